//! The recovery helper process (`tfinit __recover` for one working directory, or `tfinit recover`
//! run by hand for every record), as a task: the procedure of `Recovery::run` in
//! src/locks/recover/mod.rs step by step (import the loop's watches, watch undecided owners every
//! 500 ms, take `recover.lock`, list, and for each record: a fresh liveness check, the probe,
//! `decide`, the re-check of liveness and records right before the force-unlock), every storage
//! call and terraform run a timed operation. The decisions are the real ones: `Observer` (and its
//! judging TTL), `run_state`, `last_alive_ms`, `kernel_proof_with`, `state::may_share`,
//! `live_on_host`, `decide`, and lockinfo's parser reading the text the helper's terraform
//! version prints. The guards that live in the helper (`recover.lock`, the live-run check) ask
//! `tfinit::mutation::on` where recover/ does. Under `Rules::Legacy` it is the old helper:
//! `recover.lock` first, one listing, the old wall-clock rules, no re-check.

use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use tfinit::locks::liveness::{
    last_alive_ms, run_state, Facts, Observer, RunState, Token, Verdict, LONGEST_TTL,
};
use tfinit::locks::lockinfo::{self, LockInfo};
use tfinit::locks::record::{FileId, Heartbeat, Owner, Record};
use tfinit::locks::recover::{decide, live_on_host, Decision, Window, CLOCK_SKEW};
use tfinit::locks::state::{self, StateOf};
use tfinit::locks::store::kernel_proof_with;
use tfinit::locks::who::who_host;
use tfinit::mutation::{self, Guard};

use super::legacy;
use super::world::{
    list, read_heartbeat, read_heartbeat_by_name, workdir_path, workspace_name, BookSide, Cause,
    Ev, Lock, LockKey, LoopEv, Ms, PState, Rules, Sim, Tf, VKind, WaitFor, World, EPOCH_MS,
};

/// How often the helper re-reads a heartbeat it watches (recover/mod.rs: WATCH_EVERY).
const WATCH_EVERY: Duration = Duration::from_millis(500);
/// How long it waits for another recovery's `recover.lock` (recover/mod.rs: LOCK_WAIT).
const LOCK_WAIT: Ms = 250_000;

/// What the probe found (lockinfo::Probe, the cases the backend model has).
enum Probe {
    Free,
    Held(LockInfo),
    Unknown,
}

/// Why a helper force-unlocks, for the report of a violation.
#[derive(Debug, Clone)]
pub struct Judged {
    /// The helper.
    pub helper: usize,
    /// The record it recovers.
    pub rec: Rc<Record>,
    /// The rule's words.
    pub why: String,
    /// Legacy: when the heartbeat the rule read was stamped (simulated time).
    pub hb_stamped: Option<Ms>,
    /// Legacy: the heartbeat file of the name held another incarnation's beat.
    pub hb_other: bool,
    /// When the rule decided (simulated time).
    pub decided_at: Ms,
}

/// Helper `h`, from its start to its exit.
pub async fn run(sim: Rc<Sim>, h: usize) {
    let rules = sim.with(|w| w.cfg.rules);
    match rules {
        Rules::New => new_helper(&sim, h).await,
        Rules::Legacy => legacy_helper(&sim, h).await,
    }
    sim.with(|w| w.helper_exit(h));
}

/// What a helper knows when it starts.
struct Ctx {
    h: usize,
    node: usize,
    me: Owner,
    /// Its own TFINIT_OWNER_TTL.
    ttl: Duration,
    /// The directory it recovers (None: every record).
    workdir: Option<u8>,
    tf: Tf,
}

fn ctx(w: &World, h: usize) -> Ctx {
    let x = &w.helpers[h];
    Ctx {
        h,
        node: x.node,
        me: x.me.clone(),
        ttl: Duration::from_millis(x.ttl),
        workdir: x.workdir,
        tf: x.tf,
    }
}

impl Ctx {
    /// recover/mod.rs `run`'s `only`: whether record `rec` is in the directory this helper recovers
    /// (`same_dir`: the same text, or the same directory once symbolic links are resolved).
    fn covers(&self, w: &World, rec: &Record) -> bool {
        let Some(d) = self.workdir else {
            return true;
        };
        match dir_of(&rec.workdir) {
            Some(r) => r == d || w.cfg.dirs[r as usize].real == w.cfg.dirs[d as usize].real,
            None => false,
        }
    }
}

/// The index of working directory `/tf/w<n>`.
pub fn dir_of(workdir: &str) -> Option<u8> {
    workdir.strip_prefix("/tf/w")?.parse().ok()
}

async fn new_helper(sim: &Sim, h: usize) {
    let (c, mut observer) = sim.with(|w| {
        let c = ctx(w, h);
        let seen = match w.helpers[h].init.map(|i| &w.incs[i].book) {
            Some(BookSide::New(b)) => {
                let node = &w.nodes[c.node];
                b.observations(|i| node.ns(i))
            }
            _ => Vec::new(),
        };
        let base = w.nodes[c.node].base;
        let ttl = c.ttl * w.cfg.helper_ttl_factor;
        let o = Observer::import(ttl, LONGEST_TTL, &seen, |ns| {
            Some(base + Duration::from_nanos(ns))
        });
        (c, o)
    });
    let listed: Vec<Rc<Record>> = list(sim, c.node)
        .await
        .into_iter()
        .filter(|(_, r)| sim.with(|w| c.covers(w, r)))
        .map(|(_, r)| r)
        .collect();
    watch(sim, &c, &mut observer, &listed).await;
    if mutation::on(Guard::RecoverLock) && !lock_recovery(sim, h).await {
        return;
    }
    let found = list(sim, c.node).await;
    for (id, rec) in &found {
        if !sim.with(|w| c.covers(w, rec)) {
            continue;
        }
        one(sim, &c, &mut observer, *id, rec, &found).await;
    }
}

/// Watches the owners of `records`, and the tfinits on the hosts their `Who` names (recover/mod.rs:
/// `watch`), until each is alive, dead or proven gone.
async fn watch(sim: &Sim, c: &Ctx, observer: &mut Observer, records: &[Rc<Record>]) {
    let mut owners: Vec<Owner> = Vec::new();
    let mut add = |o: &Owner| {
        if !o.same_incarnation(&c.me) && !owners.iter().any(|x| x.same_incarnation(o)) {
            owners.push(o.clone());
        }
    };
    for r in records.iter().filter(|r| r.ended.is_none()) {
        add(&r.owner);
        observer.stated(&r.owner.key(), r.owner_ttl());
    }
    let hosts: Vec<&str> = records.iter().map(|r| who_host(&r.who)).collect();
    for hb in heartbeats(sim, c.node).await {
        if !hb.host.is_empty() && hosts.contains(&hb.host.as_str()) {
            add(&hb.owner);
        }
    }
    loop {
        let start = sim.with(|w| w.mono(c.node));
        let mut longest = Duration::ZERO;
        for o in &owners {
            if kernel(sim, c, o).await.is_some() {
                continue;
            }
            let start = read_beat(sim, c, observer, o).await;
            // An owner that states no TTL (an older tfinit) is not waited for.
            let key = o.key();
            if !observer.knows_ttl(&key) && observer.older() > observer.ttl() {
                continue;
            }
            let now = sim.with(|w| w.mono(c.node));
            match observer.verdict(&key, now) {
                Verdict::Watching { left } => longest = longest.max(left),
                Verdict::Dead { .. } => {
                    let ttl = c.ttl.as_millis() as Ms;
                    sim.with(|w| w.check_dead_verdict(&format!("helper {}", c.h), ttl, o, start));
                }
                Verdict::Alive => {}
            }
        }
        if longest.is_zero() {
            return;
        }
        let t = sim.with(|w| {
            let n = &w.nodes[c.node];
            let elapsed = n.mono(w.now).saturating_duration_since(start);
            n.real_at(n.mono(w.now) + WATCH_EVERY.min(longest).saturating_sub(elapsed))
        });
        sim.sleep_until(t.max(sim.now() + 1)).await;
    }
}

/// One read of `owner`'s heartbeat, fed to `observer`; returns when it started (simulated time).
async fn read_beat(sim: &Sim, c: &Ctx, observer: &mut Observer, owner: &Owner) -> Ms {
    let (start, started) = sim.with(|w| (w.now, w.mono(c.node)));
    let token = read_heartbeat(sim, c.node, owner)
        .await
        .map(|h| Token::of(&h));
    let done = sim.with(|w| w.mono(c.node));
    observer.saw(&owner.key(), token, started, done);
    start
}

/// What the kernel says of `owner`'s lock file (recover/mod.rs: `kernel`): its heartbeat, read now,
/// and the store's one rule (`kernel_proof_with`) on this node's kernel.
async fn kernel(sim: &Sim, c: &Ctx, owner: &Owner) -> Option<bool> {
    let hb = read_heartbeat(sim, c.node, owner).await;
    sim.with(|w| {
        kernel_proof_with(&c.me, owner, hb.as_ref(), |file| {
            w.incarnation_gone_at(c.node, owner, file, w.now)
        })
    })
}

/// Whether `rec`'s run is over, with a fresh read of its owner's heartbeat.
async fn state_now(sim: &Sim, c: &Ctx, observer: &mut Observer, rec: &Record) -> RunState {
    let facts = Facts::of(rec);
    observer.stated(&rec.owner.key(), facts.ttl);
    if facts.ended.is_some() || rec.owner.same_incarnation(&c.me) {
        return run_state(&c.me, &facts, None, Verdict::Alive);
    }
    let kernel = kernel(sim, c, &rec.owner).await;
    let mut start = 0;
    if kernel.is_none() {
        start = read_beat(sim, c, observer, &rec.owner).await;
    }
    let now = sim.with(|w| w.mono(c.node));
    let verdict = observer.verdict(&rec.owner.key(), now);
    // The verdict decides only when the kernel says nothing (and then a fresh read came first).
    if kernel.is_none() && matches!(verdict, Verdict::Dead { .. }) {
        let (who, ttl) = (format!("helper {}", c.h), c.ttl.as_millis() as Ms);
        sim.with(|w| w.check_dead_verdict(&who, ttl, &rec.owner, start));
    }
    run_state(&c.me, &facts, kernel, verdict)
}

async fn one(
    sim: &Sim,
    c: &Ctx,
    observer: &mut Observer,
    id: u64,
    rec: &Rc<Record>,
    all: &[(u64, Rc<Record>)],
) {
    let outcome = |o: &'static str, text: String| {
        sim.with(|w| {
            w.outcomes.insert(id, o);
            let h = c.h;
            w.log(|| format!("helper {h}, record {id}: {o} ({text})"));
        })
    };
    let RunState::Over(why) = state_now(sim, c, observer, rec).await else {
        return outcome("owner alive or still watched", String::new());
    };
    let info = match probe(sim, c, rec).await {
        Probe::Free => {
            outcome("lock free", why);
            return remove(sim, c, id).await;
        }
        Probe::Unknown => return outcome("probe could not tell", why),
        Probe::Held(info) => info,
    };
    let w1 = window(sim, c, observer, id, rec, &info, all).await;
    match decide(rec, &info, &w1) {
        Decision::NotOurs(d) => {
            outcome("held by another (NotOurs)", d);
            return remove(sim, c, id).await;
        }
        Decision::Ambiguous(d) if d.contains("same Who") => {
            return outcome("ambiguous: a live run or record here has the same Who", d)
        }
        Decision::Ambiguous(d) => return outcome("ambiguous", d),
        Decision::Unlock => {}
    }
    // Right before the unlock: liveness and the records again, from the volume.
    if !matches!(state_now(sim, c, observer, rec).await, RunState::Over(_)) {
        return outcome("alive at the re-check", String::new());
    }
    let fresh = list(sim, c.node).await;
    let w2 = window(sim, c, observer, id, rec, &info, &fresh).await;
    match decide(rec, &info, &w2) {
        Decision::NotOurs(d) => {
            outcome("held by another at the re-check (NotOurs)", d);
            return remove(sim, c, id).await;
        }
        Decision::Ambiguous(d) if d.contains("same Who") => {
            return outcome(
                "ambiguous at the re-check: a live run or record here has the same Who",
                d,
            )
        }
        Decision::Ambiguous(d) => return outcome("ambiguous at the re-check", d),
        Decision::Unlock => outcome("unlock", why.clone()),
    }
    let judged = Judged {
        helper: c.h,
        rec: Rc::clone(rec),
        why,
        hb_stamped: None,
        hb_other: false,
        decided_at: sim.now(),
    };
    if unlock(sim, c.node, &info, judged).await {
        remove(sim, c, id).await;
    }
}

/// recover/evidence.rs's `window`, with its reads.
async fn window(
    sim: &Sim,
    c: &Ctx,
    observer: &mut Observer,
    id: u64,
    rec: &Record,
    info: &LockInfo,
    all: &[(u64, Rc<Record>)],
) -> Window {
    let skew = CLOCK_SKEW.as_millis() as u64;
    let hb = read_heartbeat(sim, c.node, &rec.owner).await;
    let state = sim.with(|w| w.state_of(&rec.workdir, &rec.workspace));
    // Another run whose record is here, on a state that may be this one (whatever directory it
    // works in), with the same Who, that may be alive.
    let mut twin = None;
    for (p, r) in all {
        if *p == id || r.who != info.who {
            continue;
        }
        let other = sim.with(|w| w.state_of(&r.workdir, &r.workspace));
        if state::may_share(&state, &other)
            && !matches!(state_now(sim, c, observer, r).await, RunState::Over(_))
        {
            twin = Some(format!("{} of {} in {}", r.run_id, r.owner.name, r.workdir));
            break;
        }
    }
    // recover/evidence.rs: any tfinit that may be alive on the host the lock's Who names (its
    // runs, with records or not, lock as that Who): every heartbeat file, then (unless that check
    // is turned off) a liveness read of each one on that host, in order, until one may be alive.
    let beats = heartbeats(sim, c.node).await;
    let host = who_host(&info.who).to_string();
    let mut first_alive = None;
    for hb in beats.iter().filter(|_| mutation::on(Guard::LiveOnHost)) {
        if hb.host.is_empty() || hb.host != host || hb.owner.same_incarnation(&c.me) {
            continue;
        }
        let facts = Facts {
            owner: hb.owner.clone(),
            updated_ms: hb.updated_ms,
            ended: None,
            needs_person_by: None,
            ttl: hb.owner_ttl(),
        };
        let kernel = kernel(sim, c, &hb.owner).await;
        if kernel.is_none() {
            read_beat(sim, c, observer, &hb.owner).await;
        }
        let now = sim.with(|w| w.mono(c.node));
        let verdict = observer.verdict(&hb.owner.key(), now);
        if !matches!(run_state(&c.me, &facts, kernel, verdict), RunState::Over(_)) {
            first_alive = Some(hb.owner.clone());
            break;
        }
    }
    let on_host = live_on_host(&info.who, &c.me, &beats, |hb| {
        first_alive
            .as_ref()
            .is_some_and(|o| o.same_incarnation(&hb.owner))
    });
    let live = sim.with(|w| live_same_who(w, c.h, &state, info));
    let judged_by = observer.judging_ttl(&rec.owner.key());
    Window {
        not_before_ms: rec.started_ms.saturating_sub(skew),
        not_after_ms: last_alive_ms(&Facts::of(rec), hb.as_ref(), judged_by).saturating_add(skew),
        live_same_who: twin.or(on_host).or(live),
    }
}

/// Every heartbeat file of today's format, as `Store::heartbeats` lists them.
async fn heartbeats(sim: &Sim, node: usize) -> Vec<Heartbeat> {
    sim.read(node, |w| {
        w.store
            .beats
            .iter()
            .filter_map(|(k, v)| v.last().filter(|b| b.hb.v == 2 && b.hb.owner.key() == *k))
            .map(|b| (*b.hb).clone())
            .collect()
    })
    .await
}

/// recover/evidence.rs `window`'s live-run check: a live run of the helper's own init (as it was
/// when the helper started) with the lock's Who, that started before the lock was created (plus
/// clock skew), on a state that may be the record's `state`.
fn live_same_who(w: &World, h: usize, state: &StateOf, info: &LockInfo) -> Option<String> {
    let skew = CLOCK_SKEW.as_millis() as u64;
    w.helpers[h]
        .live
        .iter()
        .filter(|_| mutation::on(Guard::LiveRuns))
        .filter(|l| l.who == info.who)
        .filter(|l| {
            info.created_ms
                .is_none_or(|c| l.started_ms <= c.saturating_add(skew))
        })
        .find(|l| {
            let theirs = w.state_of(&l.workdir.to_string_lossy(), &l.workspace);
            state::may_share(state, &theirs)
        })
        .map(|l| format!("a run of this init in {}", l.workdir.display()))
}

/// The old helper's check of its init's live runs: the same directory text and workspace.
fn legacy_live_same_who(w: &World, h: usize, rec: &Record, info: &LockInfo) -> Option<String> {
    w.helpers[h]
        .live
        .iter()
        .find(|l| {
            l.workdir == Path::new(&rec.workdir)
                && l.workspace == rec.workspace
                && l.who == info.who
        })
        .map(|_| "a run of this init".to_string())
}

impl World {
    /// What recover/evidence.rs's `record_state`/`live_state` read (`state::read`) of a run in
    /// `workdir` and `workspace`: the text-named state when the state identity is turned off
    /// (`state::by_text`), else the backend settings terraform stored in the directory the path
    /// resolves to (`state::of_backend_file` on the JSON of its `.terraform/terraform.tfstate`).
    pub fn state_of(&self, workdir: &str, workspace: &str) -> StateOf {
        if let Some(by_text) = state::by_text(Path::new(workdir), workspace) {
            return by_text;
        }
        let Some(dir) = dir_of(workdir).and_then(|d| self.cfg.dirs.get(d as usize)) else {
            return StateOf::Unsure(format!("{workdir} is not a directory of the model"));
        };
        let key = if dir.key_from_env {
            serde_json::Value::Null
        } else {
            serde_json::Value::String(format!("states/s{}.tfstate", dir.state))
        };
        let stored = serde_json::json!({"version": 3, "backend": {"type": "s3", "config": {
            "bucket": "tfstate", "key": key, "region": "eu-west-1",
            "endpoints": {"s3": "http://moto:5000"}, "dynamodb_table": "locks"
        }}});
        state::of_backend_file(&stored, &workdir_path(dir.real), workspace)
    }
}
async fn legacy_helper(sim: &Sim, h: usize) {
    let c = sim.with(|w| ctx(w, h));
    if !lock_recovery(sim, h).await {
        return;
    }
    let found = list(sim, c.node).await;
    let only = c
        .workdir
        .map(|d| workdir_path(d).to_string_lossy().into_owned());
    for (id, rec) in &found {
        if only.as_ref().is_some_and(|d| *d != rec.workdir) {
            continue;
        }
        legacy_one(sim, &c, *id, rec, &found).await;
    }
}

/// The old helper's decision for one record: the old rules on the heartbeat of the owner's
/// name and this node's wall clock, no watching, no re-check before the unlock.
async fn legacy_one(sim: &Sim, c: &Ctx, id: u64, rec: &Rc<Record>, all: &[(u64, Rc<Record>)]) {
    let facts = Facts::of(rec);
    let read = read_heartbeat_by_name(sim, c.node, &rec.owner.name).await;
    let now_ms = sim.with(|w| w.wall(c.node));
    let hb = read.as_ref().map(|(h, _)| h);
    let Some(why) = legacy::run_dead_at(&c.me, &facts, hb, c.ttl, now_ms) else {
        return;
    };
    let hb_stamped = read.as_ref().map(|(_, s)| *s);
    let hb_other = hb.is_some_and(|h| !h.owner.same_incarnation(&rec.owner));
    let decided_at = sim.now();
    let info = match probe(sim, c, rec).await {
        Probe::Free => return remove(sim, c, id).await,
        Probe::Unknown => return,
        Probe::Held(info) => info,
    };
    let skew = CLOCK_SKEW.as_millis() as u64;
    let hb2 = read_heartbeat_by_name(sim, c.node, &rec.owner.name).await;
    let not_after = legacy::last_alive_ms_at(&c.me, &facts, hb2.as_ref().map(|(h, _)| h), c.ttl);
    let mut twin = None;
    for (p, r) in all {
        if *p != id && r.workdir == rec.workdir && r.workspace == rec.workspace && r.who == info.who
        {
            let hb = read_heartbeat_by_name(sim, c.node, &r.owner.name).await;
            let now_ms = sim.with(|w| w.wall(c.node));
            if legacy::run_dead_at(
                &c.me,
                &Facts::of(r),
                hb.as_ref().map(|(h, _)| h),
                c.ttl,
                now_ms,
            )
            .is_none()
            {
                twin = Some(format!("{} of {}", r.run_id, r.owner.name));
                break;
            }
        }
    }
    let live = sim.with(|w| legacy_live_same_who(w, c.h, rec, &info));
    let window = Window {
        not_before_ms: rec.started_ms.saturating_sub(skew),
        not_after_ms: not_after.saturating_add(skew),
        live_same_who: twin.or(live),
    };
    match decide(rec, &info, &window) {
        Decision::NotOurs(_) => remove(sim, c, id).await,
        Decision::Ambiguous(_) => {}
        Decision::Unlock => {
            let judged = Judged {
                helper: c.h,
                rec: Rc::clone(rec),
                why,
                hb_stamped,
                hb_other,
                decided_at,
            };
            if unlock(sim, c.node, &info, judged).await {
                remove(sim, c, id).await;
            }
        }
    }
}

/// Takes `recover.lock`, waiting up to LOCK_WAIT; false when it did not come.
async fn lock_recovery(sim: &Sim, h: usize) -> bool {
    let deadline = sim.with(|w| {
        if w.store.recover_holder.is_none() {
            w.store.recover_holder = Some(h);
        } else {
            w.store.recover_queue.push_back(h);
        }
        w.now + LOCK_WAIT
    });
    WaitFor::new(sim, deadline, move |w: &World| {
        w.store.recover_holder == Some(h)
    })
    .await;
    sim.with(|w| {
        if w.store.recover_holder == Some(h) {
            return true;
        }
        w.store.recover_queue.retain(|x| *x != h);
        false
    })
}

/// `terraform force-unlock -force <id that cannot match>` in the record's directory, by the
/// helper's terraform: it reads the lock of the directory's state at one moment and prints what
/// that version prints, which the real lockinfo parser reads (`parse_probe_of`).
async fn probe(sim: &Sim, c: &Ctx, rec: &Record) -> Probe {
    let (at, done, unknown, key) = sim.with(|w| {
        let calm = w.now >= w.cfg.calm_at;
        let dur = w.rng.range(200, 2000);
        let at = w.rng.range(w.now, w.now + dur);
        let unknown = !calm && w.rng.chance(w.cfg.probe_unknown);
        (at, w.now + dur, unknown, w.key_of(rec))
    });
    let slot = Rc::new(std::cell::RefCell::new(None));
    let s2 = Rc::clone(&slot);
    sim.with(|w| {
        w.at(
            at,
            Ev::Call(Box::new(move |w| {
                let held = key.and_then(|k| w.locks.get(&k).cloned());
                let holder_tf = held
                    .as_ref()
                    .map(|l| w.pods[w.incs[w.procs[l.holder].inc].pod].tf);
                *s2.borrow_mut() = Some((held, holder_tf, key));
            })),
        )
    });
    sim.sleep_until(done).await;
    let Some((held, holder_tf, key)) = slot.borrow_mut().take() else {
        unreachable!("the probe's read was taken before its end")
    };
    let output = if unknown {
        unreachable_output(c.tf)
    } else {
        match (&held, key) {
            (Some(l), Some(k)) => held_output(l, k, holder_tf.unwrap_or(c.tf)),
            _ => free_output(c.tf),
        }
    };
    match lockinfo::parse_probe_of("s3", None, false, &output) {
        lockinfo::Probe::Free => Probe::Free,
        lockinfo::Probe::Held(info) => Probe::Held(info),
        // Not read (the table did not answer), or read in a wording not known: cannot tell.
        lockinfo::Probe::Unknown(_) | lockinfo::Probe::Unreadable(_) => Probe::Unknown,
        lockinfo::Probe::HeldStateMissing(_) => unreachable!("the model's states exist"),
    }
}

/// The id a probe passes (lockinfo::probe_id for s3): it cannot match a lock.
const PROBE_ID: &str = "00000000-0000-0000-0000-000000000000";

/// What `force-unlock` prints for a free s3 lock (stderr, exit 1).
fn free_output(tf: Tf) -> String {
    match tf {
        // Measured (tests/fixtures/terraform/lock/probe-free.stderr).
        Tf::V1_0_3 => include_str!("../fixtures/terraform/lock/probe-free.stderr").to_string(),
        // Issue 23 finding 4, as 1.11.4 printed it (s3/client.go `Unlock`: `failed to retrieve
        // lock info for lock ID %q: %s`, the format string in the 1.11.4 binary).
        Tf::V1_11 => format!(
            "Failed to unlock state: failed to retrieve lock info for lock ID \"{PROBE_ID}\": unexpected end of JSON input\n"
        ),
    }
}

/// What `force-unlock` prints when the lock table cannot be read (network).
fn unreachable_output(tf: Tf) -> String {
    match tf {
        // Measured (tests/fixtures/terraform/lock/probe-endpoint-down.stderr).
        Tf::V1_0_3 => {
            include_str!("../fixtures/terraform/lock/probe-endpoint-down.stderr").to_string()
        }
        // From the source (the AWS SDK v2's wording after the same format string).
        Tf::V1_11 => format!(
            "Failed to unlock state: failed to retrieve lock info for lock ID \"{PROBE_ID}\": operation error DynamoDB: GetItem, exceeded maximum number of attempts, 3, https response error StatusCode: 0, RequestID: , request send failed, Post \"http://127.0.0.1:45999/\": dial tcp 127.0.0.1:45999: connect: connection refused\n"
        ),
    }
}

/// What `force-unlock` prints for lock `l` of state key `k`, taken by terraform `holder` (its
/// Version): 1.0.3's byte-exact shape (docs/notes/terraform-facts.md 3a; 1.11.4 has the same
/// `lock id %q does not match existing lock` and Lock Info template).
fn held_output(l: &Lock, k: LockKey, holder: Tf) -> String {
    let version = match holder {
        Tf::V1_0_3 => "1.0.3",
        Tf::V1_11 => "1.11.4",
    };
    let prefix = if k.1 == 0 {
        String::new()
    } else {
        format!("env:/{}/", workspace_name(k.1))
    };
    format!(
        "Failed to unlock state: lock id \"{PROBE_ID}\" does not match existing lock\nLock Info:\n  ID:        {}\n  Path:      tfstate/{prefix}states/s{}.tfstate\n  Operation: OperationTypeApply\n  Who:       {}\n  Version:   {version}\n  Created:   {}\n  Info:      \n\n",
        lock_id(l.id),
        k.0,
        l.who,
        go_time(l.created_ms)
    )
}

/// The model's lock `id` as terraform's UUID-shaped lock ID.
fn lock_id(id: u64) -> String {
    format!("5e1d6a0c-4f0b-4b3a-9f1e-{id:012x}")
}

/// The model's lock id of terraform's lock ID `id` (see [`lock_id`]).
fn model_lock_id(id: &str) -> Option<u64> {
    u64::from_str_radix(id.rsplit('-').next()?, 16).ok()
}

/// `ms` since the epoch as Go's time.Time String() in UTC, as terraform prints Created
/// (`2026-11-21 23:56:11.330240859 +0000 UTC`; the model's clocks have milliseconds).
fn go_time(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}000000 +0000 UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

#[test]
fn a_created_stamp_reads_back_through_lockinfo() {
    for ms in [
        EPOCH_MS,
        EPOCH_MS + 86_399_999,
        1_795_305_371_330,
        951_782_400_000,
    ] {
        assert_eq!(
            lockinfo::parse_go_time(&go_time(ms)),
            Some(ms),
            "{}",
            go_time(ms)
        );
    }
    assert_eq!(
        go_time(1_795_305_371_330),
        "2026-11-21 23:56:11.330000000 +0000 UTC"
    );
}

/// `terraform force-unlock -force <id>`: releases the lock if it still has that id.
/// As s3/client.go `Unlock` does it (docs/notes/terraform-facts.md 3d): a GetItem at one
/// moment compares the id, and only on a match a DeleteItem at a later moment deletes whatever
/// lock is there then, unconditionally (this is why recoveries go one at a time,
/// `recover.lock`). Whether the id matched: terraform's exit status.
async fn unlock(sim: &Sim, _node: usize, info: &LockInfo, judged: Judged) -> bool {
    let id: u64 = model_lock_id(&info.id).unwrap_or(u64::MAX);
    let (read_at, delete_at, done, key) = sim.with(|w| {
        let dur = w.rng.range(200, 2000);
        let read_at = w.rng.range(w.now, w.now + dur);
        (
            read_at,
            w.rng.range(read_at, w.now + dur),
            w.now + dur,
            w.key_of(&judged.rec),
        )
    });
    let slot = Rc::new(std::cell::RefCell::new(false));
    let s2 = Rc::clone(&slot);
    sim.with(|w| {
        w.at(
            read_at,
            Ev::Call(Box::new(move |w| {
                // terraform dies with the helper's container: killed before the compare's
                // answer, it sends no delete (one sent before lands all the same).
                let Some(k) = key.filter(|_| w.helpers[judged.helper].alive) else {
                    return;
                };
                if w.locks.get(&k).map(|l| l.id) != Some(id) {
                    return;
                }
                *s2.borrow_mut() = true;
                let delete = move |w: &mut World| w.force_unlock(k, id, &judged);
                if delete_at == w.now {
                    delete(w);
                } else {
                    w.at(delete_at, Ev::Call(Box::new(delete)));
                }
            })),
        )
    });
    sim.sleep_until(done).await;
    let ok = *slot.borrow();
    ok
}

/// Removes record `id` (after Free, NotOurs, Unlocked).
async fn remove(sim: &Sim, c: &Ctx, id: u64) {
    let _ = sim
        .write(c.node, move |w| {
            w.store.records.remove(&id);
        })
        .await;
}

impl World {
    /// The key of the lock a run of `rec` takes: the state its directory's backend names, and
    /// its workspace.
    pub fn key_of(&self, rec: &Record) -> Option<LockKey> {
        let dir = self.cfg.dirs.get(dir_of(&rec.workdir)? as usize)?;
        let ws = (0..self.cfg.workspaces).find(|ws| workspace_name(*ws) == rec.workspace)?;
        Some((dir.state, ws))
    }

    /// A helper ended: `recover.lock` goes to the next waiter, its init hears of it.
    pub fn helper_exit(&mut self, h: usize) {
        if !self.helpers[h].alive {
            return;
        }
        self.helpers[h].alive = false;
        self.release_recover_lock(h);
        let now = self.now;
        if let Some(inc) = self.helpers[h].init.filter(|i| self.incs[*i].alive) {
            self.at(now, Ev::Loop(inc, LoopEv::HelperExit { helper: h }));
        }
    }

    /// Helper `h`'s flock on `recover.lock` is gone (it ended, or died).
    pub fn release_recover_lock(&mut self, h: usize) {
        self.store.recover_queue.retain(|x| *x != h);
        if self.store.recover_holder != Some(h) {
            return;
        }
        self.store.recover_holder = None;
        while let Some(next) = self.store.recover_queue.pop_front() {
            if self.helpers[next].alive {
                self.store.recover_holder = Some(next);
                let task = self.helpers[next].task;
                let now = self.now;
                self.at(now, Ev::Wake(task));
                break;
            }
        }
    }

    /// The force-unlock's delete lands: whatever lock is at `key` goes (its id was `id` when
    /// terraform compared it). Safety: its holder must be dead.
    pub fn force_unlock(&mut self, key: LockKey, id: u64, j: &Judged) {
        let Some(lock) = self.locks.remove(&key) else {
            return;
        };
        let holder = lock.holder;
        let other = lock.id != id;
        let id = lock.id;
        self.log(|| {
            format!(
                "helper {} force-unlocks lock {id} of process {holder} ({})",
                j.helper, j.why
            )
        });
        if self.procs[holder].state == PState::Dead {
            self.stats.unlocks += 1;
            return;
        }
        let cause = if other {
            Cause::UnlockRace
        } else {
            self.classify(holder, j)
        };
        let p = &self.procs[holder];
        let text = format!(
            "helper {} (of {}, TTL {} ms) force-unlocked lock {id} of state s{} {} held by live process {holder} (run {} of {} in /tf/w{}, TTL {} ms, started at {} ms), recovering record of run {} of {} in {} ({}), because: {}",
            j.helper,
            self.helpers[j.helper].me.key(),
            self.helpers[j.helper].ttl,
            key.0,
            workspace_name(key.1),
            p.run,
            self.incs[p.inc].key,
            p.workdir,
            self.incs[p.inc].ttl,
            p.started,
            j.rec.run_id,
            j.rec.owner.key(),
            j.rec.workdir,
            j.rec.who,
            j.why
        );
        self.fail(VKind::Safety(cause), text);
    }

    /// What made a helper unlock a live holder's lock.
    fn classify(&self, holder: usize, j: &Judged) -> Cause {
        let p = &self.procs[holder];
        let h = &self.helpers[j.helper];
        let own_run = self.incs[p.inc].owner.same_incarnation(&j.rec.owner)
            && p.run.to_string() == j.rec.run_id;
        if own_run {
            let key = &self.incs[p.inc].key;
            let shared = self
                .incs
                .iter()
                .enumerate()
                .any(|(i, x)| i != p.inc && x.alive && x.key == *key);
            if shared {
                return Cause::SharedKey;
            }
            if self.create_failed(p.inc, p.run) {
                return Cause::LandedButFailed;
            }
            if self.cfg.rules == Rules::New {
                // Issue 23 finding 3: the kernel "proved" it gone on a file that replaced its own.
                if j.why.contains("kernel freed") && self.lock_file_replaced(p.inc) {
                    return Cause::ReplacedLockFile;
                }
                // Finding 1: it beats and fences by a TTL longer than the one it was judged by.
                if self.incs[p.inc].ttl > h.ttl {
                    return Cause::OwnersTtl;
                }
                return Cause::Other;
            }
            if j.why.contains("earlier incarnation")
                || j.why.contains("restarted since")
                || j.hb_other
            {
                return Cause::SharedName;
            }
            let Some(stamped) = j.hb_stamped else {
                return Cause::Other;
            };
            // The heartbeat read was younger than the TTL in real time: only the two nodes'
            // wall clocks made it look older.
            if j.decided_at.saturating_sub(stamped) <= self.cfg.ttl {
                return Cause::Skew;
            }
            let stale = self
                .store
                .records
                .values()
                .any(|s| s.inc == p.inc && s.rec.run_id == p.run.to_string() && s.landed_stale);
            return if stale {
                Cause::StaleRecord
            } else {
                Cause::NoFence
            };
        }
        // Finding 2: a live run with the record's Who on the same state, in another directory.
        let rec_dir = dir_of(&j.rec.workdir);
        let same_state = rec_dir.is_some_and(|d| self.cfg.dirs[d as usize].state == p.key.0);
        if self.cfg.rules == Rules::New
            && p.who == j.rec.who
            && rec_dir != Some(p.workdir)
            && same_state
        {
            return Cause::SameState;
        }
        if Some(p.inc) == h.init && p.started >= h.started {
            return Cause::TwoHelpers;
        }
        if self.cfg.rules == Rules::New && Some(p.inc) == h.init && p.who == j.rec.who {
            return Cause::InitsLiveRun;
        }
        if p.who == j.rec.who && self.incs[p.inc].owner.same_incarnation(&j.rec.owner) {
            return Cause::OwnUnrecorded;
        }
        if p.who == j.rec.who && Some(p.inc) != h.init {
            return Cause::SameWho;
        }
        Cause::Other
    }

    /// Whether the file at incarnation `inc`'s lock path is not the one it locked.
    pub fn lock_file_replaced(&self, inc: usize) -> bool {
        let i = &self.incs[inc];
        self.store
            .lock_files
            .get(&i.key)
            .is_some_and(|f| i.lock_ino.is_some_and(|ino| ino != f.ino))
    }

    /// What the kernel of `node` says at time `t` of `owner`'s lock file, when it is the file
    /// `file` (`Store::incarnation_gone`): the file at the path is compared with `file` by the
    /// store's own rule (`same_lock_file`), then its flock is tested. On this kernel, whether
    /// every process holding it (the init that took it and its terraform runs) is gone; from
    /// another kernel, or on a copy nobody locked, "free", which proves nothing of the owner:
    /// the boot-id and inode checks must refuse it, not luck.
    pub fn incarnation_gone_at(
        &self,
        node: usize,
        owner: &Owner,
        file: FileId,
        t: Ms,
    ) -> Option<bool> {
        let found = self.store.lock_files.get(&owner.key())?;
        let id = FileId {
            dev: super::world::VOLUME_DEV,
            ino: found.ino,
        };
        if !tfinit::locks::store::same_lock_file(id, file) {
            return None;
        }
        match found.holder {
            Some(h) if self.incs[h].node == node => Some(!self.flock_held(h, t)),
            _ => Some(true),
        }
    }
}
