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
use tfinit::locks::lockinfo::LockInfo;
use tfinit::locks::record::{Heartbeat, Owner, Record};
use tfinit::locks::recover::{decide, live_on_host, Decision, Window, CLOCK_SKEW};
use tfinit::locks::state::{self, StateOf};
use tfinit::locks::store::kernel_proof_with;
use tfinit::locks::who::who_host;
use tfinit::mutation::{self, Guard};

use super::backend::{probe, unlock, Probe};
use super::exec::{list, read_heartbeat, read_heartbeat_by_name, Sim, WaitFor};
use super::lease_store;
use super::legacy;
use super::recovery_lease;
use super::world::{workdir_path, BookSide, Ms, Rules, Tf, World};

/// How often the helper re-reads a heartbeat it watches (recover/mod.rs: WATCH_EVERY).
const WATCH_EVERY: Duration = Duration::from_millis(500);
/// How long it waits for another recovery's `recover.lock` (recover/mod.rs: LOCK_WAIT).
const LOCK_WAIT: Ms = 250_000;

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
    // The recovery Lease, if it holds it, is deleted as the recovery ends.
    if sim.with(|w| w.cfg.leases && w.helpers[h].alive) {
        let node = sim.with(|w| w.helpers[h].node);
        recovery_lease::release(&sim, h, node).await;
    }
    sim.with(|w| w.helper_exit(h));
}

/// What a helper knows when it starts.
pub struct Ctx {
    pub h: usize,
    pub node: usize,
    pub me: Owner,
    /// Its own TFINIT_OWNER_TTL.
    pub ttl: Duration,
    /// The directory it recovers (None: every record).
    pub workdir: Option<u8>,
    pub tf: Tf,
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
    let found = if sim.with(|w| w.cfg.leases) {
        // The list, and the unreadable record Leases in it set aside (`set_aside_corrupt`).
        let mut kube = lease_store::Client::new(c.node);
        let (found, bad) = kube.records(sim).await.unwrap_or_default();
        kube.set_aside(sim, &bad).await;
        found
    } else {
        list(sim, c.node).await
    };
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
    for hb in heartbeats(sim, c.node).await.unwrap_or_default() {
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

/// One read of `owner`'s heartbeat, fed to `observer` when the store answered (recover/mod.rs
/// `read_beat`: a read with no answer is no observation); returns when it started (simulated
/// time).
async fn read_beat(sim: &Sim, c: &Ctx, observer: &mut Observer, owner: &Owner) -> Ms {
    let (start, started) = sim.with(|w| (w.now, w.mono(c.node)));
    let token = match read_heartbeat(sim, c.node, owner).await {
        Ok(hb) => hb.as_ref().map(Token::of),
        Err(_) if mutation::on(Guard::UnansweredRead) => return start,
        Err(_) => None,
    };
    let done = sim.with(|w| w.mono(c.node));
    observer.saw(&owner.key(), token, started, done);
    start
}

/// What the kernel says of `owner`'s lock file (recover/mod.rs: `kernel`): its heartbeat, read now,
/// and the store's one rule (`kernel_proof_with`) on this node's kernel.
async fn kernel(sim: &Sim, c: &Ctx, owner: &Owner) -> Option<bool> {
    let hb = read_heartbeat(sim, c.node, owner).await.ok().flatten();
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
    // A right to recover that must be renewed (the recovery Lease) and may have lapsed: nothing
    // is released (`RecoveryLock::held`).
    if mutation::on(Guard::RecoveryHeld)
        && mutation::on(Guard::RecoverLock)
        && sim.with(|w| w.cfg.leases && !recovery_lease::held(w, c.h, c.node))
    {
        return outcome(
            "the right to recover was not renewed in time",
            String::new(),
        );
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
    // recover/evidence.rs: evidence the store gave no answer for leaves the lock alone.
    let mut unread = Vec::new();
    let hb = read_heartbeat(sim, c.node, &rec.owner)
        .await
        .unwrap_or_else(|e| {
            unread.push(format!("the heartbeat of owner {} ({e})", rec.owner.name));
            None
        });
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
    let beats = heartbeats(sim, c.node).await.unwrap_or_else(|e| {
        unread.push(format!("the heartbeats of the tfinits ({e})"));
        Vec::new()
    });
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
        unread: (!unread.is_empty() && mutation::on(Guard::UnansweredRead))
            .then(|| unread.join("; ")),
    }
}

/// Every heartbeat file of today's format, as `Store::heartbeats` lists them.
async fn heartbeats(sim: &Sim, node: usize) -> Result<Vec<Heartbeat>, String> {
    if sim.with(|w| w.cfg.leases) {
        return lease_store::Client::new(node).heartbeats(sim, None).await;
    }
    let beats = sim
        .read(node, |w| {
            w.store
                .beats
                .iter()
                .filter_map(|(k, v)| v.last().filter(|b| b.hb.v == 2 && b.hb.owner.key() == *k))
                .map(|b| (*b.hb).clone())
                .collect::<Vec<_>>()
        })
        .await;
    // The simulated volume answers every read.
    Ok(beats)
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
        unread: None,
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
    if sim.with(|w| w.cfg.leases) {
        let (node, me, ttl) = sim.with(|w| {
            let x = &w.helpers[h];
            (x.node, x.me.key(), Duration::from_millis(x.ttl))
        });
        return recovery_lease::take(sim, h, node, &me, ttl, LOCK_WAIT).await;
    }
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

/// Removes record `id` (after Free, NotOurs, Unlocked).
async fn remove(sim: &Sim, c: &Ctx, id: u64) {
    if sim.with(|w| w.cfg.leases) {
        let _ = lease_store::Client::new(c.node).remove(sim, id).await;
        return;
    }
    let _ = sim
        .write(c.node, move |w| {
            w.store.records.remove(&id);
        })
        .await;
}
