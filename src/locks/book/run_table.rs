//! The one table of runs: an entry per run holds the runs concern's part (`R`: its life) and the
//! records concern's part (`C`: what its lock-owner record is doing) side by side, so the two
//! cannot drift apart as two tables keyed by `RunId` could.
//!
//! Each part has one writer. The runs concern adds and takes its part with the map-like methods
//! ([`RunTable::insert`], [`RunTable::remove`], ...), which see only run parts; the book reaches
//! the record parts through methods visible in `locks::book` alone. A record part is only ever
//! put beside a run part that is in the table ([`RunTable::put_record`]); a record is closed only
//! with the [`Left`] that [`RunTable::remove`] gives as the run part leaves (a record cannot
//! close beside a live run); and the entry stays while its record part does (an end-marking or
//! removal still on its way after its run left), so one table answers for the whole run.

use std::collections::BTreeMap;

use crate::locks::names::RunId;

/// A run's entry: its part of each concern.
#[derive(Debug)]
struct Entry<R, C> {
    /// The runs concern's part, until the run is over.
    run: Option<R>,
    /// The records concern's part, from the run's record's begin until its close is done.
    record: Option<C>,
}

/// Proof that a run's part left the table: what closing its record takes. Only
/// [`RunTable::remove`] makes one.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a run that left the table closes its record with this (Record::Close)"]
pub struct Left(RunId);

impl Left {
    /// The run that left.
    pub fn run(&self) -> RunId {
        self.0
    }
}

/// Every run, by id (arrival order), each with its run part and its record part.
#[derive(Debug)]
pub struct RunTable<R, C> {
    entries: BTreeMap<RunId, Entry<R, C>>,
    /// How many entries hold a run part (the runs concern's `len`, without a walk).
    runs: usize,
}

impl<R, C> Default for RunTable<R, C> {
    fn default() -> Self {
        RunTable {
            entries: BTreeMap::new(),
            runs: 0,
        }
    }
}

impl<R, C> RunTable<R, C> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    // ----- the runs concern's side: run parts only -----

    /// Adds run `id`'s part (ids are never reused: a new run has no entry yet).
    pub fn insert(&mut self, id: RunId, run: R) {
        let entry = self.entries.entry(id).or_insert(Entry {
            run: None,
            record: None,
        });
        if entry.run.replace(run).is_none() {
            self.runs += 1;
        }
    }

    /// Takes run `id`'s part out: the run is over. Its entry stays while its record part does;
    /// the [`Left`] is what closes that record.
    pub fn remove(&mut self, id: &RunId) -> Option<(R, Left)> {
        let entry = self.entries.get_mut(id)?;
        let run = entry.run.take()?;
        self.runs -= 1;
        if entry.record.is_none() {
            self.entries.remove(id);
        }
        Some((run, Left(*id)))
    }

    /// Run `id`'s part, while the run is in the table.
    pub fn get(&self, id: &RunId) -> Option<&R> {
        self.entries.get(id)?.run.as_ref()
    }

    /// See [`Self::get`].
    pub fn get_mut(&mut self, id: &RunId) -> Option<&mut R> {
        self.entries.get_mut(id)?.run.as_mut()
    }

    /// Whether run `id` is in the table.
    pub fn contains_key(&self, id: &RunId) -> bool {
        self.get(id).is_some()
    }

    /// The runs, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = (&RunId, &R)> {
        self.entries
            .iter()
            .filter_map(|(id, e)| Some((id, e.run.as_ref()?)))
    }

    /// The runs' parts, oldest first.
    pub fn values(&self) -> impl Iterator<Item = &R> {
        self.iter().map(|(_, r)| r)
    }

    /// The runs' ids, oldest first.
    pub fn keys(&self) -> impl Iterator<Item = &RunId> {
        self.iter().map(|(id, _)| id)
    }

    /// How many runs there are (records still closing after their run count in none).
    pub fn len(&self) -> usize {
        self.runs
    }

    /// Whether no run is left.
    pub fn is_empty(&self) -> bool {
        self.runs == 0
    }

    // ----- the book's side: record parts only -----

    /// Run `id`'s record part.
    pub(super) fn record(&self, id: &RunId) -> Option<&C> {
        self.entries.get(id)?.record.as_ref()
    }

    /// See [`Self::record`].
    pub(super) fn record_mut(&mut self, id: &RunId) -> Option<&mut C> {
        self.entries.get_mut(id)?.record.as_mut()
    }

    /// Puts a record part beside run `id`'s part; false (and nothing put) when the run is not in
    /// the table: a record never begins for a run that is over, or unknown.
    pub(super) fn put_record(&mut self, id: RunId, record: C) -> bool {
        match self.entries.get_mut(&id) {
            Some(e) if e.run.is_some() => {
                e.record = Some(record);
                true
            }
            _ => false,
        }
    }

    /// Takes the record part of a run that `left` the table; the entry goes with it.
    pub(super) fn take_record(&mut self, left: Left) -> Option<C> {
        let record = self.entries.get_mut(&left.0)?.record.take();
        // A run part cannot be back: ids are never reused.
        self.entries.remove(&left.0);
        record
    }

    /// Ends run `id`'s record part (its close is done): the entry goes too once its run left.
    pub(super) fn drop_record(&mut self, id: &RunId) -> Option<C> {
        let entry = self.entries.get_mut(id)?;
        let record = entry.record.take();
        if entry.run.is_none() {
            self.entries.remove(id);
        }
        record
    }

    /// Every record part, oldest first.
    pub(super) fn records(&self) -> impl Iterator<Item = (RunId, &C)> {
        self.entries
            .iter()
            .filter_map(|(id, e)| Some((*id, e.record.as_ref()?)))
    }

    /// See [`Self::records`].
    pub(super) fn records_mut(&mut self) -> impl Iterator<Item = (RunId, &mut C)> {
        self.entries
            .iter_mut()
            .filter_map(|(id, e)| Some((*id, e.record.as_mut()?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(n: u64) -> RunId {
        RunId::from(n)
    }

    #[test]
    fn a_record_part_is_put_only_beside_a_run_in_the_table() {
        let mut t: RunTable<&str, u32> = RunTable::new();
        assert!(!t.put_record(r(1), 7), "an unknown run gets no record part");
        assert!(t.records().next().is_none());
        t.insert(r(1), "run");
        assert!(t.put_record(r(1), 7));
        let (_, left) = t.remove(&r(1)).expect("in the table");
        assert!(
            !t.put_record(r(1), 8),
            "a run that left gets no new record part"
        );
        assert_eq!(t.record(&r(1)), Some(&7));
        assert_eq!(t.take_record(left), Some(7));
    }

    #[test]
    fn the_entry_stays_while_its_record_part_does_and_counts_as_no_run() {
        let mut t: RunTable<&str, u32> = RunTable::new();
        t.insert(r(1), "a");
        t.insert(r(2), "b");
        t.put_record(r(1), 1);
        let (run, left) = t.remove(&r(1)).expect("in the table");
        assert_eq!((run, left.run()), ("a", r(1)));
        // The runs concern sees one run; the record of the one that left is still on its way.
        assert_eq!(
            (t.len(), t.keys().copied().collect::<Vec<_>>()),
            (1, vec![r(2)])
        );
        assert!(!t.contains_key(&r(1)));
        assert_eq!(t.records().collect::<Vec<_>>(), [(r(1), &1)]);
        assert_eq!(t.drop_record(&r(1)), Some(1));
        assert!(
            !t.entries.contains_key(&r(1)),
            "both parts done: the entry goes"
        );
        // A run without a record part leaves no entry behind.
        let (_, _left) = t.remove(&r(2)).expect("in the table");
        assert!(t.is_empty() && t.entries.is_empty());
        assert!(t.remove(&r(2)).is_none(), "a run leaves once");
    }
}
