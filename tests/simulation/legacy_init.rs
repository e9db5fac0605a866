//! The init's loop under the old rules (`Rules::Legacy`), as far as records and locks go: the
//! model of the code before issue 18, kept to show that the simulation finds its bugs (today's
//! init is the real code: `init.rs` drives it). A state-locking run's check (wait while the
//! store opens or while our own end-markings in its directory are on their way; a helper when
//! the old book says a recovery is needed; nothing serialises recoveries), its record, its
//! launch, the book's timers, and what happens when terraform ends.

use std::time::Instant;

use tfinit::locks::book::{Event, Start};
use tfinit::locks::names::RunId;
use tfinit::locks::record::{Ended, Record, FORMAT};
use tfinit::locks::recorder::Work;

use super::legacy;
use super::world::{workdir_path, workspace_name, BookSide, Comp, Life, LoopEv, Run, World};

impl World {
    /// An event for the loop of incarnation `inc` (old rules), then its timers.
    pub fn on_loop_legacy(&mut self, inc: usize, lev: LoopEv) {
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
    }

    fn old_book(&mut self, inc: usize) -> &mut legacy::Book {
        match &mut self.incs[inc].book {
            BookSide::Old(b) => b,
            BookSide::New(_) => unreachable!("the old rules' loop runs the old book"),
        }
    }

    /// Takes the completions waiting (records.rs: on_recorder).
    fn on_recorder(&mut self, inc: usize) {
        let done = std::mem::take(&mut self.incs[inc].inbox);
        let now = self.mono_of(inc);
        for c in done {
            let Comp::Old(c) = c else {
                unreachable!("one kind of completion per rule set")
            };
            let events = self.old_book(inc).on_completion(c, now);
            self.apply(inc, events);
        }
    }

    /// The book's timers, then the runs that waited too long (records.rs: on_record_timers).
    fn on_timers(&mut self, inc: usize) {
        self.on_recorder(inc);
        let now = self.mono_of(inc);
        let events = self.old_book(inc).tick(now);
        self.apply(inc, events);
        let expired: Vec<u64> = self.incs[inc]
            .runs
            .iter()
            .filter(|(_, r)| matches!(r.life, Life::Awaiting { deadline } if deadline <= now))
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

    fn resume_awaiting(&mut self, inc: usize) {
        let ready: Vec<u64> = self.incs[inc]
            .runs
            .iter()
            .filter(|(_, r)| matches!(r.life, Life::Awaiting { .. }))
            .filter(|(_, r)| {
                let BookSide::Old(b) = &self.incs[inc].book else {
                    unreachable!()
                };
                !b.opening() && b.may_recover(&workdir_path(r.workdir))
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
        if self.old_book(inc).opening() {
            run.life = Life::Awaiting { deadline };
            self.incs[inc].runs.insert(k, run);
            return;
        }
        if run.observed {
            self.owe(inc, run.workdir, run.ws);
        }
        let wall = self.wall(self.incs[inc].node);
        let b = self.old_book(inc);
        let (needs, may) = (b.needs_recovery(&path, wall), b.may_recover(&path));
        if !needs {
            return self.record_step(inc, k, run, Some(deadline));
        }
        if !may {
            run.life = Life::Awaiting { deadline };
            self.incs[inc].runs.insert(k, run);
            return;
        }
        let live = self.old_book(inc).live_runs();
        let h = self.start_helper(inc, run.id, run.workdir, live);
        run.life = Life::Recovering { helper: h };
        self.incs[inc].runs.insert(k, run);
    }

    /// launch.rs: record_step.
    fn record_step(&mut self, inc: usize, k: u64, mut run: Run, deadline: Option<Instant>) {
        let now = self.mono_of(inc);
        let path = workdir_path(run.workdir);
        let ws = workspace_name(run.ws);
        let start = self.old_book(inc).begin(run.id, &path, &ws, now, deadline);
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

    /// launch.rs: launch (the old init had no fence), then terraform starts.
    fn launch(&mut self, inc: usize, k: u64, mut run: Run) {
        if self.incs[inc].stopping {
            self.forget_record(inc, run.id);
            return;
        }
        let p = self.start_terraform(inc, run.id, run.workdir, run.ws);
        run.life = Life::Running { proc: p };
        self.incs[inc].runs.insert(k, run);
    }

    /// A run that never started is over: its record is removed.
    fn forget_record(&mut self, inc: usize, id: RunId) {
        if let Some(r) = self.old_book(inc).exited(id, None) {
            self.send_request(inc, r);
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
        if let Some(r) = self.old_book(inc).exited(run.id, ended) {
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
        let rescan = self
            .old_book(inc)
            .recovery_done(&workdir_path(run.workdir), now);
        self.send_request(inc, rescan);
        if self.incs[inc].stopping {
            return;
        }
        self.record_step(inc, k, run, None);
    }

    /// The loop's next timer (old rules): the book's, and the waiting runs' deadlines.
    pub fn next_wakeup_legacy(&self, inc: usize) -> Option<Instant> {
        let BookSide::Old(b) = &self.incs[inc].book else {
            unreachable!()
        };
        let waits = self.incs[inc].runs.values().filter_map(|r| match r.life {
            Life::Awaiting { deadline } => Some(deadline),
            _ => None,
        });
        b.next_wakeup().into_iter().chain(waits).min()
    }

    /// SIGTERM to the init (old rules): runs not started are refused, terraform gets SIGTERM.
    pub fn stop_legacy(&mut self, inc: usize) {
        let waiting: Vec<(u64, RunId)> = self.incs[inc]
            .runs
            .iter()
            .filter(|(_, r)| matches!(r.life, Life::Awaiting { .. } | Life::Recording))
            .map(|(k, r)| (*k, r.id))
            .collect();
        for (k, id) in waiting {
            self.incs[inc].runs.remove(&k);
            self.forget_record(inc, id);
        }
        let procs: Vec<usize> = self.incs[inc]
            .runs
            .values()
            .filter_map(|r| match r.life {
                Life::Running { proc } => Some(proc),
                _ => None,
            })
            .collect();
        for p in procs {
            self.sigterm(p);
        }
    }
}
