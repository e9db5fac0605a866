//! The control socket and its clients: accepting them (only the init's own user), reading what
//! they send into their [`Session`]s, and writing what is queued for them without ever blocking
//! the loop. What a client asks, and what the answers say, is the session's and the loop's; this
//! file owns the sockets, and holds every client to the bounds of bounds.rs: how many are open,
//! how long a request may take, and the bytes all of them together make the init hold.

use std::collections::HashMap;
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::Instant;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::epoll::{Epoll, EpollEvent, EpollFlags};
use nix::sys::socket::{getsockopt, sockopt};

use super::action::Action;
use super::bounds::{
    ACCEPT_RETRY, HELD_BUDGET, HIGH_WATER, MAX_CONNECTIONS, OUTPUT_BUDGET, OVER_BUDGET_READ,
    REQUEST_DEADLINE, UNFINISHED_BUDGET,
};
use super::session::{Input, Session};
use super::token::{self, ConnId};
use crate::duration::fmt_duration;
use crate::locks::names::RunId;
use crate::metrics::{Dropped, Listener, Metrics, Pause};
use crate::protocol::{self, ExitNote, Kind, Reply};
use crate::sys::{self, RecvError};
use crate::throttle::Throttle;

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

impl After {
    /// What the loop does about it: a detached run is abandoned, a run that caught up is read
    /// again.
    pub(super) fn action(self) -> Option<Action> {
        match self {
            After::Nothing => None,
            After::Detached(run) => Some(Action::Detach(run)),
            After::CaughtUp(run) => Some(Action::Resume(run)),
        }
    }
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

/// Clients accepted per event of the listener.
const ACCEPTS_PER_EVENT: usize = 64;

/// Whether the listener is in the epoll set, and why not. Out of it, clients wait in the
/// kernel's listen queue: the loop neither spins on a listener it cannot serve nor drops them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Accepting {
    /// In it: every pending client is accepted.
    Yes,
    /// Out of it: [`MAX_CONNECTIONS`] are open; back in when one closes.
    Full,
    /// Out of it: accept(2) failed (out of descriptors, most often); back in when a connection
    /// closes (a descriptor is free) or at `retry`.
    Failed {
        /// When accepting is tried again.
        retry: Instant,
    },
}

/// A time during which clients waited in the listen queue: from the first pause until the queue
/// was found empty. One warning when it begins, one line when it ends, one count in the metrics:
/// a pause that repeats (a descriptor frees, one client is accepted, the next fails) stays one.
#[derive(Debug, Clone, Copy)]
struct Waiting {
    /// When the first pause began.
    since: Instant,
    /// accept(2) calls that failed meanwhile.
    failures: u64,
}

/// The control socket's listening side.
#[derive(Debug)]
struct Listening {
    sock: UnixListener,
    accepting: Accepting,
    /// While clients wait in the listen queue.
    waiting: Option<Waiting>,
}

/// What the sessions hold together (bounds.rs), kept in step by [`Conns::with`] and
/// [`Conns::close`]: the bounds are checked against these, never by a walk over every client.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Totals {
    /// Bytes of frames not whole yet.
    unfinished: usize,
    /// What the requests of runs not started yet cost.
    held: usize,
    /// Output queued for shims.
    queued: usize,
}

impl Totals {
    fn of(s: &Session) -> Totals {
        Totals {
            unfinished: s.unfinished(),
            held: s.held(),
            queued: s.queued(),
        }
    }

    fn add(&mut self, t: Totals) {
        self.unfinished += t.unfinished;
        self.held += t.held;
        self.queued += t.queued;
    }

    fn sub(&mut self, t: Totals) {
        self.unfinished = self.unfinished.saturating_sub(t.unfinished);
        self.held = self.held.saturating_sub(t.held);
        self.queued = self.queued.saturating_sub(t.queued);
    }
}

/// The repeated warnings about clients, each rate-limited: a client can repeat its problem as
/// fast as it connects.
#[derive(Debug, Clone)]
struct Warnings {
    /// A client broke the protocol.
    bad_request: Throttle,
    /// A client of another uid.
    other_uid: Throttle,
    /// A client too slow to send its request.
    too_slow: Throttle,
    /// A client whose request did not fit in memory.
    no_room: Throttle,
    /// The listener paused (a new wait began).
    paused: Throttle,
    /// A socket call about one client failed (SO_PEERCRED, O_NONBLOCK, epoll_ctl).
    socket: Throttle,
}

impl Default for Warnings {
    fn default() -> Self {
        Warnings {
            bad_request: Throttle::per_minute(),
            other_uid: Throttle::per_minute(),
            too_slow: Throttle::per_minute(),
            no_room: Throttle::per_minute(),
            paused: Throttle::per_minute(),
            socket: Throttle::per_minute(),
        }
    }
}

/// The control socket's listener and every client connection.
#[derive(Debug)]
pub(super) struct Conns {
    listener: Option<Listening>,
    table: HashMap<ConnId, Conn>,
    next: u64,
    /// The largest frame a client may send (protocol::request_limit).
    frame_limit: usize,
    totals: Totals,
    warn: Warnings,
    metrics: Arc<Metrics>,
}

impl Conns {
    /// The clients of `listener` (None: shims cannot use the init), whose frames may be
    /// `frame_limit` bytes; what they cost is counted in `metrics`.
    pub(super) fn new(
        listener: Option<UnixListener>,
        frame_limit: usize,
        metrics: Arc<Metrics>,
    ) -> Conns {
        Conns {
            listener: listener.map(|sock| Listening {
                sock,
                accepting: Accepting::Yes,
                waiting: None,
            }),
            table: HashMap::new(),
            next: 1,
            frame_limit,
            totals: Totals::default(),
            warn: Warnings::default(),
            metrics,
        }
    }

    /// Whether connection `id` is open.
    pub(super) fn contains(&self, id: ConnId) -> bool {
        self.table.contains_key(&id)
    }

    /// How many connections are open.
    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    /// Accepts every pending client, up to [`MAX_CONNECTIONS`]. A peer of another uid (not root)
    /// is answered with an error and closed: only the init's own user may start terraform or
    /// control the init through it. When no more can be accepted (the cap, or accept(2) failed:
    /// out of descriptors), the listener leaves the epoll set until a connection closes or a
    /// short timer fires, so that the loop never spins on it. At most [`ACCEPTS_PER_EVENT`] per
    /// event: the listener is level-triggered, so the rest come at the next turn of the loop,
    /// after the signals.
    pub(super) fn accept_all(&mut self, epoll: &Epoll) {
        for _ in 0..ACCEPTS_PER_EVENT {
            let Some(l) = &self.listener else {
                return;
            };
            if l.accepting != Accepting::Yes {
                // An event from before the listener left the set.
                return;
            }
            if self.table.len() >= MAX_CONNECTIONS {
                return self.pause(epoll, Accepting::Full, Pause::Connections, None);
            }
            let sock = match l.sock.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return self.drained(),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // The client gave up before it was taken: nothing to do with the listener.
                Err(e)
                    if matches!(
                        Errno::from_raw(e.raw_os_error().unwrap_or(0)),
                        Errno::ECONNABORTED | Errno::EPROTO
                    ) =>
                {
                    continue
                }
                Err(e) => {
                    let errno = Errno::from_raw(e.raw_os_error().unwrap_or(0));
                    let why = match errno {
                        Errno::EMFILE | Errno::ENFILE => Pause::Descriptors,
                        _ => Pause::Error,
                    };
                    let retry = Instant::now() + ACCEPT_RETRY;
                    return self.pause(epoll, Accepting::Failed { retry }, why, Some(e));
                }
            };
            let now = Instant::now();
            if !own_user(&sock, &mut self.warn.other_uid, now) {
                continue;
            }
            if let Err(e) = sock.set_nonblocking(true) {
                if let Some(held_back) = self.warn.socket.allow(now) {
                    tracing::warn!(error = %e, held_back, "cannot make a client socket non-blocking; client dropped");
                }
                continue;
            }
            let id = ConnId::from(self.next);
            self.next += 1;
            let flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP;
            if let Err(e) = epoll.add(sock.as_fd(), EpollEvent::new(flags, token::conn(id))) {
                if let Some(held_back) = self.warn.socket.allow(now) {
                    tracing::warn!(error = %e, held_back, "cannot watch a client socket; client dropped");
                }
                continue;
            }
            let conn = Conn {
                sock,
                session: Session::new(self.frame_limit, now + REQUEST_DEADLINE),
                want_write: false,
            };
            self.table.insert(id, conn);
        }
    }

    /// Takes the listener out of the epoll set (`accepting` says until when), and begins a wait
    /// unless one is under way (`failed`: the accept(2) error).
    fn pause(
        &mut self,
        epoll: &Epoll,
        accepting: Accepting,
        why: Pause,
        failed: Option<io::Error>,
    ) {
        let Some(l) = &mut self.listener else {
            return;
        };
        if let Err(e) = epoll.delete(l.sock.as_fd()) {
            // Still in the set: the next event comes back here, and tries again.
            if let Some(held_back) = self.warn.socket.allow(Instant::now()) {
                tracing::warn!(error = %e, held_back, "cannot take the control socket's listener out of the epoll set");
            }
            return;
        }
        l.accepting = accepting;
        let now = Instant::now();
        if let Some(w) = &mut l.waiting {
            w.failures += u64::from(failed.is_some());
            return;
        }
        l.waiting = Some(Waiting {
            since: now,
            failures: u64::from(failed.is_some()),
        });
        self.metrics.accept_paused(Listener::Control, why);
        let Some(held_back) = self.warn.paused.allow(now) else {
            return;
        };
        match failed {
            None => tracing::warn!(
                limit = MAX_CONNECTIONS, held_back,
                "the control socket has its most open connections: new clients wait in the listen queue until one closes"
            ),
            Some(e) => {
                let hint = match why {
                    Pause::Descriptors => "the init is out of file descriptors: raise its open-files limit (RLIMIT_NOFILE, the container's ulimit) or find the process holding many connections to the control socket",
                    Pause::Connections | Pause::Error => "the kernel refused a new connection",
                };
                tracing::warn!(
                    error = %e, held_back, retry_every = %fmt_duration(ACCEPT_RETRY),
                    "accept on the control socket failed: new clients wait in the listen queue, and accepting is tried again when a connection closes or after {}; {hint}",
                    fmt_duration(ACCEPT_RETRY)
                )
            }
        }
    }

    /// Puts the listener back in the epoll set (a connection closed, or the retry is due).
    fn listen(&mut self, epoll: &Epoll) {
        let Some(l) = &mut self.listener else {
            return;
        };
        if l.accepting == Accepting::Yes {
            return;
        }
        let ev = EpollEvent::new(EpollFlags::EPOLLIN, token::TOKEN_LISTENER);
        match epoll.add(l.sock.as_fd(), ev) {
            Ok(()) => {
                l.accepting = Accepting::Yes;
                // Nobody waiting: no event will come to find the queue empty, so it is found here.
                if !has_waiting_clients(&l.sock) {
                    self.drained();
                }
            }
            Err(e) => {
                // Tried again at the next retry: never spin on it.
                l.accepting = Accepting::Failed {
                    retry: Instant::now() + ACCEPT_RETRY,
                };
                if let Some(held_back) = self.warn.socket.allow(Instant::now()) {
                    tracing::warn!(error = %e, held_back, "cannot put the control socket's listener back in the epoll set; trying again shortly");
                }
            }
        }
    }

    /// The listen queue is empty: a wait, if one was under way, is over.
    fn drained(&mut self) {
        let Some(l) = &mut self.listener else {
            return;
        };
        if let Some(w) = l.waiting.take() {
            tracing::info!(
                waited_seconds = w.since.elapsed().as_secs_f64(),
                failed_accepts = w.failures,
                "the control socket's waiting clients were all accepted"
            );
        }
    }

    /// Runs `f` on connection `id` and keeps the totals in step with what its session holds.
    fn with<R>(&mut self, id: ConnId, f: impl FnOnce(&mut Conn) -> R) -> Option<R> {
        let conn = self.table.get_mut(&id)?;
        let before = Totals::of(&conn.session);
        let r = f(conn);
        self.totals.sub(before);
        self.totals.add(Totals::of(&conn.session));
        Some(r)
    }

    /// Reads once from connection `id` into its session.
    pub(super) fn read(&mut self, id: ConnId, epoll: &Epoll, buf: &mut [u8]) -> Read {
        loop {
            let Some(got) = self.with(id, |c| {
                sys::recv_with_fds(c.sock.as_fd(), buf).map(|(n, fds)| {
                    c.session.received(&buf[..n], fds);
                    n
                })
            }) else {
                return Read::Done(After::Nothing);
            };
            return match got {
                Ok(0) => Read::Done(self.close(id, epoll, "peer closed")),
                Ok(_) => Read::Data,
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

    /// After an event's reads of connection `id`: a frame it has not finished, while unfinished
    /// frames hold more than [`UNFINISHED_BUDGET`], is answered "try again" (exit 75) and freed.
    /// Whole requests never count: the budget cannot keep a shim's request out.
    pub(super) fn after_reads(&mut self, id: ConnId, epoll: &Epoll) -> After {
        let Some(c) = self.table.get(&id) else {
            return After::Nothing;
        };
        let mine = c.session.unfinished();
        if mine == 0 || self.totals.unfinished <= UNFINISHED_BUDGET {
            return After::Nothing;
        }
        let others = self.totals.unfinished - mine;
        let problem = format!(
            "refused for now: requests that have not come whole hold {others} bytes of the init's memory, and this one ({mine} bytes so far) does not fit in the {UNFINISHED_BUDGET} it gives them (another client may be sending slowly); try again"
        );
        self.no_room(id, epoll, &problem)
    }

    /// The next whole request or note connection `id` sent. A request is parsed only when what
    /// it would cost fits in what [`HELD_BUDGET`] leaves.
    pub(super) fn next_input(&mut self, id: ConnId) -> Option<Input> {
        let room = HELD_BUDGET.saturating_sub(self.totals.held);
        self.with(id, |c| c.session.next_input(room)).flatten()
    }

    /// Connection `id`'s request started `run`.
    pub(super) fn attach(&mut self, id: ConnId, run: RunId) {
        self.with(id, |c| c.session.attach(run));
    }

    /// terraform of connection `id`'s run started: its request is no longer held.
    pub(super) fn launched(&mut self, id: ConnId) {
        self.with(id, |c| c.session.launched());
    }

    /// Connection `id` broke the protocol: mid-run it is closed (as if the shim were gone);
    /// otherwise it is answered with the problem (exit 125) and read no more.
    pub(super) fn broken(&mut self, id: ConnId, epoll: &Epoll, problem: &str) -> After {
        if let Some(held_back) = self.warn.bad_request.allow(Instant::now()) {
            tracing::warn!(conn = id.number(), problem, held_back, "bad client request");
        }
        self.refuse(id, epoll, protocol::EXIT_INIT_ERROR, problem)
    }

    /// Connection `id`'s request does not fit in the memory the init gives requests: it is
    /// answered "try again" (exit 75), or closed mid-run.
    pub(super) fn no_room(&mut self, id: ConnId, epoll: &Epoll, problem: &str) -> After {
        self.metrics.dropped(Listener::Control, Dropped::Memory);
        if let Some(held_back) = self.warn.no_room.allow(Instant::now()) {
            tracing::warn!(
                conn = id.number(),
                problem,
                held_back,
                "a client's request did not fit in the memory the init gives requests"
            );
        }
        self.refuse(id, epoll, protocol::EXIT_REFUSED, problem)
    }

    /// Answers connection `id` with `code` and `problem` and reads nothing more from it; mid-run
    /// it is closed instead (as if the shim were gone).
    fn refuse(&mut self, id: ConnId, epoll: &Epoll, code: i32, problem: &str) -> After {
        if self.table.get(&id).and_then(|c| c.session.run()).is_some() {
            return self.close(id, epoll, problem);
        }
        let note = ExitNote {
            code,
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
                if let Some(held_back) = self.warn.socket.allow(Instant::now()) {
                    tracing::warn!(conn = id.number(), error = %e, held_back, "cannot stop reading a client socket; closing it");
                }
                self.close(id, epoll, &e.to_string())
            }
        }
    }

    /// Sends connection `id` its exit note (of its run, or of a refused or failed request); it
    /// closes once that is written.
    pub(super) fn answer(&mut self, id: ConnId, epoll: &Epoll, note: &ExitNote) -> After {
        if self
            .with(id, |c| c.session.answer(Kind::Exit, note))
            .is_none()
        {
            return After::Nothing;
        }
        self.flush(id, epoll)
    }

    /// Sends connection `id` the reply to its control request; it closes once that is written.
    pub(super) fn reply(&mut self, id: ConnId, epoll: &Epoll, reply: &Reply) -> After {
        if self
            .with(id, |c| c.session.answer(Kind::Reply, reply))
            .is_none()
        {
            return After::Nothing;
        }
        self.flush(id, epoll)
    }

    /// How many bytes of its run's output may be read for connection `id` now: none once its
    /// shim lags [`HIGH_WATER`] behind, or while all shims together lag [`OUTPUT_BUDGET`]
    /// behind and it has anything queued (then a little for one with nothing queued).
    pub(super) fn room(&self, id: ConnId) -> usize {
        let queued = self.table.get(&id).map_or(0, |c| c.session.queued());
        if queued >= HIGH_WATER {
            0
        } else if self.totals.queued < OUTPUT_BUDGET {
            protocol::MAX_DATA
        } else if queued == 0 {
            OVER_BUDGET_READ
        } else {
            0
        }
    }

    /// Queues a frame of terraform's output for connection `id`.
    pub(super) fn queue(&mut self, id: ConnId, kind: Kind, bytes: &[u8]) {
        self.with(id, |c| c.session.queue_frame(kind, bytes));
    }

    /// Writes what connection `id` has queued and keeps EPOLLOUT in its interest set exactly
    /// while something is left; closes it once its answer is written, or when writing fails.
    pub(super) fn flush(&mut self, id: ConnId, epoll: &Epoll) -> After {
        let Some(flushed) = self.with(id, |c| c.flush(id, epoll)) else {
            return After::Nothing;
        };
        let queued = match flushed {
            Ok(q) => q,
            Err(e) => {
                if let FlushError::Watch(_) = e {
                    if let Some(held_back) = self.warn.socket.allow(Instant::now()) {
                        tracing::warn!(conn = id.number(), error = %e, held_back, "cannot change what is watched on a client socket; closing it");
                    }
                }
                return self.close(id, epoll, &e.to_string());
            }
        };
        let Some(conn) = self.table.get(&id) else {
            return After::Nothing;
        };
        if queued == 0 && conn.session.closing() {
            return self.close(id, epoll, "done");
        }
        match conn.session.run() {
            Some(run) if queued < HIGH_WATER / 2 && self.room(id) > 0 => After::CaughtUp(run),
            _ => After::Nothing,
        }
    }

    /// At exit: one last non-blocking attempt to deliver what is queued (exit codes) to shims.
    pub(super) fn write_all_now(&mut self) {
        for conn in self.table.values_mut() {
            let _ = conn.write_some();
        }
    }

    /// When a timer of the clients is due next: a request's deadline, or trying to accept again.
    pub(super) fn next_wakeup(&self) -> Option<Instant> {
        let retry = match self.listener.as_ref().map(|l| l.accepting) {
            Some(Accepting::Failed { retry }) => Some(retry),
            _ => None,
        };
        self.table
            .values()
            .filter_map(|c| c.session.deadline())
            .chain(retry)
            .min()
    }

    /// Acts on the clients' timers due at `now`: accepting is tried again after a failure, and a
    /// client whose request has not come whole within [`REQUEST_DEADLINE`] is answered (exit
    /// 125, saying so) and closed, its bytes freed. Such clients have no run: nothing follows.
    pub(super) fn client_timers(&mut self, now: Instant, epoll: &Epoll) {
        if let Some(Accepting::Failed { retry }) = self.listener.as_ref().map(|l| l.accepting) {
            if retry <= now {
                self.listen(epoll);
            }
        }
        let due: Vec<ConnId> = self
            .table
            .iter()
            .filter(|(_, c)| c.session.deadline().is_some_and(|d| d <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let Some((got, expected)) = self.table.get(&id).map(|c| c.session.progress()) else {
                continue;
            };
            let of = expected.map_or(String::new(), |n| format!(" of a {n}-byte frame"));
            let problem = format!(
                "closed: the request did not come whole within {} of connecting ({got} bytes{of} came); a tfinit client sends its whole request at once",
                fmt_duration(REQUEST_DEADLINE)
            );
            self.metrics.dropped(Listener::Control, Dropped::Deadline);
            if let Some(held_back) = self.warn.too_slow.allow(now) {
                tracing::warn!(
                    conn = id.number(),
                    problem,
                    held_back,
                    "closed a client that did not send its request in time"
                );
            }
            self.refuse(id, epoll, protocol::EXIT_INIT_ERROR, &problem);
        }
    }

    fn close(&mut self, id: ConnId, epoll: &Epoll, why: &str) -> After {
        let Some(conn) = self.table.remove(&id) else {
            return After::Nothing;
        };
        self.totals.sub(Totals::of(&conn.session));
        let _ = epoll.delete(conn.sock.as_fd());
        tracing::debug!(conn = id.number(), why, "client connection closed");
        let after = conn.session.run().map_or(After::Nothing, After::Detached);
        drop(conn);
        // A descriptor and a place are free: clients waiting in the listen queue come in.
        self.listen(epoll);
        after
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

/// Whether clients wait in `listener`'s queue, asked without waiting (poll(2) with no timeout).
fn has_waiting_clients(listener: &UnixListener) -> bool {
    let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
}

/// Whether the peer of `sock` runs as the init's user (or root); any other is answered with an
/// error, and dropped. Its warning goes through `warn`: a client can repeat it at will.
fn own_user(sock: &UnixStream, warn: &mut Throttle, now: Instant) -> bool {
    let me = nix::unistd::geteuid().as_raw();
    match getsockopt(sock, sockopt::PeerCredentials) {
        Ok(cred) if cred.uid() == me || cred.uid() == 0 => true,
        Ok(cred) => {
            if let Some(held_back) = warn.allow(now) {
                tracing::warn!(
                    peer_uid = cred.uid(),
                    peer_pid = cred.pid(),
                    init_uid = me,
                    held_back,
                    "refused a client of another uid"
                );
            }
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
            if let Some(held_back) = warn.allow(now) {
                tracing::warn!(error = %e, held_back, "SO_PEERCRED failed; client refused");
            }
            false
        }
    }
}
