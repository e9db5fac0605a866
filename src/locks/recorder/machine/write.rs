//! The record writes of the [`Machine`]: a create (after a fresh heartbeat), progress, an end,
//! a removal, and the retries of closings that failed.

use std::collections::VecDeque;
use std::io;

use super::{AfterBeat, Doing, Machine, Now, Op};
use crate::locks::liveness::fresh_enough;
use crate::locks::names::RunId;
use crate::locks::record::Record;
use crate::locks::record_id::RecordId;
use crate::locks::recorder::{Completion, Work, WriteError};
use crate::locks::who::who_for;

/// A closing of a finished run's record that failed, to try again.
#[derive(Debug)]
pub(super) enum Unclosed {
    /// The record is to be removed.
    Remove {
        /// The run.
        run: RunId,
        /// The record.
        path: RecordId,
    },
    /// The record is to be rewritten as ended (this content).
    End {
        /// The run.
        run: RunId,
        /// The record, ended.
        record: Box<Record>,
    },
}

impl Unclosed {
    pub(super) fn run(&self) -> RunId {
        match self {
            Unclosed::Remove { run, .. } | Unclosed::End { run, .. } => *run,
        }
    }
}

/// A record write in flight.
#[derive(Debug)]
pub(super) enum Writing {
    Create { run: RunId, record: Box<Record> },
    Progress { run: RunId },
    End { run: RunId },
    Remove { run: RunId, path: RecordId },
}

impl Machine {
    /// Tries again each closing that failed, in the order they failed; reports those that land
    /// now (the book counted the failure already, so a late success is reported without counting
    /// a request). Then a rescan, after the writes already queued: a scan of many records must
    /// not delay them.
    pub(super) fn close_again(&mut self) {
        let mut left: VecDeque<Unclosed> = std::mem::take(&mut self.unclosed).into();
        match left.pop_front() {
            Some(u) => self.begin_closing(u, left, Vec::new()),
            None => {
                self.queue.push(Work::Rescan);
            }
        }
    }

    pub(super) fn begin_closing(
        &mut self,
        u: Unclosed,
        left: VecDeque<Unclosed>,
        still: Vec<Unclosed>,
    ) {
        self.op = Some(match &u {
            Unclosed::Remove { path, .. } => Op::Remove(path.clone()),
            Unclosed::End { record, .. } => Op::Write(record.clone()),
        });
        self.doing = Doing::Closing {
            now: u,
            left,
            still,
        };
    }

    pub(super) fn closed(
        &mut self,
        u: Unclosed,
        mut left: VecDeque<Unclosed>,
        mut still: Vec<Unclosed>,
        result: io::Result<()>,
    ) {
        if result.is_ok() {
            let run = u.run();
            tracing::info!(run = %run, state_dir = %self.location, "the lock-owner record of a run that ended is closed now (it failed before)");
            self.send(match u {
                Unclosed::Remove { .. } => Completion::Removed {
                    run,
                    result: Ok(()),
                },
                Unclosed::End { .. } => Completion::Ended {
                    run,
                    result: Ok(()),
                },
            });
        } else {
            still.push(u);
        }
        match left.pop_front() {
            Some(u) => self.begin_closing(u, left, still),
            None => {
                self.unclosed = still;
                self.queue.push(Work::Rescan);
            }
        }
    }

    pub(super) fn begin_write(&mut self, w: Work, n: usize, now: Now) {
        match w {
            Work::Create { run, record, env } => {
                // A record lands only under a fresh heartbeat: every observer then has at least
                // two thirds of a TTL of watching ahead, and this owner's fence stops the run
                // before any of them may call it dead (locks::liveness).
                let fresh = fresh_enough(self.last_heartbeat, now.mono, self.ttl);
                if self.open && !fresh {
                    let then = AfterBeat::Create {
                        run,
                        record,
                        env,
                        n,
                    };
                    self.begin_beat(true, then, now);
                } else {
                    self.write_create(run, record, &env, n, now);
                }
            }
            Work::Progress { run, in_progress } => {
                self.rewrite(Writing::Progress { run }, n, now, |r| {
                    r.in_progress = in_progress;
                });
            }
            Work::End {
                run,
                ended,
                in_progress,
            } => self.rewrite(Writing::End { run }, n, now, |r| {
                r.in_progress = in_progress;
                r.ended = Some(ended);
            }),
            Work::Remove { run } => match self.written.remove(&run) {
                Some((path, _)) => {
                    self.op = Some(Op::Remove(path.clone()));
                    self.doing = Doing::Writing {
                        what: Writing::Remove { run, path },
                        n,
                    };
                }
                // Never written (its create failed or was cancelled): nothing to remove.
                None => {
                    self.send(Completion::Removed {
                        run,
                        result: Ok(()),
                    });
                    self.done(n);
                }
            },
            // Not record writes: the queue never holds them as such.
            Work::Heartbeat | Work::Rescan => self.done(n),
        }
    }

    pub(super) fn write_create(
        &mut self,
        run: RunId,
        mut record: Box<Record>,
        env: &[String],
        n: usize,
        now: Now,
    ) {
        if !self.open {
            self.send(Completion::Created {
                run,
                result: Err(WriteError::NotOpen),
            });
            self.done(n);
            return;
        }
        record.who = who_for(self.passwd_user.as_deref(), &self.host, env);
        record.updated_ms = now.wall_ms;
        self.op = Some(Op::Write(record.clone()));
        self.doing = Doing::Writing {
            what: Writing::Create { run, record },
            n,
        };
    }

    /// Rewrites the record of the run `what` names, changed by `change`; a run without a record
    /// is answered at once.
    pub(super) fn rewrite(
        &mut self,
        what: Writing,
        n: usize,
        now: Now,
        change: impl FnOnce(&mut Record),
    ) {
        let (Writing::Progress { run } | Writing::End { run }) = what else {
            unreachable!("only progress and ends are rewrites")
        };
        let Some((_, rec)) = self.written.get_mut(&run) else {
            self.wrote(what, n, Err(io::Error::other("no record")));
            return;
        };
        change(rec);
        rec.updated_ms = now.wall_ms;
        self.op = Some(Op::Write(Box::new(rec.clone())));
        self.doing = Doing::Writing { what, n };
    }

    /// A record write returned (or, for a run without a record, was not needed).
    pub(super) fn wrote(&mut self, what: Writing, n: usize, result: io::Result<RecordId>) {
        let c = match what {
            Writing::Create { run, record } => {
                let result = match result {
                    Ok(path) => {
                        self.written.insert(run, (path.clone(), *record));
                        Ok(path)
                    }
                    Err(e) => Err(e.into()),
                };
                Completion::Created { run, result }
            }
            Writing::Progress { run } => Completion::Written {
                run,
                result: self.rewritten(run, result),
            },
            Writing::End { run } => {
                let result = self.rewritten(run, result);
                // Kept on the volume, never written again by this incarnation (but for a retry).
                if let (Err(WriteError::Volume(..)), Some((_, record))) =
                    (&result, self.written.remove(&run))
                {
                    let record = Box::new(record);
                    self.unclosed.push(Unclosed::End { run, record });
                }
                Completion::Ended { run, result }
            }
            Writing::Remove { .. } => unreachable!("a removal is answered by Outcome::Removed"),
        };
        self.send(c);
        self.done(n);
    }

    /// The result of rewriting `run`'s record: no record at all, or what the write returned.
    pub(super) fn rewritten(
        &self,
        run: RunId,
        result: io::Result<RecordId>,
    ) -> Result<(), WriteError> {
        if !self.written.contains_key(&run) {
            return Err(WriteError::NoRecord);
        }
        result.map(|_| ()).map_err(WriteError::from)
    }
}
