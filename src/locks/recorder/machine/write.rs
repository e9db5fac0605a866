//! The record writes of the [`Machine`], in batches (group commit): every record write pending
//! when a trip to the store begins (creates, progress, ends, removals, of every run) goes out as
//! one [`Op::Apply`], after a fresh heartbeat when the batch holds a create; and the retries of
//! closings that failed, as one batch too.

use super::{AfterBeat, Doing, Machine, Now, Op};
use crate::locks::liveness::fresh_enough;
use crate::locks::names::RunId;
use crate::locks::record::Record;
use crate::locks::record_id::RecordId;
use crate::locks::recorder::{Completion, Work, WriteError};
use crate::locks::store::Change;
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

    fn change(&self) -> Change {
        match self {
            Unclosed::Remove { path, .. } => Change::Remove(path.clone()),
            Unclosed::End { record, .. } => Change::Put(record.clone()),
        }
    }
}

/// A request a batch answers once it returned, and how many requests it stands for.
#[derive(Debug)]
pub(super) enum Asked {
    Create(usize),
    Progress(usize),
    End(usize),
    Remove(usize),
}

/// What a batch does to one run's record.
#[derive(Debug)]
pub(super) enum Act {
    /// Creates it (this content, with the progress and end asked after the create).
    Create(Box<Record>),
    /// Rewrites it: its content is the machine's `written` entry when the batch goes out.
    Rewrite,
    /// Removes it.
    Remove(RecordId),
}

/// One run's part of a batch: one change, and the requests it answers, in the order asked.
#[derive(Debug)]
pub(super) struct Slot {
    run: RunId,
    act: Act,
    asks: Vec<Asked>,
}

impl Machine {
    /// Tries again every closing that failed, as one batch; reports those that land now (the
    /// book counted the failure already, so a late success is reported without counting a
    /// request). Then a rescan, after the writes already queued: a scan of many records must not
    /// delay them.
    pub(super) fn close_again(&mut self) {
        let items = std::mem::take(&mut self.unclosed);
        if items.is_empty() {
            self.queue.push(Work::Rescan);
            return;
        }
        self.op = Some(Op::Apply(items.iter().map(Unclosed::change).collect()));
        self.doing = Doing::Closing { items };
    }

    pub(super) fn closed(&mut self, items: Vec<Unclosed>, results: Vec<Result<(), WriteError>>) {
        for (u, result) in items.into_iter().zip(results) {
            if result.is_err() {
                self.unclosed.push(u);
                continue;
            }
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
        }
        self.queue.push(Work::Rescan);
    }

    /// The first write of a batch and the rest of the writes queued: after a fresh heartbeat
    /// when one of them is a create, else at once.
    pub(super) fn begin_batch(&mut self, first: (Work, usize), now: Now) {
        let mut items = vec![first];
        items.extend(self.queue.take_writes());
        // A record lands only under a fresh heartbeat: every observer then has at least two
        // thirds of a TTL of watching ahead, and this owner's fence stops the run before any of
        // them may call it dead (locks::liveness). The heartbeat is written before the batch.
        let create = items.iter().any(|(w, _)| matches!(w, Work::Create { .. }));
        let fresh = fresh_enough(self.last_heartbeat, now.mono, self.ttl);
        if create && self.open && !fresh {
            self.begin_beat(true, AfterBeat::Batch(items), now);
        } else {
            self.send_batch(items, now);
        }
    }

    /// The heartbeat a batch with creates waited for could not be written: its creates fail,
    /// its other writes go out.
    pub(super) fn batch_without_heartbeat(&mut self, items: Vec<(Work, usize)>, now: Now) {
        let mut rest = Vec::new();
        for (w, n) in items {
            match w {
                Work::Create { run, .. } => {
                    self.send(Completion::Created {
                        run,
                        result: Err(WriteError::NoHeartbeat),
                    });
                    self.done(n);
                }
                other => rest.push((other, n)),
            }
        }
        self.send_batch(rest, now);
    }

    /// Makes one batch of `items` (one change per run) and asks for it; what needs no change
    /// (progress of a run without a record, removal of a record never written) is answered now.
    pub(super) fn send_batch(&mut self, items: Vec<(Work, usize)>, now: Now) {
        let mut slots: Vec<Slot> = Vec::new();
        for (w, n) in items {
            match w {
                Work::Create {
                    run,
                    mut record,
                    env,
                } => {
                    if !self.open {
                        self.send(Completion::Created {
                            run,
                            result: Err(WriteError::NotOpen),
                        });
                        self.done(n);
                        continue;
                    }
                    record.who = who_for(self.passwd_user.as_deref(), &self.host, &env);
                    record.updated_ms = now.wall_ms;
                    slots.push(Slot {
                        run,
                        act: Act::Create(record),
                        asks: vec![Asked::Create(n)],
                    });
                }
                Work::Progress { run, in_progress } => {
                    let changed = self.change(&mut slots, run, now, |r| {
                        r.in_progress = in_progress;
                    });
                    match changed {
                        Some(slot) => slot.asks.push(Asked::Progress(n)),
                        None => {
                            self.send(Completion::Written {
                                run,
                                result: Err(WriteError::NoRecord),
                            });
                            self.done(n);
                        }
                    }
                }
                Work::End {
                    run,
                    ended,
                    in_progress,
                } => {
                    let changed = self.change(&mut slots, run, now, |r| {
                        r.in_progress = in_progress;
                        r.ended = Some(ended);
                    });
                    match changed {
                        Some(slot) => slot.asks.push(Asked::End(n)),
                        None => {
                            self.send(Completion::Ended {
                                run,
                                result: Err(WriteError::NoRecord),
                            });
                            self.done(n);
                        }
                    }
                }
                Work::Remove { run } => {
                    // The queue drops a run's queued progress and cancels its queued create
                    // when its removal comes, so no slot of this run is in the batch yet; were
                    // one there, it is superseded the same way.
                    if let Some(i) = slots.iter().position(|s| s.run == run) {
                        for asked in slots.remove(i).asks {
                            match asked {
                                Asked::Create(n) => {
                                    self.send(Completion::Created {
                                        run,
                                        result: Err(WriteError::Cancelled),
                                    });
                                    self.done(n);
                                }
                                Asked::Progress(n) | Asked::End(n) | Asked::Remove(n) => {
                                    self.done(n)
                                }
                            }
                        }
                    }
                    match self.written.remove(&run) {
                        Some((path, _)) => slots.push(Slot {
                            run,
                            act: Act::Remove(path),
                            asks: vec![Asked::Remove(n)],
                        }),
                        // Never written (its create failed or was cancelled): nothing to remove.
                        None => {
                            self.send(Completion::Removed {
                                run,
                                result: Ok(()),
                            });
                            self.done(n);
                        }
                    }
                }
                // Not record writes: the queue never holds them as such.
                Work::Heartbeat | Work::Rescan => self.done(n),
            }
        }
        if slots.is_empty() {
            return;
        }
        let changes = slots
            .iter()
            .map(|s| match &s.act {
                Act::Create(r) => Change::Put(r.clone()),
                Act::Rewrite => Change::Put(Box::new(self.written[&s.run].1.clone())),
                Act::Remove(path) => Change::Remove(path.clone()),
            })
            .collect();
        self.op = Some(Op::Apply(changes));
        self.doing = Doing::Batch(slots);
    }

    /// Changes `run`'s record in the batch by `f`: the record its create in this batch writes,
    /// or the one on the volume. None: the run has no record.
    fn change<'a>(
        &mut self,
        slots: &'a mut Vec<Slot>,
        run: RunId,
        now: Now,
        f: impl FnOnce(&mut Record),
    ) -> Option<&'a mut Slot> {
        let i = match slots.iter().position(|s| s.run == run) {
            Some(i) => i,
            None => {
                self.written.get(&run)?;
                slots.push(Slot {
                    run,
                    act: Act::Rewrite,
                    asks: Vec::new(),
                });
                slots.len() - 1
            }
        };
        let slot = &mut slots[i];
        let rec = match &mut slot.act {
            Act::Create(r) => &mut **r,
            Act::Rewrite => &mut self.written.get_mut(&run)?.1,
            Act::Remove(_) => return None,
        };
        f(rec);
        rec.updated_ms = now.wall_ms;
        Some(slot)
    }

    /// A batch returned: each run's result answers its requests in the order they were asked.
    pub(super) fn applied(&mut self, slots: Vec<Slot>, results: Vec<Result<RecordId, WriteError>>) {
        for (slot, result) in slots.into_iter().zip(results) {
            let Slot { run, act, asks } = slot;
            let removed = match act {
                Act::Create(record) => {
                    if let Ok(path) = &result {
                        self.written.insert(run, (path.clone(), *record));
                    }
                    None
                }
                Act::Rewrite => None,
                Act::Remove(path) => Some(path),
            };
            for asked in asks {
                let (c, n) = match asked {
                    Asked::Create(n) => (
                        Completion::Created {
                            run,
                            result: result.clone(),
                        },
                        n,
                    ),
                    Asked::Progress(n) => (
                        Completion::Written {
                            run,
                            result: self.rewritten(run, &result),
                        },
                        n,
                    ),
                    Asked::End(n) => {
                        let result = self.rewritten(run, &result);
                        // Kept on the volume, never written again by this incarnation (but for
                        // a retry).
                        if let (Err(WriteError::Volume(..)), Some((_, record))) =
                            (&result, self.written.remove(&run))
                        {
                            let record = Box::new(record);
                            self.unclosed.push(Unclosed::End { run, record });
                        }
                        (Completion::Ended { run, result }, n)
                    }
                    Asked::Remove(n) => {
                        let result = result.clone().map(|_| ());
                        if let (Err(_), Some(path)) = (&result, removed.clone()) {
                            self.unclosed.push(Unclosed::Remove { run, path });
                        }
                        (Completion::Removed { run, result }, n)
                    }
                };
                self.send(c);
                self.done(n);
            }
        }
    }

    /// The result of rewriting `run`'s record: no record at all, or what the write returned.
    fn rewritten(
        &self,
        run: RunId,
        result: &Result<RecordId, WriteError>,
    ) -> Result<(), WriteError> {
        if !self.written.contains_key(&run) {
            return Err(WriteError::NoRecord);
        }
        result.clone().map(|_| ())
    }
}
