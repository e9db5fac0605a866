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
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeMetric;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::locks::labels::{Backend, StoreFault, StoreStatus, UnlockOutcome};
use crate::phase::Phase;
use crate::sys::SigNo;

mod labels;

use labels::{
    signal_label, BackendLabels, CancelLabels, DroppedLabels, FaultLabels, NameLabels, PauseLabels,
    PhaseLabels, RunLabels, SignalLabels, StateLabels, SubcommandLabels, UnlockLabels,
    VersionLabels,
};
pub use labels::{
    subcommand_label, Cancel, Dropped, Listener, Pause, RunCounts, RunOutcome, RunStage,
};

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
    zombies: Counter,
    signals: Family<SignalLabels, Counter>,
    force_unlocks: Family<UnlockLabels, Counter>,
    unknown_wordings: Family<BackendLabels, Counter>,
    needing_person: Gauge,
    orphan_candidates: Counter,
    cancels: Family<CancelLabels, Counter>,
    accept_pauses: Family<PauseLabels, Counter>,
    dropped: Family<DroppedLabels, Counter>,
    control_connections: Gauge,
    heartbeat: Arc<HeartbeatAge>,
    /// `tfinit_heartbeat_write_failures_total`'s series, by [`StoreFault::ALL`]'s order.
    heartbeat_failures: [Counter; StoreFault::ALL.len()],
    /// `tfinit_runs`, `tfinit_records_store_state` and `tfinit_shutdown_phase` (registered,
    /// reached through these handles only), and handles on the signals' series: what the loop
    /// records on every wake-up or signal is then an atomic store, without hashing a label set
    /// and taking the family's lock.
    hot: Hot,
}

/// Series the loop sets on every wake-up, by their label's position in its `ALL` list, and
/// the forwarded-signal series by signal number (made at first forward, like the family's).
#[derive(Debug)]
struct Hot {
    runs: [Gauge; RunStage::ALL.len()],
    store_state: [Gauge; StoreStatus::ALL.len()],
    phase: [Gauge; Phase::ALL.len()],
    signals: [OnceLock<Counter>; SIGNALS],
}

/// Signal numbers 0..=64 (SIGRTMAX on Linux).
const SIGNALS: usize = 65;

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
        // tfinit_force_unlocks_total's series are made at first use too (90 label sets).
        let hot = Hot {
            runs: RunStage::ALL.map(|state| runs.get_or_create(&StateLabels { state }).clone()),
            store_state: StoreStatus::ALL
                .map(|state| store_state.get_or_create(&NameLabels { state }).clone()),
            phase: Phase::ALL
                .map(|phase| shutdown_phase.get_or_create(&PhaseLabels { phase }).clone()),
            signals: [const { OnceLock::new() }; SIGNALS],
        };
        hot.set_phase(Phase::Running);
        let heartbeat_failures_family = Family::<FaultLabels, Counter>::default();
        let heartbeat_failures = StoreFault::ALL.map(|reason| {
            heartbeat_failures_family
                .get_or_create(&FaultLabels { reason })
                .clone()
        });
        registry.register(
            "heartbeat_write_failures",
            "Heartbeat writes of this owner that failed, by reason (denied: the store refused, e.g. the service account lost its rights on Leases; missing: the namespace or directory is gone; unanswered; other)",
            heartbeat_failures_family,
        );
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
        registry.register("runs", "terraform runs now, by state", runs);
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
            store_state,
        );
        registry.register(
            "shutdown_phase",
            "Phase of the init (1 for the current phase)",
            shutdown_phase,
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
            zombies,
            signals,
            force_unlocks,
            unknown_wordings,
            needing_person,
            orphan_candidates,
            cancels,
            accept_pauses,
            dropped,
            control_connections,
            heartbeat,
            heartbeat_failures,
            hot,
        }
    }

    /// A run of `subcommand` ended with `outcome` after `took` (refused runs count with a zero
    /// duration, and are not observed in the histogram).
    pub fn run_ended(&self, subcommand: &str, outcome: RunOutcome, took: Duration) {
        let subcommand = subcommand_label(subcommand);
        self.runs_total
            .get_or_create(&RunLabels {
                subcommand,
                outcome,
            })
            .inc();
        if outcome != RunOutcome::Refused {
            self.run_duration
                .get_or_create(&SubcommandLabels { subcommand })
                .observe(took.as_secs_f64());
        }
    }

    /// How many runs are in each state now.
    pub fn set_runs(&self, counts: RunCounts) {
        for (gauge, n) in self.hot.runs.iter().zip(counts) {
            gauge.set(n);
        }
    }

    /// `n` processes were reaped.
    pub fn reaped(&self, n: u64) {
        self.zombies.inc_by(n);
    }

    /// Signal `signo` was forwarded.
    pub fn forwarded(&self, signo: SigNo) {
        let series = || {
            let signal = signal_label(signo);
            self.signals.get_or_create(&SignalLabels { signal }).clone()
        };
        match usize::try_from(signo)
            .ok()
            .and_then(|n| self.hot.signals.get(n))
        {
            Some(cached) => cached.get_or_init(series).inc(),
            None => series().inc(),
        };
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
        for (s, gauge) in StoreStatus::ALL.into_iter().zip(&self.hot.store_state) {
            gauge.set(i64::from(s == state));
        }
    }

    /// Heartbeat writes that failed since the start, by [`StoreFault::ALL`]'s order (the
    /// book's totals: each series is brought up to its total).
    pub fn set_heartbeat_failures(&self, totals: [u64; StoreFault::ALL.len()]) {
        for (counter, total) in self.heartbeat_failures.iter().zip(totals) {
            let now = counter.get();
            if total > now {
                counter.inc_by(total - now);
            }
        }
    }

    /// The last heartbeat that landed was written at `at`.
    pub fn set_heartbeat(&self, at: Instant) {
        let ns = at.saturating_duration_since(self.heartbeat.base).as_nanos() as u64;
        self.heartbeat.at_ns.store(ns + 1, Ordering::Relaxed);
    }

    /// The init is in `phase`.
    pub(crate) fn set_phase(&self, phase: Phase) {
        self.hot.set_phase(phase);
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

impl Hot {
    fn set_phase(&self, phase: Phase) {
        for (p, gauge) in Phase::ALL.into_iter().zip(&self.phase) {
            gauge.set(i64::from(p == phase));
        }
    }
}

/// The Content-Type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests;
