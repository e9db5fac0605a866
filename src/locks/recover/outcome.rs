//! What a recovery decided about one record ([`RecoveryOutcome`]), and what the recovery helper tells the
//! init of it on its report pipe ([`HelperReport`]), for the metrics and the log.

use serde::{Deserialize, Serialize};

use crate::locks::labels::UnlockOutcome;
use crate::locks::lockinfo::LockInfo;

/// What happened to one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecoveryOutcome {
    /// Its run may still be going: untouched.
    OwnerAlive,
    /// The backend's lock dies with its process (local, pg): record removed.
    NothingToRelease(String),
    /// The backend cannot be probed safely: lock untouched, record set aside (`*.manual`).
    Unsupported(String),
    /// The lock is free: record removed.
    Free,
    /// The dead run's lock was released (or would be, in a dry run): record removed.
    Unlocked(LockInfo),
    /// Somebody else holds the lock (the reason says why it is not the dead run's): untouched,
    /// record removed.
    HeldByOther(LockInfo, String),
    /// The lock may be the dead run's or a live run's with the same Who: untouched, record kept.
    Ambiguous(LockInfo, String),
    /// The probe could not tell: nothing touched, record kept.
    Unknown(String),
    /// The probe's answer is in a wording tfinit does not know (lockinfo::Probe::Unknown): as
    /// [`RecoveryOutcome::Unknown`], and the init says it once per record and counts it.
    UnknownWording(String),
    /// The unlock itself failed: record kept.
    UnlockFailed(String),
    /// The dead run holds the lock but terraform cannot load the state (it is missing), so no
    /// force-unlock can release it: a person must run the command. Record kept, marked.
    NeedsPerson(LockInfo, String),
    /// A person was already told, by this incarnation, how to release this record's lock:
    /// automatic recovery leaves it alone and says nothing more.
    WaitingForPerson,
}

impl RecoveryOutcome {
    /// Its name in `tfinit_force_unlocks_total{outcome}`; None for a record left alone without a
    /// decision (a person was told already).
    pub fn label(&self) -> Option<UnlockOutcome> {
        Some(match self {
            RecoveryOutcome::OwnerAlive => UnlockOutcome::OwnerAlive,
            RecoveryOutcome::NothingToRelease(_) => UnlockOutcome::NothingToRelease,
            RecoveryOutcome::Unsupported(_) => UnlockOutcome::Unsupported,
            RecoveryOutcome::Free => UnlockOutcome::Free,
            RecoveryOutcome::Unlocked(_) => UnlockOutcome::Unlocked,
            RecoveryOutcome::HeldByOther(..) => UnlockOutcome::HeldByOther,
            RecoveryOutcome::Ambiguous(..) => UnlockOutcome::Ambiguous,
            RecoveryOutcome::Unknown(_) | RecoveryOutcome::UnknownWording(_) => {
                UnlockOutcome::Unknown
            }
            RecoveryOutcome::UnlockFailed(_) => UnlockOutcome::UnlockFailed,
            RecoveryOutcome::NeedsPerson(..) => UnlockOutcome::NeedsPerson,
            RecoveryOutcome::WaitingForPerson => return None,
        })
    }
}

/// What a recovery helper tells the init of one record it decided on: one JSON line each, on the
/// pipe the init gave it (`TFINIT_REPORT_FD`), for the metrics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelperReport {
    /// The working directory's backend type (`s3`, `kubernetes`, ...; `other` when unknown).
    pub backend: String,
    /// [`RecoveryOutcome::label`]'s text ([`UnlockOutcome::label`]).
    pub outcome: String,
    /// Resources the dead run had in progress (orphan candidates).
    pub orphans: u64,
    /// Set when the probe answered in a wording tfinit does not know ([`RecoveryOutcome::UnknownWording`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unknown_wording: Option<UnknownWording>,
}

/// A probe's answer in a wording tfinit does not know, and the record it was about: what the init
/// says once per record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnknownWording {
    /// The record's file.
    pub record: String,
    /// The record's working directory.
    pub workdir: String,
    /// The answer's first line.
    pub said: String,
}

/// The variable that names the helper's report pipe (a descriptor number it inherited).
pub const REPORT_FD_VAR: &str = "TFINIT_REPORT_FD";
