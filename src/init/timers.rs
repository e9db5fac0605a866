//! Timers, as the epoll timeout: the shutdown timeline, the records' timers (the heartbeat, a
//! record that does not land in time), an abandoned run's SIGKILL, and the linger of pipes after
//! terraform exited.

use std::time::Instant;

use nix::sys::epoll::EpollTimeout;

use super::runs::{Life, Stream};
use super::state::Init;

impl Init {
    /// The epoll timeout: until the nearest timer, or forever.
    pub(super) fn timeout(&self) -> EpollTimeout {
        let now = Instant::now();
        let mut next: Option<Instant> = self.timeline.next_wakeup();
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        };
        consider(self.book.next_wakeup());
        for r in self.runs.values() {
            consider(r.kill_due());
            if let Life::Exited { linger_until, .. } = r.life {
                consider(Some(linger_until));
            }
            if let Life::AwaitingRecords { deadline, .. } = r.life {
                consider(Some(deadline));
            }
        }
        match next {
            None => EpollTimeout::NONE,
            Some(t) => {
                let ms = t.saturating_duration_since(now).as_millis().min(60_000) as u16;
                // Round up so we do not wake a millisecond early and spin.
                EpollTimeout::from(ms.saturating_add(1))
            }
        }
    }

    /// Acts on every timer that is due at `now`.
    pub(super) fn on_timers(&mut self, now: Instant) {
        while let Some(t) = self.timeline.due(now) {
            self.transition(t);
        }
        self.on_record_timers(now);
        let ids: Vec<u64> = self.runs.keys().copied().collect();
        for id in ids {
            let Some(run) = self.runs.get_mut(&id) else {
                continue;
            };
            if run.kill_due().is_some_and(|t| now >= t) {
                self.kill_run(id, "abandoned run did not stop within TFINIT_STOP_TIMEOUT");
                continue;
            }
            if matches!(run.life, Life::Exited { linger_until, .. } if now >= linger_until) {
                tracing::debug!(run = %run.job.id, "output pipes still open after terraform exited; draining and closing them");
                self.drain_and_close(id, Stream::Stdout);
                self.drain_and_close(id, Stream::Stderr);
                continue;
            }
        }
    }
}
