//! The control socket and its clients: accepting them (only the init's own user), reading what
//! they send into their [`Session`]s, and writing what is queued for them without ever blocking
//! the loop. What a client asks, and what the answers say, is the session's and the loop's; this
//! file owns the sockets.

use std::collections::HashMap;
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollEvent, EpollFlags};
use nix::sys::socket::{getsockopt, sockopt};

use super::session::{Input, Session};
use super::token::{self, ConnId};
use crate::locks::names::RunId;
use crate::protocol::{self, ExitNote, Kind, Reply};
use crate::sys::{self, RecvError};

/// Output queued for a shim beyond which terraform's pipes are paused (backpressure).
pub(super) const HIGH_WATER: usize = 1 << 20;

/// What a connection's change means for its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum After {
    /// Nothing.
    Nothing,
    /// It closed while attached: its run is abandoned.
    Detached(RunId),
    /// Its queue fell below half the high-water mark: its run's paused pipes are read again.
    CaughtUp(RunId),
}

/// What one read of a connection gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Read {
    /// Bytes came: take the session's inputs, then read again.
    Data,
    /// Stop reading for now: nothing more is there, or the connection was closed or answered.
    Done(After),
}

/// Why a connection must be closed after a flush.
#[derive(Debug, thiserror::Error)]
enum FlushError {
    /// The peer is gone (or the socket failed).
    #[error("write failed: {0}")]
    Write(io::Error),
    /// EPOLLOUT could not be added to or removed from the interest set: the connection would
    /// stall or spin, so it is closed.
    #[error("epoll_ctl(MOD) of the client socket failed: {0}")]
    Watch(Errno),
}

/// A client connection.
#[derive(Debug)]
struct Conn {
    /// The socket (non-blocking).
    sock: UnixStream,
    session: Session,
    /// Whether EPOLLOUT is in the interest set.
    want_write: bool,
}

/// The control socket's listener and every client connection.
#[derive(Debug)]
pub(super) struct Conns {
    listener: Option<UnixListener>,
    table: HashMap<ConnId, Conn>,
    next: u64,
}

impl Conns {
    /// The clients of `listener` (None: shims cannot use the init).
    pub(super) fn new(listener: Option<UnixListener>) -> Conns {
        Conns {
            listener,
            table: HashMap::new(),
            next: 1,
        }
    }

    /// Whether connection `id` is open.
    pub(super) fn contains(&self, id: ConnId) -> bool {
        self.table.contains_key(&id)
    }

    /// Accepts every pending client. A peer of another uid (not root) is answered with an error and
    /// closed: only the init's own user may start terraform or control the init through it.
    pub(super) fn accept_all(&mut self, epoll: &Epoll) {
        loop {
            let Some(listener) = &self.listener else {
                return;
            };
            let sock = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and friends: log, and retry on the next event rather than spin.
                    tracing::warn!(error = %e, "accept on the control socket failed");
                    return;
                }
            };
            if !own_user(&sock) {
                continue;
            }
            if let Err(e) = sock.set_nonblocking(true) {
                tracing::warn!(error = %e, "cannot make a client socket non-blocking; client dropped");
                continue;
            }
            let id = ConnId::from(self.next);
            self.next += 1;
            let flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP;
            if let Err(e) = epoll.add(sock.as_fd(), EpollEvent::new(flags, token::conn(id))) {
                tracing::warn!(error = %e, "cannot watch a client socket; client dropped");
                continue;
            }
            let conn = Conn {
                sock,
                session: Session::default(),
                want_write: false,
            };
            self.table.insert(id, conn);
        }
    }

    /// Reads once from connection `id` into its session.
    pub(super) fn read(&mut self, id: ConnId, epoll: &Epoll, buf: &mut [u8]) -> Read {
        loop {
            let Some(conn) = self.table.get_mut(&id) else {
                return Read::Done(After::Nothing);
            };
            return match sys::recv_with_fds(conn.sock.as_fd(), buf) {
                Ok((0, _)) => Read::Done(self.close(id, epoll, "peer closed")),
                Ok((n, fds)) => {
                    conn.session.received(&buf[..n], fds);
                    Read::Data
                }
                Err(RecvError::Os(Errno::EAGAIN)) => Read::Done(After::Nothing),
                Err(RecvError::Os(Errno::EINTR)) => continue,
                Err(RecvError::Os(e)) => {
                    Read::Done(self.close(id, epoll, &format!("read failed: {e}")))
                }
                Err(RecvError::TooManyFds) => Read::Done(self.broken(
                    id,
                    epoll,
                    &format!("a message carried more than {} file descriptors (all were closed): the shim passes only its stdin; use the tfinit binary of the init as the shim", sys::MAX_FDS),
                )),
            };
        }
    }

    /// The next whole request or note connection `id` sent.
    pub(super) fn next_input(&mut self, id: ConnId) -> Option<Input> {
        self.table.get_mut(&id)?.session.next_input()
    }

    /// Connection `id`'s request started `run`.
    pub(super) fn attach(&mut self, id: ConnId, run: RunId) {
        if let Some(c) = self.table.get_mut(&id) {
            c.session.attach(run);
        }
    }

    /// Connection `id` broke the protocol: mid-run it is closed (as if the shim were gone);
    /// otherwise it is answered with the problem and read no more.
    pub(super) fn broken(&mut self, id: ConnId, epoll: &Epoll, problem: &str) -> After {
        tracing::warn!(conn = id.number(), problem, "bad client request");
        if self.table.get(&id).and_then(|c| c.session.run()).is_some() {
            return self.close(id, epoll, problem);
        }
        let note = ExitNote {
            code: protocol::EXIT_INIT_ERROR,
            error: Some(format!("tfinit: {problem}")),
            ..Default::default()
        };
        let after = self.answer(id, epoll, &note);
        let Some(c) = self.table.get_mut(&id) else {
            return after;
        };
        // Read nothing more from it: only EPOLLOUT stays in the interest set.
        let mut out = EpollEvent::new(EpollFlags::EPOLLOUT, token::conn(id));
        match epoll.modify(c.sock.as_fd(), &mut out) {
            Ok(()) => {
                c.want_write = true;
                after
            }
            Err(e) => {
                tracing::warn!(conn = id.number(), error = %e, "cannot stop reading a client socket; closing it");
                self.close(id, epoll, &e.to_string())
            }
        }
    }

    /// Sends connection `id` its exit note (of its run, or of a refused or failed request); it
    /// closes once that is written.
    pub(super) fn answer(&mut self, id: ConnId, epoll: &Epoll, note: &ExitNote) -> After {
        let Some(c) = self.table.get_mut(&id) else {
            return After::Nothing;
        };
        c.session.answer(Kind::Exit, note);
        self.flush(id, epoll)
    }

    /// Sends connection `id` the reply to its control request; it closes once that is written.
    pub(super) fn reply(&mut self, id: ConnId, epoll: &Epoll, reply: &Reply) -> After {
        let Some(c) = self.table.get_mut(&id) else {
            return After::Nothing;
        };
        c.session.answer(Kind::Reply, reply);
        self.flush(id, epoll)
    }

    /// Whether connection `id` has so much queued that its run's output must wait.
    pub(super) fn is_full(&self, id: ConnId) -> bool {
        self.table
            .get(&id)
            .is_some_and(|c| c.session.queued() >= HIGH_WATER)
    }

    /// Queues a frame of terraform's output for connection `id`.
    pub(super) fn queue(&mut self, id: ConnId, kind: Kind, bytes: &[u8]) {
        if let Some(c) = self.table.get_mut(&id) {
            c.session.queue_frame(kind, bytes);
        }
    }

    /// Writes what connection `id` has queued and keeps EPOLLOUT in its interest set exactly
    /// while something is left; closes it once its answer is written, or when writing fails.
    pub(super) fn flush(&mut self, id: ConnId, epoll: &Epoll) -> After {
        let Some(conn) = self.table.get_mut(&id) else {
            return After::Nothing;
        };
        let queued = match conn.flush(id, epoll) {
            Ok(q) => q,
            Err(e) => {
                if let FlushError::Watch(_) = e {
                    tracing::warn!(conn = id.number(), error = %e, "cannot change what is watched on a client socket; closing it");
                }
                return self.close(id, epoll, &e.to_string());
            }
        };
        if queued == 0 && conn.session.closing() {
            return self.close(id, epoll, "done");
        }
        match conn.session.run() {
            Some(run) if queued < HIGH_WATER / 2 => After::CaughtUp(run),
            _ => After::Nothing,
        }
    }

    /// At exit: one last non-blocking attempt to deliver what is queued (exit codes) to shims.
    pub(super) fn write_all_now(&mut self) {
        for conn in self.table.values_mut() {
            let _ = conn.write_some();
        }
    }

    fn close(&mut self, id: ConnId, epoll: &Epoll, why: &str) -> After {
        let Some(conn) = self.table.remove(&id) else {
            return After::Nothing;
        };
        let _ = epoll.delete(conn.sock.as_fd());
        tracing::debug!(conn = id.number(), why, "client connection closed");
        conn.session.run().map_or(After::Nothing, After::Detached)
    }
}

impl Conn {
    /// Writes what it can; Err only for a dead peer.
    fn write_some(&mut self) -> io::Result<()> {
        while self.session.queued() > 0 {
            match (&self.sock).write(self.session.unwritten()) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.session.wrote(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Writes what it can and keeps EPOLLOUT in the interest set exactly while something is
    /// queued. Returns the bytes still queued.
    fn flush(&mut self, id: ConnId, epoll: &Epoll) -> Result<usize, FlushError> {
        self.write_some().map_err(FlushError::Write)?;
        let queued = self.session.queued();
        let want = queued > 0;
        if want != self.want_write {
            let mut flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP;
            if want {
                flags |= EpollFlags::EPOLLOUT;
            }
            epoll
                .modify(
                    self.sock.as_fd(),
                    &mut EpollEvent::new(flags, token::conn(id)),
                )
                .map_err(FlushError::Watch)?;
            self.want_write = want;
        }
        Ok(queued)
    }
}

/// Whether the peer of `sock` runs as the init's user (or root); any other is answered with an
/// error, and dropped.
fn own_user(sock: &UnixStream) -> bool {
    let me = nix::unistd::geteuid().as_raw();
    match getsockopt(sock, sockopt::PeerCredentials) {
        Ok(cred) if cred.uid() == me || cred.uid() == 0 => true,
        Ok(cred) => {
            tracing::warn!(
                peer_uid = cred.uid(),
                peer_pid = cred.pid(),
                init_uid = me,
                "refused a client of another uid"
            );
            let note = ExitNote {
                code: protocol::EXIT_INIT_ERROR,
                error: Some(format!(
                    "tfinit: refused: this client runs as uid {} but the init runs as uid {me}; only the init's own user (or root) may start terraform or control the init (status, drain, cancel) through it",
                    cred.uid()
                )),
                ..Default::default()
            };
            let mut buf = Vec::new();
            protocol::encode_json(Kind::Exit, &note, &mut buf);
            let _ = sock.set_nonblocking(true);
            let _ = (&*sock).write(&buf);
            false
        }
        Err(e) => {
            tracing::warn!(error = %e, "SO_PEERCRED failed; client refused");
            false
        }
    }
}
