//! The output relay: terraform's pipes to the shim (or, once the shim is gone, to the log). The
//! pipes are read while the shim keeps up, paused while it lags (terraform then blocks on a full
//! pipe, exactly as with a slow reader of a direct run), and drained to the end once terraform
//! exited. The runs say where output goes; this file moves the bytes.

use std::time::Instant;

use nix::errno::Errno;
use nix::sys::epoll::{EpollEvent, EpollFlags};

use super::Init;
use crate::init::action::Action;
use crate::init::token::{self, Stream};
use crate::locks::names::RunId;
use crate::protocol::{self, Kind};

impl Init {
    /// Puts a run's open pipes in the epoll set.
    pub(super) fn watch_pipes(&mut self, id: RunId) {
        for stream in Stream::BOTH {
            if let Some(fd) = self.runs.pipe(id, stream) {
                let ev = EpollEvent::new(EpollFlags::EPOLLIN, token::output(id, stream));
                if let Err(e) = self.epoll.add(fd, ev) {
                    if let Some(held_back) = self.warn.output.allow(Instant::now()) {
                        tracing::warn!(run = %id, error = %e, held_back, "cannot watch terraform's output");
                    }
                }
            }
        }
    }

    /// Stops reading a run's pipes while its shim lags (terraform then blocks on a full pipe,
    /// exactly as with a slow reader of a direct run).
    fn pause(&mut self, id: RunId) {
        if !self.runs.pause(id) {
            return;
        }
        for stream in Stream::BOTH {
            if let Some(fd) = self.runs.pipe(id, stream) {
                let _ = self.epoll.delete(fd);
            }
        }
    }

    /// Resumes reading a paused run's pipes.
    pub(super) fn resume(&mut self, id: RunId) {
        if self.runs.unpause(id) {
            self.watch_pipes(id);
        }
    }

    /// A run's pipe is readable: relays what it holds.
    pub(in crate::init) fn on_output(&mut self, id: RunId, stream: Stream) {
        // Bounded per event so one chatty run cannot starve signals and other runs.
        for _ in 0..16 {
            if !self.runs.reading(id) {
                return;
            }
            let attached = self.runs.conn(id).filter(|c| self.conns.contains(*c));
            // Output waiting for shims is bounded (bounds.rs): how much may be read now.
            let room = attached.map_or(protocol::MAX_DATA, |c| self.conns.room(c));
            if let (Some(c), 0) = (attached, room) {
                self.pause(id);
                // Write what the socket takes now, and watch it for room (EPOLLOUT): that is
                // what resumes the run. Without this a run could stay paused forever.
                let after = self.conns.flush(c, &self.epoll);
                return self.after_conn(after);
            }
            let Some(fd) = self.runs.pipe(id, stream) else {
                return;
            };
            match nix::unistd::read(fd, &mut self.scratch[..room]) {
                Ok(0) => {
                    if attached.is_none() {
                        self.runs.flush_detached(id, stream);
                    }
                    let acts = self.close_pipe(id, stream);
                    return self.apply(acts);
                }
                Ok(n) => {
                    let progress = self.deliver(id, stream, n);
                    self.apply(progress.into_iter().collect());
                }
                Err(Errno::EAGAIN) => break,
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    if let Some(held_back) = self.warn.output.allow(Instant::now()) {
                        tracing::warn!(run = %id, stream = stream.as_str(), error = %e, held_back, "reading terraform's output failed; closing it");
                    }
                    let acts = self.close_pipe(id, stream);
                    return self.apply(acts);
                }
            }
        }
        if let Some(c) = self.runs.conn(id) {
            let after = self.conns.flush(c, &self.epoll);
            self.after_conn(after);
        }
    }

    /// Hands `self.scratch[..n]`, just read from a run's pipe, to the run (its follower, or the
    /// log when no shim is attached) and to its shim; returns the update of the run's record when
    /// its resources in progress changed.
    fn deliver(&mut self, id: RunId, stream: Stream, n: usize) -> Option<Action> {
        let bytes = &self.scratch[..n];
        let attached = self.runs.conn(id).filter(|c| self.conns.contains(*c));
        let progress = self.runs.output(id, stream, bytes, attached.is_some());
        if let Some(c) = attached {
            let kind = match stream {
                Stream::Stdout => Kind::Stdout,
                Stream::Stderr => Kind::Stderr,
            };
            self.conns.queue(c, kind, bytes);
        }
        progress
    }

    /// Reads what is left in both of a run's pipes and closes them (terraform exited a while ago).
    pub(super) fn drain(&mut self, id: RunId) -> Vec<Action> {
        let mut acts = Vec::new();
        for stream in Stream::BOTH {
            self.drain_and_close(id, stream, &mut acts);
        }
        acts
    }

    /// Closes a pipe of a run whose terraform has exited, after reading what is left in it
    /// however far the shim lags: nothing terraform wrote is lost (bounded by the pipe's size,
    /// plus whatever a leftover grandchild writes meanwhile).
    fn drain_and_close(&mut self, id: RunId, stream: Stream, acts: &mut Vec<Action>) {
        for _ in 0..64 {
            let Some(fd) = self.runs.pipe(id, stream) else {
                return;
            };
            match nix::unistd::read(fd, &mut self.scratch) {
                Ok(0) => break,
                Ok(n) => acts.extend(self.deliver(id, stream, n)),
                Err(Errno::EINTR) => continue,
                // EAGAIN: empty, but still held open by a leftover grandchild.
                Err(_) => break,
            }
        }
        self.runs.flush_detached(id, stream);
        acts.extend(self.close_pipe(id, stream));
    }

    /// Closes one of a run's pipes; the run ends once both are closed and terraform was reaped.
    fn close_pipe(&mut self, id: RunId, stream: Stream) -> Vec<Action> {
        let Some((fd, paused)) = self.runs.take_pipe(id, stream) else {
            return Vec::new();
        };
        if !paused {
            let _ = self.epoll.delete(&fd);
        }
        drop(fd);
        self.runs.pipe_closed(id, self.records.book())
    }
}
