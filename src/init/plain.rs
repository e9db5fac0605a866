//! Supervising the controller without an event loop: the fallback when epoll itself cannot be
//! created. It still forwards signals (same rewrite and target rules) and reaps.

use std::time::Duration;

use nix::unistd::Pid;

use super::forward::forward_target;
use super::reaper;
use crate::config::ForwardTo;
use crate::signals::{self, Incoming, Rewrites};
use crate::sys;

/// How long one wait for a signal lasts before reaping anyway (SIGCHLDs coalesce, and reaping
/// on a short period keeps the fallback simple).
const WAIT: Duration = Duration::from_millis(50);

/// Waits for the controller, forwarding signals to it and reaping; returns its exit code.
pub fn wait_plain(main: Pid, forward: ForwardTo, rewrite: &Rewrites) -> i32 {
    // Every signal the init blocked first thing in main: taken here with sigtimedwait instead
    // of from the signalfd.
    let set = signals::init_mask();
    loop {
        let (exits, _) = reaper::reap_all();
        if let Some((_, e)) = exits.iter().find(|(p, _)| *p == main) {
            return e.code();
        }
        match sys::wait_signal(&set, WAIT) {
            Ok(None) => {}
            Ok(Some(signo)) => match signals::classify(signo) {
                Incoming::Child => {}
                Incoming::Shutdown(s) | Incoming::Forward(s) => {
                    let to = rewrite.apply(s);
                    if let Some(target) = forward_target(forward, main, false) {
                        match sys::kill(target, to) {
                            Ok(()) => {
                                tracing::info!(signal = %signals::name(to), %target, "signal forwarded")
                            }
                            Err(e) => {
                                tracing::warn!(signal = %signals::name(to), %target, error = %e, "forwarding failed")
                            }
                        }
                    }
                }
                Incoming::Ignore(_) => {}
            },
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                tracing::warn!(error = %e, "sigtimedwait failed; waiting without forwarding");
                std::thread::sleep(WAIT);
            }
        }
    }
}
