//! The recorder: one thread beside the PID-1 loop (while it has work: it ends when idle, and
//! the loop starts it again, see `thread.rs`) that owns the [`Store`](super::store::Store)
//! and does all of its
//! storage work (opening, probing, sweeping and pruning the store, the heartbeat, record create,
//! progress, end and remove, and the scans for dead owners' records), so the loop never waits on
//! the volume.
//!
//! The loop sends [`Work`]s over an unbounded channel (a send never blocks) and takes
//! [`Completion`]s back when the recorder's eventfd, registered in its epoll set, is readable.
//! Each thread is started after main blocked the signals (by the loop, which keeps them
//! blocked), inherits that mask and changes nothing in it: every signal stays for the loop's
//! signalfd.
//!
//! Order of work: the heartbeat goes first (a late heartbeat makes other pods take this owner for
//! dead); then record writes in the order they were asked for, every write waiting when one
//! begins in one batch (group commit: one change per run, `Store::apply`); rescans last. Writes of one record
//! apply in order (create, then progress, then end or remove). Progress asked for while a write
//! is in flight waits in the queue, where later progress of the same record replaces it, so one
//! slow write is followed by at most one more. A remove drops that run's queued updates.
//!
//! Files: this one (what the loop and the recorder say to each other), `machine/` (every
//! decision of the recorder, without I/O: the next storage operation from its state, the clock
//! and the outcome of the last one; the simulation drives it too), `queue.rs` (the order of
//! work), `thread.rs` (the loop's handle, and the thread that performs the machine's operations
//! on the store), `tests.rs` (the thread on a storage test double).

use std::io;
use std::path::PathBuf;
use std::time::Instant;

use super::labels::StoreFault;
use super::liveness::Facts;
use super::names::RunId;
use super::record::{Ended, Heartbeat, Owner, Record};
use crate::locks::record_id::RecordId;

pub mod machine;
mod queue;
#[cfg(test)]
pub(crate) mod tests;
mod thread;

pub use thread::Recorder;

/// Why a record or heartbeat write did not land.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteError {
    /// The store did not open, so nothing is written to it.
    NotOpen,
    /// A progress or end write for a run whose record was never written (its create failed or
    /// was cancelled): there is nothing to rewrite.
    NoRecord,
    /// A create cancelled because its run's removal came before it started.
    Cancelled,
    /// A create that must follow a fresh heartbeat, which could not be written.
    NoHeartbeat,
    /// The store's own error: its kind, and its text (which says what to do).
    Volume(StoreFault, String),
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WriteError::NotOpen => "the lock-owner record store is not usable",
            WriteError::NoRecord => "no record was written for this run",
            WriteError::Cancelled => "not written: the run was over before its record was",
            WriteError::NoHeartbeat => {
                "not written: the heartbeat it must follow could not be written"
            }
            WriteError::Volume(_, e) => e,
        })
    }
}

impl std::error::Error for WriteError {}

impl From<io::Error> for WriteError {
    fn from(e: io::Error) -> WriteError {
        WriteError::Volume(StoreFault::of(e.kind()), e.to_string())
    }
}

/// Work for the recorder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Work {
    /// Refresh this owner's heartbeat now (ahead of any record write), then rescan. The recorder
    /// also does this by itself every TTL/3 while the store is open.
    Heartbeat,
    /// Write a new record. Its `who` is computed by the recorder from `env` (needs passwd).
    Create {
        /// The run.
        run: RunId,
        /// The record; `who` is overwritten.
        record: Box<Record>,
        /// The run's environment ($USER and $HOME count when there is no passwd entry).
        env: Vec<String>,
    },
    /// The run's set of resources in progress changed.
    Progress {
        /// The run.
        run: RunId,
        /// Resources whose operation started and did not complete.
        in_progress: Vec<String>,
    },
    /// The run ended in a way that may leave its lock: mark its record ended and keep it.
    End {
        /// The run.
        run: RunId,
        /// How it ended.
        ended: Ended,
        /// Its last resources in progress.
        in_progress: Vec<String>,
    },
    /// The run is over and released its lock: remove its record.
    Remove {
        /// The run.
        run: RunId,
    },
    /// Rescan the records and heartbeats (after a recovery).
    Rescan,
}

/// A record on the volume, as far as the loop's decisions need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its id in the store.
    pub path: RecordId,
    /// Where its run worked.
    pub workdir: PathBuf,
    /// The `Who` of its run's lock.
    pub who: String,
    /// Owner, last write, end.
    pub facts: Facts,
}

impl Entry {
    /// The entry of record `rec`, stored at `path`.
    pub fn of(path: RecordId, rec: &Record) -> Entry {
        Entry {
            path,
            workdir: PathBuf::from(&rec.workdir),
            who: rec.who.clone(),
            facts: Facts::of(rec),
        }
    }
}

/// Which working directories hold records, and the heartbeat of each owner, as last scanned.
#[derive(Debug, Clone)]
pub struct Table {
    /// When the scan started: a change made before that is in it.
    pub scanned: Instant,
    /// Every readable record.
    pub records: Vec<Entry>,
    /// Why the records could not be listed (then `records` is empty, and what the store holds is
    /// unknown, not nothing).
    pub unlisted: Option<String>,
    /// One read of the heartbeat of each incarnation with records, and of every other
    /// incarnation of our own name, that the store answered.
    pub beats: Vec<Beat>,
    /// The incarnations with records whose heartbeat read got no answer: not watched this time,
    /// but still watched.
    pub unread: Vec<String>,
    /// The incarnations with records the kernel proves gone (see [`Store::incarnation_gone`](crate::locks::store::Store::incarnation_gone)).
    pub gone: Vec<String>,
    /// The incarnations with records a process of which holds their lock file: alive, whatever
    /// their heartbeat does.
    pub held: Vec<String>,
}

/// One read of an incarnation's heartbeat, timed on the reader's monotonic clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Beat {
    /// The incarnation.
    pub owner: Owner,
    /// What was read (None: no heartbeat file).
    pub heartbeat: Option<Heartbeat>,
    /// When the read started.
    pub started: Instant,
    /// When it returned.
    pub done: Instant,
}

/// What the recorder did.
#[derive(Debug)]
pub enum Completion {
    /// The store was opened (always the first completion). On success, the table of records,
    /// and the passwd user name of our uid (for the `Who` of runs without a record).
    Opened {
        /// Whether the store is usable, or why not.
        result: Result<(), String>,
        /// The records found (empty when not usable).
        table: Option<Table>,
        /// Our uid's passwd user name.
        passwd_user: Option<String>,
        /// Where the store is (which one TFINIT_STORE chose), for messages; None when no opening
        /// was tried.
        location: Option<String>,
        /// When the first heartbeat write (which succeeded) started: its age counts from then,
        /// not from this completion (the sweep and the scan came after it).
        beat: Option<Instant>,
        /// This incarnation's lock file, flocked, for every terraform run to inherit; None when
        /// it could not be taken (records are written all the same, proven dead only by watching).
        lock: Option<std::sync::Arc<std::os::fd::OwnedFd>>,
    },
    /// A heartbeat write finished.
    Heartbeat {
        /// Whether it is on the volume.
        result: Result<(), WriteError>,
        /// When its time stamp was taken: its age counts from then.
        stamped: Instant,
        /// That time stamp, ms since the epoch.
        wall_ms: u64,
    },
    /// A create finished.
    Created {
        /// The run.
        run: RunId,
        /// Whether the record is on the volume (with its id).
        result: Result<RecordId, WriteError>,
    },
    /// A progress rewrite finished (or was not needed: no record).
    Written {
        /// The run.
        run: RunId,
        /// Whether it is on the volume.
        result: Result<(), WriteError>,
    },
    /// An end-marking finished.
    Ended {
        /// The run.
        run: RunId,
        /// Whether the ended record is on the volume.
        result: Result<(), WriteError>,
    },
    /// A removal finished.
    Removed {
        /// The run.
        run: RunId,
        /// Whether the record is gone.
        result: Result<(), WriteError>,
    },
    /// A rescan finished.
    Table(Table),
}

impl Completion {
    /// The opening of a store that cannot be used (`error` says why): the one stand-in for a
    /// store that never opened (no recorder thread, or it died).
    pub fn not_usable(error: String) -> Completion {
        Completion::Opened {
            result: Err(error),
            table: None,
            passwd_user: None,
            location: None,
            beat: None,
            lock: None,
        }
    }
}

/// The recorder is gone: its state, with its end of the channel, was dropped (a panic in its
/// thread; a thread that ends while idle hands its state back to the [`Recorder`] instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the recorder thread is gone")]
pub struct Gone;
