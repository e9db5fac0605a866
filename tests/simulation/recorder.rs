//! The recorder thread of an incarnation, as a task: the real recorder's decisions
//! (`tfinit::locks::recorder::machine::Machine`: the order of work, the heartbeat every TTL/3
//! ahead of everything, a heartbeat before a create unless `fresh_enough`, the retries of failed
//! closings, a rescan after each heartbeat) driven the way the thread drives them
//! (src/locks/recorder/thread.rs `serve`), with each storage operation a timed operation on the
//! simulated volume instead of a `Store` call. Under `Rules::Legacy` the old recorder runs
//! instead (`legacy_recorder.rs`).

use std::collections::HashMap;
use std::io;
use std::rc::Rc;
use std::time::Duration;

use tfinit::locks::record::{FileId, Owner, Record};
use tfinit::locks::record_id::RecordId;
use tfinit::locks::recorder::machine::{HeartbeatRead, Held, Machine, Next, Now, Op, Out, Outcome};
use tfinit::locks::recorder::Entry;
use tfinit::locks::store::{kernel_proof_with, Change};

use super::exec::{list, Sim, WaitFor};
use super::lease_store;
use super::world::{
    record_path, Comp, Ev, LockFile, LoopEv, Ms, Stored, StoredBeat, World, VOLUME_DEV,
};

/// The recorder of incarnation `inc`, from the store's opening on.
pub async fn run(sim: Rc<Sim>, inc: usize) {
    let (me, ttl, node) =
        sim.with(|w| (w.incs[inc].owner.clone(), w.ttl_of(inc), w.incs[inc].node));
    let mut machine = Machine::new(me.clone(), ttl, "/state".into());
    // The id of each record this incarnation wrote, by run (the real store names a record by its
    // owner and run).
    let mut ids: HashMap<String, u64> = HashMap::new();
    // On the Lease store: `KubeStore` (`lease_store.rs`) instead of the volume.
    let leases = sim.with(|w| w.cfg.leases);
    let mut kube = lease_store::Client::new(node);
    loop {
        for r in sim.with(|w| std::mem::take(&mut w.incs[inc].requests)) {
            machine.request(r);
        }
        let next = machine.next(now(&sim, node));
        flush(&sim, inc, &mut machine);
        match next {
            Next::Do(op) => {
                let outcome = if leases {
                    lease_store::perform(&sim, (inc, node, &me), &mut kube, &mut ids, op).await
                } else {
                    perform(&sim, (inc, node, &me), &mut ids, op).await
                };
                machine.finished(outcome, now(&sim, node));
            }
            Next::Wait(until) => {
                let t = sim.with(|w| w.nodes[node].real_at(until));
                sim.with(|w| w.incs[inc].rec_idle = true);
                WaitFor::new(&sim, t, move |w: &World| !w.incs[inc].requests.is_empty()).await;
                sim.with(|w| w.incs[inc].rec_idle = false);
            }
        }
        flush(&sim, inc, &mut machine);
    }
}

/// Node `node`'s clocks now.
fn now(sim: &Sim, node: usize) -> Now {
    sim.with(|w| Now {
        mono: w.mono(node),
        wall_ms: w.wall(node),
    })
}

/// Passes the machine's messages to the loop of `inc`.
fn flush(sim: &Sim, inc: usize, machine: &mut Machine) {
    let out = machine.take_out();
    if out.is_empty() {
        return;
    }
    sim.with(|w| {
        for o in out {
            match o {
                Out::Wake(c) => w.send(inc, Comp::New(c), true),
                Out::Quiet(c) => w.send(inc, Comp::New(c), false),
                Out::Done(n) => {
                    let i = &mut w.incs[inc];
                    i.writes = i.writes.saturating_sub(n);
                }
            }
        }
    });
}

fn volume_error(e: String) -> io::Error {
    io::Error::other(e)
}

/// Does `op` for incarnation `inc` (on `node`, owner `me`) as the store would, each volume
/// operation timed.
async fn perform(
    sim: &Sim,
    (inc, node, me): (usize, usize, &Owner),
    ids: &mut HashMap<String, u64>,
    op: Op,
) -> Outcome {
    match op {
        Op::Open { .. } => sim.with(|w| {
            // The lock file (store.rs `hold_incarnation_lock`: open or create the file at the
            // path, flock it, fstat it). Another live incarnation with the same key (same name,
            // boot, start millisecond and pid) may hold it.
            if w.incs[inc].lock_ino.is_none() {
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
            let i = &w.incs[inc];
            let held = match i.lock_ino.filter(|_| i.holds_lock) {
                Some(ino) => Held::File(
                    None,
                    FileId {
                        dev: VOLUME_DEV,
                        ino,
                    },
                ),
                None => Held::NoFile,
            };
            Outcome::Opened {
                passwd_user: None,
                host: i.host.clone(),
                location: "/state".into(),
                result: Ok(held),
            }
        }),
        Op::WriteHeartbeat(hb) => {
            // The file of this incarnation (its key, computed once).
            let (key, stamped) = sim.with(|w| (w.incs[inc].key.clone(), w.now));
            let hb = Rc::new(hb);
            let result = sim
                .write(node, move |w| {
                    let landed = w.now;
                    w.store.beats.entry(key).or_default().push(StoredBeat {
                        hb,
                        stamped,
                        landed,
                    });
                    let i = &mut w.incs[inc];
                    i.beat_landed = Some(i.beat_landed.map_or(stamped, |b| b.max(stamped)));
                })
                .await;
            Outcome::Wrote(result.map_err(volume_error))
        }
        // Nothing unreadable is ever on the simulated volume, and no heartbeat is pruned.
        Op::Tidy { .. } => Outcome::Tidied,
        Op::List => {
            let found = list(sim, node).await;
            Outcome::Listed {
                records: found
                    .into_iter()
                    .map(|(id, rec)| Entry::of(record_path(id), &rec))
                    .collect(),
                unlisted: None,
            }
        }
        Op::ReadHeartbeats { owners, name } => {
            // One read of each heartbeat, one after the other, then one of every heartbeat of
            // our own name: each with its own start, end and moment, looked up in the files'
            // history once the last one is done.
            let times = sim.with(|w| w.read_sequence(node, owners.len() + 1));
            let end = times.last().map_or(sim.now(), |t| t.2);
            sim.sleep_until(end).await;
            sim.with(|w| {
                let n = &w.nodes[node];
                let each = owners
                    .into_iter()
                    .zip(&times)
                    .map(|(owner, &(start, at, done))| {
                        let heartbeat = w
                            .store
                            .beat_at(&owner.key(), at)
                            .filter(|b| b.hb.v == 2 && b.hb.owner.same_incarnation(&owner))
                            .map(|b| (*b.hb).clone());
                        // The store's `kernel_proof` on the heartbeat just read, once the read
                        // returned.
                        let proof = kernel_proof_with(me, &owner, heartbeat.as_ref(), |file| {
                            w.incarnation_gone_at(node, &owner, file, done)
                        });
                        // The simulated volume answers every read (its faults hang or fail
                        // writes).
                        HeartbeatRead {
                            owner,
                            answer: Ok(heartbeat),
                            started: n.mono(start),
                            done: n.mono(done),
                            proof,
                        }
                    })
                    .collect();
                // `name/incarnation` keys: those of one name are one range.
                let (start, at, done) = *times.last().expect("one read at least");
                let (from, to) = (format!("{name}/"), format!("{name}0"));
                let named = w
                    .store
                    .beats
                    .range(from..to)
                    .filter_map(|(k, _)| w.store.beat_at(k, at))
                    .filter(|b| b.hb.v == 2 && b.hb.owner.name == name)
                    .map(|b| (*b.hb).clone())
                    .collect::<Vec<_>>();
                Outcome::Heartbeats {
                    each,
                    named: Ok(named),
                    named_started: n.mono(start),
                    named_done: n.mono(done),
                }
            })
        }
        Op::Apply(changes) => {
            // One batch is one atomic write of the incarnation's record file (the file store's
            // group commit): one timed operation for all of it, landing whole or not at all.
            let mut puts = Vec::new();
            let mut removes = Vec::new();
            let mut order = Vec::new();
            for c in changes {
                match c {
                    Change::Put(record) => {
                        let known = ids.get(&record.run_id).copied();
                        let id = known.unwrap_or_else(|| {
                            sim.with(|w| {
                                w.next_record += 1;
                                w.next_record
                            })
                        });
                        order.push(id);
                        puts.push((id, known.is_none(), Rc::new(*record)));
                    }
                    Change::Remove(path) => {
                        let id = record_id(&path);
                        order.push(id);
                        removes.push(id);
                    }
                }
            }
            let landed_puts: Vec<(String, u64)> = puts
                .iter()
                .map(|(id, _, r)| (r.run_id.clone(), *id))
                .collect();
            let gone = removes.clone();
            let result = sim
                .write(node, move |w| {
                    for (id, new, rec) in puts {
                        land(w, id, inc, rec, new, "record");
                    }
                    for id in removes {
                        w.store.records.remove(&id);
                    }
                })
                .await;
            if result.is_ok() {
                ids.extend(landed_puts);
                ids.retain(|_, v| !gone.contains(v));
            }
            Outcome::Applied(
                order
                    .into_iter()
                    .map(|id| {
                        result
                            .clone()
                            .map(|()| record_path(id))
                            .map_err(volume_error)
                    })
                    .collect(),
            )
        }
    }
}

/// The id of the record at `path` ([`record_path`]).
fn record_id(path: &RecordId) -> u64 {
    path.as_file()
        .and_then(|p| p.file_stem())
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse().ok())
        .expect("a path made by record_path")
}

impl World {
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

/// Record `id` of incarnation `inc` lands now in either store (`what`: "record", "record
/// Lease"), `new` when this is its create. A create lands under a stale heartbeat when its
/// owner's last one that landed was stamped more than a TTL before (an issue 18 finding).
pub fn land(w: &mut World, id: u64, inc: usize, rec: Rc<Record>, new: bool, what: &str) {
    let stale = new
        && w.incs[inc]
            .beat_landed
            .is_none_or(|b| w.now.saturating_sub(b) > w.incs[inc].ttl);
    if new {
        w.log(|| {
            format!(
                "{what} {id} of {} ({}) lands{}",
                rec.run_id,
                rec.owner.name,
                if stale {
                    " under a stale heartbeat"
                } else {
                    ""
                }
            )
        });
    }
    let landed = w.now;
    w.store.records.insert(
        id,
        Stored {
            inc,
            rec,
            landed_stale: stale,
            landed,
        },
    );
}
