//! The Lease store (src/locks/store/kube/mod.rs `KubeStore`) step by step, over the simulated
//! API server (`api.rs`): what each call sends, and what each answer does.
//!
//! - A heartbeat is its incarnation's Lease, a record one Lease per run (its name fixed by owner
//!   and run, `layout::record_name`: here `rec-<id>`, the id drawn once per run).
//! - A write is `put`: an update of the Lease as last known (its `resourceVersion`), or a create;
//!   409 (changed, or exists), 404 (gone), a lost answer and no answer are each resolved by a get
//!   and the change applied to what it read, at most 5 rounds; each request sent again as the
//!   real `RetryPolicy` says (`api::retried`).
//! - A read that gets no answer is an error (the store contract of issue 24): a list of records
//!   is `Found::Unlisted`, a heartbeat read or a list of heartbeats an `Err`.
//! - A record Lease edited by hand into garbage is set aside by relabelling (an update on the
//!   version read: a record its owner rewrote since is a conflict, and stays).
//! - A person deletes or garbles one Lease of an owner at a time (`hand`): deleting both a live
//!   run's record and its owner's heartbeat destroys the evidence, as deleting both files would
//!   on the volume, and is outside the model (docs/reliability.md).
//!
//! The kernel's proof is the file store's alone: a Lease incarnation holds no lock file.

use std::collections::HashMap;
use std::io;
use std::rc::Rc;

use tfinit::kube::{Error, Verb};
use tfinit::locks::record::{Heartbeat, Owner, Record};
use tfinit::locks::record_id::RecordId;
use tfinit::locks::recorder::machine::{HeartbeatRead, Held, Op, Outcome};
use tfinit::locks::recorder::Entry;
use tfinit::locks::store::Change;

use super::api::{call, retried, Body, Pre, Refusal};
use super::exec::Sim;
use super::world::{record_path, Ms, StoredBeat, World};

/// The name of record `id`'s Lease.
pub fn record_name(id: u64) -> String {
    format!("rec-{id}")
}

/// The name of the heartbeat Lease of the incarnation of `key`.
pub fn beat_name(key: &str) -> String {
    format!("hb-{key}")
}

/// One `KubeStore` of a process on `node`: the `resourceVersion` of each Lease as last written
/// or read (`known`).
pub struct Client {
    node: usize,
    known: HashMap<String, u64>,
}

/// A Lease's version as read.
type Read<T> = Result<Option<(u64, T)>, Error>;

impl Client {
    /// The store of a process on `node`.
    pub fn new(node: usize) -> Client {
        Client {
            node,
            known: HashMap::new(),
        }
    }

    /// `KubeStore::get`: the Lease `name` (None: it does not exist), `read` of it at the
    /// moment the server answers.
    async fn get<T: 'static>(
        &mut self,
        sim: &Sim,
        name: &str,
        read: impl Fn(&World, &super::api::Obj) -> T + Clone + 'static,
    ) -> Read<T> {
        let n = name.to_string();
        let got = retried(sim, self.node, Verb::Get, Some(name), move |w| {
            let o = w.api.get(&n)?;
            Ok((o.rv, read(w, &o)))
        })
        .await;
        match got {
            Ok(v) => {
                self.known.insert(name.to_string(), v.0);
                Ok(Some(v))
            }
            Err(Error::NotFound { .. }) => {
                self.known.remove(name);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// `KubeStore::put`: `body` written to `name`, `land` applied with it where it lands.
    async fn put(
        &mut self,
        sim: &Sim,
        name: &str,
        body: Body,
        land: impl Fn(&mut World) + Clone + 'static,
    ) -> Result<(), Error> {
        let mut base = self.known.get(name).copied();
        let mut last = None;
        for _ in 0..5 {
            let (n, b, l) = (name.to_string(), body.clone(), land.clone());
            let written = match base {
                Some(rv) => {
                    retried(sim, self.node, Verb::Update, Some(name), move |w| {
                        let o = w.api.update(&n, rv, b.clone())?;
                        l(w);
                        Ok(o.rv)
                    })
                    .await
                }
                None => {
                    retried(sim, self.node, Verb::Create, Some(name), move |w| {
                        let o = w.api.create(&n, b.clone())?;
                        l(w);
                        Ok(o.rv)
                    })
                    .await
                }
            };
            match written {
                Ok(rv) => {
                    self.known.insert(name.to_string(), rv);
                    return Ok(());
                }
                Err(
                    e @ (Error::Conflict { .. }
                    | Error::AlreadyExists { .. }
                    | Error::NotFound { .. }
                    | Error::AnswerLost { .. }
                    | Error::Timeout { .. }),
                ) => {
                    last = Some(e);
                    base = self.get(sim, name, |_, _| ()).await?.map(|(rv, ())| rv);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.expect("a round ended in an error"))
    }

    /// `KubeStore::list` of the record Leases: the records, and the names and versions of the
    /// record Leases that cannot be read (edited by hand).
    pub async fn records(&mut self, sim: &Sim) -> Result<Listed, Error> {
        retried(sim, self.node, Verb::List, None, |w| {
            let recs = w
                .store
                .records
                .iter()
                .map(|(id, s)| (*id, Rc::clone(&s.rec)))
                .collect();
            let bad = w
                .api
                .objs
                .iter()
                .filter(|(n, o)| o.body == Body::Garbage && n.starts_with("rec-"))
                .map(|(n, o)| (n.clone(), o.rv))
                .collect();
            Ok((recs, bad))
        })
        .await
    }

    /// `KubeStore::read_heartbeat`: Ok(None) when missing, unreadable or another incarnation's;
    /// Err when the API gave no answer.
    pub async fn read_heartbeat(
        &mut self,
        sim: &Sim,
        owner: &Owner,
    ) -> Result<Option<Heartbeat>, String> {
        let key = owner.key();
        let o = owner.clone();
        let got = self
            .get(sim, &beat_name(&key), move |w, obj| {
                (obj.body == Body::Beat(key.clone()))
                    .then(|| w.store.beat(&key))
                    .flatten()
                    .filter(|b| b.hb.v == 2 && b.hb.owner.same_incarnation(&o))
                    .map(|b| (*b.hb).clone())
            })
            .await;
        got.map(|found| found.and_then(|(_, hb)| hb))
            .map_err(|e| e.to_string())
    }

    /// `KubeStore::heartbeats` (every one) or `heartbeats_named`; Err when not answered.
    pub async fn heartbeats(
        &mut self,
        sim: &Sim,
        named: Option<&str>,
    ) -> Result<Vec<Heartbeat>, String> {
        let named = named.map(str::to_string);
        retried(sim, self.node, Verb::List, None, move |w| {
            Ok(w.api
                .objs
                .values()
                .filter_map(|o| match &o.body {
                    Body::Beat(key) => w.store.beat(key),
                    _ => None,
                })
                .filter(|b| b.hb.v == 2)
                .filter(|b| named.as_ref().is_none_or(|n| b.hb.owner.name == *n))
                .map(|b| (*b.hb).clone())
                .collect())
        })
        .await
        .map_err(|e| e.to_string())
    }

    /// `KubeStore::remove`: a delete; a Lease already gone is fine.
    pub async fn remove(&mut self, sim: &Sim, id: u64) -> Result<(), Error> {
        let name = record_name(id);
        let n = name.clone();
        let r = retried(sim, self.node, Verb::Delete, Some(&name), move |w| {
            w.api.delete(&n, Pre::None)?;
            w.store.records.remove(&id);
            Ok(())
        })
        .await;
        self.known.remove(&name);
        match r {
            Ok(()) | Err(Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `Store::sweep`'s part for the Leases: each unreadable record Lease listed is set aside
    /// (`KubeStore::set_aside`: a get, then an update relabelling the version that get read,
    /// whatever it holds by then: a record its owner rewrote since the list is set aside too,
    /// and back when its owner next writes it, after the 409).
    pub async fn set_aside(&mut self, sim: &Sim, bad: &[(String, u64)]) {
        for (name, _) in bad {
            let Ok(Some((rv, ()))) = self.get(sim, name, |_, _| ()).await else {
                continue;
            };
            let n = name.clone();
            let _ = retried(sim, self.node, Verb::Update, Some(name), move |w| {
                let before = w.api.get(&n)?.body;
                w.api.update(&n, rv, Body::Aside)?;
                if let Body::Record(id) = before {
                    w.store.records.remove(&id);
                    w.log(|| format!("record Lease {id}, rewritten since the list, set aside"));
                }
                Ok(())
            })
            .await;
        }
    }
}

/// A list of records: (id, record) in force, (name, version) of the unreadable.
pub type Listed = (Vec<(u64, Rc<Record>)>, Vec<(String, u64)>);

fn io_of(e: Error) -> io::Error {
    io::Error::other(e.to_string())
}

/// Does `op` for incarnation `inc` (on `node`, owner `me`) as `KubeStore` would; `ids`: the
/// record id of each run (its Lease name).
pub async fn perform(
    sim: &Sim,
    (inc, node, me): (usize, usize, &Owner),
    kube: &mut Client,
    ids: &mut HashMap<String, u64>,
    op: Op,
) -> Outcome {
    match op {
        Op::Open { .. } => {
            // `KubeStore::open`: the heartbeat Leases listable; no lock file.
            let listed = retried(sim, node, Verb::List, None, |_| Ok(())).await;
            let host = sim.with(|w| {
                w.incs[inc].holds_lock = false;
                w.incs[inc].host.clone()
            });
            Outcome::Opened {
                passwd_user: None,
                host,
                location: format!("the Leases of namespace {}", super::api::NAMESPACE),
                result: listed.map(|()| Held::NoFile).map_err(|e| e.to_string()),
            }
        }
        Op::WriteHeartbeat(hb) => {
            let (key, stamped) = sim.with(|w| (w.incs[inc].key.clone(), w.now));
            let hb = Rc::new(hb);
            let k = key.clone();
            let land = move |w: &mut World| {
                let landed = w.now;
                w.store
                    .beats
                    .entry(k.clone())
                    .or_default()
                    .push(StoredBeat {
                        hb: Rc::clone(&hb),
                        stamped,
                        landed,
                    });
                let i = &mut w.incs[inc];
                i.beat_landed = Some(i.beat_landed.map_or(stamped, |b| b.max(stamped)));
            };
            let r = kube.put(sim, &beat_name(&key), Body::Beat(key), land).await;
            Outcome::Wrote(r.map_err(io_of))
        }
        Op::Tidy { .. } => {
            if let Ok((_, bad)) = kube.records(sim).await {
                kube.set_aside(sim, &bad).await;
            }
            Outcome::Tidied
        }
        Op::List => {
            // `Found::Unlisted` when the list got no answer: the records are unknown.
            let (found, unlisted) = match kube.records(sim).await {
                Ok(l) => (l.0, None),
                Err(e) => (Vec::new(), Some(e.to_string())),
            };
            Outcome::Listed {
                records: found
                    .into_iter()
                    .map(|(id, rec)| Entry::of(record_path(id), &rec))
                    .collect(),
                unlisted,
            }
        }
        Op::ReadHeartbeats { owners, name } => {
            let mut each = Vec::new();
            for owner in owners {
                let started = sim.with(|w| w.mono(node));
                let answer = kube.read_heartbeat(sim, &owner).await;
                let done = sim.with(|w| w.mono(node));
                each.push(HeartbeatRead {
                    owner,
                    answer,
                    started,
                    done,
                    proof: None,
                });
            }
            let named_started = sim.with(|w| w.mono(node));
            let named = kube.heartbeats(sim, Some(&name)).await;
            let named_done = sim.with(|w| w.mono(node));
            Outcome::Heartbeats {
                each,
                named,
                named_started,
                named_done,
            }
        }
        // `KubeStore::apply`: one request per record Lease. The real store has a batch's
        // requests in flight together; here they go one after the other (each its own timed
        // request), which orders them no differently with respect to the heartbeat written
        // before the batch.
        Op::Apply(changes) => {
            let mut results = Vec::new();
            for c in changes {
                results.push(match c {
                    Change::Put(record) => put_record(sim, inc, kube, ids, record).await,
                    Change::Remove(path) => {
                        let id = record_id(&path);
                        let r = kube.remove(sim, id).await;
                        if r.is_ok() {
                            ids.retain(|_, v| *v != id);
                        }
                        r.map(|()| path).map_err(io_of)
                    }
                });
            }
            let _ = me;
            Outcome::Applied(results)
        }
    }
}

/// One record Lease written (created or rewritten) for incarnation `inc`.
async fn put_record(
    sim: &Sim,
    inc: usize,
    kube: &mut Client,
    ids: &mut HashMap<String, u64>,
    record: Box<Record>,
) -> io::Result<RecordId> {
    let first = !ids.contains_key(&record.run_id);
    let id = *ids.entry(record.run_id.clone()).or_insert_with(|| {
        sim.with(|w| {
            w.next_record += 1;
            w.next_record
        })
    });
    let rec = Rc::new(*record);
    let land = move |w: &mut World| {
        super::recorder::land(w, id, inc, Rc::clone(&rec), first, "record Lease");
    };
    let r = kube
        .put(sim, &record_name(id), Body::Record(id), land)
        .await;
    r.map(|()| record_path(id)).map_err(io_of)
}

/// The id of the record at `path` ([`record_path`]).
fn record_id(path: &RecordId) -> u64 {
    path.as_file()
        .and_then(|p| p.file_stem())
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse().ok())
        .expect("a path made by record_path")
}

/// A single request of the recovery Lease (not retried), as `recovery.rs` sends some.
pub async fn once<T: 'static>(
    sim: &Sim,
    node: usize,
    verb: Verb,
    apply: impl FnOnce(&mut World) -> Result<T, Refusal> + 'static,
) -> Result<T, Error> {
    call(sim, node, verb, Some(super::api::RECOVERY), apply).await
}

impl World {
    /// A person deletes (or, with `garbage`, edits into garbage) one Lease of an owner none of
    /// whose Leases was touched by hand yet.
    pub fn hand(&mut self, garbage: bool) {
        let mut cands: Vec<(String, String)> = Vec::new();
        for (name, o) in &self.api.objs {
            let owner = match &o.body {
                Body::Beat(key) => key.clone(),
                Body::Record(id) => match self.store.records.get(id) {
                    Some(s) => s.rec.owner.key(),
                    None => continue,
                },
                _ => continue,
            };
            if !self.api.touched.contains(&owner) {
                cands.push((name.clone(), owner));
            }
        }
        if cands.is_empty() {
            return;
        }
        let (name, owner) = cands.swap_remove(self.rng.pick(cands.len()));
        self.api.touched.push(owner);
        let body = self.api.objs[&name].body.clone();
        if garbage {
            self.api.edit(&name, Body::Garbage);
        } else {
            self.api.objs.remove(&name);
        }
        let what = if garbage {
            "edits into garbage"
        } else {
            "deletes"
        };
        self.log(|| format!("a person {what} Lease {name}"));
        match body {
            Body::Beat(key) => self.beat_gone(&key),
            Body::Record(id) => {
                self.store.records.remove(&id);
            }
            _ => {}
        }
    }

    /// The heartbeat of `key` can no longer be read (its Lease deleted or garbled): a version
    /// that is no heartbeat of the current format, which every reader skips.
    fn beat_gone(&mut self, key: &str) {
        let now: Ms = self.now;
        if let Some(last) = self.store.beat(key).cloned() {
            let mut hb = (*last.hb).clone();
            hb.v = 0;
            self.store
                .beats
                .entry(key.to_string())
                .or_default()
                .push(StoredBeat {
                    hb: Rc::new(hb),
                    stamped: last.stamped,
                    landed: now,
                });
        }
    }
}
