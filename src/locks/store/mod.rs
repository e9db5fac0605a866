//! Where lock-owner records and heartbeats live: one [`Store`] trait for every reader and writer
//! (the recorder thread, the recovery helper, `tfinit recover`), and its implementations:
//! [`FileStore`] in TFINIT_STATE_DIR, and [`KubeStore`] in Leases of the pod's namespace
//! (`kube/`: its objects and what each API answer does are documented there).
//!
//! The file store's layout: `records/<owner>.<incarnation>.json`, every record of one incarnation
//! (its state-locking runs in flight, or killed: one atomic write per batch of the recorder,
//! `incarnation/`), the first layout's `records/<owner>.<incarnation>.<run>.json` still read, and
//! `owners/<owner>.<incarnation>.json`, each incarnation's heartbeat;
//! `recover.lock` serialises recoveries. Every write is atomic (temporary file, fsync, rename,
//! fsync of the directory), so a reader sees a whole file or none. Every call may block for as
//! long as the volume takes: only the recorder thread and helper processes call it, never the
//! PID-1 loop.
//!
//! Anything else may sit in the directory (a FIFO, a device, a symbolic link to anywhere, a file
//! of gigabytes): files are opened with `O_NOFOLLOW | O_NONBLOCK` and used only when `fstat` says
//! they are regular files (`fsio.rs`'s `open_regular`), so no entry can block a reader or steer it
//! elsewhere; an entry that is not a regular file is named in a warning and left for a person.
//!
//! Files: `file.rs` ([`FileStore`]), `incarnation/` (its records, a file per incarnation),
//! `fsio.rs` (the file system calls), `kernel.rs` (what a
//! flock proves of an incarnation), `report.rs` (what a reader says of a record it cannot use),
//! `kube/` ([`KubeStore`]), `choose.rs` (which one TFINIT_STORE picks: [`chosen`]).

use std::io;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::record::{FileId, Found, Heartbeat, Owner, Record, FORMAT};

mod choose;
mod file;
mod fsio;
mod incarnation;
mod kernel;
pub mod kube;
mod report;

pub use choose::{chosen, chosen_with};
pub use file::FileStore;
pub use incarnation::{FILE_FORMAT, MAX_INCARNATION_FILE};
pub use kube::KubeStore;

/// Which record of a store (see [`crate::locks::record_id`]).
pub use super::record_id::RecordId;
pub use fsio::{atomic_write, remove};
pub use kernel::{kernel_proof_with, same_lock_file};
pub use report::{set_aside_corrupt, warn_left_alone, warn_unlisted, warn_unreadable};

/// Why a record is set aside (renamed so no recovery reads it again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Aside {
    /// It cannot be read (`*.corrupt`); the text says why.
    Corrupt(String),
    /// Its lock must be released by hand (`*.manual`).
    Manual,
}

/// The exclusive right to recover records in a store; released on drop.
pub struct RecoveryLock {
    _held: Box<dyn Send>,
    /// For a right that must be renewed (the Kubernetes store's Lease): until when, on this
    /// process's clock, it is surely still this process's. None: held until dropped (a flock).
    fence: Option<Arc<Mutex<Instant>>>,
}

impl RecoveryLock {
    /// The right `held` stands for (released when it is dropped), surely this process's until
    /// the instant in `fence` (which its renewals move on), or until dropped (`fence` None).
    pub fn new(held: Box<dyn Send>, fence: Option<Arc<Mutex<Instant>>>) -> RecoveryLock {
        RecoveryLock { _held: held, fence }
    }

    /// Whether the right is surely still this process's: always for a flock; for a Lease, until
    /// 2/3 of its duration after the last renewal that landed (a waiter takes it only after
    /// watching it unrenewed for all of it). A recovery checks it before each release.
    pub fn held(&self) -> bool {
        self.held_at(Instant::now())
    }

    /// [`held`](RecoveryLock::held) at `now`, an instant of this process's monotonic clock.
    pub fn held_at(&self, now: Instant) -> bool {
        self.fence.as_ref().is_none_or(|f| match f.lock() {
            Ok(until) => now < *until,
            Err(_) => false,
        })
    }
}

impl std::fmt::Debug for RecoveryLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecoveryLock")
    }
}

/// One change of a batch ([`Store::apply`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Write this record, new or rewritten (as [`Store::write`]).
    Put(Box<Record>),
    /// Remove this record (as [`Store::remove`]).
    Remove(RecordId),
}

/// All storage of records and heartbeats. Every method may block on the volume.
pub trait Store: Send {
    /// Where the store is, for messages (the state directory).
    fn location(&self) -> String;

    /// Prepares the store for writing: creates what is missing, proves it writable, and removes
    /// hidden temporary files older than `stale_temp` (left by writers that died mid-write).
    fn open(&self, stale_temp: Duration) -> io::Result<()>;

    /// Every record, parsed or not, in a stable order; a listing that got no answer is
    /// [`Found::Unlisted`] (its records are unknown, not absent).
    fn list(&self) -> Vec<Found>;

    /// Reads one record.
    fn read(&self, id: &RecordId) -> io::Result<Record>;

    /// Writes `record` atomically (creating or rewriting it) and returns its id. What is written
    /// is [`Record::fitted`], and only when it reads back, so every record file can be read.
    fn write(&self, record: &Record) -> io::Result<RecordId>;

    /// Removes a record; a missing one is fine.
    fn remove(&self, id: &RecordId) -> io::Result<()>;

    /// Applies a batch of changes (the recorder's group commit: every record change of one
    /// incarnation pending at one moment), as few writes as the store can make of it; returns
    /// each change's result, in order (a put's id; a removal's id as given). A store that can do
    /// no better than one change after the other: the default.
    fn apply(&self, changes: &[Change]) -> Vec<io::Result<RecordId>> {
        changes.iter().map(|c| self.apply_one(c)).collect()
    }

    /// One change of a batch on its own: a put is [`write`](Store::write), a removal
    /// [`remove`](Store::remove) (its id as given).
    fn apply_one(&self, change: &Change) -> io::Result<RecordId> {
        match change {
            Change::Put(r) => self.write(r),
            Change::Remove(id) => self.remove(id).map(|()| id.clone()),
        }
    }

    /// Sets a record aside so no recovery reads it again; returns its new id.
    fn set_aside(&self, id: &RecordId, why: &Aside) -> io::Result<RecordId>;

    /// Reads one incarnation's heartbeat (`owners/<name>.<incarnation>.json`; for an incarnation
    /// of the first format, the shared `owners/<name>.json` when it is that incarnation's).
    /// Ok(None): the store answered that there is none (missing, or not a heartbeat: its owner's
    /// next beat replaces it). Err: the store gave no answer (an I/O error, an API down or
    /// refusing): nothing is known, and a caller must not take it for "missing, unchanged",
    /// which would let a TTL of failed reads call a live owner dead.
    fn read_heartbeat(&self, owner: &Owner) -> io::Result<Option<Heartbeat>>;

    /// The heartbeats of every incarnation named `name` (to tell that two live inits share it);
    /// Err when the store gave no (whole) answer.
    fn heartbeats_named(&self, name: &str) -> io::Result<Vec<Heartbeat>>;

    /// The heartbeats of every incarnation (current format), to tell which hosts live tfinits
    /// run on; Err when the store gave no (whole) answer (a tfinit it did not list may be alive).
    fn heartbeats(&self) -> io::Result<Vec<Heartbeat>>;

    /// Writes `hb`, its incarnation's heartbeat.
    fn write_heartbeat(&self, hb: &Heartbeat) -> io::Result<()>;

    /// Removes heartbeats (and incarnation lock files) of incarnations that have no record in
    /// `records` and whose heartbeat says it was last written longer than `older_than` ago by
    /// this node's clock: cleaning only (pods of a Deployment come and go under new names), never
    /// a liveness decision, since an incarnation with no record has no lock to lose. With
    /// `listed_all` (`records` is every record of the store: the listing answered and each record
    /// parsed), also those the kernel proves gone ([`kernel_proof`](Store::kernel_proof)),
    /// whatever their age: each restart of a container on a local volume would otherwise leave a
    /// heartbeat that every later start reads and watches for a day.
    fn prune_heartbeats(
        &self,
        records: &[Record],
        me: &Owner,
        older_than: Duration,
        listed_all: bool,
    );

    /// Takes this incarnation's lock file (`owners/<name>.<incarnation>.lock`) with an exclusive
    /// flock, kept for the life of the process, and returns a descriptor of it (close-on-exec)
    /// that every terraform run inherits: the kernel frees the flock only once the last process
    /// holding the descriptor is gone. None when the state directory is not on a local
    /// filesystem: there a free flock proves nothing, and a descriptor every terraform holds
    /// would make each one's exit wait on the volume (FUSE and NFS talk to their server when a
    /// descriptor is closed). With the descriptor, the file's device and inode: the heartbeat
    /// names them, so that a free flock proves something only on this very file.
    /// A store with no lock file (the Kubernetes store) holds none: the default.
    fn hold_incarnation_lock(&self, _me: &Owner) -> io::Result<Option<(OwnedFd, FileId)>> {
        Ok(None)
    }

    /// Whether the kernel proves every process of `owner` gone: its lock file is on a local
    /// filesystem of this kernel, it is the file `file` (device and inode, as the incarnation's
    /// heartbeat names it: a file that replaced it at that path proves nothing), and its flock is
    /// free. Some(false): it is held (alive); None: nothing proven (network filesystem, no lock
    /// file, another file, an error). Callers go through [`kernel_proof`](Store::kernel_proof), which checks the rest.
    /// A store with no lock file proves nothing: the default.
    fn incarnation_gone(&self, _owner: &Owner, _file: FileId) -> Option<bool> {
        None
    }

    /// What the kernel proves of `owner` for observer `me`, given `hb`, that incarnation's
    /// heartbeat as just read: Some(true) every process of it is gone, Some(false) one holds its
    /// lock file (alive), None nothing. Only for an incarnation of this kernel (boot id) whose
    /// heartbeat says it held its lock file and names that file's device and inode (a heartbeat
    /// of a tfinit before record format 4 names none: its owner is watched instead).
    fn kernel_proof(&self, me: &Owner, owner: &Owner, hb: Option<&Heartbeat>) -> Option<bool> {
        kernel_proof_with(me, owner, hb, |file| self.incarnation_gone(owner, file))
    }

    /// Takes the exclusive right to recover in this store, waiting up to `wait` for another
    /// recovery (another pod's, or a `tfinit recover`) to finish.
    fn lock_recovery(&self, wait: Duration) -> io::Result<RecoveryLock>;

    /// Sets corrupt records aside (only those: no live owner has one, see [`Found::Corrupt`]) and
    /// warns about the files left alone; returns the parsed records. Never fails: a problem with
    /// one record is that record's warning.
    fn sweep(&self) -> Vec<(RecordId, Record)> {
        self.sweep_listed().0
    }

    /// [`sweep`](Store::sweep), and whether the records returned are all the store holds: false
    /// when the listing got no answer or a record was left unread (unreadable, of a newer format,
    /// left alone), since that record's owner is unknown.
    fn sweep_listed(&self) -> (Vec<(RecordId, Record)>, bool) {
        let mut out = Vec::new();
        let mut listed_all = true;
        for f in self.list() {
            // A record not read (no answer, unreadable, newer, left alone) has an unknown owner.
            listed_all &= matches!(f, Found::Record(..) | Found::Corrupt(..));
            match f {
                Found::Record(p, r) => out.push((p, *r)),
                Found::Corrupt(p, problem) => set_aside_corrupt(self, &p, &problem),
                Found::Future(p, v) => tracing::warn!(
                    file = %p, version = v, this_version = FORMAT,
                    "lock-owner record of a newer tfinit format is left alone; upgrade this tfinit, or recover that lock with the newer one"
                ),
                Found::Unreadable(p, e) => warn_unreadable(&p, &e),
                Found::LeftAlone(p, why) => warn_left_alone(&p, &why),
                Found::Unlisted(why) => warn_unlisted(&self.location(), &why),
            }
        }
        (out, listed_all)
    }

    /// The opening's cleaning: [`sweep_listed`](Store::sweep_listed), then
    /// [`prune_heartbeats`](Store::prune_heartbeats) of the incarnations without a record.
    fn tidy(&self, me: &Owner, older_than: Duration) {
        let (swept, listed_all) = self.sweep_listed();
        let records: Vec<Record> = swept.into_iter().map(|(_, r)| r).collect();
        self.prune_heartbeats(&records, me, older_than, listed_all);
    }
}

#[cfg(test)]
mod recovery_lock_tests {
    use super::*;

    fn with_fence(until: Instant) -> RecoveryLock {
        RecoveryLock {
            _held: Box::new(()),
            fence: Some(Arc::new(Mutex::new(until))),
        }
    }

    #[test]
    fn a_lease_right_is_held_until_its_fence_and_a_flock_until_dropped() {
        let now = Instant::now();
        assert!(with_fence(now + Duration::from_secs(60)).held());
        assert!(!with_fence(now).held(), "a fence that passed: not held");
        let flock = RecoveryLock {
            _held: Box::new(()),
            fence: None,
        };
        assert!(flock.held());
        // A renewal that lands moves the fence on: held again.
        let lease = with_fence(now);
        *lease.fence.as_ref().unwrap().lock().unwrap() = now + Duration::from_secs(60);
        assert!(lease.held());
    }
}
