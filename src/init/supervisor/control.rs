//! The control socket's clients: accepting them, reading what they send, and handing each whole
//! request to whom it concerns: a shim's run request and its forwarded signals to the runs,
//! `tfinit status`, `drain`, `resume`, `metrics` and `cancel` answered here (conns.rs owns the
//! sockets, session.rs the conversation).

use std::time::Instant;

use nix::sys::epoll::EpollFlags;

use super::Init;
use crate::init::action::Force;
use crate::init::bounds;
use crate::init::conns::Read;
use crate::init::runs::CancelTarget;
use crate::init::session::{Control, Input};
use crate::init::shutdown::Phase;
use crate::init::status;
use crate::init::token::ConnId;
use crate::protocol::{self, Reply};

impl Init {
    /// Accepts every pending client.
    pub(in crate::init) fn accept_all(&mut self) {
        self.conns.accept_all(&self.epoll);
    }

    /// A client socket is readable, writable or hung up.
    pub(in crate::init) fn on_conn(&mut self, id: ConnId, flags: EpollFlags) {
        if flags.contains(EpollFlags::EPOLLOUT) {
            let after = self.conns.flush(id, &self.epoll);
            self.after_conn(after);
        }
        let readable = EpollFlags::EPOLLIN
            | EpollFlags::EPOLLHUP
            | EpollFlags::EPOLLRDHUP
            | EpollFlags::EPOLLERR;
        if !flags.intersects(readable) {
            return;
        }
        let mut buf = [0u8; bounds::READ_CHUNK];
        // Bounded per event: a peer streaming garbage cannot hold the loop.
        for _ in 0..bounds::READ_PER_EVENT / bounds::READ_CHUNK {
            match self.conns.read(id, &self.epoll, &mut buf) {
                Read::Data => {
                    if !self.take_inputs(id) {
                        return;
                    }
                }
                Read::Done(after) => {
                    self.after_conn(after);
                    break;
                }
            }
        }
        // What it has not finished sending must fit in what the init gives unfinished requests.
        let after = self.conns.after_reads(id, &self.epoll);
        self.after_conn(after);
    }

    /// Handles every whole request or note the client sent; false when it must not be read on.
    fn take_inputs(&mut self, id: ConnId) -> bool {
        while let Some(input) = self.conns.next_input(id) {
            match input {
                Input::Run { request, stdin } => {
                    // The latest table first: the run's lock check is decided on it.
                    let now = Instant::now();
                    self.take_news();
                    let phase = self.timeline.phase();
                    let book = self.records.book();
                    let acts = self.runs.request(id, request, stdin, phase, book, now);
                    self.apply(acts);
                }
                Input::Control(c) => self.on_control(id, c),
                Input::Signal { run, signo } => {
                    let stopping = self.timeline.phase() == Phase::Stopping;
                    let acts = self.runs.shim_signal(run, signo, stopping);
                    self.apply(acts);
                }
                Input::Broken(problem) => {
                    let after = self.conns.broken(id, &self.epoll, &problem);
                    self.after_conn(after);
                    return false;
                }
                Input::Busy(problem) => {
                    let after = self.conns.no_room(id, &self.epoll, &problem);
                    self.after_conn(after);
                    return false;
                }
            }
        }
        self.conns.contains(id)
    }

    /// `tfinit status`, `drain` or `resume`: done, and answered with the status document;
    /// `tfinit metrics`: answered with the metrics text (what a scrape reads); `tfinit cancel`:
    /// done, and answered with what was done to each run, or why nothing was.
    fn on_control(&mut self, id: ConnId, control: Control) {
        let mut cancelled = Vec::new();
        let error = match control {
            Control::Metrics => return self.reply_metrics(id),
            Control::Status => None,
            Control::Drain => {
                self.drain_runs();
                None
            }
            Control::Resume => self.resume_runs(),
            Control::Cancel { target, force } => match self.cancel(&target, force) {
                Ok(lines) => {
                    cancelled = lines;
                    None
                }
                Err(e) => Some(e),
            },
        };
        self.reply_status(id, error, cancelled);
    }

    /// `tfinit drain`: new runs are refused, and so are the runs that wait to start.
    fn drain_runs(&mut self) {
        if !self.timeline.drain() {
            return;
        }
        tracing::info!(
            phase = Phase::Draining.as_str(),
            runs = self.runs.len(),
            "draining: new terraform runs are refused until `tfinit resume`"
        );
        if let Some(why) = self.timeline.refusal() {
            let refused = self.runs.refuse_waiting(why);
            self.apply(refused);
        }
    }

    /// `tfinit resume`: runs are accepted again; the error when the init is not draining.
    fn resume_runs(&mut self) -> Option<String> {
        let resumed = self.timeline.resume();
        if resumed {
            tracing::info!(
                phase = Phase::Running.as_str(),
                "resumed: terraform runs are accepted again"
            );
        }
        let phase = self.timeline.phase();
        (!resumed && phase != Phase::Running)
            .then(|| format!("cannot resume: the init is {}", phase.as_str()))
    }

    /// `tfinit cancel`: refused while stopping (the timeline stops every run itself, on its
    /// schedule: a cancel would only second-guess it); otherwise the runs do it.
    fn cancel(&mut self, target: &CancelTarget, force: Force) -> Result<Vec<String>, String> {
        if self.timeline.phase() == Phase::Stopping {
            let left = self.timeline.seconds_left(Instant::now()).unwrap_or(0.0);
            return Err(format!(
                "cannot cancel: the init is shutting down and stops every run itself (its graceful SIGTERM TFINIT_STOP_TIMEOUT before the deadline, SIGKILL TFINIT_KILL_MARGIN before it; {left:.0}s left); nothing was sent"
            ));
        }
        let (acts, done) = self.runs.cancel(target, force, Instant::now())?;
        self.apply(acts);
        Ok(done)
    }

    /// Answers `tfinit metrics` with the metrics text, as a scrape would read it now.
    fn reply_metrics(&mut self, id: ConnId) {
        let now = Instant::now();
        self.take_news();
        self.publish(now);
        let reply = Reply {
            v: protocol::VERSION,
            ok: true,
            error: None,
            status: None,
            metrics: Some(self.metrics.render()),
            cancelled: Vec::new(),
        };
        let after = self.conns.reply(id, &self.epoll, &reply);
        self.after_conn(after);
    }

    /// Answers a control request with the status document (and `error`, or what a cancel did).
    fn reply_status(&mut self, id: ConnId, error: Option<String>, cancelled: Vec<String>) {
        // The heartbeat's age as of the recorder's latest (quiet) news.
        let now = Instant::now();
        self.take_news();
        let view = self.records.book().view(now);
        let document = status::document(&self.timeline, &self.children, &view, &self.runs, now);
        let reply = Reply {
            v: protocol::VERSION,
            ok: error.is_none(),
            error,
            status: Some(document),
            metrics: None,
            cancelled,
        };
        let after = self.conns.reply(id, &self.epoll, &reply);
        self.after_conn(after);
    }
}
