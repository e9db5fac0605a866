//! The book's log lines: each [`Notice`] with its level and its text.

use std::path::PathBuf;
use std::time::Duration;

use crate::duration::fmt_duration;
use crate::locks::labels::StoreFault;
use crate::locks::names::RunId;
use crate::locks::recorder::WriteError;

/// A message for the log; [`Notice::log`] writes it at its level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// The store opened.
    Enabled {
        /// The state directory.
        dir: String,
        /// Our owner name.
        owner: String,
        /// Our incarnation.
        incarnation: String,
    },
    /// Records of dead owners were found at open.
    DeadRecords {
        /// How many.
        count: usize,
        /// Whether recoveries run automatically.
        auto: bool,
    },
    /// The store cannot be used (once, at start).
    NotUsable {
        /// The store's location (a state directory, or the Leases of a namespace).
        dir: String,
        /// Why.
        error: String,
    },
    /// The store cannot be written, and records of this pod's host (`Who`) are in these
    /// working directories: state-locking runs there are refused meanwhile.
    Shadowed {
        /// The state directory.
        dir: String,
        /// The working directories.
        workdirs: Vec<PathBuf>,
    },
    /// The store cannot be written, and its records cannot be listed either: state-locking
    /// runs are refused meanwhile.
    Unlisted {
        /// The store's location.
        dir: String,
        /// Why the listing got no answer.
        error: String,
    },
    /// A heartbeat write failed, of a kind not said since the last one that landed.
    HeartbeatFailed {
        /// The store's location.
        dir: String,
        /// The kind of failure.
        fault: StoreFault,
        /// The store's error (a 403's names the Role rule).
        error: String,
        /// TFINIT_OWNER_TTL: the fence's times follow from it.
        ttl: Duration,
    },
    /// A run's record did not land in time: it starts without one.
    RecordTimeout {
        /// The run.
        run: RunId,
        /// The state directory.
        dir: String,
        /// TFINIT_RECORD_TIMEOUT.
        timeout: Duration,
    },
    /// The volume still does not answer: a run starts without a record (once a minute).
    NotAnswering {
        /// The run.
        run: RunId,
        /// The state directory.
        dir: String,
        /// For how long.
        since: Duration,
    },
    /// A write succeeded after the volume stopped answering.
    AnswersAgain {
        /// The state directory.
        dir: String,
    },
    /// The heartbeat is older than TTL/2 while records of ours are on the volume (once).
    HeartbeatStale {
        /// The state directory.
        dir: String,
        /// The last successful heartbeat's age.
        age: Duration,
        /// TFINIT_OWNER_TTL.
        ttl: Duration,
    },
    /// A run starts without a record because the heartbeat is stale.
    HeartbeatStaleRun {
        /// The run.
        run: RunId,
    },
    /// The heartbeat was written after it had gone stale.
    HeartbeatAgain {
        /// The state directory.
        dir: String,
    },
    /// A run's record create failed: it starts without one.
    CreateFailed {
        /// The run.
        run: RunId,
        /// The state directory.
        dir: String,
        /// Why.
        error: WriteError,
    },
    /// A progress rewrite failed.
    ProgressFailed {
        /// The run.
        run: RunId,
        /// Why.
        error: WriteError,
    },
    /// An end-marking failed.
    EndFailed {
        /// The run.
        run: RunId,
        /// Why.
        error: WriteError,
    },
    /// A removal failed.
    RemoveFailed {
        /// The run.
        run: RunId,
        /// Why.
        error: WriteError,
    },
    /// Another live incarnation writes heartbeats under our owner name (once).
    SharedName {
        /// The name.
        owner: String,
        /// The other incarnation.
        other: String,
        /// Ours.
        me: String,
    },
    /// Recorded runs are stopped because the heartbeat has not landed.
    Fenced {
        /// The runs.
        runs: Vec<RunId>,
        /// SIGKILL (else the graceful SIGTERM).
        kill: bool,
        /// Age of the last heartbeat that landed.
        age: Duration,
        /// TFINIT_OWNER_TTL.
        ttl: Duration,
    },
}

impl Notice {
    /// Its level.
    pub fn level(&self) -> tracing::Level {
        use tracing::Level;
        match self {
            Notice::Enabled { .. }
            | Notice::DeadRecords { .. }
            | Notice::AnswersAgain { .. }
            | Notice::HeartbeatAgain { .. } => Level::INFO,
            Notice::HeartbeatStale { .. }
            | Notice::Fenced { .. }
            | Notice::HeartbeatFailed { .. } => Level::ERROR,
            _ => Level::WARN,
        }
    }

    /// Its text.
    pub fn message(&self) -> String {
        let secs = |d: &Duration| fmt_duration(Duration::from_secs(d.as_secs()));
        match self {
            Notice::Enabled { dir, owner, incarnation } => format!(
                "lock-owner records enabled (store {dir}, owner {owner}, incarnation {incarnation})"
            ),
            Notice::DeadRecords { count, auto } => format!(
                "lock-owner records of dead owners found ({count}): each is checked before the next state-locking run in its directory{}",
                if *auto { "" } else { " (TFINIT_FORCE_UNLOCK=off: run `tfinit recover` by hand)" }
            ),
            Notice::NotUsable { dir, error } => format!(
                "the lock-owner record store is not usable: tfinit keeps working without lock-owner records, so a \
                 state lock left by this pod's death will not be released automatically. For files, mount a \
                 writable volume at TFINIT_STATE_DIR (emptyDir for container restarts, a PVC for pod replacement) \
                 or set TFINIT_STATE_DIR to one; for Leases, see the error (store {dir}: {error})"
            ),
            Notice::Shadowed { dir, workdirs } => {
                let dirs = list(workdirs.iter().map(|d| d.display()));
                format!(
                    "the lock-owner record store ({dir}) cannot be written but holds lock-owner records of earlier runs with \
                     this pod's hostname in their lock's Who, in {dirs}: state-locking runs are refused (exit code 75), in \
                     every directory (another may lock the same state), until the store takes writes again or those \
                     records are gone, because another pod recovering such a record could release a lock of this pod's, \
                     which carries the same Who, while this pod cannot say it is alive. Fix the store (the volume at \
                     TFINIT_STATE_DIR: space, permissions, the NFS server; or the Kubernetes API and the service \
                     account's rights on Leases)"
                )
            }
            Notice::Unlisted { dir, error } => format!(
                "the lock-owner record store ({dir}) can neither be written nor listed ({error}): it may hold a record of an \
                 earlier run with this pod's hostname in its lock's Who, so state-locking runs are refused (exit code 75), \
                 in every directory, until the store answers, because another pod recovering such a record could release a \
                 lock of this pod's, which carries the same Who, while this pod cannot say it is alive. Check the store \
                 (the volume at TFINIT_STATE_DIR, or the Kubernetes API and the service account's rights on Leases)"
            ),
            Notice::HeartbeatFailed {
                dir,
                fault,
                error,
                ttl,
            } => format!(
                "this owner's heartbeat could not be written to the lock-owner record store ({dir}; {}): {error}. Until \
                 one lands, other pods cannot tell this pod is alive: its state-locking runs get their graceful stop {} \
                 after the last heartbeat that landed and are killed at {} (the fence), and new ones are refused. \
                 Counted in tfinit_heartbeat_write_failures_total{{reason=\"{}\"}}; said again only for another kind \
                 of failure",
                fault.label(),
                fmt_duration(*ttl * 2 / 3),
                fmt_duration(*ttl * 9 / 10),
                fault.label()
            ),
            Notice::RecordTimeout { run, dir, timeout } => format!(
                "run {run}: the state volume did not answer within TFINIT_RECORD_TIMEOUT ({}): terraform starts without a \
                 lock-owner record, so a state lock this run leaves behind will not be released automatically. \
                 Check the volume mounted at TFINIT_STATE_DIR ({dir}); until a write succeeds again, state-locking \
                 runs start at once without a record. Raise TFINIT_RECORD_TIMEOUT if the volume is merely slow",
                fmt_duration(*timeout)
            ),
            Notice::NotAnswering { run, dir, since } => format!(
                "run {run}: the state volume is not answering (for {}): terraform starts without a lock-owner record. \
                 Check the volume mounted at TFINIT_STATE_DIR ({dir})",
                secs(since)
            ),
            Notice::AnswersAgain { dir } => format!(
                "the state volume answers again ({dir}): state-locking runs get lock-owner records again"
            ),
            Notice::HeartbeatStale { dir, age, ttl } => format!(
                "this owner's heartbeat has not been written for {} in the lock-owner record store ({dir}): other pods may \
                 take this owner for dead after TFINIT_OWNER_TTL ({}) and release the state locks its records name. \
                 New state-locking runs start without a record until it is written again; check the store (the \
                 volume, or the Kubernetes API and the service account's rights on Leases)",
                secs(age),
                fmt_duration(*ttl)
            ),
            Notice::HeartbeatStaleRun { run } => format!(
                "run {run}: the heartbeat is stale, so terraform starts without a lock-owner record (a record no pod \
                 can trust protects nothing)"
            ),
            Notice::HeartbeatAgain { dir } => format!(
                "heartbeat written again in the lock-owner record store ({dir}): state-locking runs get lock-owner records again"
            ),
            Notice::CreateFailed { run, dir, error } => format!(
                "run {run}: cannot write the lock-owner record; this run's lock will not be recoverable automatically. \
                 Free space in TFINIT_STATE_DIR ({dir}) or mount a bigger, writable volume there ({error})"
            ),
            Notice::ProgressFailed { run, error } => format!(
                "run {run}: cannot update the lock-owner record; its resources in progress are out of date. Free space \
                 in TFINIT_STATE_DIR or mount a bigger, writable volume there ({error})"
            ),
            Notice::EndFailed { run, error } => format!(
                "run {run}: cannot mark the lock-owner record as ended; tried again after every heartbeat that lands, and recovered once this owner is dead ({error})"
            ),
            Notice::RemoveFailed { run, error } => {
                format!("run {run}: cannot remove the lock-owner record; tried again after every heartbeat that lands ({error})")
            }
            Notice::SharedName { owner, other, me } => format!(
                "another tfinit is using owner name {owner} (incarnation {other}; this one is {me}) with the same \
                 TFINIT_STATE_DIR: each judges only its own records, so neither releases the other's locks, but give \
                 each pod its own TFINIT_OWNER (the default, the hostname, is unique per pod unless hostNetwork is set)"
            ),
            Notice::Fenced { runs, kill, age, ttl } => format!(
                "the heartbeat has not landed in the lock-owner record store for {} (TFINIT_OWNER_TTL {}): other pods may take this \
                 owner for dead and release the locks that carry its Who, so its state-locking runs (recorded or not) {}: {}. New state-locking \
                 runs are refused until a heartbeat lands; check the store (the volume, or the Kubernetes API and the service \
                 account's rights on Leases), or raise TFINIT_OWNER_TTL if it stalls this long",
                secs(age),
                fmt_duration(*ttl),
                if *kill { "are SIGKILLed now" } else { "are asked to stop gracefully (one SIGTERM)" },
                list(runs)
            ),
        }
    }

    /// Writes it to the log at its level.
    pub fn log(&self) {
        let m = self.message();
        match self.level() {
            tracing::Level::ERROR => tracing::error!("{m}"),
            tracing::Level::WARN => tracing::warn!("{m}"),
            _ => tracing::info!("{m}"),
        }
    }
}

/// `items` separated by commas (runs, directories), for a log line.
fn list<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    let mut out = String::new();
    for (i, item) in items.into_iter().enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        out += &format!("{sep}{item}");
    }
    out
}
