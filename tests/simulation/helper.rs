//! The recovery helper process (`tfinit __recover` for one working directory), as a task: the
//! procedure of `Recovery::run` in src/locks/recover.rs step by step (import the loop's watches,
//! watch undecided owners every 500 ms, take `recover.lock`, list, and for each record: a fresh
//! liveness check, the probe, `decide`, the re-check of liveness and records right before the
//! force-unlock), every storage call and terraform run a timed operation. The decisions are the
//! real ones: `Observer`, `run_state`, `last_alive_ms`, `decide`. Under `Rules::Legacy` it is
//! the old helper: `recover.lock` first, one listing, the old wall-clock rules, no re-check.

use std::rc::Rc;
use std::time::Duration;

use tfinit::locks::liveness::{
    last_alive_ms, run_state, Facts, Observer, RunState, Token, Verdict, LONGEST_TTL,
};
use tfinit::locks::lockinfo::LockInfo;
use tfinit::locks::record::{Heartbeat, Owner, Record};
use tfinit::locks::recover::{decide, live_on_host, Decision, Window, CLOCK_SKEW};
use tfinit::locks::who::who_host;

use super::legacy;
use super::world::{
    list, read_heartbeat, read_heartbeat_by_name, workdir_path, workspace_name, BookSide, Cause,
    Ev, LoopEv, Ms, PState, Rules, Sim, VKind, WaitFor, World,
};

/// How often the helper re-reads a heartbeat it watches (recover.rs: WATCH_EVERY).
const WATCH_EVERY: Duration = Duration::from_millis(500);
/// How long it waits for another recovery's `recover.lock` (recover.rs: LOCK_WAIT).
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
    ttl: Duration,
    workdir: String,
}

fn ctx(w: &World, h: usize) -> Ctx {
    let inc = w.helpers[h].inc;
    Ctx {
        h,
        node: w.incs[inc].node,
        me: w.incs[inc].owner.clone(),
        ttl: w.cfg.ttl_d(),
        workdir: workdir_path(w.helpers[h].workdir)
            .to_string_lossy()
            .into_owned(),
    }
}

async fn new_helper(sim: &Sim, h: usize) {
    let (c, mut observer) = sim.with(|w| {
        let c = ctx(w, h);
        let inc = w.helpers[h].inc;
        let seen = match &w.incs[inc].book {
            BookSide::New(b) => {
                let node = &w.nodes[c.node];
                b.observations(|i| node.ns(i))
            }
            BookSide::Old(_) => Vec::new(),
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
        .filter(|(_, r)| r.workdir == c.workdir)
        .map(|(_, r)| r)
        .collect();
    watch(sim, &c, &mut observer, &listed).await;
    if !lock_recovery(sim, h).await {
        return;
    }
    let found = list(sim, c.node).await;
    for (id, rec) in &found {
        if rec.workdir != c.workdir {
            continue;
        }
        one(sim, &c, &mut observer, *id, rec, &found).await;
    }
}

/// Watches the owners of `records`, and the tfinits on the hosts their `Who` names (recover.rs:
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
            let now = sim.with(|w| w.mono(c.node));
            match observer.verdict(&o.key(), now) {
                Verdict::Watching { left } => longest = longest.max(left),
                Verdict::Dead { .. } => {
                    sim.with(|w| w.check_dead_verdict(&format!("helper {}", c.h), o, start));
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

/// What the kernel says of `owner`'s lock file when it ran on this kernel and said it held it
/// (recover.rs: `kernel`): Some(true) every process of it is gone, Some(false) one holds it.
async fn kernel(sim: &Sim, c: &Ctx, owner: &Owner) -> Option<bool> {
    if owner.boot_id.is_empty() || owner.boot_id != c.me.boot_id {
        return None;
    }
    let holds = read_heartbeat(sim, c.node, owner)
        .await
        .is_some_and(|h| h.holds_lock);
    if !holds {
        return None;
    }
    sim.with(|w| w.incarnation_gone(c.node, owner))
}

/// Whether `rec`'s run is over, with a fresh read of its owner's heartbeat.
async fn state_now(sim: &Sim, c: &Ctx, observer: &mut Observer, rec: &Record) -> RunState {
    let facts = Facts::of(rec);
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
        sim.with(|w| w.check_dead_verdict(&format!("helper {}", c.h), &rec.owner, start));
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
    let info = match probe(sim, c.node, rec).await {
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

/// recover.rs's `window`, with its reads.
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
    let mut twin = None;
    for (p, r) in all {
        if *p != id
            && r.workdir == rec.workdir
            && r.workspace == rec.workspace
            && r.who == info.who
            && !matches!(state_now(sim, c, observer, r).await, RunState::Over(_))
        {
            twin = Some(format!("{} of {}", r.run_id, r.owner.name));
            break;
        }
    }
    // recover.rs: any tfinit that may be alive on the host the lock's Who names (its runs, with
    // records or not, lock as that Who): every heartbeat file, then a liveness read of each one
    // on that host, in order, until one may be alive.
    let beats = heartbeats(sim, c.node).await;
    let host = who_host(&info.who).to_string();
    let mut first_alive = None;
    for hb in &beats {
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
    let live = sim.with(|w| live_same_who(w, c.h, rec, info));
    Window {
        not_before_ms: rec.started_ms.saturating_sub(skew),
        not_after_ms: last_alive_ms(&Facts::of(rec), hb.as_ref(), c.ttl).saturating_add(skew),
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

/// A live run of the helper's own init (as it was when the helper started) with the same Who.
fn live_same_who(w: &World, h: usize, rec: &Record, info: &LockInfo) -> Option<String> {
    w.helpers[h]
        .live
        .iter()
        .find(|l| {
            l.workdir == std::path::Path::new(&rec.workdir)
                && l.workspace == rec.workspace
                && l.who == info.who
        })
        .map(|_| "a run of this init".to_string())
}

async fn legacy_helper(sim: &Sim, h: usize) {
    let c = sim.with(|w| ctx(w, h));
    if !lock_recovery(sim, h).await {
        return;
    }
    let found = list(sim, c.node).await;
    for (id, rec) in &found {
        if rec.workdir != c.workdir {
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
    let info = match probe(sim, c.node, rec).await {
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
    let live = sim.with(|w| live_same_who(w, c.h, rec, &info));
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

/// `terraform force-unlock -force <id that cannot match>`: reads the lock at one moment.
async fn probe(sim: &Sim, _node: usize, rec: &Record) -> Probe {
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
                *s2.borrow_mut() = Some(key.and_then(|k| w.locks.get(&k).cloned()));
            })),
        )
    });
    sim.sleep_until(done).await;
    if unknown {
        return Probe::Unknown;
    }
    let seen = slot.borrow_mut().take().flatten();
    match seen {
        None => Probe::Free,
        Some(l) => Probe::Held(LockInfo {
            id: format!("{}", l.id),
            path: "tfstate".into(),
            operation: "OperationTypeApply".into(),
            who: l.who,
            version: "1.5.7".into(),
            created: format!("{} ms", l.created_ms),
            created_ms: Some(l.created_ms),
            info: String::new(),
        }),
    }
}

/// `terraform force-unlock -force <id>`: releases the lock if it still has that id.
async fn unlock(sim: &Sim, _node: usize, info: &LockInfo, judged: Judged) -> bool {
    let id: u64 = info.id.parse().unwrap_or(u64::MAX);
    let (at, done, key) = sim.with(|w| {
        let dur = w.rng.range(200, 2000);
        (
            w.rng.range(w.now, w.now + dur),
            w.now + dur,
            w.key_of(&judged.rec),
        )
    });
    let slot = Rc::new(std::cell::RefCell::new(false));
    let s2 = Rc::clone(&slot);
    sim.with(|w| {
        w.at(
            at,
            Ev::Call(Box::new(move |w| {
                if let Some(k) = key {
                    *s2.borrow_mut() = w.force_unlock(k, id, &judged);
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
    /// The backend lock key of a record's workdir and workspace.
    pub fn key_of(&self, rec: &Record) -> Option<(u8, u8)> {
        let w: u8 = rec.workdir.strip_prefix("/tf/w")?.parse().ok()?;
        let ws = (0..self.cfg.workspaces).find(|ws| workspace_name(*ws) == rec.workspace)?;
        Some((w, ws))
    }

    /// A helper ended: `recover.lock` goes to the next waiter, its init hears of it.
    pub fn helper_exit(&mut self, h: usize) {
        if !self.helpers[h].alive {
            return;
        }
        self.helpers[h].alive = false;
        self.release_recover_lock(h);
        let inc = self.helpers[h].inc;
        let now = self.now;
        if self.incs[inc].alive {
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

    /// The force-unlock lands: the lock goes if it still has `id`. Safety: its holder must be
    /// dead.
    pub fn force_unlock(&mut self, key: (u8, u8), id: u64, j: &Judged) -> bool {
        if self.locks.get(&key).map(|l| l.id) != Some(id) {
            return false;
        }
        let lock = self.locks.remove(&key).expect("checked above");
        let holder = lock.holder;
        self.log(|| {
            format!(
                "helper {} force-unlocks lock {id} of process {holder} ({})",
                j.helper, j.why
            )
        });
        if self.procs[holder].state == PState::Dead {
            self.stats.unlocks += 1;
            return true;
        }
        let cause = self.classify(holder, j);
        let p = &self.procs[holder];
        let text = format!(
            "helper {} (of {}) force-unlocked lock {id} in /tf/w{} {} held by live process {holder} (run {} of {}, started at {} ms), recovering record of run {} of {} ({}), because: {}",
            j.helper,
            self.incs[self.helpers[j.helper].inc].key,
            key.0,
            workspace_name(key.1),
            p.run,
            self.incs[p.inc].key,
            p.started,
            j.rec.run_id,
            j.rec.owner.key(),
            j.rec.who,
            j.why
        );
        self.fail(VKind::Safety(cause), text);
        true
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
        if p.inc == h.inc && p.started >= h.started {
            return Cause::TwoHelpers;
        }
        if p.who == j.rec.who && self.incs[p.inc].owner.same_incarnation(&j.rec.owner) {
            return Cause::OwnUnrecorded;
        }
        if p.who == j.rec.who && p.inc != h.inc {
            return Cause::SameWho;
        }
        Cause::Other
    }
}
