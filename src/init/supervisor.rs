//! The loop's state: the concerns, each behind its own private fields (the timeline, the
//! controller and the other children, the clients, the runs, the records), and the descriptors
//! of the epoll set. Each input (a signal, a reaped pid, a client's request, terraform's output,
//! the recorder's news, a timer) goes to the concern it concerns; what that concern asks for comes
//! back as [`Action`]s, and [`Init::apply`] carries them out in order, queueing what comes of each
//! before the rest: the one place that signals, spawns, answers shims, changes the records and
//! hands one concern's answer to another. Only the signal forward (the hot path, `forward_now`)
//! sends a signal without an action, to keep the controller's latency to the kill itself.
//!
//! Beside this file: relay.rs (terraform's output to the shims), control.rs (the control
//! socket's clients and their requests), signalling.rs (the signals actions send, and their logs).

mod control;
mod relay;
mod signalling;

use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::signalfd::SignalFd;
use nix::unistd::Pid;

use super::action::Action;
use super::bounds;
use super::conns::{After, Conns};
use super::forward::forward_target;
use super::handoff;
use super::reaper::{self, Exit};
use super::reaping::Children;
use super::records::Records;
use super::reports::Reports;
use super::runs::Runs;
use super::setup::Mode;
use super::shutdown::Timeline;
use super::spawn;
use super::token::{self, ConnId};
use crate::config::InitConfig;
use crate::locks::names::RunId;
use crate::metrics::{Metrics, RunOutcome};
use crate::protocol::{self, ExitNote};
use crate::signals::{self, Incoming};
use crate::sys::{self, SigNo, Target};
use crate::throttle::Throttle;

/// What a forward did: the signal after rewrite, and where it went with kill(2)'s result (none
/// when there was no one to send it to).
type Forwarded = (SigNo, Option<(Target, Result<(), Errno>)>);

/// The init's state while the loop runs.
pub(super) struct Init {
    cfg: InitConfig,
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
        let budget = (cfg.grace_period, cfg.stop_timeout, cfg.kill_margin);
        Ok(Init {
            timeline: Timeline::new(budget, main_pid, mode == Mode::Pid1),
            runs: Runs::new(cfg.record_timeout, cfg.stop_timeout, cfg.max_runs),
            children: Children::new(main_pid),
            conns: Conns::new(listener, frame_limit, Arc::clone(&metrics)),
            cfg,
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
        let view = self.records.book().view(now);
        self.metrics.set_store_state(view.state);
        self.metrics.set_needing_person(view.needing_person as i64);
        self.metrics.set_heartbeat_failures(view.heartbeat_failures);
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
    /// a record's answer, a concern's answer to another's) is carried out before the actions
    /// asked after it (handoff.rs `run_queue`).
    fn apply(&mut self, actions: Vec<Action>) {
        handoff::run_queue(actions, |action, more| self.apply_one(action, more));
    }

    /// Carries out one action; what comes of it goes to `more`. Those between the runs and the
    /// records are carried out in handoff.rs (the simulation drives the same code).
    fn apply_one(&mut self, action: Action, more: &mut Vec<Action>) {
        let now = Instant::now();
        let at = (now, self.timeline.phase());
        let (runs, records) = (&mut self.runs, &mut self.records);
        let Some(action) = handoff::carry(runs, records, &self.cfg.state_dir, at, action, more)
        else {
            return;
        };
        match action {
            Action::Attach { conn, run } => self.conns.attach(conn, run),
            Action::Answer { conn, note } => more.extend(self.answer(conn, &note)),
            Action::Spawn(run) => more.extend(self.spawn_terraform(run)),
            Action::Recover(run) => more.extend(self.start_recovery(run, now)),
            Action::Adopt { pid, child } => self.children.adopt(pid, child),
            Action::CountCancel(how) => self.metrics.cancelled(how),
            Action::Tally {
                subcommand,
                outcome,
                took,
            } => self.tally(&subcommand, outcome, took),
            Action::Watch(run) => self.watch_pipes(run),
            Action::Resume(run) => self.resume(run),
            Action::Drain(run) => more.extend(self.drain(run)),
            Action::Term { run, pid, reason } => self.term(run, pid, reason),
            Action::KillGroup { run, pgid, reason } => self.kill_group(run, pgid, reason),
            Action::KillLeftovers {
                run,
                pgid,
                stopping,
            } => self.leftovers(run, pgid, stopping),
            Action::KillHelper(pid) => self.kill_helper(pid),
            Action::Signal {
                target,
                signo,
                what,
            } => self.signal(target, signo, what),
            Action::StopRuns(force) => more.extend(self.stop_runs(force)),
            Action::ControllerExited { pid, exit } => more.extend(self.main_exited(pid, exit, now)),
            Action::ShutdownBegan {
                cause,
                quiet_when_done,
            } => self.began(cause, quiet_when_done),
            // Carried out by handoff::carry above.
            Action::Record(_)
            | Action::TakeNews
            | Action::RecordTimers
            | Action::RunTimers
            | Action::Admit
            | Action::Recheck
            | Action::RefuseWaiting(_)
            | Action::Detach(_)
            | Action::TerraformExited(..)
            | Action::RecoveryExited(..) => {}
        }
    }

    /// Answers a shim with its exit note; what that means for its run comes back.
    fn answer(&mut self, conn: ConnId, note: &ExitNote) -> Option<Action> {
        self.conns.answer(conn, &self.epoll, note).action()
    }

    /// A run of `subcommand` is over: counted.
    fn tally(&self, subcommand: &str, outcome: RunOutcome, took: Duration) {
        self.metrics.run_ended(subcommand, outcome, took);
    }

    /// Starts terraform for a run in `Launching`, and tells the run how that went.
    fn spawn_terraform(&mut self, run: RunId) -> Vec<Action> {
        let Some((request, stdin)) = self.runs.launching(run) else {
            return Vec::new();
        };
        let started = spawn::terraform(request, stdin, self.records.incarnation_lock());
        // Its request is no longer held (it was dropped with the spawn): room for another.
        if let Some(conn) = self.runs.conn(run) {
            self.conns.launched(conn);
        }
        self.runs.spawned(run, started)
    }

    /// Starts a run's lock-recovery helper with what the records say now (after every records
    /// action asked before it: the live runs it must not take for dead ones), and tells the run.
    fn start_recovery(&mut self, run: RunId, now: Instant) -> Vec<Action> {
        let Some(workdir) = self.runs.workdir(run) else {
            return Vec::new();
        };
        let (args, watching) = self.records.recovery_args(self.runs.table(), workdir, now);
        let Some(request) = self.runs.request_of(run) else {
            return Vec::new();
        };
        let report_to = self.reports.as_ref().map(Reports::write_end);
        let started = spawn::recovery(request, &args, report_to);
        self.runs.recovery_started(run, &args, watching, started)
    }

    /// Takes in the recorder's news (never blocks) and carries out what it means: before anything
    /// is decided on records, so that decisions use the latest table.
    fn take_news(&mut self) {
        self.apply(vec![Action::TakeNews]);
    }

    /// The controller was reaped: the shutdown starts unless it runs already.
    fn main_exited(&mut self, pid: Pid, exit: Exit, now: Instant) -> Vec<Action> {
        tracing::info!(pid = pid.as_raw(), %exit, "controller exited");
        self.timeline.on_main_exit(now)
    }

    /// What a connection's change means for its run.
    fn after_conn(&mut self, after: After) {
        self.apply(after.action().into_iter().collect());
    }

    // ----- signals: forwarded to the controller (the hot path), or acted on -----

    /// Reads every pending signal from the signalfd, several per read(2), until none is left:
    /// a signal that came while we forwarded the last (the woken controller often runs first)
    /// is taken here, without another trip through epoll_wait and the loop's timers. True when
    /// each one was only passed on (see [`Self::on_signal`]).
    pub(super) fn on_signals(&mut self) -> bool {
        let mut batch = sys::SignalBatch::new();
        let mut only_forwarded = true;
        loop {
            match batch.read(self.sigfd.as_fd()) {
                Ok(0) => return only_forwarded,
                Ok(_) => {
                    for (signo, sender) in batch.iter() {
                        only_forwarded &= self.on_signal(signo, sender);
                    }
                }
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    if let Some(held_back) = self.warn.signals.allow(Instant::now()) {
                        tracing::warn!(error = %e, held_back, "reading the signalfd failed");
                    }
                    return only_forwarded;
                }
            }
        }
    }

    /// Acts on one signal. True when it was only passed on to the controller (or ignored), as
    /// no stop signal: nothing the timers, the runs or the records read has changed.
    fn on_signal(&mut self, signo: SigNo, sender: i32) -> bool {
        match signals::classify(signo) {
            Incoming::Child => {
                self.reap();
                false
            }
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
                self.apply(t);
                false
            }
            Incoming::Forward(s) => {
                let forwarded = self.forward_now(s);
                tracing::debug!(signal = %signals::name(s), sender, "signal received");
                // A rewrite to a stop signal stopped the controller's group (forward_now).
                let stop = matches!(signals::classify(forwarded.0), Incoming::Shutdown(_));
                self.log_forward(s, forwarded);
                !stop
            }
            Incoming::Ignore(s) => {
                tracing::debug!(signal = %signals::name(s), "signal raised by our own I/O; not forwarded");
                true
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

    // ----- reaping -----

    /// Reaps every child that exited (reaper.rs calls waitpid) and hands each exit to whose it
    /// was, one after the other.
    pub(super) fn reap(&mut self) {
        let (exits, _) = reaper::reap_all();
        self.metrics.reaped(exits.len() as u64);
        for (pid, exit) in exits {
            let acts = self.children.reaped(pid, exit);
            self.apply(acts);
        }
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
        self.take_news();
    }

    /// When the nearest timer of any concern is due, if one is set.
    pub(super) fn next_timer(&self) -> Option<Instant> {
        [
            self.timeline.next_wakeup(),
            self.records.next_wakeup(self.runs.table()),
            self.runs.next_wakeup(),
            self.conns.next_wakeup(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The epoll timeout that wakes the loop at `next` ([`Self::next_timer`]).
    pub(super) fn timeout(next: Option<Instant>) -> EpollTimeout {
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
        self.conns.client_timers(now, &self.epoll);
        let steps = self.timeline.due(now);
        self.apply(steps);
        // The records' timers, then the runs' (handoff.rs).
        self.apply(vec![Action::RecordTimers, Action::RunTimers]);
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
        let deadline = self.timeline.deadline().map(|(at, _)| at);
        self.records.settle(self.runs.records_mut(), deadline);
        self.conns.write_all_now();
        tracing::info!(exit_code = code, "tfinit exiting");
        // Straight out: the kernel closes our descriptors and frees our memory faster than
        // destructors and atexit handlers would, and a container's exit waits on us.
        sys::exit_now(code)
    }
}
