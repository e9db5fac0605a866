//! The control socket: accepting clients, checking who they are, decoding their requests, and
//! writing frames back without ever blocking the loop.

use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::sys::epoll::{EpollEvent, EpollFlags};
use nix::sys::socket::{getsockopt, sockopt};

use super::conn::{Conn, FlushError, HIGH_WATER};
use super::state::Init;
use super::token;
use crate::protocol::{self, Envelope, ExitNote, Kind, Reply, Request, RunRequest, SignalNote};
use crate::sys::{self, RecvError};

impl Init {
    /// Accepts every pending client. A peer of another uid (not root) is answered with an error and
    /// closed: only the init's own user may start terraform through it.
    pub(super) fn accept_all(&mut self) {
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
            let me = nix::unistd::geteuid().as_raw();
            match getsockopt(&sock, sockopt::PeerCredentials) {
                Ok(cred) if cred.uid() == me || cred.uid() == 0 => {}
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
                            "tfinit: refused: this client runs as uid {} but the init runs as uid {me}; only the init's own user (or root) may start terraform through it",
                            cred.uid()
                        )),
                        ..Default::default()
                    };
                    let mut buf = Vec::new();
                    protocol::encode_json(Kind::Exit, &note, &mut buf);
                    let _ = sock.set_nonblocking(true);
                    let _ = (&sock).write(&buf);
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "SO_PEERCRED failed; client refused");
                    continue;
                }
            }
            if let Err(e) = sock.set_nonblocking(true) {
                tracing::warn!(error = %e, "cannot make a client socket non-blocking; client dropped");
                continue;
            }
            let id = self.next_id;
            self.next_id += 1;
            let flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP;
            if let Err(e) = self
                .epoll
                .add(sock.as_fd(), EpollEvent::new(flags, token::conn(id)))
            {
                tracing::warn!(error = %e, "cannot watch a client socket; client dropped");
                continue;
            }
            self.conns.insert(id, Conn::new(id, sock));
        }
    }

    /// A client socket is readable, writable or hung up.
    pub(super) fn on_conn(&mut self, id: u64, flags: EpollFlags) {
        if flags.contains(EpollFlags::EPOLLOUT) {
            self.flush_conn(id);
        }
        if flags.intersects(
            EpollFlags::EPOLLIN
                | EpollFlags::EPOLLHUP
                | EpollFlags::EPOLLRDHUP
                | EpollFlags::EPOLLERR,
        ) {
            self.read_conn(id);
        }
    }

    fn read_conn(&mut self, id: u64) {
        let mut buf = [0u8; 16 << 10];
        // Bounded per event: a peer streaming garbage cannot hold the loop.
        for _ in 0..64 {
            let Some(conn) = self.conns.get_mut(&id) else {
                return;
            };
            match sys::recv_with_fds(conn.sock.as_fd(), &mut buf) {
                Ok((0, _)) => {
                    self.close_conn(id, "peer closed");
                    return;
                }
                Ok((n, fds)) => {
                    for fd in fds {
                        if conn.stdin.is_none() && !conn.requested {
                            conn.stdin = Some(fd);
                        }
                        // Any other descriptor is dropped (closed) here.
                    }
                    conn.decoder.push(&buf[..n]);
                    if !self.process_frames(id) {
                        return;
                    }
                }
                Err(RecvError::Os(Errno::EAGAIN)) => return,
                Err(RecvError::Os(Errno::EINTR)) => continue,
                Err(RecvError::Os(e)) => {
                    self.close_conn(id, &format!("read failed: {e}"));
                    return;
                }
                Err(RecvError::TooManyFds) => {
                    self.protocol_error(
                        id,
                        &format!("a message carried more than {} file descriptors (all were closed): the shim passes only its stdin; use the tfinit binary of the init as the shim", sys::MAX_FDS),
                    );
                    return;
                }
            }
        }
    }

    /// Handles every whole frame received; false when the connection was closed.
    fn process_frames(&mut self, id: u64) -> bool {
        loop {
            let Some(conn) = self.conns.get_mut(&id) else {
                return false;
            };
            let frame = match conn.decoder.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => return true,
                Err(e) => {
                    self.protocol_error(id, &e.to_string());
                    return false;
                }
            };
            match frame.kind {
                Kind::Request if !conn.requested => {
                    conn.requested = true;
                    let stdin = conn.stdin.take();
                    match serde_json::from_slice::<Envelope>(&frame.payload) {
                        Ok(env) if env.v != protocol::VERSION => {
                            self.protocol_error(
                                id,
                                &format!("protocol version {} is not supported (this init speaks {}): use the tfinit binary of the init as the shim", env.v, protocol::VERSION),
                            );
                            return false;
                        }
                        Ok(env) => self.handle_request(id, env.request, stdin),
                        Err(e) => {
                            self.protocol_error(id, &format!("malformed request: {e}"));
                            return false;
                        }
                    }
                }
                Kind::Signal if conn.run.is_some() => {
                    let run = conn.run;
                    match serde_json::from_slice::<SignalNote>(&frame.payload) {
                        Ok(n) => {
                            if let Some(r) = run {
                                self.on_shim_signal(r, n.signal);
                            }
                        }
                        Err(e) => {
                            tracing::debug!(conn = id, error = %e, "malformed signal note ignored")
                        }
                    }
                }
                other => {
                    self.protocol_error(id, &format!("unexpected {other:?} frame"));
                    return false;
                }
            }
        }
    }

    fn handle_request(&mut self, id: u64, req: Request, stdin: Option<OwnedFd>) {
        match req {
            Request::Run(r) => match validate_run(&r) {
                Ok(()) => self.start_run(id, r, stdin),
                Err(problem) => self.protocol_error(id, &problem),
            },
            Request::Status => self.reply(id, true, None),
            Request::Drain => {
                if self.timeline.drain() {
                    tracing::info!(
                        phase = "draining",
                        runs = self.runs.len(),
                        "draining: new terraform runs are refused until `tfinit resume`"
                    );
                    self.refuse_waiting();
                }
                self.reply(id, true, None);
            }
            Request::Resume => {
                let ok = self.timeline.resume();
                if ok {
                    tracing::info!(
                        phase = "running",
                        "resumed: terraform runs are accepted again"
                    );
                }
                let phase = self.timeline.phase();
                let err = (!ok && phase.as_str() != "running")
                    .then(|| format!("cannot resume: the init is {}", phase.as_str()));
                self.reply(id, err.is_none(), err);
            }
        }
    }

    fn reply(&mut self, id: u64, ok: bool, error: Option<String>) {
        // The heartbeat's age as of the recorder's latest (quiet) news.
        self.on_recorder();
        let status = self.status();
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        conn.queue_json(
            Kind::Reply,
            &Reply {
                v: protocol::VERSION,
                ok,
                error,
                status: Some(status),
            },
        );
        conn.closing = true;
        self.flush_conn(id);
    }

    /// Sends the exit note of a run (or of a refused request) and closes after it.
    pub(super) fn reply_exit(&mut self, id: u64, note: ExitNote) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        conn.queue_json(Kind::Exit, &note);
        conn.closing = true;
        conn.run = None;
        self.flush_conn(id);
    }

    fn protocol_error(&mut self, id: u64, problem: &str) {
        tracing::warn!(conn = id, problem, "bad client request");
        if let Some(run) = self.conns.get(&id).and_then(|c| c.run) {
            // A protocol error mid-run: treat the shim as gone.
            self.close_conn(id, problem);
            let _ = run;
            return;
        }
        self.reply_exit(
            id,
            ExitNote {
                code: protocol::EXIT_INIT_ERROR,
                error: Some(format!("tfinit: {problem}")),
                ..Default::default()
            },
        );
        if let Some(c) = self.conns.get_mut(&id) {
            // Read nothing more from it.
            if let Err(e) = c.stop_reading(&self.epoll) {
                tracing::warn!(conn = id, error = %e, "cannot stop reading a client socket; closing it");
                self.close_conn(id, &e.to_string());
            }
        }
    }

    /// Writes queued frames; resumes a paused run when its shim caught up; closes when done.
    pub(super) fn flush_conn(&mut self, id: u64) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        let queued = match conn.flush(&self.epoll) {
            Ok(q) => q,
            Err(e) => {
                if let FlushError::Watch(_) = e {
                    tracing::warn!(conn = id, error = %e, "cannot change what is watched on a client socket; closing it");
                }
                self.close_conn(id, &e.to_string());
                return;
            }
        };
        if queued == 0 && conn.closing {
            self.close_conn(id, "done");
            return;
        }
        if queued < HIGH_WATER / 2 {
            if let Some(run) = conn.run {
                self.resume(run);
            }
        }
    }

    fn close_conn(&mut self, id: u64, why: &str) {
        let Some(conn) = self.conns.remove(&id) else {
            return;
        };
        let _ = self.epoll.delete(conn.sock.as_fd());
        tracing::debug!(conn = id, why, "client connection closed");
        if let Some(run) = conn.run {
            self.detach(run);
        }
    }
}

fn validate_run(r: &RunRequest) -> Result<(), String> {
    if !Path::new(&r.program).is_absolute() {
        return Err(format!("program {:?} is not an absolute path", r.program));
    }
    if !Path::new(&r.cwd).is_absolute() {
        return Err(format!("cwd {:?} is not an absolute path", r.cwd));
    }
    if r.argv0.is_empty() {
        return Err("argv0 is empty".into());
    }
    Ok(())
}
