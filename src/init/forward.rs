//! Signals to the init: read from the signalfd, forwarded to the controller (the hot path), or
//! acted on (SIGCHLD reaps, SIGTERM/SIGINT start the shutdown timeline).

use std::time::Instant;

use nix::errno::Errno;
use nix::unistd::Pid;

use super::state::Init;
use crate::config::ForwardTo;
use crate::signals::{self, Incoming};
use crate::sys::{self, SigNo, Target};

/// What a forward did: the signal after rewrite, and where it went with kill(2)'s result (none
/// when there was no one to send it to).
type Forwarded = (SigNo, Option<(Target, Result<(), Errno>)>);

/// Where a forwarded signal goes: the controller itself while it runs (`TFINIT_FORWARD=child`;
/// nobody once it exited), or its whole process group (`group`).
pub fn forward_target(forward: ForwardTo, main: Pid, main_exited: bool) -> Option<Target> {
    match (forward, main_exited) {
        (ForwardTo::Child, false) => Some(Target::Pid(main)),
        (ForwardTo::Child, true) => None,
        (ForwardTo::Group, _) => Some(Target::Group(main)),
    }
}

impl Init {
    /// Reads every pending signal from the signalfd.
    pub(super) fn on_signals(&mut self) {
        loop {
            match self.sigfd.read_signal() {
                Ok(Some(info)) => self.on_signal(info.ssi_signo as SigNo, info.ssi_pid as i32),
                Ok(None) => return,
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the signalfd failed");
                    return;
                }
            }
        }
    }

    fn on_signal(&mut self, signo: SigNo, sender: i32) {
        match signals::classify(signo) {
            Incoming::Child => self.reap(),
            Incoming::Shutdown(s) => {
                // The kill first, the bookkeeping after: the controller's latency is what the
                // init does between reading the signal and kill(2), so nothing else runs there.
                let forwarded = self.forward_now(s);
                let t = self.timeline.on_stop_signal(Instant::now());
                // Logged after the timeline moved, so with the phase and deadline it belongs to;
                // the transition's own signals (if any) follow the forward.
                self.log_forward(s, forwarded);
                tracing::info!(signal = %signals::name(s), sender, "stop signal received");
                if let Some(t) = t {
                    self.transition(t);
                }
            }
            Incoming::Forward(s) => {
                let forwarded = self.forward_now(s);
                tracing::debug!(signal = %signals::name(s), sender, "signal received");
                self.log_forward(s, forwarded);
            }
            Incoming::Ignore(s) => {
                tracing::debug!(signal = %signals::name(s), "signal raised by our own I/O; not forwarded")
            }
        }
    }

    /// Sends a signal (after rewrite) to the controller or its group: the hot path, kept to the
    /// kill itself. Returns what was sent where, for [`Self::log_forward`]: the signal after
    /// rewrite, and no target when there is no one to send it to (`TFINIT_FORWARD=child` and the
    /// controller is gone).
    fn forward_now(&mut self, signo: SigNo) -> Forwarded {
        let to = self.cfg.rewrite.apply(signo);
        let Some(target) =
            forward_target(self.cfg.forward, self.main.pid, self.main.exit.is_some())
        else {
            return (to, None);
        };
        let sent = sys::kill(target, to);
        if sent.is_ok() {
            // Let the woken controller run before we spend our time slice on logs and the
            // timeline: on a busy node it often shares our CPU (forwarding latency, benchmarks).
            std::thread::yield_now();
        }
        if target == Target::Group(self.main.pid)
            && matches!(signals::classify(to), Incoming::Shutdown(_))
        {
            self.main.group_stopped = true;
        }
        (to, Some((target, sent)))
    }

    /// Logs what [`Self::forward_now`] did with `signo`.
    fn log_forward(&self, signo: SigNo, (to, sent_to): Forwarded) {
        let Some((target, sent)) = sent_to else {
            tracing::debug!(signal = %signals::name(to), "controller gone; signal not forwarded");
            return;
        };
        match sent {
            // A stop signal sent on is a shutdown step: logged at info like the others.
            Ok(()) if matches!(signals::classify(signo), Incoming::Shutdown(_)) => {
                let (phase, left) = self.when();
                tracing::info!(signal = %signals::name(to), %target, phase, seconds_left = left, "signal forwarded")
            }
            Ok(()) => tracing::debug!(signal = %signals::name(to), %target, "signal forwarded"),
            Err(Errno::ESRCH) => {
                tracing::debug!(signal = %signals::name(to), %target, "nothing to forward to")
            }
            Err(e) => {
                tracing::warn!(signal = %signals::name(to), %target, error = %e, "forwarding failed")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_go_to_the_controller_or_its_group_and_nowhere_once_the_child_is_gone() {
        let main = Pid::from_raw(42);
        assert_eq!(
            forward_target(ForwardTo::Child, main, false),
            Some(Target::Pid(main))
        );
        assert_eq!(forward_target(ForwardTo::Child, main, true), None);
        assert_eq!(
            forward_target(ForwardTo::Group, main, false),
            Some(Target::Group(main))
        );
        // The group may outlive the controller: its leftovers still get signals.
        assert_eq!(
            forward_target(ForwardTo::Group, main, true),
            Some(Target::Group(main))
        );
    }
}
