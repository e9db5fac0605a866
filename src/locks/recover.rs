//! Recovery of state locks left by dead owners: probe, decide, and force-unlock only what is
//! provably the dead owner's. Runs as its own process (the init's hidden `__recover` helper, or
//! `tfinit recover` by hand), so the init's loop never waits on terraform or the network.
//!
//! Decision for each record of a dead owner in a working directory:
//! | backend                       | probe says              | action                                   |
//! |-------------------------------|-------------------------|------------------------------------------|
//! | local, pg (locks die with us) | -                       | remove the record                        |
//! | consul, http, other           | - (never probed)        | warn: release by hand; record set aside  |
//! | s3, kubernetes, azurerm, gcs  | free                    | remove the record                        |
//! |                               | held, Who and Created match the record | force-unlock, warn with orphan candidates |
//! |                               | held by anyone else     | leave the lock; remove the record        |
//! |                               | cannot tell             | leave everything; try again next run     |

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::lockinfo::{self, LockInfo, Probe};
use super::record::{self, Found, Owner, Record, Store};

/// The init's hidden subcommand that recovers one working directory.
pub const HIDDEN_SUBCOMMAND: &str = "__recover";

/// Created may precede the record's start by this much (clocks of two nodes disagree a little;
/// terraform takes the lock after tfinit writes the record, so Created is normally later).
pub const CLOCK_SKEW: Duration = Duration::from_secs(60);

/// How long one terraform probe or unlock may take.
const TERRAFORM_TIMEOUT: Duration = Duration::from_secs(120);

/// What happened to one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Its owner may be alive: untouched.
    OwnerAlive,
    /// Not in the working directory asked about.
    Elsewhere,
    /// The backend's lock dies with its process (local, pg): record removed.
    NothingToRelease(String),
    /// The backend cannot be probed safely: lock untouched, record set aside.
    Unsupported(String),
    /// The lock is free: record removed.
    Free,
    /// The dead owner's lock was released (or would be, in a dry run).
    Unlocked(LockInfo),
    /// Somebody else holds the lock: untouched, record removed.
    HeldByOther(LockInfo),
    /// The probe could not tell: nothing touched, record kept.
    Unknown(String),
    /// The unlock itself failed: record kept.
    UnlockFailed(String),
}

/// One recovery pass.
pub struct Recovery {
    /// The state directory.
    pub store: Store,
    /// The live incarnation of this owner (its records are never recovered).
    pub me: Owner,
    /// Heartbeat TTL.
    pub ttl: Duration,
    /// The real terraform.
    pub terraform: PathBuf,
    /// Report only.
    pub dry_run: bool,
}

impl Recovery {
    /// Recovers every dead owner's record (all directories when `only` is None). Corrupt records are
    /// set aside with a warning. Returns each record's outcome.
    pub fn run(&self, only: Option<&Path>) -> Vec<(PathBuf, Outcome)> {
        let mut out = Vec::new();
        for f in self.store.list() {
            match f {
                Found::Corrupt(path, problem) => {
                    if !self.dry_run {
                        record::set_aside_corrupt(&path, &problem);
                    }
                }
                Found::Future(path, v) => tracing::warn!(
                    file = %path.display(), version = v,
                    "lock-owner record of a newer tfinit format is left alone; upgrade this tfinit"
                ),
                Found::Record(path, rec) => {
                    if only.is_some_and(|d| Path::new(&rec.workdir) != d) {
                        continue;
                    }
                    let outcome = self.one(&path, &rec);
                    out.push((path, outcome));
                }
            }
        }
        out
    }

    fn one(&self, path: &Path, rec: &Record) -> Outcome {
        let Some(why_dead) = super::owner_dead(&self.store, &self.me, rec, self.ttl) else {
            return Outcome::OwnerAlive;
        };
        let workdir = Path::new(&rec.workdir);
        let backend = backend_type(workdir);
        let base = || {
            format!(
                "owner {} ({}) is dead: {why_dead}; run {} `terraform {}` in {} started {}",
                rec.owner.name,
                rec.owner.incarnation(),
                rec.run_id,
                rec.argv.join(" "),
                rec.workdir,
                rec.started_ms
            )
        };
        let outcome = match backend.as_deref() {
            None | Some("local") | Some("pg") => {
                Outcome::NothingToRelease(backend.unwrap_or_else(|| "local".into()))
            }
            Some(b) if !lockinfo::probe_safe(b) => Outcome::Unsupported(b.to_string()),
            Some(b) => self.probe_and_decide(b, workdir, rec),
        };
        let orphans = &rec.in_progress;
        match &outcome {
            Outcome::Unlocked(info) => tracing::warn!(
                record = %path.display(), lock_id = %info.id, lock_path = %info.path, operation = %info.operation,
                who = %info.who, version = %info.version, created = %info.created, orphan_candidates = ?orphans,
                dry_run = self.dry_run,
                "{}: {} its state lock. Resources that may exist outside the state: check them and import or delete: {:?}",
                base(), if self.dry_run { "would force-unlock" } else { "force-unlocked" }, orphans
            ),
            Outcome::HeldByOther(info) => tracing::warn!(
                record = %path.display(), lock_id = %info.id, who = %info.who, created = %info.created,
                expected_who = %rec.who, orphan_candidates = ?orphans,
                "{}: the state lock is held by someone else ({}), not by the dead owner: left alone", base(), info.who
            ),
            Outcome::Free => {
                if orphans.is_empty() {
                    tracing::info!(record = %path.display(), "{}: the state lock is free; record removed", base());
                } else {
                    tracing::warn!(record = %path.display(), orphan_candidates = ?orphans, "{}: the state lock is free, but resources were in progress when it died: check them and import or delete", base());
                }
            }
            Outcome::NothingToRelease(b) => {
                tracing::info!(record = %path.display(), backend = %b, orphan_candidates = ?orphans, "{}: the {b} backend's lock ends with its process; record removed", base())
            }
            Outcome::Unsupported(b) => tracing::warn!(
                record = %path.display(), backend = %b, orphan_candidates = ?orphans,
                "{}: automatic recovery is not supported for the {b} backend (force-unlock there deletes any lock, whoever holds it); if terraform reports the lock held by {}, release it by hand with `terraform force-unlock`", base(), rec.who
            ),
            Outcome::Unknown(msg) => {
                tracing::warn!(record = %path.display(), probe = %msg, "{}: could not read the state lock; nothing touched, will try again before the next run", base())
            }
            Outcome::UnlockFailed(msg) => {
                tracing::warn!(record = %path.display(), error = %msg, "{}: force-unlock failed; record kept, will try again before the next run", base())
            }
            Outcome::OwnerAlive | Outcome::Elsewhere => {}
        }
        if !self.dry_run {
            match &outcome {
                Outcome::Unlocked(_)
                | Outcome::HeldByOther(_)
                | Outcome::Free
                | Outcome::NothingToRelease(_) => {
                    if let Err(e) = record::remove(path) {
                        tracing::warn!(record = %path.display(), error = %e, "cannot remove the record");
                    }
                }
                Outcome::Unsupported(_) => {
                    let aside = path.with_extension("json.manual");
                    let _ = fs::rename(path, aside);
                }
                _ => {}
            }
        }
        outcome
    }

    fn probe_and_decide(&self, backend: &str, workdir: &Path, rec: &Record) -> Outcome {
        let probe = match run_terraform(
            &self.terraform,
            workdir,
            &["force-unlock", "-force", lockinfo::probe_id(backend)],
        ) {
            Ok((_, output)) => lockinfo::parse_probe(backend, &output),
            Err(e) => return Outcome::Unknown(e),
        };
        let info = match probe {
            Probe::Free => return Outcome::Free,
            Probe::Unknown(m) => return Outcome::Unknown(m),
            Probe::Held(info) => info,
        };
        let not_before = rec.started_ms.saturating_sub(CLOCK_SKEW.as_millis() as u64);
        let created_ok = info.created_ms.is_some_and(|c| c >= not_before);
        if info.who != rec.who || !created_ok || !lockinfo::plain_id(&info.id) {
            return Outcome::HeldByOther(info);
        }
        if self.dry_run {
            return Outcome::Unlocked(info);
        }
        match run_terraform(
            &self.terraform,
            workdir,
            &["force-unlock", "-force", &info.id],
        ) {
            Ok((true, _)) => Outcome::Unlocked(info),
            Ok((false, output)) => Outcome::UnlockFailed(
                output
                    .lines()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("")
                    .trim()
                    .to_string(),
            ),
            Err(e) => Outcome::UnlockFailed(e),
        }
    }
}

/// The backend type a working directory was initialised with (`.terraform/terraform.tfstate`,
/// or `$TF_DATA_DIR/terraform.tfstate`); None when not initialised or local.
pub fn backend_type(workdir: &Path) -> Option<String> {
    let data_dir = std::env::var_os("TF_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(".terraform"));
    let file = workdir.join(data_dir).join("terraform.tfstate");
    let mut bytes = Vec::new();
    fs::File::open(file)
        .ok()?
        .take(1 << 20)
        .read_to_end(&mut bytes)
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    v.get("backend")?.get("type")?.as_str().map(str::to_string)
}

/// Runs terraform with `args` in `workdir` (argv, no shell), non-interactive, with a timeout.
/// Returns whether it succeeded and its combined output.
fn run_terraform(
    terraform: &Path,
    workdir: &Path,
    args: &[&str],
) -> Result<(bool, String), String> {
    let mut cmd = Command::new(terraform);
    cmd.args(args)
        .current_dir(workdir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("TF_INPUT", "0")
        .env("TF_IN_AUTOMATION", "1");
    // Extra arguments from the environment would change what the probe does.
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TF_CLI_ARGS") {
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
    let mut err_bytes = Vec::new();
    if let Some(e) = err.as_mut() {
        let _ = e.take(4 << 20).read_to_end(&mut err_bytes);
    }
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
    combined.extend_from_slice(&err_bytes);
    Ok((
        status.success(),
        String::from_utf8_lossy(&combined).into_owned(),
    ))
}

/// Where `tfinit recover` finds this container's live incarnation: the heartbeat of our owner
/// name, written by the running init. Without one, a fresh identity (no init runs here).
pub fn current_owner(store: &Store, name: &str) -> Owner {
    match store.read_heartbeat(name) {
        Some(hb) => hb.owner,
        None => Owner::current(name, None),
    }
}
