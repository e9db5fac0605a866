//! The init's loop, as far as records and locks go (src/init/records.rs and runs/launch.rs): a
//! state-locking run's check (wait while the store opens, while a recovery of this init runs,
//! while our own end-markings in its directory are on their way; a helper when the book says a
//! recovery is needed), its record, its launch (refused while the fence is up, or as the book
//! says), the book's timers and fence, and what happens when terraform ends. Also terraform
//! itself (takes the lock of its directory's state, waits for it, works, releases it; SIGTERM and
//! SIGKILL), `tfinit recover` by hand, a restore of `owners/`, and the life of pods and
//! containers. Under `Rules::Legacy` the book is the old one and nothing serialises recoveries.

use std::time::Instant;

use tfinit::locks::book::{Event, Launch, NewRun, Start};
use tfinit::locks::liveness::{last_alive_ms, Facts};
use tfinit::locks::names::RunId;
use tfinit::locks::record::{Ended, Record, FORMAT};
use tfinit::locks::recorder::Work;
use tfinit::locks::recover::CLOCK_SKEW;
use tfinit::locks::who::who_host;

use super::check::{Obligation, CALM_OP_MAX};
use super::helper::dir_of;
use super::terraform::{PState, Proc};
use super::world::{
    workdir_path, workspace_name, BookSide, Comp, Ev, Helper, Life, LoopEv, Rules, Run, Spawn,
    Stored, World,
};

/// The helper's probe and unlock take at most this long (backend.rs).
const PROBE_MAX: u64 = 2_000;

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
        match lev {
            LoopEv::Wake => {}
            LoopEv::Request {
                workdir,
                ws,
                observed,
            } => self.start_run(inc, workdir, ws, observed),
            LoopEv::Reaped { proc } => self.on_reaped(inc, proc),
            LoopEv::HelperExit { helper } => self.on_helper_exit(inc, helper),
        }
        // As event_loop.rs: the dispatch, then the timers.
        self.on_timers(inc);
        self.maybe_exit(inc);
        self.schedule_wake(inc);
    }

    fn mono_of(&self, inc: usize) -> Instant {
        self.mono(self.incs[inc].node)
    }

    /// Takes the completions waiting (records.rs: on_recorder).
    fn on_recorder(&mut self, inc: usize) {
        let done = std::mem::take(&mut self.incs[inc].inbox);
        let now = self.mono_of(inc);
        for c in done {
            let events = match (&mut self.incs[inc].book, c) {
                (BookSide::New(b), Comp::New(c)) => b.on_completion(c, now),
                (BookSide::Old(b), Comp::Old(c)) => b.on_completion(c, now),
                _ => unreachable!("one kind of completion per rule set"),
            };
            self.apply(inc, events);
        }
    }

    /// The book's timers, then the runs that waited too long (records.rs: on_record_timers).
    fn on_timers(&mut self, inc: usize) {
        self.on_recorder(inc);
        let now = self.mono_of(inc);
        let events = match &mut self.incs[inc].book {
            BookSide::New(b) => b.tick(now),
            BookSide::Old(b) => b.tick(now),
        };
        self.apply(inc, events);
        let expired: Vec<u64> = self.incs[inc]
            .runs
            .iter()
            .filter(|(_, r)| matches!(r.life, Life::Awaiting { deadline } if deadline <= now))
            .filter(|_| !self.recovering(inc))
            .map(|(k, _)| *k)
            .collect();
        for k in expired {
            if let Some(run) = self.incs[inc].runs.remove(&k) {
                let Life::Awaiting { deadline } = run.life else {
                    unreachable!()
                };
                self.record_step(inc, k, run, Some(deadline));
            }
        }
    }

    /// Does what the book asks (records.rs: apply), then resumes runs that may go on.
    fn apply(&mut self, inc: usize, events: Vec<Event>) {
        for e in events {
            match e {
                Event::Log(n) => {
                    let key = self.incs[inc].key.clone();
                    self.log(|| format!("{key}: {}", n.message()));
                }
                Event::Start { run, .. } => self.record_settled(inc, run),
                Event::Fence { runs, kill } => {
                    let key = self.incs[inc].key.clone();
                    self.log(|| {
                        format!(
                            "{key}: fence {} {runs:?}",
                            if kill { "SIGKILL" } else { "SIGTERM" }
                        )
                    });
                    for id in runs {
                        let proc = self.incs[inc].runs.values().find_map(|r| match r.life {
                            Life::Running { proc } if r.id == id => Some(proc),
                            _ => None,
                        });
                        if let Some(p) = proc {
                            if kill {
                                self.sigkill(p);
                            } else {
                                self.sigterm(p);
                            }
                        }
                    }
                }
            }
        }
        self.resume_awaiting(inc);
    }

    /// Whether a recovery helper of this init runs (runs/mod.rs `recovering`: no state-locking
    /// run starts meanwhile, in any directory; the old init had no such rule).
    fn recovering(&self, inc: usize) -> bool {
        self.cfg.rules == Rules::New
            && self.incs[inc]
                .runs
                .values()
                .any(|r| matches!(r.life, Life::Recovering { .. }))
    }

    fn resume_awaiting(&mut self, inc: usize) {
        let ready: Vec<u64> = self.incs[inc]
            .runs
            .iter()
            .filter(|(_, r)| matches!(r.life, Life::Awaiting { .. }))
            .filter(|(_, r)| {
                let i = &self.incs[inc];
                let path = workdir_path(r.workdir);
                let (opening, may) = match &i.book {
                    BookSide::New(b) => (b.opening(), b.may_recover(&path)),
                    BookSide::Old(b) => (b.opening(), b.may_recover(&path)),
                };
                !opening && may && !self.recovering(inc)
            })
            .map(|(k, _)| *k)
            .collect();
        for k in ready {
            if let Some(run) = self.incs[inc].runs.remove(&k) {
                let Life::Awaiting { deadline } = run.life else {
                    unreachable!()
                };
                self.check_lock(inc, k, run, Some(deadline));
            }
        }
    }

    /// A shim asks for a state-locking run (launch.rs: start_run).
    fn start_run(&mut self, inc: usize, workdir: u8, ws: u8, observed: bool) {
        if self.incs[inc].stopping {
            return;
        }
        let k = self.incs[inc].next_run;
        self.incs[inc].next_run += 1;
        let now = self.mono_of(inc);
        let run = Run {
            id: RunId::from(k),
            workdir,
            ws,
            life: Life::Awaiting { deadline: now },
            observed,
        };
        let key = self.incs[inc].key.clone();
        self.log(|| {
            format!(
                "{key}: run r{k} asked for in /tf/w{workdir} {}",
                workspace_name(ws)
            )
        });
        self.check_lock(inc, k, run, None);
    }

    /// launch.rs: check_lock.
    fn check_lock(&mut self, inc: usize, k: u64, mut run: Run, deadline: Option<Instant>) {
        let now = self.mono_of(inc);
        let deadline =
            deadline.unwrap_or(now + std::time::Duration::from_millis(self.cfg.record_timeout));
        self.on_recorder(inc);
        let path = workdir_path(run.workdir);
        let opening = match &self.incs[inc].book {
            BookSide::New(b) => b.opening(),
            BookSide::Old(b) => b.opening(),
        };
        if opening || self.recovering(inc) {
            run.life = Life::Awaiting { deadline };
            self.incs[inc].runs.insert(k, run);
            return;
        }
        if run.observed {
            self.owe(inc, run.workdir, run.ws);
        }
        let wall = self.wall(self.incs[inc].node);
        let (needs, may) = match &self.incs[inc].book {
            BookSide::New(b) => (b.needs_recovery(&path, now), b.may_recover(&path)),
            BookSide::Old(b) => (b.needs_recovery(&path, wall), b.may_recover(&path)),
        };
        if !needs {
            return self.record_step(inc, k, run, Some(deadline));
        }
        if !may {
            run.life = Life::Awaiting { deadline };
            self.incs[inc].runs.insert(k, run);
            return;
        }
        let live = match &self.incs[inc].book {
            BookSide::New(b) => b.live_runs(),
            BookSide::Old(b) => b.live_runs(),
        };
        let h = self.helpers.len();
        let task = self.spawn(Spawn::Helper(h), None);
        let i = &self.incs[inc];
        self.helpers.push(Helper {
            init: Some(inc),
            node: i.node,
            me: i.owner.clone(),
            ttl: i.ttl,
            tf: self.pods[i.pod].tf,
            workdir: Some(run.workdir),
            task,
            alive: true,
            live,
            started: self.now,
        });
        self.stats.helpers += 1;
        self.incs[inc].helpers.push(h);
        let key = self.incs[inc].key.clone();
        self.log(|| {
            format!(
                "{key}: helper {h} for run {} in /tf/w{}",
                run.id, run.workdir
            )
        });
        run.life = Life::Recovering { helper: h };
        self.incs[inc].runs.insert(k, run);
    }

    /// launch.rs: record_step.
    fn record_step(&mut self, inc: usize, k: u64, mut run: Run, deadline: Option<Instant>) {
        let now = self.mono_of(inc);
        let path = workdir_path(run.workdir);
        let ws = workspace_name(run.ws);
        let started_ms = self.wall(self.incs[inc].node);
        let start = match &mut self.incs[inc].book {
            BookSide::New(b) => {
                let new = NewRun {
                    run: run.id,
                    workdir: &path,
                    workspace: &ws,
                    subcommand: "apply",
                    argv: &[],
                    env: &[],
                    started_ms,
                };
                b.begin(&new, now, deadline)
            }
            BookSide::Old(b) => b.begin(run.id, &path, &ws, now, deadline),
        };
        match start {
            Start::Unrecorded(_) => self.launch(inc, k, run),
            Start::Record { .. } => {
                let wall = self.wall(self.incs[inc].node);
                let record = Record {
                    v: FORMAT,
                    owner: self.incs[inc].owner.clone(),
                    who: String::new(),
                    run_id: run.id.to_string(),
                    cwd: path.to_string_lossy().into_owned(),
                    workdir: path.to_string_lossy().into_owned(),
                    workspace: ws,
                    subcommand: "apply".into(),
                    argv: vec!["apply".into()],
                    started_ms: wall,
                    in_progress: Vec::new(),
                    updated_ms: wall,
                    ended: None,
                    needs_person: None,
                    ttl_ms: Some(self.incs[inc].ttl),
                    data_dir: None,
                };
                let id = run.id;
                run.life = Life::Recording;
                self.incs[inc].runs.insert(k, run);
                self.send_request(
                    inc,
                    Work::Create {
                        run: id,
                        record: Box::new(record),
                        env: Vec::new(),
                    },
                );
            }
        }
    }

    /// The book says a run waiting in `recording` may start.
    fn record_settled(&mut self, inc: usize, id: RunId) {
        let k = self.incs[inc]
            .runs
            .iter()
            .find(|(_, r)| r.id == id && matches!(r.life, Life::Recording))
            .map(|(k, _)| *k);
        if let Some(k) = k {
            let run = self.incs[inc].runs.remove(&k).expect("found above");
            self.launch(inc, k, run);
        }
    }

    /// launch.rs: launch (refused while the fence is up), then terraform starts.
    fn launch(&mut self, inc: usize, k: u64, mut run: Run) {
        let refused = match &self.incs[inc].book {
            BookSide::New(b) => b.may_launch(run.id) != Launch::Yes,
            BookSide::Old(_) => false,
        };
        if refused || self.incs[inc].stopping {
            self.forget_record(inc, run.id);
            return;
        }
        let p = self.procs.len();
        let work = match self.rng.below(10) {
            0..=5 => self.rng.range(100, self.cfg.ttl),
            _ => self.rng.range(self.cfg.ttl, 3 * self.cfg.ttl),
        };
        let stubborn = self.rng.chance(150);
        self.procs.push(Proc {
            inc,
            run: run.id,
            workdir: run.workdir,
            key: (self.cfg.dirs[run.workdir as usize].state, run.ws),
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
        self.log(|| {
            format!(
                "{key}: terraform {p} starts for run {} in /tf/w{}",
                run.id, run.workdir
            )
        });
        run.life = Life::Running { proc: p };
        self.incs[inc].runs.insert(k, run);
    }

    /// A run that never started is over: its record is removed.
    pub fn forget_record(&mut self, inc: usize, id: RunId) {
        let req = match &mut self.incs[inc].book {
            BookSide::New(b) => b.exited(id, None, Vec::new()),
            BookSide::Old(b) => b.exited(id, None),
        };
        if let Some(r) = req {
            self.send_request(inc, r);
        }
    }

    /// records.rs: a request to the recorder (its channel), counted while it is a write.
    fn send_request(&mut self, inc: usize, r: Work) {
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

    /// SIGCHLD for terraform process `p` (launch/finish: the book hears how it ended).
    fn on_reaped(&mut self, inc: usize, p: usize) {
        let k = self.incs[inc]
            .runs
            .iter()
            .find(|(_, r)| matches!(r.life, Life::Running { proc } if proc == p))
            .map(|(k, _)| *k);
        let Some(k) = k else {
            return;
        };
        let run = self.incs[inc].runs.remove(&k).expect("found above");
        let ended = self.procs[p].killed.then(|| Ended {
            ms: self.wall(self.incs[inc].node),
            how: "killed by SIGKILL".into(),
        });
        let req = match &mut self.incs[inc].book {
            BookSide::New(b) => b.exited(run.id, ended, Vec::new()),
            BookSide::Old(b) => b.exited(run.id, ended),
        };
        if let Some(r) = req {
            self.send_request(inc, r);
        }
    }

    /// launch.rs: on_recovery_exit.
    fn on_helper_exit(&mut self, inc: usize, h: usize) {
        let k = self.incs[inc]
            .runs
            .iter()
            .find(|(_, r)| matches!(r.life, Life::Recovering { helper } if helper == h))
            .map(|(k, _)| *k);
        let Some(k) = k else {
            return;
        };
        let run = self.incs[inc].runs.remove(&k).expect("found above");
        let now = self.mono_of(inc);
        let path = workdir_path(run.workdir);
        let rescan = match &mut self.incs[inc].book {
            BookSide::New(b) => b.recovery_done(&path, now),
            BookSide::Old(b) => b.recovery_done(&path, now),
        };
        self.send_request(inc, rescan);
        if self.incs[inc].stopping {
            return;
        }
        self.record_step(inc, k, run, None);
    }

    /// The loop's next timer: the book's, and the waiting runs' deadlines.
    fn schedule_wake(&mut self, inc: usize) {
        if !self.incs[inc].alive {
            return;
        }
        let book = match &self.incs[inc].book {
            BookSide::New(b) => b.next_wakeup(),
            BookSide::Old(b) => b.next_wakeup(),
        };
        // A run whose wait is blocked by a recovery goes on when that recovery ends (the
        // helper's exit wakes the loop): the real loop leaves its deadline out of the epoll
        // timeout (runs::next_wakeup), as here. (It once kept it there and woke every
        // millisecond until then; `spin_ms` counted that and stays 0 now.)
        let waits: Vec<Instant> = self.incs[inc]
            .runs
            .values()
            .filter_map(|r| match r.life {
                Life::Awaiting { .. } if self.recovering(inc) => None,
                Life::Awaiting { deadline } => Some(deadline),
                _ => None,
            })
            .collect();
        let Some(next) = book.into_iter().chain(waits).min() else {
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
        if !i.stopping || !i.runs.is_empty() {
            return;
        }
        let t = self.now + if i.writes == 0 { 50 } else { 1000 };
        self.at(
            t,
            Ev::Call(Box::new(move |w| {
                if w.incs[inc].alive && w.incs[inc].runs.is_empty() {
                    w.kill_inc(inc, "the init exited");
                }
            })),
        );
    }

    // Progress.

    /// A calm-phase run asked for in `workdir`/`ws` by incarnation `inc`, a live observer with a
    /// working volume: every lock of that directory's state held by a dead run that a record in
    /// the directory names is owed; and when that lock is free, every record there of a dead run
    /// (its removal: a freed lock's record must not stay for good, issue 23 finding 4).
    fn owe(&mut self, inc: usize, workdir: u8, ws: u8) {
        let open = match &self.incs[inc].book {
            BookSide::New(b) => b.state() == tfinit::locks::book::StoreState::Open,
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
