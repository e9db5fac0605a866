//! The book's test fixture: a book, the tables and completions the recorder would send, and
//! owners and records to put in them, shared by the tests of every file of the book.

use std::path::Path;
use std::time::{Duration, Instant};

use super::{Book, Event, Launch, LiveRun, NewRun, RecordStatus, RunRecord, RunTable, Start};
use crate::locks::liveness::{Facts, Observer};
use crate::locks::names::RunId;
use crate::locks::record::Ended;
use crate::locks::record::{Heartbeat, Owner};
pub(super) use crate::locks::recorder::tests::me;
use crate::locks::recorder::{Beat, Completion, Entry, Table, Work};

pub(super) const TTL: Duration = Duration::from_secs(30);

/// A state-locking `apply` of `run` in `workdir`, started at T0.
pub(super) fn new_run<'a>(
    run: RunId,
    workdir: &'a Path,
    workspace: &'a str,
    env: &'a [String],
) -> NewRun<'a> {
    NewRun {
        run,
        workdir,
        workspace,
        subcommand: "apply",
        argv: &[],
        env,
        started_ms: T0,
    }
}
pub(super) const TIMEOUT: Duration = Duration::from_secs(10);
pub(super) const T0: u64 = 1_800_000_000_000;

pub(super) fn book(t: Instant) -> Booked {
    Booked::new(Book::new(
        Path::new("/state"),
        me(),
        Observer::new(TTL, crate::locks::liveness::LONGEST_TTL),
        TIMEOUT,
        true,
        "pod-a".into(),
        t,
    ))
}

pub(super) fn table(at: Instant, records: Vec<Entry>, heartbeats: Vec<Heartbeat>) -> Table {
    Table {
        scanned: at,
        records,
        beats: heartbeats
            .into_iter()
            .map(|h| Beat {
                owner: h.owner.clone(),
                heartbeat: Some(h),
                started: at,
                done: at,
            })
            .collect(),
        gone: Vec::new(),
        held: Vec::new(),
        unlisted: None,
        unread: Vec::new(),
    }
}

pub(super) fn opened(t: Instant, table: Table) -> Completion {
    Completion::Opened {
        result: Ok(()),
        table: Some(table),
        passwd_user: None,
        location: None,
        beat: Some(t),
        lock: None,
    }
}

pub(super) fn open_book(t: Instant) -> Booked {
    let mut b = book(t);
    b.on_completion(opened(t, table(t, vec![], vec![])), t);
    b
}

pub(super) fn other(name: &str, started_ms: u64) -> Owner {
    Owner {
        name: name.into(),
        started_ms,
        ..me()
    }
}

pub(super) fn entry(path: &str, workdir: &str, owner: Owner, updated_ms: u64) -> Entry {
    Entry {
        path: path.into(),
        workdir: workdir.into(),
        who: format!("@{}", owner.name),
        facts: Facts {
            owner,
            updated_ms,
            ended: None,
            needs_person_by: None,
            ttl: Some(TTL),
        },
    }
}

pub(super) fn logs(ev: &[Event]) -> Vec<String> {
    ev.iter()
        .filter_map(|e| match e {
            Event::Log(n) => Some(n.message()),
            _ => None,
        })
        .collect()
}

pub(super) fn failed_open(t: Instant, records: Vec<Entry>) -> Completion {
    Completion::Opened {
        result: Err("No space left on device (os error 28)".into()),
        table: Some(table(t, records, vec![])),
        passwd_user: None,
        location: None,
        beat: None,
        lock: None,
    }
}

pub(super) fn begin(b: &mut Booked, run: RunId, now: Instant) -> Start {
    b.begin(&new_run(run, Path::new("/tf/x"), "default", &[]), now, None)
}

/// Begins run `run` in /tf/x and lands its record as `path`.
pub(super) fn recorded(b: &mut Booked, run: RunId, path: &str, now: Instant) -> Vec<Event> {
    begin(b, run, now);
    b.on_completion(
        Completion::Created {
            run,
            result: Ok(path.into()),
        },
        now,
    )
}

pub(super) fn beat(owner: Owner, seq: u64, updated_ms: u64) -> Heartbeat {
    Heartbeat {
        v: crate::locks::record::HEARTBEAT_FORMAT,
        owner,
        seq,
        updated_ms,
        holds_lock: true,
        host: String::new(),
        ttl_ms: Some(30_000),
        lock_file: None,
    }
}

/// A book with the one table of runs it keeps the records in, as the loop has them: a run is put
/// in the table as it begins and taken out as it exits (what the runs concern does), so the
/// tests read like calls of the book alone.
#[derive(Debug)]
pub(super) struct Booked {
    pub(super) book: Book,
    pub(super) runs: RunTable<(), RunRecord>,
}

impl std::ops::Deref for Booked {
    type Target = Book;
    fn deref(&self) -> &Book {
        &self.book
    }
}

impl std::ops::DerefMut for Booked {
    fn deref_mut(&mut self) -> &mut Book {
        &mut self.book
    }
}

impl Booked {
    pub(super) fn new(book: Book) -> Booked {
        Booked {
            book,
            runs: RunTable::new(),
        }
    }

    pub(super) fn begin(&mut self, new: &NewRun<'_>, now: Instant, d: Option<Instant>) -> Start {
        self.runs.insert(new.run, ());
        self.book.begin(&mut self.runs, new, now, d)
    }

    pub(super) fn exited(&mut self, run: RunId, e: Option<Ended>, ip: Vec<String>) -> Option<Work> {
        let (_, left) = self.runs.remove(&run)?;
        self.book.exited(&mut self.runs, left, e, ip)
    }

    pub(super) fn on_completion(&mut self, c: Completion, now: Instant) -> Vec<Event> {
        self.book.on_completion(&mut self.runs, c, now)
    }

    pub(super) fn tick(&mut self, now: Instant) -> Vec<Event> {
        self.book.tick(&mut self.runs, now)
    }

    pub(super) fn next_wakeup(&self) -> Option<Instant> {
        self.book.next_wakeup(&self.runs)
    }

    pub(super) fn may_launch(&self, run: RunId) -> Launch {
        self.book.may_launch(&self.runs, run)
    }

    pub(super) fn record(&self, run: RunId) -> Option<&RecordStatus> {
        self.book.record(&self.runs, run)
    }

    pub(super) fn progress(&self, run: RunId, in_progress: Vec<String>) -> Option<Work> {
        self.book.progress(&self.runs, run, in_progress)
    }

    pub(super) fn live_runs(&self) -> Vec<LiveRun> {
        self.book.live_runs(&self.runs)
    }

    pub(super) fn needs_recovery(&self, workdir: &Path, now: Instant) -> bool {
        self.book.needs_recovery(&self.runs, workdir, now)
    }

    pub(super) fn may_recover(&self, workdir: &Path) -> bool {
        self.book.may_recover(&self.runs, workdir)
    }
}
