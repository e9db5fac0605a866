//! What a shim does to its run: leaves (the run is abandoned), forwards a stop signal, or asks
//! for the status document.

use std::time::{Instant, SystemTime};

use super::runs::Run;
use super::shutdown::Phase;
use super::state::Init;
use crate::protocol;
use crate::signals;

impl Init {
    /// A shim's connection ended while its run goes on: the run is abandoned.
    pub(super) fn detach(&mut self, id: u64) {
        let stopping = self.timeline.phase() == Phase::Stopping;
        let stop_timeout = self.cfg.stop_timeout;
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        run.job.conn = None;
        if run.waits_for_store() {
            // Nobody waits for it any more, and starting it now would only leave a run to stop.
            tracing::info!(run = %run.job.id, state = run.life.as_str(), "the shim is gone; terraform is not started");
            let job_id = run.job.id.clone();
            self.runs.remove(&id);
            self.forget_record(&job_id);
            return;
        }
        let was_paused = run.paused();
        if !run.alive() {
            self.resume(id);
            return;
        }
        tracing::info!(run = %run.job.id, pid = run.pid().map_or(0, |p| p.as_raw()), cwd = %run.job.cwd.display(), subcommand = %run.job.invocation.subcommand, "the shim is gone; terraform keeps running, its output is logged");
        if !stopping {
            // The caller gave up (a reconcile timeout): stop gracefully, then hard after the timeout.
            run.set_kill_at(Instant::now() + stop_timeout);
            self.request_stop(id, "the shim that started it is gone");
        }
        if was_paused {
            self.resume(id);
        }
    }

    /// A shim forwarded a signal it received.
    pub(super) fn on_shim_signal(&mut self, id: u64, signo: i32) {
        let Some(run) = self.runs.get(&id) else {
            return;
        };
        if self.timeline.phase() == Phase::Stopping {
            tracing::info!(run = %run.job.id, signal = %signals::name(signo), "the shim got a signal during shutdown; the shutdown timeline decides instead");
            return;
        }
        if run.stop_requested() {
            tracing::info!(run = %run.job.id, signal = %signals::name(signo), "the shim got another signal; terraform was already asked to stop once (a second would make it exit immediately)");
            return;
        }
        self.request_stop(id, "the shim received a stop signal");
    }

    /// The status document.
    pub(super) fn status(&self) -> protocol::Status {
        let now = Instant::now();
        let mut runs: Vec<_> = self.runs.values().map(Run::status).collect();
        runs.sort_by(|a, b| {
            a.started_unix
                .partial_cmp(&b.started_unix)
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        protocol::Status {
            v: protocol::VERSION,
            pid: std::process::id() as i32,
            phase: self.timeline.phase().as_str().to_string(),
            deadline_unix: self
                .timeline
                .deadline()
                .and_then(|(_, wall)| wall.duration_since(SystemTime::UNIX_EPOCH).ok())
                .map(|d| d.as_secs_f64()),
            seconds_left: self.timeline.seconds_left(now),
            main_pid: self.main.exit.is_none().then_some(self.main.pid.as_raw()),
            records: Some({
                let view = self.book.view(now);
                protocol::RecordsStatus {
                    state: view.state.to_string(),
                    heartbeat_age_seconds: view.heartbeat_age.map(|d| d.as_secs_f64()),
                }
            }),
            runs,
        }
    }
}
