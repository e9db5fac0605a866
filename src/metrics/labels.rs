//! The metrics' label values: the enums that own them, encoded by their own text, and the label
//! sets the families are keyed by.

use nix::sys::signal::Signal;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};

use crate::locks::labels::{Backend, StoreFault, StoreStatus, UnlockOutcome};
use crate::phase::Phase;
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
    RunOutcome => label,
    RunStage => label,
    Cancel => label,
    Listener => label,
    Pause => label,
    Dropped => label,
    UnlockOutcome => label,
    Backend => label,
    StoreStatus => label,
    StoreFault => label,
    Phase => as_str,
);

/// How a run ended, as `tfinit_runs_total{outcome}` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunOutcome {
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

impl RunOutcome {
    /// Its label value.
    pub fn label(self) -> &'static str {
        match self {
            RunOutcome::Succeeded => "succeeded",
            RunOutcome::Failed => "failed",
            RunOutcome::Signalled => "signalled",
            RunOutcome::StoppedGracefully => "stopped_gracefully",
            RunOutcome::Killed => "killed",
            RunOutcome::Refused => "refused",
        }
    }
}

/// A run's state, as `tfinit_runs{state}` counts the runs in each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunStage {
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

impl RunStage {
    /// Its label value.
    pub fn label(self) -> &'static str {
        match self {
            RunStage::Recovering => "recovering",
            RunStage::Recording => "recording",
            RunStage::Queued => "queued",
            RunStage::Running => "running",
            RunStage::Stopping => "stopping",
        }
    }

    /// Every state, in the order of [`RunCounts`].
    pub const ALL: [RunStage; 5] = [
        RunStage::Recovering,
        RunStage::Recording,
        RunStage::Queued,
        RunStage::Running,
        RunStage::Stopping,
    ];
}

/// How many runs are in each [`RunStage`], in the order of [`RunStage::ALL`].
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
pub(super) struct RunLabels {
    pub(super) subcommand: &'static str,
    pub(super) outcome: RunOutcome,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct SubcommandLabels {
    pub(super) subcommand: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct StateLabels {
    pub(super) state: RunStage,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct SignalLabels {
    pub(super) signal: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct UnlockLabels {
    pub(super) backend: Backend,
    pub(super) outcome: UnlockOutcome,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct NameLabels {
    pub(super) state: StoreStatus,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct FaultLabels {
    pub(super) reason: StoreFault,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct BackendLabels {
    pub(super) backend: Backend,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct PhaseLabels {
    pub(super) phase: Phase,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct CancelLabels {
    pub(super) how: Cancel,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct PauseLabels {
    pub(super) listener: Listener,
    pub(super) reason: Pause,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct DroppedLabels {
    pub(super) listener: Listener,
    pub(super) reason: Dropped,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct VersionLabels {
    pub(super) version: &'static str,
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
pub(super) fn signal_label(signo: SigNo) -> &'static str {
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
