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
//!
//! This file is the procedure (list, watch, decide, act, per record); `decision.rs` decides on the
//! evidence alone, `evidence.rs` gathers it (the window of the dead run's life, and the live runs
//! and hosts that could have written the same Who), `backend.rs` reads what the working directory
//! was initialised with and writes the command a person runs, `invoke.rs` runs terraform,
//! `outcome.rs` is what a recovery decided and what the helper tells the init, `report.rs` the
//! log lines.
//!
//! The procedure has two seams and no effect outside them: the store ([`Store`]) and
//! [`Effects`] (`effects.rs`: the clock, the watch's sleep, a working directory's resolved path,
//! data directory and state, the terraform runs). [`Recovery::run`] uses the real ones
//! ([`System`]). The deterministic simulation (tests/simulation/procedure.rs) calls
//! [`Recovery::run_with`] as a coroutine with its own store and effects, each call a request it
//! performs in simulated time while the procedure waits: the procedure it checks, and the guards
//! its mutation check turns off, are these.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::liveness::{run_state, Facts, Observer, RunState, Seen, Token, Verdict};
use super::lockinfo::{self, Probe};
use super::record::{self, Found, NeedsPerson, Owner, Record};
use super::store::{self, Aside, RecoveryLock, Store};
use super::who::who_host;
use crate::duration::fmt_duration;
use crate::locks::record_id::RecordId;
use crate::mutation::{self, Guard};

mod backend;
mod decision;
mod effects;
mod evidence;
mod invoke;
mod outcome;
mod report;
#[cfg(test)]
mod tests;

use backend::record_data_dir;
pub use backend::{backend_config, backend_type, kubernetes_lease, release_command, DataDir};
pub use decision::{decide, Decision, Window, CLOCK_SKEW};
pub use effects::{Effects, System};
pub use evidence::live_on_host;
pub use outcome::{HelperReport, RecoveryOutcome, UnknownWording, REPORT_FD_VAR};

/// The init's hidden subcommand that recovers one working directory.
pub const HIDDEN_SUBCOMMAND: &str = "__recover";
/// How long a recovery waits for another one in the same state directory.
const LOCK_WAIT: Duration = Duration::from_secs(250);
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
    pub fn run(
        &self,
        only: Option<&Path>,
    ) -> Result<Vec<(RecordId, Box<Record>, RecoveryOutcome)>, String> {
        let fx = System {
            terraform: &self.terraform,
        };
        self.run_with(&fx, only)
    }

    /// [`run`](Recovery::run) with the effects `fx` (the real ones: [`System`]; the simulation's,
    /// in simulated time): every effect besides the store goes through it.
    pub fn run_with(
        &self,
        fx: &dyn Effects,
        only: Option<&Path>,
    ) -> Result<Vec<(RecordId, Box<Record>, RecoveryOutcome)>, String> {
        let mut observer =
            Observer::import(self.ttl, self.older_ttl, &self.seen, |ns| fx.instant_of(ns));
        let only = only.map(|d| (d, fx.canonical(d)));
        let only = only.as_ref();
        // Watching first, without the state directory's recovery lock: a pod that just came up
        // watches another's heartbeat for a TTL before it can call it dead, and other pods'
        // recoveries need not wait for that.
        let listed: Vec<Record> = self
            .store
            .list()
            .into_iter()
            .filter_map(|f| match f {
                Found::Record(_, r) if only.is_none_or(|d| same_dir(fx, d, &r.workdir)) => Some(*r),
                _ => None,
            })
            .collect();
        self.watch(fx, &mut observer, &listed);
        // A dry run changes nothing, so it needs no exclusivity (and works on a read-only view).
        let lock = if self.dry_run || !mutation::on(Guard::RecoverLock) {
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
        let records: Vec<(RecordId, Record)> = found
            .iter()
            .filter_map(|f| match f {
                Found::Record(p, r) => Some((p.clone(), (**r).clone())),
                _ => None,
            })
            .collect();
        // Records that could not be listed may include a live run with the same Who as a
        // listed dead one: no lock is decided on a partial listing.
        let unlisted = found.iter().find_map(|f| match f {
            Found::Unlisted(why) => Some(why.clone()),
            _ => None,
        });
        let mut out = Vec::new();
        for f in found {
            match f {
                Found::Unlisted(why) => store::warn_unlisted(&self.store.location(), &why),
                Found::Corrupt(path, problem) => {
                    if self.dry_run {
                        tracing::warn!(file = %path, problem = %problem, "lock-owner record cannot be read (dry run: left in place)");
                    } else {
                        store::set_aside_corrupt(&*self.store, &path, &problem);
                    }
                }
                Found::Unreadable(path, e) => store::warn_unreadable(&path, &e),
                Found::LeftAlone(path, why) => store::warn_left_alone(&path, &why),
                Found::Future(path, v) => tracing::warn!(
                    file = %path, version = v, this_version = record::FORMAT,
                    "lock-owner record of a newer tfinit format is left alone; upgrade this tfinit"
                ),
                Found::Record(path, rec) => {
                    if only.is_some_and(|d| !same_dir(fx, d, &rec.workdir)) {
                        continue;
                    }
                    let outcome = match &unlisted {
                        Some(why) if mutation::on(Guard::UnansweredRead) => {
                            RecoveryOutcome::Unknown(format!(
                                "not every lock-owner record could be listed ({why}): a live run with this record's Who may be among those not listed"
                            ))
                        }
                        _ => self.one(fx, &mut observer, &path, &rec, &records, lock.as_ref()),
                    };
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
    fn watch(&self, fx: &dyn Effects, observer: &mut Observer, records: &[Record]) {
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
        // A listing with no answer watches fewer: the evidence of each lock reads them again,
        // and leaves the lock alone when they cannot be read (`Window::unread`).
        for hb in self.store.heartbeats().unwrap_or_default() {
            if !hb.host.is_empty() && hosts.contains(&hb.host.as_str()) {
                add(&hb.owner);
            }
        }
        let mut said = false;
        let mut older_said: Vec<String> = Vec::new();
        loop {
            let now = fx.now();
            let mut longest = Duration::ZERO;
            for o in &owners {
                if self.kernel(o).is_some() {
                    continue;
                }
                self.read_beat(fx, observer, o);
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
                if let Verdict::Watching { left } = observer.verdict(&key, fx.now()) {
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
            let elapsed = fx.now().saturating_duration_since(now);
            fx.sleep(WATCH_EVERY.min(longest).saturating_sub(elapsed));
        }
    }

    /// One read of `owner`'s heartbeat, fed to `observer` when the store answered: a read with
    /// no answer is no sign of anything (fed as "missing", a TTL of them would call a live owner
    /// dead).
    fn read_beat(&self, fx: &dyn Effects, observer: &mut Observer, owner: &Owner) {
        let started = fx.now();
        let token = match self.store.read_heartbeat(owner) {
            Ok(hb) => hb.as_ref().map(Token::of),
            Err(_) if mutation::on(Guard::UnansweredRead) => return,
            Err(_) => None,
        };
        observer.saw(&owner.key(), token, started, fx.now());
    }

    /// What the kernel says of `owner`'s lock file when it ran on this kernel and its heartbeat
    /// names the file it held: Some(true) every process of it is gone, Some(false) one still
    /// holds it (alive).
    fn kernel(&self, owner: &Owner) -> Option<bool> {
        let hb = self.store.read_heartbeat(owner).ok().flatten();
        self.store.kernel_proof(&self.me, owner, hb.as_ref())
    }

    /// Whether `rec`'s run is over, with a fresh read of its owner's heartbeat.
    fn state_now(&self, fx: &dyn Effects, observer: &mut Observer, rec: &Record) -> RunState {
        let facts = Facts::of(rec);
        observer.stated(&rec.owner.key(), facts.ttl);
        if facts.ended.is_some() || rec.owner.same_incarnation(&self.me) {
            return run_state(&self.me, &facts, None, Verdict::Alive);
        }
        let kernel = self.kernel(&rec.owner);
        if kernel.is_none() {
            self.read_beat(fx, observer, &rec.owner);
        }
        let verdict = observer.verdict(&rec.owner.key(), fx.now());
        run_state(&self.me, &facts, kernel, verdict)
    }

    fn one(
        &self,
        fx: &dyn Effects,
        observer: &mut Observer,
        path: &RecordId,
        rec: &Record,
        all: &[(RecordId, Record)],
        lock: Option<&RecoveryLock>,
    ) -> RecoveryOutcome {
        let RunState::Over(why_dead) = self.state_now(fx, observer, rec) else {
            return RecoveryOutcome::OwnerAlive;
        };
        if self.automatic
            && Facts::of(rec).needs_person_by.as_deref() == Some(self.me.incarnation().as_str())
        {
            return RecoveryOutcome::WaitingForPerson;
        }
        let workdir = Path::new(&rec.workdir);
        let data_dir = record_data_dir(rec);
        let stored = fx.data_dir(&data_dir);
        let outcome = match stored.backend.as_deref() {
            // Not initialised (yet: a new pod's first `init`, recorded and so recovered before it
            // runs, in a fresh working directory): the backend is unknown, not local.
            None if !stored.exists => RecoveryOutcome::Unknown(format!(
                "{} is not initialised ({} does not exist): its backend is unknown until `terraform init` runs there",
                workdir.display(),
                data_dir.display()
            )),
            None | Some("local") | Some("pg") => {
                RecoveryOutcome::NothingToRelease(stored.backend.unwrap_or_else(|| "local".into()))
            }
            Some(b) if !lockinfo::probe_safe(b) => RecoveryOutcome::Unsupported(b.to_string()),
            Some(b) => {
                let config = stored.config.clone().unwrap_or_default();
                self.probe_and_decide(fx, observer, b, &config, path, rec, all, lock)
            }
        };
        self.report(path, rec, &why_dead, &outcome);
        if !self.dry_run {
            match &outcome {
                RecoveryOutcome::NeedsPerson(info, command) => {
                    let mut marked = rec.clone();
                    marked.needs_person = Some(NeedsPerson {
                        reported_by: self.me.incarnation(),
                        ms: fx.now_ms(),
                        lock_id: info.id.clone(),
                        command: command.clone(),
                    });
                    if let Err(e) = self.store.write(&marked).map(|_| ()) {
                        tracing::warn!(record = %path, error = %e, "cannot mark the record as needing a person; it will be reported again before the next run");
                    }
                }
                RecoveryOutcome::Unlocked(_)
                | RecoveryOutcome::HeldByOther(..)
                | RecoveryOutcome::Free
                | RecoveryOutcome::NothingToRelease(_) => {
                    if let Err(e) = self.store.remove(path) {
                        tracing::warn!(record = %path, error = %e, "cannot remove the record");
                    }
                }
                RecoveryOutcome::Unsupported(_) => {
                    if let Err(e) = self.store.set_aside(path, &Aside::Manual) {
                        tracing::warn!(record = %path, error = %e, "cannot set the record aside");
                    }
                }
                _ => {}
            }
        }
        outcome
    }

    #[allow(clippy::too_many_arguments)]
    fn probe_and_decide(
        &self,
        fx: &dyn Effects,
        observer: &mut Observer,
        backend: &str,
        config: &serde_json::Value,
        path: &RecordId,
        rec: &Record,
        all: &[(RecordId, Record)],
        lock: Option<&RecoveryLock>,
    ) -> RecoveryOutcome {
        let data_dir = record_data_dir(rec);
        let lease = (backend == "kubernetes").then(|| kubernetes_lease(config, &rec.workspace).1);
        let probe = match fx.terraform(
            rec,
            &data_dir,
            &["force-unlock", "-force", lockinfo::probe_id(backend)],
        ) {
            Ok((ok, output)) => lockinfo::parse_probe_of(backend, lease.as_deref(), ok, &output),
            Err(e) => return RecoveryOutcome::Unknown(e),
        };
        let (info, state_missing) = match probe {
            Probe::Free => return RecoveryOutcome::Free,
            Probe::Unreadable(m) => return RecoveryOutcome::Unknown(m),
            Probe::Unknown(m) => return RecoveryOutcome::UnknownWording(m),
            Probe::Held(info) => (info, false),
            Probe::HeldStateMissing(info) => (info, true),
        };
        match decide(
            rec,
            &info,
            &self.window(fx, observer, path, rec, &info, all),
        ) {
            Decision::NotOurs(why) => return RecoveryOutcome::HeldByOther(info, why),
            Decision::Ambiguous(why) => return RecoveryOutcome::Ambiguous(info, why),
            Decision::Unlock => {}
        }
        // terraform's force-unlock loads the state first, and loading a missing state takes the
        // lock to create it: with the lock held, that fails whatever the id.
        if state_missing {
            let command = release_command(backend, config, &rec.workspace, &info);
            return RecoveryOutcome::NeedsPerson(info, command);
        }
        if self.dry_run {
            return RecoveryOutcome::Unlocked(info);
        }
        // Right before the unlock, everything again from the volume: the owner's heartbeat (a
        // beat since the probe makes it alive) and the records (a run that started here since,
        // with the same Who, makes the lock ambiguous). The init's live runs cannot have grown:
        // no state-locking run of the init starts while its recovery runs.
        if !matches!(self.state_now(fx, observer, rec), RunState::Over(_)) {
            return RecoveryOutcome::OwnerAlive;
        }
        let mut fresh: Vec<(RecordId, Record)> = Vec::new();
        for f in self.store.list() {
            match f {
                Found::Record(p, r) => fresh.push((p, *r)),
                // A run that started since, with the same Who, may be among the records not
                // listed: a listing with no answer is no "none" (found by the simulation's model
                // of this recheck).
                Found::Unlisted(why) if mutation::on(Guard::UnansweredRead) => {
                    return RecoveryOutcome::Ambiguous(
                        info,
                        format!("the records could not be listed again right before the release ({why}): a run with the same Who may have started since"),
                    )
                }
                _ => {}
            }
        }
        match decide(
            rec,
            &info,
            &self.window(fx, observer, path, rec, &info, &fresh),
        ) {
            Decision::NotOurs(why) => return RecoveryOutcome::HeldByOther(info, why),
            Decision::Ambiguous(why) => return RecoveryOutcome::Ambiguous(info, why),
            Decision::Unlock => {}
        }
        // A right to recover that must be renewed (the Kubernetes store's Lease) and was not in
        // time may be another pod's by now: nothing is released without it.
        if mutation::on(Guard::RecoveryHeld) && lock.is_some_and(|l| !l.held_at(fx.now())) {
            return RecoveryOutcome::Unknown(
                "the right to recover was not renewed in time (the recovery Lease): nothing released; the next recovery decides again".into(),
            );
        }
        match fx.terraform(rec, &data_dir, &["force-unlock", "-force", &info.id]) {
            Ok((true, _)) => RecoveryOutcome::Unlocked(info),
            Ok((false, output)) => RecoveryOutcome::UnlockFailed(lockinfo::first_line(&output)),
            Err(e) => RecoveryOutcome::UnlockFailed(e),
        }
    }
}

/// Whether the working directory `dir` (given with its resolved path) is `workdir`, by what it
/// is: the same text, or the same directory once symbolic links are resolved.
fn same_dir(fx: &dyn Effects, dir: &(&Path, Option<PathBuf>), workdir: &str) -> bool {
    let (text, resolved) = dir;
    *text == Path::new(workdir)
        || resolved
            .as_ref()
            .is_some_and(|r| fx.canonical(Path::new(workdir)).is_some_and(|w| w == *r))
}
