//! The signals the concerns' actions send (every one through `sys::kill`), each logged with the
//! shutdown's phase and time left; and the shutdown's own log lines. Who gets which signal when
//! is decided by the concerns (runs/, shutdown.rs, reaping.rs): this file only carries it out.

use std::path::Path;
use std::time::Instant;

use nix::errno::Errno;
use nix::unistd::Pid;

use super::Init;
use crate::duration::fmt_duration;
use crate::init::action::{Action, Force};
use crate::init::shutdown::{Phase, Step};
use crate::locks::names::RunId;
use crate::signals;
use crate::sys::{self, SigNo, Target};

impl Init {
    /// Signals `target` (the controller's group, only while it has members; everyone) and logs
    /// it.
    pub(super) fn signal(&self, target: Target, signo: SigNo, what: &str) {
        if let Target::Group(pgid) = target {
            if !sys::group_alive(pgid) {
                return;
            }
        }
        let (phase, left) = self.timeline.when(Instant::now());
        match sys::kill(target, signo) {
            Ok(()) => {
                tracing::info!(%target, signal = %signals::name(signo), phase, seconds_left = left, "signalled {what}")
            }
            Err(Errno::ESRCH) => tracing::debug!(%target, "{what}: already gone"),
            Err(e) => {
                tracing::warn!(%target, signal = %signals::name(signo), error = %e, "signalling {what} failed")
            }
        }
    }

    /// terraform's one graceful SIGTERM (to its own pid, never its group).
    pub(super) fn term(&self, run: RunId, pid: Pid, reason: &str) {
        let (phase, left) = self.timeline.when(Instant::now());
        let (cwd, subcommand, _) = self.runs.named(run).unwrap_or((Path::new(""), "", None));
        match sys::kill(Target::Pid(pid), libc::SIGTERM) {
            Ok(()) => tracing::info!(
                run = %run, pid = pid.as_raw(), cwd = %cwd.display(), subcommand,
                phase, seconds_left = left, reason, "SIGTERM to terraform (graceful stop: it finishes operations in flight, saves state, releases the lock)"
            ),
            Err(e) => {
                tracing::warn!(run = %run, pid = pid.as_raw(), error = %e, "SIGTERM to terraform failed")
            }
        }
    }

    /// SIGKILL to a run's process group, when anything is left in it.
    pub(super) fn kill_group(&self, run: RunId, pgid: Pid, reason: &str) {
        if !sys::group_alive(pgid) {
            return;
        }
        let (phase, left) = self.timeline.when(Instant::now());
        let (cwd, subcommand, in_progress) =
            self.runs.named(run).unwrap_or((Path::new(""), "", None));
        match sys::kill(Target::Group(pgid), libc::SIGKILL) {
            Ok(()) => tracing::info!(
                run = %run, pid = pgid.as_raw(), pgid = pgid.as_raw(), cwd = %cwd.display(), subcommand,
                phase, seconds_left = left, reason, in_progress = ?in_progress,
                "SIGKILL to terraform's process group"
            ),
            Err(e) => {
                tracing::warn!(run = %run, error = %e, "SIGKILL to terraform's group failed")
            }
        }
    }

    /// SIGKILL to what terraform left in its process group after it exited.
    pub(super) fn leftovers(&self, run: RunId, pgid: Pid, stopping: bool) {
        if !sys::group_alive(pgid) {
            return;
        }
        match sys::kill(Target::Group(pgid), libc::SIGKILL) {
            Ok(()) if stopping => {
                let (phase, left) = self.timeline.when(Instant::now());
                tracing::info!(
                    run = %run, pgid = pgid.as_raw(), phase, seconds_left = left,
                    "SIGKILL to what terraform left in its process group"
                )
            }
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(e) => {
                tracing::warn!(run = %run, pgid = pgid.as_raw(), error = %e, "SIGKILL to terraform's leftovers failed")
            }
        }
    }

    /// SIGKILL to a recovery helper's process group.
    pub(super) fn kill_helper(&self, pid: Pid) {
        let _ = sys::kill(Target::Group(pid), libc::SIGKILL);
    }

    /// A shutdown step for the runs: logged, then every run's one SIGTERM, or every run's group
    /// (or helper) SIGKILLed.
    pub(super) fn stop_runs(&mut self, force: Force) -> Vec<Action> {
        let (what, reason) = match force {
            Force::Graceful => (
                "asking terraform runs to stop gracefully",
                "shutdown deadline approaching",
            ),
            Force::Kill => ("SIGKILL to everything left", "shutdown deadline"),
        };
        let left = self.timeline.seconds_left(Instant::now()).unwrap_or(0.0);
        tracing::info!(
            phase = Phase::Stopping.as_str(),
            step = Step::of(force).as_str(),
            runs = self.runs.len(),
            seconds_left = left,
            "{what}"
        );
        self.runs.stop_all(force, reason)
    }

    /// The shutdown began (`cause`): said with what it will do, unless `quiet_when_done` and
    /// nothing is left to stop (the init exits right away, and its exit is logged).
    pub(super) fn began(&self, cause: &str, quiet_when_done: bool) {
        let main = self.children.main();
        if quiet_when_done && self.runs.is_empty() && !sys::group_alive(main) {
            return;
        }
        let left = self.timeline.seconds_left(Instant::now()).unwrap_or(0.0);
        tracing::info!(
            phase = Phase::Stopping.as_str(),
            cause,
            grace_period = %fmt_duration(self.cfg.grace_period),
            runs = self.runs.len(),
            seconds_left = left,
            "shutdown: new terraform runs are refused; runs in flight get SIGTERM {} before the deadline and SIGKILL {} before it",
            fmt_duration(self.cfg.stop_timeout),
            fmt_duration(self.cfg.kill_margin),
        );
    }
}
