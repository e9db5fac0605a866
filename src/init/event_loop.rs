//! The PID-1 event loop: one thread, one epoll set (signalfd, control socket, connections, run
//! output pipes, the recorder's eventfd, the recovery helpers' report pipe), timers as the epoll
//! timeout. It only waits and dispatches each event to its handler (supervisor.rs and the files
//! beside it), which hands it to the concern it concerns and carries out what comes back. Nothing
//! here panics or exits on a runtime error: failures are logged and the loop carries on, because
//! if PID 1 dies the container dies.

use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::epoll::{EpollEvent, EpollFlags};

use super::supervisor::Init;
use super::token::{self, Source};

impl Init {
    /// Runs until the controller and every run are gone, then exits the process with the
    /// controller's code.
    pub(super) fn run(mut self) -> ! {
        let mut events = vec![EpollEvent::empty(); 256];
        // A SIGCHLD may have come before the signalfd was registered: reap once up front.
        self.reap();
        // The nearest timer, computed again only after a wake-up that may have moved it: one
        // that only forwarded signals changed nothing it is computed from (the recorder's thread
        // rings when it goes idle with a timer of its own, an event like any other).
        let mut next_timer = None;
        let mut timers_moved = true;
        loop {
            if let Some(code) = self.finished() {
                self.exit(code);
            }
            if timers_moved {
                next_timer = self.next_timer();
            }
            let n = match self.wait(&mut events, Init::timeout(next_timer)) {
                Ok(n) => n,
                Err(Errno::EINTR) => 0,
                Err(e) => {
                    self.wait_failed(e);
                    std::thread::sleep(Duration::from_millis(10));
                    0
                }
            };
            let mut only_forwarded = true;
            for ev in &events[..n] {
                only_forwarded &= self.dispatch(ev.data(), ev.events());
            }
            // The controller's exit was the last thing waited for: out now, without this
            // wake-up's timers and gauges (cold code on the exit's path).
            if let Some(code) = self.finished() {
                self.exit(code);
            }
            let now = Instant::now();
            timers_moved = timers_due(only_forwarded, next_timer, now);
            if timers_moved {
                self.on_timers(now);
                self.publish(now);
            }
        }
    }

    /// Hands one epoll event to the handler of its source. True when it only passed signals on
    /// to the controller (`on_signals`): nothing any concern holds has changed.
    fn dispatch(&mut self, tok: u64, flags: EpollFlags) -> bool {
        match token::decode(tok) {
            Source::Signals => return self.on_signals(),
            Source::Listener => self.accept_all(),
            Source::Conn(id) => self.on_conn(id, flags),
            Source::Output(id, stream) => self.on_output(id, stream),
            Source::Recorder => self.on_recorder(),
            Source::Reports => self.on_reports(),
            Source::Unknown(t) => tracing::debug!(token = t, "event for an unknown token"),
        }
        false
    }
}

/// Whether a wake-up acts on the timers and sets the gauges: after any event but a forwarded
/// signal, or once the nearest timer (`next`, as it was before the wait) is due. A wake-up that
/// only forwarded signals changed nothing the timers or the gauges read, so they wait for their
/// own wake-up, as in an idle init: without this, the records' and runs' timers (the recorder's
/// quiet news taken, waiting runs checked again) were 3,016 of a forward's 5,098 instructions.
/// False also means that the nearest timer has not moved: the loop keeps the one it had.
fn timers_due(only_forwarded: bool, next: Option<Instant>, now: Instant) -> bool {
    !only_forwarded || next.is_some_and(|t| t <= now)
}

#[cfg(test)]
mod tests {
    use super::timers_due;
    use std::time::{Duration, Instant};

    #[test]
    fn a_wake_up_that_only_forwarded_signals_leaves_the_timers_until_one_is_due() {
        let now = Instant::now();
        let later = now + Duration::from_secs(5);
        assert!(
            !timers_due(true, Some(later), now),
            "forwards only, nothing due"
        );
        assert!(
            !timers_due(true, None, now),
            "forwards only, no timer at all"
        );
        assert!(timers_due(true, Some(now), now), "a timer due now");
        assert!(
            timers_due(true, Some(now - Duration::from_millis(1)), now),
            "one overdue"
        );
        assert!(timers_due(false, Some(later), now), "any other event");
        assert!(timers_due(false, None, now), "any other event, no timer");
    }
}
