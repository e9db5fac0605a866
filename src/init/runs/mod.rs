//! The terraform runs the init started for shims. [`Runs`] owns them: each input (a shim's
//! request, a record that landed, terraform reaped, a shim gone, a timer, a shutdown step)
//! changes a run's [`Life`] and returns the [`Action`]s that follow. Nothing here touches a
//! process, a pipe's contents or a socket: the loop does what the actions say.
//!
//! One table holds every run ([`RunTable`]): each entry has the run's part (its [`Life`], written
//! here) and its record's part (written by the records concern alone, and read here through the
//! table's read-only view). So there is one table keyed by `RunId`, not two to keep in step: a
//! record part is put only beside a run that is in the table, closes only with the
//! [`Left`](crate::locks::book::Left) that [`Runs::take`] gets as the run leaves, and keeps the
//! entry until its end-marking or removal is done.
//!
//! The lock-owner records are read here, never written: through the book and the table,
//! read-only, and a change is asked for with an [`Action::Record`] (the loop hands the records
//! the table with it). Whatever must be decided after such a change is a follow-up action
//! ([`Action::Admit`], [`Action::Recheck`], [`Action::Recover`]) that the loop carries out after
//! it, so every decision reads the records as the changes asked before it left them. A
//! state-locking run's record begins only through its `Record::Begin` (launch.rs,
//! `record_step`) and closes only through the `Record::Close` that [`Runs::take`] asks for as it
//! takes the run's part out of the table.
//!
//! - launch.rs: from the request to terraform's start (refusal, the queue under
//!   TFINIT_MAX_RUNS, lock check, recovery, record).
//! - ending.rs: stopping, abandoning and ending runs (signals, exits, records closed, timers).
//! - cancel.rs: `tfinit cancel`, one run or a directory's runs stopped on an operator's request.

mod cancel;
mod ending;
mod launch;
mod life;

pub(super) use cancel::CancelTarget;

use std::num::NonZeroUsize;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

pub(in crate::init) use life::Run;
use life::{Life, Stop};

use super::action::{Action, Force};
use super::records::{Record, RecordEvent};
use super::token::{ConnId, Stream};
use crate::locks::book::{Book, RunRecord, RunTable};
use crate::locks::names::RunId;
use crate::locks::record::Ended;
use crate::protocol::RunStatus;

/// How long pipes held open by a leftover grandchild are drained after terraform exits.
pub(super) const LINGER: Duration = Duration::from_secs(2);

/// Every run, by id.
#[derive(Debug)]
pub(super) struct Runs {
    /// Ordered by id, which is arrival order: every walk over the runs (the queue, the runs that
    /// waited for the store, refusals, status, a directory's cancel) goes oldest first. Each
    /// entry also holds the run's record part, which only the records concern writes.
    table: RunTable<Run, RunRecord>,
    /// The id of the next run.
    next: RunId,
    /// TFINIT_RECORD_TIMEOUT: how long a state-locking run waits for the store at most.
    record_timeout: Duration,
    /// TFINIT_STOP_TIMEOUT: how long an abandoned or cancelled run may take to stop before its
    /// SIGKILL.
    stop_timeout: Duration,
    /// TFINIT_MAX_RUNS: how many runs may hold a place at once (None: no limit).
    max_runs: Option<NonZeroUsize>,
}

impl Runs {
    /// No runs yet.
    pub(super) fn new(
        record_timeout: Duration,
        stop_timeout: Duration,
        max_runs: Option<NonZeroUsize>,
    ) -> Runs {
        Runs {
            table: RunTable::new(),
            next: RunId::FIRST,
            record_timeout,
            stop_timeout,
            max_runs,
        }
    }

    /// The one table of runs, read-only: what the records of the runs say
    /// ([`RunTable::record_status`]), for the book's decisions.
    pub(in crate::init) fn table(&self) -> &RunTable<Run, RunRecord> {
        &self.table
    }

    /// The one table of runs, for the records concern to write the record parts in (generic
    /// over the run part, it can neither read nor build one).
    pub(in crate::init) fn records_mut(&mut self) -> &mut RunTable<Run, RunRecord> {
        &mut self.table
    }

    /// Whether no run is left.
    pub(super) fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// How many runs there are.
    pub(super) fn len(&self) -> usize {
        self.table.len()
    }

    /// How many runs are in each state of `tfinit_runs{state}` (terraform exited and its output
    /// draining counts in none).
    pub(super) fn counts(&self) -> crate::metrics::RunCounts {
        use crate::metrics::RunStage as M;
        let mut counts = [0i64; 5];
        for run in self.table.values() {
            let state = match &run.life {
                Life::Queued { .. } => M::Queued,
                Life::AwaitingRecords { .. } | Life::Recovering { .. } => M::Recovering,
                Life::Recording { .. } => M::Recording,
                Life::Launching { .. } => M::Running,
                Life::Running { stop, .. } if *stop == Stop::None => M::Running,
                Life::Running { .. } => M::Stopping,
                Life::Exited { .. } => continue,
            };
            if let Some(i) = M::ALL.iter().position(|s| *s == state) {
                counts[i] += 1;
            }
        }
        counts
    }

    /// The `tfinit status` entries, oldest first.
    pub(super) fn statuses(&self) -> Vec<RunStatus> {
        self.table.values().map(Run::status).collect()
    }

    /// When a run's timer is due next: an abandoned run's SIGKILL, the end of a wait for the
    /// store, the end of a pipes' linger.
    pub(super) fn next_wakeup(&self) -> Option<Instant> {
        self.table
            .values()
            .filter_map(|r| match r.life {
                // A wait blocked by a recovery ends with that recovery (its helper's exit wakes
                // the loop), not at its deadline: counting an expired one here would spin the
                // loop on a zero timeout (found by the simulation).
                Life::AwaitingRecords { .. } if self.recovering() => None,
                Life::AwaitingRecords { deadline, .. } => Some(deadline),
                Life::Exited { linger_until, .. } => Some(linger_until),
                _ => r.kill_due(),
            })
            .min()
    }

    /// What the records say for the runs (`book`: as they are now): waiting runs that may start,
    /// runs the fence stops; then, after what that asks of the records, runs that waited for the
    /// store check their lock again ([`Action::Recheck`]), unless this was only the answer to a
    /// run's own begin.
    pub(super) fn on_record_events(
        &mut self,
        events: Vec<RecordEvent>,
        book: &Book,
    ) -> Vec<Action> {
        let mut acts = Vec::new();
        let news = events.is_empty() || events.iter().any(RecordEvent::is_news);
        for e in events {
            match e {
                RecordEvent::Settled(run) | RecordEvent::Unrecorded(run) => {
                    self.settled(run, book, &mut acts)
                }
                RecordEvent::Fence { runs, kill } => {
                    let force = if kill { Force::Kill } else { Force::Graceful };
                    for run in runs {
                        self.stop(run, force, "the heartbeat did not land (fence)", &mut acts);
                    }
                }
            }
        }
        // Also: a run the fence refused as its record landed gave its place back.
        if news {
            acts.push(Action::Recheck);
        }
        acts
    }

    /// Takes run `id` out of the table, over: the one way out, so that a state-locking run's
    /// record is always closed with it (`ended`: how it ended, when that may have left its lock;
    /// `in_progress`: what it left unfinished).
    fn take(
        &mut self,
        id: RunId,
        ended: Option<Ended>,
        in_progress: Vec<String>,
        acts: &mut Vec<Action>,
    ) -> Option<Run> {
        let (run, left) = self.table.remove(&id)?;
        if run.job.locking() {
            acts.push(Action::Record(Record::Close {
                left,
                ended,
                in_progress,
            }));
        }
        Some(run)
    }

    /// How signal logs name run `id`'s terraform: its working directory, its subcommand, and
    /// the resources it has in progress (state-locking runs).
    pub(super) fn named(&self, id: RunId) -> Option<(&Path, &str, Option<Vec<String>>)> {
        let job = &self.table.get(&id)?.job;
        let in_progress = job.follower.as_ref().map(|f| f.in_progress());
        Some((&job.cwd, &job.invocation.subcommand, in_progress))
    }

    // ----- the output relay's view: where a run's output goes -----

    /// Whether `id`'s pipes are read now (it exists, and its shim keeps up).
    pub(super) fn reading(&self, id: RunId) -> bool {
        self.table
            .get(&id)
            .is_some_and(|r| !r.pipes().is_some_and(|p| p.paused))
    }

    /// The connection of `id`'s shim, while attached.
    pub(super) fn conn(&self, id: RunId) -> Option<ConnId> {
        self.table.get(&id)?.job.conn
    }

    /// The read end of `id`'s `stream` pipe, while open.
    pub(super) fn pipe(&self, id: RunId, stream: Stream) -> Option<BorrowedFd<'_>> {
        Some(self.table.get(&id)?.pipes()?.get(stream)?.as_fd())
    }

    /// `bytes` were read from `id`'s `stream`: the follower sees them (the returned update of its
    /// record, when the resources in progress changed), and the log gets them when no shim is
    /// `attached` to take them.
    pub(super) fn output(
        &mut self,
        id: RunId,
        stream: Stream,
        bytes: &[u8],
        attached: bool,
    ) -> Option<Action> {
        let job = &mut self.table.get_mut(&id)?.job;
        // Progress goes to the recorder as soon as it is seen (the recorder coalesces while a
        // write of this record is in flight): a resource is on the volume within one write of
        // its `Creating...` line.
        let mut progress = None;
        if let Some(f) = job.follower.as_mut() {
            f.feed(stream as usize, bytes);
            if f.take_changed() {
                let in_progress = f.in_progress();
                progress = Some(Action::Record(Record::Progress {
                    run: id,
                    in_progress,
                }));
            }
        }
        if !attached {
            job.log_detached(stream, bytes);
        }
        progress
    }

    /// `id`'s `stream` ended with no shim attached: its last partial line goes to the log.
    pub(super) fn flush_detached(&mut self, id: RunId, stream: Stream) {
        if let Some(run) = self.table.get_mut(&id) {
            if run.job.conn.is_none() {
                run.job.flush_detached(stream);
            }
        }
    }

    /// Marks `id`'s pipes paused (its shim lags); true when they were read until now.
    pub(super) fn pause(&mut self, id: RunId) -> bool {
        let Some(pipes) = self.table.get_mut(&id).and_then(Run::pipes_mut) else {
            return false;
        };
        !std::mem::replace(&mut pipes.paused, true)
    }

    /// Marks `id`'s pipes read again; true when they were paused.
    pub(super) fn unpause(&mut self, id: RunId) -> bool {
        let Some(pipes) = self.table.get_mut(&id).and_then(Run::pipes_mut) else {
            return false;
        };
        std::mem::replace(&mut pipes.paused, false)
    }

    /// Takes `id`'s `stream` pipe out to close it, with whether it was paused (out of the epoll
    /// set already).
    pub(super) fn take_pipe(&mut self, id: RunId, stream: Stream) -> Option<(OwnedFd, bool)> {
        let pipes = self.table.get_mut(&id)?.pipes_mut()?;
        Some((pipes.take(stream)?, pipes.paused))
    }

    /// Where run `id`'s terraform works (for its recovery helper).
    pub(super) fn workdir(&self, id: RunId) -> Option<&Path> {
        Some(&self.table.get(&id)?.job.workdir)
    }

    /// Until when run `id` waits for the store before its lock check (`AwaitingRecords`), if it
    /// does (the simulation's seam: a calm-phase request owes progress from its check).
    #[cfg(feature = "mutation")]
    pub(in crate::init) fn awaiting_until(&self, id: RunId) -> Option<Instant> {
        match self.table.get(&id)?.life {
            Life::AwaitingRecords { deadline, .. } => Some(deadline),
            _ => None,
        }
    }

    /// Every run's id.
    fn ids(&self) -> Vec<RunId> {
        self.table.keys().copied().collect()
    }

    fn next_id(&mut self) -> RunId {
        let id = self.next;
        self.next = id.next();
        id
    }

    /// How many runs hold a place under TFINIT_MAX_RUNS.
    fn in_flight(&self) -> usize {
        self.table.values().filter(|r| r.holds_place()).count()
    }

    /// How many runs wait in the queue.
    fn queued(&self) -> usize {
        self.table.values().filter(|r| r.queued()).count()
    }

    /// The queued run that came first, while a place is free.
    fn next_admitted(&self) -> Option<RunId> {
        let max = self.max_runs?;
        if self.in_flight() >= max.get() {
            return None;
        }
        self.table.values().find(|r| r.queued()).map(|r| r.job.id)
    }

    /// Whether a run asked now must wait in the queue: a cap is set and reached, or others wait
    /// already (arrival order).
    fn must_queue(&self) -> bool {
        self.max_runs
            .is_some_and(|max| self.in_flight() >= max.get() || self.queued() > 0)
    }

    /// Whether a lock recovery of this init runs (or is being started): no state-locking run
    /// starts meanwhile, in any directory. The helper decides with the live runs it was given,
    /// and a directory's text does not say which state its runs lock: a run started in a
    /// symbolic link to the recovered directory, or in one whose backend names the same key,
    /// would hold a lock the helper takes for the dead run's (issue 23; the simulation found it,
    /// docs/reliability.md).
    pub(in crate::init) fn recovering(&self) -> bool {
        self.table.values().any(|r| r.recovering())
    }
}

#[cfg(test)]
mod tests;
