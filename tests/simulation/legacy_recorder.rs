//! A MODEL OF THE OLD RECORDER (before issue 18), kept only for the negative tests of the old
//! rules (`legacy.rs` has the rest): one job at a time, the heartbeat every TTL/3 ahead of
//! everything, a rescan after each heartbeat, but no fresh-heartbeat check before a create, one
//! heartbeat file per owner NAME (read by name), no lock file, no retry of a store that failed at
//! open nor of a failed closing. Every storage call is a timed operation on the simulated volume.
//! Today's rules run the real recorder's decisions (`recorder.rs`).

use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use tfinit::locks::names::RunId;
use tfinit::locks::record::{Ended, Heartbeat, Record};
use tfinit::locks::recorder::{Entry, Work, WriteError};

use super::exec::{list, Sim, WaitFor};
use super::legacy::{Completion, Table};
use super::world::{record_path, Comp, Ms, Stored, StoredBeat, World};

/// Work for the old recorder.
#[derive(Debug, Clone)]
enum Job {
    Create { run: RunId, record: Box<Record> },
    End { run: RunId, ended: Ended },
    Remove { run: RunId },
}

/// The old recorder's queue: the heartbeat first, then the oldest create, then writes in order,
/// then a rescan.
#[derive(Debug, Default)]
struct Queue {
    heartbeat: bool,
    rescan: bool,
    writes: VecDeque<Job>,
}

/// What the old recorder does next.
enum Next {
    Heartbeat,
    Write(Job),
    Rescan,
}

impl Queue {
    /// Adds a request; returns the runs whose queued create it cancelled (a removal of a run
    /// whose create never started) and how many queued end-markings it dropped.
    fn push(&mut self, r: Work) -> (Vec<RunId>, usize) {
        let job = match r {
            Work::Heartbeat => {
                self.heartbeat = true;
                return (Vec::new(), 0);
            }
            Work::Rescan => {
                self.rescan = true;
                return (Vec::new(), 0);
            }
            Work::Create { run, record, .. } => Job::Create { run, record },
            Work::End { run, ended, .. } => Job::End { run, ended },
            Work::Remove { run } => Job::Remove { run },
            Work::Progress { .. } => return (Vec::new(), 0),
        };
        let mut cancelled = Vec::new();
        let mut dropped = 0;
        if let Job::Remove { run } = &job {
            self.writes.retain(|w| match w {
                Job::Create { run: r, .. } if r == run => {
                    cancelled.push(*r);
                    false
                }
                Job::End { run: r, .. } if r == run => {
                    dropped += 1;
                    false
                }
                _ => true,
            });
        }
        self.writes.push_back(job);
        (cancelled, dropped)
    }

    fn next(&mut self) -> Option<Next> {
        if std::mem::take(&mut self.heartbeat) {
            return Some(Next::Heartbeat);
        }
        if let Some(i) = self
            .writes
            .iter()
            .position(|w| matches!(w, Job::Create { .. }))
        {
            return self.writes.remove(i).map(Next::Write);
        }
        if let Some(w) = self.writes.pop_front() {
            return Some(Next::Write(w));
        }
        std::mem::take(&mut self.rescan).then_some(Next::Rescan)
    }
}

/// The old recorder's state.
struct Old {
    inc: usize,
    node: usize,
    ttl: Duration,
    open: bool,
    /// When the last heartbeat write that succeeded started.
    last_heartbeat: Option<Instant>,
    /// Records it wrote, by run: (id, content).
    written: HashMap<RunId, (u64, Record)>,
    /// Next heartbeat due (simulated time).
    next_beat: Ms,
    queue: Queue,
}

/// The old recorder of incarnation `inc`, from the store's opening on.
pub async fn run(sim: Rc<Sim>, inc: usize) {
    let (node, ttl) = sim.with(|w| (w.incs[inc].node, w.ttl_of(inc)));
    let mut old = Old {
        inc,
        node,
        ttl,
        open: false,
        last_heartbeat: None,
        written: HashMap::new(),
        next_beat: Ms::MAX,
        queue: Queue::default(),
    };
    open(&sim, &mut old).await;
    loop {
        let arrived = sim.with(|w| std::mem::take(&mut w.incs[inc].requests));
        for r in arrived {
            let (cancelled, dropped) = old.queue.push(r);
            for _ in 0..dropped {
                sim.with(|w| done(w, inc));
            }
            for run in cancelled {
                let c = Completion::Created {
                    run,
                    result: Err(WriteError::Cancelled.to_string()),
                };
                sim.with(|w| {
                    w.send(inc, Comp::Old(c), true);
                    done(w, inc);
                });
            }
        }
        if old.open && sim.now() >= old.next_beat {
            old.next_beat = sim.with(|w| next_due(w, node, ttl));
            old.queue.heartbeat = true;
        }
        match old.queue.next() {
            Some(Next::Heartbeat) => {
                let late = sim.with(|w| {
                    let now = w.mono(node);
                    old.last_heartbeat
                        .is_none_or(|t| now.saturating_duration_since(t) > ttl / 2)
                });
                if heartbeat_now(&sim, &mut old, late).await {
                    old.queue.rescan = true;
                }
            }
            Some(Next::Rescan) => {
                if old.open {
                    let c = Completion::Table(scan(&sim, inc).await);
                    sim.with(|w| w.send(inc, Comp::Old(c), false));
                }
            }
            Some(Next::Write(job)) => {
                write(&sim, &mut old, job).await;
                sim.with(|w| done(w, inc));
            }
            None => {
                // A store that failed at open stays failed.
                let until = if old.open { old.next_beat } else { Ms::MAX };
                sim.with(|w| w.incs[inc].rec_idle = true);
                WaitFor::new(&sim, until, move |w: &World| {
                    !w.incs[inc].requests.is_empty()
                })
                .await;
                sim.with(|w| w.incs[inc].rec_idle = false);
            }
        }
    }
}

/// One record write request of `inc` is done.
fn done(w: &mut World, inc: usize) {
    let i = &mut w.incs[inc];
    i.writes = i.writes.saturating_sub(1);
}

/// Opens the store: the first heartbeat, then the scan.
async fn open(sim: &Sim, old: &mut Old) {
    let (_, result) = beat(sim, old).await;
    let ok = result.is_ok();
    let table = if ok {
        Some(scan(sim, old.inc).await)
    } else {
        None
    };
    let (inc, node, ttl) = (old.inc, old.node, old.ttl);
    sim.with(|w| {
        old.next_beat = next_due(w, node, ttl);
        old.open = ok;
        w.send(inc, Comp::Old(Completion::Opened { result, table }), true);
    });
}

/// When the next heartbeat is due: TTL/3 from now on the node's own clock.
fn next_due(w: &World, node: usize, ttl: Duration) -> Ms {
    let n = &w.nodes[node];
    n.real_at(n.mono(w.now) + ttl / 3)
}

/// Writes the next heartbeat, in the file of the owner's NAME: when its stamp was taken, and
/// whether it landed.
async fn beat(sim: &Sim, old: &mut Old) -> (Instant, Result<(), String>) {
    let inc = old.inc;
    let (key, hb, stamped, now) = sim.with(|w| {
        let wall = w.wall(old.node);
        let i = &w.incs[inc];
        let hb = Heartbeat {
            v: 1,
            owner: i.owner.clone(),
            seq: 0,
            updated_ms: wall,
            holds_lock: false,
            // The old heartbeat had no host, no TTL and no lock file.
            host: String::new(),
            ttl_ms: None,
            lock_file: None,
        };
        (i.owner.name.clone(), Rc::new(hb), w.mono(old.node), w.now)
    });
    let result = sim
        .write(old.node, move |w| {
            let landed = w.now;
            w.store.beats.entry(key).or_default().push(StoredBeat {
                hb,
                stamped: now,
                landed,
            });
            let i = &mut w.incs[inc];
            i.beat_landed = Some(i.beat_landed.map_or(now, |b| b.max(now)));
        })
        .await;
    if result.is_ok() {
        old.last_heartbeat = Some(stamped);
    }
    (stamped, result)
}

/// A heartbeat, reported to the loop (waking it when `wake`, or when it failed).
async fn heartbeat_now(sim: &Sim, old: &mut Old, wake: bool) -> bool {
    let (stamped, result) = beat(sim, old).await;
    let ok = result.is_ok();
    let c = Completion::Heartbeat { result, stamped };
    sim.with(|w| w.send(old.inc, Comp::Old(c), !ok || wake));
    ok
}

/// The old scan: records, and the heartbeat file of each records' owner name.
async fn scan(sim: &Sim, inc: usize) -> Table {
    let node = sim.with(|w| w.incs[inc].node);
    let scanned = sim.with(|w| w.mono(node));
    let found = list(sim, node).await;
    let mut records = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for (id, rec) in &found {
        if !names.contains(&rec.owner.name) {
            names.push(rec.owner.name.clone());
        }
        records.push(Entry::of(record_path(*id), rec));
    }
    let times = sim.with(|w| w.read_sequence(node, names.len()));
    if let Some(t) = times.last() {
        sim.sleep_until(t.2).await;
    }
    let heartbeats = sim.with(|w| {
        names
            .into_iter()
            .zip(&times)
            .filter_map(|(name, t)| {
                let hb = w.store.beat_at(&name, t.1).map(|b| (*b.hb).clone())?;
                Some((name, hb))
            })
            .collect()
    });
    Table {
        scanned,
        records,
        heartbeats,
    }
}

/// One record write, reported to the loop.
async fn write(sim: &Sim, old: &mut Old, job: Job) {
    let (inc, node) = (old.inc, old.node);
    match job {
        Job::Create { run, mut record } => {
            if !old.open {
                let result = Err(WriteError::NotOpen.to_string());
                sim.with(|w| w.send(inc, Comp::Old(Completion::Created { run, result }), true));
                return;
            }
            let (id, rec) = sim.with(|w| {
                record.who = format!("@{}", w.incs[inc].host);
                record.updated_ms = w.wall(node);
                w.next_record += 1;
                (w.next_record, Rc::new((*record).clone()))
            });
            let stored = Rc::clone(&rec);
            let result = sim
                .write(node, move |w| {
                    let stale = w.incs[inc]
                        .beat_landed
                        .is_none_or(|b| w.now.saturating_sub(b) > w.incs[inc].ttl);
                    w.log(|| {
                        format!(
                            "record {id} of {} ({}) lands{}",
                            stored.run_id,
                            stored.owner.name,
                            if stale {
                                " under a stale heartbeat"
                            } else {
                                ""
                            }
                        )
                    });
                    let landed = w.now;
                    w.store.records.insert(
                        id,
                        Stored {
                            inc,
                            rec: stored,
                            landed_stale: stale,
                            landed,
                        },
                    );
                })
                .await;
            if result.is_ok() {
                old.written.insert(run, (id, (*rec).clone()));
            }
            let result = result.map(|()| record_path(id));
            sim.with(|w| w.send(inc, Comp::Old(Completion::Created { run, result }), true));
        }
        Job::End { run, ended } => {
            let Some((id, mut rec)) = old.written.remove(&run) else {
                let result = Err(WriteError::NoRecord.to_string());
                sim.with(|w| w.send(inc, Comp::Old(Completion::Ended { run, result }), true));
                return;
            };
            rec.ended = Some(ended);
            rec.updated_ms = sim.with(|w| w.wall(node));
            let rec = Rc::new(rec);
            let result = sim
                .write(node, move |w| {
                    let landed = w.now;
                    w.store.records.insert(
                        id,
                        Stored {
                            inc,
                            rec,
                            landed_stale: false,
                            landed,
                        },
                    );
                })
                .await;
            sim.with(|w| w.send(inc, Comp::Old(Completion::Ended { run, result }), true));
        }
        Job::Remove { run } => {
            let result = match old.written.remove(&run) {
                Some((id, _)) => {
                    sim.write(node, move |w| {
                        w.store.records.remove(&id);
                    })
                    .await
                }
                None => Ok(()),
            };
            sim.with(|w| w.send(inc, Comp::Old(Completion::Removed { run, result }), true));
        }
    }
}
