//! The recovery helper of today's rules is the real procedure: `Recovery::run_with`
//! (src/locks/recover/mod.rs) as a coroutine of its own (a stack of its own, switched to and from
//! on the simulation's thread: `corosensei`), its store (`Store`) and its other effects
//! (`recover::Effects`: the clock, the watch's sleeps, terraform, what a working directory
//! holds) the simulation's. Each store call, sleep or terraform run of the procedure suspends it
//! with a request to the helper's task, which performs it in simulated time (the timed
//! operations of `exec.rs`, `backend.rs`, `lease_store.rs`, `recovery_lease.rs`) and resumes it
//! with the result and the node's clock. One side runs at a time on one thread, so a seed
//! replays exactly, and the mutation switch (per thread) is the schedule's. A helper killed with
//! its container: its task is dropped, and the coroutine's stack is unwound with it.
//!
//! What the copy of the procedure used to check on the way is checked where the effect lands:
//! a record removed or a lock force-unlocked after a dead verdict of the watched heartbeat
//! (`check_dead_verdict`, with the start of the read that decided), and why a helper unlocked
//! (`Judged`) at the unlock.

use std::cell::Cell;
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult, Yielder};

use tfinit::locks::liveness::{Seen, LONGEST_TTL};
use tfinit::locks::record::{FileId, Found, Heartbeat, Owner, Record};
use tfinit::locks::record_id::RecordId;
use tfinit::locks::recover::{DataDir, Effects, Recovery, RecoveryOutcome};
use tfinit::locks::state::StateOf;
use tfinit::locks::store::{Aside, RecoveryLock, Store};

use super::api::NAMESPACE;
use super::backend::{probe_output, unlock, PROBE_ID};
use super::exec::{read_heartbeat, Sim};
use super::helper::{dir_of, heartbeats, lock_recovery, state_of, Judged};
use super::lease_store::{self, record_name};
use super::world::{record_path, workdir_path, BookSide, Dir, Ms, Tf, World};

/// What the procedure asks of the simulation.
enum Req {
    List,
    ReadHeartbeat(Owner),
    Heartbeats,
    IncarnationGone(Owner, FileId),
    Remove(RecordId),
    SetAside(RecordId),
    LockRecovery,
    Sleep(Duration),
    NowMs,
    Terraform(Box<Record>, Vec<String>),
}

/// The simulation's answer.
enum Ans {
    Found(Vec<Found>),
    Heartbeat(Result<Option<Heartbeat>, String>),
    Heartbeats(Result<Vec<Heartbeat>, String>),
    Gone(Option<bool>),
    Done(Result<(), String>),
    Lock(Result<RecoveryLock, String>),
    Slept,
    Ms(u64),
    Terraform(Result<(bool, String), String>),
}

/// What the procedure returns.
type Out = Result<Vec<(RecordId, Box<Record>, RecoveryOutcome)>, String>;

/// The procedure's side of its coroutine: it suspends with a request, and is resumed with the
/// node's monotonic clock and the answer.
type Side = Yielder<(Instant, Ans), Req>;

thread_local! {
    /// The yielder of the procedure that runs now on this thread (each helper's procedure is a
    /// coroutine of its own; one runs at a time), set whenever one starts or is resumed.
    static CURRENT: Cell<*const Side> = const { Cell::new(std::ptr::null()) };
    /// Its node's monotonic clock as of its last answer (simulated time stands still while it
    /// runs).
    static NOW: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// The procedure that runs now (called from its coroutine, `side` its yielder) starts or is
/// resumed at `now`.
fn running(side: *const Side, now: Instant) {
    CURRENT.set(side);
    NOW.set(Some(now));
}

/// Asks the simulation, from the procedure that runs now, and waits for its answer.
fn ask(req: Req) -> Ans {
    let side = CURRENT.get();
    assert!(!side.is_null(), "asked outside of a recovery procedure");
    // SAFETY: only the store and effects of a procedure ask, and only from its coroutine's body:
    // `side` is that coroutine's yielder (set when it started, and again below each time it is
    // resumed), which lives on its stack as long as the body runs.
    let (now, ans) = unsafe { &*side }.suspend(req);
    running(side, now);
    ans
}

fn io_err(e: String) -> io::Error {
    io::Error::other(e)
}

/// The store of the procedure: each call a request.
struct SimStore;

impl Store for SimStore {
    fn location(&self) -> String {
        "/state (simulated)".into()
    }

    fn open(&self, _: Duration) -> io::Result<()> {
        unreachable!("a recovery does not open the store")
    }

    fn list(&self) -> Vec<Found> {
        match ask(Req::List) {
            Ans::Found(f) => f,
            _ => unreachable!("a list is answered with records"),
        }
    }

    fn read(&self, _: &RecordId) -> io::Result<Record> {
        unreachable!("a recovery reads records by listing them")
    }

    fn write(&self, _: &Record) -> io::Result<RecordId> {
        // Only a lock whose state is missing (needs a person) has its record rewritten, and the
        // model's states all exist.
        Err(io::Error::other(
            "the simulation models no record rewritten by a recovery",
        ))
    }

    fn remove(&self, id: &RecordId) -> io::Result<()> {
        match ask(Req::Remove(id.clone())) {
            Ans::Done(r) => r.map_err(io_err),
            _ => unreachable!("a removal is answered with its result"),
        }
    }

    fn set_aside(&self, id: &RecordId, _: &Aside) -> io::Result<RecordId> {
        match ask(Req::SetAside(id.clone())) {
            Ans::Done(r) => r.map(|()| id.clone()).map_err(io_err),
            _ => unreachable!("a set-aside is answered with its result"),
        }
    }

    fn read_heartbeat(&self, owner: &Owner) -> io::Result<Option<Heartbeat>> {
        match ask(Req::ReadHeartbeat(owner.clone())) {
            Ans::Heartbeat(r) => r.map_err(io_err),
            _ => unreachable!("a heartbeat read is answered with one"),
        }
    }

    fn heartbeats_named(&self, _: &str) -> io::Result<Vec<Heartbeat>> {
        unreachable!("a recovery lists every heartbeat")
    }

    fn heartbeats(&self) -> io::Result<Vec<Heartbeat>> {
        match ask(Req::Heartbeats) {
            Ans::Heartbeats(r) => r.map_err(io_err),
            _ => unreachable!("a heartbeat list is answered with one"),
        }
    }

    fn write_heartbeat(&self, _: &Heartbeat) -> io::Result<()> {
        unreachable!("a recovery writes no heartbeat")
    }

    fn prune_heartbeats(&self, _: &[Record], _: &Owner, _: Duration, _: bool) {
        unreachable!("a recovery prunes no heartbeat")
    }

    fn incarnation_gone(&self, owner: &Owner, file: FileId) -> Option<bool> {
        match ask(Req::IncarnationGone(owner.clone(), file)) {
            Ans::Gone(g) => g,
            _ => unreachable!("a flock test is answered with its result"),
        }
    }

    fn lock_recovery(&self, _: Duration) -> io::Result<RecoveryLock> {
        match ask(Req::LockRecovery) {
            Ans::Lock(r) => r.map_err(io_err),
            _ => unreachable!("the recovery lock is answered with it"),
        }
    }
}

/// The procedure's other effects: the clock and the sleeps of the helper's node, terraform as
/// `backend.rs` models it, and the model's working directories (each an s3 backend's, its
/// path resolving as `Dir::real` says, its state as [`state_of`] reads it).
struct SimEffects {
    /// The node's CLOCK_MONOTONIC zero.
    base: Instant,
    dirs: Vec<Dir>,
}

impl Effects for SimEffects {
    fn now(&self) -> Instant {
        NOW.get().expect("the procedure runs")
    }

    fn sleep(&self, d: Duration) {
        ask(Req::Sleep(d));
    }

    fn instant_of(&self, ns: u64) -> Option<Instant> {
        Some(self.base + Duration::from_nanos(ns))
    }

    fn now_ms(&self) -> u64 {
        match ask(Req::NowMs) {
            Ans::Ms(ms) => ms,
            _ => unreachable!("the wall clock is answered with it"),
        }
    }

    fn canonical(&self, path: &Path) -> Option<PathBuf> {
        let d = dir_of(path.to_str()?)?;
        Some(workdir_path(self.dirs.get(d as usize)?.real))
    }

    fn data_dir(&self, _: &Path) -> DataDir {
        DataDir {
            exists: true,
            backend: Some("s3".into()),
            config: None,
        }
    }

    fn state(&self, workdir: &Path, _: Option<&Path>, workspace: &str) -> StateOf {
        state_of(&self.dirs, &workdir.to_string_lossy(), workspace)
    }

    fn terraform(&self, rec: &Record, _: &Path, args: &[&str]) -> Result<(bool, String), String> {
        let args = args.iter().map(|a| a.to_string()).collect();
        match ask(Req::Terraform(Box::new(rec.clone()), args)) {
            Ans::Terraform(r) => r,
            _ => unreachable!("a terraform run is answered with its result"),
        }
    }
}

/// What the helper's side remembers of the procedure's calls, to judge its force-unlocks and
/// removals (in order).
#[derive(Debug, Clone)]
enum Call {
    /// A read of this incarnation's heartbeat (key) started then.
    Beat(String, Ms),
    /// The kernel's answer for this incarnation.
    Kernel(String, Option<bool>),
    /// A listing of the records.
    Listed,
    /// A probe.
    Probed,
}

/// Helper `h` of today's rules, from its start to the end of its procedure.
pub async fn run(sim: &Sim, h: usize) {
    let (node, tf, me, ttl, only) = sim.with(|w| {
        let x = &w.helpers[h];
        (
            x.node,
            x.tf,
            x.me.clone(),
            x.ttl,
            x.workdir.map(workdir_path),
        )
    });
    let start = sim.with(|w| w.mono(node));
    let recovery = sim.with(|w| recovery(w, h));
    let fx = sim.with(|w| SimEffects {
        base: w.nodes[node].base,
        dirs: w.cfg.dirs.clone(),
    });
    // Debug builds' frames are large: room to spare.
    let stack = DefaultStack::new(4 << 20).expect("a stack for a recovery procedure");
    let mut procedure: Coroutine<(Instant, Ans), Req, Out, DefaultStack> =
        Coroutine::with_stack(stack, move |side: &Side, (now, _): (Instant, Ans)| {
            running(side, now);
            recovery.run_with(&fx, only.as_deref())
        });
    let mut answer = (start, Ans::Slept);
    let mut calls: Vec<Call> = Vec::new();
    loop {
        let req = match procedure.resume(answer) {
            CoroutineResult::Yield(req) => req,
            CoroutineResult::Return(out) => return done(sim, h, out),
        };
        let ans = match req {
            Req::List => {
                calls.push(Call::Listed);
                Ans::Found(list(sim, node).await)
            }
            Req::ReadHeartbeat(owner) => {
                calls.push(Call::Beat(owner.key(), sim.now()));
                Ans::Heartbeat(read_heartbeat(sim, node, &owner).await)
            }
            Req::Heartbeats => Ans::Heartbeats(heartbeats(sim, node).await),
            Req::IncarnationGone(owner, file) => {
                let gone = sim.with(|w| w.incarnation_gone_at(node, &owner, file, w.now));
                calls.push(Call::Kernel(owner.key(), gone));
                Ans::Gone(gone)
            }
            Req::Remove(id) => {
                let id = model_id(&id);
                if let Some(rec) = sim.with(|w| w.store.records.get(&id).map(|s| s.rec.clone())) {
                    judge(sim, h, &me, ttl, &rec, &calls, Call::Probed);
                }
                Ans::Done(remove(sim, node, id).await)
            }
            Req::SetAside(id) => Ans::Done(set_aside(sim, node, &id).await),
            Req::LockRecovery => Ans::Lock(take(sim, h).await),
            Req::Sleep(d) => {
                let t = sim.with(|w| {
                    let n = &w.nodes[node];
                    n.real_at(n.mono(w.now) + d)
                });
                sim.sleep_until(t.max(sim.now() + 1)).await;
                Ans::Slept
            }
            Req::NowMs => Ans::Ms(sim.with(|w| w.wall(node))),
            Req::Terraform(rec, args) => {
                Ans::Terraform(terraform(sim, h, tf, &me, ttl, rec, &args, &mut calls).await)
            }
        };
        answer = (sim.with(|w| w.mono(node)), ans);
    }
}

/// The procedure of helper `h` (its init's, or `tfinit recover` run by hand) on `store`.
fn recovery(w: &World, h: usize) -> Recovery {
    let x = &w.helpers[h];
    let seen: Vec<Seen> = match x.init.map(|i| &w.incs[i].book) {
        Some(BookSide::New(b)) => {
            let node = &w.nodes[x.node];
            b.observations(|i| node.ns(i))
        }
        _ => Vec::new(),
    };
    Recovery {
        store: Box::new(SimStore),
        me: x.me.clone(),
        ttl: Duration::from_millis(x.ttl) * w.cfg.helper_ttl_factor,
        older_ttl: LONGEST_TTL,
        terraform: PathBuf::from("terraform"),
        dry_run: false,
        live: x.live.clone(),
        automatic: x.init.is_some(),
        seen,
    }
}

/// What the procedure decided for each record, for the trace and the progress report.
fn done(sim: &Sim, h: usize, out: Out) {
    let out = match out {
        Ok(out) => out,
        Err(e) => return sim.with(|w| w.log(|| format!("helper {h}: {e}"))),
    };
    sim.with(|w| {
        for (id, _, outcome) in out {
            let id = model_id(&id);
            let label = label(&outcome);
            w.outcomes.insert(id, label);
            w.log(|| format!("helper {h}, record {id}: {label} ({outcome:?})"));
        }
    });
}

/// A short name of `outcome` (the progress report's).
fn label(outcome: &RecoveryOutcome) -> &'static str {
    match outcome {
        RecoveryOutcome::OwnerAlive => "owner alive or still watched",
        RecoveryOutcome::Free => "lock free",
        RecoveryOutcome::HeldByOther(..) => "held by another (NotOurs)",
        RecoveryOutcome::Ambiguous(_, why) if why.contains("same Who") => {
            "ambiguous: a live run or record here has the same Who"
        }
        RecoveryOutcome::Ambiguous(..) => "ambiguous",
        RecoveryOutcome::Unlocked(_) => "unlock",
        RecoveryOutcome::UnlockFailed(_) => "unlock failed",
        RecoveryOutcome::UnknownWording(_) => "probe could not tell",
        RecoveryOutcome::Unknown(_) => "could not tell",
        _ => "other",
    }
}

/// The model's id of record `id` (its file, or its Lease).
fn model_id(id: &RecordId) -> u64 {
    let name = match id.as_file() {
        Some(path) => path.file_stem().and_then(|s| s.to_str()),
        None => id
            .as_lease_in(NAMESPACE)
            .and_then(|n| n.strip_prefix("rec-")),
    };
    name.and_then(|n| n.parse().ok()).unwrap_or(u64::MAX)
}

/// `Store::list`: every record at one moment (the file store), or the record Leases with the
/// unreadable ones as corrupt (the Lease store; no answer: unlisted).
async fn list(sim: &Sim, node: usize) -> Vec<Found> {
    let found = |id: u64, rec: &Rc<Record>, lease: bool| {
        let at = if lease {
            RecordId::lease(NAMESPACE, &record_name(id))
        } else {
            record_path(id)
        };
        Found::Record(at, Box::new((**rec).clone()))
    };
    if !sim.with(|w| w.cfg.leases) {
        let recs = super::exec::list(sim, node).await;
        return recs.iter().map(|(id, r)| found(*id, r, false)).collect();
    }
    match lease_store::Client::new(node).records(sim).await {
        Ok((recs, bad)) => {
            let mut out: Vec<Found> = recs.iter().map(|(id, r)| found(*id, r, true)).collect();
            out.extend(bad.into_iter().map(|(name, _)| {
                Found::Corrupt(RecordId::lease(NAMESPACE, &name), "edited by hand".into())
            }));
            out
        }
        Err(e) => vec![Found::Unlisted(e.to_string())],
    }
}

/// `Store::remove` of record `id`.
async fn remove(sim: &Sim, node: usize, id: u64) -> Result<(), String> {
    if sim.with(|w| w.cfg.leases) {
        return lease_store::Client::new(node)
            .remove(sim, id)
            .await
            .map_err(|e| e.to_string());
    }
    sim.write(node, move |w| {
        w.store.records.remove(&id);
    })
    .await
}

/// `Store::set_aside` of record Lease `id` (only the Lease store has records that cannot be
/// read).
async fn set_aside(sim: &Sim, node: usize, id: &RecordId) -> Result<(), String> {
    let Some(name) = id.as_lease_in(NAMESPACE) else {
        return Err(format!("{id}: the model's files are all records"));
    };
    lease_store::Client::new(node)
        .set_aside(sim, &[(name.to_string(), 0)])
        .await;
    Ok(())
}

/// `Store::lock_recovery`: `recover.lock`, or the recovery Lease with its fence (the cell its
/// renewer moves on).
async fn take(sim: &Sim, h: usize) -> Result<RecoveryLock, String> {
    if !lock_recovery(sim, h).await {
        return Err("another recovery holds the right to recover".into());
    }
    let fence = sim.with(|w| w.rights.get(&h).map(|r| Arc::clone(&r.fence)));
    Ok(RecoveryLock::new(Box::new(()), fence))
}

/// A terraform run of the procedure: the probe (what helper's terraform `tf` prints), or the
/// force-unlock of lock `args[2]`, judged first.
#[allow(clippy::too_many_arguments)]
async fn terraform(
    sim: &Sim,
    h: usize,
    tf: Tf,
    me: &Owner,
    ttl: Ms,
    rec: Box<Record>,
    args: &[String],
    calls: &mut Vec<Call>,
) -> Result<(bool, String), String> {
    let id = args.get(2).map(String::as_str).unwrap_or_default();
    if id == PROBE_ID {
        calls.push(Call::Probed);
        return Ok((false, probe_output(sim, tf, &rec).await));
    }
    let rec = Rc::new(*rec);
    // The verdict of the first look (before the probe) and of the re-check (before the last
    // listing).
    judge(sim, h, me, ttl, &rec, calls, Call::Probed);
    let why = judge(sim, h, me, ttl, &rec, calls, Call::Listed);
    let judged = Judged {
        helper: h,
        rec,
        why,
        hb_stamped: None,
        hb_other: false,
        decided_at: sim.now(),
    };
    if unlock(sim, id, judged).await {
        return Ok((true, String::new()));
    }
    Ok((
        false,
        format!("Failed to unlock state: lock id \"{id}\" does not match existing lock\n"),
    ))
}

/// Why helper `h` (incarnation `me`, its TTL `ttl`) calls `rec`'s run over, as its calls up to
/// the last `mark` show: its record says it ended, the kernel freed its incarnation's lock file,
/// or (checked here: `check_dead_verdict`) the read of its owner's heartbeat that preceded the
/// mark, after which it watched it unchanged.
fn judge(
    sim: &Sim,
    h: usize,
    me: &Owner,
    ttl: Ms,
    rec: &Record,
    calls: &[Call],
    mark: Call,
) -> String {
    if rec.ended.is_some() {
        return "its terraform ended".into();
    }
    if rec.owner.same_incarnation(me) {
        return "its own incarnation's run".into();
    }
    let key = rec.owner.key();
    let is_mark = |c: &Call| std::mem::discriminant(c) == std::mem::discriminant(&mark);
    let before = calls.iter().rposition(is_mark).unwrap_or(calls.len());
    let decided = calls[..before].iter().rev().find(|c| match c {
        Call::Beat(k, _) | Call::Kernel(k, _) => *k == key,
        _ => false,
    });
    match decided {
        Some(Call::Kernel(_, Some(true))) => "the kernel freed its lock file".into(),
        Some(Call::Beat(_, start)) => {
            let start = *start;
            sim.with(|w| w.check_dead_verdict(&format!("helper {h}"), ttl, &rec.owner, start));
            "its owner's heartbeat did not change for a TTL of watching".into()
        }
        _ => "no verdict seen".into(),
    }
}
