//! The loop's in-memory book of lock-owner records: the store's state, each state-locking run's
//! record, and the table of records the recorder last scanned. Pure: no I/O, no clock of its own
//! (every call gets `now`), so every decision the loop takes about records is unit-tested here.
//!
//! The loop calls [`Book::begin`] for a state-locking run, sends the requests the book returns to
//! the [`Recorder`](super::recorder::Recorder), feeds every completion to
//! [`Book::on_completion`] and calls [`Book::tick`] at [`Book::next_wakeup`]; the [`Event`]s it
//! gets back say which waiting run may start and what to log.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::labels::StoreStatus;
use super::liveness::{run_state, Facts, Fence, Observer, RunState, Seen, Token, Verdict};
use super::names::RunId;
use super::record::{Ended, Owner};
use super::recorder::{Completion, Entry, Request, Table, WriteError};
use super::who::{who_for, who_host};
use crate::duration::fmt_duration;
use crate::mutation::{self, Guard};

/// How often "state volume is not answering" is repeated while it lasts.
pub const NOT_ANSWERING_EVERY: Duration = Duration::from_secs(60);

/// The store's state, as the loop knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreState {
    /// The recorder is opening it (probe, sweep, first heartbeat).
    Opening {
        /// Since when.
        since: Instant,
    },
    /// Usable.
    Open,
    /// Not usable (missing, read-only, not a directory): runs start without records.
    Failed,
    /// A run's record did not land within TFINIT_RECORD_TIMEOUT: runs start at once without
    /// records until a write succeeds again.
    NotAnswering {
        /// Since when.
        since: Instant,
        /// When the last "not answering" warning was given.
        last_warned: Instant,
    },
}

/// A state-locking run's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordStatus {
    /// None will be written (the store failed, does not answer, or its heartbeat is stale).
    Unrecorded,
    /// Its create is queued or in flight, and the run waits in `recording` until `deadline`.
    Pending {
        /// When the run stops waiting.
        deadline: Instant,
    },
    /// Its create is queued or in flight, and the run no longer waits for it: still tracked, so
    /// a late landing is marked ended or removed with its run.
    Abandoned,
    /// On the volume.
    Written {
        /// Its id in the store.
        path: PathBuf,
    },
    /// Its create failed.
    Failed,
}

impl RecordStatus {
    /// Whether a record of this run is, or may soon be, on the volume.
    pub fn may_exist(&self) -> bool {
        matches!(
            self,
            RecordStatus::Pending { .. } | RecordStatus::Abandoned | RecordStatus::Written { .. }
        )
    }
}

/// What the loop does with a new state-locking run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// Start terraform now without a record; log the notice first, when there is one.
    Unrecorded(Option<Notice>),
    /// Send [`Request::Create`] now; the run waits in `recording` until an [`Event::Start`] for
    /// it, at the latest `deadline` (then [`Book::tick`] gives that event).
    Record {
        /// now + TFINIT_RECORD_TIMEOUT.
        deadline: Instant,
    },
}

/// Something the loop must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Log this.
    Log(Notice),
    /// The run waiting in `recording` may start; `recorded` says whether its record is on the
    /// volume.
    Start {
        /// The run.
        run: RunId,
        /// Whether its record is on the volume.
        recorded: bool,
    },
    /// This owner's heartbeat has not landed for long: stop its state-locking runs before any
    /// observer may call it dead (locks::liveness::Fence).
    Fence {
        /// The runs whose record is, or may soon be, on the volume.
        runs: Vec<RunId>,
        /// false: their one graceful SIGTERM; true: SIGKILL of what is left.
        kill: bool,
    },
}

/// How far this owner has gone in stopping its recorded runs for want of a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceStage {
    /// The heartbeat is on time.
    Clear,
    /// Recorded runs got their graceful SIGTERM; new ones are refused.
    Stopping,
    /// Recorded runs were SIGKILLed; new ones are refused.
    Killing,
}

/// A live state-locking run, as the recovery helper counts it: a possible holder of any lock
/// with its `Who` on a state it may lock (locks::state), created after it started.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LiveRun {
    /// Where terraform works (the text it was started with: the helper resolves it).
    pub workdir: PathBuf,
    /// Its workspace.
    pub workspace: String,
    /// The `Who` its lock carries.
    pub who: String,
    /// Its TF_DATA_DIR, absolute, when it set one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// When it started, ms since the epoch by this node's clock (the clock its lock's Created
    /// is stamped by).
    pub started_ms: u64,
    /// Why the state it locks cannot be read from its data directory, when it cannot
    /// ([`super::state::unsure_reason`]): it may then hold the lock of any state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unsure: Option<String>,
}

/// A new state-locking run, as the book registers it.
#[derive(Debug, Clone, Copy)]
pub struct NewRun<'a> {
    /// The run.
    pub run: RunId,
    /// Where terraform works (cwd + -chdir, as text).
    pub workdir: &'a Path,
    /// The workspace whose state it locks.
    pub workspace: &'a str,
    /// The terraform subcommand.
    pub subcommand: &'a str,
    /// argv, redacted.
    pub argv: &'a [String],
    /// Its environment: $USER and $HOME make the lock's Who without a passwd entry; TF_DATA_DIR
    /// and TF_CLI_ARGS say where its backend settings are.
    pub env: &'a [String],
    /// When it starts, ms since the epoch (this node's wall clock).
    pub started_ms: u64,
}

/// The records part of `tfinit status`.
#[derive(Debug, Clone, PartialEq)]
pub struct View {
    /// The store's state.
    pub state: StoreStatus,
    /// Age of the last successful heartbeat write; None before the first one.
    pub heartbeat_age: Option<Duration>,
    /// Records whose lock a recovery found it cannot release: a person must.
    pub needing_person: usize,
}

/// A message for the log; [`Notice::log`] writes it at its level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// The store opened.
    Enabled {
        /// The state directory.
        dir: String,
        /// Our owner name.
        owner: String,
        /// Our incarnation.
        incarnation: String,
    },
    /// Records of dead owners were found at open.
    DeadRecords {
        /// How many.
        count: usize,
        /// Whether recoveries run automatically.
        auto: bool,
    },
    /// The store cannot be used (once, at start).
    NotUsable {
        /// The state directory.
        dir: String,
        /// Why.
        error: String,
    },
    /// The store cannot be written, and records of this pod's host (`Who`) are in these
    /// working directories: state-locking runs there are refused meanwhile.
    Shadowed {
        /// The state directory.
        dir: String,
        /// The working directories.
        workdirs: Vec<PathBuf>,
    },
    /// A run's record did not land in time: it starts without one.
    RecordTimeout {
        /// The run.
        run: RunId,
        /// The state directory.
        dir: String,
        /// TFINIT_RECORD_TIMEOUT.
        timeout: Duration,
    },
    /// The volume still does not answer: a run starts without a record (once a minute).
    NotAnswering {
        /// The run.
        run: RunId,
        /// The state directory.
        dir: String,
        /// For how long.
        since: Duration,
    },
    /// A write succeeded after the volume stopped answering.
    AnswersAgain {
        /// The state directory.
        dir: String,
    },
    /// The heartbeat is older than TTL/2 while records of ours are on the volume (once).
    HeartbeatStale {
        /// The state directory.
        dir: String,
        /// The last successful heartbeat's age.
        age: Duration,
        /// TFINIT_OWNER_TTL.
        ttl: Duration,
    },
    /// A run starts without a record because the heartbeat is stale.
    HeartbeatStaleRun {
        /// The run.
        run: RunId,
    },
    /// The heartbeat was written after it had gone stale.
    HeartbeatAgain {
        /// The state directory.
        dir: String,
    },
    /// A run's record create failed: it starts without one.
    CreateFailed {
        /// The run.
        run: RunId,
        /// The state directory.
        dir: String,
        /// Why.
        error: WriteError,
    },
    /// A progress rewrite failed.
    ProgressFailed {
        /// The run.
        run: RunId,
        /// Why.
        error: WriteError,
    },
    /// An end-marking failed.
    EndFailed {
        /// The run.
        run: RunId,
        /// Why.
        error: WriteError,
    },
    /// A removal failed.
    RemoveFailed {
        /// The run.
        run: RunId,
        /// Why.
        error: WriteError,
    },
    /// Another live incarnation writes heartbeats under our owner name (once).
    SharedName {
        /// The name.
        owner: String,
        /// The other incarnation.
        other: String,
        /// Ours.
        me: String,
    },
    /// Recorded runs are stopped because the heartbeat has not landed.
    Fenced {
        /// The runs.
        runs: Vec<RunId>,
        /// SIGKILL (else the graceful SIGTERM).
        kill: bool,
        /// Age of the last heartbeat that landed.
        age: Duration,
        /// TFINIT_OWNER_TTL.
        ttl: Duration,
    },
}

impl Notice {
    /// Its level.
    pub fn level(&self) -> tracing::Level {
        use tracing::Level;
        match self {
            Notice::Enabled { .. }
            | Notice::DeadRecords { .. }
            | Notice::AnswersAgain { .. }
            | Notice::HeartbeatAgain { .. } => Level::INFO,
            Notice::HeartbeatStale { .. } | Notice::Fenced { .. } => Level::ERROR,
            _ => Level::WARN,
        }
    }

    /// Its text.
    pub fn message(&self) -> String {
        let secs = |d: &Duration| fmt_duration(Duration::from_secs(d.as_secs()));
        match self {
            Notice::Enabled { dir, owner, incarnation } => format!(
                "lock-owner records enabled (state_dir {dir}, owner {owner}, incarnation {incarnation})"
            ),
            Notice::DeadRecords { count, auto } => format!(
                "lock-owner records of dead owners found ({count}): each is checked before the next state-locking run in its directory{}",
                if *auto { "" } else { " (TFINIT_FORCE_UNLOCK=off: run `tfinit recover` by hand)" }
            ),
            Notice::NotUsable { dir, error } => format!(
                "TFINIT_STATE_DIR is not usable: tfinit keeps working without lock-owner records, so a \
                 state lock left by this pod's death will not be released automatically. Mount a \
                 writable volume there (emptyDir for container restarts, a PVC for pod replacement) \
                 or set TFINIT_STATE_DIR to one (state_dir {dir}: {error})"
            ),
            Notice::Shadowed { dir, workdirs } => {
                let dirs = list(workdirs.iter().map(|d| d.display()));
                format!(
                    "TFINIT_STATE_DIR ({dir}) cannot be written but holds lock-owner records of earlier runs with this pod's \
                     hostname in their lock's Who, in {dirs}: state-locking runs are refused (exit code 75), in every \
                     directory (another may lock the same state), until the volume takes writes again or those records \
                     are gone, because another pod recovering such a record could release a lock of this pod's, which \
                     carries the same Who, while this pod cannot say it is alive. Fix the volume (space, permissions, the \
                     NFS server)"
                )
            }
            Notice::RecordTimeout { run, dir, timeout } => format!(
                "run {run}: the state volume did not answer within TFINIT_RECORD_TIMEOUT ({}): terraform starts without a \
                 lock-owner record, so a state lock this run leaves behind will not be released automatically. \
                 Check the volume mounted at TFINIT_STATE_DIR ({dir}); until a write succeeds again, state-locking \
                 runs start at once without a record. Raise TFINIT_RECORD_TIMEOUT if the volume is merely slow",
                fmt_duration(*timeout)
            ),
            Notice::NotAnswering { run, dir, since } => format!(
                "run {run}: the state volume is not answering (for {}): terraform starts without a lock-owner record. \
                 Check the volume mounted at TFINIT_STATE_DIR ({dir})",
                secs(since)
            ),
            Notice::AnswersAgain { dir } => format!(
                "the state volume answers again ({dir}): state-locking runs get lock-owner records again"
            ),
            Notice::HeartbeatStale { dir, age, ttl } => format!(
                "this owner's heartbeat has not been written for {} in TFINIT_STATE_DIR ({dir}): other pods may take \
                 this owner for dead after TFINIT_OWNER_TTL ({}) and release the state locks its records name. New \
                 state-locking runs start without a record until it is written again; check the volume",
                secs(age),
                fmt_duration(*ttl)
            ),
            Notice::HeartbeatStaleRun { run } => format!(
                "run {run}: the heartbeat is stale, so terraform starts without a lock-owner record (a record no pod \
                 can trust protects nothing)"
            ),
            Notice::HeartbeatAgain { dir } => format!(
                "heartbeat written again in TFINIT_STATE_DIR ({dir}): state-locking runs get lock-owner records again"
            ),
            Notice::CreateFailed { run, dir, error } => format!(
                "run {run}: cannot write the lock-owner record; this run's lock will not be recoverable automatically. \
                 Free space in TFINIT_STATE_DIR ({dir}) or mount a bigger, writable volume there ({error})"
            ),
            Notice::ProgressFailed { run, error } => format!(
                "run {run}: cannot update the lock-owner record; its resources in progress are out of date. Free space \
                 in TFINIT_STATE_DIR or mount a bigger, writable volume there ({error})"
            ),
            Notice::EndFailed { run, error } => format!(
                "run {run}: cannot mark the lock-owner record as ended; tried again after every heartbeat that lands, and recovered once this owner is dead ({error})"
            ),
            Notice::RemoveFailed { run, error } => {
                format!("run {run}: cannot remove the lock-owner record; tried again after every heartbeat that lands ({error})")
            }
            Notice::SharedName { owner, other, me } => format!(
                "another tfinit is using owner name {owner} (incarnation {other}; this one is {me}) with the same \
                 TFINIT_STATE_DIR: each judges only its own records, so neither releases the other's locks, but give \
                 each pod its own TFINIT_OWNER (the default, the hostname, is unique per pod unless hostNetwork is set)"
            ),
            Notice::Fenced { runs, kill, age, ttl } => format!(
                "the heartbeat has not landed in TFINIT_STATE_DIR for {} (TFINIT_OWNER_TTL {}): other pods may take this \
                 owner for dead and release the locks that carry its Who, so its state-locking runs (recorded or not) {}: {}. New state-locking \
                 runs are refused until a heartbeat lands; check the volume, or raise TFINIT_OWNER_TTL if it stalls this long",
                secs(age),
                fmt_duration(*ttl),
                if *kill { "are SIGKILLed now" } else { "are asked to stop gracefully (one SIGTERM)" },
                list(runs)
            ),
        }
    }

    /// Writes it to the log at its level.
    pub fn log(&self) {
        let m = self.message();
        match self.level() {
            tracing::Level::ERROR => tracing::error!("{m}"),
            tracing::Level::WARN => tracing::warn!("{m}"),
            _ => tracing::info!("{m}"),
        }
    }
}

/// `items` separated by commas (runs, directories), for a log line.
fn list<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    let mut out = String::new();
    for (i, item) in items.into_iter().enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        out += &format!("{sep}{item}");
    }
    out
}

/// A live state-locking run.
#[derive(Debug, Clone)]
struct Run {
    workdir: PathBuf,
    workspace: String,
    /// $USER and $HOME from its environment (they make the Who when passwd has no entry).
    user_env: Vec<String>,
    record: RecordStatus,
    /// [`LiveRun::data_dir`].
    data_dir: Option<PathBuf>,
    /// [`LiveRun::started_ms`].
    started_ms: u64,
    /// [`LiveRun::unsure`].
    unsure: Option<String>,
}

/// An end-marking or removal queued or in flight.
#[derive(Debug, Clone)]
struct Closing {
    workdir: PathBuf,
    /// The `Who` of its run's lock.
    who: String,
    /// The record's id, when its create had landed.
    path: Option<PathBuf>,
    /// How the run ended (an end-marking), or None (a removal).
    ended: Option<Ended>,
}

/// What the loop knows about records.
#[derive(Debug)]
pub struct Book {
    state: StoreState,
    dir: String,
    me: Owner,
    ttl: Duration,
    record_timeout: Duration,
    auto_unlock: bool,
    host: String,
    passwd_user: Option<String>,
    table: Option<Table>,
    /// Records of the last table whose lock needs a person (counted when a table comes in, not
    /// at every look: the loop reads it after each wake-up, and a table may hold thousands).
    needing_person: usize,
    /// Our own end-markings and removals since they became durable, by record id (Some: the
    /// ended record; None: removed): they count until a table scanned after them arrives.
    own: HashMap<PathBuf, (Instant, Option<Entry>)>,
    /// When the last recovery in each directory finished: the table counts there again once it
    /// was scanned after that.
    recovered: HashMap<PathBuf, Instant>,
    /// When the last successful heartbeat was stamped.
    heartbeat_ok: Option<Instant>,
    stale_reported: bool,
    /// What this incarnation has seen of other incarnations' heartbeats.
    observer: Observer,
    /// Incarnations the kernel proves gone, as of the last table.
    gone: Vec<String>,
    /// Incarnations a process of which the kernel says holds their lock file (alive).
    held: Vec<String>,
    /// Another live incarnation of our name was reported.
    shared_reported: bool,
    fence: FenceStage,
    /// While the store cannot be written: where records of this host's `Who` keep state-locking
    /// runs from starting ([`Book::may_launch`]).
    shadowed: Vec<PathBuf>,
    runs: HashMap<RunId, Run>,
    closing: HashMap<RunId, Closing>,
}

/// Whether a state-locking run may start terraform now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launch {
    /// It may.
    Yes,
    /// Not while this owner's heartbeat does not land (the fence is up).
    Fenced,
    /// Not while the store cannot be written and a record with this pod's `Who` is on it (in
    /// any working directory: another may lock the same state).
    Shadowed,
    /// Not before a heartbeat of this incarnation is on the volume, while the store has not
    /// opened (it hangs, or it did not answer in time): other pods cannot know it is alive, nor
    /// can it read whether a dead earlier run with its `Who` has a record there (the rule for a
    /// store that fails at open, [`Launch::Shadowed`], needs that reading).
    Unseen,
}

impl Book {
    /// A book for owner `me` with the store at `dir` being opened since `now`; `observer` judges
    /// other incarnations (its own TTL is this owner's TFINIT_OWNER_TTL).
    pub fn new(
        dir: &Path,
        me: Owner,
        observer: Observer,
        record_timeout: Duration,
        auto_unlock: bool,
        host: String,
        now: Instant,
    ) -> Book {
        Book {
            state: StoreState::Opening { since: now },
            dir: dir.display().to_string(),
            me,
            ttl: observer.ttl(),
            record_timeout,
            auto_unlock,
            host,
            passwd_user: None,
            table: None,
            needing_person: 0,
            own: HashMap::new(),
            recovered: HashMap::new(),
            heartbeat_ok: None,
            stale_reported: false,
            observer,
            gone: Vec::new(),
            held: Vec::new(),
            shared_reported: false,
            fence: FenceStage::Clear,
            shadowed: Vec::new(),
            runs: HashMap::new(),
            closing: HashMap::new(),
        }
    }

    /// This incarnation.
    pub fn owner(&self) -> &Owner {
        &self.me
    }

    /// Whether the recorder is still opening the store (what is on it is not known yet).
    pub fn opening(&self) -> bool {
        matches!(self.state, StoreState::Opening { .. })
    }

    /// The store's state.
    pub fn state(&self) -> StoreState {
        self.state
    }

    /// A run's record status; None for a run the book does not know (not state-locking, or over).
    pub fn record(&self, run: RunId) -> Option<&RecordStatus> {
        self.runs.get(&run).map(|r| &r.record)
    }

    /// Registers a new state-locking run and decides whether it waits for a record: until
    /// `deadline` at the latest, or TFINIT_RECORD_TIMEOUT from `now` when None. A run that has
    /// waited for the store already (for its directory's end-markings, or for the store to open)
    /// passes the deadline of its first wait, so one TFINIT_RECORD_TIMEOUT bounds the whole wait.
    pub fn begin(&mut self, new: &NewRun<'_>, now: Instant, deadline: Option<Instant>) -> Start {
        let run = new.run;
        let deadline = deadline.unwrap_or(now + self.record_timeout);
        let user_env = new
            .env
            .iter()
            .filter(|kv| kv.starts_with("USER=") || kv.starts_with("HOME="))
            .cloned()
            .collect();
        let (start, record) = match self.state {
            StoreState::Failed => (Start::Unrecorded(None), RecordStatus::Unrecorded),
            StoreState::NotAnswering { since, last_warned } => {
                let warn = self.heartbeat_ok.is_some()
                    && now.saturating_duration_since(last_warned) >= NOT_ANSWERING_EVERY;
                let notice = warn.then(|| {
                    self.state = StoreState::NotAnswering {
                        since,
                        last_warned: now,
                    };
                    Notice::NotAnswering {
                        run,
                        dir: self.dir.clone(),
                        since: now.saturating_duration_since(since),
                    }
                });
                (Start::Unrecorded(notice), RecordStatus::Unrecorded)
            }
            StoreState::Open if self.heartbeat_stale(now) || self.fence != FenceStage::Clear => (
                Start::Unrecorded(Some(Notice::HeartbeatStaleRun { run })),
                RecordStatus::Unrecorded,
            ),
            StoreState::Open => (
                Start::Record { deadline },
                RecordStatus::Pending { deadline },
            ),
            // Its run waited TFINIT_RECORD_TIMEOUT for the store to open and gave up: no create
            // is sent before the store is open, so that every run with a record is started after
            // the loop holds the incarnation's lock file (and inherits it). Until a write
            // succeeds, the store does not answer.
            // No heartbeat of this incarnation landed yet, so the run is refused when it asks to
            // launch (Launch::Unseen), which says why.
            StoreState::Opening { .. } => {
                self.state = StoreState::NotAnswering {
                    since: now,
                    last_warned: now,
                };
                (Start::Unrecorded(None), RecordStatus::Unrecorded)
            }
        };
        let data_dir = crate::protocol::env_value(new.env, "TF_DATA_DIR")
            .filter(|d| !d.is_empty())
            .map(|d| new.workdir.join(d));
        self.runs.insert(
            run,
            Run {
                workdir: new.workdir.to_path_buf(),
                workspace: new.workspace.to_string(),
                user_env,
                record,
                data_dir,
                started_ms: new.started_ms,
                unsure: super::state::unsure_reason(new.subcommand, new.argv, new.env),
            },
        );
        start
    }

    /// The request for a run's new set of resources in progress, when its record is (or may be)
    /// on the volume.
    pub fn progress(&self, run: RunId, in_progress: Vec<String>) -> Option<Request> {
        let r = self.runs.get(&run)?;
        r.record
            .may_exist()
            .then_some(Request::Progress { run, in_progress })
    }

    /// The run is over (exited, or refused while `recording`): forgets it as live, and returns
    /// the end-marking (`ended` given: it may have left its lock) or the removal of its record,
    /// when one is or may be on the volume. A recovery in its directory waits for that request.
    pub fn exited(
        &mut self,
        run: RunId,
        ended: Option<Ended>,
        in_progress: Vec<String>,
    ) -> Option<Request> {
        let r = self.runs.remove(&run)?;
        if !r.record.may_exist() {
            return None;
        }
        let path = match r.record {
            RecordStatus::Written { path } => Some(path),
            _ => None,
        };
        self.closing.insert(
            run,
            Closing {
                who: who_for(self.passwd_user.as_deref(), &self.host, &r.user_env),
                workdir: r.workdir,
                path,
                ended: ended.clone(),
            },
        );
        Some(match ended {
            Some(ended) => Request::End {
                run,
                ended,
                in_progress,
            },
            None => Request::Remove { run },
        })
    }

    /// Takes in what the recorder did, at `now`.
    pub fn on_completion(&mut self, c: Completion, now: Instant) -> Vec<Event> {
        let mut ev = Vec::new();
        match c {
            Completion::Opened {
                result: Ok(()),
                table,
                passwd_user,
                beat,
                ..
            } => self.opened(table, passwd_user, beat, now, &mut ev),
            Completion::Opened {
                result: Err(error),
                passwd_user,
                table,
                ..
            } => self.open_failed(error, passwd_user, table, &mut ev),
            Completion::Heartbeat {
                result: Ok(()),
                stamped,
                ..
            } => self.beat_landed(stamped, now, &mut ev),
            // The next heartbeat's age still counts from the last one that landed.
            Completion::Heartbeat { result: Err(_), .. } => {}
            Completion::Created { run, result } => self.created(run, result, &mut ev),
            Completion::Written { run, result } => match result {
                Ok(()) => self.answered(&mut ev),
                // A run without a record has nothing to rewrite: said when its create failed.
                Err(WriteError::NoRecord) => {}
                Err(error) => ev.push(Event::Log(Notice::ProgressFailed { run, error })),
            },
            Completion::Ended { run, result } => {
                let failed = |run, error| Notice::EndFailed { run, error };
                self.closed(run, result, failed, now, &mut ev)
            }
            Completion::Removed { run, result } => {
                let failed = |run, error| Notice::RemoveFailed { run, error };
                self.closed(run, result, failed, now, &mut ev)
            }
            Completion::Table(t) => {
                self.own.retain(|_, (at, _)| *at > t.scanned);
                self.recovered.retain(|_, at| *at > t.scanned);
                self.take_table(t, &mut ev);
            }
        }
        ev
    }

    /// The store opened: its records, our passwd user, and when its first heartbeat was stamped.
    fn opened(
        &mut self,
        table: Option<Table>,
        passwd_user: Option<String>,
        beat: Option<Instant>,
        now: Instant,
        ev: &mut Vec<Event>,
    ) {
        self.passwd_user = passwd_user;
        if let Some(t) = table {
            self.take_table(t, ev);
        }
        self.heartbeat_ok = beat;
        ev.push(Event::Log(Notice::Enabled {
            dir: self.dir.clone(),
            owner: self.me.name.clone(),
            incarnation: self.me.incarnation(),
        }));
        let dead = self.dead_records(now);
        if dead > 0 {
            ev.push(Event::Log(Notice::DeadRecords {
                count: dead,
                auto: self.auto_unlock,
            }));
        }
        self.answered(ev);
        // A store that failed at start opens when the recorder's retry succeeds.
        if matches!(self.state, StoreState::Opening { .. } | StoreState::Failed) {
            self.state = StoreState::Open;
            self.shadowed.clear();
        }
    }

    /// The store cannot be used: said once, and every run waiting for its record starts without,
    /// but in a directory the records it could still read shadow (see [`Book::may_launch`]). The
    /// recorder tries again every TTL/3: a later failure only brings the records it read.
    fn open_failed(
        &mut self,
        error: String,
        passwd_user: Option<String>,
        table: Option<Table>,
        ev: &mut Vec<Event>,
    ) {
        self.passwd_user = passwd_user;
        self.set_table(table);
        let shadowed = self.shadowed_dirs();
        if shadowed != self.shadowed {
            if !shadowed.is_empty() {
                ev.push(Event::Log(Notice::Shadowed {
                    dir: self.dir.clone(),
                    workdirs: shadowed.clone(),
                }));
            }
            self.shadowed = shadowed;
        }
        if self.state == StoreState::Failed {
            return;
        }
        self.state = StoreState::Failed;
        ev.push(Event::Log(Notice::NotUsable {
            dir: self.dir.clone(),
            error,
        }));
        // Runs start at once, without a warning each: the one above says it all.
        for (id, r) in &mut self.runs {
            if matches!(r.record, RecordStatus::Pending { .. }) {
                ev.push(Event::Start {
                    run: *id,
                    recorded: false,
                });
            }
            if r.record.may_exist() {
                r.record = RecordStatus::Unrecorded;
            }
        }
    }

    /// A heartbeat stamped at `stamped` landed: the fence clears while it is young enough, and a
    /// stale heartbeat that is fresh again is said once.
    fn beat_landed(&mut self, stamped: Instant, now: Instant, ev: &mut Vec<Event>) {
        self.heartbeat_ok = Some(self.heartbeat_ok.map_or(stamped, |t| t.max(stamped)));
        if now < Fence::after(stamped, self.ttl).stop_at {
            self.fence = FenceStage::Clear;
        }
        // A write that hung lands with an old stamp (other pods read that time in the file):
        // still stale, and said once; the next, fresh one ends it.
        let fresh = now.saturating_duration_since(stamped) <= self.ttl / 2;
        if fresh && std::mem::take(&mut self.stale_reported) {
            ev.push(Event::Log(Notice::HeartbeatAgain {
                dir: self.dir.clone(),
            }));
        }
        self.answered(ev);
    }

    /// A run's create finished: the run waiting for it starts (with its record, or without and a
    /// warning); a late landing of a run that is over counts for its end-marking or removal.
    fn created(&mut self, run: RunId, result: Result<PathBuf, WriteError>, ev: &mut Vec<Event>) {
        if result.is_ok() {
            self.answered(ev);
        }
        let Some(r) = self.runs.get_mut(&run) else {
            if let (Some(c), Ok(path)) = (self.closing.get_mut(&run), result) {
                // Landed after its run was over: the end-marking or removal queued behind it
                // applies to it.
                c.path = Some(path);
            }
            return;
        };
        let waiting = matches!(r.record, RecordStatus::Pending { .. });
        match result {
            Ok(path) => {
                // A late landing of a live run's record is as good as an early one.
                r.record = RecordStatus::Written { path };
                if waiting {
                    ev.push(Event::Start {
                        run,
                        recorded: true,
                    });
                }
            }
            Err(error) => {
                r.record = RecordStatus::Failed;
                if waiting {
                    ev.push(Event::Log(Notice::CreateFailed {
                        run,
                        dir: self.dir.clone(),
                        error,
                    }));
                    ev.push(Event::Start {
                        run,
                        recorded: false,
                    });
                }
            }
        }
    }

    /// A run's end-marking or removal finished: until a scan made after it arrives, its record
    /// counts as this (ended record, or none). A failure is said with `failed`'s notice.
    fn closed(
        &mut self,
        run: RunId,
        result: Result<(), WriteError>,
        failed: fn(RunId, WriteError) -> Notice,
        now: Instant,
        ev: &mut Vec<Event>,
    ) {
        let closing = self.closing.remove(&run);
        match result {
            Ok(()) => self.answered(ev),
            // An end-marking of a run whose create failed: said when it failed.
            Err(WriteError::NoRecord) => return,
            Err(error) => return ev.push(Event::Log(failed(run, error))),
        }
        let Some(Closing {
            workdir,
            who,
            path: Some(path),
            ended,
        }) = closing
        else {
            return;
        };
        let entry = ended.map(|ended| Entry {
            path: path.clone(),
            workdir,
            who,
            facts: Facts {
                owner: self.me.clone(),
                updated_ms: ended.ms,
                ended: Some(ended),
                needs_person_by: None,
                ttl: Some(self.ttl),
            },
        });
        self.own.insert(path, (now, entry));
    }

    /// The last table of records, and what is counted of it.
    fn set_table(&mut self, table: Option<Table>) {
        self.needing_person = table
            .iter()
            .flat_map(|t| &t.records)
            .filter(|e| e.facts.needs_person_by.is_some())
            .count();
        self.table = table;
    }

    /// Takes in a scan: the records, and what it read of each incarnation's heartbeat.
    fn take_table(&mut self, t: Table, ev: &mut Vec<Event>) {
        for b in &t.beats {
            let token = b.heartbeat.as_ref().map(Token::of);
            self.observer.saw(&b.owner.key(), token, b.started, b.done);
        }
        let keys: Vec<String> = t.beats.iter().map(|b| b.owner.key()).collect();
        self.observer.retain(|k| keys.iter().any(|x| x == k));
        // A record states its owner's TTL too: what it is judged by while its heartbeat is missing.
        for e in &t.records {
            self.observer.stated(&e.facts.owner.key(), e.facts.ttl);
        }
        if !self.shared_reported {
            let twin = t.beats.iter().find(|b| {
                b.owner.name == self.me.name
                    && !b.owner.same_incarnation(&self.me)
                    && self.observer.verdict(&b.owner.key(), t.scanned) == Verdict::Alive
            });
            if let Some(b) = twin {
                self.shared_reported = true;
                ev.push(Event::Log(Notice::SharedName {
                    owner: self.me.name.clone(),
                    other: b.owner.incarnation(),
                    me: self.me.incarnation(),
                }));
            }
        }
        self.gone.clone_from(&t.gone);
        self.held.clone_from(&t.held);
        self.set_table(Some(t));
    }

    /// A write succeeded: the volume answers.
    fn answered(&mut self, ev: &mut Vec<Event>) {
        if let StoreState::NotAnswering { .. } = self.state {
            self.state = StoreState::Open;
            ev.push(Event::Log(Notice::AnswersAgain {
                dir: self.dir.clone(),
            }));
        }
    }

    /// Time-driven work: runs whose record did not land in time start without one, the heartbeat
    /// is asked for when due, and a stale heartbeat is reported once.
    pub fn tick(&mut self, now: Instant) -> Vec<Event> {
        let mut ev = Vec::new();
        let mut expired: Vec<RunId> = self
            .runs
            .iter()
            .filter(
                |(_, r)| matches!(r.record, RecordStatus::Pending { deadline } if deadline <= now),
            )
            .map(|(id, _)| *id)
            .collect();
        expired.sort();
        for id in expired {
            if let Some(r) = self.runs.get_mut(&id) {
                r.record = RecordStatus::Abandoned;
            }
            if !matches!(self.state, StoreState::NotAnswering { .. }) {
                self.state = StoreState::NotAnswering {
                    since: now,
                    last_warned: now,
                };
            }
            // A run of an incarnation no heartbeat of which landed is refused when it asks to
            // start (Launch::Unseen), which says why: "starts without a record" would be wrong.
            if self.heartbeat_ok.is_some() {
                ev.push(Event::Log(Notice::RecordTimeout {
                    run: id,
                    dir: self.dir.clone(),
                    timeout: self.record_timeout,
                }));
            }
            ev.push(Event::Start {
                run: id,
                recorded: false,
            });
        }
        if let Some(f) = self.fence_due(now) {
            ev.push(f);
        }
        if !self.stale_reported && self.heartbeat_stale(now) && self.has_records() {
            self.stale_reported = true;
            ev.push(Event::Log(Notice::HeartbeatStale {
                dir: self.dir.clone(),
                age: self.heartbeat_age(now).unwrap_or_default(),
                ttl: self.ttl,
            }));
        }
        ev
    }

    /// The fence's next step at `now`, if one is due: recorded runs are stopped before any
    /// observer may call this owner dead (see [`Fence`]).
    fn fence_due(&mut self, now: Instant) -> Option<Event> {
        if !mutation::on(Guard::Fence) {
            return None;
        }
        let f = Fence::after(self.heartbeat_ok?, self.ttl);
        let kill = match self.fence {
            FenceStage::Clear if now >= f.kill_at => true,
            FenceStage::Clear if now >= f.stop_at => false,
            FenceStage::Stopping if now >= f.kill_at => true,
            _ => return None,
        };
        self.fence = if kill {
            FenceStage::Killing
        } else {
            FenceStage::Stopping
        };
        // Every state-locking run of this incarnation, recorded or not: its lock carries this
        // owner's Who, which another pod may release once it takes this owner for dead (the
        // simulation found an unrecorded run's lock released so, seed 1094).
        let mut runs: Vec<RunId> = self.runs.keys().copied().collect();
        if runs.is_empty() {
            return None;
        }
        runs.sort();
        Some(Event::Fence { runs, kill })
    }

    /// Whether state-locking `run` may start terraform now: not while the fence is up (its lock
    /// would carry the Who of an owner other pods may soon take for dead), recorded or not. A run
    /// the book does not know (it takes no lock) always may.
    pub fn may_launch(&self, run: RunId) -> Launch {
        if !self.runs.contains_key(&run) {
            return Launch::Yes;
        }
        if self.fence != FenceStage::Clear {
            return Launch::Fenced;
        }
        if self.state == StoreState::Failed {
            // In every directory, not only those of the records: a directory's path does not say
            // which state its runs lock (a symbolic link, a backend naming the same key).
            if !self.shadowed.is_empty() && mutation::on(Guard::Shadowed) {
                return Launch::Shadowed;
            }
        } else if self.heartbeat_ok.is_none() && mutation::on(Guard::Unseen) {
            return Launch::Unseen;
        }
        Launch::Yes
    }

    /// The working directories where a record of another incarnation has a `Who` of this
    /// pod's host: while this incarnation cannot write to the volume, it is invisible to other
    /// pods, and one recovering such a record (a dead earlier container's, a run whose removal
    /// failed) could release a lock of this incarnation's that carries the same `Who`. So its
    /// state-locking runs wait (refused with 75), in every directory (any may lock the state of
    /// one of these), until the volume opens or the records are gone. Found by the simulation
    /// (docs/reliability.md).
    fn shadowed_dirs(&self) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        let Some(t) = &self.table else {
            return dirs;
        };
        for e in &t.records {
            if who_host(&e.who) == self.host
                && !e.facts.owner.same_incarnation(&self.me)
                && !dirs.contains(&e.workdir)
            {
                dirs.push(e.workdir.clone());
            }
        }
        dirs.sort();
        dirs
    }

    /// How far the fence has gone: a state-locking run may start only while it is `Clear`.
    pub fn fence_stage(&self) -> FenceStage {
        self.fence
    }

    /// The log line for a fence event.
    pub fn fence_notice(&self, runs: &[RunId], kill: bool, now: Instant) -> Notice {
        Notice::Fenced {
            runs: runs.to_vec(),
            kill,
            age: self.heartbeat_age(now).unwrap_or_default(),
            ttl: self.ttl,
        }
    }

    /// When [`Book::tick`] has work next.
    pub fn next_wakeup(&self) -> Option<Instant> {
        let deadlines = self.runs.values().filter_map(|r| match r.record {
            RecordStatus::Pending { deadline } => Some(deadline),
            _ => None,
        });
        let stale = self
            .heartbeat_ok
            .filter(|_| !self.stale_reported && self.has_records())
            .map(|t| t + self.ttl / 2 + Duration::from_millis(1));
        let fence = self
            .heartbeat_ok
            .filter(|_| !self.runs.is_empty())
            .and_then(|b| {
                let f = Fence::after(b, self.ttl);
                match self.fence {
                    FenceStage::Clear => Some(f.stop_at),
                    FenceStage::Stopping => Some(f.kill_at),
                    FenceStage::Killing => None,
                }
            });
        deadlines.chain(stale).chain(fence).min()
    }

    /// Whether this incarnation has (or may soon have) a record of a live run on the volume.
    fn has_records(&self) -> bool {
        self.runs.values().any(|r| r.record.may_exist())
    }

    /// Age of the last successful heartbeat write.
    pub fn heartbeat_age(&self, now: Instant) -> Option<Duration> {
        self.heartbeat_ok.map(|t| now.saturating_duration_since(t))
    }

    /// Whether the last successful heartbeat is older than TTL/2: other pods may soon take this
    /// owner for dead, so no record should be written under it (whether or not records of ours
    /// are on the volume now).
    pub fn heartbeat_stale(&self, now: Instant) -> bool {
        matches!(
            self.state,
            StoreState::Open | StoreState::NotAnswering { .. }
        ) && self.heartbeat_age(now).is_some_and(|a| a > self.ttl / 2)
    }

    /// The records part of `tfinit status`.
    pub fn view(&self, now: Instant) -> View {
        let state = match self.state {
            StoreState::Opening { .. } => StoreStatus::Opening,
            StoreState::Failed => StoreStatus::Failed,
            StoreState::NotAnswering { .. } => StoreStatus::NotAnswering,
            StoreState::Open if self.heartbeat_stale(now) => StoreStatus::HeartbeatStale,
            StoreState::Open => StoreStatus::Open,
        };
        View {
            state,
            heartbeat_age: self.heartbeat_age(now),
            needing_person: self.needing_person,
        }
    }

    /// Every record the loop knows of, at lookup time: the last table, corrected by our own
    /// end-markings and removals since it was scanned.
    fn entries(&self) -> impl Iterator<Item = &Entry> {
        let scanned = self.table.as_ref().map(|t| t.scanned);
        let newer = move |at: &Instant| !scanned.is_some_and(|s| *at <= s);
        let table = self
            .table
            .iter()
            .flat_map(|t| t.records.iter())
            .filter(move |e| !self.own.get(&e.path).is_some_and(|(at, _)| newer(at)));
        let own = self
            .own
            .values()
            .filter(move |(at, _)| newer(at))
            .filter_map(|(_, e)| e.as_ref());
        table.chain(own)
    }

    /// Whether `e`'s run is over, may run, or is being watched, as this observer sees it now.
    fn run_state(&self, e: &Entry, now: Instant) -> RunState {
        let key = e.facts.owner.key();
        let kernel = if self.gone.contains(&key) {
            Some(true)
        } else if self.held.contains(&key) {
            Some(false)
        } else {
            None
        };
        run_state(&self.me, &e.facts, kernel, self.observer.verdict(&key, now))
    }

    /// Not known to be alive (over, or being watched), and not already reported by this
    /// incarnation as needing a person: a recovery helper looks at it (and waits for a verdict).
    fn wants_recovery(&self, e: &Entry, now: Instant) -> bool {
        !matches!(self.run_state(e, now), RunState::Alive)
            && e.facts.needs_person_by.as_deref() != Some(self.me.incarnation().as_str())
    }

    fn dead_records(&self, now: Instant) -> usize {
        self.entries()
            .filter(|e| matches!(self.run_state(e, now), RunState::Over(_)))
            .count()
    }

    /// What this incarnation has seen of other incarnations' heartbeats, for a recovery helper
    /// (`mono` turns an instant into CLOCK_MONOTONIC nanoseconds).
    pub fn observations(&self, mono: impl Fn(Instant) -> u64) -> Vec<Seen> {
        self.observer.export(mono)
    }

    /// The incarnations the kernel proved gone in the last scan.
    pub fn proven_gone(&self) -> &[String] {
        &self.gone
    }

    /// Whether a state-locking run in `workdir` must wait for a recovery first: a record there of
    /// a run seen dying, of an incarnation proven gone or watched dead, or of one not watched
    /// long enough to tell (the helper then watches), decided at `now` on our monotonic clock.
    pub fn needs_recovery(&self, workdir: &Path, now: Instant) -> bool {
        if !self.auto_unlock
            || !matches!(
                self.state,
                StoreState::Open | StoreState::NotAnswering { .. }
            )
        {
            return false;
        }
        // A run of ours here ended in a way that may have left its lock, and its end-marking is
        // still on its way to the volume: a recovery is needed (it waits for that marking).
        if self
            .closing
            .values()
            .any(|c| c.workdir == workdir && c.ended.is_some())
        {
            return true;
        }
        // The table before a recovery's rescan still shows what that recovery resolved.
        let scanned = self.table.as_ref().map(|t| t.scanned);
        if self
            .recovered
            .get(workdir)
            .is_some_and(|at| !scanned.is_some_and(|s| s >= *at))
        {
            return false;
        }
        self.entries()
            .any(|e| e.workdir == workdir && self.wants_recovery(e, now))
    }

    /// Whether what a recovery in `workdir` would look at is only records of owners not watched
    /// long enough to tell (none is known over): the helper then only watches, unless one dies.
    pub fn only_watching(&self, workdir: &Path, now: Instant) -> bool {
        !self
            .closing
            .values()
            .any(|c| c.workdir == workdir && c.ended.is_some())
            && !self.entries().any(|e| {
                e.workdir == workdir && matches!(self.run_state(e, now), RunState::Over(_))
            })
    }

    /// Whether a recovery in `workdir` may start now: no end-marking or removal of a record there
    /// is still queued or in flight (a recovery must read what our runs left as the truth).
    pub fn may_recover(&self, workdir: &Path) -> bool {
        !self.closing.values().any(|c| c.workdir == workdir)
    }

    /// A recovery in `workdir` finished: returns the rescan to send.
    pub fn recovery_done(&mut self, workdir: &Path, now: Instant) -> Request {
        self.recovered.insert(workdir.to_path_buf(), now);
        Request::Rescan
    }

    /// The live state-locking runs, recorded or not, for the recovery helper.
    pub fn live_runs(&self) -> Vec<LiveRun> {
        let mut out: Vec<LiveRun> = self
            .runs
            .values()
            .map(|r| LiveRun {
                workdir: r.workdir.clone(),
                workspace: r.workspace.clone(),
                who: who_for(self.passwd_user.as_deref(), &self.host, &r.user_env),
                data_dir: r.data_dir.clone(),
                started_ms: r.started_ms,
                unsure: r.unsure.clone(),
            })
            .collect();
        out.sort_by(|a, b| (&a.workdir, &a.workspace).cmp(&(&b.workdir, &b.workspace)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::locks::record::Heartbeat;
    use crate::locks::recorder::tests::me;
    use crate::locks::recorder::Beat;

    const TTL: Duration = Duration::from_secs(30);

    /// A state-locking `apply` of `run` in `workdir`, started at T0.
    fn new_run<'a>(
        run: RunId,
        workdir: &'a Path,
        workspace: &'a str,
        env: &'a [String],
    ) -> NewRun<'a> {
        NewRun {
            run,
            workdir,
            workspace,
            subcommand: "apply",
            argv: &[],
            env,
            started_ms: T0,
        }
    }
    const TIMEOUT: Duration = Duration::from_secs(10);
    const T0: u64 = 1_800_000_000_000;

    fn book(t: Instant) -> Book {
        Book::new(
            Path::new("/state"),
            me(),
            Observer::new(TTL, crate::locks::liveness::LONGEST_TTL),
            TIMEOUT,
            true,
            "pod-a".into(),
            t,
        )
    }

    fn table(at: Instant, records: Vec<Entry>, heartbeats: Vec<Heartbeat>) -> Table {
        Table {
            scanned: at,
            records,
            beats: heartbeats
                .into_iter()
                .map(|h| Beat {
                    owner: h.owner.clone(),
                    heartbeat: Some(h),
                    started: at,
                    done: at,
                })
                .collect(),
            gone: Vec::new(),
            held: Vec::new(),
        }
    }

    fn opened(t: Instant, table: Table) -> Completion {
        Completion::Opened {
            result: Ok(()),
            table: Some(table),
            passwd_user: None,
            beat: Some(t),
            lock: None,
        }
    }

    fn open_book(t: Instant) -> Book {
        let mut b = book(t);
        b.on_completion(opened(t, table(t, vec![], vec![])), t);
        b
    }

    fn other(name: &str, started_ms: u64) -> Owner {
        Owner {
            name: name.into(),
            started_ms,
            ..me()
        }
    }

    fn entry(path: &str, workdir: &str, owner: Owner, updated_ms: u64) -> Entry {
        Entry {
            path: path.into(),
            workdir: workdir.into(),
            who: format!("@{}", owner.name),
            facts: Facts {
                owner,
                updated_ms,
                ended: None,
                needs_person_by: None,
                ttl: Some(TTL),
            },
        }
    }

    fn logs(ev: &[Event]) -> Vec<String> {
        ev.iter()
            .filter_map(|e| match e {
                Event::Log(n) => Some(n.message()),
                _ => None,
            })
            .collect()
    }

    fn failed_open(t: Instant, records: Vec<Entry>) -> Completion {
        Completion::Opened {
            result: Err("No space left on device (os error 28)".into()),
            table: Some(table(t, records, vec![])),
            passwd_user: None,
            beat: None,
            lock: None,
        }
    }

    #[test]
    fn a_store_that_fails_at_open_refuses_runs_while_a_record_has_this_pods_who() {
        let t = Instant::now();
        let mut b = book(t);
        let earlier = other("pod-a", T0 - 60_000);
        let records = vec![
            entry("/state/records/1.json", "/tf/x", earlier, T0),
            entry("/state/records/2.json", "/tf/y", other("pod-b", T0), T0),
        ];
        let ev = b.on_completion(failed_open(t, records.clone()), t);
        let said = logs(&ev);
        assert!(
            said.iter()
                .any(|l| l.starts_with("TFINIT_STATE_DIR is not usable")),
            "{said:?}"
        );
        assert!(
            said.iter().any(
                |l| l.contains("cannot be written but holds lock-owner records")
                    && l.contains("/tf/x")
                    && !l.contains("/tf/y")
            ),
            "{said:?}"
        );
        let (x, y) = (RunId::from(1), RunId::from(2));
        begin(&mut b, x, t);
        b.begin(&new_run(y, Path::new("/tf/y"), "default", &[]), t, None);
        assert_eq!(
            b.may_launch(x),
            Launch::Shadowed,
            "an earlier container's record in /tf/x"
        );
        assert_eq!(
            b.may_launch(y),
            Launch::Shadowed,
            "/tf/y may lock /tf/x's state (a symbolic link, the same backend key)"
        );
        // The retry fails again with the same records: nothing new is said.
        let ev = b.on_completion(failed_open(t, records), t);
        assert_eq!(logs(&ev), Vec::<String>::new());
        assert_eq!(b.may_launch(x), Launch::Shadowed);
        // Another pod recovered the record, the volume still failing: another pod's record (its
        // Who is not this pod's) refuses nothing.
        let others = vec![entry(
            "/state/records/2.json",
            "/tf/y",
            other("pod-b", T0),
            T0,
        )];
        let ev = b.on_completion(failed_open(t, others), t);
        assert_eq!(logs(&ev), Vec::<String>::new());
        assert_eq!(b.may_launch(x), Launch::Yes);
        assert_eq!(b.may_launch(y), Launch::Yes);
        // The volume is back: the store opens on a retry.
        let earlier = other("pod-a", T0 - 60_000);
        let rec = entry("/state/records/1.json", "/tf/x", earlier, T0);
        b.on_completion(failed_open(t, vec![rec.clone()]), t);
        assert_eq!(b.may_launch(x), Launch::Shadowed);
        b.on_completion(opened(t, table(t, vec![rec], vec![])), t);
        assert_eq!(b.state(), StoreState::Open);
        assert_eq!(
            b.may_launch(x),
            Launch::Yes,
            "an open store records and fences"
        );
    }

    #[test]
    fn the_view_counts_the_records_that_need_a_person_as_the_last_table_had_them() {
        let t = Instant::now();
        let mut b = book(t);
        assert_eq!(b.view(t).needing_person, 0);
        let mut waiting = entry("/state/records/1.json", "/tf/x", other("pod-b", T0), T0);
        waiting.facts.needs_person_by = Some("pod-c incarnation".into());
        let plain = entry("/state/records/2.json", "/tf/y", other("pod-b", T0), T0);
        b.on_completion(opened(t, table(t, vec![waiting, plain.clone()], vec![])), t);
        assert_eq!(b.view(t).needing_person, 1);
        // A person released it: the next scan no longer has it.
        b.on_completion(Completion::Table(table(t, vec![plain], vec![])), t);
        assert_eq!(b.view(t).needing_person, 0);
    }

    #[test]
    fn a_run_whose_wait_ends_before_any_heartbeat_landed_is_refused_not_started_unrecorded() {
        let t = Instant::now();
        let mut b = book(t);
        let r1 = RunId::from(1);
        // The init asks once the run's wait for the store (TFINIT_RECORD_TIMEOUT) is over.
        assert_eq!(b.state(), StoreState::Opening { since: t });
        let start = begin(&mut b, r1, t + TIMEOUT);
        assert!(
            matches!(start, Start::Unrecorded(None)),
            "no \"terraform starts without a record\": {start:?}"
        );
        assert_eq!(b.may_launch(r1), Launch::Unseen);
        // The next run asks while the volume still has not answered: refused at once, too.
        let r2 = RunId::from(2);
        begin(&mut b, r2, t + TIMEOUT);
        assert_eq!(b.may_launch(r2), Launch::Unseen);
        // Its first heartbeat lands (the open finishes): runs may start.
        b.on_completion(opened(t + TIMEOUT, table(t, vec![], vec![])), t + TIMEOUT);
        assert_eq!(b.may_launch(r2), Launch::Yes);
    }

    fn begin(b: &mut Book, run: RunId, now: Instant) -> Start {
        b.begin(&new_run(run, Path::new("/tf/x"), "default", &[]), now, None)
    }

    /// Begins run `run` in /tf/x and lands its record as `path`.
    fn recorded(b: &mut Book, run: RunId, path: &str, now: Instant) -> Vec<Event> {
        begin(b, run, now);
        b.on_completion(
            Completion::Created {
                run,
                result: Ok(path.into()),
            },
            now,
        )
    }

    #[test]
    fn a_run_waits_for_its_record_and_starts_when_it_lands() {
        let t = Instant::now();
        let mut b = book(t);
        assert_eq!(b.view(t).state, StoreStatus::Opening);
        // No create goes out before the store is open (and the loop holds the incarnation's
        // lock file for the run to inherit): a run that gave up waiting gets none, and may not
        // launch before this incarnation's first heartbeat landed.
        assert!(matches!(
            begin(&mut b, RunId::from(0), t),
            Start::Unrecorded(None)
        ));
        assert_eq!(b.may_launch(RunId::from(0)), Launch::Unseen);
        let ev = b.on_completion(opened(t, table(t, vec![], vec![])), t);
        assert!(
            logs(&ev)[0].contains("lock-owner records enabled"),
            "{ev:?}"
        );
        assert_eq!(b.state(), StoreState::Open);
        assert_eq!(
            begin(&mut b, RunId::from(1), t),
            Start::Record {
                deadline: t + TIMEOUT
            }
        );
        assert!(b.tick(t + Duration::from_secs(1)).is_empty(), "not due yet");
        let ev = b.on_completion(
            Completion::Created {
                run: RunId::from(1),
                result: Ok("p1".into()),
            },
            t,
        );
        assert_eq!(
            ev,
            [Event::Start {
                run: RunId::from(1),
                recorded: true
            }]
        );
        assert_eq!(
            b.record(RunId::from(1)),
            Some(&RecordStatus::Written { path: "p1".into() })
        );
        assert!(b.progress(RunId::from(1), vec!["a".into()]).is_some());
        // Runs the book does not know (not state-locking) never write progress.
        assert!(b.progress(RunId::from(99), vec!["a".into()]).is_none());
    }

    #[test]
    fn a_record_that_does_not_land_in_time_makes_the_store_not_answering() {
        let t = Instant::now();
        let mut b = open_book(t);
        begin(&mut b, RunId::from(1), t);
        assert_eq!(b.next_wakeup(), Some(t + TIMEOUT));
        assert!(b.tick(t + TIMEOUT - Duration::from_millis(1)).is_empty());
        let ev = b.tick(t + TIMEOUT);
        assert!(
            logs(&ev)[0].contains("the state volume did not answer within TFINIT_RECORD_TIMEOUT")
        );
        assert!(ev.contains(&Event::Start {
            run: RunId::from(1),
            recorded: false
        }));
        assert_eq!(b.record(RunId::from(1)), Some(&RecordStatus::Abandoned));
        assert_eq!(b.view(t + TIMEOUT).state, StoreStatus::NotAnswering);
        // The next locking runs start at once, warned once a minute.
        let t1 = t + TIMEOUT + Duration::from_secs(1);
        assert_eq!(begin(&mut b, RunId::from(2), t1), Start::Unrecorded(None));
        let t2 = t + TIMEOUT + NOT_ANSWERING_EVERY;
        match begin(&mut b, RunId::from(3), t2) {
            Start::Unrecorded(Some(n)) => {
                assert!(n.message().contains("state volume is not answering"))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            begin(&mut b, RunId::from(4), t2 + Duration::from_secs(59)),
            Start::Unrecorded(None)
        );
        // The late create lands: the volume answers again, and the live run's record counts.
        let ev = b.on_completion(
            Completion::Created {
                run: RunId::from(1),
                result: Ok("p1".into()),
            },
            t2,
        );
        assert!(logs(&ev)[0].contains("state volume answers again"));
        assert!(
            !ev.iter().any(|e| matches!(e, Event::Start { .. })),
            "r1 already started"
        );
        assert_eq!(b.state(), StoreState::Open);
        // The heartbeat is old by now (r1's record is on the volume): stale until written.
        assert!(matches!(
            begin(&mut b, RunId::from(5), t2),
            Start::Unrecorded(Some(_))
        ));
        b.on_completion(
            Completion::Heartbeat {
                result: Ok(()),
                stamped: t2,
                wall_ms: T0,
            },
            t2,
        );
        assert!(matches!(
            begin(&mut b, RunId::from(6), t2),
            Start::Record { .. }
        ));
    }

    #[test]
    fn a_store_that_fails_to_open_warns_once_and_runs_start_without_records() {
        let t = Instant::now();
        let mut b = book(t);
        assert!(matches!(
            begin(&mut b, RunId::from(1), t),
            Start::Unrecorded(None)
        ));
        let ev = b.on_completion(Completion::not_usable("read-only file system".into()), t);
        assert_eq!(
            b.may_launch(RunId::from(1)),
            Launch::Yes,
            "no record to shadow it"
        );
        assert_eq!(logs(&ev).len(), 1);
        assert!(logs(&ev)[0].contains("TFINIT_STATE_DIR is not usable"));
        assert!(
            !ev.iter().any(|e| matches!(e, Event::Start { .. })),
            "r1 never waited: no create goes out before the store opens"
        );
        assert_eq!(begin(&mut b, RunId::from(2), t), Start::Unrecorded(None));
        assert_eq!(b.view(t).state, StoreStatus::Failed);
        assert!(
            b.tick(t + TTL).is_empty(),
            "no heartbeat for a failed store"
        );
        assert_eq!(
            b.exited(RunId::from(2), None, vec![]),
            None,
            "nothing to remove"
        );
    }

    #[test]
    fn a_failed_create_starts_the_run_with_todays_warning() {
        let t = Instant::now();
        let mut b = open_book(t);
        begin(&mut b, RunId::from(1), t);
        let ev = b.on_completion(
            Completion::Created {
                run: RunId::from(1),
                result: Err(WriteError::Volume("no space left".into())),
            },
            t,
        );
        assert!(logs(&ev)[0].contains("cannot write the lock-owner record"));
        assert!(ev.contains(&Event::Start {
            run: RunId::from(1),
            recorded: false
        }));
        assert_eq!(b.exited(RunId::from(1), None, vec![]), None);
    }

    #[test]
    fn a_stale_heartbeat_is_one_error_and_new_runs_go_without_records() {
        let t = Instant::now();
        let mut b = open_book(t);
        let hb_due = t + TTL / 3;
        assert_eq!(
            b.tick(hb_due),
            [],
            "the recorder keeps the heartbeat's clock"
        );
        // Stale whether or not records of ours are on the volume: the next record must not land
        // under it.
        assert!(b.heartbeat_stale(t + TTL));
        recorded(&mut b, RunId::from(1), "p1", t);
        let late = t + TTL / 2 + Duration::from_millis(2);
        assert!(b.next_wakeup().is_some_and(|w| w <= late));
        let ev = b.tick(late);
        assert_eq!(logs(&ev).len(), 1, "{ev:?}");
        assert!(logs(&ev)[0].contains("heartbeat has not been written for"));
        assert!(
            b.tick(late + Duration::from_secs(1))
                .iter()
                .all(|e| !matches!(e, Event::Log(_))),
            "reported once"
        );
        assert_eq!(b.view(late).state, StoreStatus::HeartbeatStale);
        assert_eq!(b.view(late).heartbeat_age, Some(late - t));
        match begin(&mut b, RunId::from(2), late) {
            Start::Unrecorded(Some(n)) => assert!(n.message().contains("heartbeat is stale")),
            other => panic!("{other:?}"),
        }
        let ev = b.on_completion(
            Completion::Heartbeat {
                result: Ok(()),
                stamped: late,
                wall_ms: T0,
            },
            late,
        );
        assert!(logs(&ev)[0].contains("heartbeat written again"));
        assert_eq!(b.view(late).state, StoreStatus::Open);
        assert!(matches!(
            begin(&mut b, RunId::from(3), late),
            Start::Record { .. }
        ));
        // A failed heartbeat changes nothing by itself.
        let ev = b.on_completion(
            Completion::Heartbeat {
                result: Err(WriteError::Volume("EIO".into())),
                stamped: late,
                wall_ms: T0,
            },
            late,
        );
        assert!(ev.is_empty());
    }

    fn beat(owner: Owner, seq: u64, updated_ms: u64) -> Heartbeat {
        Heartbeat {
            v: crate::locks::record::HEARTBEAT_FORMAT,
            owner,
            seq,
            updated_ms,
            holds_lock: true,
            host: String::new(),
            ttl_ms: Some(30_000),
            lock_file: None,
        }
    }

    #[test]
    fn owners_are_judged_by_what_this_observer_saw_change_on_its_own_clock() {
        let t = Instant::now();
        let mut b = book(t);
        let pod_b = other("pod-b", T0 - 100_000);
        let mine = entry("mine", "/tf/mine", me(), T0);
        let mut ended_mine = entry("ended", "/tf/ended", me(), T0);
        ended_mine.facts.ended = Some(Ended {
            ms: T0,
            how: "killed by SIGKILL".into(),
        });
        let records = vec![
            entry("b", "/tf/b", pod_b.clone(), T0 - 50_000),
            entry("c", "/tf/c", other("pod-c", T0 - 100_000), T0),
            mine,
            ended_mine,
        ];
        // pod-b's stamps are an hour old by any clock here: they are never compared with one.
        let stamp = T0 - 3_600_000;
        b.on_completion(
            opened(
                t,
                table(t, records.clone(), vec![beat(pod_b.clone(), 1, stamp)]),
            ),
            t,
        );
        // Not watched for a TTL yet: a recovery helper looks (and waits for a verdict).
        assert!(b.needs_recovery(Path::new("/tf/b"), t));
        assert!(b.needs_recovery(Path::new("/tf/c"), t));
        // pod-b's heartbeat changes: alive, its lock is never looked at.
        let t1 = t + TTL / 3;
        let scan = |at: Instant, seq: u64| {
            Completion::Table(table(
                at,
                records.clone(),
                vec![beat(pod_b.clone(), seq, stamp + seq)],
            ))
        };
        b.on_completion(scan(t1, 2), t1);
        assert!(!b.needs_recovery(Path::new("/tf/b"), t1));
        // Unchanged in a read just short of a TTL later: still alive.
        let t2 = t1 + TTL - Duration::from_millis(1);
        b.on_completion(scan(t2, 2), t2);
        assert!(!b.needs_recovery(Path::new("/tf/b"), t2 + TTL));
        // Unchanged in a read a full TTL after it was first seen: dead.
        let t3 = t1 + TTL;
        b.on_completion(scan(t3, 2), t3);
        assert!(b.needs_recovery(Path::new("/tf/b"), t3));
        // pod-c has no heartbeat at all: watched like any content, dead after a TTL of it.
        assert_eq!(
            b.dead_records(t3),
            2,
            "pod-b watched dead, our own ended run"
        );
        // Our own live record never; our own ended one always.
        assert!(!b.needs_recovery(Path::new("/tf/mine"), t3 + 100 * TTL));
        assert!(b.needs_recovery(Path::new("/tf/ended"), t));
        assert!(!b.needs_recovery(Path::new("/tf/elsewhere"), t3 + 100 * TTL));
        // TFINIT_FORCE_UNLOCK=off: never.
        b.auto_unlock = false;
        assert!(!b.needs_recovery(Path::new("/tf/ended"), t));
    }

    #[test]
    fn an_incarnation_the_kernel_proves_gone_is_over_at_once() {
        let t = Instant::now();
        let mut b = book(t);
        let earlier = other("pod-a", 0);
        let mut tab = table(
            t,
            vec![entry("a0", "/tf/a", earlier.clone(), T0)],
            vec![beat(earlier.clone(), 9, T0)],
        );
        tab.gone = vec![earlier.key()];
        b.on_completion(opened(t, tab), t);
        assert_eq!(b.dead_records(t), 1);
        assert_eq!(b.proven_gone(), [earlier.key()]);
    }

    #[test]
    fn an_incarnation_whose_lock_file_a_process_holds_is_alive_whatever_its_heartbeat_does() {
        // An init that died outside a PID namespace leaves its terraform behind, holding the
        // lock file: its heartbeat stops, but the kernel says a process of it lives.
        let t = Instant::now();
        let mut b = book(t);
        let orphaned = other("pod-o", 0);
        let recs = vec![entry("o1", "/tf/o", orphaned.clone(), T0)];
        let scan = |at: Instant| {
            let mut tab = table(at, recs.clone(), vec![beat(orphaned.clone(), 4, T0)]);
            tab.held = vec![orphaned.key()];
            tab
        };
        b.on_completion(opened(t, scan(t)), t);
        let later = t + TTL * 2;
        b.on_completion(Completion::Table(scan(later)), later);
        assert!(!b.needs_recovery(Path::new("/tf/o"), later));
        assert_eq!(b.dead_records(later), 0);
        // Negative case: the same watch without the kernel's word is dead.
        let mut b = book(t);
        let plain = |at: Instant| table(at, recs.clone(), vec![beat(orphaned.clone(), 4, T0)]);
        b.on_completion(opened(t, plain(t)), t);
        b.on_completion(Completion::Table(plain(later)), later);
        assert!(b.needs_recovery(Path::new("/tf/o"), later));
        assert_eq!(b.dead_records(later), 1);
    }

    #[test]
    fn another_live_incarnation_of_our_name_is_reported_once_and_its_records_stay_alive() {
        let t = Instant::now();
        let mut b = open_book(t);
        let twin = other("pod-a", 5);
        let recs = vec![entry("t1", "/tf/t", twin.clone(), T0)];
        let mut ev = Vec::new();
        for i in 0..6u64 {
            let at = t + TTL / 3 * (i as u32);
            ev.extend(b.on_completion(
                Completion::Table(table(at, recs.clone(), vec![beat(twin.clone(), i, T0)])),
                at,
            ));
            assert!(
                i == 0 || !b.needs_recovery(Path::new("/tf/t"), at),
                "the twin's beats change: alive"
            );
        }
        let said: Vec<String> = logs(&ev)
            .into_iter()
            .filter(|m| m.contains("another tfinit is using owner name pod-a"))
            .collect();
        assert_eq!(said.len(), 1, "{ev:?}");
    }

    #[test]
    fn a_recovery_waits_for_end_markings_and_its_rescan() {
        let t = Instant::now();
        let mut b = open_book(t);
        recorded(&mut b, RunId::from(1), "p1", t);
        let w = Path::new("/tf/x");
        assert!(b.may_recover(w));
        let end = Ended {
            ms: T0,
            how: "killed by SIGKILL".into(),
        };
        let req = b.exited(RunId::from(1), Some(end.clone()), vec!["a".into()]);
        assert_eq!(
            req,
            Some(Request::End {
                run: RunId::from(1),
                ended: end,
                in_progress: vec!["a".into()]
            })
        );
        assert!(!b.may_recover(w), "the end-marking is still queued");
        assert!(b.may_recover(Path::new("/tf/other")));
        assert!(
            b.needs_recovery(w, t),
            "an end-marking on its way makes the directory need a recovery, which waits for it"
        );
        let t1 = t + Duration::from_secs(1);
        b.on_completion(
            Completion::Ended {
                run: RunId::from(1),
                result: Ok(()),
            },
            t1,
        );
        assert!(b.may_recover(w));
        // The ended record counts before any rescan shows it.
        assert!(b.needs_recovery(w, t));
        let t2 = t1 + Duration::from_secs(1);
        assert_eq!(b.recovery_done(w, t2), Request::Rescan);
        assert!(
            !b.needs_recovery(w, t),
            "resolved until the rescan says otherwise"
        );
        // A table scanned before the recovery ended does not bring the record back...
        b.on_completion(Completion::Table(table(t1, vec![], vec![])), t2);
        assert!(!b.needs_recovery(w, t));
        // ...one scanned after it tells the truth: the record is still there (recovery failed).
        let mut left = entry("p1", "/tf/x", me(), T0);
        left.facts.ended = Some(Ended {
            ms: T0,
            how: "killed by SIGKILL".into(),
        });
        b.on_completion(
            Completion::Table(table(t2 + Duration::from_millis(1), vec![left], vec![])),
            t2,
        );
        assert!(b.needs_recovery(w, t));
    }

    #[test]
    fn a_refused_recording_run_removes_its_late_record_and_a_removal_hides_it() {
        let t = Instant::now();
        let mut b = open_book(t);
        begin(&mut b, RunId::from(1), t);
        // Shutdown refuses the run while its create is in flight.
        assert_eq!(
            b.exited(RunId::from(1), None, vec![]),
            Some(Request::Remove {
                run: RunId::from(1)
            })
        );
        assert_eq!(b.record(RunId::from(1)), None);
        assert!(b.live_runs().is_empty());
        // The create lands late: nothing starts; the removal queued behind it is tracked.
        let ev = b.on_completion(
            Completion::Created {
                run: RunId::from(1),
                result: Ok("p1".into()),
            },
            t,
        );
        assert!(ev.is_empty(), "{ev:?}");
        assert!(!b.may_recover(Path::new("/tf/x")));
        let t1 = t + Duration::from_secs(1);
        b.on_completion(
            Completion::Removed {
                run: RunId::from(1),
                result: Ok(()),
            },
            t1,
        );
        assert!(b.may_recover(Path::new("/tf/x")));
        // A table scanned before the removal still lists it: the removal wins.
        let mut stale = entry("p1", "/tf/x", me(), T0);
        stale.facts.ended = Some(Ended {
            ms: T0,
            how: "x".into(),
        });
        b.on_completion(Completion::Table(table(t, vec![stale], vec![])), t1);
        assert!(!b.needs_recovery(Path::new("/tf/x"), t));
    }

    #[test]
    fn live_runs_carry_the_who_terraform_will_write() {
        let t = Instant::now();
        let mut b = book(t);
        let env = vec![
            "USER=bob".to_string(),
            "HOME=/home/bob".to_string(),
            "X=1".to_string(),
        ];
        b.begin(
            &new_run(RunId::from(1), Path::new("/tf/x"), "staging", &env),
            t,
            None,
        );
        b.begin(
            &new_run(RunId::from(2), Path::new("/tf/y"), "default", &[]),
            t,
            None,
        );
        let who: Vec<String> = b.live_runs().into_iter().map(|r| r.who).collect();
        assert_eq!(who, ["bob@pod-a", "@pod-a"]);
        b.on_completion(
            Completion::Opened {
                result: Ok(()),
                table: Some(table(t, vec![], vec![])),
                passwd_user: Some("app".into()),
                beat: Some(t),
                lock: None,
            },
            t,
        );
        let runs = b.live_runs();
        assert_eq!(runs[0].who, "app@pod-a");
        assert_eq!(runs[0].workspace, "staging");
        assert_eq!(runs[1].workdir, Path::new("/tf/y"));
    }

    #[test]
    fn an_end_marking_on_its_way_already_makes_its_directory_need_a_recovery() {
        let now = Instant::now();
        let mut b = open_book(now);
        let wd = Path::new("/tf/a");
        assert!(matches!(
            b.begin(&new_run(RunId::from(1), wd, "default", &[]), now, None),
            Start::Record { .. }
        ));
        b.on_completion(
            Completion::Created {
                run: RunId::from(1),
                result: Ok(PathBuf::from("/s/records/r1.json")),
            },
            now,
        );
        assert!(
            !b.needs_recovery(wd, now),
            "a live run's record is not a dead one"
        );
        let ended = Ended {
            ms: 1,
            how: "killed by SIGKILL".into(),
        };
        assert!(matches!(
            b.exited(RunId::from(1), Some(ended), vec![]),
            Some(Request::End { .. })
        ));
        assert!(b.needs_recovery(wd, now), "the end-marking is queued");
        assert!(!b.may_recover(wd), "but the recovery waits for it");
        assert!(
            !b.needs_recovery(Path::new("/tf/b"), now),
            "other directories are not concerned"
        );
    }

    #[test]
    fn locking_runs_are_stopped_then_killed_before_any_observer_may_call_us_dead() {
        let t = Instant::now();
        let mut b = open_book(t);
        recorded(&mut b, RunId::from(1), "p1", t);
        // An unrecorded run is nobody's concern.
        b.on_completion(
            Completion::Created {
                run: RunId::from(2),
                result: Err(WriteError::Volume("x".into())),
            },
            t,
        );
        let stop_at = t + TTL * 2 / 3;
        let kill_at = t + TTL - TTL / 10;
        assert_eq!(b.next_wakeup().map(|w| w <= stop_at), Some(true));
        assert!(!b
            .tick(stop_at - Duration::from_millis(1))
            .iter()
            .any(|e| matches!(e, Event::Fence { .. })));
        let ev = b.tick(stop_at);
        assert!(
            ev.contains(&Event::Fence {
                runs: vec![RunId::from(1)],
                kill: false
            }),
            "{ev:?}"
        );
        assert!(
            !b.tick(stop_at)
                .iter()
                .any(|e| matches!(e, Event::Fence { .. })),
            "once"
        );
        assert_eq!(b.fence_stage(), FenceStage::Stopping);
        // No new record while the fence is up, and no state-locking run may start at all: its
        // lock would carry this owner's Who (the simulation's seed 1094 found an unrecorded
        // run's lock released by a pod that took this owner for dead).
        assert!(matches!(
            begin(&mut b, RunId::from(3), stop_at),
            Start::Unrecorded(Some(_))
        ));
        assert_eq!(b.may_launch(RunId::from(3)), Launch::Fenced);
        assert_eq!(
            b.may_launch(RunId::from(9)),
            Launch::Yes,
            "a run that takes no lock may"
        );
        assert_eq!(b.next_wakeup().map(|w| w <= kill_at), Some(true));
        let ev = b.tick(kill_at);
        assert!(
            ev.contains(&Event::Fence {
                runs: vec![RunId::from(1), RunId::from(3)],
                kill: true
            }),
            "every state-locking run, recorded or not: {ev:?}"
        );
        assert!(b
            .fence_notice(&[RunId::from(1)], true, kill_at)
            .message()
            .contains("SIGKILLed"));
        // A heartbeat lands: clear again, records resume.
        b.on_completion(
            Completion::Heartbeat {
                result: Ok(()),
                stamped: kill_at,
                wall_ms: T0,
            },
            kill_at,
        );
        assert_eq!(b.fence_stage(), FenceStage::Clear);
        assert!(matches!(
            begin(&mut b, RunId::from(4), kill_at),
            Start::Record { .. }
        ));
    }

    #[test]
    fn the_heartbeats_age_counts_from_its_write_not_from_the_open_that_reported_it() {
        // The open wrote the heartbeat at t, then swept and scanned for a TTL/2 on a slow
        // volume: the heartbeat is already half a TTL old when the loop hears of it.
        let t = Instant::now();
        let mut b = book(t);
        let reported = t + TTL / 2 + Duration::from_millis(1);
        b.on_completion(opened(t, table(t, vec![], vec![])), reported);
        assert_eq!(b.heartbeat_age(reported), Some(reported - t));
        assert!(b.heartbeat_stale(reported), "no record lands under it");
        assert!(matches!(
            begin(&mut b, RunId::from(1), reported),
            Start::Unrecorded(Some(_))
        ));
    }
}
