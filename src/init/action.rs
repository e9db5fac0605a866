//! What the concerns ask for. Runs (runs/), the timeline (shutdown.rs) and reaping (reaping.rs)
//! answer an input with [`Action`]s instead of doing anything themselves. The records
//! (records.rs) are changed only through [`Action::Record`], and answer with `RecordEvent`s that
//! the loop hands to the runs; the connections (conns.rs) answer with `After`, which the loop
//! turns into an action. The loop carries actions out in one place (`Init::apply`,
//! supervisor.rs), in order, and what comes of one (terraform started or not, a record's answer)
//! is carried out before the next: a concern that must decide after a change it asked for asks
//! for that decision as an action too (`Admit`, `Recheck`, `Recover`).
//!
//! Some actions are inputs to another concern (`TerraformExited`, `StopRuns`, `Admit`, ...): a
//! concern never calls another one, it asks the loop to.

use std::time::Duration;

use nix::unistd::Pid;

use super::reaper::Exit;
use super::records::Record;
use super::token::ConnId;
use crate::locks::book::Launch;
use crate::locks::names::RunId;
use crate::metrics::RunOutcome;
use crate::protocol::{self, ExitNote};
use crate::sys::{SigNo, Target};

/// A child of ours other than the controller: whose it is, for when it is reaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Child {
    /// terraform of a run.
    Terraform(RunId),
    /// The lock-recovery helper of a run.
    Recovery(RunId),
}

/// How a run is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::init) enum Force {
    /// Its one graceful SIGTERM.
    Graceful,
    /// SIGKILL to its process group.
    Kill,
}

/// Something the loop must do.
#[derive(Debug)]
pub(super) enum Action {
    /// Ties connection `conn` to run `run`: its output and exit note go there, and its hang-up
    /// abandons the run.
    Attach {
        /// The shim's connection.
        conn: ConnId,
        /// Its run.
        run: RunId,
    },
    /// Answers `conn` with an exit note; it closes once that is written.
    Answer {
        /// The shim's connection.
        conn: ConnId,
        /// What it exits with, and why.
        note: ExitNote,
    },
    /// Starts terraform for a run waiting in `Life::Launching` (its request is there).
    Spawn(RunId),
    /// Starts the lock-recovery helper of a run waiting in `Life::Recovering`. What the helper is
    /// given (the live runs, what this pod has seen) is read from the records when it starts,
    /// after the records' actions asked before it.
    Recover(RunId),
    /// A new child of ours: whose it is, for when it is reaped.
    Adopt {
        /// Its pid.
        pid: Pid,
        /// Whose it is.
        child: Child,
    },
    /// Puts a run's output pipes in the epoll set (terraform just started).
    Watch(RunId),
    /// Reads a paused run's pipes again (its shim caught up, or left).
    Resume(RunId),
    /// Reads what is left in a run's pipes and closes them (terraform exited a while ago).
    Drain(RunId),
    /// terraform's one graceful SIGTERM, to its own pid.
    Term {
        /// The run.
        run: RunId,
        /// terraform's pid.
        pid: Pid,
        /// Why, for the log.
        reason: &'static str,
    },
    /// SIGKILL to a run's process group, unless it is empty already.
    KillGroup {
        /// The run.
        run: RunId,
        /// terraform's process group.
        pgid: Pid,
        /// Why, for the log.
        reason: &'static str,
    },
    /// SIGKILL to what a terraform that exited left in its process group.
    KillLeftovers {
        /// The run.
        run: RunId,
        /// Its process group.
        pgid: Pid,
        /// Whether this happens because the run was being stopped (then logged).
        stopping: bool,
    },
    /// SIGKILL to a recovery helper's process group.
    KillHelper(Pid),
    /// A signal to the controller's process group (only while it has members) or to everyone,
    /// logged as going to `what`.
    Signal {
        /// Where.
        target: Target,
        /// Which.
        signo: SigNo,
        /// Who that is, for the log.
        what: &'static str,
    },
    /// A change to the lock-owner records (the records concern is the only writer of the book).
    Record(Record),
    /// Runs: a place under TFINIT_MAX_RUNS may be free (the oldest queued run goes on).
    Admit,
    /// Runs: the records changed, so runs that wait for the store look again (then [`Self::Admit`]).
    Recheck,
    /// Runs: the init stopped accepting runs, so every run still waiting is refused.
    RefuseWaiting(Refusal),
    /// Runs: a shutdown step (logged as that step): every run's one graceful SIGTERM, or the
    /// SIGKILL of every run's group (or helper).
    StopRuns(Force),
    /// Runs: the shim of this run is gone (its connection ended).
    Detach(RunId),
    /// Runs: terraform of this run was reaped.
    TerraformExited(RunId, Exit),
    /// Records: take in the recorder's news now (what follows is decided on the latest table).
    TakeNews,
    /// Records: the recorder's news, then the book's timers that are due (records that did not
    /// land in time, the fence, a stale heartbeat).
    RecordTimers,
    /// Runs: their timers that are due (waits for the store, abandoned runs' SIGKILL, the
    /// linger of pipes after terraform exited).
    RunTimers,
    /// Runs: this run's lock-recovery helper was reaped.
    RecoveryExited(RunId, Exit),
    /// The timeline: the controller was reaped (logged, and the shutdown starts unless it runs).
    ControllerExited {
        /// Its pid.
        pid: Pid,
        /// How it ended.
        exit: Exit,
    },
    /// The shutdown began (`cause`, for the log): logged with what it will do, unless
    /// `quiet_when_done` and nothing is left to stop (the init then exits at once).
    ShutdownBegan {
        /// Why, for the log.
        cause: &'static str,
        /// Whether to say nothing when no run and no member of the controller's group is left.
        quiet_when_done: bool,
    },
    /// `tfinit cancel` acted on a run: the metrics count it.
    CountCancel(crate::metrics::Cancel),
    /// A run of `subcommand` is over (`outcome`, after `took`): the metrics count it.
    Tally {
        /// terraform's subcommand.
        subcommand: String,
        /// How it ended.
        outcome: RunOutcome,
        /// From the shim's request to the end.
        took: Duration,
    },
}

/// Why a run is refused (or ended) before terraform starts. The shim exits 75 ("try again
/// later") with the one message [`Refusal::answer`] builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// `tfinit drain`.
    Draining,
    /// The shutdown timeline runs.
    ShuttingDown,
    /// This owner's heartbeat does not land, so its state-locking runs are being stopped.
    Fenced,
    /// The state volume cannot be written and holds a record with this pod's `Who` in the run's
    /// working directory.
    Shadowed,
    /// The state volume has not answered since the init started: no heartbeat of it is there.
    Unseen,
    /// `tfinit cancel` ended it while it was queued or waiting for its lock check or record.
    Cancelled,
}

impl Refusal {
    /// Why a state-locking run must not start now, as the book says it, if it must not.
    pub(super) fn of_launch(launch: Launch) -> Option<Refusal> {
        match launch {
            Launch::Yes => None,
            Launch::Fenced => Some(Refusal::Fenced),
            Launch::Shadowed => Some(Refusal::Shadowed),
            Launch::Unseen => Some(Refusal::Unseen),
        }
    }

    /// Why, as the refusal says it (after "tfinit: ").
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Refusal::Draining => "the init is draining (tfinit drain; `tfinit resume` accepts runs again)",
            Refusal::ShuttingDown => "the init is shutting down (the container is stopping)",
            Refusal::Fenced => "the init is unable to keep this owner's heartbeat in the lock-owner record store (its state-locking runs are being stopped)",
            Refusal::Unseen => "the init is waiting for the lock-owner record store (the volume at TFINIT_STATE_DIR, or the Kubernetes API), which has not answered since the init started: a state-locking run starts only once this pod's heartbeat is on it (until then another pod could take a lock of this pod's for a dead earlier run's, with the same Who, and release it; see the init's log)",
            Refusal::Shadowed => "the init is unable to write to the lock-owner record store, which holds a lock-owner record of an earlier run with this pod's Who or cannot list its records (another pod's recovery of such a record could release this run's lock, in any directory that locks the same state; see the init's log)",
            Refusal::Cancelled => "the run was cancelled (tfinit cancel) before terraform started",
        }
    }

    /// The answer to `conn` (of run `run`, once it has one): exit code 75, and why.
    pub(super) fn answer(self, conn: ConnId, run: Option<RunId>) -> Action {
        let msg = format!(
            "tfinit: {}: terraform was not started; the controller should retry later (exit code {})",
            self.as_str(),
            protocol::EXIT_REFUSED
        );
        Action::Answer {
            conn,
            note: ExitNote {
                code: protocol::EXIT_REFUSED,
                error: Some(msg),
                run_id: run.map(|r| r.to_string()),
                ..Default::default()
            },
        }
    }
}
