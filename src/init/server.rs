//! The control socket: accepting clients, checking who they are, decoding their requests, and
//! writing frames back without ever blocking the loop.

use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

use nix::errno::Errno;
use nix::sys::epoll::{EpollEvent, EpollFlags};
use nix::sys::socket::{getsockopt, sockopt};
use nix::unistd::Pid;

use super::event_loop::{Init, HIGH_WATER};
use crate::locks::Locks;
use crate::protocol::{
    self, Decoder, Envelope, ExitNote, Kind, Reply, Request, RunRequest, SignalNote,
};

const KIND_CONN: u64 = 1;

/// A client connection.
#[derive(Debug)]
pub struct Conn {
    sock: UnixStream,
    decoder: Decoder,
    out: Vec<u8>,
    sent: usize,
    /// The run this connection asked for.
    pub run: Option<u64>,
    /// A file descriptor passed with the request (the shim's stdin).
    stdin: Option<OwnedFd>,
    /// Whether the request was handled (any later request is a protocol error).
    requested: bool,
    /// Close once everything queued is written.
    closing: bool,
    /// Whether EPOLLOUT is in the interest set.
    want_write: bool,
}

impl Conn {
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

    fn queue_json<T: serde::Serialize>(&mut self, kind: Kind, v: &T) {
        let body = serde_json::to_vec(v).unwrap_or_else(|_| b"{}".to_vec());
        self.queue_frame(kind, &body);
    }

    /// Writes what it can; Err only for a dead peer.
    fn write_some(&mut self) -> io::Result<()> {
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
}

fn conn_token(id: u64) -> u64 {
    (id << 8) | KIND_CONN
}

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
                .add(sock.as_fd(), EpollEvent::new(flags, conn_token(id)))
            {
                tracing::warn!(error = %e, "cannot watch a client socket; client dropped");
                continue;
            }
            self.conns.insert(
                id,
                Conn {
                    sock,
                    decoder: Decoder::default(),
                    out: Vec::new(),
                    sent: 0,
                    run: None,
                    stdin: None,
                    requested: false,
                    closing: false,
                    want_write: false,
                },
            );
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
            match crate::sys::recv_with_fds(conn.sock.as_fd(), &mut buf) {
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
                Err(Errno::EAGAIN) => return,
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    self.close_conn(id, &format!("read failed: {e}"));
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
            let _ = self.epoll.modify(
                c.sock.as_fd(),
                &mut EpollEvent::new(EpollFlags::EPOLLOUT, conn_token(id)),
            );
            c.want_write = true;
        }
    }

    /// Writes queued frames; resumes a paused run when its shim caught up; closes when done.
    pub(super) fn flush_conn(&mut self, id: u64) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if let Err(e) = conn.write_some() {
            self.close_conn(id, &format!("write failed: {e}"));
            return;
        }
        let queued = conn.queued();
        if queued == 0 && conn.closing {
            self.close_conn(id, "done");
            return;
        }
        let want = queued > 0;
        if want != conn.want_write {
            conn.want_write = want;
            let mut flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP;
            if want {
                flags |= EpollFlags::EPOLLOUT;
            }
            let _ = self.epoll.modify(
                conn.sock.as_fd(),
                &mut EpollEvent::new(flags, conn_token(id)),
            );
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

    /// On exit: one last non-blocking attempt to deliver queued frames (exit codes) to shims.
    pub(super) fn flush_all_best_effort(&mut self) {
        for conn in self.conns.values_mut() {
            let _ = conn.write_some();
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

/// Starts the lock-recovery helper for `workdir` (this binary, hidden subcommand), with the run's
/// environment (backend credentials) and working directory, in its own process group.
pub fn spawn_recovery(req: &RunRequest, locks: &Locks, workdir: &Path) -> io::Result<Pid> {
    let store = locks
        .store
        .as_ref()
        .ok_or_else(|| io::Error::other("no state directory"))?;
    let owner_json = serde_json::to_string(&locks.owner).map_err(io::Error::other)?;
    let mut cmd = std::process::Command::new("/proc/self/exe");
    std::os::unix::process::CommandExt::arg0(&mut cmd, "tfinit");
    cmd.arg(crate::locks::recover::HIDDEN_SUBCOMMAND)
        .arg("--workdir")
        .arg(workdir)
        .arg("--terraform")
        .arg(&req.program)
        .arg("--state-dir")
        .arg(store.dir())
        .arg("--owner-json")
        .arg(owner_json)
        .arg("--ttl-ms")
        .arg(locks.ttl.as_millis().to_string())
        .current_dir(&req.cwd)
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::inherit())
        .stderr(std::process::Stdio::inherit());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    crate::sys::child_defaults(&mut cmd);
    super::spawn::set_env(&mut cmd, &req.env);
    // Its logs go to the container log in the init's format.
    for k in ["TFINIT_LOG", "TFINIT_LOG_FORMAT"] {
        if let Some(v) = std::env::var_os(k) {
            cmd.env(k, v);
        }
    }
    let child = cmd.spawn()?;
    Ok(Pid::from_raw(child.id() as i32))
}
