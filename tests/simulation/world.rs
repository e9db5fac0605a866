//! The simulated world: nodes with their own clocks, the shared state volume and its faults,
//! terraform's backend lock table, pods, their incarnations and processes, and the queue of events
//! in simulated time (the executor that polls the recorders and recovery helpers is `exec.rs`; the
//! invariants `check.rs`).
//!
//! Time is simulated real time in milliseconds (`Ms`). A node's monotonic clock is
//! `base + t·(1 + ppm/10⁶)` (an `Instant` of its own: two nodes' instants are never compared
//! here, only turned back into simulated time with the node that made them); its wall clock is
//! `EPOCH_MS + t + skew(t)`, the skew stepping forward and back as the schedule says.

use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use tfinit::locks::book::LiveRun;
use tfinit::locks::names::RunId;
use tfinit::locks::record::{Heartbeat, Owner, Record};
use tfinit::locks::record_id::RecordId;
use tfinit::locks::recorder::Work;

use super::check::{Obligation, Stats, Violation, CALM_OP_MAX};
use super::legacy;
use super::pods::EnvEv;
use super::rng::Rng;
use super::terraform::{Lock, LockKey, Proc};

/// Simulated real time, milliseconds since the schedule began.
pub type Ms = u64;
/// Wall-clock ms of simulated time 0 (late 2026).
pub const EPOCH_MS: u64 = 1_800_000_000_000;
/// A task of the executor (a recorder thread or a recovery helper process).
pub type TaskId = usize;

/// Which decision rules the pods run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rules {
    /// Today's code: the real `Book`, `Observer`, `run_state`, `fresh_enough`, `Fence`, `decide`.
    New,
    /// The model of the code before issue 18 (`legacy.rs`).
    Legacy,
}

/// One schedule's settings (its "swarm" knobs are in `schedule.rs`).
#[derive(Debug, Clone)]
pub struct Cfg {
    /// Decision rules.
    pub rules: Rules,
    /// The schedule's TTL: the shortest TFINIT_OWNER_TTL of its pods (each pod has its own,
    /// `Pod::ttl`), the unit of its trouble's lengths.
    pub ttl: Ms,
    /// TFINIT_RECORD_TIMEOUT.
    pub record_timeout: Ms,
    /// How many working directories (`/tf/w0`..).
    pub workdirs: u8,
    /// Each working directory: where its path leads, which state its backend names.
    pub dirs: Vec<Dir>,
    /// How many workspaces per directory.
    pub workspaces: u8,
    /// Probes that cannot tell (network error), per mille, before the calm phase.
    pub probe_unknown: u64,
    /// No fault, kill or clock step from here on.
    pub calm_at: Ms,
    /// The schedule ends here.
    pub end_at: Ms,
    /// Whether progress is checked (calm-phase requests create obligations).
    pub progress: bool,
    /// Whether a helper's dead verdict is checked against the owner's recorded runs (off in the
    /// searches for a finding, which go on to the force-unlock the wrong verdict leads to).
    pub dead_verdicts: bool,
    /// The helper watches for this many TTLs (1; 2 only in the test that shows progress can fail).
    pub helper_ttl_factor: u32,
    /// Largest rate difference of a node's monotonic clock, ppm.
    pub max_ppm: i64,
    /// The records and heartbeats are Leases of the API server (`api.rs`, `lease_store.rs`), not
    /// files of a state volume: no kernel proof, no `recover.lock` (the recovery Lease instead).
    pub leases: bool,
    /// The most a slow volume or API adds to an operation (the TTL; more where requests must
    /// time out).
    pub slow_max: Ms,
}

/// A working directory `/tf/w<n>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dir {
    /// The directory its path resolves to: itself, or the target of the symbolic link it is.
    pub real: u8,
    /// The state its backend names (with a workspace, the key of terraform's lock table): two
    /// directories whose backends name one key lock one state.
    pub state: u8,
    /// Its backend's `key` comes from the environment (terraform stored none in
    /// `.terraform/terraform.tfstate`): tfinit cannot tell its state from another of the bucket.
    pub key_from_env: bool,
}

/// The terraform a pod runs, by the wording of its messages (lockinfo reads them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tf {
    /// terraform 1.0.3 (the panicwrap shape; its free s3 lock: `failed to retrieve lock info:
    /// unexpected end of JSON input`).
    V1_0_3,
    /// terraform 1.11 (its free s3 lock names the id it was given: `failed to retrieve lock
    /// info for lock ID "<id>": unexpected end of JSON input`).
    V1_11,
}

/// A node: a kernel with its boot id and clocks, and its mount of the state volume.
#[derive(Debug, Clone)]
pub struct Node {
    /// Its name (the hostname of its hostNetwork pods).
    pub name: String,
    /// /proc/sys/kernel/random/boot_id.
    pub boot: String,
    /// Its CLOCK_MONOTONIC at simulated time 0.
    pub base: Instant,
    /// Rate difference of its monotonic clock, parts per million.
    pub ppm: i64,
    /// Wall-clock skew steps: from this time on, the skew is this (ms).
    pub steps: Vec<(Ms, i64)>,
}

impl Node {
    /// Its monotonic clock at simulated time `t`.
    pub fn mono(&self, t: Ms) -> Instant {
        self.base + Duration::from_micros(Self::us(t, self.ppm))
    }

    fn us(t: Ms, ppm: i64) -> u64 {
        (t as i64 * 1000 + t as i64 * ppm / 1000) as u64
    }

    /// The first simulated time at which its monotonic clock reads at least `i`.
    pub fn real_at(&self, i: Instant) -> Ms {
        let us = i.saturating_duration_since(self.base).as_micros() as i64;
        let mut t = (us * 1000 / (1_000_000 + self.ppm)).max(0) as u64;
        while Self::us(t, self.ppm) < us as u64 {
            t += 1;
        }
        t
    }

    /// An instant of this node as CLOCK_MONOTONIC nanoseconds (to hand watches to a helper).
    pub fn ns(&self, i: Instant) -> u64 {
        i.saturating_duration_since(self.base).as_nanos() as u64
    }

    /// Its wall clock at simulated time `t`, ms since the epoch.
    pub fn wall(&self, t: Ms) -> u64 {
        let skew = self
            .steps
            .iter()
            .rev()
            .find(|(at, _)| *at <= t)
            .map_or(0, |s| s.1);
        (EPOCH_MS as i64 + t as i64 + skew) as u64
    }
}

/// What goes wrong with the state volume for a while.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// Operations started now complete only after the window (and may apply at any moment).
    Hang,
    /// Writes fail (ENOSPC, read-only); reads work.
    FailWrites,
    /// Writes land but report an error (the rename happened, the directory fsync failed).
    LostReply,
    /// Every operation takes long.
    Slow,
}

/// A fault window, on the whole volume or on one node's mount.
#[derive(Debug, Clone)]
pub struct Fault {
    /// From.
    pub from: Ms,
    /// To.
    pub to: Ms,
    /// What.
    pub kind: FaultKind,
    /// One node's mount, or the volume (None).
    pub node: Option<usize>,
}

/// A pod's processes frozen (CPU throttling, a stop signal): its init's loop and recorder.
#[derive(Debug, Clone)]
pub struct Freeze {
    /// The pod.
    pub pod: usize,
    /// From.
    pub from: Ms,
    /// To.
    pub to: Ms,
}

/// How a pod is named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodKind {
    /// A Deployment's pod: unique name, hostname = name = owner.
    Deployment,
    /// A StatefulSet's pod: its replacement keeps the name (and hostname, so the Who).
    StatefulSet,
    /// hostNetwork: hostname = node name = owner name; two on one node share both.
    HostNetwork,
    /// A fixed TFINIT_OWNER for every pod of this kind; hostname = pod name.
    FixedOwner,
}

/// A pod.
#[derive(Debug, Clone)]
pub struct Pod {
    /// metadata.name.
    pub name: String,
    /// Its hostname (terraform's Who is `@host`).
    pub host: String,
    /// TFINIT_OWNER.
    pub owner_name: String,
    /// Where it runs.
    pub node: usize,
    /// metadata.uid.
    pub uid: String,
    /// How it was named.
    pub kind: PodKind,
    /// Its container's current incarnation.
    pub inc: Option<usize>,
    /// Deleted or killed for good.
    pub gone: bool,
    /// Its TFINIT_OWNER_TTL (a rolling update may give its replacement another).
    pub ttl: Ms,
    /// Its terraform.
    pub tf: Tf,
}

/// A record on the volume, with what the simulation knows of it.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The incarnation that wrote it.
    pub inc: usize,
    /// Its content.
    pub rec: Rc<Record>,
    /// When its create landed, its owner's last landed heartbeat had been stamped more than a
    /// TTL before (simulated time).
    pub landed_stale: bool,
    /// When this version landed.
    pub landed: Ms,
}

/// A heartbeat on the volume.
#[derive(Debug, Clone)]
pub struct StoredBeat {
    /// Its content.
    pub hb: Rc<Heartbeat>,
    /// When its stamp was taken (simulated time).
    pub stamped: Ms,
    /// When it landed.
    pub landed: Ms,
}

impl Store {
    /// Heartbeat file `key` as it is.
    pub fn beat(&self, key: &str) -> Option<&StoredBeat> {
        self.beats.get(key)?.last()
    }

    /// Heartbeat file `key` as it was at time `t` (after the writes that landed until then).
    pub fn beat_at(&self, key: &str, t: Ms) -> Option<&StoredBeat> {
        self.beats.get(key)?.iter().rev().find(|b| b.landed <= t)
    }
}

/// The state volume (TFINIT_STATE_DIR), shared by every pod.
#[derive(Debug, Default)]
pub struct Store {
    /// Records by id (`/state/records/<id>.json`).
    pub records: BTreeMap<u64, Stored>,
    /// Heartbeats by file, `name/incarnation` (new) or `name` (legacy): every version, in the
    /// order they landed (a read may look up the file as it was at its moment).
    pub beats: BTreeMap<String, Vec<StoredBeat>>,
    /// The helper holding `recover.lock`.
    pub recover_holder: Option<usize>,
    /// Helpers waiting for it, in order.
    pub recover_queue: VecDeque<usize>,
    /// Incarnation lock files (`<name>.<incarnation>.lock`, by key), as they are at that path.
    pub lock_files: BTreeMap<String, LockFile>,
    /// The next inode a new file gets.
    pub next_ino: u64,
}

/// A lock file at an incarnation's path.
#[derive(Debug, Clone, Copy)]
pub struct LockFile {
    /// Its inode (the device is the volume's, 1).
    pub ino: u64,
    /// The incarnation whose flock is on it (inherited by its terraform runs); None for a file
    /// that replaced it at the path (a restore of `owners/` from a backup), which nobody locked.
    pub holder: Option<usize>,
}

/// The volume's device number, in every FileId of the model.
pub const VOLUME_DEV: u64 = 1;

/// The path of record `id`.
pub fn record_path(id: u64) -> RecordId {
    RecordId::file(format!("/state/records/{id}.json"))
}

/// The path of working directory `w`.
pub fn workdir_path(w: u8) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/tf/w{w}"))
}

/// The workspace name `ws`.
pub fn workspace_name(ws: u8) -> String {
    if ws == 0 {
        "default".into()
    } else {
        format!("ws{ws}")
    }
}

/// Where a state-locking run is, in its init (the old rules' model: today's runs are the real
/// code's, `init.rs`).
#[derive(Debug, Clone)]
pub enum Life {
    /// Waits for the store (opening, a recovery here, our end-markings here) until `deadline`.
    Awaiting {
        /// Its whole wait's deadline (the owner's monotonic clock).
        deadline: Instant,
    },
    /// A recovery helper runs for it.
    Recovering {
        /// The helper.
        helper: usize,
    },
    /// Its record is being written.
    Recording,
    /// terraform runs.
    Running {
        /// The process.
        proc: usize,
    },
}

/// A run in an init.
#[derive(Debug, Clone)]
pub struct Run {
    /// Its id (`r<n>`).
    pub id: RunId,
    /// Where.
    pub workdir: u8,
    /// Which workspace.
    pub ws: u8,
    /// Where it is.
    pub life: Life,
    /// A calm-phase request of the observer (it creates progress obligations).
    pub observed: bool,
}

/// The book of an init: the real one, or the old one.
#[derive(Debug)]
pub enum BookSide {
    /// Today's init: the real runs and records around today's `Book` (`init.rs`).
    New(Box<super::init::Today>),
    /// The old book (`legacy.rs`).
    Old(Box<legacy::Book>),
}

/// A completion waiting for the loop.
#[derive(Debug)]
pub enum Comp {
    /// For today's book.
    New(tfinit::locks::recorder::Completion),
    /// For the old one.
    Old(legacy::Completion),
}

/// One tfinit incarnation: a container's PID 1, its loop, book and recorder.
#[derive(Debug)]
pub struct Inc {
    /// Its pod.
    pub pod: usize,
    /// Its node.
    pub node: usize,
    /// Who it is.
    pub owner: Owner,
    /// `owner.key()`, computed once.
    pub key: String,
    /// Its hostname.
    pub host: String,
    /// Its TFINIT_OWNER_TTL (its pod's).
    pub ttl: Ms,
    /// The inode of the lock file it took (None: not taken).
    pub lock_ino: Option<u64>,
    /// PID 1 alive.
    pub alive: bool,
    /// SIGTERMed: refuses runs, stops them, exits when they are gone.
    pub stopping: bool,
    /// The loop's book.
    pub book: BookSide,
    /// Completions not yet taken by the loop.
    pub inbox: Vec<Comp>,
    /// Requests sent to the recorder and not taken yet (the channel).
    pub requests: Vec<Work>,
    /// Record write requests sent and not done (the handle's count, for the exit's wait).
    pub writes: usize,
    /// The recorder task.
    pub rec_task: TaskId,
    /// Runs by key (the old rules' model).
    pub runs: BTreeMap<u64, Run>,
    /// Next run key (the old rules' model).
    pub next_run: u64,
    /// When the loop's next timer wake-up is scheduled.
    pub wake_at: Option<Ms>,
    /// Its helpers.
    pub helpers: Vec<usize>,
    /// The incarnation lock file is held (said in its heartbeats).
    pub holds_lock: bool,
    /// When its last heartbeat that landed was stamped (simulated time).
    pub beat_landed: Option<Ms>,
    /// When PID 1 died.
    pub died_at: Option<Ms>,
    /// A loop wake-up scheduled at this time.
    pub wake_pending: Option<Ms>,
    /// The recorder waits for work (a request must wake it).
    pub rec_idle: bool,
}

/// A recovery helper process: an init's `__recover`, or `tfinit recover` run by hand.
#[derive(Debug, Clone)]
pub struct Helper {
    /// Its init; None for `tfinit recover` run by hand (from a shell in a pod's container).
    pub init: Option<usize>,
    /// Its node.
    pub node: usize,
    /// Who it is (its init; by hand, a new incarnation of the pod's owner name).
    pub me: Owner,
    /// Its TFINIT_OWNER_TTL (its own, whatever the owners it judges have).
    pub ttl: Ms,
    /// The terraform it probes and unlocks with.
    pub tf: Tf,
    /// The directory it recovers; None: every record (`tfinit recover`).
    pub workdir: Option<u8>,
    /// Its task.
    pub task: TaskId,
    /// Alive.
    pub alive: bool,
    /// The init's live runs when it started.
    pub live: Vec<LiveRun>,
    /// When it started.
    pub started: Ms,
}

/// A scheduled event.
pub enum Ev {
    /// Poll a task.
    Wake(TaskId),
    /// Run this.
    Call(Box<dyn FnOnce(&mut World)>),
    /// Something for an init's loop.
    Loop(usize, LoopEv),
    /// A terraform process's timer (process, generation).
    Proc(usize, u32),
    /// The schedule's environment event number n.
    Env(usize),
    /// The kubelet SIGKILLs pod n's container at the end of its grace period.
    Hard(usize),
}

/// Work for an init's loop.
#[derive(Debug, Clone)]
pub enum LoopEv {
    /// Timers, or completions that wake it.
    Wake,
    /// A shim asks for a state-locking run.
    Request {
        /// Where.
        workdir: u8,
        /// Which workspace.
        ws: u8,
        /// A calm-phase request of the observer.
        observed: bool,
    },
    /// SIGCHLD: this terraform process ended.
    Reaped {
        /// The process.
        proc: usize,
    },
    /// A recovery helper ended.
    HelperExit {
        /// The helper.
        helper: usize,
    },
}

/// A task to create.
#[derive(Debug, Clone, Copy)]
pub enum Spawn {
    /// An incarnation's recorder.
    Recorder(usize),
    /// A recovery helper.
    Helper(usize),
    /// The thread of helper n that renews its recovery Lease.
    Renewer(usize),
}

/// Everything simulated.
pub struct World {
    /// Now.
    pub now: Ms,
    /// Due events as `time << 64 | sequence` (a min-heap through Reverse), their payloads in
    /// `events` by sequence number.
    queue: BinaryHeap<std::cmp::Reverse<u128>>,
    events: Vec<Option<Ev>>,
    /// The schedule's randomness (op latencies, process timings).
    pub rng: Rng,
    /// Settings.
    pub cfg: Cfg,
    /// Nodes.
    pub nodes: Vec<Node>,
    /// Pods.
    pub pods: Vec<Pod>,
    /// Incarnations.
    pub incs: Vec<Inc>,
    /// terraform processes.
    pub procs: Vec<Proc>,
    /// The live ones that hold a lock.
    pub holders: Vec<usize>,
    /// Recovery helpers.
    pub helpers: Vec<Helper>,
    /// The state volume (or what the Leases hold: `api.rs`).
    pub store: Store,
    /// The API server's Leases (a schedule on the Lease store).
    pub api: super::api::Api,
    /// Each helper's recovery Lease, while it holds it (`recovery_lease.rs`).
    pub rights: BTreeMap<usize, super::recovery_lease::Right>,
    /// terraform's backend locks, by (state, workspace).
    pub locks: BTreeMap<LockKey, Lock>,
    /// Next lock id.
    pub next_lock: u64,
    /// Next record id.
    pub next_record: u64,
    /// Fault windows.
    pub faults: Vec<Fault>,
    /// Freezes.
    pub freezes: Vec<Freeze>,
    /// The environment's events (what the seed chose), for the replay print.
    pub env: Vec<(Ms, EnvEv)>,
    /// Tasks to create.
    pub spawns: Vec<(TaskId, Spawn)>,
    /// Which tasks are alive.
    pub task_alive: Vec<bool>,
    /// The incarnation a task belongs to (frozen with it), if any.
    pub task_inc: Vec<Option<usize>>,
    /// The task being polled.
    pub current: TaskId,
    /// The first invariant that failed.
    pub violation: Option<Violation>,
    /// Figures.
    pub stats: Stats,
    /// What happened, line by line (only when replaying a seed).
    pub trace: Option<Vec<String>>,
    /// Progress obligations not met yet.
    pub obligations: Vec<Obligation>,
    /// The last thing a helper decided about each record (to explain a progress failure).
    pub outcomes: HashMap<u64, &'static str>,
    /// Why the first progress failure happened (its record's last outcome).
    pub progress_why: &'static str,
    /// What explains the first dead verdict that failed.
    pub dead_why: &'static str,
}

impl World {
    /// A world of `cfg` with nothing scheduled.
    pub fn new(cfg: Cfg, rng: Rng) -> World {
        World {
            now: 0,
            queue: BinaryHeap::new(),
            events: Vec::new(),
            rng,
            cfg,
            nodes: Vec::new(),
            pods: Vec::new(),
            incs: Vec::new(),
            procs: Vec::new(),
            holders: Vec::new(),
            helpers: Vec::new(),
            store: Store::default(),
            api: Default::default(),
            rights: BTreeMap::new(),
            locks: BTreeMap::new(),
            next_lock: 1,
            next_record: 1,
            faults: Vec::new(),
            freezes: Vec::new(),
            env: Vec::new(),
            spawns: Vec::new(),
            task_alive: Vec::new(),
            task_inc: Vec::new(),
            current: 0,
            violation: None,
            stats: Stats::default(),
            trace: None,
            obligations: Vec::new(),
            outcomes: HashMap::new(),
            progress_why: "",
            dead_why: "",
        }
    }

    /// Schedules `ev` at `t` (not before now).
    pub fn at(&mut self, t: Ms, ev: Ev) {
        if let Ev::Loop(inc, LoopEv::Wake) = ev {
            // One wake-up of a loop at a time is enough: it looks at everything.
            if self.incs[inc].wake_pending == Some(t.max(self.now)) {
                return;
            }
            self.incs[inc].wake_pending = Some(t.max(self.now));
        }
        let seq = self.events.len() as u64;
        self.events.push(Some(ev));
        let t = t.max(self.now) as u128;
        self.queue.push(std::cmp::Reverse(t << 64 | seq as u128));
    }

    /// The next event due by the schedule's end, with the clock set to its time.
    pub fn next_event(&mut self) -> Option<Ev> {
        let std::cmp::Reverse(key) = *self.queue.peek()?;
        let t = (key >> 64) as Ms;
        if t > self.cfg.end_at {
            return None;
        }
        self.queue.pop();
        self.now = t;
        self.events[key as u64 as usize].take()
    }

    /// Writes a trace line (replay only).
    pub fn log(&mut self, f: impl FnOnce() -> String) {
        if self.trace.is_some() {
            let line = format!("{:>8} ms  {}", self.now, f());
            if let Some(t) = self.trace.as_mut() {
                t.push(line);
            }
        }
    }

    /// A new task, created after the current event.
    pub fn spawn(&mut self, what: Spawn, inc: Option<usize>) -> TaskId {
        let id = self.task_alive.len();
        self.task_alive.push(true);
        self.task_inc.push(inc);
        self.spawns.push((id, what));
        id
    }

    /// Wakes the task being polled at `t`.
    pub fn wake_current_at(&mut self, t: Ms) {
        let task = self.current;
        self.at(t, Ev::Wake(task));
    }

    /// When pod `pod`'s freeze ends, if it is frozen now.
    pub fn frozen_until(&self, pod: usize) -> Option<Ms> {
        self.freezes
            .iter()
            .filter(|f| f.pod == pod && f.from <= self.now && self.now < f.to)
            .map(|f| f.to)
            .max()
    }

    /// Node `n`'s monotonic clock now.
    pub fn mono(&self, n: usize) -> Instant {
        self.nodes[n].mono(self.now)
    }

    /// Node `n`'s wall clock now.
    pub fn wall(&self, n: usize) -> u64 {
        self.nodes[n].wall(self.now)
    }

    pub fn faulty(&self, node: usize, t: Ms, kind: FaultKind) -> Option<&Fault> {
        self.faults
            .iter()
            .find(|f| f.kind == kind && f.from <= t && t < f.to && f.node.is_none_or(|n| n == node))
    }

    /// When an operation on the volume started now from `node` completes, and when it takes
    /// effect (a read's snapshot, a write's landing), somewhere in between.
    pub fn op_timing(&mut self, node: usize) -> (Ms, Ms) {
        self.op_timing_from(node, self.now)
    }

    /// [`World::op_timing`] for an operation that will start at `now` (the next of a sequence).
    pub fn op_timing_from(&mut self, node: usize, now: Ms) -> (Ms, Ms) {
        let mut done = now + self.latency(node, now);
        let hang_end = self
            .faults
            .iter()
            .filter(|f| {
                f.kind == FaultKind::Hang
                    && f.from <= now
                    && now < f.to
                    && f.node.is_none_or(|n| n == node)
            })
            .map(|f| f.to)
            .max();
        if let Some(end) = hang_end {
            done = done.max(end + self.rng.range(1, 50));
        }
        (self.moment(now, done), done)
    }

    /// An operation's timing from `node` starting at `now`, slowness counted, hangs not (the
    /// API's model decides what a hang does: `api.rs`).
    pub fn op_timing_plain(&mut self, node: usize, now: Ms) -> (Ms, Ms) {
        let done = now + self.latency(node, now);
        (self.moment(now, done), done)
    }

    /// How long an operation from `node` starting at `now` takes (a slow volume or API counted).
    fn latency(&mut self, node: usize, now: Ms) -> Ms {
        let calm = now >= self.cfg.calm_at;
        let mut lat = match self.rng.below(100) {
            0..=89 => self.rng.range(1, 15),
            90..=98 => self.rng.range(15, CALM_OP_MAX),
            _ if calm => self.rng.range(15, CALM_OP_MAX),
            _ => self.rng.range(CALM_OP_MAX, 2000),
        };
        if self.faulty(node, now, FaultKind::Slow).is_some() {
            lat += self.rng.range(100, self.cfg.slow_max);
        }
        lat
    }

    /// When an operation from `now` to `done` takes effect.
    fn moment(&mut self, now: Ms, done: Ms) -> Ms {
        if done - now <= 20 {
            if self.rng.chance(500) {
                now
            } else {
                done
            }
        } else {
            self.rng.range(now, done)
        }
    }

    /// Whether a write from `node` landing at `at` fails, lands but reports an error, or works.
    pub fn write_outcome(&self, node: usize, at: Ms) -> WriteOutcome {
        if self.faulty(node, at, FaultKind::FailWrites).is_some() {
            WriteOutcome::Fails
        } else if self.faulty(node, at, FaultKind::LostReply).is_some() {
            WriteOutcome::LandsWithError
        } else {
            WriteOutcome::Lands
        }
    }

    /// A new lock or record id.
    pub fn new_lock_id(&mut self) -> u64 {
        self.next_lock += 1;
        self.next_lock
    }
}

/// A write's fate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// On the volume, reported done.
    Lands,
    /// On the volume, reported failed.
    LandsWithError,
    /// Not on the volume, reported failed.
    Fails,
}
