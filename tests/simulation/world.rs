//! The simulated world: nodes with their own clocks, the shared state volume, terraform's backend
//! lock table, pods and their processes, and a deterministic executor that runs the recorders and
//! recovery helpers (async functions) and every other event in simulated time.
//!
//! Time is simulated real time in milliseconds (`Ms`). A node's monotonic clock is
//! `base + t·(1 + ppm/10⁶)` (an `Instant` of its own: two nodes' instants are never compared
//! here, only turned back into simulated time with the node that made them); its wall clock is
//! `EPOCH_MS + t + skew(t)`, the skew stepping forward and back as the schedule says.

use std::cell::RefCell;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use tfinit::locks::book::{Book, LiveRun};
use tfinit::locks::names::RunId;
use tfinit::locks::record::{Heartbeat, Owner, Record};
use tfinit::locks::record_id::RecordId;
use tfinit::locks::recorder::{Completion, WriteError};

use super::legacy;
use super::rng::Rng;

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

/// A held state lock in terraform's backend.
#[derive(Debug, Clone)]
pub struct Lock {
    /// Its ID (a plain lock id).
    pub id: u64,
    /// terraform's Who: `@host`.
    pub who: String,
    /// Created, stamped by the holder's node wall clock.
    pub created_ms: u64,
    /// The terraform process holding it.
    pub holder: usize,
}

/// The key of terraform's lock table: (state, workspace).
pub type LockKey = (u8, u8);

/// A terraform process's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PState {
    /// Starting up, not yet at the lock.
    Starting,
    /// Waiting for a held lock (-lock-timeout), until `until`.
    Waiting {
        /// Gives up then.
        until: Ms,
    },
    /// Holding the lock, working.
    Holding,
    /// SIGTERMed while holding: finishing, then releases the lock.
    Stopping,
    /// Exited or killed.
    Dead,
}

/// A terraform process.
#[derive(Debug, Clone)]
pub struct Proc {
    /// Its init.
    pub inc: usize,
    /// Its run id.
    pub run: RunId,
    /// Where.
    pub workdir: u8,
    /// The lock it takes: its directory's state, its workspace.
    pub key: LockKey,
    /// Its Who.
    pub who: String,
    /// Life.
    pub state: PState,
    /// Timer generation (older timers are ignored).
    pub gen: u32,
    /// The lock it holds (its id).
    pub lock: Option<u64>,
    /// When it started.
    pub started: Ms,
    /// How long it works once it holds the lock.
    pub work: Ms,
    /// Ignores SIGTERM.
    pub stubborn: bool,
    /// SIGKILLed.
    pub killed: bool,
    /// When it ended (Ms::MAX while alive).
    pub died: Ms,
}

/// Where a state-locking run is, in its init.
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
    /// Today's `Book`.
    New(Box<Book>),
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

/// Work for a recorder.
#[derive(Debug, Clone)]
pub enum Job {
    /// Write a record.
    Create {
        /// Run.
        run: RunId,
        /// The record (who and updated_ms are set when written).
        record: Box<Record>,
    },
    /// Mark a record ended.
    End {
        /// Run.
        run: RunId,
        /// How.
        ended: tfinit::locks::record::Ended,
    },
    /// Remove a record.
    Remove {
        /// Run.
        run: RunId,
    },
}

/// A recorder's queue (the real one is crate-private): the heartbeat first, then the oldest
/// create, then writes in order, then a rescan.
#[derive(Debug, Default)]
pub struct RecQueue {
    /// A heartbeat is due.
    pub heartbeat: bool,
    /// A rescan is asked for.
    pub rescan: bool,
    /// Record writes.
    pub writes: VecDeque<Job>,
}

/// What the recorder does next.
#[derive(Debug)]
pub enum Next {
    /// Heartbeat.
    Heartbeat,
    /// A record write.
    Write(Job),
    /// A rescan.
    Rescan,
}

impl RecQueue {
    /// Adds a request; returns the runs whose queued create it cancelled (a removal of a run
    /// whose create never started).
    pub fn push(&mut self, job: Job) -> Vec<RunId> {
        if let Job::Remove { run } = &job {
            let mut cancelled = Vec::new();
            let mut had_create = false;
            self.writes.retain(|w| match w {
                Job::Create { run: r, .. } if r == run => {
                    cancelled.push(*r);
                    had_create = true;
                    false
                }
                Job::End { run: r, .. } if r == run => false,
                _ => true,
            });
            let _ = had_create;
            self.writes.push_back(job);
            return cancelled;
        }
        self.writes.push_back(job);
        Vec::new()
    }

    /// The next job.
    pub fn next(&mut self) -> Option<Next> {
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

    /// Nothing to do.
    pub fn is_empty(&self) -> bool {
        !self.heartbeat && !self.rescan && self.writes.is_empty()
    }
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
    /// The recorder's queue.
    pub rq: RecQueue,
    /// The recorder task.
    pub rec_task: TaskId,
    /// Runs by key.
    pub runs: BTreeMap<u64, Run>,
    /// Next run key.
    pub next_run: u64,
    /// When the loop's next timer wake-up is scheduled.
    pub wake_at: Option<Ms>,
    /// Its helpers.
    pub helpers: Vec<usize>,
    /// Recorder: the store opened.
    pub open: bool,
    /// Recorder: last heartbeat sequence number.
    pub seq: u64,
    /// Recorder: when the last heartbeat write that succeeded started (its monotonic clock).
    pub last_heartbeat: Option<Instant>,
    /// Recorder: records it wrote, by run: (id, content).
    pub written: HashMap<RunId, (u64, Record)>,
    /// Recorder: closings of finished runs that failed, tried again after every heartbeat that
    /// lands: (run, record id, the ended content, or None for a removal).
    pub unclosed: Vec<(RunId, u64, Option<Record>)>,
    /// Recorder: next heartbeat due (simulated time).
    pub next_beat: Ms,
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

/// Something the environment does.
#[derive(Debug, Clone)]
pub enum EnvEv {
    /// A pod's container starts (its first incarnation).
    StartPod(usize),
    /// The pod's controller asks for a state-locking run (another live pod's if it is gone).
    Request {
        /// The pod.
        pod: usize,
        /// Where.
        workdir: u8,
        /// Which workspace.
        ws: u8,
    },
    /// The calm phase's observer asks for a run (progress is owed from here).
    Observe {
        /// The observer pod.
        pod: usize,
        /// Where.
        workdir: u8,
        /// Which workspace.
        ws: u8,
    },
    /// The pod dies with everything in it (node lost, SIGKILL); gone for good.
    KillPod(usize),
    /// The container restarts: PID 1 dies, a new incarnation starts `after` ms later.
    Restart {
        /// The pod.
        pod: usize,
        /// Delay.
        after: Ms,
    },
    /// The pod is deleted: SIGTERM, the kubelet's SIGKILL after `grace`.
    Terminate {
        /// The pod.
        pod: usize,
        /// terminationGracePeriodSeconds.
        grace: Ms,
    },
    /// The OOM killer SIGKILLs one terraform of the pod (its init lives on), one that waits for
    /// its lock (`-lock-timeout`) as well as one that holds it.
    Oom(usize),
    /// A person runs `tfinit recover` in the pod's container with TFINIT_OWNER_TTL `ttl` (the
    /// default, or nothing of the pod's environment).
    ManualRecover {
        /// The pod.
        pod: usize,
        /// Its TTL.
        ttl: Ms,
    },
    /// `owners/` is restored from a backup: every incarnation lock file is replaced by a copy (a
    /// new inode, flocked by nobody) while its holders keep the old one.
    RestoreOwners,
    /// A fault, a freeze, a clock step or the calm phase, listed for the replay.
    Note(String),
}

/// Why a force-unlock of a live holder's lock happened, as far as the simulation can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cause {
    /// Issue 18 finding 1: a wall-clock age judged a live owner dead because of clock skew.
    Skew,
    /// Finding 2: the run's record landed under a heartbeat already older than the TTL.
    StaleRecord,
    /// Finding 3: two live inits share the owner name (one heartbeat file, or the same-name rule).
    SharedName,
    /// Finding 4: a helper's stale view of its own init's live runs and records.
    TwoHelpers,
    /// The owner's heartbeat stalled under a live run that nobody stopped (no fence).
    NoFence,
    /// A live run of another incarnation with the same Who (hostNetwork pods on one node, a
    /// StatefulSet pod and its replacement), that no record names.
    SameWho,
    /// A live run of the very incarnation whose old record was recovered, that no record names
    /// (it started without one, its heartbeat being stale).
    OwnUnrecorded,
    /// The owner was judged dead while alive: another live incarnation has the same key (name,
    /// boot, start millisecond, pid), so both write one heartbeat file.
    SharedKey,
    /// The run's record landed but its create reported an error: its owner's book counted the
    /// run as unrecorded and its fence never stopped it.
    LandedButFailed,
    /// Issue 23 finding 1: the owner was judged by an observer's TTL shorter than its own, by
    /// which it beats and fences.
    OwnersTtl,
    /// Finding 2: a live run with the same Who on the same state, in another directory (a
    /// symbolic link, or a backend naming the same key).
    SameState,
    /// Finding 3: a free flock on a file that replaced the owner's lock file at its path.
    ReplacedLockFile,
    /// terraform's force-unlock compared the dead run's lock id, then its unconditional delete
    /// removed a live run's lock taken meanwhile (two recoveries at once: `recover.lock`).
    UnlockRace,
    /// A live run of the helper's own init, started before the helper (so in the live runs the
    /// init handed it), with the record's Who, that no record names.
    InitsLiveRun,
    /// Anything else.
    Other,
}

/// What failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VKind {
    /// A lock whose holder was alive was force-unlocked.
    Safety(Cause),
    /// An observer called an incarnation dead while one of its recorded runs was alive.
    DeadVerdict,
    /// A dead run's lock was not released in time.
    Progress,
    /// The schedule never ends (an event storm).
    Runaway,
}

/// The longest a volume operation takes in the calm phase.
pub const CALM_OP_MAX: Ms = 300;

/// More steps than any schedule needs.
const STEP_LIMIT: u64 = 2_000_000;

/// An invariant that failed.
#[derive(Debug, Clone)]
pub struct Violation {
    /// When.
    pub at: Ms,
    /// Which.
    pub kind: VKind,
    /// The details.
    pub text: String,
    /// What tells this failure from others of its kind (for the exploration summary).
    pub sig: String,
}

/// A progress obligation: this lock (or, for a dead run's record whose lock is free, this
/// record) must be gone by `deadline`.
#[derive(Debug, Clone)]
pub struct Obligation {
    /// The lock; None: the record is owed.
    pub lock: Option<u64>,
    /// The record that names its run.
    pub record: u64,
    /// Its key.
    pub key: LockKey,
    /// Created at.
    pub since: Ms,
    /// Due.
    pub deadline: Ms,
    /// The request that created it.
    pub text: String,
}

/// What a schedule did, for the figures.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stats {
    /// Events processed (each followed by the invariant checks).
    pub steps: u64,
    /// Force-unlocks that released a dead holder's lock.
    pub unlocks: u64,
    /// Helpers started.
    pub helpers: u64,
    /// Progress obligations met.
    pub met: u64,
    /// Dead locks not owed (wall step beyond CLOCK_SKEW, or a live same-Who run there).
    pub excused: u64,
    /// Time the real loop would spin on a 1 ms epoll timeout (an expired wait blocked by a
    /// recovery), simulated ms.
    pub spin_ms: u64,
    /// Loop wake-ups for a book timer still due right after `tick` (should be 0).
    pub past_timers: u64,
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
    /// The state volume.
    pub store: Store,
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
    fn next_event(&mut self) -> Option<Ev> {
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

    /// Records the first violation.
    pub fn fail(&mut self, kind: VKind, text: String) {
        if self.violation.is_none() {
            let at = self.now;
            self.log(|| format!("VIOLATION {kind:?}: {text}"));
            let sig = match &kind {
                VKind::Progress => format!("Progress ({})", self.progress_why),
                VKind::DeadVerdict => format!("DeadVerdict{}", self.dead_why),
                k => format!("{k:?}"),
            };
            self.violation = Some(Violation {
                at,
                kind,
                text,
                sig,
            });
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

    fn faulty(&self, node: usize, t: Ms, kind: FaultKind) -> Option<&Fault> {
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
        let calm = now >= self.cfg.calm_at;
        let mut lat = match self.rng.below(100) {
            0..=89 => self.rng.range(1, 15),
            90..=98 => self.rng.range(15, CALM_OP_MAX),
            _ if calm => self.rng.range(15, CALM_OP_MAX),
            _ => self.rng.range(CALM_OP_MAX, 2000),
        };
        if self.faulty(node, now, FaultKind::Slow).is_some() {
            lat += self.rng.range(100, self.cfg.ttl);
        }
        let mut done = now + lat;
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
        let at = if done - now <= 20 {
            if self.rng.chance(500) {
                now
            } else {
                done
            }
        } else {
            self.rng.range(now, done)
        };
        (at, done)
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

    /// terraform processes of incarnation `inc` alive at time `t` whose record had landed by
    /// then, not marked ended.
    pub fn recorded_live_procs(&self, inc: usize, t: Ms) -> Vec<usize> {
        self.procs
            .iter()
            .enumerate()
            .filter(|(_, p)| p.inc == inc && p.started <= t && p.died > t)
            .filter(|(_, p)| {
                self.store.records.values().any(|s| {
                    s.inc == inc
                        && s.rec.run_id == p.run.to_string()
                        && s.rec.ended.is_none()
                        && s.landed <= t
                })
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// An observer (`who` says which, `ttl` its own TTL) calls incarnation `owner` dead after a
    /// read that started at `read_start` showed its heartbeat unchanged: none of its runs whose record was on the
    /// volume then was alive then (the owner's fence stopped them before any observer may
    /// decide). The verdict says nothing of runs recorded later: the owner may come back, and
    /// the re-check before an unlock reads again.
    pub fn check_dead_verdict(&mut self, who: &str, ttl: Ms, owner: &Owner, read_start: Ms) {
        if !self.cfg.dead_verdicts {
            return;
        }
        let Some(inc) = self
            .incs
            .iter()
            .position(|i| i.owner.same_incarnation(owner))
        else {
            return;
        };
        let live = self.recorded_live_procs(inc, read_start);
        if let Some(&p) = live.first() {
            let pr = &self.procs[p];
            let key = &self.incs[inc].key;
            let shared = self
                .incs
                .iter()
                .enumerate()
                .any(|(j, i)| j != inc && i.alive && i.key == *key);
            let text = format!(
                "{who} calls {key} dead after a read that started at {read_start} ms, but its recorded run {} (process {p}, {:?}, started at {} ms) was alive then; its last heartbeat that landed was stamped at {:?} ms{}",
                pr.run,
                pr.state,
                pr.started,
                self.incs[inc].beat_landed,
                if shared {
                    "; another live incarnation has the same key (name, boot, start ms, pid) and writes the same heartbeat file"
                } else {
                    ""
                }
            );
            self.dead_why = if shared {
                " (two live incarnations share a key)"
            } else if self.incs[inc].ttl > ttl {
                " (judged by a TTL shorter than the owner's)"
            } else if self.create_failed(inc, pr.run) {
                " (a create that reported an error landed)"
            } else {
                ""
            };
            self.fail(VKind::DeadVerdict, text);
        }
    }

    /// Whether incarnation `inc`'s book counts run `run`'s record as failed (its create
    /// reported an error).
    pub fn create_failed(&self, inc: usize, run: RunId) -> bool {
        match &self.incs[inc].book {
            BookSide::New(b) => matches!(
                b.record(run),
                Some(tfinit::locks::book::RecordStatus::Failed)
            ),
            BookSide::Old(_) => false,
        }
    }

    /// The invariants after every step.
    pub fn check(&mut self) {
        // Safety, belt and braces (the unlock itself checks first): a live terraform holding a
        // lock still holds it.
        for &i in &self.holders {
            let p = &self.procs[i];
            if let Some(id) = p.lock {
                if self.locks.get(&p.key).map(|l| l.id) != Some(id) {
                    let text = format!("process {i} ({}) lost its lock {id}", p.run);
                    self.fail(VKind::Safety(Cause::Other), text);
                    return;
                }
            }
        }
        // Progress: every obligation due is met.
        let now = self.now;
        let (locks, records) = (&self.locks, &self.store.records);
        let mut met = 0;
        self.obligations.retain(|o| {
            let owed = match o.lock {
                Some(id) => locks.get(&o.key).is_some_and(|l| l.id == id),
                None => records.contains_key(&o.record),
            };
            if !owed {
                met += 1;
            }
            owed
        });
        self.stats.met += met;
        if let Some(o) = self.obligations.iter().find(|o| now > o.deadline).cloned() {
            let last = self
                .outcomes
                .get(&o.record)
                .copied()
                .unwrap_or("no helper looked at it");
            self.progress_why = last;
            let what = match o.lock {
                Some(id) => format!(
                    "lock {id} of state s{} {} still held",
                    o.key.0,
                    workspace_name(o.key.1)
                ),
                None => format!(
                    "record {} of a dead run whose lock (state s{} {}) was free still on the volume",
                    o.record,
                    o.key.0,
                    workspace_name(o.key.1)
                ),
            };
            let text = format!(
                "{what} at {now} ms (last helper outcome for its record {}: {last}); owed since {} ms, due {} ms: {}",
                o.record, o.since, o.deadline, o.text
            );
            self.fail(VKind::Progress, text);
        }
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

/// A task's future.
pub type Task = Pin<Box<dyn Future<Output = ()>>>;

struct Noop;
impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

/// The world and its tasks.
pub struct Sim {
    /// The world.
    pub w: RefCell<World>,
    futs: RefCell<Vec<Option<Task>>>,
    waker: Waker,
    /// Makes the future of a task to spawn (the recorder's or a helper's).
    task: fn(Rc<Sim>, Spawn) -> Task,
}

impl Sim {
    /// A simulation of `w` whose tasks `task` makes.
    pub fn new(w: World, task: fn(Rc<Sim>, Spawn) -> Task) -> Rc<Sim> {
        Rc::new(Sim {
            w: RefCell::new(w),
            futs: RefCell::new(Vec::new()),
            waker: Waker::from(Arc::new(Noop)),
            task,
        })
    }

    /// Now.
    pub fn now(&self) -> Ms {
        self.w.borrow().now
    }

    /// Runs `f` on the world.
    pub fn with<T>(&self, f: impl FnOnce(&mut World) -> T) -> T {
        f(&mut self.w.borrow_mut())
    }

    /// Waits until simulated time `t`.
    pub fn sleep_until(&self, t: Ms) -> Until<'_> {
        Until {
            sim: self,
            t,
            armed: false,
        }
    }

    /// A read of the volume from `node`: `f` sees the volume as it is at one moment between
    /// now and the read's end.
    pub async fn read<T: 'static>(&self, node: usize, f: impl FnOnce(&World) -> T + 'static) -> T {
        let (at, done) = self.with(|w| w.op_timing(node));
        let now = self.now();
        if at == now {
            let v = self.with(|w| f(w));
            self.sleep_until(done).await;
            return v;
        }
        if at == done {
            self.sleep_until(done).await;
            return self.with(|w| f(w));
        }
        let slot = Rc::new(RefCell::new(None));
        let s2 = Rc::clone(&slot);
        self.with(|w| {
            w.at(
                at,
                Ev::Call(Box::new(move |w| {
                    *s2.borrow_mut() = Some(f(w));
                })),
            )
        });
        self.sleep_until(done).await;
        let v = slot.borrow_mut().take();
        v.expect("the read's snapshot was taken before its end")
    }

    /// A write to the volume from `node`: `f` applies it at one moment between now and the
    /// write's end (even if the writer dies meanwhile: the request is on its way).
    pub async fn write(
        &self,
        node: usize,
        f: impl FnOnce(&mut World) + 'static,
    ) -> Result<(), String> {
        let (at, done, outcome) = self.with(|w| {
            let (at, done) = w.op_timing(node);
            (at, done, w.write_outcome(node, at))
        });
        if outcome != WriteOutcome::Fails {
            if at == self.now() {
                self.with(f);
            } else {
                self.with(|w| w.at(at, Ev::Call(Box::new(f))));
            }
        }
        self.sleep_until(done).await;
        match outcome {
            WriteOutcome::Lands => Ok(()),
            WriteOutcome::LandsWithError => Err("EIO (the write landed, its fsync failed)".into()),
            WriteOutcome::Fails => Err("No space left on device".into()),
        }
    }

    /// Runs the events until the schedule ends or an invariant fails.
    pub fn run(self: &Rc<Self>) {
        loop {
            self.start_spawned();
            let Some(ev) = self.w.borrow_mut().next_event() else {
                break;
            };
            match ev {
                Ev::Wake(task) => self.poll(task),
                Ev::Call(f) => f(&mut self.w.borrow_mut()),
                other => self.w.borrow_mut().handle(other),
            }
            let mut w = self.w.borrow_mut();
            w.stats.steps += 1;
            if w.stats.steps > STEP_LIMIT {
                let text = format!("more than {STEP_LIMIT} steps: something wakes in a loop");
                w.fail(VKind::Runaway, text);
            }
            w.check();
            if w.violation.is_some() {
                break;
            }
        }
        // Futures hold the Sim: drop them to free the schedule.
        self.futs.borrow_mut().clear();
    }

    fn start_spawned(self: &Rc<Self>) {
        let spawns = std::mem::take(&mut self.w.borrow_mut().spawns);
        for (id, what) in spawns {
            let fut = (self.task)(Rc::clone(self), what);
            let mut futs = self.futs.borrow_mut();
            if futs.len() <= id {
                futs.resize_with(id + 1, || None);
            }
            futs[id] = Some(fut);
            let mut w = self.w.borrow_mut();
            let now = w.now;
            w.at(now, Ev::Wake(id));
        }
    }

    fn poll(self: &Rc<Self>, task: TaskId) {
        {
            let mut w = self.w.borrow_mut();
            if !w.task_alive.get(task).copied().unwrap_or(false) {
                return;
            }
            // A frozen pod's recorder thread runs when the freeze ends.
            if let Some(inc) = w.task_inc[task] {
                let pod = w.incs[inc].pod;
                if let Some(end) = w.frozen_until(pod) {
                    w.at(end, Ev::Wake(task));
                    return;
                }
            }
            w.current = task;
        }
        let Some(mut fut) = self.futs.borrow_mut().get_mut(task).and_then(Option::take) else {
            return;
        };
        let mut cx = Context::from_waker(&self.waker);
        let done = fut.as_mut().poll(&mut cx).is_ready();
        let alive = self.w.borrow().task_alive[task];
        if !done && alive {
            self.futs.borrow_mut()[task] = Some(fut);
        } else {
            self.w.borrow_mut().task_alive[task] = false;
        }
    }
}

// What the recorder and the helpers read of the volume, and a create's completion.

/// Every record on the volume, at one moment.
pub async fn list(sim: &Sim, node: usize) -> Vec<(u64, Rc<Record>)> {
    sim.read(node, |w| {
        w.store
            .records
            .iter()
            .map(|(id, s)| (*id, Rc::clone(&s.rec)))
            .collect()
    })
    .await
}

/// The heartbeat file of incarnation `owner` (today's layout).
pub async fn read_heartbeat(sim: &Sim, node: usize, owner: &Owner) -> Option<Heartbeat> {
    let key = owner.key();
    let owner = owner.clone();
    sim.read(node, move |w| {
        w.store
            .beat(&key)
            .filter(|b| b.hb.v == 2 && b.hb.owner.same_incarnation(&owner))
            .map(|b| (*b.hb).clone())
    })
    .await
}

/// The heartbeat file of owner name `name` (the old layout), with when its stamp was taken.
pub async fn read_heartbeat_by_name(sim: &Sim, node: usize, name: &str) -> Option<(Heartbeat, Ms)> {
    let name = name.to_string();
    sim.read(node, move |w| {
        w.store.beat(&name).map(|b| ((*b.hb).clone(), b.stamped))
    })
    .await
}

/// A create's completion (the old book's carries the error as text).
pub fn created(new: bool, run: RunId, result: Result<RecordId, WriteError>) -> Comp {
    if new {
        Comp::New(Completion::Created { run, result })
    } else {
        Comp::Old(super::legacy::Completion::Created {
            run,
            result: result.map_err(|e| e.to_string()),
        })
    }
}

/// The future of [`Sim::sleep_until`].
pub struct Until<'a> {
    sim: &'a Sim,
    t: Ms,
    armed: bool,
}

impl Future for Until<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if self.sim.now() >= self.t {
            return Poll::Ready(());
        }
        if !self.armed {
            self.armed = true;
            let t = self.t;
            self.sim.with(|w| w.wake_current_at(t));
        }
        Poll::Pending
    }
}

/// Waits until `cond` holds on the world, or until `until` (Ms::MAX: no time limit).
pub struct WaitFor<'a, F: Fn(&World) -> bool + Unpin> {
    sim: &'a Sim,
    until: Ms,
    cond: F,
    armed: bool,
}

impl<'a, F: Fn(&World) -> bool + Unpin> WaitFor<'a, F> {
    /// Waits on `sim` for `cond`, at the latest until `until`.
    pub fn new(sim: &'a Sim, until: Ms, cond: F) -> Self {
        WaitFor {
            sim,
            until,
            cond,
            armed: false,
        }
    }
}

impl<F: Fn(&World) -> bool + Unpin> Future for WaitFor<'_, F> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let (ready, now) = {
            let w = this.sim.w.borrow();
            ((this.cond)(&w), w.now)
        };
        if ready || now >= this.until {
            return Poll::Ready(());
        }
        if !this.armed && this.until != Ms::MAX {
            this.armed = true;
            let t = this.until;
            this.sim.with(|w| w.wake_current_at(t));
        }
        Poll::Pending
    }
}
