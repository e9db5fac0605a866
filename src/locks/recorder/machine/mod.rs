//! The recorder's decisions without its I/O (sans-IO): which storage operation comes next, from
//! the queued requests, the clock reading and what the last operation returned. The thread in
//! `thread.rs` performs each [`Op`] on the [`Store`](crate::locks::store::Store); the simulation
//! (tests/simulation/recorder.rs) performs it as a timed operation on its simulated volume. Both
//! feed the [`Outcome`] back and pass the machine's [`Out`]s to the loop, so the order of work,
//! the heartbeat's clock, the fresh-heartbeat rule before a create and the retries of failed
//! closings are this module's alone.
//!
//! One job at a time, as the thread did it: a job (the opening, a heartbeat, a batch of record
//! writes, a rescan) is a sequence of operations; requests that arrive meanwhile wait in
//! `arrived` and join the `Queue` (queue.rs) when the job is over, which is where the heartbeat
//! overtakes writes and progress coalesces. Record writes go out in batches (group commit): the
//! next batch takes every write queued (one change per run, [`Op::Apply`]), so 16 runs that start
//! together wait for at most two trips to the store, not sixteen.
//!
//! Files: this one (what the machine and its drivers say to each other, the heartbeat and the
//! opening), `write.rs` (record writes and the retries of failed closings), `scan.rs` (the scans),
//! `tests.rs` (the machine alone, without a thread or a store).

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod scan;
#[cfg(test)]
mod tests;
mod write;

use scan::{Scan, ScanFor};
use write::{Slot, Unclosed};

use super::queue::{Chore, Queue};
use super::{Completion, Entry, Work, WriteError};
use crate::locks::names::RunId;
use crate::locks::record::{FileId, Heartbeat, Owner, Record, HEARTBEAT_FORMAT};
use crate::locks::record_id::RecordId;
use crate::locks::store::Change;

/// How long the heartbeat of an owner without records is kept after it went silent.
const HEARTBEAT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// One reading of the recorder's clocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// The monotonic clock: every age and deadline of the recorder.
    pub mono: Instant,
    /// The wall clock, ms since the epoch: only written into heartbeats and records.
    pub wall_ms: u64,
}

/// A storage operation for the driver to perform, then answer with the [`Outcome`] of the same
/// name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Read our uid's passwd user name and the hostname, prepare the store (`Store::open` with
    /// this age of stale temporary files) and, when that worked, take this incarnation's lock
    /// file (`Store::hold_incarnation_lock`). Answer: [`Outcome::Opened`].
    Open {
        /// Temporary files older than this are removed.
        stale_temp: Duration,
    },
    /// Write this heartbeat (`Store::write_heartbeat`). Answer: [`Outcome::Wrote`].
    WriteHeartbeat(Heartbeat),
    /// Set unreadable records aside (`Store::sweep`), then remove the heartbeats of incarnations
    /// without a record silent for longer than `older_than` (`Store::prune_heartbeats`).
    /// Answer: [`Outcome::Tidied`].
    Tidy {
        /// Cleaning age.
        older_than: Duration,
    },
    /// List every record (`Store::list`), as [`Entry`]s of those that parse (the rest is the
    /// opening's sweep's to report). Answer: [`Outcome::Listed`].
    List,
    /// Read the heartbeat of each of `owners` in turn (`Store::read_heartbeat`), each read timed
    /// and followed by what the kernel proves of it for us (`Store::kernel_proof` on what was
    /// read), then the heartbeats of every incarnation named `name` (`Store::heartbeats_named`),
    /// timed. Answer: [`Outcome::Heartbeats`].
    ReadHeartbeats {
        /// The incarnations whose heartbeat to read, in this order.
        owners: Vec<Owner>,
        /// Our own name.
        name: String,
    },
    /// Apply this batch of record changes, one per run (`Store::apply`): every record write
    /// pending when it was made (group commit). Answer: [`Outcome::Applied`].
    Apply(Vec<Change>),
}

/// This incarnation's lock file, as [`Op::Open`] took it.
#[derive(Debug, Clone)]
pub enum Held {
    /// Flocked: the descriptor every terraform run inherits (None where there is no real file,
    /// in the simulation) and the file's device and inode.
    File(Option<Arc<OwnedFd>>, FileId),
    /// Not taken: the store is not on a local filesystem, or another process holds it.
    NoFile,
    /// Taking it failed (the driver warned): no file is named as held.
    Failed,
}

/// What an [`Op`] returned.
#[derive(Debug)]
pub enum Outcome {
    /// [`Op::Open`].
    Opened {
        /// Our uid's passwd user name.
        passwd_user: Option<String>,
        /// The hostname.
        host: String,
        /// Where the store is, as it says after the opening (`Store::location`: which store
        /// TFINIT_STORE chose, for the loop's messages).
        location: String,
        /// The store is prepared (and the lock file as taken), or why not.
        result: Result<Held, String>,
    },
    /// [`Op::WriteHeartbeat`].
    Wrote(io::Result<()>),
    /// [`Op::Tidy`].
    Tidied,
    /// [`Op::List`].
    Listed {
        /// The records that parse.
        records: Vec<Entry>,
        /// Why the listing got no answer ([`Found::Unlisted`](crate::locks::record::Found::Unlisted)):
        /// the records are unknown, not absent.
        unlisted: Option<String>,
    },
    /// [`Op::ReadHeartbeats`].
    Heartbeats {
        /// Each owner's read, in the order asked.
        each: Vec<HeartbeatRead>,
        /// The heartbeats of our name, or why the store gave no answer.
        named: Result<Vec<Heartbeat>, String>,
        /// When that read started.
        named_started: Instant,
        /// When it returned.
        named_done: Instant,
    },
    /// [`Op::Apply`]: each change's result, in order (the record's id, or why not).
    Applied(Vec<io::Result<RecordId>>),
}

/// One read of an incarnation's heartbeat, as the driver made it.
#[derive(Debug)]
pub struct HeartbeatRead {
    /// The incarnation.
    pub owner: Owner,
    /// What the store answered (None: it has no heartbeat of the incarnation), or why it gave no
    /// answer (`Store::read_heartbeat`'s error): such a read tells nothing and is not watched.
    pub answer: Result<Option<Heartbeat>, String>,
    /// When the read started, on the reader's monotonic clock.
    pub started: Instant,
    /// When it returned.
    pub done: Instant,
    /// What the kernel proves of the incarnation (`Store::kernel_proof` on what was read):
    /// gone, alive, or nothing proven.
    pub proof: Option<bool>,
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Perform this operation and answer with [`Machine::finished`].
    Do(Op),
    /// Nothing to do until this time (the heartbeat's) or a request.
    Wait(Instant),
}

/// A message for the loop.
#[derive(Debug)]
pub enum Out {
    /// A completion that wakes the loop (its eventfd).
    Wake(Completion),
    /// A completion nobody waits for (a heartbeat that went well, the table it rescanned), taken
    /// whenever the loop next looks: an idle init then wakes once a heartbeat, not three times.
    Quiet(Completion),
    /// This many record write requests are done (finished, merged into another, or dropped):
    /// the loop's count of pending writes goes down, and the loop is woken for it.
    Done(usize),
}

/// What a heartbeat job does once its write returned.
#[derive(Debug)]
enum AfterBeat {
    /// The heartbeat's own job: close what failed, then rescan.
    Chore,
    /// A batch with creates, which waits for a fresh heartbeat (each write and how many
    /// requests it stands for).
    Batch(Vec<(Work, usize)>),
}

/// The job in progress, and the operation it waits for.
#[derive(Debug)]
enum Doing {
    /// Between jobs.
    Idle,
    /// [`Op::Open`] in flight.
    Opening,
    /// The opening's first heartbeat in flight.
    FirstBeat {
        stamped: Instant,
        lock: Option<Arc<OwnedFd>>,
    },
    /// The opening's [`Op::Tidy`] in flight.
    Tidying {
        beat: Instant,
        lock: Option<Arc<OwnedFd>>,
    },
    /// A scan's operation in flight.
    Scanning(Scan),
    /// A heartbeat write in flight.
    Beating {
        stamped: Instant,
        wall_ms: u64,
        wake: bool,
        then: AfterBeat,
    },
    /// The retries of failed closings in flight, as one batch.
    Closing { items: Vec<Unclosed> },
    /// A batch of record writes in flight: one slot per run.
    Batch(Vec<Slot>),
}

/// The recorder's state: what it wrote, its heartbeat, its queue, and the job in progress.
#[derive(Debug)]
pub struct Machine {
    me: Owner,
    ttl: Duration,
    /// The store, for messages: as the last opening said (TFINIT_STORE's choice), at first as
    /// the thread was given it.
    location: String,
    open: bool,
    passwd_user: Option<String>,
    host: String,
    /// Records on the volume, by run, with their last content.
    written: HashMap<RunId, (RecordId, Record)>,
    /// When the last heartbeat write that succeeded started.
    last_heartbeat: Option<Instant>,
    /// The sequence number of the last heartbeat written (or tried).
    seq: u64,
    /// The lock file this incarnation holds, when it holds one (said in every heartbeat).
    lock_file: Option<FileId>,
    /// Closings of finished runs that failed (a removal, an end-marking), tried again after every
    /// heartbeat that lands: left alone, such a record reads as a live run of this live owner,
    /// with its `Who`, and no recovery in its directory could release a dead run's lock there.
    unclosed: Vec<Unclosed>,
    /// Whether the store was tried once (later tries are retries of a failed one).
    tried_open: bool,
    /// The heartbeat's own clock: every TTL/3 while the store is open, whatever the loop does
    /// (None until the first opening is over).
    next_heartbeat: Option<Instant>,
    queue: Queue,
    /// Requests that came during a job, queued when it is over.
    arrived: Vec<Work>,
    doing: Doing,
    /// The operation the driver is to perform next.
    op: Option<Op>,
    out: Vec<Out>,
}

impl Machine {
    /// The recorder of owner `me` (heartbeat TTL `ttl`) on the store at `location`; its first
    /// job opens the store.
    pub fn new(me: Owner, ttl: Duration, location: String) -> Machine {
        Machine {
            me,
            ttl,
            location,
            open: false,
            passwd_user: None,
            host: String::new(),
            written: HashMap::new(),
            last_heartbeat: None,
            seq: 0,
            lock_file: None,
            unclosed: Vec::new(),
            tried_open: false,
            next_heartbeat: None,
            queue: Queue::default(),
            arrived: Vec::new(),
            doing: Doing::Idle,
            op: None,
            out: Vec::new(),
        }
    }

    /// A request of the loop.
    pub fn request(&mut self, r: Work) {
        if matches!(self.doing, Doing::Idle) {
            self.enqueue(r);
        } else {
            self.arrived.push(r);
        }
    }

    /// The messages for the loop since the last call, in order.
    pub fn take_out(&mut self) -> Vec<Out> {
        std::mem::take(&mut self.out)
    }

    /// What to do now (`now`: a clock reading): the next operation of the job in progress, or of
    /// the next job, or nothing until the heartbeat is due. After [`Next::Do`], call
    /// [`Machine::finished`] before asking again.
    pub fn next(&mut self, now: Now) -> Next {
        loop {
            if let Some(op) = self.op.take() {
                return Next::Do(op);
            }
            // Between jobs: everything that arrived during the last one is queued first.
            for r in std::mem::take(&mut self.arrived) {
                self.enqueue(r);
            }
            let Some(due) = self.next_heartbeat else {
                self.begin_open();
                continue;
            };
            if now.mono >= due {
                self.next_heartbeat = Some(now.mono + self.ttl / 3);
                if self.open {
                    self.queue.push(Work::Heartbeat);
                } else {
                    // A volume that failed at start (not mounted yet, full, an NFS server away)
                    // is tried again on the heartbeat's clock, and its records read again
                    // meanwhile (they may keep this pod's runs from starting).
                    self.begin_open();
                    continue;
                }
            }
            match self.queue.next() {
                Some(job) => self.begin(job, now),
                None => return Next::Wait(due.max(now.mono)),
            }
        }
    }

    /// The outcome of the operation [`Machine::next`] returned, read at `now`.
    pub fn finished(&mut self, outcome: Outcome, now: Now) {
        match (std::mem::replace(&mut self.doing, Doing::Idle), outcome) {
            (
                Doing::Opening,
                Outcome::Opened {
                    passwd_user,
                    host,
                    location,
                    result,
                },
            ) => {
                self.passwd_user = passwd_user;
                self.host = host;
                self.location = location;
                match result {
                    Ok(held) => {
                        let lock = match held {
                            Held::File(fd, id) => {
                                self.lock_file = Some(id);
                                fd
                            }
                            Held::NoFile => {
                                self.lock_file = None;
                                None
                            }
                            // No descriptor of this try holds a file: naming the file of an
                            // earlier try (its descriptor dropped with that try's failure)
                            // would let the kernel's proof take this live owner for gone.
                            Held::Failed => {
                                self.lock_file = None;
                                None
                            }
                        };
                        // The lock first: the first heartbeat says whether it is held.
                        let (stamped, hb) = self.stamp(now);
                        self.doing = Doing::FirstBeat { stamped, lock };
                        self.op = Some(Op::WriteHeartbeat(hb));
                    }
                    Err(e) => self.opening_failed(e, now),
                }
            }
            (Doing::FirstBeat { stamped, lock }, Outcome::Wrote(result)) => match result {
                Ok(()) => {
                    self.last_heartbeat = Some(stamped);
                    self.doing = Doing::Tidying {
                        beat: stamped,
                        lock,
                    };
                    // Unreadable records are set aside now, so each is reported once.
                    self.op = Some(Op::Tidy {
                        older_than: HEARTBEAT_RETENTION.max(self.ttl),
                    });
                }
                Err(e) => self.opening_failed(e.to_string(), now),
            },
            (Doing::Tidying { beat, lock }, Outcome::Tidied) => {
                let purpose = ScanFor::Opening {
                    result: Ok(()),
                    beat: Some(beat),
                    lock,
                };
                self.begin_scan(true, purpose, now);
            }
            (Doing::Scanning(scan), outcome) => self.scanned(scan, outcome, now),
            (
                Doing::Beating {
                    stamped,
                    wall_ms,
                    wake,
                    then,
                },
                Outcome::Wrote(result),
            ) => self.beaten(stamped, wall_ms, wake, then, result, now),
            (Doing::Closing { items }, Outcome::Applied(results)) => {
                let results = answers(results, items.len());
                let results = results.into_iter().map(|r| r.map(|_| ())).collect();
                self.closed(items, results);
            }
            (Doing::Batch(slots), Outcome::Applied(results)) => {
                let results = answers(results, slots.len());
                self.applied(slots, results);
            }
            (doing, outcome) => {
                unreachable!("the driver answered {outcome:?} while the recorder was {doing:?}")
            }
        }
    }

    fn enqueue(&mut self, r: Work) {
        let (cancelled, dropped) = self.queue.push(r);
        for run in cancelled {
            self.send(Completion::Created {
                run,
                result: Err(WriteError::Cancelled),
            });
            self.done(1);
        }
        self.done(dropped);
    }

    fn send(&mut self, c: Completion) {
        self.out.push(Out::Wake(c));
    }

    fn done(&mut self, n: usize) {
        if n > 0 {
            self.out.push(Out::Done(n));
        }
    }

    /// The next heartbeat, stamped at `now`.
    fn stamp(&mut self, now: Now) -> (Instant, Heartbeat) {
        self.seq += 1;
        let hb = Heartbeat {
            v: HEARTBEAT_FORMAT,
            owner: self.me.clone(),
            seq: self.seq,
            updated_ms: now.wall_ms,
            holds_lock: self.lock_file.is_some(),
            host: self.host.clone(),
            ttl_ms: Some(self.ttl.as_millis() as u64),
            lock_file: self.lock_file,
        };
        (now.mono, hb)
    }

    fn begin_open(&mut self) {
        self.doing = Doing::Opening;
        self.op = Some(Op::Open {
            stale_temp: self.ttl,
        });
    }

    /// What can still be read of a store that did not open: records of earlier runs with this
    /// pod's Who keep its runs in their directories from starting while it cannot write
    /// (locks::book, "shadow").
    fn opening_failed(&mut self, error: String, now: Now) {
        // The lock file's descriptor of this try is dropped with it: no heartbeat may name the
        // file as held any more.
        self.lock_file = None;
        let purpose = ScanFor::Opening {
            result: Err(error),
            beat: None,
            lock: None,
        };
        self.begin_scan(false, purpose, now);
    }

    fn begin(&mut self, job: Chore, now: Now) {
        match job {
            Chore::Heartbeat if !self.open => self.send(Completion::Heartbeat {
                result: Err(WriteError::NotOpen),
                stamped: now.mono,
                wall_ms: now.wall_ms,
            }),
            Chore::Heartbeat => {
                // A failure may matter at once, and so does a success after a gap the loop may
                // have called stale (it says "written again" and records resume); an on-time
                // success only changes an age the loop reads when it needs it.
                let late = self
                    .last_heartbeat
                    .is_none_or(|t| now.mono.saturating_duration_since(t) > self.ttl / 2);
                self.begin_beat(late, AfterBeat::Chore, now);
            }
            Chore::Rescan if self.open => self.begin_scan(true, ScanFor::Rescan, now),
            Chore::Rescan => {}
            Chore::Write(w, n) => self.begin_batch((w, n), now),
        }
    }

    fn begin_beat(&mut self, wake: bool, then: AfterBeat, now: Now) {
        let (stamped, hb) = self.stamp(now);
        self.doing = Doing::Beating {
            stamped,
            wall_ms: now.wall_ms,
            wake,
            then,
        };
        self.op = Some(Op::WriteHeartbeat(hb));
    }

    fn beaten(
        &mut self,
        stamped: Instant,
        wall_ms: u64,
        wake: bool,
        then: AfterBeat,
        result: io::Result<()>,
        now: Now,
    ) {
        let ok = result.is_ok();
        if ok {
            self.last_heartbeat = Some(stamped);
        }
        let done = Completion::Heartbeat {
            result: result.map_err(WriteError::from),
            stamped,
            wall_ms,
        };
        if ok && !wake {
            self.out.push(Out::Quiet(done));
        } else {
            self.send(done);
        }
        match then {
            AfterBeat::Chore if ok => self.close_again(),
            AfterBeat::Chore => {}
            AfterBeat::Batch(items) if !ok => self.batch_without_heartbeat(items, now),
            AfterBeat::Batch(items) => self.send_batch(items, now),
        }
    }
}

/// A store's answers to a batch of `n` changes as the machine's errors; a store that answered
/// fewer (a bug) fails the rest rather than leave requests unanswered.
fn answers(results: Vec<io::Result<RecordId>>, n: usize) -> Vec<Result<RecordId, WriteError>> {
    let mut out: Vec<_> = results
        .into_iter()
        .map(|r| r.map_err(WriteError::from))
        .collect();
    while out.len() < n {
        out.push(Err(WriteError::from(io::Error::other(
            "the store gave no answer for this change",
        ))));
    }
    out
}
