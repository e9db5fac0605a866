//! The recorder thread of an incarnation, as a task: the logic of `Worker` in
//! src/locks/recorder.rs (one job at a time; the heartbeat every TTL/3 ahead of everything; a
//! heartbeat before a create unless `fresh_enough`; a rescan after each heartbeat), with every
//! storage call a timed operation on the simulated volume. Under `Rules::Legacy` it is the old
//! recorder: no fresh-heartbeat check, one heartbeat file per owner name, read by name.

use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use tfinit::locks::liveness::{fresh_enough, Facts};
use tfinit::locks::names::RunId;
use tfinit::locks::record::{FileId, Heartbeat, Owner, Record};
use tfinit::locks::recorder::{Beat, Completion, Entry, Table, WriteError};
use tfinit::locks::store::kernel_proof_with;

use super::legacy;
use super::world::{
    created, list, record_path, Comp, Ev, Job, LockFile, LoopEv, Ms, Next, Rules, Sim, Stored,
    StoredBeat, WaitFor, World, VOLUME_DEV,
};

/// The recorder of incarnation `inc`, from the store's opening on.
pub async fn run(sim: Rc<Sim>, inc: usize) {
    let (rules, node, ttl) = sim.with(|w| (w.cfg.rules, w.incs[inc].node, w.ttl_of(inc)));
    open(&sim, inc, true).await;
    loop {
        let job = sim.with(|w| {
            let now = w.now;
            let i = &w.incs[inc];
            if i.open && now >= i.next_beat {
                let due = next_due(w, node, ttl);
                let i = &mut w.incs[inc];
                i.next_beat = due;
                i.rq.heartbeat = true;
            }
            w.incs[inc].rq.next()
        });
        // A store that failed at open is tried again on the heartbeat's clock (today's rules).
        let retry = sim
            .with(|w| rules == Rules::New && !w.incs[inc].open && w.now >= w.incs[inc].next_beat);
        if retry {
            open(&sim, inc, false).await;
        }
        match job {
            Some(Next::Heartbeat) => {
                let late = sim.with(|w| {
                    let now = w.mono(node);
                    w.incs[inc]
                        .last_heartbeat
                        .is_none_or(|t| now.saturating_duration_since(t) > ttl / 2)
                });
                if heartbeat_now(&sim, inc, late).await {
                    if rules == Rules::New {
                        close_again(&sim, inc).await;
                    }
                    sim.with(|w| w.incs[inc].rq.rescan = true);
                }
            }
            Some(Next::Rescan) => {
                if sim.with(|w| w.incs[inc].open) {
                    let comp = if rules == Rules::New {
                        Comp::New(Completion::Table(scan(&sim, inc).await))
                    } else {
                        Comp::Old(legacy::Completion::Table(scan_legacy(&sim, inc).await))
                    };
                    sim.with(|w| w.send(inc, comp, false));
                }
            }
            Some(Next::Write(job)) => write(&sim, inc, job).await,
            None => {
                let (open, due) = sim.with(|w| (w.incs[inc].open, w.incs[inc].next_beat));
                let until = if open || rules == Rules::New {
                    due
                } else {
                    Ms::MAX
                };
                sim.with(|w| w.incs[inc].rec_idle = true);
                WaitFor::new(&sim, until, move |w: &World| !w.incs[inc].rq.is_empty()).await;
                sim.with(|w| w.incs[inc].rec_idle = false);
            }
        }
    }
}

/// Opens the store (`first`: at start; else a retry of a store that failed): the lock file,
/// the first heartbeat, the scan; or, when it fails, the records as they can still be listed.
async fn open(sim: &Rc<Sim>, inc: usize, first: bool) {
    let (rules, node, ttl) = sim.with(|w| (w.cfg.rules, w.incs[inc].node, w.ttl_of(inc)));
    // The lock file first (store.rs `hold_incarnation_lock`: open or create the file at the path,
    // flock it, fstat it): the first heartbeat says whether it is held, and which file it is.
    // Another live incarnation with the same key (same name, boot, start millisecond and pid)
    // may hold it.
    sim.with(|w| {
        if rules == Rules::New && w.incs[inc].lock_ino.is_none() {
            let key = w.incs[inc].key.clone();
            let found = w.store.lock_files.get(&key).copied();
            let taken = found.is_some_and(|f| f.holder.is_some_and(|h| w.flock_held(h, w.now)));
            if !taken {
                let ino = found.map_or_else(
                    || {
                        w.store.next_ino += 1;
                        w.store.next_ino
                    },
                    |f| f.ino,
                );
                let file = LockFile {
                    ino,
                    holder: Some(inc),
                };
                w.store.lock_files.insert(key, file);
                w.incs[inc].lock_ino = Some(ino);
            }
            w.incs[inc].holds_lock = !taken;
        }
    });
    let (stamped, result) = beat(sim, inc).await;
    let ok = result.is_ok();
    let comp = if rules == Rules::New {
        let table = if ok {
            scan(sim, inc).await
        } else {
            listed(sim, inc).await
        };
        let table = Some(table);
        Comp::New(Completion::Opened {
            result,
            table,
            passwd_user: None,
            beat: ok.then_some(stamped),
            lock: None,
        })
    } else {
        let table = if ok {
            Some(scan_legacy(sim, inc).await)
        } else {
            None
        };
        Comp::Old(legacy::Completion::Opened { result, table })
    };
    sim.with(|w| {
        let due = next_due(w, node, ttl);
        let i = &mut w.incs[inc];
        i.open = ok;
        i.next_beat = due;
        // Another failure wakes nobody (the real recorder sends it quietly).
        w.send(inc, comp, first || ok);
    });
}

/// The records alone, as a store that cannot be written still lists them (recorder.rs:
/// `listed`).
async fn listed(sim: &Sim, inc: usize) -> Table {
    let node = sim.with(|w| w.incs[inc].node);
    let scanned = sim.with(|w| w.mono(node));
    let records = list(sim, node)
        .await
        .iter()
        .map(|(id, rec)| Entry {
            path: record_path(*id),
            workdir: PathBuf::from(&rec.workdir),
            who: rec.who.clone(),
            facts: Facts::of(rec),
        })
        .collect();
    Table {
        scanned,
        records,
        beats: Vec::new(),
        gone: Vec::new(),
        held: Vec::new(),
    }
}

/// Tries again each closing of a finished run's record that failed (the real recorder's
/// `close_again`), in the order they failed; reports those that land.
async fn close_again(sim: &Sim, inc: usize) {
    let (node, unclosed) =
        sim.with(|w| (w.incs[inc].node, std::mem::take(&mut w.incs[inc].unclosed)));
    for (run, id, ended) in unclosed {
        let retry = ended.clone();
        let result = match ended {
            None => {
                sim.write(node, move |w| {
                    w.store.records.remove(&id);
                })
                .await
            }
            Some(rec) => store_ended(sim, node, inc, id, rec).await,
        };
        sim.with(|w| match result {
            Ok(()) => {
                let c = match retry {
                    None => Completion::Removed {
                        run,
                        result: Ok(()),
                    },
                    Some(_) => Completion::Ended {
                        run,
                        result: Ok(()),
                    },
                };
                w.send(inc, Comp::New(c), true);
            }
            Err(_) => w.incs[inc].unclosed.push((run, id, retry)),
        });
    }
}

/// Writes record `id` of incarnation `inc` marked ended (`rec`) from `node`.
async fn store_ended(
    sim: &Sim,
    node: usize,
    inc: usize,
    id: u64,
    rec: Record,
) -> Result<(), String> {
    let rec = Rc::new(rec);
    sim.write(node, move |w| {
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
    .await
}

/// When the next heartbeat is due: TTL/3 from now on the node's own clock.
fn next_due(w: &World, node: usize, ttl: Duration) -> Ms {
    let n = &w.nodes[node];
    n.real_at(n.mono(w.now) + ttl / 3)
}

/// Writes the next heartbeat: when its stamp was taken, and whether it landed.
async fn beat(sim: &Sim, inc: usize) -> (Instant, Result<(), String>) {
    let (node, key, hb, stamped, now) = sim.with(|w| {
        let node = w.incs[inc].node;
        let wall = w.wall(node);
        let legacy = w.cfg.rules == Rules::Legacy;
        let i = &mut w.incs[inc];
        let ttl_ms = i.ttl;
        i.seq += 1;
        let hb = Heartbeat {
            v: if legacy { 1 } else { 2 },
            owner: i.owner.clone(),
            seq: if legacy { 0 } else { i.seq },
            updated_ms: wall,
            holds_lock: i.holds_lock,
            // The old heartbeat had no host; today's says which host its runs lock as.
            host: if legacy {
                String::new()
            } else {
                i.host.clone()
            },
            ttl_ms: (!legacy).then_some(ttl_ms),
            lock_file: i.lock_ino.filter(|_| i.holds_lock).map(|ino| FileId {
                dev: VOLUME_DEV,
                ino,
            }),
        };
        // Legacy: one file per owner name, whoever wrote it last.
        let key = if legacy {
            i.owner.name.clone()
        } else {
            i.key.clone()
        };
        (node, key, Rc::new(hb), w.mono(node), w.now)
    });
    let result = sim
        .write(node, move |w| {
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
        sim.with(|w| w.incs[inc].last_heartbeat = Some(stamped));
    }
    (stamped, result)
}

/// A heartbeat, reported to the loop (waking it when `wake`, or when it failed).
async fn heartbeat_now(sim: &Sim, inc: usize, wake: bool) -> bool {
    let wall_ms = sim.with(|w| w.wall(w.incs[inc].node));
    let (stamped, result) = beat(sim, inc).await;
    let ok = result.is_ok();
    sim.with(|w| {
        let comp = if w.cfg.rules == Rules::New {
            Comp::New(Completion::Heartbeat {
                result: result.map_err(WriteError::Volume),
                stamped,
                wall_ms,
            })
        } else {
            Comp::Old(legacy::Completion::Heartbeat { result, stamped })
        };
        w.send(inc, comp, !ok || wake);
    });
    ok
}

/// The recorder's scan: records, one timed read of each other incarnation's heartbeat, the
/// kernel's proof for those of this boot, and the other incarnations of our own name.
async fn scan(sim: &Sim, inc: usize) -> Table {
    let (node, me) = sim.with(|w| (w.incs[inc].node, w.incs[inc].owner.clone()));
    let mut table = listed(sim, inc).await;
    let mut owners: Vec<Owner> = Vec::new();
    for e in &table.records {
        if !owners.iter().any(|o| o.same_incarnation(&e.facts.owner)) {
            owners.push(e.facts.owner.clone());
        }
    }
    // One read of each other incarnation's heartbeat, one after the other, then one read of
    // every heartbeat of our own name: each with its own start, end and moment, looked up in
    // the files' history once the last one is done.
    owners.retain(|o| !o.same_incarnation(&me));
    let times = sim.with(|w| w.read_sequence(node, owners.len() + 1));
    let end = times.last().map_or(sim.now(), |t| t.2);
    sim.sleep_until(end).await;
    let mut beats = Vec::new();
    let mut gone = Vec::new();
    let mut held = Vec::new();
    sim.with(|w| {
        let n = &w.nodes[node];
        for (owner, &(start, at, done)) in owners.into_iter().zip(&times) {
            let key = owner.key();
            let heartbeat = w
                .store
                .beat_at(&key, at)
                .filter(|b| b.hb.v == 2 && b.hb.owner.same_incarnation(&owner))
                .map(|b| (*b.hb).clone());
            // recorder.rs: the store's `kernel_proof` on the heartbeat just read.
            let proof = kernel_proof_with(&me, &owner, heartbeat.as_ref(), |file| {
                w.incarnation_gone_at(node, &owner, file, done)
            });
            match proof {
                Some(true) => gone.push(key),
                Some(false) => held.push(key),
                None => {}
            }
            beats.push(Beat {
                owner,
                heartbeat,
                started: n.mono(start),
                done: n.mono(done),
            });
        }
        // `name/incarnation` keys: those of our name are one range, in incarnation order.
        let (start, at, done) = *times.last().expect("one read at least");
        let (from, to) = (format!("{}/", me.name), format!("{}0", me.name));
        let named: Vec<Heartbeat> = w
            .store
            .beats
            .range(from..to)
            .filter_map(|(k, _)| w.store.beat_at(k, at))
            .filter(|b| b.hb.v == 2 && b.hb.owner.name == me.name)
            .map(|b| (*b.hb).clone())
            .collect();
        for hb in named {
            if hb.owner.same_incarnation(&me)
                || beats
                    .iter()
                    .any(|b: &Beat| b.owner.same_incarnation(&hb.owner))
            {
                continue;
            }
            beats.push(Beat {
                owner: hb.owner.clone(),
                heartbeat: Some(hb),
                started: n.mono(start),
                done: n.mono(done),
            });
        }
    });
    table.beats = beats;
    table.gone = gone;
    table.held = held;
    table
}

/// The old scan: records, and the heartbeat file of each records' owner name.
async fn scan_legacy(sim: &Sim, inc: usize) -> legacy::Table {
    let node = sim.with(|w| w.incs[inc].node);
    let scanned = sim.with(|w| w.mono(node));
    let found = list(sim, node).await;
    let mut records = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for (id, rec) in &found {
        if !names.contains(&rec.owner.name) {
            names.push(rec.owner.name.clone());
        }
        records.push(Entry {
            path: record_path(*id),
            workdir: PathBuf::from(&rec.workdir),
            who: rec.who.clone(),
            facts: Facts::of(rec),
        });
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
    legacy::Table {
        scanned,
        records,
        heartbeats,
    }
}

/// One record write, reported to the loop.
async fn write(sim: &Sim, inc: usize, job: Job) {
    let (rules, node, ttl, open) = sim.with(|w| {
        (
            w.cfg.rules,
            w.incs[inc].node,
            w.ttl_of(inc),
            w.incs[inc].open,
        )
    });
    let new = rules == Rules::New;
    match job {
        Job::Create { run, mut record } => {
            if new {
                // A record lands only under a fresh heartbeat (the real recorder's rule).
                let fresh =
                    sim.with(|w| fresh_enough(w.incs[inc].last_heartbeat, w.mono(node), ttl));
                if open && !fresh && !heartbeat_now(sim, inc, true).await {
                    let result = Err(WriteError::NoHeartbeat);
                    sim.with(|w| w.send(inc, created(new, run, result), true));
                    return;
                }
            }
            if !open {
                sim.with(|w| w.send(inc, created(new, run, Err(WriteError::NotOpen)), true));
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
            sim.with(|w| {
                if result.is_ok() {
                    w.incs[inc].written.insert(run, (id, (*rec).clone()));
                }
                w.send(
                    inc,
                    created(
                        new,
                        run,
                        result.map(|()| record_path(id)).map_err(WriteError::Volume),
                    ),
                    true,
                );
            });
        }
        Job::End { run, ended } => {
            let Some((id, mut rec)) = sim.with(|w| w.incs[inc].written.remove(&run)) else {
                sim.with(|w| w.send(inc, ended_comp(new, run, Err(WriteError::NoRecord)), true));
                return;
            };
            rec.ended = Some(ended);
            rec.updated_ms = sim.with(|w| w.wall(node));
            let retry = new.then(|| rec.clone());
            let result = store_ended(sim, node, inc, id, rec).await;
            let result = result.map_err(WriteError::Volume);
            sim.with(|w| {
                if let (Err(_), Some(rec)) = (&result, retry) {
                    w.incs[inc].unclosed.push((run, id, Some(rec)));
                }
                w.send(inc, ended_comp(new, run, result), true)
            });
        }
        Job::Remove { run } => {
            let result = match sim.with(|w| w.incs[inc].written.remove(&run)) {
                Some((id, _)) => {
                    let r = sim
                        .write(node, move |w| {
                            w.store.records.remove(&id);
                        })
                        .await;
                    if r.is_err() && new {
                        sim.with(|w| w.incs[inc].unclosed.push((run, id, None)));
                    }
                    r
                }
                None => Ok(()),
            };
            let comp = if new {
                Comp::New(Completion::Removed {
                    run,
                    result: result.map_err(WriteError::Volume),
                })
            } else {
                Comp::Old(legacy::Completion::Removed { run, result })
            };
            sim.with(|w| w.send(inc, comp, true));
        }
    }
}

fn ended_comp(new: bool, run: RunId, result: Result<(), WriteError>) -> Comp {
    if new {
        Comp::New(Completion::Ended { run, result })
    } else {
        let result = result.map_err(|e| e.to_string());
        Comp::Old(legacy::Completion::Ended { run, result })
    }
}

impl World {
    /// A completion for incarnation `inc`'s loop; `wake`: through the eventfd (else it is taken
    /// whenever the loop next looks).
    pub fn send(&mut self, inc: usize, c: Comp, wake: bool) {
        if !self.incs[inc].alive {
            return;
        }
        self.incs[inc].inbox.push(c);
        if wake {
            let now = self.now;
            self.at(now, Ev::Loop(inc, LoopEv::Wake));
        }
    }

    /// `n` volume operations from `node`, one after the other from now: (start, moment, end).
    pub fn read_sequence(&mut self, node: usize, n: usize) -> Vec<(Ms, Ms, Ms)> {
        let mut t = self.now;
        (0..n)
            .map(|_| {
                let (at, done) = self.op_timing_from(node, t);
                let r = (t, at, done);
                t = done;
                r
            })
            .collect()
    }

    /// Whether incarnation `inc`'s flock is held at time `t`: by its init or a terraform run.
    pub fn flock_held(&self, inc: usize, t: Ms) -> bool {
        self.incs[inc].died_at.is_none_or(|d| d > t)
            || self
                .procs
                .iter()
                .any(|p| p.inc == inc && p.started <= t && p.died > t)
    }

    /// Incarnation `inc`'s TTL.
    pub fn ttl_of(&self, inc: usize) -> Duration {
        Duration::from_millis(self.incs[inc].ttl)
    }
}
