//! Recovery of state locks left by dead runs: probe, decide, and force-unlock only what is
//! provably the dead run's. Runs as its own process (the init's hidden `__recover` helper, or
//! `tfinit recover` by hand), so the init's loop never waits on terraform or the network. One
//! recovery at a time per state directory (flock on `recover.lock`), so two pods never race to
//! unlock the same lock (terraform's s3 Unlock reads, compares, then deletes unconditionally).
//!
//! Decision for each record whose run is over (owner dead, or terraform seen dying), in the
//! record's working directory and workspace (docs/records.md has the full table):
//! | backend                       | probe says              | action                                   |
//! |-------------------------------|-------------------------|------------------------------------------|
//! | not initialised (no data dir) | -                       | cannot tell: keep the record             |
//! | local, pg (locks die with us) | -                       | remove the record                        |
//! | consul, http, other           | - (never probed)        | warn: release by hand; record set aside  |
//! | s3, kubernetes, azurerm, gcs  | free                    | remove the record                        |
//! |                               | held, Who equal, Created inside the run's life, no live run with that Who here | force-unlock; warn with orphan candidates |
//! |                               | held, and a live run here has the same Who | leave the lock; keep the record |
//! |                               | held by anyone else     | leave the lock; remove the record        |
//! |                               | held by the dead run, state missing (`Failed to load state`) | needs a person: no unlock (it cannot work), one error with the command that releases it; record kept, marked `needs_person` |
//! |                               | cannot tell             | leave everything; try again next run     |
//!
//! kubernetes: a NotFound of the lock's own Lease (deleted by hand) is "free"; a missing namespace,
//! Forbidden, an unreachable server stay "cannot tell". A `needs_person` record is skipped by the
//! automatic recovery of the incarnation that reported it; `tfinit recover` probes it again.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::labels::UnlockOutcome;
use super::liveness::{
    self, last_alive_ms, run_state, Facts, Observer, RunState, Seen, Token, Verdict,
};
use super::lockinfo::{self, LockInfo, Probe};
use super::record::{self, Found, Heartbeat, NeedsPerson, Owner, Record};
use super::state::{self, StateOf};
use super::store::{self, Aside, Store};
use super::who::who_host;
use super::workspace::data_dir;
use crate::duration::fmt_duration;
use crate::mutation::{self, Guard};

/// The init's hidden subcommand that recovers one working directory.
pub const HIDDEN_SUBCOMMAND: &str = "__recover";

/// How far two nodes' clocks may disagree: Created may precede the record's start, or follow the
/// owner's last sign of life, by this much (terraform takes the lock after tfinit writes the
/// record, so on one node Created is always later than the start).
pub const CLOCK_SKEW: Duration = Duration::from_secs(60);

/// How long one terraform probe or unlock may take.
const TERRAFORM_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a recovery waits for another one in the same state directory.
const LOCK_WAIT: Duration = Duration::from_secs(250);

/// What happened to one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Its run may still be going: untouched.
    OwnerAlive,
    /// The backend's lock dies with its process (local, pg): record removed.
    NothingToRelease(String),
    /// The backend cannot be probed safely: lock untouched, record set aside (`*.manual`).
    Unsupported(String),
    /// The lock is free: record removed.
    Free,
    /// The dead run's lock was released (or would be, in a dry run): record removed.
    Unlocked(LockInfo),
    /// Somebody else holds the lock (the reason says why it is not the dead run's): untouched,
    /// record removed.
    HeldByOther(LockInfo, String),
    /// The lock may be the dead run's or a live run's with the same Who: untouched, record kept.
    Ambiguous(LockInfo, String),
    /// The probe could not tell: nothing touched, record kept.
    Unknown(String),
    /// The probe's answer is in a wording tfinit does not know (lockinfo::Probe::Unknown): as
    /// [`Outcome::Unknown`], and the init says it once per record and counts it.
    UnknownWording(String),
    /// The unlock itself failed: record kept.
    UnlockFailed(String),
    /// The dead run holds the lock but terraform cannot load the state (it is missing), so no
    /// force-unlock can release it: a person must run the command. Record kept, marked.
    NeedsPerson(LockInfo, String),
    /// A person was already told, by this incarnation, how to release this record's lock:
    /// automatic recovery leaves it alone and says nothing more.
    WaitingForPerson,
}

impl Outcome {
    /// Its name in `tfinit_force_unlocks_total{outcome}`; None for a record left alone without a
    /// decision (a person was told already).
    pub fn label(&self) -> Option<UnlockOutcome> {
        Some(match self {
            Outcome::OwnerAlive => UnlockOutcome::OwnerAlive,
            Outcome::NothingToRelease(_) => UnlockOutcome::NothingToRelease,
            Outcome::Unsupported(_) => UnlockOutcome::Unsupported,
            Outcome::Free => UnlockOutcome::Free,
            Outcome::Unlocked(_) => UnlockOutcome::Unlocked,
            Outcome::HeldByOther(..) => UnlockOutcome::HeldByOther,
            Outcome::Ambiguous(..) => UnlockOutcome::Ambiguous,
            Outcome::Unknown(_) | Outcome::UnknownWording(_) => UnlockOutcome::Unknown,
            Outcome::UnlockFailed(_) => UnlockOutcome::UnlockFailed,
            Outcome::NeedsPerson(..) => UnlockOutcome::NeedsPerson,
            Outcome::WaitingForPerson => return None,
        })
    }
}

/// What a recovery helper tells the init of one record it decided on: one JSON line each, on the
/// pipe the init gave it (`TFINIT_REPORT_FD`), for the metrics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelperReport {
    /// The working directory's backend type (`s3`, `kubernetes`, ...; `other` when unknown).
    pub backend: String,
    /// [`Outcome::label`]'s text ([`UnlockOutcome::label`]).
    pub outcome: String,
    /// Resources the dead run had in progress (orphan candidates).
    pub orphans: u64,
    /// Set when the probe answered in a wording tfinit does not know ([`Outcome::UnknownWording`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unknown_wording: Option<UnknownWording>,
}

/// A probe's answer in a wording tfinit does not know, and the record it was about: what the init
/// says once per record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnknownWording {
    /// The record's file.
    pub record: String,
    /// The record's working directory.
    pub workdir: String,
    /// The answer's first line.
    pub said: String,
}

/// The variable that names the helper's report pipe (a descriptor number it inherited).
pub const REPORT_FD_VAR: &str = "TFINIT_REPORT_FD";

/// What the state directory proves about when a dead run could have taken its lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// A lock created earlier (ms since the epoch) is not the run's.
    pub not_before_ms: u64,
    /// A lock created later is not the run's.
    pub not_after_ms: u64,
    /// A live run that may lock the same state (locks::state, whatever directory it works in)
    /// and whose lock would carry the same Who.
    pub live_same_who: Option<String>,
}

/// Whether to force-unlock a lock held as `info`, for the dead run of `rec`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Every check passed.
    Unlock,
    /// Provably not the dead run's lock.
    NotOurs(String),
    /// Could be the dead run's, could be a live one's.
    Ambiguous(String),
}

/// A tfinit that may be alive (`alive` says so of each heartbeat's incarnation) and runs
/// terraform on the host that lock Who `who` names, other than `me`: its runs lock as that Who
/// whether they have records or not, so such a lock may be one of theirs.
pub fn live_on_host<'a>(
    who: &str,
    me: &Owner,
    beats: impl IntoIterator<Item = &'a Heartbeat>,
    mut alive: impl FnMut(&Heartbeat) -> bool,
) -> Option<String> {
    let host = who_host(who);
    if !mutation::on(Guard::LiveOnHost) {
        return None;
    }
    beats
        .into_iter()
        .filter(|hb| !hb.host.is_empty() && hb.host == host)
        .filter(|hb| !hb.owner.same_incarnation(me))
        .find(|hb| alive(hb))
        .map(|hb| {
            format!(
                "tfinit {} (incarnation {}) may be alive on host {host}, and its runs lock as {who}",
                hb.owner.name,
                hb.owner.incarnation()
            )
        })
}

/// Decides on the evidence alone (no I/O), so every rule is unit-tested. The lock is the dead
/// run's only if terraform wrote exactly the run's Who, created it while the run could have, its id
/// is a plain lock id, and no live run here could have written the same Who.
pub fn decide(rec: &Record, info: &LockInfo, w: &Window) -> Decision {
    if info.who != rec.who {
        return Decision::NotOurs(format!(
            "its Who {:?} is not the dead run's {:?}",
            info.who, rec.who
        ));
    }
    let Some(created) = info.created_ms else {
        return Decision::Ambiguous(format!("its Created {:?} cannot be read", info.created));
    };
    if created < w.not_before_ms {
        return Decision::NotOurs(format!(
            "it was created {}s before the dead run started (allowing {}s of clock skew)",
            (rec.started_ms.saturating_sub(created)) / 1000,
            CLOCK_SKEW.as_secs()
        ));
    }
    if created > w.not_after_ms {
        return Decision::NotOurs(format!(
            "it was created {}s after the dead run's owner was last known alive (allowing {}s of clock skew)",
            (created - w.not_after_ms + CLOCK_SKEW.as_millis() as u64) / 1000,
            CLOCK_SKEW.as_secs()
        ));
    }
    if !lockinfo::plain_id(&info.id) {
        return Decision::Ambiguous(format!("its ID {:?} is not a plain lock id", info.id));
    }
    if let Some(live) = &w.live_same_who {
        return Decision::Ambiguous(format!(
            "a live run here ({live}) has the same Who, so the lock may be that run's"
        ));
    }
    Decision::Unlock
}

/// Logs at warn what a recovery did with the record of [`Report`] `$r`, with the record's every
/// field, then (after `lock`) the lock's fields, then the outcome's own fields and message.
macro_rules! warn_record {
    ($r:expr, lock $i:expr, $($field:tt)*) => {
        warn_record!(
            $r, lock_id = %$i.id, lock_path = %$i.path, operation = %$i.operation, who = %$i.who,
            version = %$i.version, created = %$i.created, $($field)*
        )
    };
    ($r:expr, $($field:tt)*) => {
        tracing::warn!(
            record = %$r.path.display(), run = %$r.rec.run_id, owner = %$r.rec.owner.name,
            incarnation = %$r.rec.owner.incarnation(), pod_uid = ?$r.rec.owner.pod_uid,
            expected_who = %$r.rec.who, workdir = %$r.rec.workdir, workspace = %$r.rec.workspace,
            subcommand = %$r.rec.subcommand, argv = ?$r.rec.argv, started_ms = $r.rec.started_ms,
            ended = ?$r.rec.ended, orphan_candidates = ?$r.rec.in_progress, dry_run = $r.dry_run,
            $($field)*
        )
    };
}

/// The sentence naming the resources a dead run may have left outside the state, if any.
fn orphan_hint(orphans: &[String]) -> String {
    if orphans.is_empty() {
        return String::new();
    }
    format!(
        ". Resources that may exist outside the state (their create, update or destroy started and never completed): check them and import or delete: {}",
        orphans.join(", ")
    )
}

/// One record's outcome, to log: which run is over and why (`base`), and the orphan candidates
/// it may have left (`hint`).
struct Report<'a> {
    base: String,
    hint: String,
    path: &'a Path,
    rec: &'a Record,
    dry_run: bool,
}

impl Report<'_> {
    /// The lock was probed: the dead run's (unlocked), someone else's, or either.
    fn lock(&self, i: &LockInfo, outcome: &Outcome) {
        let (base, hint) = (&self.base, &self.hint);
        match outcome {
            Outcome::Unlocked(_) => warn_record!(
                self, lock i, info = %i.info,
                "{base}: {} its state lock {} (Who {}, Created {}){hint}",
                if self.dry_run { "would force-unlock" } else { "force-unlocked" },
                i.id, i.who, i.created
            ),
            Outcome::HeldByOther(_, why) => warn_record!(
                self, lock i,
                "{base}: the state lock is not the dead run's ({why}): left alone{hint}"
            ),
            Outcome::Ambiguous(_, why) => warn_record!(
                self, lock i,
                "{base}: the state lock may not be the dead run's ({why}): left alone, record kept{hint}"
            ),
            _ => {}
        }
    }

    /// Nothing was at stake (no orphan candidates): the lock is free, or ends with its process
    /// (`backend`).
    fn released(&self, backend: Option<&str>) {
        let (base, path) = (&self.base, self.path.display());
        match backend {
            None => {
                tracing::info!(record = %path, "{base}: the state lock is free; record removed")
            }
            Some(b) => tracing::info!(
                record = %path, backend = %b,
                "{base}: the {b} backend's lock ends with its process; record removed"
            ),
        }
    }

    /// Records removed with orphan candidates, set aside for a person, or left as they were.
    fn untouched(&self, outcome: &Outcome) {
        let (base, hint) = (&self.base, &self.hint);
        match outcome {
            Outcome::Free => {
                warn_record!(self, "{base}: the state lock is free; record removed{hint}")
            }
            Outcome::NothingToRelease(b) => warn_record!(
                self, backend = %b,
                "{base}: the {b} backend's lock ends with its process; record removed{hint}"
            ),
            Outcome::Unsupported(b) => warn_record!(
                self, backend = %b,
                "{base}: automatic recovery is not supported for the {b} backend (its force-unlock deletes any lock, whoever holds it); if terraform reports the lock held by {}, release it by hand with `terraform force-unlock`; record renamed to *.manual{hint}",
                self.rec.who
            ),
            Outcome::Unknown(msg) => warn_record!(
                self, probe = %msg,
                "{base}: could not read the state lock; nothing touched, will try again before the next run"
            ),
            Outcome::UnknownWording(msg) => warn_record!(
                self, probe = %msg,
                "{base}: terraform answered the lock probe in a wording this tfinit does not know, so it cannot tell whether the lock is free; nothing touched, record kept. Upgrade tfinit, or report the wording with your terraform version"
            ),
            Outcome::UnlockFailed(msg) => warn_record!(
                self, error = %msg,
                "{base}: force-unlock failed; record kept, will try again before the next run"
            ),
            _ => {}
        }
    }

    /// The dead run holds the lock, and only a person can release it.
    fn needs_person(&self, i: &LockInfo, command: &str) {
        let (base, hint, rec) = (&self.base, &self.hint, self.rec);
        tracing::error!(
            record = %self.path.display(), run = %rec.run_id, owner = %rec.owner.name,
            incarnation = %rec.owner.incarnation(), expected_who = %rec.who,
            workdir = %rec.workdir, workspace = %rec.workspace, subcommand = %rec.subcommand,
            lock_id = %i.id, lock_path = %i.path, operation = %i.operation, who = %i.who,
            created = %i.created, command = %command, dry_run = self.dry_run,
            "{base}: the dead run holds the state lock {} (Who {}, Operation {}, Created {}) but terraform cannot load workspace {}'s state, which does not exist (the run died between taking the lock and writing the first state, or the state was deleted), so no force-unlock can release it: a person must. Release it with: {command} ; then run `tfinit recover`. Workspace {} has no state: if the run created resources, restore the state or import them before the next apply creates them again. Record kept (needs_person){hint}",
            i.id, i.who, i.operation, i.created, rec.workspace, rec.workspace
        )
    }
}

/// One recovery pass.
pub struct Recovery {
    /// The state directory.
    pub store: Box<dyn Store>,
    /// The live incarnation of this owner (its running records are never recovered).
    pub me: Owner,
    /// This observer's TFINIT_OWNER_TTL (an owner is judged by its own when that is longer).
    pub ttl: Duration,
    /// TFINIT_OLDER_OWNER_TTL: what an owner whose heartbeat states no TTL is judged by.
    pub older_ttl: Duration,
    /// The real terraform.
    pub terraform: PathBuf,
    /// Report only.
    pub dry_run: bool,
    /// The init's live state-locking runs, recorded or not (empty for `tfinit recover`): a
    /// lock with one's Who on a state it may lock may be that run's.
    pub live: Vec<super::book::LiveRun>,
    /// The init's own recovery before a run (not `tfinit recover` by hand): it skips the records
    /// it already reported as needing a person.
    pub automatic: bool,
    /// What the init has seen of other incarnations' heartbeats (empty for `tfinit recover`,
    /// which watches them itself for one TTL before it can call any of them dead).
    pub seen: Vec<Seen>,
}

/// How often a recovery re-reads a heartbeat it is watching.
const WATCH_EVERY: Duration = Duration::from_millis(500);

impl Recovery {
    /// Recovers every record whose run is over (in `only` when given). Corrupt records are set
    /// aside with a warning (not in a dry run); files left alone are named in a warning. Returns each record's outcome; an error when the
    /// state directory's recovery lock cannot be taken (a dry run takes none).
    pub fn run(&self, only: Option<&Path>) -> Result<Vec<(PathBuf, Box<Record>, Outcome)>, String> {
        let mut observer =
            Observer::import(self.ttl, self.older_ttl, &self.seen, liveness::instant_of);
        let only = only.map(|d| (d, fs::canonicalize(d).ok()));
        let only = only.as_ref();
        // Watching first, without the state directory's recovery lock: a pod that just came up
        // watches another's heartbeat for a TTL before it can call it dead, and other pods'
        // recoveries need not wait for that.
        let listed: Vec<Record> = self
            .store
            .list()
            .into_iter()
            .filter_map(|f| match f {
                Found::Record(_, r) if only.is_none_or(|d| same_dir(d, &r.workdir)) => Some(*r),
                _ => None,
            })
            .collect();
        self.watch(&mut observer, &listed);
        // A dry run changes nothing, so it needs no exclusivity (and works on a read-only view).
        let _lock = if self.dry_run || !mutation::on(Guard::RecoverLock) {
            None
        } else {
            Some(self.store.lock_recovery(LOCK_WAIT).map_err(|e| {
                format!(
                    "the lock recovery in {} cannot start: {e}",
                    self.store.location()
                )
            })?)
        };
        let found = self.store.list();
        let records: Vec<(PathBuf, Record)> = found
            .iter()
            .filter_map(|f| match f {
                Found::Record(p, r) => Some((p.clone(), (**r).clone())),
                _ => None,
            })
            .collect();
        let mut out = Vec::new();
        for f in found {
            match f {
                Found::Corrupt(path, problem) => {
                    if self.dry_run {
                        tracing::warn!(file = %path.display(), problem = %problem, "lock-owner record cannot be read (dry run: left in place)");
                    } else {
                        store::set_aside_corrupt(&*self.store, &path, &problem);
                    }
                }
                Found::Unreadable(path, e) => store::warn_unreadable(&path, &e),
                Found::LeftAlone(path, why) => store::warn_left_alone(&path, &why),
                Found::Future(path, v) => tracing::warn!(
                    file = %path.display(), version = v, this_version = record::FORMAT,
                    "lock-owner record of a newer tfinit format is left alone; upgrade this tfinit"
                ),
                Found::Record(path, rec) => {
                    if only.is_some_and(|d| !same_dir(d, &rec.workdir)) {
                        continue;
                    }
                    let outcome = self.one(&mut observer, &path, &rec, &records);
                    out.push((path, rec, outcome));
                }
            }
        }
        Ok(out)
    }

    /// Watches the heartbeats of the owners of `records` until each is alive (changed) or dead
    /// (unchanged for a TTL), or proven gone by the kernel; and so those of the tfinits on the
    /// hosts the records' `Who` names, which [`live_on_host`] asks about (one that died shortly
    /// before would otherwise stay "may be alive" and keep a dead run's lock for good). Says once
    /// what it waits for.
    fn watch(&self, observer: &mut Observer, records: &[Record]) {
        let mut owners: Vec<Owner> = Vec::new();
        let mut add = |o: &Owner| {
            if !o.same_incarnation(&self.me) && !owners.iter().any(|x| x.same_incarnation(o)) {
                owners.push(o.clone());
            }
        };
        for r in records.iter().filter(|r| r.ended.is_none()) {
            add(&r.owner);
            observer.stated(&r.owner.key(), r.owner_ttl());
        }
        let hosts: Vec<&str> = records.iter().map(|r| who_host(&r.who)).collect();
        for hb in self.store.heartbeats() {
            if !hb.host.is_empty() && hosts.contains(&hb.host.as_str()) {
                add(&hb.owner);
            }
        }
        let mut said = false;
        let mut older_said: Vec<String> = Vec::new();
        loop {
            let now = Instant::now();
            let mut longest = Duration::ZERO;
            for o in &owners {
                if self.kernel(o).is_some() {
                    continue;
                }
                self.read_beat(observer, o);
                // An older tfinit states no TTL: it is judged by TFINIT_OLDER_OWNER_TTL, a year by
                // default, which no run waits for. Its record stays until it is decided.
                let key = o.key();
                if !observer.knows_ttl(&key) && observer.older() > self.ttl {
                    if !older_said.contains(&key) {
                        older_said.push(key.clone());
                        tracing::warn!(
                            owner = %o.name, incarnation = %o.incarnation(),
                            older_owner_ttl_seconds = observer.older().as_secs_f64(),
                            "owner {} (incarnation {}) is a tfinit older than record format 4, whose heartbeat does not say its TFINIT_OWNER_TTL: its runs count as alive until its heartbeat has not changed for TFINIT_OLDER_OWNER_TTL ({}); if every older pod ran with a TTL of at most D, set TFINIT_OLDER_OWNER_TTL=D (here, or for `tfinit recover`) to let its dead runs' locks be released after D",
                            o.name, o.incarnation(), fmt_duration(observer.older())
                        );
                    }
                    continue;
                }
                if let Verdict::Watching { left } = observer.verdict(&key, Instant::now()) {
                    longest = longest.max(left);
                    if !said {
                        said = true;
                        let ttl = observer.judging_ttl(&key);
                        tracing::info!(
                            owner = %o.name, incarnation = %o.incarnation(),
                            ttl_seconds = ttl.as_secs_f64(), left_seconds = left.as_secs_f64(),
                            "waiting up to {:.1}s to tell whether owner {} (incarnation {}) is alive: its heartbeat must be watched unchanged for its TFINIT_OWNER_TTL ({}, or this pod's own when longer) on this pod's own clock before its lock may be released (a pod that just came up watches for one TTL)",
                            left.as_secs_f64(), o.name, o.incarnation(), fmt_duration(ttl)
                        );
                    }
                }
            }
            if longest.is_zero() {
                return;
            }
            std::thread::sleep(WATCH_EVERY.min(longest).saturating_sub(now.elapsed()));
        }
    }

    /// One read of `owner`'s heartbeat, fed to `observer`.
    fn read_beat(&self, observer: &mut Observer, owner: &Owner) {
        let started = Instant::now();
        let token = self.store.read_heartbeat(owner).map(|h| Token::of(&h));
        observer.saw(&owner.key(), token, started, Instant::now());
    }

    /// What the kernel says of `owner`'s lock file when it ran on this kernel and its heartbeat
    /// names the file it held: Some(true) every process of it is gone, Some(false) one still
    /// holds it (alive).
    fn kernel(&self, owner: &Owner) -> Option<bool> {
        let hb = self.store.read_heartbeat(owner);
        self.store.kernel_proof(&self.me, owner, hb.as_ref())
    }

    /// Whether `rec`'s run is over, with a fresh read of its owner's heartbeat.
    fn state_now(&self, observer: &mut Observer, rec: &Record) -> RunState {
        let facts = Facts::of(rec);
        observer.stated(&rec.owner.key(), facts.ttl);
        if facts.ended.is_some() || rec.owner.same_incarnation(&self.me) {
            return run_state(&self.me, &facts, None, Verdict::Alive);
        }
        let kernel = self.kernel(&rec.owner);
        if kernel.is_none() {
            self.read_beat(observer, &rec.owner);
        }
        let verdict = observer.verdict(&rec.owner.key(), Instant::now());
        run_state(&self.me, &facts, kernel, verdict)
    }

    fn one(
        &self,
        observer: &mut Observer,
        path: &Path,
        rec: &Record,
        all: &[(PathBuf, Record)],
    ) -> Outcome {
        let RunState::Over(why_dead) = self.state_now(observer, rec) else {
            return Outcome::OwnerAlive;
        };
        if self.automatic
            && Facts::of(rec).needs_person_by.as_deref() == Some(self.me.incarnation().as_str())
        {
            return Outcome::WaitingForPerson;
        }
        let workdir = Path::new(&rec.workdir);
        let data_dir = record_data_dir(rec);
        let backend = backend_type_in(&data_dir);
        let outcome = match backend.as_deref() {
            // Not initialised (yet: a new pod's first `init`, recorded and so recovered before it
            // runs, in a fresh working directory): the backend is unknown, not local.
            None if !data_dir.is_dir() => Outcome::Unknown(format!(
                "{} is not initialised ({} does not exist): its backend is unknown until `terraform init` runs there",
                workdir.display(),
                data_dir.display()
            )),
            None | Some("local") | Some("pg") => {
                Outcome::NothingToRelease(backend.unwrap_or_else(|| "local".into()))
            }
            Some(b) if !lockinfo::probe_safe(b) => Outcome::Unsupported(b.to_string()),
            Some(b) => self.probe_and_decide(observer, b, path, rec, all),
        };
        self.report(path, rec, &why_dead, &outcome);
        if !self.dry_run {
            match &outcome {
                Outcome::NeedsPerson(info, command) => {
                    let mut marked = rec.clone();
                    marked.needs_person = Some(NeedsPerson {
                        reported_by: self.me.incarnation(),
                        ms: record::now_ms(),
                        lock_id: info.id.clone(),
                        command: command.clone(),
                    });
                    if let Err(e) = self.store.write(&marked).map(|_| ()) {
                        tracing::warn!(record = %path.display(), error = %e, "cannot mark the record as needing a person; it will be reported again before the next run");
                    }
                }
                Outcome::Unlocked(_)
                | Outcome::HeldByOther(..)
                | Outcome::Free
                | Outcome::NothingToRelease(_) => {
                    if let Err(e) = self.store.remove(path) {
                        tracing::warn!(record = %path.display(), error = %e, "cannot remove the record");
                    }
                }
                Outcome::Unsupported(_) => {
                    if let Err(e) = self.store.set_aside(path, &Aside::Manual) {
                        tracing::warn!(record = %path.display(), error = %e, "cannot set the record aside");
                    }
                }
                _ => {}
            }
        }
        outcome
    }

    /// Logs one outcome at warn (info when nothing was at stake), with the record's every field.
    fn report(&self, path: &Path, rec: &Record, why_dead: &str, outcome: &Outcome) {
        let r = Report {
            base: format!(
                "run {} of {} ({}) `terraform {}` in {} (workspace {}) started at {} ms is over: {why_dead}",
                rec.run_id,
                rec.owner.name,
                rec.owner.incarnation(),
                rec.argv.join(" "),
                rec.workdir,
                rec.workspace,
                rec.started_ms,
            ),
            hint: orphan_hint(&rec.in_progress),
            path,
            rec,
            dry_run: self.dry_run,
        };
        let quiet = rec.in_progress.is_empty();
        match outcome {
            Outcome::Unlocked(i) | Outcome::HeldByOther(i, _) | Outcome::Ambiguous(i, _) => {
                r.lock(i, outcome)
            }
            Outcome::Free if quiet => r.released(None),
            Outcome::NothingToRelease(b) if quiet => r.released(Some(b)),
            Outcome::NeedsPerson(i, command) => r.needs_person(i, command),
            Outcome::OwnerAlive | Outcome::WaitingForPerson => {}
            // The init says it, once per record (its helper runs before every run here).
            Outcome::UnknownWording(_) if self.automatic => {}
            _ => r.untouched(outcome),
        }
    }

    fn probe_and_decide(
        &self,
        observer: &mut Observer,
        backend: &str,
        path: &Path,
        rec: &Record,
        all: &[(PathBuf, Record)],
    ) -> Outcome {
        let workdir = Path::new(&rec.workdir);
        let data_dir = record_data_dir(rec);
        let config = backend_config_in(&data_dir).unwrap_or_default();
        let lease = (backend == "kubernetes").then(|| kubernetes_lease(&config, &rec.workspace).1);
        let probe = match run_terraform(
            &self.terraform,
            workdir,
            &data_dir,
            &rec.workspace,
            &["force-unlock", "-force", lockinfo::probe_id(backend)],
        ) {
            Ok((ok, output)) => lockinfo::parse_probe_of(backend, lease.as_deref(), ok, &output),
            Err(e) => return Outcome::Unknown(e),
        };
        let (info, state_missing) = match probe {
            Probe::Free => return Outcome::Free,
            Probe::Unreadable(m) => return Outcome::Unknown(m),
            Probe::Unknown(m) => return Outcome::UnknownWording(m),
            Probe::Held(info) => (info, false),
            Probe::HeldStateMissing(info) => (info, true),
        };
        match decide(rec, &info, &self.window(observer, path, rec, &info, all)) {
            Decision::NotOurs(why) => return Outcome::HeldByOther(info, why),
            Decision::Ambiguous(why) => return Outcome::Ambiguous(info, why),
            Decision::Unlock => {}
        }
        // terraform's force-unlock loads the state first, and loading a missing state takes the
        // lock to create it: with the lock held, that fails whatever the id.
        if state_missing {
            let command = release_command(backend, &config, &rec.workspace, &info);
            return Outcome::NeedsPerson(info, command);
        }
        if self.dry_run {
            return Outcome::Unlocked(info);
        }
        // Right before the unlock, everything again from the volume: the owner's heartbeat (a
        // beat since the probe makes it alive) and the records (a run that started here since,
        // with the same Who, makes the lock ambiguous). The init's live runs cannot have grown:
        // no state-locking run of the init starts while its recovery runs.
        if !matches!(self.state_now(observer, rec), RunState::Over(_)) {
            return Outcome::OwnerAlive;
        }
        let fresh: Vec<(PathBuf, Record)> = self
            .store
            .list()
            .into_iter()
            .filter_map(|f| match f {
                Found::Record(p, r) => Some((p, *r)),
                _ => None,
            })
            .collect();
        match decide(rec, &info, &self.window(observer, path, rec, &info, &fresh)) {
            Decision::NotOurs(why) => return Outcome::HeldByOther(info, why),
            Decision::Ambiguous(why) => return Outcome::Ambiguous(info, why),
            Decision::Unlock => {}
        }
        match run_terraform(
            &self.terraform,
            workdir,
            &data_dir,
            &rec.workspace,
            &["force-unlock", "-force", &info.id],
        ) {
            Ok((true, _)) => Outcome::Unlocked(info),
            Ok((false, output)) => Outcome::UnlockFailed(lockinfo::first_line(&output)),
            Err(e) => Outcome::UnlockFailed(e),
        }
    }
}

impl Recovery {
    /// What the state directory proves about when the dead run of `rec` could have taken the
    /// lock `info`, and whether a run that may be alive here would write the same Who.
    fn window(
        &self,
        observer: &mut Observer,
        path: &Path,
        rec: &Record,
        info: &LockInfo,
        all: &[(PathBuf, Record)],
    ) -> Window {
        let skew = CLOCK_SKEW.as_millis() as u64;
        let hb = self.store.read_heartbeat(&rec.owner);
        let state = record_state(rec);
        // Another run whose record is here, on a state that may be this one (whatever directory
        // it works in), with the same Who, that may be alive.
        let twin = all
            .iter()
            .filter(|(p, r)| p != path && r.who == info.who)
            .filter(|(_, r)| state::may_share(&state, &record_state(r)))
            .find(|(_, r)| !matches!(self.state_now(observer, r), RunState::Over(_)))
            .map(|(_, r)| format!("{} of {} in {}", r.run_id, r.owner.name, r.workdir));
        let beats = self.store.heartbeats();
        let on_host = live_on_host(&info.who, &self.me, &beats, |hb| {
            let facts = Facts {
                owner: hb.owner.clone(),
                updated_ms: hb.updated_ms,
                ended: None,
                needs_person_by: None,
                ttl: hb.owner_ttl(),
            };
            let kernel = self.kernel(&hb.owner);
            if kernel.is_none() {
                self.read_beat(observer, &hb.owner);
            }
            let verdict = observer.verdict(&hb.owner.key(), Instant::now());
            !matches!(
                run_state(&self.me, &facts, kernel, verdict),
                RunState::Over(_)
            )
        });
        // This init's own live runs with the same Who, on a state that may be this one, that
        // started before the lock was created (one that started later cannot hold it).
        let live = || {
            self.live
                .iter()
                .filter(|_| mutation::on(Guard::LiveRuns))
                .filter(|l| l.who == info.who)
                .filter(|l| {
                    info.created_ms
                        .is_none_or(|c| l.started_ms <= c.saturating_add(skew))
                })
                .find(|l| state::may_share(&state, &live_state(l)))
                .map(|l| {
                    format!(
                        "a run of {} in this init, in {} (workspace {})",
                        self.me.name,
                        l.workdir.display(),
                        l.workspace
                    )
                })
        };
        let judged_by = observer.judging_ttl(&rec.owner.key());
        Window {
            not_before_ms: rec.started_ms.saturating_sub(skew),
            not_after_ms: last_alive_ms(&Facts::of(rec), hb.as_ref(), judged_by)
                .saturating_add(skew),
            live_same_who: twin.or(on_host).or_else(live),
        }
    }
}

/// Whether the working directory `dir` (given with its resolved path) is `workdir`, by what it
/// is: the same text, or the same directory once symbolic links are resolved.
fn same_dir(dir: &(&Path, Option<PathBuf>), workdir: &str) -> bool {
    let (text, resolved) = dir;
    *text == Path::new(workdir)
        || resolved
            .as_ref()
            .is_some_and(|r| fs::canonicalize(workdir).is_ok_and(|w| w == *r))
}

/// The state `rec`'s run locks, as far as its working directory tells now.
fn record_state(rec: &Record) -> StateOf {
    if let Some(why) = state::unsure_reason(&rec.subcommand, &rec.argv, &[]) {
        return StateOf::Unsure(why);
    }
    let data_dir = rec.data_dir.as_deref().map(Path::new);
    state::read(Path::new(&rec.workdir), data_dir, &rec.workspace)
}

/// The state live run `l` locks, as far as its working directory tells now.
fn live_state(l: &super::book::LiveRun) -> StateOf {
    if let Some(why) = &l.unsure {
        return StateOf::Unsure(why.clone());
    }
    state::read(&l.workdir, l.data_dir.as_deref(), &l.workspace)
}

/// The data directory of the run of `rec`: the TF_DATA_DIR it recorded (format 4: none recorded
/// means it set none); for an older record, this helper's own (the run's environment).
fn record_data_dir(rec: &Record) -> PathBuf {
    match (&rec.data_dir, rec.v >= 4) {
        (Some(d), _) => PathBuf::from(d),
        (None, true) => data_dir(Path::new(&rec.workdir), None),
        (None, false) => run_data_dir(Path::new(&rec.workdir)),
    }
}

/// The backend type a working directory was initialised with (`.terraform/terraform.tfstate`,
/// or `$TF_DATA_DIR/terraform.tfstate`); None when not initialised or local.
pub fn backend_type(workdir: &Path) -> Option<String> {
    backend_type_in(&run_data_dir(workdir))
}

/// The backend type stored in data directory `data_dir`; None when not initialised or local.
fn backend_type_in(data_dir: &Path) -> Option<String> {
    let v = backend_file(data_dir)?;
    v.get("backend")?.get("type")?.as_str().map(str::to_string)
}

/// The backend configuration a working directory was initialised with (its `config` object, as
/// terraform stored it after merging -backend-config), when there is one.
pub fn backend_config(workdir: &Path) -> Option<serde_json::Value> {
    backend_config_in(&run_data_dir(workdir))
}

/// The backend configuration stored in data directory `data_dir`, when there is one.
fn backend_config_in(data_dir: &Path) -> Option<serde_json::Value> {
    let mut v = backend_file(data_dir)?;
    Some(v.get_mut("backend")?.get_mut("config")?.take())
}

/// The namespace and name of terraform's Lease for `workspace` on the kubernetes backend
/// (client.go: `lock-tfstate-<workspace>-<secret_suffix>`; the namespace defaults to
/// $KUBE_NAMESPACE, else `default`, as backend.go does).
pub fn kubernetes_lease(config: &serde_json::Value, workspace: &str) -> (String, String) {
    let text = |k: &str| {
        config
            .get(k)
            .and_then(|v| v.as_str())
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    let namespace = text("namespace")
        .or_else(|| {
            std::env::var("KUBE_NAMESPACE")
                .ok()
                .filter(|n| !n.is_empty())
        })
        .unwrap_or_else(|| "default".into());
    let suffix = text("secret_suffix").unwrap_or_default();
    (namespace, format!("lock-tfstate-{workspace}-{suffix}"))
}

/// The command a person runs to release `info`, a lock terraform cannot release because the
/// state is missing: for kubernetes, a merge patch that empties the Lease's holder and lock info
/// (what terraform's own Unlock does); for s3, a DynamoDB delete of exactly that lock item.
pub fn release_command(
    backend: &str,
    config: &serde_json::Value,
    workspace: &str,
    info: &LockInfo,
) -> String {
    match backend {
        "kubernetes" => {
            let (namespace, lease) = kubernetes_lease(config, workspace);
            let patch = serde_json::json!({
                "metadata": {"annotations": {"app.terraform.io/lock-info": null}},
                "spec": {"holderIdentity": null},
            });
            format!(
                "kubectl -n {} patch lease {} --type=merge -p {}",
                shell_quote(&namespace),
                shell_quote(&lease),
                shell_quote(&patch.to_string())
            )
        }
        "s3" => {
            let table = config
                .get("dynamodb_table")
                .and_then(|v| v.as_str())
                .unwrap_or("TABLE");
            let endpoint = config
                .get("dynamodb_endpoint")
                .and_then(|v| v.as_str())
                .filter(|e| !e.is_empty())
                .map(|e| format!(" --endpoint-url {}", shell_quote(e)))
                .unwrap_or_default();
            let key = serde_json::json!({"LockID": {"S": info.path}});
            let id = serde_json::json!({":id": {"S": info.id}});
            format!(
                "aws dynamodb delete-item{endpoint} --table-name {} --key {} --condition-expression 'contains(Info, :id)' --expression-attribute-values {}",
                shell_quote(table),
                shell_quote(&key.to_string()),
                shell_quote(&id.to_string())
            )
        }
        other => format!(
            "the {other} backend's own tools: remove the lock {} of state {} (terraform cannot, while the state is missing)",
            info.id, info.path
        ),
    }
}

/// `s` as one shell word: single-quoted, with each `'` written as `'\''`.
fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@,".contains(c))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// terraform's data directory of `workdir` for this process, which runs with the run's environment
/// (its TF_DATA_DIR).
fn run_data_dir(workdir: &Path) -> PathBuf {
    data_dir(workdir, std::env::var_os("TF_DATA_DIR").as_deref())
}

/// `terraform.tfstate` of the data directory `data_dir`, parsed.
fn backend_file(data_dir: &Path) -> Option<serde_json::Value> {
    let file = data_dir.join("terraform.tfstate");
    let mut bytes = Vec::new();
    fs::File::open(file)
        .ok()?
        .take(1 << 20)
        .read_to_end(&mut bytes)
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Runs terraform with `args` in `workdir`, data directory `data_dir` and `workspace` (argv, no
/// shell), non-interactive, with a timeout. Returns whether it succeeded and its combined output.
fn run_terraform(
    terraform: &Path,
    workdir: &Path,
    data_dir: &Path,
    workspace: &str,
    args: &[&str],
) -> Result<(bool, String), String> {
    let mut cmd = Command::new(terraform);
    cmd.args(args).current_dir(workdir);
    // The dead run's data directory, whatever the environment this helper was given says.
    if data_dir == super::workspace::data_dir(workdir, None) {
        cmd.env_remove("TF_DATA_DIR");
    } else {
        cmd.env("TF_DATA_DIR", data_dir);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("TF_INPUT", "0")
        .env("TF_IN_AUTOMATION", "1")
        .env("TF_WORKSPACE", workspace);
    // Extra arguments from the environment would change what the probe does; debug logs would
    // mix into the output it parses.
    for (k, _) in std::env::vars_os() {
        let k_text = k.to_string_lossy();
        if k_text.starts_with("TF_CLI_ARGS") || k_text.starts_with("TF_LOG") {
            cmd.env_remove(k);
        }
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", terraform.display()))?;
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        if let Some(o) = out.as_mut() {
            let _ = o.take(4 << 20).read_to_end(&mut s);
        }
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        if let Some(e) = err.as_mut() {
            let _ = e.take(4 << 20).read_to_end(&mut s);
        }
        s
    });
    let deadline = Instant::now() + TERRAFORM_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "terraform {} timed out after {}s",
                    args.join(" "),
                    TERRAFORM_TIMEOUT.as_secs()
                ));
            }
            Err(e) => return Err(format!("waiting for terraform failed: {e}")),
        }
    };
    let mut combined = reader.join().unwrap_or_default();
    combined.extend_from_slice(&err_reader.join().unwrap_or_default());
    Ok((
        status.success(),
        String::from_utf8_lossy(&combined).into_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::locks::record::{Ended, FORMAT};

    const T0: u64 = 1_800_000_000_000;

    fn rec() -> Record {
        Record {
            v: FORMAT,
            owner: Owner {
                name: "pod-a".into(),
                boot_id: "b".into(),
                started_ms: T0 - 60_000,
                pid: 1,
                pod_uid: None,
                nonce: None,
            },
            who: "@pod-a".into(),
            run_id: "r1".into(),
            cwd: "/tf/x".into(),
            workdir: "/tf/x".into(),
            workspace: "default".into(),
            subcommand: "apply".into(),
            argv: vec!["apply".into()],
            started_ms: T0,
            in_progress: vec![],
            updated_ms: T0,
            ended: None,
            needs_person: None,
            ttl_ms: Some(30_000),
            data_dir: None,
        }
    }

    fn lock(who: &str, created_ms: Option<u64>) -> LockInfo {
        LockInfo {
            id: "e7f9146b-c044-abab-c58c-2e409467401c".into(),
            who: who.into(),
            created_ms,
            ..Default::default()
        }
    }

    fn window() -> Window {
        Window {
            not_before_ms: T0 - CLOCK_SKEW.as_millis() as u64,
            not_after_ms: T0 + 30_000 + CLOCK_SKEW.as_millis() as u64,
            live_same_who: None,
        }
    }

    #[test]
    fn the_dead_runs_own_lock_is_unlocked() {
        assert_eq!(
            decide(&rec(), &lock("@pod-a", Some(T0 + 800)), &window()),
            Decision::Unlock
        );
        // Clock skew: a little before the start still counts.
        assert_eq!(
            decide(&rec(), &lock("@pod-a", Some(T0 - 59_000)), &window()),
            Decision::Unlock
        );
    }

    #[test]
    fn another_who_is_never_unlocked() {
        for who in [
            "root@laptop",
            "@pod-b",
            "root@pod-a",
            "@pod-a ",
            "@POD-A",
            "",
        ] {
            assert!(
                matches!(
                    decide(&rec(), &lock(who, Some(T0 + 1)), &window()),
                    Decision::NotOurs(_)
                ),
                "{who:?}"
            );
        }
    }

    #[test]
    fn a_lock_created_outside_the_runs_life_is_not_its() {
        assert!(matches!(
            decide(&rec(), &lock("@pod-a", Some(T0 - 61_000)), &window()),
            Decision::NotOurs(_)
        ));
        let late = window().not_after_ms + 1;
        assert!(matches!(
            decide(&rec(), &lock("@pod-a", Some(late)), &window()),
            Decision::NotOurs(_)
        ));
    }

    #[test]
    fn an_unreadable_created_or_odd_id_or_live_twin_leaves_the_lock() {
        assert!(matches!(
            decide(&rec(), &lock("@pod-a", None), &window()),
            Decision::Ambiguous(_)
        ));
        let mut odd = lock("@pod-a", Some(T0 + 1));
        odd.id = "-lock=false".into();
        assert!(matches!(
            decide(&rec(), &odd, &window()),
            Decision::Ambiguous(_)
        ));
        let w = Window {
            live_same_who: Some("r3 of pod-a".into()),
            ..window()
        };
        assert!(matches!(
            decide(&rec(), &lock("@pod-a", Some(T0 + 1)), &w),
            Decision::Ambiguous(_)
        ));
    }

    #[test]
    fn the_release_command_names_the_backends_own_lock() {
        let info = LockInfo {
            id: "11111111-2222-3333-4444-555555555555".into(),
            path: "tfstate/env:/feature/it's/terraform.tfstate".into(),
            ..Default::default()
        };
        let kube = serde_json::json!({"namespace": "crossplane-system", "secret_suffix": "providerconfig-default"});
        assert_eq!(
            release_command("kubernetes", &kube, "feature", &info),
            r#"kubectl -n crossplane-system patch lease lock-tfstate-feature-providerconfig-default --type=merge -p '{"metadata":{"annotations":{"app.terraform.io/lock-info":null}},"spec":{"holderIdentity":null}}'"#
        );
        let s3 = serde_json::json!({"dynamodb_table": "tflock", "dynamodb_endpoint": null});
        assert_eq!(
            release_command("s3", &s3, "feature", &info),
            r#"aws dynamodb delete-item --table-name tflock --key '{"LockID":{"S":"tfstate/env:/feature/it'\''s/terraform.tfstate"}}' --condition-expression 'contains(Info, :id)' --expression-attribute-values '{":id":{"S":"11111111-2222-3333-4444-555555555555"}}'"#
        );
    }

    #[test]
    fn last_alive_comes_from_the_owners_own_stamps_or_its_end() {
        let ttl = Duration::from_secs(30);
        let t0 = T0 - 600_000;
        let mut r = rec();
        r.started_ms = t0;
        r.updated_ms = t0;
        let facts = Facts::of(&r);
        // No heartbeat: only the record's last write, plus one TTL.
        assert_eq!(last_alive_ms(&facts, None, ttl), t0 + 30_000);
        // Its own heartbeat: the last beat plus one TTL.
        let hb = record::Heartbeat {
            v: record::HEARTBEAT_FORMAT,
            owner: r.owner.clone(),
            seq: 4,
            updated_ms: t0 + 20_000,
            holds_lock: true,
            host: String::new(),
            ttl_ms: Some(30_000),
            lock_file: None,
        };
        assert_eq!(last_alive_ms(&facts, Some(&hb), ttl), t0 + 50_000);
        // Another incarnation's heartbeat says nothing about this one.
        let other = record::Heartbeat {
            owner: Owner {
                started_ms: t0 + 5_000,
                ..r.owner.clone()
            },
            ..hb.clone()
        };
        assert_eq!(last_alive_ms(&facts, Some(&other), ttl), t0 + 30_000);
        // Seen dying: exactly then.
        let mut ended = r.clone();
        ended.ended = Some(Ended {
            ms: t0 + 900,
            how: "killed by SIGKILL".into(),
        });
        assert_eq!(last_alive_ms(&Facts::of(&ended), Some(&hb), ttl), t0 + 900);
    }
}
