//! Today's book with the one table of runs it keeps their records in. In tfinit the runs concern
//! holds that table, putting a run's part in as the run starts and taking it out as the run ends;
//! here the simulated init has its own runs, so this puts a run's (empty) part in as its record
//! begins and takes it out as its record closes, which is where the real loop does too.

use std::path::Path;
use std::time::Instant;

use tfinit::locks::book::{
    Book, Event, Launch, LiveRun, NewRun, RecordStatus, RunRecord, RunTable, Start,
};
use tfinit::locks::names::RunId;
use tfinit::locks::record::Ended;
use tfinit::locks::recorder::{Completion, Work};

/// The real `Book`, and the table whose entries hold the runs' records.
#[derive(Debug)]
pub struct Booked {
    book: Book,
    runs: RunTable<(), RunRecord>,
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
    /// `book`, with no run yet.
    pub fn new(book: Book) -> Booked {
        Booked {
            book,
            runs: RunTable::new(),
        }
    }

    /// [`Book::begin`] of a run that enters the table now.
    pub fn begin(&mut self, new: &NewRun<'_>, now: Instant, d: Option<Instant>) -> Start {
        self.runs.insert(new.run, ());
        self.book.begin(&mut self.runs, new, now, d)
    }

    /// [`Book::exited`] of a run that leaves the table now.
    pub fn exited(&mut self, run: RunId, e: Option<Ended>, ip: Vec<String>) -> Option<Work> {
        let (_, left) = self.runs.remove(&run)?;
        self.book.exited(&mut self.runs, left, e, ip)
    }

    /// [`Book::on_completion`].
    pub fn on_completion(&mut self, c: Completion, now: Instant) -> Vec<Event> {
        self.book.on_completion(&mut self.runs, c, now)
    }

    /// [`Book::tick`].
    pub fn tick(&mut self, now: Instant) -> Vec<Event> {
        self.book.tick(&mut self.runs, now)
    }

    /// [`Book::next_wakeup`].
    pub fn next_wakeup(&self) -> Option<Instant> {
        self.book.next_wakeup(&self.runs)
    }

    /// [`Book::may_launch`].
    pub fn may_launch(&self, run: RunId) -> Launch {
        self.book.may_launch(&self.runs, run)
    }

    /// [`Book::record`].
    pub fn record(&self, run: RunId) -> Option<&RecordStatus> {
        self.book.record(&self.runs, run)
    }

    /// [`Book::live_runs`].
    pub fn live_runs(&self) -> Vec<LiveRun> {
        self.book.live_runs(&self.runs)
    }

    /// [`Book::needs_recovery`].
    pub fn needs_recovery(&self, workdir: &Path, now: Instant) -> bool {
        self.book.needs_recovery(&self.runs, workdir, now)
    }

    /// [`Book::may_recover`].
    pub fn may_recover(&self, workdir: &Path) -> bool {
        self.book.may_recover(&self.runs, workdir)
    }
}
