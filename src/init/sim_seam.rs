//! The init's runs and records without a process, for the simulation (tests/simulation/init.rs;
//! tests only: the cargo feature `mutation`). A [`Loop`] holds the real [`Runs`], [`Records`] (the
//! book, with the recorder's channel by hand) and reaping's [`Children`], and takes the inputs
//! the supervisor takes: a shim's request, a child reaped, the timers, the stop signal. It
//! carries out what the concerns answer in the supervisor's order, through the same code
//! (handoff.rs); what the supervisor would do to the world (start terraform or a recovery
//! helper, signal a process) goes to the caller's [`World`]. The caller plays the recorder
//! ([`Loop::take_sent`], [`Loop::deliver`]) and sets the clocks: the monotonic one as `now`, the
//! wall clock with [`crate::mutation::at_wall_ms`].

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::unistd::Pid;

use super::action::{Action, Force, Refusal};
use super::handoff;
use super::reaper::Exit;
use super::reaping::Children;
use super::records::Records;
use super::runs::Runs;
use super::shutdown::Phase;
use super::spawn::Started;
use super::token::{ConnId, Stream};
use crate::locks::book::{Book, LiveRun, RecordStatus};
use crate::locks::names::RunId;
use crate::locks::recorder::{Completion, Work};
use crate::protocol::RunRequest;

/// What the supervisor does outside the concerns, as the caller plays it.
pub trait World {
    /// Starts terraform for run `run` (always starts): its pid.
    fn spawn(&mut self, run: RunId) -> Pid;
    /// Starts the lock-recovery helper of run `run` in `workdir`, given the init's live runs
    /// `live`: its pid.
    fn recover(&mut self, run: RunId, workdir: &Path, live: Vec<LiveRun>) -> Pid;
    /// terraform's one graceful SIGTERM, to its pid.
    fn sigterm(&mut self, pid: Pid);
    /// SIGKILL to a process group (terraform's, or a recovery helper's).
    fn sigkill(&mut self, pgid: Pid);
}

/// The runs and the records of one init, driven by hand.
#[derive(Debug)]
pub struct Loop {
    runs: Runs,
    records: Records,
    children: Children,
    phase: Phase,
    state_dir: PathBuf,
    /// The run a request just made (its shim's connection was tied to it).
    attached: Option<RunId>,
    /// What stands for terraform's output pipes (the simulated terraform writes nothing).
    null: File,
}

impl Loop {
    /// An init whose book is `book` (its store at `state_dir`, its TFINIT_OWNER_TTL `ttl`), whose
    /// state-locking runs wait for the store at most `record_timeout`.
    pub fn new(book: Book, state_dir: &Path, ttl: Duration, record_timeout: Duration) -> Loop {
        Loop {
            runs: Runs::new(record_timeout, Duration::from_secs(30), None),
            records: Records::by_hand(book, state_dir.to_path_buf(), ttl),
            // The controller is not simulated: no pid of a run or helper is 1.
            children: Children::new(Pid::from_raw(1)),
            phase: Phase::Running,
            state_dir: state_dir.to_path_buf(),
            attached: None,
            null: File::open("/dev/null").expect("/dev/null opens"),
        }
    }

    /// The book, read-only.
    pub fn book(&self) -> &Book {
        self.records.book()
    }

    /// Run `run`'s record status, None for a run the book does not know (its record lives in the
    /// run's entry of the one table, which the runs hold).
    pub fn record(&self, run: RunId) -> Option<&RecordStatus> {
        self.book().record(self.runs.table(), run)
    }

    /// The storage work sent to the recorder since the last call.
    pub fn take_sent(&mut self) -> Vec<Work> {
        self.records.take_sent()
    }

    /// A completion of the recorder, in the channel: taken in with the next news.
    pub fn deliver(&mut self, c: Completion) {
        self.records.deliver(c);
    }

    /// When the loop must wake next: the records' timers (no recorder thread here), the runs'.
    pub fn next_wakeup(&self) -> Option<Instant> {
        let records = self.records.next_wakeup(self.runs.table());
        [records, self.runs.next_wakeup()]
            .into_iter()
            .flatten()
            .min()
    }

    /// Whether no run is left.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Whether a lock recovery of this init runs (no state-locking run starts meanwhile).
    pub fn recovering(&self) -> bool {
        self.runs.recovering()
    }

    /// Until when run `run` waits for the store before its lock check, if it does.
    pub fn awaiting_until(&self, run: RunId) -> Option<Instant> {
        self.runs.awaiting_until(run)
    }

    /// The recorder's eventfd is readable: its news is taken in (supervisor.rs `on_recorder`).
    pub fn news(&mut self, w: &mut dyn World, now: Instant) {
        self.apply(w, now, vec![Action::TakeNews]);
    }

    /// A shim asks for `terraform <args>` in `cwd`, workspace `workspace` (as control.rs takes
    /// a run request: the latest news first): the run, unless it was refused.
    pub fn request(
        &mut self,
        w: &mut dyn World,
        (cwd, workspace, args): (&Path, &str, &[&str]),
        now: Instant,
    ) -> Option<RunId> {
        self.apply(w, now, vec![Action::TakeNews]);
        let request = RunRequest {
            program: "terraform".into(),
            argv0: "terraform".into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            cwd: cwd.to_string_lossy().into_owned(),
            env: Vec::new(),
            workspace: Some(workspace.into()),
            cwd_id: None,
            workdir_id: None,
        };
        let conn = ConnId::from(0);
        let book = self.records.book();
        let acts = self
            .runs
            .request(conn, request, None, self.phase, book, now);
        self.apply(w, now, acts);
        self.attached.take()
    }

    /// `pid` was reaped (`killed`: by SIGKILL, else it exited 0).
    pub fn reaped(&mut self, w: &mut dyn World, pid: Pid, killed: bool, now: Instant) {
        let exit = if killed {
            Exit::Signal(libc::SIGKILL)
        } else {
            Exit::Code(0)
        };
        let acts = self.children.reaped(pid, exit);
        self.apply(w, now, acts);
    }

    /// The timers at `now` (after the events of a wake-up, as event_loop.rs): the records', the
    /// runs'.
    pub fn timers(&mut self, w: &mut dyn World, now: Instant) {
        self.apply(w, now, vec![Action::RecordTimers, Action::RunTimers]);
    }

    /// The stop signal, its steps at once: runs that wait to start are refused, and so are new
    /// ones; every run gets its one graceful SIGTERM.
    pub fn stop(&mut self, w: &mut dyn World, now: Instant) {
        self.phase = Phase::Stopping;
        let steps = vec![
            Action::RefuseWaiting(Refusal::ShuttingDown),
            Action::StopRuns(Force::Graceful),
        ];
        self.apply(w, now, steps);
    }

    fn apply(&mut self, w: &mut dyn World, now: Instant, actions: Vec<Action>) {
        handoff::run_queue(actions, |action, more| self.apply_one(w, now, action, more));
    }

    /// What the supervisor's `apply_one` does, with the world's part played by `w`.
    fn apply_one(
        &mut self,
        w: &mut dyn World,
        now: Instant,
        action: Action,
        more: &mut Vec<Action>,
    ) {
        let at = (now, self.phase);
        let (runs, records) = (&mut self.runs, &mut self.records);
        let Some(action) = handoff::carry(runs, records, &self.state_dir, at, action, more) else {
            return;
        };
        match action {
            Action::Attach { run, .. } => self.attached = Some(run),
            Action::Spawn(run) => more.extend(self.spawn_terraform(w, run)),
            Action::Recover(run) => more.extend(self.start_recovery(w, run, now)),
            Action::Adopt { pid, child } => self.children.adopt(pid, child),
            // The simulated terraform writes nothing: its output ends at once.
            Action::Watch(run) => {
                for stream in [Stream::Stdout, Stream::Stderr] {
                    if self.runs.take_pipe(run, stream).is_some() {
                        more.extend(self.runs.pipe_closed(run, self.records.book()));
                    }
                }
            }
            Action::Term { pid, .. } => w.sigterm(pid),
            Action::KillGroup { pgid, .. } | Action::KillLeftovers { pgid, .. } => w.sigkill(pgid),
            Action::KillHelper(pid) => w.sigkill(pid),
            Action::StopRuns(force) => more.extend(self.runs.stop_all(force, "the stop signal")),
            // The shims, the metrics, the pipes' reads, the controller: not simulated.
            Action::Answer { .. }
            | Action::Tally { .. }
            | Action::CountCancel(_)
            | Action::Resume(_)
            | Action::Drain(_)
            | Action::Signal { .. }
            | Action::ControllerExited { .. }
            | Action::ShutdownBegan { .. } => {}
            // Carried out by handoff::carry above.
            Action::Record(_)
            | Action::TakeNews
            | Action::RecordTimers
            | Action::RunTimers
            | Action::Admit
            | Action::Recheck
            | Action::RefuseWaiting(_)
            | Action::Detach(_)
            | Action::TerraformExited(..)
            | Action::RecoveryExited(..) => {}
        }
    }

    /// As the supervisor's `spawn_terraform`, the process being `w`'s.
    fn spawn_terraform(&mut self, w: &mut dyn World, run: RunId) -> Vec<Action> {
        if self.runs.launching(run).is_none() {
            return Vec::new();
        }
        let started = self.pipe().and_then(|stdout| {
            Ok(Started {
                pid: w.spawn(run),
                stdout,
                stderr: self.pipe()?,
            })
        });
        self.runs
            .spawned(run, started.map_err(super::spawn::StartError::Spawn))
    }

    /// As the supervisor's `start_recovery`, the helper being `w`'s.
    fn start_recovery(&mut self, w: &mut dyn World, run: RunId, now: Instant) -> Vec<Action> {
        let Some(workdir) = self.runs.workdir(run) else {
            return Vec::new();
        };
        let (args, watching) = self.records.recovery_args(self.runs.table(), workdir, now);
        let pid = w.recover(run, &args.workdir, args.live.clone());
        self.runs.recovery_started(run, &args, watching, Ok(pid))
    }

    /// A descriptor that stands for the read end of an output pipe.
    fn pipe(&self) -> io::Result<OwnedFd> {
        Ok(self.null.try_clone()?.into())
    }
}
