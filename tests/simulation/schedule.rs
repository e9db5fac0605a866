//! A schedule from a seed: the cluster (nodes, clocks, pods and how they are named), the faults
//! and the events, all drawn from one PRNG. Swarm testing: each schedule turns each kind of
//! trouble on or off at random, so that rare combinations are not drowned by common ones.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use super::pods::EnvEv;
use super::rng::Rng;
use super::world::{
    Cfg, Dir, Ev, Fault, FaultKind, Freeze, Ms, Node, Pod, PodKind, Rules, Tf, World,
};

/// Options of a batch of schedules.
#[derive(Debug, Clone, Copy)]
pub struct Opts {
    /// Decision rules.
    pub rules: Rules,
    /// The safety guard turned off (the mutation check), if any.
    pub off: Option<tfinit::mutation::Guard>,
    /// How many TTLs of trouble (a range is drawn up to this).
    pub max_ttls: u64,
    /// The helper's watch, in TTLs (1; 2 in the progress check's negative test).
    pub helper_ttl_factor: u32,
    /// Whether schedules end with a calm phase that checks progress (half of them).
    pub progress: bool,
    /// Whether a helper's dead verdict is checked (world::Cfg::dead_verdicts).
    pub dead_verdicts: bool,
    /// Which trouble to favour (the searches for issue 18's findings in the old rules).
    pub focus: Focus,
    /// Largest rate difference of a node's monotonic clock (ppm, each way).
    pub max_ppm: i64,
    /// Longest freeze of a pod's init, as a fraction of the TTL (20: TTL/20).
    pub freeze_div: u64,
}

/// The trouble a batch of schedules favours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Focus {
    /// Every knob drawn at random.
    None,
    /// Issue 18 finding 1: wall clocks skewed, nothing else.
    Skew,
    /// Finding 2: a slow or hung volume, clocks in agreement.
    StaleRecord,
    /// Finding 3: pods sharing an owner name, clocks in agreement, a healthy volume.
    SharedName,
    /// Finding 4: container restarts, probes that fail, several runs per directory.
    TwoHelpers,
    /// Writes that land but report an error, then a mount that fails writes (Deployment pods,
    /// clocks in agreement).
    LostReply,
    /// Issue 23 finding 1: pods with TTLs of their own (a rolling update raising or lowering
    /// it) and `tfinit recover` by hand with another TTL; a healthy volume, clocks in agreement.
    OwnersTtl,
    /// Finding 2: several directories per state (a symbolic link, two backends naming one
    /// key), runs waiting for their lock and OOM kills; a healthy volume.
    Aliases,
    /// Finding 3: `owners/` restored from a backup under live owners, every pod on one node
    /// (the kernel's proof holds only there), `tfinit recover` by hand; a healthy volume.
    Restore,
    /// Finding 4: terraform 1.11 everywhere, the progress check on.
    Wording,
    /// An incarnation other pods cannot see: its node's mount hangs or fails writes from its
    /// container's restart on (no heartbeat lands), while an earlier container's record with its
    /// Who is on the volume (what `Launch::Unseen` and `Launch::Shadowed` are for).
    Invisible,
    /// Many requests in one directory of three pods, OOM kills that leave locks with ended
    /// records (recovered at once, by several pods' helpers), one node's mount failing for a
    /// while (runs without a record): two recoveries at the same lock (what `recover.lock` is
    /// for), a helper at a lock of its own init's live run.
    Crowd,
    /// Every schedule on the Lease store, every fault of the API (down, slow, 429, lost
    /// answers) and Leases deleted or garbled by hand.
    Leases,
    /// The Lease store with an API that does not answer for a while, the whole API's or one
    /// node's (reads and writes time out), and nothing else.
    Unanswered,
    /// [`Focus::Crowd`] whose node faults all fail writes: a run of an init OOM-killed, its
    /// record's removal failing, and a new run of the same init on the state while the record
    /// waits for the next recovery (what the init's live runs handed to a helper are for).
    OwnLock,
    /// [`Focus::OwnLock`] with five pods: more helpers at one dead lock at once (what
    /// `recover.lock` is for).
    Race,
    /// [`Focus::Crowd`] on the Lease store, one node's writes refused for a while (429): a
    /// helper's renewals of the recovery Lease fail while its reads work, and another helper
    /// takes the Lease (what `RecoveryLock::held` is for).
    LeaseCrowd,
}

/// Builds the world of `seed`.
pub fn build(seed: u64, o: &Opts, anchor: Instant, mask: &Mask) -> World {
    let mut r = Rng::new(seed);
    let ttl: Ms = match r.below(20) {
        0..=11 => 3_000,
        12..=16 => 6_000,
        _ => 30_000,
    };
    let mut horizon = ttl * r.range(3, o.max_ttls.max(3));
    // Swarm knobs.
    let mut skew = r.chance(500);
    let mut steps = skew && r.chance(500);
    let mut vol_faults = r.chance(500);
    let mut node_faults = r.chance(400);
    let lost_replies = r.chance(250);
    let kills = r.chance(500);
    let mut restarts = r.chance(500);
    let mut replacements = r.chance(400);
    let ooms = r.chance(300);
    let freezes = r.chance(300);
    let mut unknown = r.chance(300);
    let max_ppm: i64 = if r.chance(500) { o.max_ppm } else { 0 };
    let mut naming = match r.below(5) {
        0 | 1 => PodKind::Deployment,
        2 => PodKind::StatefulSet,
        3 => PodKind::HostNetwork,
        _ => PodKind::FixedOwner,
    };
    // Issue 23's knobs (today's rules only: the old code had none of this).
    let new = o.rules == Rules::New;
    let mut aliases = new && r.chance(400);
    let mut ttls = new && r.chance(400);
    let mut manual = new && r.chance(250);
    let mut restores = new && r.chance(150);
    let mut ooms = ooms;
    let mut one_node = false;
    let mut progress_forced = false;
    let mut tf_mode = if new { r.below(3) } else { 0 };
    match o.focus {
        Focus::None | Focus::Leases | Focus::Unanswered => {}
        Focus::LeaseCrowd => {
            horizon += 30_000;
            (skew, steps, vol_faults, node_faults) = (false, false, false, true);
            (restarts, replacements, naming, ooms) = (false, false, PodKind::Deployment, true);
        }
        Focus::Skew => {
            (skew, steps, vol_faults, node_faults) = (true, false, false, false);
            (restarts, replacements, naming) = (false, false, PodKind::Deployment);
        }
        Focus::StaleRecord => {
            (skew, steps, vol_faults) = (false, false, true);
            (restarts, replacements, naming) = (false, false, PodKind::Deployment);
        }
        Focus::SharedName => {
            (skew, steps, vol_faults, node_faults) = (false, false, false, false);
            if !matches!(naming, PodKind::HostNetwork | PodKind::FixedOwner) {
                naming = PodKind::FixedOwner;
            }
        }
        Focus::LostReply => {
            (skew, steps, vol_faults, node_faults) = (false, false, true, true);
            (restarts, replacements, naming) = (false, false, PodKind::Deployment);
        }
        Focus::TwoHelpers => {
            (skew, steps, vol_faults, node_faults) = (false, false, false, false);
            (restarts, unknown, replacements, naming) = (true, true, false, PodKind::Deployment);
        }
        Focus::OwnersTtl => {
            (skew, steps, vol_faults, node_faults) = (false, false, false, false);
            (ttls, manual, replacements) = (true, true, true);
        }
        Focus::Aliases => {
            (skew, steps, vol_faults, node_faults) = (false, false, false, false);
            (aliases, ooms) = (true, true);
        }
        Focus::Restore => {
            (skew, steps, vol_faults, node_faults) = (false, false, false, false);
            (restores, manual, one_node) = (true, true, true);
        }
        Focus::Wording => {
            (tf_mode, progress_forced) = (1, true);
        }
        Focus::Crowd | Focus::OwnLock | Focus::Race => {
            // One node's mount failing for a while: its runs start without a record (today's
            // init writes one before every run its store can take one for, and the model of its
            // loop once started runs without one where the real code writes it; issue 25).
            (skew, steps, vol_faults, node_faults) = (false, false, false, true);
            (restarts, replacements, naming, ooms) = (false, false, PodKind::Deployment, true);
        }
        Focus::Invisible => {
            (skew, steps, vol_faults, node_faults) = (false, false, false, false);
            (restarts, replacements, naming, manual) = (true, false, PodKind::Deployment, true);
        }
    }
    // The store: the Lease store in about half of today's schedules, drawn apart from the rest
    // so that the file store's schedules stay what they were (the foci tuned for a volume keep
    // it).
    let mut lr = Rng::new(seed ^ 0x001e_a5e5_570e);
    let leases = new
        && match o.focus {
            Focus::None => lr.chance(500),
            Focus::Leases | Focus::Unanswered | Focus::LeaseCrowd => true,
            _ => false,
        };
    match o.focus {
        Focus::Leases => {
            (vol_faults, node_faults, restarts, replacements) = (true, true, true, true);
            manual = true;
        }
        Focus::Unanswered => {
            // Room for requests that go unanswered for the client's 10 s and more.
            horizon += 40_000;
            (skew, steps, vol_faults, node_faults) = (false, false, lr.chance(300), true);
            (restarts, replacements, naming, manual) = (true, true, PodKind::Deployment, true);
        }
        _ => {}
    }
    let lost_replies = lost_replies || o.focus == Focus::Leases;
    let crowd_like = matches!(
        o.focus,
        Focus::Crowd | Focus::OwnLock | Focus::Race | Focus::LeaseCrowd
    );
    // The foci whose node faults all fail writes, several of them.
    let failing_writes = matches!(o.focus, Focus::LeaseCrowd | Focus::OwnLock | Focus::Race);
    let progress = o.progress && new && (progress_forced || r.chance(500));
    // Working directories: with aliases, a later one may be a symbolic link to an earlier one
    // or name the same backend key; and one's key may come from the environment.
    // A crowd: many requests in one directory.
    let crowd = crowd_like || o.focus == Focus::Unanswered;
    let n_dirs = match (aliases, crowd) {
        (_, true) => 1,
        (true, false) => r.range(2, 3) as u8,
        (false, false) => r.range(1, 2) as u8,
    };
    let mut dirs: Vec<Dir> = Vec::new();
    for d in 0..n_dirs {
        let mut dir = Dir {
            real: d,
            state: d,
            key_from_env: false,
        };
        if d > 0 && aliases && (d == 1 || r.chance(500)) {
            let target = dirs[r.pick(d as usize)];
            dir.state = target.state;
            if r.chance(500) {
                dir.real = target.real;
            }
        }
        dir.key_from_env = aliases && r.chance(100);
        dirs.push(dir);
    }
    // Each pod's TTL: the schedule's (the shortest), or longer.
    let base_ttl = ttl;
    let pod_ttl = move |r: &mut Rng| -> Ms {
        if !ttls {
            return base_ttl;
        }
        match r.below(20) {
            0..=10 => base_ttl,
            11..=16 => 2 * base_ttl,
            _ if base_ttl >= 30_000 => 2 * base_ttl,
            _ => 4 * base_ttl,
        }
    };
    let mixed_tf = tf_mode == 2;
    let cluster_tf = if tf_mode == 1 { Tf::V1_11 } else { Tf::V1_0_3 };
    let pod_tf = move |r: &mut Rng| -> Tf {
        match (mixed_tf, r.chance(500)) {
            (true, true) => Tf::V1_11,
            (true, false) => Tf::V1_0_3,
            (false, _) => cluster_tf,
        }
    };
    let cfg = Cfg {
        rules: o.rules,
        ttl,
        record_timeout: r.range(ttl / 3, ttl),
        workdirs: n_dirs,
        dirs,
        workspaces: if r.chance(200) && !crowd_like { 2 } else { 1 },
        probe_unknown: if unknown { 200 } else { 0 },
        calm_at: horizon,
        end_at: horizon + ttl,
        progress,
        dead_verdicts: o.dead_verdicts,
        helper_ttl_factor: o.helper_ttl_factor,
        max_ppm,
        leases,
        // With the API unanswering, a slow request outlives the client's deadline half the time.
        slow_max: if o.focus == Focus::Unanswered {
            40_000
        } else {
            ttl
        },
    };
    let mut w = World::new(cfg, Rng::new(r.next_u64()));
    let n_nodes = r.range(2, 3) as usize;
    for n in 0..n_nodes {
        let mut st = Vec::new();
        if skew {
            st.push((0, r.signed(10 * ttl as i64)));
            if steps {
                for _ in 0..r.range(1, 3) {
                    st.push((r.below(horizon), r.signed(10 * ttl as i64)));
                }
                st.sort_by_key(|s| s.0);
            }
        }
        w.nodes.push(Node {
            name: format!("node{n}"),
            boot: format!("{:016x}{:016x}", r.next_u64(), r.next_u64()),
            base: anchor + Duration::from_secs(r.range(1, 1_000_000)),
            ppm: r.signed(max_ppm),
            steps: st,
        });
    }
    let mut env: Vec<(Ms, EnvEv)> = Vec::new();
    let n_pods = if o.focus == Focus::Race {
        5
    } else if crowd_like {
        3
    } else {
        r.range(2, 3) as usize
    };
    for i in 0..n_pods {
        // hostNetwork pods crowd node 0, where they share the hostname.
        let node = if one_node || (naming == PodKind::HostNetwork && r.chance(700)) {
            0
        } else {
            r.pick(n_nodes)
        };
        let kind = if i == 0 || r.chance(700) {
            naming
        } else {
            PodKind::Deployment
        };
        let (pt, tf) = (pod_ttl(&mut r), pod_tf(&mut r));
        let p = add_pod(&mut w, kind, node, None, pt, tf);
        env.push((r.range(0, ttl / 2), EnvEv::StartPod(p)));
    }
    if replacements {
        for _ in 0..r.range(1, 2) {
            let old = r.pick(n_pods);
            let kind = w.pods[old].kind;
            let node = if one_node { 0 } else { r.pick(n_nodes) };
            // A rolling update may change TFINIT_OWNER_TTL (either way) and terraform.
            let (pt, tf) = (pod_ttl(&mut r), pod_tf(&mut r));
            let new = add_pod(&mut w, kind, node, Some(old), pt, tf);
            // Everything, grace periods included, is over before the calm phase.
            let grace = r.range(ttl / 10, 2 * ttl);
            let t = r.range(ttl, horizon - grace);
            if kind == PodKind::StatefulSet && r.chance(500) {
                // The StatefulSet way: the old pod goes first, its replacement after it.
                env.push((t, EnvEv::Terminate { pod: old, grace }));
                env.push((t + r.range(0, grace), EnvEv::StartPod(new)));
            } else {
                // A rolling update (or a pod force-deleted on a partitioned node): the new one
                // first, the old one still running for a while.
                env.push((t, EnvEv::StartPod(new)));
                let when = (t + r.range(0, 2 * ttl)).min(horizon - grace);
                if r.chance(800) {
                    env.push((when, EnvEv::Terminate { pod: old, grace }));
                } else {
                    env.push((when, EnvEv::KillPod(old)));
                }
            }
        }
    }
    let pods_now = w.pods.len();
    let n_req = (horizon / (ttl / 2)).max(2) * if crowd { 4 } else { 1 };
    for _ in 0..n_req {
        let pod = r.pick(pods_now);
        let workdir = r.below(w.cfg.workdirs as u64) as u8;
        let ws = r.below(w.cfg.workspaces as u64) as u8;
        env.push((r.range(0, horizon), EnvEv::Request { pod, workdir, ws }));
    }
    if kills {
        for _ in 0..r.range(1, 2) {
            env.push((r.range(ttl / 2, horizon), EnvEv::KillPod(r.pick(pods_now))));
        }
    }
    if restarts {
        for _ in 0..r.range(1, 3) {
            let pod = r.pick(pods_now);
            let t = r.range(ttl / 2, horizon);
            env.push((
                t,
                EnvEv::Restart {
                    pod,
                    after: r.range(100, 3_000),
                },
            ));
            if o.focus == Focus::Invisible {
                let kind = if r.chance(500) {
                    FaultKind::Hang
                } else {
                    FaultKind::FailWrites
                };
                w.faults.push(Fault {
                    from: t,
                    to: (t + r.range(ttl, 3 * ttl)).min(horizon),
                    kind,
                    node: Some(w.pods[pod].node),
                });
            }
        }
    }
    if ooms {
        let (fewest, most) = if matches!(o.focus, Focus::OwnLock | Focus::Race) {
            (3, 8)
        } else {
            (1, 3)
        };
        for _ in 0..r.range(fewest, most) {
            env.push((r.range(ttl / 2, horizon), EnvEv::Oom(r.pick(pods_now))));
        }
    }
    if manual {
        for _ in 0..r.range(1, 2) {
            // A person's `tfinit recover`, with the default TTL or the pod's environment's.
            let ttl = match r.below(3) {
                0 => 30_000,
                1 => 1_000,
                _ => ttl,
            };
            let pod = r.pick(pods_now);
            env.push((
                r.range(ttl.min(horizon) / 2, horizon),
                EnvEv::ManualRecover { pod, ttl },
            ));
        }
    }
    if restores {
        for _ in 0..r.range(1, 2) {
            env.push((r.range(ttl / 2, horizon), EnvEv::RestoreOwners));
        }
    }
    let fault = |w: &mut World, r: &mut Rng, node: Option<usize>| {
        let kind = match r.below(100) {
            _ if o.focus == Focus::Unanswered && r.chance(500) => FaultKind::Hang,
            _ if o.focus == Focus::Unanswered => FaultKind::Slow,
            _ if failing_writes => FaultKind::FailWrites,
            _ if o.focus == Focus::LostReply && node.is_none() => FaultKind::LostReply,
            _ if o.focus == Focus::LostReply => FaultKind::FailWrites,
            0..=34 => FaultKind::Hang,
            35..=64 => FaultKind::FailWrites,
            65..=84 => FaultKind::Slow,
            _ if lost_replies => FaultKind::LostReply,
            _ => FaultKind::Hang,
        };
        let len = match kind {
            // Long enough for reads to go unanswered past the client's 10 s budget.
            FaultKind::Hang if o.focus == Focus::Unanswered => r.range(ttl, 3 * ttl) + 10_000,
            FaultKind::Hang => r.range(ttl / 4, 2 * ttl),
            // Long enough for a recovery Lease to lapse under a helper at work.
            FaultKind::FailWrites if o.focus == Focus::LeaseCrowd => r.range(2 * ttl, 4 * ttl),
            FaultKind::FailWrites => r.range(ttl / 3, 3 * ttl),
            FaultKind::Slow => r.range(ttl / 2, 3 * ttl),
            FaultKind::LostReply => r.range(ttl / 4, ttl),
        };
        let from = r.below(horizon);
        let to = (from + len).min(horizon);
        w.faults.push(Fault {
            from,
            to,
            kind,
            node,
        });
    };
    if vol_faults {
        for _ in 0..r.range(1, 3) {
            fault(&mut w, &mut r, None);
        }
    }
    if node_faults {
        let most = if failing_writes { 6 } else { 2 };
        for _ in 0..r.range(1, most) {
            let n = r.pick(n_nodes);
            fault(&mut w, &mut r, Some(n));
        }
    }
    // People at work on the Leases: deletes and edits by hand, before the calm phase.
    if leases && (o.focus == Focus::Leases || lr.chance(300)) {
        for _ in 0..lr.range(1, 3) {
            let garbage = lr.chance(500);
            env.push((lr.range(ttl / 2, horizon), EnvEv::Hand { garbage }));
        }
    }
    if freezes {
        for _ in 0..r.range(1, 3) {
            let pod = r.pick(pods_now);
            let from = r.below(horizon);
            let to = from + r.range(10, ttl / o.freeze_div.max(1));
            w.freezes.push(Freeze { pod, from, to });
        }
    }
    if progress {
        // A fresh observer on a healthy volume. Every owner that died did so before the calm
        // phase: after 3/2 TTL it asks for a run in every directory and workspace at once.
        let node = r.pick(n_nodes);
        let (pt, tf) = (pod_ttl(&mut r), pod_tf(&mut r));
        let obs = add_pod(&mut w, PodKind::Deployment, node, None, pt, tf);
        env.push((horizon, EnvEv::StartPod(obs)));
        let t = horizon + 3 * ttl / 2 + 2_000;
        for workdir in 0..w.cfg.workdirs {
            for ws in 0..w.cfg.workspaces {
                env.push((
                    t,
                    EnvEv::Observe {
                        pod: obs,
                        workdir,
                        ws,
                    },
                ));
            }
        }
        // Extended to the latest deadline of the obligations these requests create.
        w.cfg.end_at = t + 1;
    }
    env.sort_by_key(|e| e.0);
    // What the shrinker left out.
    let mut env: Vec<(Ms, EnvEv)> = env
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !mask.contains(&Item::Env(*i)))
        .map(|(_, e)| e)
        .collect();
    let faults = std::mem::take(&mut w.faults);
    w.faults = faults
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !mask.contains(&Item::Fault(*i)))
        .map(|(_, f)| f)
        .collect();
    let freezes = std::mem::take(&mut w.freezes);
    w.freezes = freezes
        .into_iter()
        .enumerate()
        .filter(|(i, _)| !mask.contains(&Item::Freeze(*i)))
        .map(|(_, f)| f)
        .collect();
    for (n, node) in w.nodes.iter_mut().enumerate() {
        let steps = std::mem::take(&mut node.steps);
        node.steps = steps
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !mask.contains(&Item::Step(n, *i)))
            .map(|(_, st)| st)
            .collect();
    }
    // Notes for the listing.
    for f in &w.faults {
        let on = f
            .node
            .map_or("the volume".to_string(), |n| format!("node{n}'s mount"));
        env.push((
            f.from,
            EnvEv::Note(format!("{:?} on {on} until {} ms", f.kind, f.to)),
        ));
    }
    for f in &w.freezes {
        env.push((
            f.from,
            EnvEv::Note(format!("pod {} frozen until {} ms", f.pod, f.to)),
        ));
    }
    for (n, node) in w.nodes.iter().enumerate() {
        for (t, st) in &node.steps {
            env.push((
                *t,
                EnvEv::Note(format!("node{n}'s wall clock is {st:+} ms off from here")),
            ));
        }
    }
    env.push((
        horizon,
        EnvEv::Note("calm: no more faults, kills or clock steps".into()),
    ));
    env.sort_by_key(|e| e.0);
    for (i, (t, _)) in env.iter().enumerate() {
        w.at(*t, Ev::Env(i));
    }
    w.env = env;
    w
}

/// A part of a schedule the shrinker may leave out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Item {
    /// The n-th environment event (before notes are added).
    Env(usize),
    /// The n-th fault window.
    Fault(usize),
    /// The n-th freeze.
    Freeze(usize),
    /// Node n's m-th wall-clock step.
    Step(usize, usize),
}

/// Every part of schedule `seed` the shrinker may leave out.
pub fn items(seed: u64, o: &Opts, anchor: Instant) -> Vec<Item> {
    let w = build(seed, o, anchor, &Mask::new());
    let mut out: Vec<Item> = Vec::new();
    let actions = w
        .env
        .iter()
        .filter(|e| !matches!(e.1, EnvEv::Note(_)))
        .count();
    out.extend((0..actions).map(Item::Env));
    out.extend((0..w.faults.len()).map(Item::Fault));
    out.extend((0..w.freezes.len()).map(Item::Freeze));
    for (n, node) in w.nodes.iter().enumerate() {
        out.extend((0..node.steps.len()).map(|i| Item::Step(n, i)));
    }
    out
}

/// The parts left out of a schedule.
pub type Mask = std::collections::BTreeSet<Item>;

/// A new pod of `kind` on `node` (`like`: the pod a StatefulSet replacement takes the name of),
/// with TFINIT_OWNER_TTL `ttl` and terraform `tf`.
fn add_pod(
    w: &mut World,
    kind: PodKind,
    node: usize,
    like: Option<usize>,
    ttl: Ms,
    tf: Tf,
) -> usize {
    let k = w.pods.len();
    let (name, host, owner) = match (kind, like) {
        (PodKind::StatefulSet, Some(old)) => {
            let p = &w.pods[old];
            (p.name.clone(), p.host.clone(), p.owner_name.clone())
        }
        (PodKind::Deployment, _) => (format!("dep-{k}"), format!("dep-{k}"), format!("dep-{k}")),
        (PodKind::StatefulSet, None) => {
            (format!("sts-{k}"), format!("sts-{k}"), format!("sts-{k}"))
        }
        (PodKind::HostNetwork, _) => {
            let n = w.nodes[node].name.clone();
            (format!("hn-{k}"), n.clone(), n)
        }
        (PodKind::FixedOwner, _) => (format!("fx-{k}"), format!("fx-{k}"), "ctl".to_string()),
    };
    w.pods.push(Pod {
        name,
        host,
        owner_name: owner,
        node,
        uid: format!("uid-{k}"),
        kind,
        inc: None,
        gone: false,
        ttl,
        tf,
    });
    k
}

/// The schedule, as a replayable listing.
pub fn describe(w: &World) -> String {
    let mut s = String::new();
    let c = &w.cfg;
    let _ = writeln!(
        s,
        "rules {:?}, TTL {} ms, record timeout {} ms, {} workdir(s) x {} workspace(s), probes unknown {}/1000, max clock rate difference {} ppm, calm from {} ms, end {} ms, progress checked: {}, store: {}",
        c.rules, c.ttl, c.record_timeout, c.workdirs, c.workspaces, c.probe_unknown, c.max_ppm, c.calm_at, c.end_at, c.progress,
        if c.leases { "Leases (faults are the API's)" } else { "a state volume" }
    );
    for (i, d) in c.dirs.iter().enumerate() {
        let _ = writeln!(
            s,
            "/tf/w{i}: {}state s{}{}",
            if d.real as usize != i {
                format!("a symbolic link to /tf/w{}, ", d.real)
            } else {
                String::new()
            },
            d.state,
            if d.key_from_env {
                ", backend key from the environment"
            } else {
                ""
            }
        );
    }
    for (i, n) in w.nodes.iter().enumerate() {
        let _ = writeln!(
            s,
            "node{i}: boot {}.., rate {:+} ppm, wall skew steps {:?}",
            &n.boot[..8],
            n.ppm,
            n.steps
        );
    }
    for (i, p) in w.pods.iter().enumerate() {
        let _ = writeln!(
            s,
            "pod {i}: {} ({:?}) on node{}, hostname {}, owner {}, TTL {} ms, terraform {:?}",
            p.name, p.kind, p.node, p.host, p.owner_name, p.ttl, p.tf
        );
    }
    for (t, e) in &w.env {
        match e {
            EnvEv::Note(note) => writeln!(s, "{t:>8} ms  {note}"),
            e => writeln!(s, "{t:>8} ms  {e:?}"),
        }
        .expect("a String takes any text");
    }
    s
}
