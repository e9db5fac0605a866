//! The one place that calls waitpid: reaps every child that has changed state, ours or adopted.

use nix::errno::Errno;
use nix::unistd::Pid;

use crate::sys;

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// exit(code).
    Code(i32),
    /// Killed by a signal.
    Signal(i32),
}

impl Exit {
    /// The shell-compatible code: the exit code, or 128+N for death by signal N.
    pub fn code(self) -> i32 {
        match self {
            Exit::Code(c) => c,
            Exit::Signal(s) => 128 + s,
        }
    }

    /// The signal, if it died of one.
    pub fn signal(self) -> Option<i32> {
        match self {
            Exit::Signal(s) => Some(s),
            Exit::Code(_) => None,
        }
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Code(c) => write!(f, "exit code {c}"),
            Exit::Signal(s) => write!(f, "killed by {}", crate::signals::name(*s)),
        }
    }
}

/// Reaps until no child is left in a changed state. Signals coalesce, so one SIGCHLD may stand for
/// many exits: loop until none is ready or ECHILD. Returns the exits seen, and whether any child
/// remains.
pub fn reap_all() -> (Vec<(Pid, Exit)>, bool) {
    let mut exits = Vec::new();
    loop {
        match sys::wait_any_nohang() {
            Ok(None) => return (exits, true),
            Ok(Some((pid, status))) => {
                if libc::WIFEXITED(status) {
                    exits.push((pid, Exit::Code(libc::WEXITSTATUS(status))));
                } else if libc::WIFSIGNALED(status) {
                    exits.push((pid, Exit::Signal(libc::WTERMSIG(status))));
                }
                // Stopped/continued are not requested (no WUNTRACED): nothing to record.
            }
            Err(Errno::EINTR) => continue,
            Err(Errno::ECHILD) => return (exits, false),
            Err(e) => {
                tracing::warn!(error = %e, "waitpid(-1) failed; will retry on the next SIGCHLD");
                return (exits, true);
            }
        }
    }
}
