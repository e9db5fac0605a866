//! The init's loop, as far as records and locks go: today's is the real code (the runs and the
//! records of src/init, driven through `tfinit::init::sim_seam` as the supervisor drives them:
//! a state-locking run's lock check, its recovery, its record, its launch, the book's timers and
//! fence, what happens when terraform ends), this file being the world's side of it: what starts
//! terraform or a helper, the signals, the recorder's channel, the clocks, the progress owed.
//! Under `Rules::Legacy` the book is the old one and the loop its model (`legacy_init.rs`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use nix::unistd::Pid;
use tfinit::init::sim_seam::{self, Loop};
use tfinit::locks::book::{Book, LiveRun};
use tfinit::locks::liveness::{last_alive_ms, Facts};
use tfinit::locks::names::RunId;
use tfinit::locks::record::Record;
use tfinit::locks::recorder::Work;
use tfinit::locks::recover::CLOCK_SKEW;
use tfinit::locks::who::who_host;
use tfinit::mutation;

use super::check::{Obligation, CALM_OP_MAX};
use super::helper::dir_of;
use super::terraform::{PState, Proc};
use super::world::{
    workdir_path, workspace_name, BookSide, Comp, Ev, Helper, LoopEv, Rules, Spawn, Stored, World,
};

/// The helper's probe and unlock take at most this long (backend.rs).
const PROBE_MAX: u64 = 2_000;

/// The pids of recovery helpers start here (terraform process `p` is pid `p + 2`).
const HELPER_PIDS: i32 = 1_000_000_000;

/// Today's init: the real runs and records, and what the world knows of its runs.
#[derive(Debug)]
pub struct Today {
    /// The loop (out of here while it runs: it calls the world).
    lp: Option<Loop>,
    /// Each run's directory and workspace (what its terraform locks).
    runs: BTreeMap<RunId, (u8, u8)>,
    /// The observer's calm-phase runs that wait for their lock check, until their deadline.
    awaiting: BTreeMap<RunId, (u8, u8, Instant)>,
    /// The id of the next run (runs/mod.rs gives ids in order, from r1).
    next: u64,
}

impl Today {
    /// An init whose book is `book`, its TTL `ttl`, its TFINIT_RECORD_TIMEOUT `record_timeout`.
    pub fn new(book: Book, ttl: std::time::Duration, record_timeout: std::time::Duration) -> Today {
        Today {
            lp: Some(Loop::new(book, Path::new("/state"), ttl, record_timeout)),
            runs: BTreeMap::new(),
            awaiting: BTreeMap::new(),
            next: 1,
        }
    }

    fn lp(&self) -> &Loop {
        self.lp.as_ref().expect("the loop is back after each event")
    }

    /// Run `run`'s record status (the book's, read in the runs' table), if the book knows it.
    pub fn record(&self, run: RunId) -> Option<&tfinit::locks::book::RecordStatus> {
        self.lp().record(run)
    }
}

/// What the world reads of today's init is its book (helper.rs, check.rs): read-only.
impl std::ops::Deref for Today {
    type Target = Book;

    fn deref(&self) -> &Book {
        self.lp().book()
    }
}

/// The world, as today's loop sees it while it runs for incarnation `inc`.
struct Fx<'a> {
    w: &'a mut World,
    inc: usize,
}

impl Fx<'_> {
    fn today(&self) -> &Today {
        match &self.w.incs[self.inc].book {
            BookSide::New(t) => t,
            BookSide::Old(_) => unreachable!("today's loop runs today's book"),
        }
    }
}

impl sim_seam::World for Fx<'_> {
    fn spawn(&mut self, run: RunId) -> Pid {
        let (workdir, ws) = self.today().runs[&run];
        let p = self.w.start_terraform(self.inc, run, workdir, ws);
        Pid::from_raw(p as i32 + 2)
    }

    fn recover(&mut self, run: RunId, _workdir: &Path, live: Vec<LiveRun>) -> Pid {
        let (workdir, _) = self.today().runs[&run];
        let h = self.w.start_helper(self.inc, run, workdir, live);
        Pid::from_raw(HELPER_PIDS + h as i32)
    }

    fn sigterm(&mut self, pid: Pid) {
        let p = proc_of(pid).expect("SIGTERM goes to terraform only");
        self.w.sigterm(p);
    }

    fn sigkill(&mut self, pgid: Pid) {
        // A helper is SIGKILLed only by the shutdown's kill step or a cancel: neither is modelled.
        let p = proc_of(pgid).expect("no recovery helper is SIGKILLed in the model");
        self.w.sigkill(p);
    }
}

/// The terraform process of pid `pid`, if it is one.
fn proc_of(pid: Pid) -> Option<usize> {
    let raw = pid.as_raw();
    (2..HELPER_PIDS).contains(&raw).then(|| raw as usize - 2)
}

impl World {
    /// An event that is not a task's.
    pub fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Loop(inc, lev) => self.on_loop(inc, lev),
            Ev::Proc(p, gen) => self.on_proc_timer(p, gen),
            Ev::Env(n) => self.on_env(n),
            Ev::Hard(pod) => {
                if let Some(inc) = self.pods[pod].inc {
                    self.kill_inc(inc, "the kubelet's SIGKILL at the end of the grace period");
                }
            }
            Ev::Wake(_) | Ev::Call(_) => unreachable!("the executor runs these"),
        }
    }

    fn on_loop(&mut self, inc: usize, lev: LoopEv) {
        if !self.incs[inc].alive {
            return;
        }
        if matches!(lev, LoopEv::Wake) && self.incs[inc].wake_pending == Some(self.now) {
            self.incs[inc].wake_pending = None;
        }
        if let Some(end) = self.frozen_until(self.incs[inc].pod) {
            self.at(end, Ev::Loop(inc, lev));
            return;
        }
        match self.cfg.rules {
            Rules::New => self.on_loop_today(inc, lev),
            Rules::Legacy => self.on_loop_legacy(inc, lev),
        }
        self.maybe_exit(inc);
        self.schedule_wake(inc);
    }

    pub fn mono_of(&self, inc: usize) -> Instant {
        self.mono(self.incs[inc].node)
    }

    /// An event for today's loop, then its timers (as event_loop.rs: the dispatch, then the
    /// timers).
    fn on_loop_today(&mut self, inc: usize, lev: LoopEv) {
        let now = self.mono_of(inc);
        match lev {
            LoopEv::Wake => {}
            LoopEv::Request {
                workdir,
                ws,
                observed,
            } => self.request(inc, workdir, ws, observed),
            LoopEv::Reaped { proc } => {
                let (pid, killed) = (Pid::from_raw(proc as i32 + 2), self.procs[proc].killed);
                self.with_loop(inc, |lp, fx| lp.reaped(fx, pid, killed, now));
            }
            LoopEv::HelperExit { helper } => {
                let pid = Pid::from_raw(HELPER_PIDS + helper as i32);
                self.with_loop(inc, |lp, fx| lp.reaped(fx, pid, false, now));
            }
        }
        self.with_loop(inc, |lp, fx| lp.timers(fx, now));
    }

    /// A shim asks for a state-locking run (control.rs: the news first, then runs' `request`).
    /// A calm-phase run of the observer owes progress from its lock check: at once when the
    /// store is open and no recovery of this init runs (before terraform may start), else when
    /// it leaves its wait (`settle_observed`).
    fn request(&mut self, inc: usize, workdir: u8, ws: u8, observed: bool) {
        let now = self.mono_of(inc);
        self.with_loop(inc, |lp, fx| lp.news(fx, now));
        let today = self.today(inc);
        let checks_now = !today.lp().book().opening() && !today.lp().recovering();
        if observed && checks_now {
            self.owe(inc, workdir, ws);
        }
        let key = self.incs[inc].key.clone();
        let today = self.today_mut(inc);
        let k = today.next;
        today.runs.insert(RunId::from(k), (workdir, ws));
        self.log(|| {
            format!(
                "{key}: run r{k} asked for in /tf/w{workdir} {}",
                workspace_name(ws)
            )
        });
        let (path, name) = (workdir_path(workdir), workspace_name(ws));
        let asked = (path.as_path(), name.as_str(), &["apply"][..]);
        let run = self.with_loop(inc, |lp, fx| {
            let run = lp.request(fx, asked, now)?;
            Some((run, lp.awaiting_until(run)))
        });
        let today = self.today_mut(inc);
        let Some((run, waits)) = run else {
            // Refused (the init is stopping): no id was used.
            today.runs.remove(&RunId::from(k));
            return;
        };
        assert_eq!(run, RunId::from(k), "runs/mod.rs gives ids in order");
        today.next += 1;
        if let Some(deadline) = waits.filter(|_| observed) {
            today.awaiting.insert(run, (workdir, ws, deadline));
        }
    }

    /// Runs today's loop of `inc` with the world's part played by the world: the recorder's
    /// completions go in its channel first, the work it sent goes to the recorder after, and
    /// the wall clock its code reads is the node's.
    fn with_loop<R>(&mut self, inc: usize, f: impl FnOnce(&mut Loop, &mut Fx) -> R) -> R {
        let _wall = mutation::at_wall_ms(self.wall(self.incs[inc].node));
        let mut lp = self
            .today_mut(inc)
            .lp
            .take()
            .expect("one loop event at a time");
        for c in std::mem::take(&mut self.incs[inc].inbox) {
            let Comp::New(c) = c else {
                unreachable!("one kind of completion per rule set")
            };
            lp.deliver(c);
        }
        let out = f(&mut lp, &mut Fx { w: self, inc });
        let sent = lp.take_sent();
        self.today_mut(inc).lp = Some(lp);
        for r in sent {
            self.send_request(inc, r);
        }
        self.settle_observed(inc);
        out
    }

    /// The observer's runs that left their wait for the store before its end had their lock
    /// checked (runs' `resume_awaiting`): they owe progress from now. One that left at its end
    /// went on without a check, and owes nothing.
    fn settle_observed(&mut self, inc: usize) {
        let now = self.mono_of(inc);
        let today = self.today(inc);
        let left: Vec<(RunId, u8, u8, Instant)> = today
            .awaiting
            .iter()
            .filter(|(run, _)| today.lp().awaiting_until(**run).is_none())
            .map(|(run, (w, ws, d))| (*run, *w, *ws, *d))
            .collect();
        for (run, workdir, ws, deadline) in left {
            self.today_mut(inc).awaiting.remove(&run);
            if now < deadline {
                self.owe(inc, workdir, ws);
            }
        }
    }

    fn today(&self, inc: usize) -> &Today {
        match &self.incs[inc].book {
            BookSide::New(t) => t,
            BookSide::Old(_) => unreachable!("today's loop runs today's book"),
        }
    }

    fn today_mut(&mut self, inc: usize) -> &mut Today {
        match &mut self.incs[inc].book {
            BookSide::New(t) => t,
            BookSide::Old(_) => unreachable!("today's loop runs today's book"),
        }
    }

    /// SIGTERM to the init: runs not started are refused, and so are new ones; terraform gets
    /// SIGTERM; the init exits when they are gone (the kubelet kills it at the end of the grace
    /// period).
    pub fn stop_inc(&mut self, inc: usize) {
        self.incs[inc].stopping = true;
        match self.cfg.rules {
            Rules::New => {
                let now = self.mono_of(inc);
                self.with_loop(inc, |lp, fx| lp.stop(fx, now));
            }
            Rules::Legacy => self.stop_legacy(inc),
        }
        let now = self.now;
        self.at(now, Ev::Loop(inc, LoopEv::Wake));
    }

    /// terraform starts for run `run` of `inc` in `workdir`, workspace `ws`: its process.
    pub fn start_terraform(&mut self, inc: usize, run: RunId, workdir: u8, ws: u8) -> usize {
        let p = self.procs.len();
        let work = match self.rng.below(10) {
            0..=5 => self.rng.range(100, self.cfg.ttl),
            _ => self.rng.range(self.cfg.ttl, 3 * self.cfg.ttl),
        };
        let stubborn = self.rng.chance(150);
        self.procs.push(Proc {
            inc,
            run,
            workdir,
            key: (self.cfg.dirs[workdir as usize].state, ws),
            who: format!("@{}", self.incs[inc].host),
            state: PState::Starting,
            gen: 0,
            lock: None,
            started: self.now,
            work,
            stubborn,
            killed: false,
            died: u64::MAX,
        });
        let t = self.now + self.rng.range(20, 1500);
        self.at(t, Ev::Proc(p, 0));
        let key = self.incs[inc].key.clone();
        self.log(|| format!("{key}: terraform {p} starts for run {run} in /tf/w{workdir}"));
        p
    }

    /// The recovery helper of run `run` of `inc` starts in `workdir`, given the live runs
    /// `live`: its number.
    pub fn start_helper(
        &mut self,
        inc: usize,
        run: RunId,
        workdir: u8,
        live: Vec<LiveRun>,
    ) -> usize {
        let h = self.helpers.len();
        let task = self.spawn(Spawn::Helper(h), None);
        let i = &self.incs[inc];
        self.helpers.push(Helper {
            init: Some(inc),
            node: i.node,
            me: i.owner.clone(),
            ttl: i.ttl,
            tf: self.pods[i.pod].tf,
            workdir: Some(workdir),
            task,
            alive: true,
            live,
            started: self.now,
        });
        self.stats.helpers += 1;
        self.incs[inc].helpers.push(h);
        let key = self.incs[inc].key.clone();
        self.log(|| format!("{key}: helper {h} for run {run} in /tf/w{workdir}"));
        h
    }

    /// records.rs: a request to the recorder (its channel), counted while it is a write.
    pub fn send_request(&mut self, inc: usize, r: Work) {
        if matches!(
            r,
            Work::Create { .. } | Work::Progress { .. } | Work::End { .. } | Work::Remove { .. }
        ) {
            self.incs[inc].writes += 1;
        }
        self.incs[inc].requests.push(r);
        self.wake_recorder(inc);
    }

    fn wake_recorder(&mut self, inc: usize) {
        if std::mem::take(&mut self.incs[inc].rec_idle) {
            let task = self.incs[inc].rec_task;
            let now = self.now;
            self.at(now, Ev::Wake(task));
        }
    }

    /// The loop's next timer: the book's and the runs' (a run whose wait is blocked by a
    /// recovery goes on when that recovery ends: the helper's exit wakes the loop, and
    /// runs::next_wakeup leaves its deadline out; it once kept it there and woke every
    /// millisecond until then: `spin_ms` counted that and stays 0).
    fn schedule_wake(&mut self, inc: usize) {
        if !self.incs[inc].alive {
            return;
        }
        let next = match self.cfg.rules {
            Rules::New => self.today(inc).lp().next_wakeup(),
            Rules::Legacy => self.next_wakeup_legacy(inc),
        };
        let Some(next) = next else {
            return;
        };
        let mut t = self.nodes[self.incs[inc].node].real_at(next);
        if t <= self.now {
            // A timer already due after the tick: the real loop would wake again in 1 ms.
            self.stats.past_timers += 1;
            t = self.now + 1;
        }
        let now = self.now;
        let i = &mut self.incs[inc];
        if i.wake_at.is_none_or_past(now) || t < i.wake_at.unwrap_or(u64::MAX) {
            i.wake_at = Some(t);
            self.at(t, Ev::Loop(inc, LoopEv::Wake));
        }
    }

    /// A stopping init exits once its runs and helpers are gone (after at most 1 s for its
    /// record writes).
    fn maybe_exit(&mut self, inc: usize) {
        let i = &self.incs[inc];
        if !i.stopping || !self.no_runs(inc) {
            return;
        }
        let t = self.now + if i.writes == 0 { 50 } else { 1000 };
        self.at(
            t,
            Ev::Call(Box::new(move |w| {
                if w.incs[inc].alive && w.no_runs(inc) {
                    w.kill_inc(inc, "the init exited");
                }
            })),
        );
    }

    /// Whether incarnation `inc` has no run left.
    fn no_runs(&self, inc: usize) -> bool {
        match &self.incs[inc].book {
            BookSide::New(t) => t.lp().is_empty(),
            BookSide::Old(_) => self.incs[inc].runs.is_empty(),
        }
    }

    // Progress.

    /// A calm-phase run asked for in `workdir`/`ws` by incarnation `inc`, a live observer with a
    /// working volume: every lock of that directory's state held by a dead run that a record in
    /// the directory names is owed; and when that lock is free, every record there of a dead run
    /// (its removal: a freed lock's record must not stay for good, issue 23 finding 4).
    pub fn owe(&mut self, inc: usize, workdir: u8, ws: u8) {
        let open = match &self.incs[inc].book {
            BookSide::New(t) => t.state() == tfinit::locks::book::StoreState::Open,
            BookSide::Old(_) => false,
        };
        if !open {
            return;
        }
        let dirs = self.cfg.dirs.clone();
        let key = (dirs[workdir as usize].state, ws);
        // The records the helper of `workdir` recovers (recover/mod.rs `same_dir`): this
        // directory's, by its text or once symbolic links are resolved.
        let covered = |rec: &Record| {
            dir_of(&rec.workdir).is_some_and(|d| {
                d == workdir || dirs[d as usize].real == dirs[workdir as usize].real
            }) && rec.workspace == workspace_name(ws)
        };
        // Every TTL an owner may be judged by is at most the longest of the pods'.
        let longest = self
            .pods
            .iter()
            .map(|p| p.ttl)
            .max()
            .unwrap_or(self.cfg.ttl);
        let drift = |t: u64| t * 2 * self.cfg.max_ppm as u64 / 1_000_000;
        // An owner that died this long ago has been seen stop by any observer: a full TTL of
        // watching (on a clock up to max_ppm slow) after the last rescan that could show a
        // change.
        let seen_stop = longest + longest / 3 + drift(longest) + 1_000;
        let now = self.now;
        let dead = |w: &World, s: &Stored| {
            s.rec.ended.is_some() || w.incs[s.inc].died_at.is_some_and(|d| d + seen_stop <= now)
        };
        // A tfinit other than the asking one that lives (or died too recently to have been
        // watched dead) on the host a Who names: its runs lock as that Who, recorded or not, so
        // a lock with that Who is left alone by design (recover/evidence.rs `live_on_host`).
        let neighbour = |w: &World, who: &str| {
            let host = who_host(who);
            w.incs.iter().enumerate().any(|(j, i)| {
                j != inc
                    && i.host == host
                    && (i.alive || i.died_at.is_some_and(|d| d + seen_stop > now))
            })
        };
        // A record of a run that may be alive, with the Who `who`, on a state that may be
        // `state`'s (recover/evidence.rs `window`'s twin): the lock is left alone by design.
        let twin_record = |w: &World, who: &str, except: u64, rec: &Record| {
            let state = w.state_of(&rec.workdir, &rec.workspace);
            w.store.records.iter().any(|(id, s)| {
                *id != except
                    && s.rec.who == who
                    && !dead(w, s)
                    && tfinit::locks::state::may_share(
                        &state,
                        &w.state_of(&s.rec.workdir, &s.rec.workspace),
                    )
            })
        };
        let lock = self.locks.get(&key).cloned();
        let mut owed: Vec<(Option<u64>, u64, String)> = Vec::new();
        if let Some(lock) = lock {
            let p = &self.procs[lock.holder];
            if p.state != PState::Dead || self.obligations.iter().any(|o| o.lock == Some(lock.id)) {
                return;
            }
            let owner_inc = p.inc;
            let Some((&id, stored)) = self
                .store
                .records
                .iter()
                .find(|(_, s)| s.inc == owner_inc && s.rec.run_id == p.run.to_string())
            else {
                // No record names it (it started without one): nobody may release it.
                return;
            };
            if !covered(&stored.rec) || !dead(self, stored) {
                // Another directory's request owes it; or its owner lives (and has not marked
                // it ended yet), or died too recently to have been seen stop.
                return;
            }
            // What decide() will see: a lock created outside the run's life (its node's wall
            // clock stepped by more than CLOCK_SKEW), or a live run with the same Who on its
            // state, is left alone by design.
            let skew = CLOCK_SKEW.as_millis() as u64;
            let hb = self
                .store
                .beat(&stored.rec.owner.key())
                .map(|b| (*b.hb).clone());
            let judged = self.incs[inc].ttl.max(self.incs[owner_inc].ttl);
            let not_after = last_alive_ms(
                &Facts::of(&stored.rec),
                hb.as_ref(),
                std::time::Duration::from_millis(judged),
            ) + skew;
            let in_window =
                lock.created_ms + skew >= stored.rec.started_ms && lock.created_ms <= not_after;
            let twin = self
                .procs
                .iter()
                .any(|q| q.state != PState::Dead && q.who == lock.who && q.key == key);
            if !in_window
                || twin
                || neighbour(self, &lock.who)
                || twin_record(self, &lock.who, id, &stored.rec)
            {
                self.stats.excused += 1;
                return;
            }
            let text = format!(
                "run {} of {} (dead) holds it; {} asked for a run in /tf/w{workdir} at {} ms",
                p.run, self.incs[owner_inc].key, self.incs[inc].key, self.now
            );
            owed.push((Some(lock.id), id, text));
        } else {
            for (&id, s) in &self.store.records {
                if !covered(&s.rec)
                    || !dead(self, s)
                    || self.obligations.iter().any(|o| o.record == id)
                {
                    continue;
                }
                // A live run with its Who may take the lock before the probe (then a live run
                // holds it, in the run's window): left alone by design.
                let twin = self
                    .procs
                    .iter()
                    .any(|q| q.state != PState::Dead && q.who == s.rec.who && q.key == key);
                if twin || neighbour(self, &s.rec.who) {
                    self.stats.excused += 1;
                    continue;
                }
                let text = format!(
                    "run {} of {} is over and its lock is free; {} asked for a run in /tf/w{workdir} at {} ms",
                    s.rec.run_id, self.incs[s.inc].key, self.incs[inc].key, self.now
                );
                owed.push((None, id, text));
            }
        }
        if owed.is_empty() {
            return;
        }
        // The helper watches for at most the longest TTL on a clock up to max_ppm fast or slow.
        // Helpers take recover.lock one at a time, so ours may wait for others to go through
        // every record on the volume: per record a liveness check (a read for the kernel's
        // proof, one of the heartbeat), the probe, the window's reads (a liveness check per twin
        // record and per heartbeat on the lock's host), the re-check, the listing, the unlock,
        // the removal. Plus a rescan's delay, the 500 ms watch step and room for the latencies.
        let n = self.store.records.len() as u64;
        let b = self.store.beats.len() as u64;
        let watch = longest + drift(longest);
        let per_record = 2 * PROBE_MAX + (12 + 4 * n + 4 * b) * CALM_OP_MAX;
        let deadline = self.now + watch + n * per_record + longest / 3 + 1_000;
        self.cfg.end_at = self.cfg.end_at.max(deadline + 1);
        for (lock, record, text) in owed {
            self.obligations.push(Obligation {
                lock,
                record,
                key,
                since: self.now,
                deadline,
                text,
            });
        }
    }
}

/// `Option<Ms>` is none, or not after `now`.
trait PastOrNone {
    fn is_none_or_past(&self, now: u64) -> bool;
}

impl PastOrNone for Option<u64> {
    fn is_none_or_past(&self, now: u64) -> bool {
        self.is_none_or(|t| t <= now)
    }
}
