//! Shutdown actions: the timeline's transitions, the one graceful SIGTERM of a run, the SIGKILL
//! of a run's group, and the controller's leftovers.

use std::time::Instant;

use nix::errno::Errno;

use super::runs::Life;
use super::setup::Mode;
use super::shutdown::{Cause, Phase, Transition};
use super::state::Init;
use crate::config::fmt_duration;
use crate::signals;
use crate::sys::{self, SigNo, Target};

impl Init {
    /// Carries out one step of the shutdown timeline.
    pub(super) fn transition(&mut self, t: Transition) {
        let left = self.timeline.seconds_left(Instant::now()).unwrap_or(0.0);
        match t {
            Transition::Began(cause) => {
                let why = match cause {
                    Cause::Signal => "stop signal",
                    Cause::MainExited => "controller exited",
                };
                self.refuse_waiting();
                if cause == Cause::MainExited
                    && self.runs.is_empty()
                    && !sys::group_alive(self.main.pid)
                {
                    // Nothing is left to stop: the init exits right away (its exit is logged).
                    return;
                }
                tracing::info!(
                    phase = Phase::Stopping.as_str(),
                    cause = why,
                    grace_period = %fmt_duration(self.cfg.grace_period),
                    runs = self.runs.len(),
                    seconds_left = left,
                    "shutdown: new terraform runs are refused; runs in flight get SIGTERM {} before the deadline and SIGKILL {} before it",
                    fmt_duration(self.cfg.stop_timeout),
                    fmt_duration(self.cfg.kill_margin),
                );
                if cause == Cause::MainExited {
                    self.stop_leftovers();
                }
            }
            Transition::Graceful => {
                tracing::info!(
                    phase = "stopping",
                    step = "graceful",
                    runs = self.runs.len(),
                    seconds_left = left,
                    "asking terraform runs to stop gracefully"
                );
                let ids: Vec<u64> = self.runs.keys().copied().collect();
                for id in ids {
                    self.request_stop(id, "shutdown deadline approaching");
                }
            }
            Transition::Kill => {
                tracing::info!(
                    phase = "stopping",
                    step = "kill",
                    runs = self.runs.len(),
                    seconds_left = left,
                    "SIGKILL to everything left"
                );
                let ids: Vec<u64> = self.runs.keys().copied().collect();
                for id in ids {
                    self.kill_run(id, "shutdown deadline");
                }
                if sys::group_alive(self.main.pid) {
                    self.signal(
                        Target::Group(self.main.pid),
                        libc::SIGKILL,
                        "controller's process group",
                    );
                }
                if self.mode == Mode::Pid1 {
                    self.signal(
                        Target::Everyone,
                        libc::SIGKILL,
                        "every process left in the container",
                    );
                }
            }
        }
    }

    /// The phase and the seconds left to the deadline (once stopping), for logs.
    pub(super) fn when(&self) -> (&'static str, Option<f64>) {
        (
            self.timeline.phase().as_str(),
            self.timeline.seconds_left(Instant::now()),
        )
    }

    /// The controller exited: processes left in its group get one SIGTERM, unless the group
    /// already got a stop signal.
    pub(super) fn stop_leftovers(&mut self) {
        if !self.main.group_stopped && sys::group_alive(self.main.pid) {
            self.main.group_stopped = true;
            self.signal(
                Target::Group(self.main.pid),
                libc::SIGTERM,
                "controller's leftover processes",
            );
        }
    }

    fn signal(&self, target: Target, signo: SigNo, what: &str) {
        let (phase, left) = self.when();
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

    /// Sends a run its one graceful SIGTERM (to terraform's own pid, never its group).
    pub(super) fn request_stop(&mut self, id: u64, why: &str) {
        let (phase, left) = self.when();
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        // Still recovering a lock: terraform has not started, so there is nothing to stop, and it
        // will not start (the phase refuses it or the kill step comes first). Exited: too late.
        let Life::Running { pid, stop, .. } = &mut run.life else {
            return;
        };
        if stop.graceful {
            return;
        }
        stop.graceful = true;
        let pid = *pid;
        let job = &run.job;
        match sys::kill(Target::Pid(pid), libc::SIGTERM) {
            Ok(()) => tracing::info!(
                run = %job.id, pid = pid.as_raw(), cwd = %job.cwd.display(), subcommand = %job.invocation.subcommand,
                phase, seconds_left = left, reason = why, "SIGTERM to terraform (graceful stop: it finishes operations in flight, saves state, releases the lock)"
            ),
            Err(e) => {
                tracing::warn!(run = %job.id, pid = pid.as_raw(), error = %e, "SIGTERM to terraform failed")
            }
        }
    }

    /// SIGKILLs a run's process group (or its recovery helper's), once.
    pub(super) fn kill_run(&mut self, id: u64, why: &str) {
        let (phase, left) = self.when();
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        let job = &run.job;
        match &mut run.life {
            // Not started: nothing to kill (the shutdown refused it already).
            Life::AwaitingRecords { .. } | Life::Recording { .. } => {}
            Life::Recovering {
                helper, kill_at, ..
            } => {
                let _ = sys::kill(Target::Group(*helper), libc::SIGKILL);
                *kill_at = None;
            }
            Life::Running { pid, stop, .. }
            | Life::Exited {
                pgid: pid, stop, ..
            } => {
                let pid = *pid;
                // Due once: an abandoned run's timer never fires again.
                stop.kill_at = None;
                if stop.killed || !sys::group_alive(pid) {
                    return;
                }
                stop.killed = true;
                match sys::kill(Target::Group(pid), libc::SIGKILL) {
                    Ok(()) => tracing::info!(
                        run = %job.id, pid = pid.as_raw(), pgid = pid.as_raw(), cwd = %job.cwd.display(), subcommand = %job.invocation.subcommand,
                        phase, seconds_left = left, reason = why, in_progress = ?job.follower.as_ref().map(|f| f.in_progress()),
                        "SIGKILL to terraform's process group"
                    ),
                    Err(e) => {
                        tracing::warn!(run = %job.id, error = %e, "SIGKILL to terraform's group failed")
                    }
                }
            }
        }
    }
}
