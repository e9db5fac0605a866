//! The decision: whether a held lock is the dead run's, on the evidence alone (no I/O), so every
//! rule is unit-tested. `evidence.rs` gathers what it weighs.

use std::time::Duration;

use crate::locks::lockinfo::{self, LockInfo};
use crate::locks::record::Record;

/// How far two nodes' clocks may disagree: Created may precede the record's start, or follow the
/// owner's last sign of life, by this much (terraform takes the lock after tfinit writes the
/// record, so on one node Created is always later than the start).
pub const CLOCK_SKEW: Duration = Duration::from_secs(60);
/// What the state directory proves about when a dead run could have taken its lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// A lock created earlier (ms since the epoch) is not the run's.
    pub not_before_ms: u64,
    /// A lock created later is not the run's.
    pub not_after_ms: u64,
    /// A live run that may lock the same state (locks::state, whatever directory it works in)
    /// and whose lock would carry the same Who.
    pub live_same_who: Option<String>,
    /// Evidence the store gave no answer for (the owner's heartbeat, the other tfinits'
    /// heartbeats): the window and the live runs may be wrong, so nothing is decided but
    /// "ambiguous" (the record is kept, and judged again by the next recovery).
    pub unread: Option<String>,
}

/// Whether to force-unlock a lock held as `info`, for the dead run of `rec`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Every check passed.
    Unlock,
    /// Provably not the dead run's lock.
    NotOurs(String),
    /// Could be the dead run's, could be a live one's.
    Ambiguous(String),
}
/// Decides on the evidence alone (no I/O), so every rule is unit-tested. The lock is the dead
/// run's only if terraform wrote exactly the run's Who, created it while the run could have, its id
/// is a plain lock id, and no live run here could have written the same Who.
pub fn decide(rec: &Record, info: &LockInfo, w: &Window) -> Decision {
    if info.who != rec.who {
        return Decision::NotOurs(format!(
            "its Who {:?} is not the dead run's {:?}",
            info.who, rec.who
        ));
    }
    let Some(created) = info.created_ms else {
        return Decision::Ambiguous(format!("its Created {:?} cannot be read", info.created));
    };
    if created < w.not_before_ms {
        return Decision::NotOurs(format!(
            "it was created {}s before the dead run started (allowing {}s of clock skew)",
            (rec.started_ms.saturating_sub(created)) / 1000,
            CLOCK_SKEW.as_secs()
        ));
    }
    if let Some(why) = &w.unread {
        return Decision::Ambiguous(format!("the evidence is incomplete: {why}"));
    }
    if created > w.not_after_ms {
        return Decision::NotOurs(format!(
            "it was created {}s after the dead run's owner was last known alive (allowing {}s of clock skew)",
            (created - w.not_after_ms + CLOCK_SKEW.as_millis() as u64) / 1000,
            CLOCK_SKEW.as_secs()
        ));
    }
    if !lockinfo::plain_id(&info.id) {
        return Decision::Ambiguous(format!("its ID {:?} is not a plain lock id", info.id));
    }
    if let Some(live) = &w.live_same_who {
        return Decision::Ambiguous(format!(
            "a live run here ({live}) has the same Who, so the lock may be that run's"
        ));
    }
    Decision::Unlock
}
