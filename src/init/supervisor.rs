//! The loop's state: the concerns, each behind its own private fields (the timeline, the
//! controller and the other children, the clients, the runs, the records), and the descriptors
//! of the epoll set. Each input (a signal, a reaped pid, a client's request, terraform's output,
//! the recorder's news, a timer) goes to the concern it concerns; what that concern asks for comes
//! back as [`Action`]s, and [`Init::apply`] carries them out: the one place that signals, spawns,
//! answers shims and queues storage work.

use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::signalfd::SignalFd;
use nix::unistd::Pid;

use super::action::Action;
use super::bounds;
use super::conns::{After, Conns, Read};
use super::forward::forward_target;
use super::reaper::{self, Exit};
use super::reaping::{Children, Reaped};
use super::records::{RecordEvent, Records};
use super::reports::Reports;
use super::runs::{CancelTarget, Force, Runs};
use super::session::{Control, Input};
use super::setup::Mode;
use super::shutdown::{Cause, Phase, Step, Timeline, Transition};
use super::token::{self, ConnId, Stream};
use super::{spawn, status};
use crate::config::InitConfig;
use crate::duration::fmt_duration;
use crate::locks::names::RunId;
use crate::metrics::Metrics;
use crate::protocol::{self, Kind, Reply};
use crate::signals::{self, Incoming};
use crate::sys::{self, SigNo, Target};
use crate::throttle::Throttle;

/// What a forward did: the signal after rewrite, and where it went with kill(2)'s result (none
/// when there was no one to send it to).
type Forwarded = (SigNo, Option<(Target, Result<(), Errno>)>);

/// The init's state while the loop runs.
pub(super) struct Init {
    cfg: InitConfig,
    /// PID 1 or subreaper.
    mode: Mode,
    /// The one epoll set.
    epoll: Epoll,
    /// Signals, blocked in every thread and read here.
    sigfd: SignalFd,
    /// The controller and the init's other children.
    children: Children,
    /// The shutdown timeline.
    timeline: Timeline,
    /// The control socket's clients.
    conns: Conns,
    /// terraform runs.
    runs: Runs,
    /// Lock-owner records: the book and the recorder.
    records: Records,
    /// The recovery helpers' report pipe (None when it could not be made: no recovery metrics).
    reports: Option<Reports>,
    /// Read buffer for terraform's output.
    scratch: Vec<u8>,
    /// What the metrics count (atomics the scraper reads).
    metrics: Arc<Metrics>,
    /// The loop's own warnings that can repeat, each kind rate-limited.
    warn: LoopWarnings,
}

/// The loop's own warnings that can repeat as fast as the loop turns or signals come (a
/// syscall failing for good, a signal that cannot be forwarded, pipes that cannot be read): each
/// kind passes a few lines a minute, so that nothing floods the log.
#[derive(Debug)]
struct LoopWarnings {
    /// epoll_wait(2) failed.
    wait: Throttle,
    /// Reading the signalfd failed.
    signals: Throttle,
    /// A signal could not be forwarded.
    forward: Throttle,
    /// terraform's output could not be watched or read.
    output: Throttle,
}

impl Default for LoopWarnings {
    fn default() -> Self {
        LoopWarnings {
            wait: Throttle::per_minute(),
            signals: Throttle::per_minute(),
            forward: Throttle::per_minute(),
            output: Throttle::per_minute(),
        }
    }
}

impl Init {
    /// Registers the signalfd, the listener and the recorder in a new epoll set.
    pub(super) fn new(
        cfg: InitConfig,
        mode: Mode,
        sigfd: SignalFd,
        listener: Option<UnixListener>,
        records: Records,
        main_pid: Pid,
        metrics: Arc<Metrics>,
    ) -> io::Result<Init> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        let watch = |fd, tok| epoll.add(fd, EpollEvent::new(EpollFlags::EPOLLIN, tok));
        watch(sigfd.as_fd(), token::TOKEN_SIGNALS)?;
        if let Some(l) = &listener {
            watch(l.as_fd(), token::TOKEN_LISTENER)?;
        }
        if let Some(fd) = records.fd() {
            watch(fd, token::TOKEN_RECORDER)?;
        }
        let reports = match Reports::new() {
            Ok(r) => watch(r.fd(), token::TOKEN_REPORTS).map(|()| r).ok(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot make the recovery helpers' report pipe: tfinit_force_unlocks_total stays 0");
                None
            }
        };
        // A request is at most what exec(2) takes for terraform's arguments and environment,
        // computed from the stack limit terraform inherits from us.
        let frame_limit = protocol::request_limit(protocol::arg_max(sys::stack_limit()));
        tracing::debug!(
            frame_limit,
            memory_bound = bounds::memory_bound(frame_limit),
            max_connections = bounds::MAX_CONNECTIONS,
            "the control socket's bounds (docs/protocol.md, Limits)"
        );
        Ok(Init {
            timeline: Timeline::new(cfg.grace_period, cfg.stop_timeout, cfg.kill_margin),
            runs: Runs::new(cfg.record_timeout, cfg.stop_timeout, cfg.max_runs),
            children: Children::new(main_pid),
            conns: Conns::new(listener, frame_limit, Arc::clone(&metrics)),
            cfg,
            mode,
            epoll,
            sigfd,
            records,
            reports,
            scratch: vec![0u8; protocol::MAX_DATA],
            metrics,
            warn: LoopWarnings::default(),
        })
    }

    /// Sets the metrics' gauges to what the concerns hold now: atomics a scrape reads, so the
    /// scraper never asks the loop for anything.
    pub(super) fn publish(&self, now: Instant) {
        self.metrics.set_runs(self.runs.counts());
        let view = self.records.view(now);
        self.metrics.set_store_state(view.state);
        self.metrics.set_needing_person(view.needing_person as i64);
        if let Some(beat) = view.heartbeat_age.and_then(|age| now.checked_sub(age)) {
            self.metrics.set_heartbeat(beat);
        }
        self.metrics.set_phase(self.timeline.phase());
        self.metrics.set_control_connections(self.conns.len());
    }

    /// epoll_wait(2) failed with `e` (never expected): said a few times a minute at most.
    pub(super) fn wait_failed(&mut self, e: Errno) {
        if let Some(held_back) = self.warn.wait.allow(Instant::now()) {
            tracing::warn!(error = %e, held_back, "epoll_wait failed; retrying");
        }
    }

    /// Waits for events until `timeout`.
    pub(super) fn wait(
        &self,
        events: &mut [EpollEvent],
        timeout: EpollTimeout,
    ) -> nix::Result<usize> {
        self.epoll.wait(events, timeout)
    }

    // ----- the one place where actions are carried out -----

    /// Does what the concerns asked, in order. What comes of an action (terraform started or not,
    /// a recorder found gone) goes back to its concern at once, and its actions come first.
    fn apply(&mut self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Attach { conn, run } => self.conns.attach(conn, run),
                Action::Answer { conn, note } => {
                    let after = self.conns.answer(conn, &self.epoll, &note);
                    self.after_conn(after);
                }
                Action::Spawn(run) => self.spawn_terraform(run),
                Action::Recover { run, args } => {
                    let Some(request) = self.runs.request_of(run) else {
                        continue;
                    };
                    let report_to = self.reports.as_ref().map(Reports::write_end);
                    let started = spawn::recovery(request, &args, report_to);
                    let now = Instant::now();
                    let more =
                        self.runs
                            .recovery_started(run, &args, started, &mut self.records, now);
                    self.apply(more);
                }
                Action::Adopt { pid, child } => self.children.adopt(pid, child),
                Action::CountCancel(how) => self.metrics.cancelled(how),
                Action::Tally {
                    subcommand,
                    outcome,
                    took,
                } => self.metrics.run_ended(&subcommand, outcome, took),
                Action::Watch(run) => self.watch_pipes(run),
                Action::Resume(run) => self.resume(run),
                Action::Drain(run) => {
                    for stream in Stream::BOTH {
                        self.drain_and_close(run, stream);
                    }
                }
                Action::Term { run, pid, reason } => self.term(run, pid, reason),
                Action::KillGroup { run, pgid, reason } => self.kill_group(run, pgid, reason),
                Action::KillLeftovers {
                    run,
                    pgid,
                    stopping,
                } => self.kill_leftovers(run, pgid, stopping),
                Action::KillHelper(pid) => {
                    let _ = sys::kill(Target::Group(pid), libc::SIGKILL);
                }
                Action::Record(request) => {
                    let events = self.records.send(request);
                    self.record_events(events);
                }
            }
        }
    }

    /// Starts terraform for a run in `Launching`, and tells the run how that went.
    fn spawn_terraform(&mut self, run: RunId) {
        let Some((request, stdin)) = self.runs.launching(run) else {
            return;
        };
        let started = spawn::terraform(request, stdin, self.records.incarnation_lock());
        // Its request is no longer held (it was dropped with the spawn): room for another.
        if let Some(conn) = self.runs.conn(run) {
            self.conns.launched(conn);
        }
        let now = Instant::now();
        let more = self.runs.spawned(run, started, &mut self.records, now);
        self.apply(more);
    }

    /// What the records say for the runs (and runs that wait for the store look again).
    fn record_events(&mut self, events: Vec<RecordEvent>) {
        let more = self
            .runs
            .on_record_events(events, &mut self.records, Instant::now());
        self.apply(more);
    }

    /// What a connection's change means for its run.
    fn after_conn(&mut self, after: After) {
        match after {
            After::Nothing => {}
            After::CaughtUp(run) => self.resume(run),
            After::Detached(run) => {
                let stopping = self.timeline.phase() == Phase::Stopping;
                let now = Instant::now();
                let more = self.runs.detach(run, now, stopping, &mut self.records);
                self.apply(more);
            }
        }
    }

    // ----- signals: forwarded to the controller (the hot path), or acted on -----

    /// Reads every pending signal from the signalfd, several per read(2), until none is left:
    /// a signal that came while we forwarded the last (the woken controller often runs first)
    /// is taken here, without another trip through epoll_wait and the loop's timers.
    pub(super) fn on_signals(&mut self) {
        let mut batch = sys::SignalBatch::new();
        loop {
            match batch.read(self.sigfd.as_fd()) {
                Ok(0) => return,
                Ok(_) => {
                    for (signo, sender) in batch.iter() {
                        self.on_signal(signo, sender);
                    }
                }
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    if let Some(held_back) = self.warn.signals.allow(Instant::now()) {
                        tracing::warn!(error = %e, held_back, "reading the signalfd failed");
                    }
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
                if matches!(forwarded, (_, Some((_, Ok(()))))) {
                    // Let the woken controller run before we spend our time slice on logs and
                    // the timeline: on a busy node it often shares our CPU (forwarding latency,
                    // benchmarks). Other signals have nothing after the kill worth a syscall.
                    std::thread::yield_now();
                }
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
    /// kill itself. Returns what was sent where, for [`Self::log_forward`].
    fn forward_now(&mut self, signo: SigNo) -> Forwarded {
        let to = self.cfg.rewrite.apply(signo);
        let main = self.children.main();
        let exited = self.children.main_exit().is_some();
        let Some(target) = forward_target(self.cfg.forward, main, exited) else {
            return (to, None);
        };
        let sent = sys::kill(target, to);
        if target == Target::Group(main) && matches!(signals::classify(to), Incoming::Shutdown(_)) {
            self.children.group_stopped();
        }
        (to, Some((target, sent)))
    }

    /// Logs what [`Self::forward_now`] did with `signo`.
    fn log_forward(&mut self, signo: SigNo, (to, sent_to): Forwarded) {
        let Some((target, sent)) = sent_to else {
            tracing::debug!(signal = %signals::name(to), "controller gone; signal not forwarded");
            return;
        };
        if sent.is_ok() {
            self.metrics.forwarded(to);
        }
        match sent {
            // A stop signal sent on is a shutdown step: logged at info like the others.
            Ok(()) if matches!(signals::classify(signo), Incoming::Shutdown(_)) => {
                let (phase, left) = self.timeline.when(Instant::now());
                tracing::info!(signal = %signals::name(to), %target, phase, seconds_left = left, "signal forwarded")
            }
            Ok(()) => tracing::debug!(signal = %signals::name(to), %target, "signal forwarded"),
            Err(Errno::ESRCH) => {
                tracing::debug!(signal = %signals::name(to), %target, "nothing to forward to")
            }
            Err(e) => {
                if let Some(held_back) = self.warn.forward.allow(Instant::now()) {
                    tracing::warn!(signal = %signals::name(to), %target, error = %e, held_back, "forwarding failed")
                }
            }
        }
    }

    /// Carries out one step of the shutdown timeline.
    fn transition(&mut self, t: Transition) {
        let left = self.timeline.seconds_left(Instant::now()).unwrap_or(0.0);
        match t {
            Transition::Began(cause) => {
                if let Some(why) = self.timeline.refusal() {
                    let refused = self.runs.refuse_waiting(why, &mut self.records);
                    self.apply(refused);
                }
                let main = self.children.main();
                if cause == Cause::MainExited && self.runs.is_empty() && !sys::group_alive(main) {
                    // Nothing is left to stop: the init exits right away (its exit is logged).
                    return;
                }
                tracing::info!(
                    phase = Phase::Stopping.as_str(),
                    cause = cause.as_str(),
                    grace_period = %fmt_duration(self.cfg.grace_period),
                    runs = self.runs.len(),
                    seconds_left = left,
                    "shutdown: new terraform runs are refused; runs in flight get SIGTERM {} before the deadline and SIGKILL {} before it",
                    fmt_duration(self.cfg.stop_timeout),
                    fmt_duration(self.cfg.kill_margin),
                );
            }
            Transition::Graceful => {
                self.log_step(
                    Step::Graceful,
                    left,
                    "asking terraform runs to stop gracefully",
                );
                let stops = self
                    .runs
                    .stop_all(Force::Graceful, "shutdown deadline approaching");
                self.apply(stops);
            }
            Transition::Kill => {
                self.log_step(Step::Kill, left, "SIGKILL to everything left");
                let kills = self.runs.stop_all(Force::Kill, "shutdown deadline");
                self.apply(kills);
                let main = self.children.main();
                if sys::group_alive(main) {
                    self.signal(
                        Target::Group(main),
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

    fn log_step(&self, step: Step, left: f64, what: &str) {
        tracing::info!(
            phase = Phase::Stopping.as_str(),
            step = step.as_str(),
            runs = self.runs.len(),
            seconds_left = left,
            "{what}"
        );
    }

    /// Signals `target` (the controller's group, everyone) and logs it.
    fn signal(&self, target: Target, signo: SigNo, what: &str) {
        let (phase, left) = self.timeline.when(Instant::now());
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

    /// terraform's one graceful SIGTERM (to its own pid, never its group).
    fn term(&self, run: RunId, pid: Pid, reason: &str) {
        let (phase, left) = self.timeline.when(Instant::now());
        let (cwd, subcommand, _) = self.runs.named(run).unwrap_or((Path::new(""), "", None));
        match sys::kill(Target::Pid(pid), libc::SIGTERM) {
            Ok(()) => tracing::info!(
                run = %run, pid = pid.as_raw(), cwd = %cwd.display(), subcommand,
                phase, seconds_left = left, reason, "SIGTERM to terraform (graceful stop: it finishes operations in flight, saves state, releases the lock)"
            ),
            Err(e) => {
                tracing::warn!(run = %run, pid = pid.as_raw(), error = %e, "SIGTERM to terraform failed")
            }
        }
    }

    /// SIGKILL to a run's process group, when anything is left in it.
    fn kill_group(&self, run: RunId, pgid: Pid, reason: &str) {
        if !sys::group_alive(pgid) {
            return;
        }
        let (phase, left) = self.timeline.when(Instant::now());
        let (cwd, subcommand, in_progress) =
            self.runs.named(run).unwrap_or((Path::new(""), "", None));
        match sys::kill(Target::Group(pgid), libc::SIGKILL) {
            Ok(()) => tracing::info!(
                run = %run, pid = pgid.as_raw(), pgid = pgid.as_raw(), cwd = %cwd.display(), subcommand,
                phase, seconds_left = left, reason, in_progress = ?in_progress,
                "SIGKILL to terraform's process group"
            ),
            Err(e) => {
                tracing::warn!(run = %run, error = %e, "SIGKILL to terraform's group failed")
            }
        }
    }

    /// SIGKILL to what terraform left in its process group after it exited.
    fn kill_leftovers(&self, run: RunId, pgid: Pid, stopping: bool) {
        if !sys::group_alive(pgid) {
            return;
        }
        match sys::kill(Target::Group(pgid), libc::SIGKILL) {
            Ok(()) if stopping => {
                let (phase, left) = self.timeline.when(Instant::now());
                tracing::info!(
                    run = %run, pgid = pgid.as_raw(), phase, seconds_left = left,
                    "SIGKILL to what terraform left in its process group"
                )
            }
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(e) => {
                tracing::warn!(run = %run, pgid = pgid.as_raw(), error = %e, "SIGKILL to terraform's leftovers failed")
            }
        }
    }

    // ----- reaping -----

    /// Reaps every child that exited (reaper.rs calls waitpid) and hands each exit on.
    pub(super) fn reap(&mut self) {
        let (exits, _) = reaper::reap_all();
        self.metrics.reaped(exits.len() as u64);
        for (pid, exit) in exits {
            match self.children.reaped(pid, exit) {
                Reaped::Controller {
                    exit,
                    stop_leftovers,
                } => self.on_main_exit(pid, exit, stop_leftovers),
                Reaped::Terraform(run, exit) => {
                    let stopping = self.timeline.phase() == Phase::Stopping;
                    let now = Instant::now();
                    let more =
                        self.runs
                            .terraform_exited(run, exit, stopping, &mut self.records, now);
                    self.apply(more);
                }
                Reaped::Recovery(run, exit) => {
                    // The latest table first: the run's lock check may come next.
                    let now = Instant::now();
                    let news = self.records.take_news(now);
                    self.record_events(news);
                    let refusal = self.timeline.refusal();
                    let more =
                        self.runs
                            .recovery_exited(run, exit, refusal, &mut self.records, now);
                    self.apply(more);
                }
                Reaped::Orphan => tracing::debug!(pid = pid.as_raw(), %exit, "reaped"),
            }
        }
    }

    /// The controller exited: the timeline starts unless it runs already, and what the
    /// controller left in its group gets one SIGTERM unless the group got a stop signal.
    fn on_main_exit(&mut self, pid: Pid, exit: Exit, stop_leftovers: bool) {
        tracing::info!(pid = pid.as_raw(), %exit, "controller exited");
        if let Some(t) = self.timeline.on_main_exit(Instant::now()) {
            self.transition(t);
        }
        // Also when the timeline was already running on a signal that may not have reached the
        // group (TFINIT_FORWARD=child).
        if stop_leftovers && sys::group_alive(pid) {
            self.signal(
                Target::Group(pid),
                libc::SIGTERM,
                "controller's leftover processes",
            );
        }
    }

    // ----- clients of the control socket -----

    /// Accepts every pending client.
    pub(super) fn accept_all(&mut self) {
        self.conns.accept_all(&self.epoll);
    }

    /// A client socket is readable, writable or hung up.
    pub(super) fn on_conn(&mut self, id: ConnId, flags: EpollFlags) {
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
                    let news = self.records.take_news(now);
                    self.record_events(news);
                    let phase = self.timeline.phase();
                    let acts = self
                        .runs
                        .request(id, request, stdin, phase, &mut self.records, now);
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
            Control::Metrics => {
                let now = Instant::now();
                let news = self.records.take_news(now);
                self.record_events(news);
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
                return;
            }
            Control::Status => None,
            Control::Drain => {
                if self.timeline.drain() {
                    tracing::info!(
                        phase = Phase::Draining.as_str(),
                        runs = self.runs.len(),
                        "draining: new terraform runs are refused until `tfinit resume`"
                    );
                    if let Some(why) = self.timeline.refusal() {
                        let refused = self.runs.refuse_waiting(why, &mut self.records);
                        self.apply(refused);
                    }
                }
                None
            }
            Control::Resume => {
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
            Control::Cancel { target, force } => match self.cancel(&target, force) {
                Ok(lines) => {
                    cancelled = lines;
                    None
                }
                Err(e) => Some(e),
            },
        };
        // The heartbeat's age as of the recorder's latest (quiet) news.
        let now = Instant::now();
        let news = self.records.take_news(now);
        self.record_events(news);
        let reply = Reply {
            v: protocol::VERSION,
            ok: error.is_none(),
            error,
            status: Some(status::document(
                &self.timeline,
                &self.children,
                &self.records.view(now),
                &self.runs,
                now,
            )),
            metrics: None,
            cancelled,
        };
        let after = self.conns.reply(id, &self.epoll, &reply);
        self.after_conn(after);
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
        let now = Instant::now();
        let (acts, done) = self.runs.cancel(target, force, &mut self.records, now)?;
        self.apply(acts);
        Ok(done)
    }

    // ----- the output relay: terraform's pipes to the shim (or the log) -----

    /// Puts a run's open pipes in the epoll set.
    fn watch_pipes(&mut self, id: RunId) {
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
    fn resume(&mut self, id: RunId) {
        if self.runs.unpause(id) {
            self.watch_pipes(id);
        }
    }

    /// A run's pipe is readable: relays what it holds.
    pub(super) fn on_output(&mut self, id: RunId, stream: Stream) {
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
                    return self.close_pipe(id, stream);
                }
                Ok(n) => self.deliver(id, stream, n),
                Err(Errno::EAGAIN) => break,
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    if let Some(held_back) = self.warn.output.allow(Instant::now()) {
                        tracing::warn!(run = %id, stream = stream.as_str(), error = %e, held_back, "reading terraform's output failed; closing it");
                    }
                    return self.close_pipe(id, stream);
                }
            }
        }
        if let Some(c) = self.runs.conn(id) {
            let after = self.conns.flush(c, &self.epoll);
            self.after_conn(after);
        }
    }

    /// Hands `self.scratch[..n]`, just read from a run's pipe, to the run (its follower, or the
    /// log when no shim is attached) and to its shim.
    fn deliver(&mut self, id: RunId, stream: Stream, n: usize) {
        let bytes = &self.scratch[..n];
        let attached = self.runs.conn(id).filter(|c| self.conns.contains(*c));
        let progress = self
            .runs
            .output(id, stream, bytes, attached.is_some(), &self.records);
        if let Some(c) = attached {
            let kind = match stream {
                Stream::Stdout => Kind::Stdout,
                Stream::Stderr => Kind::Stderr,
            };
            self.conns.queue(c, kind, bytes);
        }
        if let Some(p) = progress {
            self.apply(vec![Action::Record(p)]);
        }
    }

    /// Closes a pipe of a run whose terraform has exited, after reading what is left in it
    /// however far the shim lags: nothing terraform wrote is lost (bounded by the pipe's size,
    /// plus whatever a leftover grandchild writes meanwhile).
    fn drain_and_close(&mut self, id: RunId, stream: Stream) {
        for _ in 0..64 {
            let Some(fd) = self.runs.pipe(id, stream) else {
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
        self.runs.flush_detached(id, stream);
        self.close_pipe(id, stream);
    }

    /// Closes one of a run's pipes; the run ends once both are closed and terraform was reaped.
    fn close_pipe(&mut self, id: RunId, stream: Stream) {
        let Some((fd, paused)) = self.runs.take_pipe(id, stream) else {
            return;
        };
        if !paused {
            let _ = self.epoll.delete(&fd);
        }
        drop(fd);
        let more = self.runs.pipe_closed(id, &mut self.records);
        self.apply(more);
    }

    // ----- the recorder and the timers -----

    /// The report pipe is readable: count what the recovery helpers decided (never blocks).
    pub(super) fn on_reports(&mut self) {
        let Some(reports) = &mut self.reports else {
            return;
        };
        for r in reports.take(&mut self.scratch) {
            if let Some(outcome) = r.outcome {
                self.metrics.recovered(r.backend, outcome, r.orphans);
            }
            let Some(w) = &r.unknown_wording else {
                continue;
            };
            self.metrics.unknown_wording(r.backend);
            // Its helper runs before every run in that directory: once per record is enough.
            if reports.first_time_unknown(&w.record) {
                tracing::warn!(
                    record = %w.record, workdir = %w.workdir, backend = %r.backend_name, probe = %w.said,
                    "terraform answered the lock probe for the record {} in a wording this tfinit does not know, so it cannot tell whether the lock is free: the record is kept, and every run in {} probes again first (said once per record; tfinit_lock_probe_unknown_wording_total counts each probe). Upgrade tfinit, or report the wording with your terraform version: {}",
                    w.record, w.workdir, w.said
                );
            }
        }
    }

    /// The recorder's eventfd is readable: take in what it did (never blocks).
    pub(super) fn on_recorder(&mut self) {
        let news = self.records.take_news(Instant::now());
        self.record_events(news);
    }

    /// The epoll timeout: until the nearest timer, or forever.
    pub(super) fn timeout(&self) -> EpollTimeout {
        let next = [
            self.timeline.next_wakeup(),
            self.records.next_wakeup(),
            self.runs.next_wakeup(),
            self.conns.next_wakeup(),
        ]
        .into_iter()
        .flatten()
        .min();
        match next {
            None => EpollTimeout::NONE,
            Some(t) => {
                let ms = t
                    .saturating_duration_since(Instant::now())
                    .as_millis()
                    .min(60_000) as u16;
                // Round up so we do not wake a millisecond early and spin.
                EpollTimeout::from(ms.saturating_add(1))
            }
        }
    }

    /// Acts on every timer that is due at `now`: the timeline's steps, the records' (the
    /// heartbeat, records that do not land in time), the runs' (waits for the store,
    /// abandoned runs' SIGKILL, the linger of pipes after terraform exited), and the clients'
    /// (requests not whole in time, accepting again after accept(2) failed).
    pub(super) fn on_timers(&mut self, now: Instant) {
        self.conns.tick(now, &self.epoll);
        while let Some(t) = self.timeline.due(now) {
            self.transition(t);
        }
        // The recorder's quiet news first (heartbeats that went well): a stale heartbeat is
        // judged on the latest.
        let mut events = self.records.take_news(now);
        events.extend(self.records.tick(now));
        self.record_events(events);
        let acts = self.runs.tick(&mut self.records, &self.cfg.state_dir, now);
        self.apply(acts);
    }

    // ----- the end -----

    /// Whether the init may exit now, and with which code: the controller is gone, no run is left,
    /// and the controller's process group is empty. Never waits for a timer.
    pub(super) fn finished(&self) -> Option<i32> {
        let exit = self.children.main_exit()?;
        if !self.runs.is_empty() || sys::group_alive(self.children.main()) {
            return None;
        }
        Some(exit.code())
    }

    /// Exits the process with `code`, after the last record writes (bounded) and one last
    /// non-blocking attempt to deliver queued frames (exit codes) to shims.
    pub(super) fn exit(&mut self, code: i32) -> ! {
        self.records
            .settle(self.timeline.deadline().map(|(at, _)| at));
        self.conns.write_all_now();
        tracing::info!(exit_code = code, "tfinit exiting");
        // Straight out: the kernel closes our descriptors and frees our memory faster than
        // destructors and atexit handlers would, and a container's exit waits on us.
        sys::exit_now(code)
    }
}
