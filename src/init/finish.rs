//! The ends: terraform reaped (its leftovers killed), a run finished (the shim answered, the
//! record removed or kept), and the init's own exit.

use std::time::Instant;

use nix::errno::Errno;

use super::reaper::Exit;
use super::runs::{Job, Life, LINGER};
use super::shutdown::Phase;
use super::state::Init;
use crate::locks::book::RecordStatus;
use crate::locks::follower::Follower;
use crate::locks::record;
use crate::protocol::ExitNote;
use crate::signals;
use crate::sys::{self, Target};

/// The exit code of terraform's panicwrap parent when its wrapped child (the process that holds the
/// lock) was killed by a signal (the child's wait status -1 as an exit code:
/// docs/notes/terraform-facts.md 6b). terraform itself exits 0, 1 or 2.
const PANICWRAP_CHILD_KILLED: i32 = 255;

impl Init {
    /// Whether the init may exit now, and with which code: the controller is gone, no run is left,
    /// and the controller's process group is empty. Never waits for a timer.
    pub(super) fn finished(&self) -> Option<i32> {
        let exit = self.main.exit?;
        if !self.runs.is_empty() || sys::group_alive(self.main.pid) {
            return None;
        }
        Some(exit.code())
    }

    /// Exits the process with `code`, after one last non-blocking attempt to deliver queued
    /// frames (exit codes) to shims.
    pub(super) fn exit(&mut self, code: i32) -> ! {
        self.settle_records();
        for conn in self.conns.values_mut() {
            let _ = conn.write_some();
        }
        tracing::info!(exit_code = code, "tfinit exiting");
        // Straight out: the kernel closes our descriptors and frees our memory faster than
        // destructors and atexit handlers would, and a container's exit waits on us.
        sys::exit_now(code)
    }

    /// terraform of run `id` was reaped: the run is Exited; what it left in its group goes when
    /// it was killed or while stopping.
    pub(super) fn on_terraform_exit(&mut self, id: u64, exit: Exit) {
        let stopping_phase = self.timeline.phase() == Phase::Stopping;
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        // Also after a graceful stop we asked for (the shim's signal, an abandoned run).
        let stop_requested = run.stop_requested();
        run.exited(exit, Instant::now() + LINGER);
        let Life::Exited { pgid, .. } = run.life else {
            return;
        };
        let job = &run.job;
        let dur = job.started.elapsed().map_or(0.0, |d| d.as_secs_f64());
        tracing::info!(
            run = %job.id, pid = pgid.as_raw(), %exit, seconds = dur,
            cwd = %job.cwd.display(), subcommand = %job.invocation.subcommand, attached = job.conn.is_some(),
            "terraform exited"
        );
        // Leftover members of its group: provider plugins a killed terraform left behind, or the
        // children of a local-exec that a graceful stop orphaned (`sleep`). The latter can hold
        // terraform's output pipes open (panicwrap passes them down), so while stopping they go
        // at once: the init must exit when terraform is done, not after the pipes' linger.
        // Also after a graceful stop we asked for (the shim's signal, an abandoned run): the
        // interrupted local-exec's children are debris that would hold the output pipes open.
        let stopping = stopping_phase || stop_requested;
        // Exit code 255: panicwrap's child was killed, its providers are orphans too.
        let killed = exit.signal().is_some() || exit == Exit::Code(PANICWRAP_CHILD_KILLED);
        if (killed || stopping) && sys::group_alive(pgid) {
            match sys::kill(Target::Group(pgid), libc::SIGKILL) {
                Ok(()) if stopping => tracing::info!(
                    run = %job.id, pgid = pgid.as_raw(), phase = self.timeline.phase().as_str(),
                    seconds_left = self.timeline.seconds_left(Instant::now()),
                    "SIGKILL to what terraform left in its process group"
                ),
                Ok(()) | Err(Errno::ESRCH) => {}
                Err(e) => {
                    tracing::warn!(run = %job.id, pgid = pgid.as_raw(), error = %e, "SIGKILL to terraform's leftovers failed")
                }
            }
        }
        self.maybe_finish(id);
    }

    /// Ends a run once terraform was reaped and its output fully drained: sends the exit code to
    /// the shim, removes the record when terraform exited by itself (kept when killed).
    pub(super) fn maybe_finish(&mut self, id: u64) {
        let Some(run) = self.runs.get(&id) else {
            return;
        };
        let Life::Exited { exit, pipes, .. } = &run.life else {
            return;
        };
        if pipes.is_open() {
            return;
        }
        let exit = *exit;
        let Some(run) = self.runs.remove(&id) else {
            return;
        };
        let job = run.job;
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
                run = %job.id, exit_code = exit.code(), cwd = %job.cwd.display(), subcommand = %job.invocation.subcommand,
                orphan_candidates = ?unfinished,
                "operations unfinished when terraform exited: resources that may exist outside the state: check them and import or delete"
            );
        }
        if job.follower.is_some() {
            self.close_record(&job, exit, unfinished);
        }
        if let Some(c) = job.conn {
            self.reply_exit(
                c,
                ExitNote {
                    code: exit.code(),
                    signal: exit.signal(),
                    error: None,
                    run_id: Some(job.id),
                },
            );
        }
    }

    /// A state-locking run is over: its record is removed when terraform exited by itself, and
    /// kept, marked ended, when it may have left its lock (the recorder does either, in order
    /// after the record's other writes). `in_progress`: the operations it left unfinished.
    fn close_record(&mut self, job: &Job, exit: Exit, in_progress: Vec<String>) {
        let trouble = job.follower.as_ref().and_then(Follower::lock_trouble);
        let ended = match (exit, trouble) {
            (Exit::Code(c), None) if c != PANICWRAP_CHILD_KILLED => None,
            (Exit::Signal(s), _) => Some(format!("killed by {}", signals::name(s))),
            (_, Some(why)) => Some(format!("{why}, exit code {}", exit.code())),
            _ => Some(format!(
                "exit code {PANICWRAP_CHILD_KILLED}: terraform's wrapped child process was killed by a signal"
            )),
        };
        let kept = ended.is_some()
            && self
                .book
                .record(&job.id)
                .is_some_and(|r| !matches!(r, RecordStatus::Unrecorded | RecordStatus::Failed));
        if let Some(how) = ended.as_ref().filter(|_| kept) {
            tracing::warn!(
                run = %job.id, how = %how, in_progress = ?in_progress,
                "terraform ended without releasing its state lock for sure: its lock-owner record is kept, and the next state-locking run in {} checks the lock first",
                job.workdir.display()
            );
        }
        let ended = ended.map(|how| record::Ended {
            ms: record::now_ms(),
            how,
        });
        if let Some(request) = self.book.exited(&job.id, ended, in_progress) {
            self.send_to_recorder(request);
        }
    }
}
