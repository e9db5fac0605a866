//! The output relay: terraform's pipes read as they fill and framed to the shim, paused while the
//! shim lags (backpressure), drained and closed when terraform is gone; without a shim, logged.

use std::os::fd::AsFd;

use nix::errno::Errno;
use nix::sys::epoll::{EpollEvent, EpollFlags};

use super::conn::HIGH_WATER;
use super::runs::Stream;
use super::state::Init;
use super::token;
use crate::protocol;

impl Init {
    /// Puts a run's open pipes in the epoll set.
    pub(super) fn watch_pipes(&mut self, id: u64) {
        let Some(run) = self.runs.get(&id) else {
            return;
        };
        for stream in [Stream::Stdout, Stream::Stderr] {
            if let Some(fd) = run.pipe(stream) {
                if let Err(e) = self.epoll.add(
                    fd.as_fd(),
                    EpollEvent::new(EpollFlags::EPOLLIN, token::output(id, stream)),
                ) {
                    tracing::warn!(run = %run.job.id, error = %e, "cannot watch terraform's output");
                }
            }
        }
    }

    /// Stops reading a run's pipes while its shim lags (terraform then blocks on a full pipe,
    /// exactly as with a slow reader of a direct run).
    pub(super) fn pause(&mut self, id: u64) {
        let Some(pipes) = self.runs.get_mut(&id).and_then(|r| r.pipes_mut()) else {
            return;
        };
        if pipes.paused {
            return;
        }
        pipes.paused = true;
        for fd in [&pipes.stdout, &pipes.stderr].into_iter().flatten() {
            let _ = self.epoll.delete(fd.as_fd());
        }
    }

    /// Resumes reading a paused run's pipes.
    pub(super) fn resume(&mut self, id: u64) {
        let Some(pipes) = self.runs.get_mut(&id).and_then(|r| r.pipes_mut()) else {
            return;
        };
        if !pipes.paused {
            return;
        }
        pipes.paused = false;
        self.watch_pipes(id);
    }

    /// A run's pipe is readable: relays what it holds.
    pub(super) fn on_output(&mut self, id: u64, stream: Stream) {
        // Bounded per event so one chatty run cannot starve signals and other runs.
        for _ in 0..16 {
            let Some(run) = self.runs.get_mut(&id) else {
                return;
            };
            if run.paused() {
                return;
            }
            let attached = run.job.conn.filter(|c| self.conns.contains_key(c));
            if let Some(c) = attached {
                if self.conns.get(&c).is_some_and(|c| c.queued() >= HIGH_WATER) {
                    self.pause(id);
                    // Write what the socket takes now, and watch it for room (EPOLLOUT): that is
                    // what resumes the run. Without this a run could stay paused forever.
                    self.flush_conn(c);
                    return;
                }
            }
            let Some(fd) = run.pipe(stream) else {
                return;
            };
            match nix::unistd::read(fd, &mut self.scratch) {
                Ok(0) => {
                    if attached.is_none() {
                        run.job.flush_detached(stream);
                    }
                    self.close_pipe(id, stream);
                    return;
                }
                Ok(n) => self.deliver(id, stream, n),
                Err(Errno::EAGAIN) => break,
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    tracing::warn!(run = %run.job.id, stream = stream.as_str(), error = %e, "reading terraform's output failed; closing it");
                    self.close_pipe(id, stream);
                    return;
                }
            }
        }
        if let Some(c) = self.runs.get(&id).and_then(|r| r.job.conn) {
            self.flush_conn(c);
        }
    }

    /// Hands `self.scratch[..n]`, just read from a run's pipe, to the lock-owner follower and to
    /// the shim (or to the log, at debug, when no shim is attached).
    fn deliver(&mut self, id: u64, stream: Stream, n: usize) {
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        let job = &mut run.job;
        let bytes = &self.scratch[..n];
        // Progress goes to the recorder as soon as it is seen (the recorder coalesces while a
        // write of this record is in flight): a resource is on the volume within one write of
        // its `Creating...` line.
        let mut progress = None;
        if let Some(f) = job.follower.as_mut() {
            f.feed(stream as usize, bytes);
            if f.take_changed() {
                progress = self.book.progress(&job.id, f.in_progress());
            }
        }
        match job.conn.and_then(|c| self.conns.get_mut(&c)) {
            Some(conn) => {
                let kind = match stream {
                    Stream::Stdout => protocol::Kind::Stdout,
                    Stream::Stderr => protocol::Kind::Stderr,
                };
                conn.queue_frame(kind, bytes);
            }
            None => job.log_detached(stream, bytes),
        }
        if let Some(p) = progress {
            self.send_to_recorder(p);
        }
    }

    /// Closes a pipe of a run whose terraform has exited, after reading what is left in it
    /// however far the shim lags: nothing terraform wrote is lost (bounded by the pipe's size,
    /// plus whatever a leftover grandchild writes meanwhile).
    pub(super) fn drain_and_close(&mut self, id: u64, stream: Stream) {
        for _ in 0..64 {
            let Some(run) = self.runs.get(&id) else {
                return;
            };
            let Some(fd) = run.pipe(stream) else {
                return;
            };
            match nix::unistd::read(fd, &mut self.scratch) {
                Ok(0) => break,
                Ok(n) => self.deliver(id, stream, n),
                Err(Errno::EINTR) => continue,
                // EAGAIN: empty, but still held open by a leftover grandchild.
                Err(_) => break,
            }
        }
        if let Some(run) = self.runs.get_mut(&id) {
            if run.job.conn.is_none() {
                run.job.flush_detached(stream);
            }
        }
        self.close_pipe(id, stream);
    }

    /// Closes one of a run's pipes; the run ends once both are closed and terraform was reaped.
    fn close_pipe(&mut self, id: u64, stream: Stream) {
        let Some(pipes) = self.runs.get_mut(&id).and_then(|r| r.pipes_mut()) else {
            return;
        };
        if let Some(fd) = pipes.take(stream) {
            if !pipes.paused {
                let _ = self.epoll.delete(fd.as_fd());
            }
        }
        self.maybe_finish(id);
    }
}
