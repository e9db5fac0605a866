//! One client connection of the control socket: its socket, the frames decoded from it, and the
//! frames queued for it, written without ever blocking the loop.

use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

use nix::sys::epoll::{Epoll, EpollEvent, EpollFlags};

use super::token;
use crate::protocol::{self, Decoder, Kind};

/// Output queued for a shim beyond which terraform's pipes are paused (backpressure).
pub const HIGH_WATER: usize = 1 << 20;

/// Why a connection must be closed after a flush.
#[derive(Debug, thiserror::Error)]
pub enum FlushError {
    /// The peer is gone (or the socket failed).
    #[error("write failed: {0}")]
    Write(io::Error),
    /// EPOLLOUT could not be added to or removed from the interest set: the connection would
    /// stall or spin, so it is closed.
    #[error("epoll_ctl(MOD) of the client socket failed: {0}")]
    Watch(nix::errno::Errno),
}

/// A client connection.
#[derive(Debug)]
pub struct Conn {
    /// Its id (its epoll token says which connection an event is for).
    pub id: u64,
    /// The socket (non-blocking).
    pub sock: UnixStream,
    /// Frames received and not yet whole.
    pub decoder: Decoder,
    out: Vec<u8>,
    sent: usize,
    /// The run this connection asked for.
    pub run: Option<u64>,
    /// A file descriptor passed with the request (the shim's stdin).
    pub stdin: Option<OwnedFd>,
    /// Whether the request was handled (any later request is a protocol error).
    pub requested: bool,
    /// Close once everything queued is written.
    pub closing: bool,
    /// Whether EPOLLOUT is in the interest set.
    want_write: bool,
}

impl Conn {
    /// A new connection on a non-blocking socket (already in the epoll set for reading).
    pub fn new(id: u64, sock: UnixStream) -> Conn {
        Conn {
            id,
            sock,
            decoder: Decoder::default(),
            out: Vec::new(),
            sent: 0,
            run: None,
            stdin: None,
            requested: false,
            closing: false,
            want_write: false,
        }
    }

    /// Bytes queued and not yet written.
    pub fn queued(&self) -> usize {
        self.out.len() - self.sent
    }

    /// Queues one frame.
    pub fn queue_frame(&mut self, kind: Kind, payload: &[u8]) {
        if self.sent > 0 && self.sent == self.out.len() {
            self.out.clear();
            self.sent = 0;
        }
        protocol::encode(kind, payload, &mut self.out);
    }

    /// Queues one frame with a JSON payload.
    pub fn queue_json<T: serde::Serialize>(&mut self, kind: Kind, v: &T) {
        let body = serde_json::to_vec(v).unwrap_or_else(|_| b"{}".to_vec());
        self.queue_frame(kind, &body);
    }

    /// Writes what it can; Err only for a dead peer.
    pub fn write_some(&mut self) -> io::Result<()> {
        while self.sent < self.out.len() {
            match (&self.sock).write(&self.out[self.sent..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        if self.sent == self.out.len() {
            self.out.clear();
            self.sent = 0;
        } else if self.sent >= (64 << 10) && self.sent * 2 >= self.out.len() {
            // Reclaim the written prefix once it is as large as what is left: under a steady
            // stream the buffer never empties, and would otherwise grow far past the high-water
            // mark. Each byte is moved at most once on average.
            self.out.drain(..self.sent);
            self.sent = 0;
        }
        Ok(())
    }

    /// Writes what it can and keeps EPOLLOUT in the interest set exactly while something is
    /// queued. Returns the bytes still queued; Err means the connection must be closed.
    pub fn flush(&mut self, epoll: &Epoll) -> Result<usize, FlushError> {
        self.write_some().map_err(FlushError::Write)?;
        let queued = self.queued();
        let want = queued > 0;
        if want != self.want_write {
            let mut flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP;
            if want {
                flags |= EpollFlags::EPOLLOUT;
            }
            epoll
                .modify(
                    self.sock.as_fd(),
                    &mut EpollEvent::new(flags, token::conn(self.id)),
                )
                .map_err(FlushError::Watch)?;
            self.want_write = want;
        }
        Ok(queued)
    }

    /// Reads nothing more from the peer: only EPOLLOUT stays in the interest set.
    pub fn stop_reading(&mut self, epoll: &Epoll) -> Result<(), FlushError> {
        epoll
            .modify(
                self.sock.as_fd(),
                &mut EpollEvent::new(EpollFlags::EPOLLOUT, token::conn(self.id)),
            )
            .map_err(FlushError::Watch)?;
        self.want_write = true;
        Ok(())
    }
}
