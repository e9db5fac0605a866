//! The recovery helper process (`tfinit __recover` for one working directory, or `tfinit recover`
//! run by hand for every record), as a task. Under `Rules::New` it is the real procedure,
//! `Recovery::run_with` of src/locks/recover/mod.rs, driven through its store and effects
//! (`procedure.rs`). Under `Rules::Legacy` it is the old helper, modelled here: `recover.lock`
//! first, one listing, the old wall-clock rules on the heartbeat of the owner's name, no
//! re-check before the unlock. Also here: what both share (`recover.lock` or the recovery
//! Lease, the heartbeat listing, the state a working directory names).

use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use tfinit::locks::liveness::Facts;
use tfinit::locks::lockinfo::LockInfo;
use tfinit::locks::record::{Heartbeat, Owner, Record};
use tfinit::locks::recover::{decide, Decision, Window, CLOCK_SKEW};
use tfinit::locks::state::{self, StateOf};

use super::backend::{probe, unlock, Probe};
use super::exec::{list, read_heartbeat_by_name, Sim, WaitFor};
use super::lease_store;
use super::legacy;
use super::procedure;
use super::recovery_lease;
use super::world::{workdir_path, Dir, Ms, Rules, Tf, World};

/// How long it waits for another recovery's `recover.lock` (recover/mod.rs: LOCK_WAIT).
const LOCK_WAIT: Ms = 250_000;

/// Why a helper force-unlocks, for the report of a violation.
#[derive(Debug, Clone)]
pub struct Judged {
    /// The helper.
    pub helper: usize,
    /// The record it recovers.
    pub rec: Rc<Record>,
    /// The rule's words.
    pub why: String,
    /// Legacy: when the heartbeat the rule read was stamped (simulated time).
    pub hb_stamped: Option<Ms>,
    /// Legacy: the heartbeat file of the name held another incarnation's beat.
    pub hb_other: bool,
    /// When the rule decided (simulated time).
    pub decided_at: Ms,
}

/// Helper `h`, from its start to its exit.
pub async fn run(sim: Rc<Sim>, h: usize) {
    let rules = sim.with(|w| w.cfg.rules);
    match rules {
        Rules::New => procedure::run(&sim, h).await,
        Rules::Legacy => legacy_helper(&sim, h).await,
    }
    // The recovery Lease, if it holds it, is deleted as the recovery ends.
    if sim.with(|w| w.cfg.leases && w.helpers[h].alive) {
        let node = sim.with(|w| w.helpers[h].node);
        recovery_lease::release(&sim, h, node).await;
    }
    sim.with(|w| w.helper_exit(h));
}

/// What a helper knows when it starts.
pub struct Ctx {
    pub h: usize,
    pub node: usize,
    pub me: Owner,
    /// Its own TFINIT_OWNER_TTL.
    pub ttl: Duration,
    /// The directory it recovers (None: every record).
    pub workdir: Option<u8>,
    pub tf: Tf,
}

fn ctx(w: &World, h: usize) -> Ctx {
    let x = &w.helpers[h];
    Ctx {
        h,
        node: x.node,
        me: x.me.clone(),
        ttl: Duration::from_millis(x.ttl),
        workdir: x.workdir,
        tf: x.tf,
    }
}

/// The index of working directory `/tf/w<n>`.
pub fn dir_of(workdir: &str) -> Option<u8> {
    workdir.strip_prefix("/tf/w")?.parse().ok()
}

/// Every heartbeat file of today's format, as `Store::heartbeats` lists them.
pub async fn heartbeats(sim: &Sim, node: usize) -> Result<Vec<Heartbeat>, String> {
    if sim.with(|w| w.cfg.leases) {
        return lease_store::Client::new(node).heartbeats(sim, None).await;
    }
    let beats = sim
        .read(node, |w| {
            w.store
                .beats
                .iter()
                .filter_map(|(k, v)| v.last().filter(|b| b.hb.v == 2 && b.hb.owner.key() == *k))
                .map(|b| (*b.hb).clone())
                .collect::<Vec<_>>()
        })
        .await;
    // The simulated volume answers every read.
    Ok(beats)
}

/// The old helper's check of its init's live runs: the same directory text and workspace.
fn legacy_live_same_who(w: &World, h: usize, rec: &Record, info: &LockInfo) -> Option<String> {
    w.helpers[h]
        .live
        .iter()
        .find(|l| {
            l.workdir == Path::new(&rec.workdir)
                && l.workspace == rec.workspace
                && l.who == info.who
        })
        .map(|_| "a run of this init".to_string())
}

/// What recover/evidence.rs's `record_state`/`live_state` read (`state::read`) of a run in
/// `workdir` and `workspace` among the model's directories `dirs`: the text-named state when
/// the state identity is turned off (`state::by_text`), else the backend settings terraform
/// stored in the directory the path resolves to (`state::of_backend_file` on the JSON of its
/// `.terraform/terraform.tfstate`).
pub fn state_of(dirs: &[Dir], workdir: &str, workspace: &str) -> StateOf {
    if let Some(by_text) = state::by_text(Path::new(workdir), workspace) {
        return by_text;
    }
    let Some(dir) = dir_of(workdir).and_then(|d| dirs.get(d as usize)) else {
        return StateOf::Unsure(format!("{workdir} is not a directory of the model"));
    };
    let key = if dir.key_from_env {
        serde_json::Value::Null
    } else {
        serde_json::Value::String(format!("states/s{}.tfstate", dir.state))
    };
    let stored = serde_json::json!({"version": 3, "backend": {"type": "s3", "config": {
        "bucket": "tfstate", "key": key, "region": "eu-west-1",
        "endpoints": {"s3": "http://moto:5000"}, "dynamodb_table": "locks"
    }}});
    state::of_backend_file(&stored, &workdir_path(dir.real), workspace)
}

impl World {
    /// [`state_of`] among this world's directories.
    pub fn state_of(&self, workdir: &str, workspace: &str) -> StateOf {
        state_of(&self.cfg.dirs, workdir, workspace)
    }
}

async fn legacy_helper(sim: &Sim, h: usize) {
    let c = sim.with(|w| ctx(w, h));
    if !lock_recovery(sim, h).await {
        return;
    }
    let found = list(sim, c.node).await;
    let only = c
        .workdir
        .map(|d| workdir_path(d).to_string_lossy().into_owned());
    for (id, rec) in &found {
        if only.as_ref().is_some_and(|d| *d != rec.workdir) {
            continue;
        }
        legacy_one(sim, &c, *id, rec, &found).await;
    }
}

/// The old helper's decision for one record: the old rules on the heartbeat of the owner's
/// name and this node's wall clock, no watching, no re-check before the unlock.
async fn legacy_one(sim: &Sim, c: &Ctx, id: u64, rec: &Rc<Record>, all: &[(u64, Rc<Record>)]) {
    let facts = Facts::of(rec);
    let read = read_heartbeat_by_name(sim, c.node, &rec.owner.name).await;
    let now_ms = sim.with(|w| w.wall(c.node));
    let hb = read.as_ref().map(|(h, _)| h);
    let Some(why) = legacy::run_dead_at(&c.me, &facts, hb, c.ttl, now_ms) else {
        return;
    };
    let hb_stamped = read.as_ref().map(|(_, s)| *s);
    let hb_other = hb.is_some_and(|h| !h.owner.same_incarnation(&rec.owner));
    let decided_at = sim.now();
    let info = match probe(sim, c, rec).await {
        Probe::Free => return remove(sim, c, id).await,
        Probe::Unknown => return,
        Probe::Held(info) => info,
    };
    let skew = CLOCK_SKEW.as_millis() as u64;
    let hb2 = read_heartbeat_by_name(sim, c.node, &rec.owner.name).await;
    let not_after = legacy::last_alive_ms_at(&c.me, &facts, hb2.as_ref().map(|(h, _)| h), c.ttl);
    let mut twin = None;
    for (p, r) in all {
        if *p != id && r.workdir == rec.workdir && r.workspace == rec.workspace && r.who == info.who
        {
            let hb = read_heartbeat_by_name(sim, c.node, &r.owner.name).await;
            let now_ms = sim.with(|w| w.wall(c.node));
            if legacy::run_dead_at(
                &c.me,
                &Facts::of(r),
                hb.as_ref().map(|(h, _)| h),
                c.ttl,
                now_ms,
            )
            .is_none()
            {
                twin = Some(format!("{} of {}", r.run_id, r.owner.name));
                break;
            }
        }
    }
    let live = sim.with(|w| legacy_live_same_who(w, c.h, rec, &info));
    let window = Window {
        not_before_ms: rec.started_ms.saturating_sub(skew),
        not_after_ms: not_after.saturating_add(skew),
        live_same_who: twin.or(live),
        unread: None,
    };
    match decide(rec, &info, &window) {
        Decision::NotOurs(_) => remove(sim, c, id).await,
        Decision::Ambiguous(_) => {}
        Decision::Unlock => {
            let judged = Judged {
                helper: c.h,
                rec: Rc::clone(rec),
                why,
                hb_stamped,
                hb_other,
                decided_at,
            };
            if unlock(sim, &info.id, judged).await {
                remove(sim, c, id).await;
            }
        }
    }
}

/// Takes `recover.lock`, waiting up to LOCK_WAIT; false when it did not come.
pub async fn lock_recovery(sim: &Sim, h: usize) -> bool {
    if sim.with(|w| w.cfg.leases) {
        let (node, me, ttl) = sim.with(|w| {
            let x = &w.helpers[h];
            (x.node, x.me.key(), Duration::from_millis(x.ttl))
        });
        return recovery_lease::take(sim, h, node, &me, ttl, LOCK_WAIT).await;
    }
    let deadline = sim.with(|w| {
        if w.store.recover_holder.is_none() {
            w.store.recover_holder = Some(h);
        } else {
            w.store.recover_queue.push_back(h);
        }
        w.now + LOCK_WAIT
    });
    WaitFor::new(sim, deadline, move |w: &World| {
        w.store.recover_holder == Some(h)
    })
    .await;
    sim.with(|w| {
        if w.store.recover_holder == Some(h) {
            return true;
        }
        w.store.recover_queue.retain(|x| *x != h);
        false
    })
}

/// Removes record `id` (after Free, NotOurs, Unlocked).
async fn remove(sim: &Sim, c: &Ctx, id: u64) {
    if sim.with(|w| w.cfg.leases) {
        let _ = lease_store::Client::new(c.node).remove(sim, id).await;
        return;
    }
    let _ = sim
        .write(c.node, move |w| {
            w.store.records.remove(&id);
        })
        .await;
}
