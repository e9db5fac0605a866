//! Prometheus metrics of the init and its terraform runs (`TFINIT_METRICS_ADDR`, `tfinit metrics`).
//!
//! The loop records what happens (a run ended, a zombie reaped, a signal forwarded) into
//! counters, gauges and histograms made of atomics, with every label set created up front: a
//! record never allocates and never waits on the scraper. The scraper (the HTTP thread, or the
//! loop answering `tfinit metrics`) encodes them with the `prometheus-client` crate, in the
//! OpenMetrics text format that Prometheus scrapes (`application/openmetrics-text`).
//!
//! Names follow Prometheus conventions: one `tfinit_` prefix, base units (`_seconds`), counters
//! end in `_total`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use prometheus_client::encoding::{
    EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::init::shutdown::Phase;
use crate::locks::labels::{Backend, StoreStatus, UnlockOutcome};
use crate::sys::SigNo;

/// Encodes label enums by the text their owner gives them (`label`, or `as_str` for [`Phase`]),
/// so a label set holds the enum and a record compares no text.
macro_rules! label_value {
    ($($ty:ty => $text:ident),* $(,)?) => {$(
        impl EncodeLabelValue for $ty {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
                std::fmt::Write::write_str(encoder, self.$text())
            }
        }
    )*};
}

label_value!(
    Outcome => label,
    RunState => label,
    Cancel => label,
    Listener => label,
    Pause => label,
    Dropped => label,
    UnlockOutcome => label,
    Backend => label,
    StoreStatus => label,
    Phase => as_str,
);

/// How a run ended, as `tfinit_runs_total{outcome}` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// terraform exited 0.
    Succeeded,
    /// terraform exited with another code.
    Failed,
    /// terraform died of a signal nobody in tfinit sent (the OOM killer, a person).
    Signalled,
    /// terraform ended after its one graceful SIGTERM (shutdown, cancel, an abandoned shim, the
    /// heartbeat fence).
    StoppedGracefully,
    /// terraform's group was SIGKILLed by tfinit.
    Killed,
    /// the init refused to start it (draining, shutting down): exit code 75.
    Refused,
}

impl Outcome {
    /// Its label value.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Signalled => "signalled",
            Outcome::StoppedGracefully => "stopped_gracefully",
            Outcome::Killed => "killed",
            Outcome::Refused => "refused",
        }
    }
}

/// A run's state, as `tfinit_runs{state}` counts the runs in each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunState {
    /// Waiting for a lock recovery in its directory (or for the store to tell whether one is
    /// needed).
    Recovering,
    /// Waiting for its lock-owner record.
    Recording,
    /// Waiting for a place under TFINIT_MAX_RUNS.
    Queued,
    /// terraform runs.
    Running,
    /// terraform runs and was asked to stop (its graceful SIGTERM) or killed.
    Stopping,
}

impl RunState {
    /// Its label value.
    pub fn label(self) -> &'static str {
        match self {
            RunState::Recovering => "recovering",
            RunState::Recording => "recording",
            RunState::Queued => "queued",
            RunState::Running => "running",
            RunState::Stopping => "stopping",
        }
    }

    /// Every state, in the order of [`RunCounts`].
    pub const ALL: [RunState; 5] = [
        RunState::Recovering,
        RunState::Recording,
        RunState::Queued,
        RunState::Running,
        RunState::Stopping,
    ];
}

/// How many runs are in each [`RunState`], in the order of [`RunState::ALL`].
pub type RunCounts = [i64; 5];

/// How a cancel was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cancel {
    /// The one graceful SIGTERM.
    Graceful,
    /// SIGKILL of the run's group.
    Force,
}

impl Cancel {
    /// Its label value.
    pub fn label(self) -> &'static str {
        match self {
            Cancel::Graceful => "graceful",
            Cancel::Force => "force",
        }
    }
}

/// Which listening socket, as `tfinit_accept_pauses_total{listener}` and
/// `tfinit_connections_dropped_total{listener}` name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Listener {
    /// The control socket (shims, `tfinit status`...).
    Control,
    /// The metrics server (TFINIT_METRICS_ADDR).
    Metrics,
}

impl Listener {
    /// Its label value.
    pub fn label(self) -> &'static str {
        match self {
            Listener::Control => "control",
            Listener::Metrics => "metrics",
        }
    }
}

/// Why a listener stopped accepting for a while (clients waited in the listen queue), as
/// `tfinit_accept_pauses_total{reason}` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pause {
    /// As many connections are open as the listener serves.
    Connections,
    /// accept(2) failed for want of descriptors (EMFILE, ENFILE).
    Descriptors,
    /// accept(2) failed otherwise (ENOMEM, ENOBUFS...).
    Error,
}

impl Pause {
    /// Its label value.
    pub fn label(self) -> &'static str {
        match self {
            Pause::Connections => "connections",
            Pause::Descriptors => "descriptors",
            Pause::Error => "error",
        }
    }
}

/// Why the init closed a client before serving it, as `tfinit_connections_dropped_total{reason}`
/// names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dropped {
    /// Its request (or, for the metrics server, the whole exchange) did not end in time.
    Deadline,
    /// Its request did not fit in the memory the init keeps for requests.
    Memory,
    /// The metrics server closed its oldest connection to serve a new one.
    Evicted,
}

impl Dropped {
    /// Its label value.
    pub fn label(self) -> &'static str {
        match self {
            Dropped::Deadline => "deadline",
            Dropped::Memory => "memory",
            Dropped::Evicted => "evicted",
        }
    }
}

/// The subcommands `tfinit_runs_total` and the duration histogram name; anything else is
/// `other`, so a typo in a controller cannot grow the label set without bound.
const SUBCOMMANDS: [&str; 38] = [
    "apply",
    "console",
    "destroy",
    "env delete",
    "env list",
    "env new",
    "env select",
    "fmt",
    "force-unlock",
    "get",
    "graph",
    "import",
    "init",
    "login",
    "logout",
    "output",
    "plan",
    "providers",
    "refresh",
    "show",
    "state list",
    "state mv",
    "state pull",
    "state push",
    "state replace-provider",
    "state rm",
    "state show",
    "taint",
    "test",
    "untaint",
    "validate",
    "version",
    "workspace delete",
    "workspace list",
    "workspace new",
    "workspace select",
    "workspace show",
    "other",
];

/// The label `subcommand`: one of [`SUBCOMMANDS`].
pub fn subcommand_label(subcommand: &str) -> &'static str {
    SUBCOMMANDS
        .iter()
        .find(|s| **s == subcommand)
        .copied()
        .unwrap_or("other")
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RunLabels {
    subcommand: &'static str,
    outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct SubcommandLabels {
    subcommand: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StateLabels {
    state: RunState,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct SignalLabels {
    signal: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct UnlockLabels {
    backend: Backend,
    outcome: UnlockOutcome,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct NameLabels {
    state: StoreStatus,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct BackendLabels {
    backend: Backend,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PhaseLabels {
    phase: Phase,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CancelLabels {
    how: Cancel,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PauseLabels {
    listener: Listener,
    reason: Pause,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DroppedLabels {
    listener: Listener,
    reason: Dropped,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct VersionLabels {
    version: &'static str,
}

/// Signals `tfinit_signals_forwarded_total{signal}` names by their own name: the catchable ones
/// the init forwards. Real-time signals are counted as `SIGRTMIN+N` up to 32 ([`RT_NAMES`]); any
/// other is `other`.
const FORWARDED: [Signal; 18] = [
    Signal::SIGHUP,
    Signal::SIGINT,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGTERM,
    Signal::SIGWINCH,
    Signal::SIGCONT,
    Signal::SIGALRM,
    Signal::SIGURG,
    Signal::SIGTSTP,
    Signal::SIGPROF,
    Signal::SIGVTALRM,
    Signal::SIGIO,
    Signal::SIGPWR,
    Signal::SIGXCPU,
    Signal::SIGXFSZ,
    Signal::SIGSTKFLT,
];

/// The label `signal` of `signo`: its name when the init forwards it, `other` otherwise.
fn signal_label(signo: SigNo) -> &'static str {
    if let Ok(s) = Signal::try_from(signo) {
        return if FORWARDED.contains(&s) {
            s.as_str()
        } else {
            "other"
        };
    }
    let rt = signo.checked_sub(crate::sys::sigrtmin());
    match rt.and_then(|n| usize::try_from(n).ok()) {
        Some(n) if signo <= crate::sys::sigrtmax() => RT_NAMES.get(n).copied().unwrap_or("other"),
        _ => "other",
    }
}

const RT_NAMES: [&str; 33] = [
    "SIGRTMIN",
    "SIGRTMIN+1",
    "SIGRTMIN+2",
    "SIGRTMIN+3",
    "SIGRTMIN+4",
    "SIGRTMIN+5",
    "SIGRTMIN+6",
    "SIGRTMIN+7",
    "SIGRTMIN+8",
    "SIGRTMIN+9",
    "SIGRTMIN+10",
    "SIGRTMIN+11",
    "SIGRTMIN+12",
    "SIGRTMIN+13",
    "SIGRTMIN+14",
    "SIGRTMIN+15",
    "SIGRTMIN+16",
    "SIGRTMIN+17",
    "SIGRTMIN+18",
    "SIGRTMIN+19",
    "SIGRTMIN+20",
    "SIGRTMIN+21",
    "SIGRTMIN+22",
    "SIGRTMIN+23",
    "SIGRTMIN+24",
    "SIGRTMIN+25",
    "SIGRTMIN+26",
    "SIGRTMIN+27",
    "SIGRTMIN+28",
    "SIGRTMIN+29",
    "SIGRTMIN+30",
    "SIGRTMIN+31",
    "SIGRTMIN+32",
];

/// Buckets of `tfinit_run_duration_seconds`: from a `version` to a long apply.
const DURATION_BUCKETS: [f64; 14] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];

/// Every metric of the init. Shared (`Arc`) between the loop, which records, and the scraper.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    runs_total: Family<RunLabels, Counter>,
    run_duration: Family<SubcommandLabels, Histogram, fn() -> Histogram>,
    runs: Family<StateLabels, Gauge>,
    zombies: Counter,
    signals: Family<SignalLabels, Counter>,
    force_unlocks: Family<UnlockLabels, Counter>,
    unknown_wordings: Family<BackendLabels, Counter>,
    needing_person: Gauge,
    orphan_candidates: Counter,
    store_state: Family<NameLabels, Gauge>,
    shutdown_phase: Family<PhaseLabels, Gauge>,
    cancels: Family<CancelLabels, Counter>,
    accept_pauses: Family<PauseLabels, Counter>,
    dropped: Family<DroppedLabels, Counter>,
    control_connections: Gauge,
    heartbeat: Arc<HeartbeatAge>,
}

/// `tfinit_heartbeat_age_seconds`, computed at each scrape from when the last heartbeat that
/// landed was written (so an idle init needs no timer to keep it current).
#[derive(Debug)]
struct HeartbeatAge {
    /// Nanoseconds from `base` to the last good heartbeat's start, plus one (0: none yet).
    at_ns: AtomicU64,
    base: Instant,
}

impl prometheus_client::collector::Collector for HeartbeatAge {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        let at = self.at_ns.load(Ordering::Relaxed);
        if at == 0 {
            return Ok(());
        }
        let beat = self.base + Duration::from_nanos(at - 1);
        let age = ConstGauge::new(Instant::now().saturating_duration_since(beat).as_secs_f64());
        let m = encoder.encode_descriptor(
            "heartbeat_age_seconds",
            "Age of this owner's last heartbeat that landed in TFINIT_STATE_DIR",
            None,
            age.metric_type(),
        )?;
        age.encode(m)
    }
}

impl Metrics {
    /// Every metric at zero, every label set created, for tfinit `version`. The recovery families
    /// are kept but not registered (not served) until the init feeds them: a series that never
    /// moves would mislead an alert.
    pub fn new(version: &'static str) -> Metrics {
        let mut registry = Registry::with_prefix("tfinit");
        let runs_total = Family::<RunLabels, Counter>::default();
        let run_duration: Family<SubcommandLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(|| Histogram::new(DURATION_BUCKETS));
        let runs = Family::<StateLabels, Gauge>::default();
        let zombies = Counter::default();
        let signals = Family::<SignalLabels, Counter>::default();
        let force_unlocks = Family::<UnlockLabels, Counter>::default();
        let unknown_wordings = Family::<BackendLabels, Counter>::default();
        let needing_person = Gauge::default();
        let orphan_candidates = Counter::default();
        let store_state = Family::<NameLabels, Gauge>::default();
        let shutdown_phase = Family::<PhaseLabels, Gauge>::default();
        let cancels = Family::<CancelLabels, Counter>::default();
        let accept_pauses = Family::<PauseLabels, Counter>::default();
        let dropped = Family::<DroppedLabels, Counter>::default();
        let control_connections = Gauge::default();
        // The small families' label sets now (a record then never takes their write lock). The
        // per-subcommand and per-signal ones are made at first use: made up front they would
        // cost about 300 KiB of an idle init's memory (measured), for series that mostly stay 0.
        for state in RunState::ALL {
            let _ = runs.get_or_create(&StateLabels { state });
        }
        // tfinit_force_unlocks_total's series are made at first use too (90 label sets).
        for state in StoreStatus::ALL {
            let _ = store_state.get_or_create(&NameLabels { state });
        }
        for phase in Phase::ALL {
            let _ = shutdown_phase.get_or_create(&PhaseLabels { phase });
        }
        shutdown_phase
            .get_or_create(&PhaseLabels {
                phase: Phase::Running,
            })
            .set(1);
        for how in [Cancel::Graceful, Cancel::Force] {
            let _ = cancels.get_or_create(&CancelLabels { how });
        }
        registry.register(
            "runs",
            "terraform runs that ended, by subcommand and how they ended",
            runs_total.clone(),
        );
        registry.register(
            "run_duration_seconds",
            "How long terraform runs took, from the shim's request to terraform's exit",
            run_duration.clone(),
        );
        registry.register("runs", "terraform runs now, by state", runs.clone());
        registry.register(
            "zombies_reaped",
            "Processes the init reaped (terraform, the controller, adopted orphans)",
            zombies.clone(),
        );
        registry.register(
            "signals_forwarded",
            "Signals the init forwarded to the controller, by signal (after any rewrite)",
            signals.clone(),
        );
        registry.register(
            "records_store_state",
            "State of the lock-owner records store (1 for the current state)",
            store_state.clone(),
        );
        registry.register(
            "shutdown_phase",
            "Phase of the init (1 for the current phase)",
            shutdown_phase.clone(),
        );
        registry.register(
            "force_unlocks",
            "Records a lock recovery decided on, by the working directory's backend and the outcome (unlocked: its dead run's lock was force-unlocked)",
            force_unlocks.clone(),
        );
        registry.register(
            "lock_probe_unknown_wording",
            "Lock probes whose answer terraform gave in a wording this tfinit does not know (it cannot tell whether the lock is free, so the record stays), by the working directory's backend",
            unknown_wordings.clone(),
        );
        registry.register(
            "recoveries_needing_a_person",
            "Records whose lock no terraform command can release (its state is missing): a person must run the command the log gives",
            needing_person.clone(),
        );
        registry.register(
            "orphan_candidates",
            "Resources dead runs had in progress when their records were recovered: each may exist in the cloud without being in the state",
            orphan_candidates.clone(),
        );
        registry.register(
            "cancels",
            "Runs `tfinit cancel` acted on, by how (graceful: the one SIGTERM; force: SIGKILL)",
            cancels.clone(),
        );
        registry.register(
            "accept_pauses",
            "Times a listener stopped accepting for a while (clients wait in its listen queue meanwhile), by listener and why (connections: at its cap; descriptors: out of file descriptors)",
            accept_pauses.clone(),
        );
        registry.register(
            "connections_dropped",
            "Clients closed before they were served, by listener and why (deadline: too slow; memory: their request did not fit; evicted: the metrics server's oldest, for a new one)",
            dropped.clone(),
        );
        registry.register(
            "control_connections",
            "Client connections open on the control socket",
            control_connections.clone(),
        );
        registry.register(
            "build",
            "The tfinit build",
            Info::new(VersionLabels { version }),
        );
        let now = Instant::now();
        let heartbeat = Arc::new(HeartbeatAge {
            at_ns: AtomicU64::new(0),
            // Early enough for any heartbeat this process will report.
            base: now.checked_sub(Duration::from_secs(3600)).unwrap_or(now),
        });
        registry.register_collector(Box::new(heartbeat.clone()));
        Metrics {
            registry,
            runs_total,
            run_duration,
            runs,
            zombies,
            signals,
            force_unlocks,
            unknown_wordings,
            needing_person,
            orphan_candidates,
            store_state,
            shutdown_phase,
            cancels,
            accept_pauses,
            dropped,
            control_connections,
            heartbeat,
        }
    }

    /// A run of `subcommand` ended with `outcome` after `took` (refused runs count with a zero
    /// duration, and are not observed in the histogram).
    pub fn run_ended(&self, subcommand: &str, outcome: Outcome, took: Duration) {
        let subcommand = subcommand_label(subcommand);
        self.runs_total
            .get_or_create(&RunLabels {
                subcommand,
                outcome,
            })
            .inc();
        if outcome != Outcome::Refused {
            self.run_duration
                .get_or_create(&SubcommandLabels { subcommand })
                .observe(took.as_secs_f64());
        }
    }

    /// How many runs are in each state now.
    pub fn set_runs(&self, counts: RunCounts) {
        for (state, n) in RunState::ALL.into_iter().zip(counts) {
            self.runs.get_or_create(&StateLabels { state }).set(n);
        }
    }

    /// `n` processes were reaped.
    pub fn reaped(&self, n: u64) {
        self.zombies.inc_by(n);
    }

    /// Signal `signo` was forwarded.
    pub fn forwarded(&self, signo: SigNo) {
        let signal = signal_label(signo);
        self.signals.get_or_create(&SignalLabels { signal }).inc();
    }

    /// A recovery of one record ended with `outcome` on `backend`, and named `orphans` resources
    /// in progress.
    pub fn recovered(&self, backend: Backend, outcome: UnlockOutcome, orphans: u64) {
        self.force_unlocks
            .get_or_create(&UnlockLabels { backend, outcome })
            .inc();
        if outcome.releases() {
            self.orphan_candidates.inc_by(orphans);
        }
    }

    /// A lock probe on `backend` answered in a wording tfinit does not know.
    pub fn unknown_wording(&self, backend: Backend) {
        self.unknown_wordings
            .get_or_create(&BackendLabels { backend })
            .inc();
    }

    /// Records that wait for a person now.
    pub fn set_needing_person(&self, n: i64) {
        self.needing_person.set(n);
    }

    /// The records store is in `state`.
    pub fn set_store_state(&self, state: StoreStatus) {
        for s in StoreStatus::ALL {
            self.store_state
                .get_or_create(&NameLabels { state: s })
                .set(i64::from(s == state));
        }
    }

    /// The last heartbeat that landed was written at `at`.
    pub fn set_heartbeat(&self, at: Instant) {
        let ns = at.saturating_duration_since(self.heartbeat.base).as_nanos() as u64;
        self.heartbeat.at_ns.store(ns + 1, Ordering::Relaxed);
    }

    /// The init is in `phase`.
    pub(crate) fn set_phase(&self, phase: Phase) {
        for p in Phase::ALL {
            self.shutdown_phase
                .get_or_create(&PhaseLabels { phase: p })
                .set(i64::from(p == phase));
        }
    }

    /// A run was cancelled.
    pub fn cancelled(&self, how: Cancel) {
        self.cancels.get_or_create(&CancelLabels { how }).inc();
    }

    /// `listener` stopped accepting for a while, for `why`.
    pub fn accept_paused(&self, listener: Listener, why: Pause) {
        self.accept_pauses
            .get_or_create(&PauseLabels {
                listener,
                reason: why,
            })
            .inc();
    }

    /// A client of `listener` was closed before it was served, for `why`.
    pub fn dropped(&self, listener: Listener, why: Dropped) {
        self.dropped
            .get_or_create(&DroppedLabels {
                listener,
                reason: why,
            })
            .inc();
    }

    /// `n` client connections are open on the control socket.
    pub fn set_control_connections(&self, n: usize) {
        self.control_connections.set(n as i64);
    }

    /// Every metric, in the OpenMetrics text format (ends with `# EOF`).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(16 << 10);
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The Content-Type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn every_series_moves_with_what_it_counts() {
        let m = Metrics::new("1.2.3");
        let t = m.render();
        assert!(t.ends_with("# EOF\n"), "{t}");
        assert!(t.contains("tfinit_build_info{version=\"1.2.3\"} 1"), "{t}");
        let ok = "tfinit_runs_total{subcommand=\"apply\",outcome=\"succeeded\"}";
        assert_eq!(value(&t, ok), None, "made at first use: {t}");
        m.run_ended("apply", Outcome::Succeeded, Duration::from_secs(3));
        m.run_ended("frobnicate", Outcome::Failed, Duration::from_millis(10));
        m.run_ended("plan", Outcome::Refused, Duration::ZERO);
        m.reaped(3);
        m.forwarded(libc::SIGTERM);
        m.forwarded(crate::sys::sigrtmin() + 3);
        m.forwarded(libc::SIGCHLD);
        m.recovered(Backend::S3, UnlockOutcome::Unlocked, 2);
        m.recovered(Backend::parse("etcdv3"), UnlockOutcome::Ambiguous, 5);
        m.unknown_wording(Backend::S3);
        m.unknown_wording(Backend::S3);
        m.unknown_wording(Backend::parse("etcdv3"));
        m.set_needing_person(1);
        m.set_runs([0, 1, 2, 3, 4]);
        m.set_store_state(StoreStatus::Open);
        m.set_phase(Phase::Draining);
        m.cancelled(Cancel::Graceful);
        m.accept_paused(Listener::Control, Pause::Descriptors);
        m.dropped(Listener::Metrics, Dropped::Evicted);
        m.set_control_connections(3);
        m.set_heartbeat(Instant::now() - Duration::from_secs(2));
        let t = m.render();
        assert_eq!(value(&t, ok), Some(1.0), "{t}");
        assert_eq!(
            value(
                &t,
                "tfinit_runs_total{subcommand=\"other\",outcome=\"failed\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &t,
                "tfinit_runs_total{subcommand=\"plan\",outcome=\"refused\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &t,
                "tfinit_run_duration_seconds_count{subcommand=\"apply\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            value(&t, "tfinit_run_duration_seconds_count{subcommand=\"plan\"}"),
            None,
            "refused runs have no duration"
        );
        assert_eq!(value(&t, "tfinit_zombies_reaped_total"), Some(3.0));
        assert_eq!(
            value(&t, "tfinit_signals_forwarded_total{signal=\"SIGTERM\"}"),
            Some(1.0)
        );
        assert_eq!(
            value(&t, "tfinit_signals_forwarded_total{signal=\"SIGRTMIN+3\"}"),
            Some(1.0)
        );
        assert_eq!(
            value(&t, "tfinit_signals_forwarded_total{signal=\"other\"}"),
            Some(1.0)
        );
        assert_eq!(
            value(
                &t,
                "tfinit_force_unlocks_total{backend=\"s3\",outcome=\"unlocked\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &t,
                "tfinit_force_unlocks_total{backend=\"other\",outcome=\"ambiguous\"}"
            ),
            Some(1.0),
            "an unknown backend counts as other"
        );
        assert_eq!(
            value(
                &t,
                "tfinit_lock_probe_unknown_wording_total{backend=\"s3\"}"
            ),
            Some(2.0)
        );
        assert_eq!(
            value(
                &t,
                "tfinit_lock_probe_unknown_wording_total{backend=\"other\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            value(&t, "tfinit_orphan_candidates_total"),
            Some(2.0),
            "only a released lock's resources are orphan candidates"
        );
        assert_eq!(value(&t, "tfinit_recoveries_needing_a_person"), Some(1.0));
        assert_eq!(
            value(&t, "tfinit_cancels_total{how=\"graceful\"}"),
            Some(1.0)
        );
        assert_eq!(value(&t, "tfinit_cancels_total{how=\"force\"}"), Some(0.0));
        assert_eq!(value(&t, "tfinit_runs{state=\"stopping\"}"), Some(4.0));
        assert_eq!(
            value(&t, "tfinit_records_store_state{state=\"open\"}"),
            Some(1.0)
        );
        assert_eq!(
            value(&t, "tfinit_records_store_state{state=\"failed\"}"),
            Some(0.0)
        );
        assert_eq!(
            value(&t, "tfinit_shutdown_phase{phase=\"draining\"}"),
            Some(1.0)
        );
        assert_eq!(
            value(&t, "tfinit_shutdown_phase{phase=\"running\"}"),
            Some(0.0)
        );
        assert_eq!(
            value(
                &t,
                "tfinit_accept_pauses_total{listener=\"control\",reason=\"descriptors\"}"
            ),
            Some(1.0)
        );
        assert_eq!(
            value(
                &t,
                "tfinit_connections_dropped_total{listener=\"metrics\",reason=\"evicted\"}"
            ),
            Some(1.0)
        );
        assert_eq!(value(&t, "tfinit_control_connections"), Some(3.0));
        let age = value(&t, "tfinit_heartbeat_age_seconds").unwrap();
        assert!((2.0..10.0).contains(&age), "{age}");
    }

    #[test]
    fn a_metric_with_no_heartbeat_yet_is_left_out() {
        let t = Metrics::new("x").render();
        assert!(!t.contains("tfinit_heartbeat_age_seconds"), "{t}");
    }
}
