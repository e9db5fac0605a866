//! What a lock recovery decided and on which backend, as `tfinit_force_unlocks_total` and the
//! recovery helper's report name them: one list each, so the helper that writes a label and the
//! init that counts it cannot drift. Kept apart from recover/outcome.rs, whose [`RecoveryOutcome`] carries
//! the details a label leaves out.
//!
//! [`RecoveryOutcome`]: super::recover::RecoveryOutcome

/// The kind of a recovery's decision ([`super::recover::RecoveryOutcome::label`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnlockOutcome {
    /// The dead run's lock was released.
    Unlocked,
    /// The lock is free.
    Free,
    /// Somebody else holds the lock.
    HeldByOther,
    /// The lock may be the dead run's or a live run's.
    Ambiguous,
    /// Its run may still be going.
    OwnerAlive,
    /// The probe could not tell (or answered in a wording tfinit does not know).
    Unknown,
    /// The unlock itself failed.
    UnlockFailed,
    /// No terraform command can release the lock: a person must.
    NeedsPerson,
    /// The backend's lock dies with its process.
    NothingToRelease,
    /// The backend cannot be probed safely.
    Unsupported,
}

impl UnlockOutcome {
    /// Every outcome.
    pub const ALL: [UnlockOutcome; 10] = [
        UnlockOutcome::Unlocked,
        UnlockOutcome::Free,
        UnlockOutcome::HeldByOther,
        UnlockOutcome::Ambiguous,
        UnlockOutcome::OwnerAlive,
        UnlockOutcome::Unknown,
        UnlockOutcome::UnlockFailed,
        UnlockOutcome::NeedsPerson,
        UnlockOutcome::NothingToRelease,
        UnlockOutcome::Unsupported,
    ];

    /// Its label value, and its text in the helper's report.
    pub fn label(self) -> &'static str {
        match self {
            UnlockOutcome::Unlocked => "unlocked",
            UnlockOutcome::Free => "free",
            UnlockOutcome::HeldByOther => "held_by_other",
            UnlockOutcome::Ambiguous => "ambiguous",
            UnlockOutcome::OwnerAlive => "owner_alive",
            UnlockOutcome::Unknown => "unknown",
            UnlockOutcome::UnlockFailed => "unlock_failed",
            UnlockOutcome::NeedsPerson => "needs_person",
            UnlockOutcome::NothingToRelease => "nothing_to_release",
            UnlockOutcome::Unsupported => "unsupported",
        }
    }

    /// The outcome a helper's report names; None for a text this tfinit does not know (a helper
    /// of another version).
    pub fn parse(text: &str) -> Option<UnlockOutcome> {
        UnlockOutcome::ALL.into_iter().find(|o| o.label() == text)
    }

    /// Whether the record was removed with its lock released or free: the dead run's resources
    /// in progress are then orphan candidates.
    pub fn releases(self) -> bool {
        matches!(
            self,
            UnlockOutcome::Unlocked | UnlockOutcome::Free | UnlockOutcome::NothingToRelease
        )
    }
}

/// A working directory's backend, as `tfinit_force_unlocks_total{backend}` counts it; any type
/// not listed is [`Backend::Other`], so a typo cannot grow the label set without bound. consul
/// and http are never probed (their force-unlock deletes any lock): their records are
/// `unsupported`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// `s3`.
    S3,
    /// `kubernetes`.
    Kubernetes,
    /// `azurerm`.
    Azurerm,
    /// `gcs`.
    Gcs,
    /// `local`.
    Local,
    /// `pg`.
    Pg,
    /// `consul`.
    Consul,
    /// `http`.
    Http,
    /// Any other type, or none.
    Other,
}

impl Backend {
    /// Every backend.
    pub const ALL: [Backend; 9] = [
        Backend::S3,
        Backend::Kubernetes,
        Backend::Azurerm,
        Backend::Gcs,
        Backend::Local,
        Backend::Pg,
        Backend::Consul,
        Backend::Http,
        Backend::Other,
    ];

    /// Its label value (terraform's name of the backend type).
    pub fn label(self) -> &'static str {
        match self {
            Backend::S3 => "s3",
            Backend::Kubernetes => "kubernetes",
            Backend::Azurerm => "azurerm",
            Backend::Gcs => "gcs",
            Backend::Local => "local",
            Backend::Pg => "pg",
            Backend::Consul => "consul",
            Backend::Http => "http",
            Backend::Other => "other",
        }
    }

    /// The backend terraform names `text`; [`Backend::Other`] for any it does not list.
    pub fn parse(text: &str) -> Backend {
        Backend::ALL
            .into_iter()
            .find(|b| b.label() == text)
            .unwrap_or(Backend::Other)
    }
}

/// The records store's state as `tfinit status` and `tfinit_records_store_state{state}` name it
/// ([`super::book::Book::view`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreStatus {
    /// Opening: the state directory is being scanned.
    Opening,
    /// Open, heartbeats landing.
    Open,
    /// It failed to open: no records this incarnation.
    Failed,
    /// An operation has not answered in time.
    NotAnswering,
    /// Open, but the last heartbeat that landed is older than TTL/2.
    HeartbeatStale,
}

impl StoreStatus {
    /// Every state, in the order the metrics create them.
    pub const ALL: [StoreStatus; 5] = [
        StoreStatus::Opening,
        StoreStatus::Open,
        StoreStatus::Failed,
        StoreStatus::NotAnswering,
        StoreStatus::HeartbeatStale,
    ];

    /// Its label value, and its text in `tfinit status`.
    pub fn label(self) -> &'static str {
        match self {
            StoreStatus::Opening => "opening",
            StoreStatus::Open => "open",
            StoreStatus::Failed => "failed",
            StoreStatus::NotAnswering => "not_answering",
            StoreStatus::HeartbeatStale => "heartbeat_stale",
        }
    }
}

/// Why a write to the lock-owner record store failed, as
/// `tfinit_heartbeat_write_failures_total{reason}` counts the heartbeats that did not land: the
/// kind of the store's error (`io::ErrorKind`, which both stores set; the Kubernetes store's
/// answers map onto it in store/kube/io_error.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreFault {
    /// Refused: 401 or 403 (the service account's rights on Leases), EACCES.
    Denied,
    /// What it writes to is gone: the namespace (404), the directory.
    Missing,
    /// No answer in time: a timeout, a refused or lost connection, throttling that outlasted the
    /// retries.
    Unanswered,
    /// Anything else: the store's own error (no space, an I/O error, a 5xx).
    Other,
}

impl StoreFault {
    /// Every reason.
    pub const ALL: [StoreFault; 4] = [
        StoreFault::Denied,
        StoreFault::Missing,
        StoreFault::Unanswered,
        StoreFault::Other,
    ];

    /// Its label value.
    pub fn label(self) -> &'static str {
        match self {
            StoreFault::Denied => "denied",
            StoreFault::Missing => "missing",
            StoreFault::Unanswered => "unanswered",
            StoreFault::Other => "other",
        }
    }

    /// The reason of an error of this kind.
    pub fn of(kind: std::io::ErrorKind) -> StoreFault {
        use std::io::ErrorKind;
        match kind {
            ErrorKind::PermissionDenied => StoreFault::Denied,
            ErrorKind::NotFound => StoreFault::Missing,
            ErrorKind::TimedOut
            | ErrorKind::ConnectionRefused
            | ErrorKind::ConnectionAborted
            | ErrorKind::ConnectionReset
            | ErrorKind::NotConnected
            | ErrorKind::WouldBlock => StoreFault::Unanswered,
            _ => StoreFault::Other,
        }
    }
}
