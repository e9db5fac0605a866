//! The requests waiting in the recorder, in the order they are done: the heartbeat first, then
//! the oldest create, then record writes in order, then a rescan. Pure: no I/O.

use std::collections::VecDeque;

use super::Work;
use crate::locks::names::RunId;

/// One unit of work picked from the [`Queue`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Chore {
    Heartbeat,
    Rescan,
    /// A record write, and how many write requests it stands for (merged progress).
    Write(Work, usize),
}

/// Requests waiting in the recorder, in the order they are done. Pure: no I/O.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    heartbeat: bool,
    rescan: bool,
    writes: VecDeque<(Work, usize)>,
}

impl Queue {
    /// Adds `r`. Returns the creates it cancelled (a remove for a run whose create never
    /// started) and how many write requests it dropped, so each still gets its answer.
    pub(crate) fn push(&mut self, r: Work) -> (Vec<RunId>, usize) {
        match r {
            Work::Heartbeat => self.heartbeat = true,
            Work::Rescan => self.rescan = true,
            Work::Progress {
                ref run,
                ref in_progress,
            } => {
                // Only the last queued write of this run may absorb it (order is kept).
                let last = self
                    .writes
                    .iter_mut()
                    .rev()
                    .find(|(w, _)| run_of(w) == Some(*run));
                if let Some((
                    Work::Progress {
                        in_progress: queued,
                        ..
                    },
                    n,
                )) = last
                {
                    queued.clone_from(in_progress);
                    *n += 1;
                    return (Vec::new(), 0);
                }
                self.writes.push_back((r, 1));
            }
            Work::End { ref run, .. } => {
                // The end carries the final in-progress set: queued progress is superseded.
                let dropped = self.drop_where(*run, |w| matches!(w, Work::Progress { .. }));
                self.writes.push_back((r, 1));
                return (Vec::new(), dropped);
            }
            Work::Remove { ref run } => {
                let mut cancelled = Vec::new();
                let mut dropped = 0;
                self.writes.retain(|(w, n)| {
                    if run_of(w) != Some(*run) {
                        return true;
                    }
                    if matches!(w, Work::Create { .. }) {
                        cancelled.push(*run);
                    } else {
                        dropped += n;
                    }
                    false
                });
                self.writes.push_back((r, 1));
                return (cancelled, dropped);
            }
            Work::Create { .. } => self.writes.push_back((r, 1)),
        }
        (Vec::new(), 0)
    }

    fn drop_where(&mut self, run: RunId, f: impl Fn(&Work) -> bool) -> usize {
        let mut dropped = 0;
        self.writes.retain(|(w, n)| {
            let drop = run_of(w) == Some(run) && f(w);
            if drop {
                dropped += n;
            }
            !drop
        });
        dropped
    }

    /// The next job: the heartbeat, then the oldest create (a run waits in `recording` for it,
    /// while nobody waits for another run's progress or removal; a run's own writes still follow
    /// its create), then writes in order, then a rescan.
    pub(crate) fn next(&mut self) -> Option<Chore> {
        if std::mem::take(&mut self.heartbeat) {
            return Some(Chore::Heartbeat);
        }
        let create = self
            .writes
            .iter()
            .position(|(w, _)| matches!(w, Work::Create { .. }));
        if let Some((w, n)) = create.and_then(|i| self.writes.remove(i)) {
            return Some(Chore::Write(w, n));
        }
        if let Some((w, n)) = self.writes.pop_front() {
            return Some(Chore::Write(w, n));
        }
        std::mem::take(&mut self.rescan).then_some(Chore::Rescan)
    }
}

impl Queue {
    /// Every record write queued, in the order [`Queue::next`] would give them (creates first,
    /// then the rest in order): the rest of a batch.
    pub(crate) fn take_writes(&mut self) -> Vec<(Work, usize)> {
        let (mut creates, rest): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut self.writes)
            .into_iter()
            .partition(|(w, _)| matches!(w, Work::Create { .. }));
        creates.extend(rest);
        creates.into()
    }
}

fn run_of(r: &Work) -> Option<RunId> {
    match r {
        Work::Create { run, .. }
        | Work::Progress { run, .. }
        | Work::End { run, .. }
        | Work::Remove { run } => Some(*run),
        Work::Heartbeat | Work::Rescan => None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{create, ended, progress};
    use super::*;

    #[test]
    fn queue_keeps_each_records_order_and_merges_progress() {
        let mut q = Queue::default();
        q.push(create("r1"));
        q.push(progress("r1", &["a"]));
        q.push(progress("r1", &["a", "b"]));
        q.push(create("r2"));
        q.push(progress("r1", &["b"]));
        // r1's progress merges into its own last queued write: the third progress comes after
        // r2's create in arrival, yet it is r1's last write, so it merges. Creates go first (a
        // run waits for each), and r1's progress still follows r1's create.
        assert_eq!(q.next(), Some(Chore::Write(create("r1"), 1)));
        assert_eq!(q.next(), Some(Chore::Write(create("r2"), 1)));
        assert_eq!(q.next(), Some(Chore::Write(progress("r1", &["b"]), 3)));
        assert_eq!(q.next(), None);
        // Negative: progress never merges into a create or an end.
        q.push(create("r3"));
        q.push(progress("r3", &["x"]));
        assert_eq!(q.next(), Some(Chore::Write(create("r3"), 1)));
        assert_eq!(q.next(), Some(Chore::Write(progress("r3", &["x"]), 1)));
    }

    #[test]
    fn queue_remove_and_end_drop_what_they_supersede() {
        let mut q = Queue::default();
        q.push(progress("r1", &["a"]));
        q.push(progress("r2", &["z"]));
        q.push(progress("r1", &["a", "b"]));
        assert_eq!(
            q.push(Work::Remove {
                run: RunId::from(1)
            }),
            (vec![], 2)
        );
        assert_eq!(q.next(), Some(Chore::Write(progress("r2", &["z"]), 1)));
        assert_eq!(
            q.next(),
            Some(Chore::Write(
                Work::Remove {
                    run: RunId::from(1)
                },
                1
            ))
        );
        // A create that never started is cancelled by its run's removal.
        q.push(create("r4"));
        assert_eq!(
            q.push(Work::Remove {
                run: RunId::from(4)
            }),
            (vec![RunId::from(4)], 0)
        );
        assert_eq!(
            q.next(),
            Some(Chore::Write(
                Work::Remove {
                    run: RunId::from(4)
                },
                1
            ))
        );
        // An end carries the final set: queued progress goes, a queued create stays first.
        q.push(create("r5"));
        q.push(progress("r5", &["a"]));
        let end = Work::End {
            run: RunId::from(5),
            ended: ended(),
            in_progress: vec!["a".into()],
        };
        assert_eq!(q.push(end.clone()), (vec![], 1));
        assert_eq!(q.next(), Some(Chore::Write(create("r5"), 1)));
        assert_eq!(q.next(), Some(Chore::Write(end, 1)));
        assert_eq!(q.next(), None);
    }

    #[test]
    fn queue_puts_the_heartbeat_first_and_rescans_last() {
        let mut q = Queue::default();
        q.push(Work::Rescan);
        q.push(create("r1"));
        q.push(create("r2"));
        q.push(Work::Heartbeat);
        q.push(Work::Heartbeat);
        assert_eq!(q.next(), Some(Chore::Heartbeat));
        assert_eq!(q.next(), Some(Chore::Write(create("r1"), 1)));
        q.push(Work::Heartbeat);
        assert_eq!(q.next(), Some(Chore::Heartbeat));
        assert_eq!(q.next(), Some(Chore::Write(create("r2"), 1)));
        assert_eq!(q.next(), Some(Chore::Rescan));
        assert_eq!(
            q.next(),
            None,
            "two heartbeats asked while queued are one write"
        );
    }
}
