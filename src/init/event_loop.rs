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
        loop {
            if let Some(code) = self.finished() {
                self.exit(code);
            }
            let timeout = self.timeout();
            let n = match self.wait(&mut events, timeout) {
                Ok(n) => n,
                Err(Errno::EINTR) => 0,
                Err(e) => {
                    self.wait_failed(e);
                    std::thread::sleep(Duration::from_millis(10));
                    0
                }
            };
            for ev in &events[..n] {
                self.dispatch(ev.data(), ev.events());
            }
            let now = Instant::now();
            self.on_timers(now);
            self.publish(now);
        }
    }

    /// Hands one epoll event to the handler of its source.
    fn dispatch(&mut self, tok: u64, flags: EpollFlags) {
        match token::decode(tok) {
            Source::Signals => self.on_signals(),
            Source::Listener => self.accept_all(),
            Source::Conn(id) => self.on_conn(id, flags),
            Source::Output(id, stream) => self.on_output(id, stream),
            Source::Recorder => self.on_recorder(),
            Source::Reports => self.on_reports(),
            Source::Unknown(t) => tracing::debug!(token = t, "event for an unknown token"),
        }
    }
}
