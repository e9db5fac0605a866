//! The loop's in-memory book of lock-owner records: the store's state, each state-locking run's
//! record, and the table of records the recorder last scanned. Pure: no I/O, no clock of its own
//! (every call gets `now`), so every decision the loop takes about records is unit-tested here.
//!
//! The loop calls [`Book::begin`] for a state-locking run, sends the requests the book returns to
//! the [`Recorder`](super::recorder::Recorder), feeds every completion to
//! [`Book::on_completion`] and calls [`Book::tick`] at [`Book::next_wakeup`]; the [`Event`]s it
//! gets back say which waiting run may start and what to log.
//!
//! `Book` owns the store-wide state; each state machine is an `impl Book` block in a file of its
//! own: `runs.rs` (each run's record), `store_state.rs` (the store's state), `fence.rs` (the
//! heartbeat and the fence), `table.rs` (the scanned table and liveness), `notice.rs` (the log
//! lines). Each run's record is not kept here but in the run's entry of the one table of runs,
//! [`RunTable`] (`run_table.rs`), beside the run's own state: the loop's runs concern holds the
//! table, and every call of the book that concerns runs is handed it. Only this module reads or
//! writes a record part ([`RunRecord`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::labels::{StoreFault, StoreStatus};
use super::liveness::{Fence, Observer};
use super::names::RunId;
use super::record::Owner;
use super::record_id::RecordId;
use super::recorder::{Completion, Entry, Table, WriteError};
use crate::mutation::{self, Guard};

mod fence;
#[cfg(test)]
mod fixture;
mod notice;
mod run_table;
mod runs;
mod store_state;
mod table;

pub use fence::FenceStage;
pub use notice::Notice;
pub use run_table::{Left, RunTable};
pub use runs::{LiveRun, NewRun, RecordStatus, RunRecord};
pub use store_state::{StoreState, NOT_ANSWERING_EVERY};

/// What the loop does with a new state-locking run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// Start terraform now without a record; log the notice first, when there is one.
    Unrecorded(Option<Notice>),
    /// Send [`Work::Create`](super::recorder::Work::Create) now; the run waits in
    /// `recording` until an [`Event::Start`] for it, at the latest `deadline` (then
    /// [`Book::tick`] gives that event).
    Record {
        /// now + TFINIT_RECORD_TIMEOUT.
        deadline: Instant,
    },
}

/// Something the loop must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Log this.
    Log(Notice),
    /// The run waiting in `recording` may start; `recorded` says whether its record is on the
    /// volume.
    Start {
        /// The run.
        run: RunId,
        /// Whether its record is on the volume.
        recorded: bool,
    },
    /// This owner's heartbeat has not landed for long: stop its state-locking runs before any
    /// observer may call it dead (locks::liveness::Fence).
    Fence {
        /// The runs whose record is, or may soon be, on the volume.
        runs: Vec<RunId>,
        /// false: their one graceful SIGTERM; true: SIGKILL of what is left.
        kill: bool,
    },
}

/// The records part of `tfinit status`.
#[derive(Debug, Clone, PartialEq)]
pub struct View {
    /// The store's state.
    pub state: StoreStatus,
    /// Age of the last successful heartbeat write; None before the first one.
    pub heartbeat_age: Option<Duration>,
    /// Records whose lock a recovery found it cannot release: a person must.
    pub needing_person: usize,
    /// Heartbeat writes that failed since the init started, by [`StoreFault::ALL`]'s order.
    pub heartbeat_failures: [u64; StoreFault::ALL.len()],
}

/// What the loop knows about records.
#[derive(Debug)]
pub struct Book {
    state: StoreState,
    /// Where the records are, for messages: TFINIT_STATE_DIR until the store's opening says
    /// which store TFINIT_STORE chose (the Leases of a namespace, or the directory).
    dir: String,
    me: Owner,
    ttl: Duration,
    record_timeout: Duration,
    auto_unlock: bool,
    host: String,
    passwd_user: Option<String>,
    table: Option<Table>,
    /// Records of the last table whose lock needs a person (counted when a table comes in, not
    /// at every look: the loop reads it after each wake-up, and a table may hold thousands).
    needing_person: usize,
    /// Our own end-markings and removals since they became durable, by record id (Some: the
    /// ended record; None: removed): they count until a table scanned after them arrives.
    own: HashMap<RecordId, (Instant, Option<Entry>)>,
    /// When the last recovery in each directory finished: the table counts there again once it
    /// was scanned after that.
    recovered: HashMap<PathBuf, Instant>,
    /// When the last successful heartbeat was stamped.
    heartbeat_ok: Option<Instant>,
    stale_reported: bool,
    /// What this incarnation has seen of other incarnations' heartbeats.
    observer: Observer,
    /// Incarnations the kernel proves gone, as of the last table.
    gone: Vec<String>,
    /// Incarnations a process of which the kernel says holds their lock file (alive).
    held: Vec<String>,
    /// Another live incarnation of our name was reported.
    shared_reported: bool,
    fence: FenceStage,
    /// While the store cannot be written: where records of this host's `Who` keep state-locking
    /// runs from starting ([`Book::may_launch`]).
    shadowed: Vec<PathBuf>,
    /// Heartbeat writes that failed, by [`StoreFault::ALL`]'s order, and the kind of failure
    /// last reported (until a heartbeat lands): each kind is said once, not every TTL/3.
    heartbeat_failures: [u64; StoreFault::ALL.len()],
    heartbeat_fault: Option<StoreFault>,
}

/// Whether a state-locking run may start terraform now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launch {
    /// It may.
    Yes,
    /// Not while this owner's heartbeat does not land (the fence is up).
    Fenced,
    /// Not while the store cannot be written and a record with this pod's `Who` is on it, or
    /// its records cannot be listed (in any working directory: another may lock the same
    /// state).
    Shadowed,
    /// Not before a heartbeat of this incarnation is on the volume, while the store has not
    /// opened (it hangs, or it did not answer in time): other pods cannot know it is alive, nor
    /// can it read whether a dead earlier run with its `Who` has a record there (the rule for a
    /// store that fails at open, [`Launch::Shadowed`], needs that reading).
    Unseen,
}

impl Book {
    /// A book for owner `me` with the store at `dir` being opened since `now`; `observer` judges
    /// other incarnations (its own TTL is this owner's TFINIT_OWNER_TTL).
    pub fn new(
        dir: &Path,
        me: Owner,
        observer: Observer,
        record_timeout: Duration,
        auto_unlock: bool,
        host: String,
        now: Instant,
    ) -> Book {
        Book {
            state: StoreState::Opening { since: now },
            dir: dir.display().to_string(),
            me,
            ttl: observer.ttl(),
            record_timeout,
            auto_unlock,
            host,
            passwd_user: None,
            table: None,
            needing_person: 0,
            own: HashMap::new(),
            recovered: HashMap::new(),
            heartbeat_ok: None,
            stale_reported: false,
            observer,
            gone: Vec::new(),
            held: Vec::new(),
            shared_reported: false,
            fence: FenceStage::Clear,
            shadowed: Vec::new(),
            heartbeat_failures: [0; StoreFault::ALL.len()],
            heartbeat_fault: None,
        }
    }

    /// This incarnation.
    pub fn owner(&self) -> &Owner {
        &self.me
    }

    /// Takes in what the recorder did, at `now` (`runs`: the table whose entries hold the runs'
    /// records).
    pub fn on_completion<R>(
        &mut self,
        runs: &mut RunTable<R, RunRecord>,
        c: Completion,
        now: Instant,
    ) -> Vec<Event> {
        let mut ev = Vec::new();
        // Where the records are, as the opening says it (which store TFINIT_STORE chose): what
        // every message about the store names from now on.
        if let Completion::Opened {
            location: Some(l), ..
        } = &c
        {
            self.dir.clone_from(l);
        }
        match c {
            Completion::Opened {
                result: Ok(()),
                table,
                passwd_user,
                beat,
                ..
            } => self.opened(table, passwd_user, beat, now, &mut ev),
            Completion::Opened {
                result: Err(error),
                passwd_user,
                table,
                ..
            } => self.open_failed(runs, error, passwd_user, table, &mut ev),
            Completion::Heartbeat {
                result: Ok(()),
                stamped,
                ..
            } => self.beat_landed(stamped, now, &mut ev),
            // The next heartbeat's age still counts from the last one that landed.
            Completion::Heartbeat {
                result: Err(error), ..
            } => self.beat_failed(error, &mut ev),
            Completion::Created { run, result } => self.created(runs, run, result, &mut ev),
            Completion::Written { run, result } => match result {
                Ok(()) => self.answered(&mut ev),
                // A run without a record has nothing to rewrite: said when its create failed.
                Err(WriteError::NoRecord) => {}
                Err(error) => ev.push(Event::Log(Notice::ProgressFailed { run, error })),
            },
            Completion::Ended { run, result } => {
                let failed = |run, error| Notice::EndFailed { run, error };
                self.closed(runs, run, result, failed, now, &mut ev)
            }
            Completion::Removed { run, result } => {
                let failed = |run, error| Notice::RemoveFailed { run, error };
                self.closed(runs, run, result, failed, now, &mut ev)
            }
            Completion::Table(t) => {
                self.own.retain(|_, (at, _)| *at > t.scanned);
                self.recovered.retain(|_, at| *at > t.scanned);
                self.take_table(t, &mut ev);
            }
        }
        ev
    }

    /// Time-driven work: runs whose record did not land in time start without one, the heartbeat
    /// is asked for when due, and a stale heartbeat is reported once.
    pub fn tick<R>(&mut self, runs: &mut RunTable<R, RunRecord>, now: Instant) -> Vec<Event> {
        let mut ev = Vec::new();
        // Oldest first (the table is ordered by id).
        let mut expired: Vec<RunId> = Vec::new();
        for (id, r) in runs.records_mut() {
            let Some(r) = r.open_mut() else { continue };
            if matches!(r.record, RecordStatus::Pending { deadline } if deadline <= now) {
                r.record = RecordStatus::Abandoned;
                expired.push(id);
            }
        }
        for id in expired {
            if !matches!(self.state, StoreState::NotAnswering { .. }) {
                self.state = StoreState::NotAnswering {
                    since: now,
                    last_warned: now,
                };
            }
            // A run of an incarnation no heartbeat of which landed is refused when it asks to
            // start (Launch::Unseen), which says why: "starts without a record" would be wrong.
            if self.heartbeat_ok.is_some() {
                ev.push(Event::Log(Notice::RecordTimeout {
                    run: id,
                    dir: self.dir.clone(),
                    timeout: self.record_timeout,
                }));
            }
            ev.push(Event::Start {
                run: id,
                recorded: false,
            });
        }
        if let Some(f) = self.fence_due(runs, now) {
            ev.push(f);
        }
        if !self.stale_reported && self.heartbeat_stale(now) && self.has_records(runs) {
            self.stale_reported = true;
            ev.push(Event::Log(Notice::HeartbeatStale {
                dir: self.dir.clone(),
                age: self.heartbeat_age(now).unwrap_or_default(),
                ttl: self.ttl,
            }));
        }
        ev
    }

    /// Whether state-locking `run` may start terraform now: not while the fence is up (its lock
    /// would carry the Who of an owner other pods may soon take for dead), recorded or not. A run
    /// the book does not know (it takes no lock) always may.
    pub fn may_launch<R>(&self, runs: &RunTable<R, RunRecord>, run: RunId) -> Launch {
        if runs.record_status(run).is_none() {
            return Launch::Yes;
        }
        if self.fence != FenceStage::Clear {
            return Launch::Fenced;
        }
        if self.state == StoreState::Failed {
            // In every directory, not only those of the records: a directory's path does not say
            // which state its runs lock (a symbolic link, a backend naming the same key).
            let unseen = !self.shadowed.is_empty() || self.unlisted().is_some();
            if unseen && mutation::on(Guard::Shadowed) {
                return Launch::Shadowed;
            }
        } else if self.heartbeat_ok.is_none() && mutation::on(Guard::Unseen) {
            return Launch::Unseen;
        }
        Launch::Yes
    }

    /// When [`Book::tick`] has work next.
    pub fn next_wakeup<R>(&self, runs: &RunTable<R, RunRecord>) -> Option<Instant> {
        let deadlines = runs.open_records().filter_map(|(_, r)| match r.record {
            RecordStatus::Pending { deadline } => Some(deadline),
            _ => None,
        });
        let stale = self
            .heartbeat_ok
            .filter(|_| !self.stale_reported && self.has_records(runs))
            .map(|t| t + self.ttl / 2 + Duration::from_millis(1));
        let fence = self
            .heartbeat_ok
            .filter(|_| runs.open_records().next().is_some())
            .and_then(|b| {
                let f = Fence::after(b, self.ttl);
                match self.fence {
                    FenceStage::Clear => Some(f.stop_at),
                    FenceStage::Stopping => Some(f.kill_at),
                    FenceStage::Killing => None,
                }
            });
        deadlines.chain(stale).chain(fence).min()
    }

    /// The records part of `tfinit status`.
    pub fn view(&self, now: Instant) -> View {
        let state = match self.state {
            StoreState::Opening { .. } => StoreStatus::Opening,
            StoreState::Failed => StoreStatus::Failed,
            StoreState::NotAnswering { .. } => StoreStatus::NotAnswering,
            StoreState::Open if self.heartbeat_stale(now) => StoreStatus::HeartbeatStale,
            StoreState::Open => StoreStatus::Open,
        };
        View {
            state,
            heartbeat_age: self.heartbeat_age(now),
            needing_person: self.needing_person,
            heartbeat_failures: self.heartbeat_failures,
        }
    }
}
