//! The scans of the [`Machine`]: the records, one timed read of the heartbeat of each other
//! incarnation with records (with the kernel's word on it), then the heartbeats of our own name;
//! or the records alone, as a store that did not open still lists them.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Instant;

use super::{Doing, Machine, Now, Op, Out, Outcome};
use crate::locks::record::Owner;
use crate::locks::recorder::{Beat, Completion, Table};
use crate::mutation::{self, Guard};

/// What a scan is for.
#[derive(Debug)]
pub(super) enum ScanFor {
    /// The end of an opening (or of a retry): reported as [`Completion::Opened`].
    Opening {
        result: Result<(), String>,
        beat: Option<Instant>,
        lock: Option<Arc<OwnedFd>>,
    },
    /// A rescan: reported quietly as [`Completion::Table`].
    Rescan,
}

/// Where a scan is.
#[derive(Debug)]
pub(super) enum ScanStep {
    /// Listing the records; `full`: then the heartbeats (else the records alone, as a store that
    /// cannot be written still lists them).
    Listing { full: bool },
    /// Reading the heartbeat of each other incarnation with records, then those of our own
    /// name.
    Reading,
}

/// A scan: the records, and the heartbeats read so far.
#[derive(Debug)]
pub(super) struct Scan {
    purpose: ScanFor,
    step: ScanStep,
    table: Table,
}

impl Machine {
    pub(super) fn begin_scan(&mut self, full: bool, purpose: ScanFor, now: Now) {
        let table = Table {
            scanned: now.mono,
            records: Vec::new(),
            unlisted: None,
            beats: Vec::new(),
            unread: Vec::new(),
            gone: Vec::new(),
            held: Vec::new(),
        };
        self.op = Some(Op::List);
        self.doing = Doing::Scanning(Scan {
            purpose,
            step: ScanStep::Listing { full },
            table,
        });
    }

    /// The records, one timed read of the heartbeat of each other incarnation that has records
    /// with the kernel's word on it, then the heartbeats of our own name.
    pub(super) fn scanned(&mut self, mut scan: Scan, outcome: Outcome, now: Now) {
        match (scan.step, outcome) {
            (ScanStep::Listing { full }, Outcome::Listed { records, unlisted }) => {
                scan.table.records = records;
                scan.table.unlisted = unlisted;
                if !full {
                    return self.scan_done(scan.purpose, scan.table, now);
                }
                let mut owners: Vec<Owner> = Vec::new();
                for e in &scan.table.records {
                    let o = &e.facts.owner;
                    if !o.same_incarnation(&self.me)
                        && !owners.iter().any(|x| x.same_incarnation(o))
                    {
                        owners.push(o.clone());
                    }
                }
                self.op = Some(Op::ReadHeartbeats {
                    owners,
                    name: self.me.name.clone(),
                });
                scan.step = ScanStep::Reading;
                self.doing = Doing::Scanning(scan);
            }
            (
                ScanStep::Reading,
                Outcome::Heartbeats {
                    each,
                    named,
                    named_started,
                    named_done,
                },
            ) => {
                for read in each {
                    match read.proof {
                        Some(true) => scan.table.gone.push(read.owner.key()),
                        Some(false) => scan.table.held.push(read.owner.key()),
                        None => {}
                    }
                    let heartbeat = match read.answer {
                        Ok(hb) => hb,
                        // No answer is no sign: watching it as "missing, unchanged" would let a
                        // TTL of failed reads call a live owner dead.
                        Err(_) if mutation::on(Guard::UnansweredRead) => {
                            scan.table.unread.push(read.owner.key());
                            continue;
                        }
                        Err(_) => None,
                    };
                    scan.table.beats.push(Beat {
                        owner: read.owner,
                        heartbeat,
                        started: read.started,
                        done: read.done,
                    });
                }
                // Other live incarnations of our own name show here (two inits with one
                // TFINIT_OWNER); a listing with no answer shows none (it only feeds a warning).
                for hb in named.unwrap_or_default() {
                    if hb.owner.same_incarnation(&self.me)
                        || scan
                            .table
                            .beats
                            .iter()
                            .any(|b| b.owner.same_incarnation(&hb.owner))
                    {
                        continue;
                    }
                    scan.table.beats.push(Beat {
                        owner: hb.owner.clone(),
                        heartbeat: Some(hb),
                        started: named_started,
                        done: named_done,
                    });
                }
                self.scan_done(scan.purpose, scan.table, now);
            }
            (step, outcome) => {
                unreachable!("the driver answered {outcome:?} to a scan at {step:?}")
            }
        }
    }

    pub(super) fn scan_done(&mut self, purpose: ScanFor, table: Table, now: Now) {
        match purpose {
            ScanFor::Rescan => self.out.push(Out::Quiet(Completion::Table(table))),
            ScanFor::Opening { result, beat, lock } => {
                let retry = self.tried_open;
                self.tried_open = true;
                self.open = result.is_ok();
                if self.next_heartbeat.is_none() {
                    self.next_heartbeat = Some(now.mono + self.ttl / 3);
                }
                let done = Completion::Opened {
                    beat: beat.filter(|_| self.open),
                    result,
                    table: Some(table),
                    passwd_user: self.passwd_user.clone(),
                    location: Some(self.location.clone()),
                    lock: lock.filter(|_| self.open),
                };
                // Another failure is news nobody waits for: an idle init wakes for it only once.
                if retry && !self.open {
                    self.out.push(Out::Quiet(done));
                } else {
                    self.send(done);
                }
            }
        }
    }
}
