//! The PID-1 event loop: one thread, one epoll set (signalfd, control socket, connections, run
//! output pipes), timers as the epoll timeout. Nothing in here panics or exits on a runtime
//! error: failures are logged and the loop carries on, because if PID 1 dies the container dies.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::signalfd::SignalFd;
use nix::unistd::Pid;

use super::reaper::{self, Exit};
use super::runs::{Run, RunState, Stream};
use super::server::Conn;
use super::setup::Mode;
use super::shutdown::{Cause, Phase, Timeline, Transition};
use super::spawn;
use crate::config::{fmt_duration, ForwardTo, InitConfig};
use crate::locks::record::{self, Record};
use crate::locks::{follower::Follower, Locks};
use crate::protocol::{self, ExitNote, RunRequest};
use crate::signals::{self, Incoming};
use crate::sys::{self, SigNo, Target};
use crate::terraform::{self, Invocation};

const TOKEN_SIGNALS: u64 = 0;
const TOKEN_LISTENER: u64 = 1;
const KIND_CONN: u64 = 1;
const KIND_STDOUT: u64 = 2;
const KIND_STDERR: u64 = 3;

/// Output queued for a shim beyond which terraform's pipes are paused (backpressure).
pub const HIGH_WATER: usize = 1 << 20;

/// How long pipes held open by a leftover grandchild are drained after terraform exits.
const LINGER: Duration = Duration::from_secs(2);

/// The exit code of terraform's panicwrap parent when its wrapped child (the process that holds the
/// lock) was killed by a signal (the child's wait status -1 as an exit code:
/// docs/notes/terraform-facts.md 6b). terraform itself exits 0, 1 or 2.
const PANICWRAP_CHILD_KILLED: i32 = 255;

/// How often a changed in-progress set is written to the record.
const RECORD_INTERVAL: Duration = Duration::from_secs(1);

/// What a forward did: the signal after rewrite, and where it went with kill(2)'s result (none
/// when there was no one to send it to).
type Forwarded = (SigNo, Option<(Target, Result<(), Errno>)>);

fn token(kind: u64, id: u64) -> u64 {
    (id << 8) | kind
}

/// The controller.
#[derive(Debug)]
struct Main {
    pid: Pid,
    exit: Option<Exit>,
    /// Whether its group got a stop signal already (never send it a second SIGTERM by ourselves).
    group_stopped: bool,
}

/// Who a reaped pid belonged to.
#[derive(Debug, Clone, Copy)]
enum PidOwner {
    Terraform(u64),
    Recovery(u64),
}

/// The init's whole state.
pub struct Init {
    pub(super) cfg: InitConfig,
    mode: Mode,
    pub(super) epoll: Epoll,
    sigfd: SignalFd,
    pub(super) listener: Option<UnixListener>,
    main: Main,
    pub(super) timeline: Timeline,
    pub(super) conns: HashMap<u64, Conn>,
    pub(super) runs: HashMap<u64, Run>,
    pids: HashMap<Pid, PidOwner>,
    pub(super) next_id: u64,
    next_run: u64,
    locks: Locks,
    scratch: Vec<u8>,
}

/// Waits for the controller without an event loop (only if epoll itself cannot be created).
pub fn wait_plain(main: Pid) -> i32 {
    loop {
        let (exits, _) = reaper::reap_all();
        if let Some((_, e)) = exits.iter().find(|(p, _)| *p == main) {
            return e.code();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Init {
    /// Registers the signalfd and the listener in a new epoll set.
    pub fn new(
        cfg: InitConfig,
        mode: Mode,
        sigfd: SignalFd,
        listener: Option<UnixListener>,
        locks: Locks,
        main_pid: Pid,
    ) -> io::Result<Init> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        epoll.add(
            sigfd.as_fd(),
            EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_SIGNALS),
        )?;
        if let Some(l) = &listener {
            epoll.add(
                l.as_fd(),
                EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_LISTENER),
            )?;
        }
        let timeline = Timeline::new(cfg.grace_period, cfg.stop_timeout, cfg.kill_margin);
        Ok(Init {
            cfg,
            mode,
            epoll,
            sigfd,
            listener,
            main: Main {
                pid: main_pid,
                exit: None,
                group_stopped: false,
            },
            timeline,
            conns: HashMap::new(),
            runs: HashMap::new(),
            pids: HashMap::new(),
            next_id: 1,
            next_run: 1,
            locks,
            scratch: vec![0u8; protocol::MAX_DATA],
        })
    }

    /// Runs until the controller and every run are gone; returns the exit code.
    pub fn run(mut self) -> i32 {
        let mut events = vec![EpollEvent::empty(); 256];
        // A SIGCHLD may have come before the signalfd was registered: reap once up front.
        self.reap();
        loop {
            if let Some(code) = self.finished() {
                self.flush_all_best_effort();
                tracing::info!(exit_code = code, "tfinit exiting");
                // Straight out: the kernel closes our descriptors and frees our memory faster
                // than destructors and atexit handlers would, and a container's exit waits on us.
                sys::exit_now(code);
            }
            let timeout = self.timeout();
            let n = match self.epoll.wait(&mut events, timeout) {
                Ok(n) => n,
                Err(Errno::EINTR) => 0,
                Err(e) => {
                    tracing::warn!(error = %e, "epoll_wait failed; retrying");
                    std::thread::sleep(Duration::from_millis(10));
                    0
                }
            };
            for ev in &events[..n] {
                self.dispatch(ev.data(), ev.events());
            }
            self.on_timers(Instant::now());
        }
    }

    fn dispatch(&mut self, tok: u64, flags: EpollFlags) {
        match tok {
            TOKEN_SIGNALS => self.on_signals(),
            TOKEN_LISTENER => self.accept_all(),
            t => {
                let (kind, id) = (t & 0xff, t >> 8);
                match kind {
                    KIND_CONN => self.on_conn(id, flags),
                    KIND_STDOUT => self.on_output(id, Stream::Stdout),
                    KIND_STDERR => self.on_output(id, Stream::Stderr),
                    _ => tracing::debug!(token = t, "event for an unknown token"),
                }
            }
        }
    }

    /// The epoll timeout: until the nearest timer, or forever.
    fn timeout(&self) -> EpollTimeout {
        let now = Instant::now();
        let mut next: Option<Instant> = self.timeline.next_wakeup();
        let mut consider = |t: Option<Instant>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        };
        consider(self.locks.next_heartbeat());
        for r in self.runs.values() {
            consider(r.kill_at.filter(|_| !r.killed));
            consider(r.exited_at.map(|t| t + LINGER));
            if let Some(h) = &r.record {
                consider(h.dirty.then_some(h.written + RECORD_INTERVAL));
            }
        }
        match next {
            None => EpollTimeout::NONE,
            Some(t) => {
                let ms = t.saturating_duration_since(now).as_millis().min(60_000) as u16;
                // Round up so we do not wake a millisecond early and spin.
                EpollTimeout::from(ms.saturating_add(1))
            }
        }
    }

    // ----- signals -----

    fn on_signals(&mut self) {
        loop {
            match self.sigfd.read_signal() {
                Ok(Some(info)) => self.on_signal(info.ssi_signo as SigNo, info.ssi_pid as i32),
                Ok(None) => return,
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the signalfd failed");
                    return;
                }
            }
        }
    }

    fn on_signal(&mut self, signo: SigNo, sender: i32) {
        match signals::classify(signo) {
            Incoming::Child => self.reap(),
            Incoming::Shutdown(s) => {
                // The kill first, the bookkeeping after: the controller's latency is what the
                // init does between reading the signal and kill(2), so nothing else runs there.
                let forwarded = self.forward_now(s);
                let t = self.timeline.on_stop_signal(Instant::now());
                // Logged after the timeline moved, so with the phase and deadline it belongs to;
                // the transition's own signals (if any) follow the forward.
                self.log_forward(s, forwarded);
                tracing::info!(signal = %signals::name(s), sender, "stop signal received");
                if let Some(t) = t {
                    self.transition(t);
                }
            }
            Incoming::Forward(s) => {
                let forwarded = self.forward_now(s);
                tracing::debug!(signal = %signals::name(s), sender, "signal received");
                self.log_forward(s, forwarded);
            }
            Incoming::Ignore(s) => {
                tracing::debug!(signal = %signals::name(s), "signal raised by our own I/O; not forwarded")
            }
        }
    }

    /// Sends a signal (after rewrite) to the controller or its group: the hot path, kept to the
    /// kill itself. Returns what was sent where, for [`Self::log_forward`]: the signal after
    /// rewrite, and no target when there is no one to send it to (`TFINIT_FORWARD=child` and the
    /// controller is gone).
    fn forward_now(&mut self, signo: SigNo) -> Forwarded {
        let to = self.cfg.rewrite.apply(signo);
        let target = match (self.cfg.forward, self.main.exit) {
            (ForwardTo::Child, None) => Target::Pid(self.main.pid),
            (ForwardTo::Child, Some(_)) => return (to, None),
            (ForwardTo::Group, _) => Target::Group(self.main.pid),
        };
        let sent = sys::kill(target, to);
        if sent.is_ok() {
            // Let the woken controller run before we spend our time slice on logs and the
            // timeline: on a busy node it often shares our CPU (forwarding latency, benchmarks).
            std::thread::yield_now();
        }
        if target == Target::Group(self.main.pid)
            && matches!(signals::classify(to), Incoming::Shutdown(_))
        {
            self.main.group_stopped = true;
        }
        (to, Some((target, sent)))
    }

    /// Logs what [`Self::forward_now`] did with `signo`.
    fn log_forward(&self, signo: SigNo, (to, sent_to): Forwarded) {
        let Some((target, sent)) = sent_to else {
            tracing::debug!(signal = %signals::name(to), "controller gone; signal not forwarded");
            return;
        };
        match sent {
            // A stop signal sent on is a shutdown step: logged at info like the others.
            Ok(()) if matches!(signals::classify(signo), Incoming::Shutdown(_)) => {
                let (phase, left) = self.when();
                tracing::info!(signal = %signals::name(to), %target, phase, seconds_left = left, "signal forwarded")
            }
            Ok(()) => tracing::debug!(signal = %signals::name(to), %target, "signal forwarded"),
            Err(Errno::ESRCH) => {
                tracing::debug!(signal = %signals::name(to), %target, "nothing to forward to")
            }
            Err(e) => {
                tracing::warn!(signal = %signals::name(to), %target, error = %e, "forwarding failed")
            }
        }
    }

    // ----- reaping -----

    fn reap(&mut self) {
        let (exits, _) = reaper::reap_all();
        for (pid, exit) in exits {
            if pid == self.main.pid {
                self.main.exit = Some(exit);
                tracing::info!(pid = pid.as_raw(), %exit, "controller exited");
                match self.timeline.on_main_exit(Instant::now()) {
                    Some(t) => self.transition(t),
                    // Already stopping on a signal that may not have reached the group
                    // (TFINIT_FORWARD=child): its leftovers still get their SIGTERM now.
                    None => self.stop_leftovers(),
                }
                continue;
            }
            match self.pids.remove(&pid) {
                Some(PidOwner::Terraform(id)) => self.on_terraform_exit(id, exit),
                Some(PidOwner::Recovery(id)) => self.on_recovery_exit(id, exit),
                None => tracing::debug!(pid = pid.as_raw(), %exit, "reaped"),
            }
        }
    }

    /// Whether the init may exit now, and with which code: the controller is gone, no run is left,
    /// and the controller's process group is empty. Never waits for a timer.
    fn finished(&self) -> Option<i32> {
        let exit = self.main.exit?;
        if !self.runs.is_empty() || sys::group_alive(self.main.pid) {
            return None;
        }
        Some(exit.code())
    }

    // ----- the shutdown timeline -----

    fn transition(&mut self, t: Transition) {
        let left = self.timeline.seconds_left(Instant::now()).unwrap_or(0.0);
        match t {
            Transition::Began(cause) => {
                let why = match cause {
                    Cause::Signal => "stop signal",
                    Cause::MainExited => "controller exited",
                };
                if cause == Cause::MainExited
                    && self.runs.is_empty()
                    && !sys::group_alive(self.main.pid)
                {
                    // Nothing is left to stop: the init exits right away (its exit is logged).
                    return;
                }
                tracing::info!(
                    phase = Phase::Stopping.as_str(),
                    cause = why,
                    grace_period = %fmt_duration(self.cfg.grace_period),
                    runs = self.runs.len(),
                    seconds_left = left,
                    "shutdown: new terraform runs are refused; runs in flight get SIGTERM {} before the deadline and SIGKILL {} before it",
                    fmt_duration(self.cfg.stop_timeout),
                    fmt_duration(self.cfg.kill_margin),
                );
                if cause == Cause::MainExited {
                    self.stop_leftovers();
                }
            }
            Transition::Graceful => {
                tracing::info!(
                    phase = "stopping",
                    step = "graceful",
                    runs = self.runs.len(),
                    seconds_left = left,
                    "asking terraform runs to stop gracefully"
                );
                let ids: Vec<u64> = self.runs.keys().copied().collect();
                for id in ids {
                    self.request_stop(id, "shutdown deadline approaching");
                }
            }
            Transition::Kill => {
                tracing::info!(
                    phase = "stopping",
                    step = "kill",
                    runs = self.runs.len(),
                    seconds_left = left,
                    "SIGKILL to everything left"
                );
                self.flush_records();
                let ids: Vec<u64> = self.runs.keys().copied().collect();
                for id in ids {
                    self.kill_run(id, "shutdown deadline");
                }
                if sys::group_alive(self.main.pid) {
                    self.signal(
                        Target::Group(self.main.pid),
                        libc::SIGKILL,
                        "controller's process group",
                    );
                }
                if self.mode == Mode::Pid1 {
                    self.signal(
                        Target::Everyone,
                        libc::SIGKILL,
                        "every process left in the container",
                    );
                }
            }
        }
    }

    /// The phase and the seconds left to the deadline (once stopping), for logs.
    fn when(&self) -> (&'static str, Option<f64>) {
        (
            self.timeline.phase().as_str(),
            self.timeline.seconds_left(Instant::now()),
        )
    }

    /// The controller exited: processes left in its group get one SIGTERM, unless the group
    /// already got a stop signal.
    fn stop_leftovers(&mut self) {
        if !self.main.group_stopped && sys::group_alive(self.main.pid) {
            self.main.group_stopped = true;
            self.signal(
                Target::Group(self.main.pid),
                libc::SIGTERM,
                "controller's leftover processes",
            );
        }
    }

    fn signal(&self, target: Target, signo: SigNo, what: &str) {
        let (phase, left) = self.when();
        match sys::kill(target, signo) {
            Ok(()) => {
                tracing::info!(%target, signal = %signals::name(signo), phase, seconds_left = left, "signalled {what}")
            }
            Err(Errno::ESRCH) => tracing::debug!(%target, "{what}: already gone"),
            Err(e) => {
                tracing::warn!(%target, signal = %signals::name(signo), error = %e, "signalling {what} failed")
            }
        }
    }

    /// Sends a run its one graceful SIGTERM (to terraform's own pid, never its group).
    pub(super) fn request_stop(&mut self, id: u64, why: &str) {
        let (phase, left) = self.when();
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        let Some(pid) = run.pid() else {
            // Still recovering a lock: terraform has not started, so there is nothing to stop,
            // and it will not start (the phase refuses it or the kill step comes first).
            return;
        };
        if run.stop_requested || !run.alive() {
            return;
        }
        run.stop_requested = true;
        match sys::kill(Target::Pid(pid), libc::SIGTERM) {
            Ok(()) => tracing::info!(
                run = %run.id, pid = pid.as_raw(), cwd = %run.cwd.display(), subcommand = %run.invocation.subcommand,
                phase, seconds_left = left, reason = why, "SIGTERM to terraform (graceful stop: it finishes operations in flight, saves state, releases the lock)"
            ),
            Err(e) => {
                tracing::warn!(run = %run.id, pid = pid.as_raw(), error = %e, "SIGTERM to terraform failed")
            }
        }
    }

    fn kill_run(&mut self, id: u64, why: &str) {
        let (phase, left) = self.when();
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        match &run.state {
            RunState::Recovering { helper, .. } => {
                let h = *helper;
                let _ = sys::kill(Target::Group(h), libc::SIGKILL);
                run.killed = true;
            }
            RunState::Started { pid } => {
                let pid = *pid;
                if run.killed || !sys::group_alive(pid) {
                    return;
                }
                run.killed = true;
                match sys::kill(Target::Group(pid), libc::SIGKILL) {
                    Ok(()) => tracing::info!(
                        run = %run.id, pid = pid.as_raw(), pgid = pid.as_raw(), cwd = %run.cwd.display(), subcommand = %run.invocation.subcommand,
                        phase, seconds_left = left, reason = why, in_progress = ?run.follower.as_ref().map(|f| f.in_progress()),
                        "SIGKILL to terraform's process group"
                    ),
                    Err(e) => {
                        tracing::warn!(run = %run.id, error = %e, "SIGKILL to terraform's group failed")
                    }
                }
            }
        }
    }

    // ----- timers -----

    fn on_timers(&mut self, now: Instant) {
        while let Some(t) = self.timeline.due(now) {
            self.transition(t);
        }
        self.locks.tick(now);
        let ids: Vec<u64> = self.runs.keys().copied().collect();
        for id in ids {
            let Some(run) = self.runs.get_mut(&id) else {
                continue;
            };
            if run.kill_at.is_some_and(|t| now >= t) && !run.killed && run.alive() {
                run.kill_at = None;
                self.kill_run(id, "abandoned run did not stop within TFINIT_STOP_TIMEOUT");
                continue;
            }
            if run.exited_at.is_some_and(|t| now >= t + LINGER) {
                tracing::debug!(run = %run.id, "output pipes still open after terraform exited; draining and closing them");
                self.drain_and_close(id, Stream::Stdout);
                self.drain_and_close(id, Stream::Stderr);
                continue;
            }
            if let Some(h) = run.record.as_mut() {
                if h.dirty && now >= h.written + RECORD_INTERVAL {
                    if let Some(store) = &self.locks.store {
                        if let Err(e) = store.update(h) {
                            tracing::warn!(file = %h.path.display(), error = %e, "cannot update the lock-owner record; its resources in progress are out of date. Free space in TFINIT_STATE_DIR or mount a bigger, writable volume there");
                            h.dirty = false;
                        }
                    }
                }
            }
        }
    }

    fn flush_records(&mut self) {
        let Some(store) = &self.locks.store else {
            return;
        };
        for run in self.runs.values_mut() {
            if let Some(h) = run.record.as_mut() {
                if h.dirty {
                    let _ = store.update(h);
                }
            }
        }
    }

    // ----- runs -----

    /// Starts a run for a shim's request (or refuses it), answering on connection `conn`.
    pub(super) fn start_run(&mut self, conn: u64, req: RunRequest, stdin: Option<OwnedFd>) {
        if !self.timeline.accepts_runs() {
            let phase = self.timeline.phase();
            let msg = format!(
                "tfinit: the init is {} ({}): terraform was not started; the controller should retry later (exit code {})",
                if phase == Phase::Draining { "draining" } else { "shutting down" },
                if phase == Phase::Draining { "tfinit drain; `tfinit resume` accepts runs again" } else { "the container is stopping" },
                protocol::EXIT_REFUSED
            );
            tracing::info!(phase = phase.as_str(), args = ?terraform::redact(&req.args), cwd = %req.cwd, "terraform run refused");
            self.reply_exit(
                conn,
                ExitNote {
                    code: protocol::EXIT_REFUSED,
                    error: Some(msg),
                    ..Default::default()
                },
            );
            return;
        }
        let id = self.next_run;
        self.next_run += 1;
        let invocation = Invocation::parse(&req.args);
        let cwd = PathBuf::from(&req.cwd);
        let workdir = invocation.workdir(&cwd);
        let locking = invocation.takes_lock(&req.args);
        let mut run = Run {
            id: format!("r{id}"),
            state: RunState::Started {
                pid: Pid::from_raw(0),
            },
            cwd,
            workdir,
            argv: terraform::redact(&req.args),
            invocation,
            started: SystemTime::now(),
            conn: Some(conn),
            stdout: None,
            stderr: None,
            paused: false,
            exit: None,
            exited_at: None,
            stop_requested: false,
            kill_at: None,
            killed: false,
            partial: [Vec::new(), Vec::new()],
            record: None,
            follower: locking.then(Follower::default),
        };
        if let Some(c) = self.conns.get_mut(&conn) {
            c.run = Some(id);
        }
        if locking && self.locks.needs_recovery(&run.workdir) {
            match super::server::spawn_recovery(&req, &self.locks, &run.workdir) {
                Ok(helper) => {
                    tracing::info!(run = %run.id, workdir = %run.workdir.display(), helper = helper.as_raw(), "a dead owner's lock-owner record is here: checking the state lock before terraform starts");
                    self.pids.insert(helper, PidOwner::Recovery(id));
                    run.state = RunState::Recovering {
                        helper,
                        request: Box::new(req),
                        stdin,
                    };
                    self.runs.insert(id, run);
                    return;
                }
                Err(e) => {
                    tracing::warn!(run = %run.id, error = %e, "cannot start the lock recovery; terraform starts without it")
                }
            }
        }
        self.runs.insert(id, run);
        self.launch(id, req, stdin);
    }

    /// Starts terraform for a run (after any recovery).
    fn launch(&mut self, id: u64, req: RunRequest, stdin: Option<OwnedFd>) {
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        // The record is on disk before terraform exists, so a kill right after the start leaves it.
        if run.follower.is_some() {
            if let Some(store) = &self.locks.store {
                let now = record::now_ms();
                let rec = Record {
                    v: record::FORMAT,
                    owner: self.locks.owner.clone(),
                    who: crate::locks::terraform_who(&req.env),
                    run_id: run.id.clone(),
                    cwd: run.cwd.to_string_lossy().into_owned(),
                    workdir: run.workdir.to_string_lossy().into_owned(),
                    workspace: crate::locks::workspace_of(
                        &req.args,
                        &run.invocation.subcommand,
                        &req.env,
                        &run.workdir,
                    ),
                    subcommand: run.invocation.subcommand.clone(),
                    argv: run.argv.clone(),
                    started_ms: now,
                    in_progress: Vec::new(),
                    updated_ms: now,
                    ended: None,
                };
                match store.create(rec) {
                    Ok(h) => run.record = Some(h),
                    Err(e) => {
                        tracing::warn!(run = %run.id, state_dir = %store.dir().display(), error = %e, "cannot write the lock-owner record; this run's lock will not be recoverable automatically. Free space in TFINIT_STATE_DIR or mount a bigger, writable volume there")
                    }
                }
            }
        }
        match spawn::terraform(&req, stdin) {
            Ok(started) => {
                run.state = RunState::Started { pid: started.pid };
                for fd in [&started.stdout, &started.stderr] {
                    // A bigger pipe means fewer wake-ups for large outputs (plan -json, show -json).
                    let _ = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETPIPE_SZ(1 << 20));
                    let _ = nix::fcntl::fcntl(
                        fd,
                        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
                    );
                }
                run.stdout = Some(started.stdout);
                run.stderr = Some(started.stderr);
                tracing::info!(
                    run = %run.id, pid = started.pid.as_raw(), cwd = %run.cwd.display(), subcommand = %run.invocation.subcommand,
                    argv = ?run.argv, "terraform started"
                );
                self.pids.insert(started.pid, PidOwner::Terraform(id));
                self.watch_pipes(id);
            }
            Err(e) => {
                // Out of descriptors or processes is passing: "try again later" (75), like a
                // refusal, so the controller retries instead of reporting a broken binary.
                let (code, hint) = match e.raw_os_error() {
                    Some(libc::EMFILE | libc::ENFILE | libc::EAGAIN | libc::ENOMEM) => (
                        protocol::EXIT_REFUSED,
                        " (out of resources: try again later; raise the container's open-files or process limits if it repeats)",
                    ),
                    _ if e.kind() == io::ErrorKind::NotFound => (127, ""),
                    _ => (126, ""),
                };
                let msg = format!(
                    "tfinit: cannot start {:?} in {:?}: {e}{hint}",
                    req.program, req.cwd
                );
                tracing::warn!(run = %run.id, "{msg}");
                if let Some(h) = run.record.take() {
                    let _ = record::remove(&h.path);
                }
                let conn = run.conn;
                self.runs.remove(&id);
                if let Some(c) = conn {
                    self.reply_exit(
                        c,
                        ExitNote {
                            code,
                            error: Some(msg),
                            run_id: Some(format!("r{id}")),
                            ..Default::default()
                        },
                    );
                }
            }
        }
    }

    fn on_recovery_exit(&mut self, id: u64, exit: Exit) {
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        tracing::info!(run = %run.id, %exit, "lock recovery finished");
        let state = std::mem::replace(
            &mut run.state,
            RunState::Started {
                pid: Pid::from_raw(0),
            },
        );
        let RunState::Recovering { request, stdin, .. } = state else {
            return;
        };
        if run.conn.is_none() {
            // The shim gave up while the lock was checked: nobody waits for this run, and
            // starting it now would only leave a run to stop.
            tracing::info!(run = %run.id, "the shim is gone; terraform is not started");
            self.runs.remove(&id);
            return;
        }
        if run.killed || !self.timeline.accepts_runs() {
            let conn = run.conn;
            self.runs.remove(&id);
            if let Some(c) = conn {
                let msg = format!(
                    "tfinit: the init is shutting down: terraform was not started (exit code {})",
                    protocol::EXIT_REFUSED
                );
                self.reply_exit(
                    c,
                    ExitNote {
                        code: protocol::EXIT_REFUSED,
                        error: Some(msg),
                        run_id: Some(format!("r{id}")),
                        ..Default::default()
                    },
                );
            }
            return;
        }
        self.launch(id, *request, stdin);
    }

    fn watch_pipes(&mut self, id: u64) {
        let Some(run) = self.runs.get(&id) else {
            return;
        };
        for (fd, kind) in [(&run.stdout, KIND_STDOUT), (&run.stderr, KIND_STDERR)] {
            if let Some(fd) = fd {
                if let Err(e) = self.epoll.add(
                    fd.as_fd(),
                    EpollEvent::new(EpollFlags::EPOLLIN, token(kind, id)),
                ) {
                    tracing::warn!(run = %run.id, error = %e, "cannot watch terraform's output");
                }
            }
        }
    }

    /// Stops reading a run's pipes while its shim lags (terraform then blocks on a full pipe,
    /// exactly as with a slow reader of a direct run).
    pub(super) fn pause(&mut self, id: u64) {
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        if run.paused {
            return;
        }
        run.paused = true;
        for fd in [&run.stdout, &run.stderr].into_iter().flatten() {
            let _ = self.epoll.delete(fd.as_fd());
        }
    }

    /// Resumes reading a paused run's pipes.
    pub(super) fn resume(&mut self, id: u64) {
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        if !run.paused {
            return;
        }
        run.paused = false;
        self.watch_pipes(id);
    }

    fn on_output(&mut self, id: u64, stream: Stream) {
        // Bounded per event so one chatty run cannot starve signals and other runs.
        for _ in 0..16 {
            let Some(run) = self.runs.get_mut(&id) else {
                return;
            };
            if run.paused {
                return;
            }
            let attached = run.conn.filter(|c| self.conns.contains_key(c));
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
                        run.flush_detached(stream);
                    }
                    self.close_pipe(id, stream);
                    return;
                }
                Ok(n) => self.deliver(id, stream, n),
                Err(Errno::EAGAIN) => break,
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    tracing::warn!(run = %run.id, stream = stream.as_str(), error = %e, "reading terraform's output failed; closing it");
                    self.close_pipe(id, stream);
                    return;
                }
            }
        }
        if let Some(c) = self.runs.get(&id).and_then(|r| r.conn) {
            self.flush_conn(c);
        }
    }

    /// Hands `self.scratch[..n]`, just read from a run's pipe, to the lock-owner follower and to
    /// the shim (or to the log, at debug, when no shim is attached).
    fn deliver(&mut self, id: u64, stream: Stream, n: usize) {
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        let bytes = &self.scratch[..n];
        if let Some(f) = run.follower.as_mut() {
            f.feed(stream as usize, bytes);
            if f.take_changed() {
                if let Some(h) = run.record.as_mut() {
                    h.record.in_progress = f.in_progress();
                    h.dirty = true;
                }
            }
        }
        match run.conn.and_then(|c| self.conns.get_mut(&c)) {
            Some(conn) => {
                let kind = match stream {
                    Stream::Stdout => protocol::Kind::Stdout,
                    Stream::Stderr => protocol::Kind::Stderr,
                };
                conn.queue_frame(kind, bytes);
            }
            None => run.log_detached(stream, bytes),
        }
    }

    /// Closes a pipe of a run whose terraform has exited, after reading what is left in it
    /// however far the shim lags: nothing terraform wrote is lost (bounded by the pipe's size,
    /// plus whatever a leftover grandchild writes meanwhile).
    fn drain_and_close(&mut self, id: u64, stream: Stream) {
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
            if run.conn.is_none() {
                run.flush_detached(stream);
            }
        }
        self.close_pipe(id, stream);
    }

    fn close_pipe(&mut self, id: u64, stream: Stream) {
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        if let Some(fd) = run.take_pipe(stream) {
            if !run.paused {
                let _ = self.epoll.delete(fd.as_fd());
            }
        }
        self.maybe_finish(id);
    }

    fn on_terraform_exit(&mut self, id: u64, exit: Exit) {
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        run.exit = Some(exit);
        run.exited_at = Some(Instant::now());
        let dur = run.started.elapsed().map_or(0.0, |d| d.as_secs_f64());
        tracing::info!(
            run = %run.id, pid = run.pid().map_or(0, |p| p.as_raw()), %exit, seconds = dur,
            cwd = %run.cwd.display(), subcommand = %run.invocation.subcommand, attached = run.conn.is_some(),
            "terraform exited"
        );
        // Leftover members of its group: provider plugins a killed terraform left behind, or the
        // children of a local-exec that a graceful stop orphaned (`sleep`). The latter can hold
        // terraform's output pipes open (panicwrap passes them down), so while stopping they go
        // at once: the init must exit when terraform is done, not after the pipes' linger.
        // Also after a graceful stop we asked for (the shim's signal, an abandoned run): the
        // interrupted local-exec's children are debris that would hold the output pipes open.
        let stopping = self.timeline.phase() == Phase::Stopping || run.stop_requested;
        if let Some(pid) = run.pid() {
            // Exit code 255: panicwrap's child was killed, its providers are orphans too.
            let killed = exit.signal().is_some() || exit == Exit::Code(PANICWRAP_CHILD_KILLED);
            if (killed || stopping) && sys::group_alive(pid) {
                match sys::kill(Target::Group(pid), libc::SIGKILL) {
                    Ok(()) if stopping => tracing::info!(
                        run = %run.id, pgid = pid.as_raw(), phase = self.timeline.phase().as_str(),
                        seconds_left = self.timeline.seconds_left(Instant::now()),
                        "SIGKILL to what terraform left in its process group"
                    ),
                    Ok(()) | Err(Errno::ESRCH) => {}
                    Err(e) => {
                        tracing::warn!(run = %run.id, pgid = pid.as_raw(), error = %e, "SIGKILL to terraform's leftovers failed")
                    }
                }
            }
        }
        self.maybe_finish(id);
    }

    /// Ends a run once terraform was reaped and its output fully drained: sends the exit code to
    /// the shim, removes the record when terraform exited by itself (kept when killed).
    fn maybe_finish(&mut self, id: u64) {
        let Some(run) = self.runs.get(&id) else {
            return;
        };
        let Some(exit) = run.exit else { return };
        if run.stdout.is_some() || run.stderr.is_some() {
            return;
        }
        let Some(mut run) = self.runs.remove(&id) else {
            return;
        };
        // Creates, updates or destroys that started and never completed: their resources may exist
        // outside the state. terraform exited by itself (a graceful stop, an error), so no lock
        // recovery will name them later: name them now.
        let unfinished = run
            .follower
            .as_ref()
            .map(Follower::in_progress)
            .unwrap_or_default();
        if !unfinished.is_empty() && matches!(exit, Exit::Code(_)) {
            tracing::warn!(
                run = %run.id, exit_code = exit.code(), cwd = %run.cwd.display(), subcommand = %run.invocation.subcommand,
                orphan_candidates = ?unfinished,
                "operations unfinished when terraform exited: resources that may exist outside the state: check them and import or delete"
            );
        }
        if let Some(mut h) = run.record.take() {
            let trouble = run.follower.as_ref().and_then(Follower::lock_trouble);
            match (exit, trouble) {
                (Exit::Code(c), None) if c != PANICWRAP_CHILD_KILLED => {
                    if let Err(e) = record::remove(&h.path) {
                        tracing::warn!(file = %h.path.display(), error = %e, "cannot remove the lock-owner record");
                    }
                }
                _ => {
                    let how = match (exit, trouble) {
                        (Exit::Signal(s), _) => format!("killed by {}", signals::name(s)),
                        (_, Some(why)) => format!("{why}, exit code {}", exit.code()),
                        _ => format!(
                            "exit code {PANICWRAP_CHILD_KILLED}: terraform's wrapped child process was killed by a signal"
                        ),
                    };
                    if let Some(f) = &run.follower {
                        h.record.in_progress = f.in_progress();
                    }
                    h.record.ended = Some(record::Ended {
                        ms: record::now_ms(),
                        how: how.clone(),
                    });
                    if let Some(store) = &self.locks.store {
                        if let Err(e) = store.update(&mut h) {
                            tracing::warn!(file = %h.path.display(), error = %e, "cannot mark the lock-owner record as ended; it is recovered once this owner is dead");
                        }
                    }
                    tracing::warn!(
                        run = %run.id, how = %how, record = %h.path.display(), in_progress = ?h.record.in_progress,
                        "terraform ended without releasing its state lock for sure: its lock-owner record is kept, and the next state-locking run in {} checks the lock first",
                        run.workdir.display()
                    );
                }
            }
        }
        if let Some(c) = run.conn {
            self.reply_exit(
                c,
                ExitNote {
                    code: exit.code(),
                    signal: exit.signal(),
                    error: None,
                    run_id: Some(run.id.clone()),
                },
            );
        }
    }

    /// A shim's connection ended while its run goes on: the run is abandoned.
    pub(super) fn detach(&mut self, id: u64) {
        let stopping = self.timeline.phase() == Phase::Stopping;
        let stop_timeout = self.cfg.stop_timeout;
        let Some(run) = self.runs.get_mut(&id) else {
            return;
        };
        run.conn = None;
        let was_paused = run.paused;
        if !run.alive() {
            self.resume(id);
            return;
        }
        tracing::info!(run = %run.id, pid = run.pid().map_or(0, |p| p.as_raw()), cwd = %run.cwd.display(), subcommand = %run.invocation.subcommand, "the shim is gone; terraform keeps running, its output is logged");
        if !stopping {
            // The caller gave up (a reconcile timeout): stop gracefully, then hard after the timeout.
            run.kill_at = Some(Instant::now() + stop_timeout);
            self.request_stop(id, "the shim that started it is gone");
        }
        if was_paused {
            self.resume(id);
        }
    }

    /// A shim forwarded a signal it received.
    pub(super) fn on_shim_signal(&mut self, id: u64, signo: i32) {
        let Some(run) = self.runs.get(&id) else {
            return;
        };
        if self.timeline.phase() == Phase::Stopping {
            tracing::info!(run = %run.id, signal = %signals::name(signo), "the shim got a signal during shutdown; the shutdown timeline decides instead");
            return;
        }
        if run.stop_requested {
            tracing::info!(run = %run.id, signal = %signals::name(signo), "the shim got another signal; terraform was already asked to stop once (a second would make it exit immediately)");
            return;
        }
        self.request_stop(id, "the shim received a stop signal");
    }

    /// The status document.
    pub(super) fn status(&self) -> protocol::Status {
        let now = Instant::now();
        let mut runs: Vec<_> = self.runs.values().map(Run::status).collect();
        runs.sort_by(|a, b| {
            a.started_unix
                .partial_cmp(&b.started_unix)
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        protocol::Status {
            v: protocol::VERSION,
            pid: std::process::id() as i32,
            phase: self.timeline.phase().as_str().to_string(),
            deadline_unix: self
                .timeline
                .deadline()
                .and_then(|(_, wall)| wall.duration_since(SystemTime::UNIX_EPOCH).ok())
                .map(|d| d.as_secs_f64()),
            seconds_left: self.timeline.seconds_left(now),
            main_pid: self.main.exit.is_none().then_some(self.main.pid.as_raw()),
            runs,
        }
    }
}
