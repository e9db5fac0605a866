//! How runs stop and end: the one graceful SIGTERM, the SIGKILL of a group, a shim that leaves or
//! forwards a signal, terraform reaped, the run finished (its shim answered, its record removed
//! or kept), and the timers of abandoned and exited runs.

use std::path::Path;
use std::time::Instant;

use super::super::action::{Action, Force};
use super::super::reaper::Exit;
use super::life::{Helper, Job, Life, Stop};
use super::{Runs, LINGER};
use crate::locks::book::{Book, RecordStatus};
use crate::locks::follower::Follower;
use crate::locks::names::RunId;
use crate::locks::record;
use crate::metrics::RunOutcome;
use crate::protocol::ExitNote;
use crate::signals;

/// The exit code of terraform's panicwrap parent when its wrapped child (the process that holds the
/// lock) was killed by a signal (the child's wait status -1 as an exit code:
/// docs/notes/terraform-facts.md 6b). terraform itself exits 0, 1 or 2.
const PANICWRAP_CHILD_KILLED: i32 = 255;

impl Runs {
    /// Asks a run to stop gracefully: its one SIGTERM, to terraform's own pid (never its group).
    fn request_stop(&mut self, id: RunId, reason: &'static str, acts: &mut Vec<Action>) {
        let Some(run) = self.table.get_mut(&id) else {
            return;
        };
        // Not started: there is nothing to stop, and it will not start (the phase refuses it or
        // the kill step comes first). Exited: too late.
        let Life::Running { pid, stop, .. } = &mut run.life else {
            return;
        };
        *stop = match *stop {
            Stop::None => Stop::Graceful { kill_at: None },
            Stop::Killed { graceful: false } => Stop::Killed { graceful: true },
            Stop::Graceful { .. } | Stop::Killed { graceful: true } => return,
        };
        acts.push(Action::Term {
            run: id,
            pid: *pid,
            reason,
        });
    }

    /// SIGKILLs a run's process group (or its recovery helper's), once.
    fn kill_run(&mut self, id: RunId, reason: &'static str, acts: &mut Vec<Action>) {
        let Some(run) = self.table.get_mut(&id) else {
            return;
        };
        match &mut run.life {
            // Not started: nothing to kill (the shutdown refused it already).
            Life::Queued { .. }
            | Life::AwaitingRecords { .. }
            | Life::Recording { .. }
            | Life::Launching { .. } => {}
            Life::Recovering { helper, .. } => {
                if let Helper::Running { pid, kill_at } = helper {
                    // Due once: an abandoned run's timer never fires again.
                    *kill_at = None;
                    acts.push(Action::KillHelper(*pid));
                }
            }
            Life::Running { pid, stop, .. }
            | Life::Exited {
                pgid: pid, stop, ..
            } => {
                let graceful = match *stop {
                    Stop::Killed { .. } => return,
                    s => s.graceful(),
                };
                *stop = Stop::Killed { graceful };
                acts.push(Action::KillGroup {
                    run: id,
                    pgid: *pid,
                    reason,
                });
            }
        }
    }

    /// The shutdown's graceful step (`Force::Graceful`: every run gets its one SIGTERM) or its
    /// kill step (`Force::Kill`: every run's process group, or helper, is SIGKILLed).
    pub(in crate::init) fn stop_all(&mut self, force: Force, reason: &'static str) -> Vec<Action> {
        let mut acts = Vec::new();
        let ids = self.ids();
        for id in ids {
            self.stop(id, force, reason, &mut acts);
        }
        acts
    }

    /// Stops run `id` gracefully, or kills it.
    pub(super) fn stop(
        &mut self,
        id: RunId,
        force: Force,
        reason: &'static str,
        acts: &mut Vec<Action>,
    ) {
        match force {
            Force::Graceful => self.request_stop(id, reason, acts),
            Force::Kill => self.kill_run(id, reason, acts),
        }
    }

    /// The shim of run `id` forwarded a stop signal: terraform gets its one graceful SIGTERM,
    /// unless the shutdown timeline decides (`stopping`) or it got it already.
    pub(in crate::init) fn shim_signal(
        &mut self,
        id: RunId,
        signo: i32,
        stopping: bool,
    ) -> Vec<Action> {
        let mut acts = Vec::new();
        let Some(run) = self.table.get(&id) else {
            return acts;
        };
        if stopping {
            tracing::info!(run = %id, signal = %signals::name(signo), "the shim got a signal during shutdown; the shutdown timeline decides instead");
        } else if run.stop_requested() {
            tracing::info!(run = %id, signal = %signals::name(signo), "the shim got another signal; terraform was already asked to stop once (a second would make it exit immediately)");
        } else {
            self.request_stop(id, "the shim received a stop signal", &mut acts);
        }
        acts
    }

    /// The shim's connection of run `id` ended while the run goes on: the run is abandoned. One
    /// that has not started never starts; a running terraform is stopped gracefully, then hard
    /// after TFINIT_STOP_TIMEOUT (unless `stopping`: the timeline decides); its output goes to
    /// the log.
    pub(in crate::init) fn detach(
        &mut self,
        id: RunId,
        now: Instant,
        stopping: bool,
    ) -> Vec<Action> {
        let Some(run) = self.table.get_mut(&id) else {
            return Vec::new();
        };
        run.job.conn = None;
        if run.waiting() {
            // Nobody waits for it any more, and starting it now would only leave a run to stop.
            tracing::info!(run = %id, state = run.life.as_str(), "the shim is gone; terraform is not started");
            let mut acts = Vec::new();
            self.take(id, None, Vec::new(), &mut acts);
            acts.push(Action::Admit);
            return acts;
        }
        let was_paused = run.pipes().is_some_and(|p| p.paused);
        if matches!(run.life, Life::Exited { .. }) {
            // Its output, still draining, goes to the log now.
            return vec![Action::Resume(id)];
        }
        let job = &run.job;
        tracing::info!(run = %id, pid = run.pid().map_or(0, |p| p.as_raw()), cwd = %job.cwd.display(), subcommand = %job.invocation.subcommand, "the shim is gone; terraform keeps running, its output is logged");
        let mut acts = Vec::new();
        if !stopping {
            // The caller gave up (a reconcile timeout): stop gracefully, then hard after the timeout.
            self.request_stop(id, "the shim that started it is gone", &mut acts);
            if let Some(run) = self.table.get_mut(&id) {
                run.arm_kill(now + self.stop_timeout);
            }
        }
        if was_paused {
            acts.push(Action::Resume(id));
        }
        acts
    }

    /// terraform of run `id` was reaped: the run is Exited (its pipes drain until the linger
    /// ends); what it left in its group goes when it was killed or while stopping.
    pub(in crate::init) fn terraform_exited(
        &mut self,
        id: RunId,
        exit: Exit,
        stopping_phase: bool,
        book: &Book,
        now: Instant,
    ) -> Vec<Action> {
        let Some(run) = self.table.get_mut(&id) else {
            return Vec::new();
        };
        let Some((pgid, stop)) = run.reaped(exit, now + LINGER) else {
            return Vec::new();
        };
        let job = &run.job;
        let dur = job.started.elapsed().map_or(0.0, |d| d.as_secs_f64());
        tracing::info!(
            run = %id, pid = pgid.as_raw(), %exit, seconds = dur,
            cwd = %job.cwd.display(), subcommand = %job.invocation.subcommand, attached = job.conn.is_some(),
            "terraform exited"
        );
        // Leftover members of its group: provider plugins a killed terraform left behind, or the
        // children of a local-exec that a graceful stop orphaned (`sleep`). The latter can hold
        // terraform's output pipes open (panicwrap passes them down), so while stopping they go
        // at once: the init must exit when terraform is done, not after the pipes' linger.
        // Also after a graceful stop we asked for (the shim's signal, an abandoned run): the
        // interrupted local-exec's children are debris that would hold the output pipes open.
        let stopping = stopping_phase || stop.graceful();
        // Exit code 255: panicwrap's child was killed, its providers are orphans too.
        let killed = exit.signal().is_some() || exit == Exit::Code(PANICWRAP_CHILD_KILLED);
        let mut acts = Vec::new();
        if killed || stopping {
            acts.push(Action::KillLeftovers {
                run: id,
                pgid,
                stopping,
            });
        }
        self.finish_if_done(id, book, &mut acts);
        // Its place under TFINIT_MAX_RUNS is free: terraform is gone (its output may still drain).
        acts.push(Action::Admit);
        acts
    }

    /// One of run `id`'s pipes was closed: the run may be over.
    pub(in crate::init) fn pipe_closed(&mut self, id: RunId, book: &Book) -> Vec<Action> {
        let mut acts = Vec::new();
        self.finish_if_done(id, book, &mut acts);
        acts
    }

    /// Ends a run once terraform was reaped and its output fully drained: its shim gets the exit
    /// code, and its record is removed when terraform exited by itself (kept when killed).
    fn finish_if_done(&mut self, id: RunId, book: &Book, acts: &mut Vec<Action>) {
        let Some(run) = self.table.get(&id) else {
            return;
        };
        let (exit, stop) = match &run.life {
            Life::Exited {
                exit, pipes, stop, ..
            } if !pipes.is_open() => (*exit, *stop),
            _ => return,
        };
        let job = &run.job;
        // Creates, updates or destroys that started and never completed: their resources may exist
        // outside the state. terraform exited by itself (a graceful stop, an error), so no lock
        // recovery will name them later: name them now.
        let unfinished = job
            .follower
            .as_ref()
            .map(Follower::in_progress)
            .unwrap_or_default();
        if !unfinished.is_empty() && matches!(exit, Exit::Code(_)) {
            tracing::warn!(
                run = %id, exit_code = exit.code(), cwd = %job.cwd.display(), subcommand = %job.invocation.subcommand,
                orphan_candidates = ?unfinished,
                "operations unfinished when terraform exited: resources that may exist outside the state: check them and import or delete"
            );
        }
        let ended = job
            .locking()
            .then(|| how_it_ended(job, exit, &unfinished, book.record(&self.table, id)))
            .flatten();
        let Some(run) = self.take(id, ended, unfinished, acts) else {
            return;
        };
        let job = run.job;
        if let Some(conn) = job.conn {
            let note = ExitNote {
                code: exit.code(),
                signal: exit.signal(),
                error: None,
                run_id: Some(id.to_string()),
            };
            acts.push(Action::Answer { conn, note });
        }
        acts.push(Action::Tally {
            subcommand: job.invocation.subcommand.clone(),
            outcome: outcome_of(exit, stop),
            took: job.started.elapsed().unwrap_or_default(),
        });
    }

    /// Time-driven work at `now`: runs that waited too long for the store go on; an abandoned
    /// run that did not stop within TFINIT_STOP_TIMEOUT is SIGKILLed; pipes still open after
    /// terraform's linger are drained and closed.
    pub(in crate::init) fn run_timers(&mut self, state_dir: &Path, now: Instant) -> Vec<Action> {
        let mut acts = Vec::new();
        self.expire_waiting(state_dir, now, &mut acts);
        let ids = self.ids();
        for id in ids {
            let Some(run) = self.table.get(&id) else {
                continue;
            };
            if run.kill_due().is_some_and(|t| now >= t) {
                let reason = match run.job.conn {
                    None => "abandoned run did not stop within TFINIT_STOP_TIMEOUT",
                    Some(_) => "cancelled run did not stop within TFINIT_STOP_TIMEOUT",
                };
                self.kill_run(id, reason, &mut acts);
            } else if matches!(run.life, Life::Exited { linger_until, .. } if now >= linger_until) {
                tracing::debug!(run = %id, "output pipes still open after terraform exited; draining and closing them");
                acts.push(Action::Drain(id));
            }
        }
        acts
    }
}

/// How a run ended, as the metrics count it: what tfinit did to it first, else its exit.
fn outcome_of(exit: Exit, stop: Stop) -> RunOutcome {
    match (exit, stop) {
        (_, Stop::Killed { .. }) => RunOutcome::Killed,
        (_, s) if s.graceful() => RunOutcome::StoppedGracefully,
        (Exit::Signal(_), _) => RunOutcome::Signalled,
        (Exit::Code(0), _) => RunOutcome::Succeeded,
        (Exit::Code(_), _) => RunOutcome::Failed,
    }
}

/// A state-locking run is over: its record is removed when terraform exited by itself (None),
/// and kept, marked ended (how), when it may have left its lock (the recorder does either, in
/// order after the record's other writes). `in_progress`: the operations it left unfinished.
fn how_it_ended(
    job: &Job,
    exit: Exit,
    in_progress: &[String],
    record: Option<&RecordStatus>,
) -> Option<record::Ended> {
    let trouble = job.follower.as_ref().and_then(Follower::lock_trouble);
    let ended = match (exit, trouble) {
        (Exit::Code(c), None) if c != PANICWRAP_CHILD_KILLED => None,
        (Exit::Signal(s), _) => Some(format!("killed by {}", signals::name(s))),
        (_, Some(why)) => Some(format!("{why}, exit code {}", exit.code())),
        _ => Some(format!(
            "exit code {PANICWRAP_CHILD_KILLED}: terraform's wrapped child process was killed by a signal"
        )),
    };
    let kept = record.is_some_and(RecordStatus::may_exist);
    if let Some(how) = ended.as_ref().filter(|_| kept) {
        tracing::warn!(
            run = %job.id, how = %how, in_progress = ?in_progress,
            "terraform ended without releasing its state lock for sure: its lock-owner record is kept, and the next state-locking run in {} checks the lock first",
            job.workdir.display()
        );
    }
    ended.map(|how| record::Ended {
        ms: record::now_ms(),
        how,
    })
}
