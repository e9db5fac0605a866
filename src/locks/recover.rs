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
//! | local, pg (locks die with us) | -                       | remove the record                        |
//! | consul, http, other           | - (never probed)        | warn: release by hand; record set aside  |
//! | s3, kubernetes, azurerm, gcs  | free                    | remove the record                        |
//! |                               | held, Who equal, Created inside the run's life, no live run with that Who here | force-unlock; warn with orphan candidates |
//! |                               | held, and a live run here has the same Who | leave the lock; keep the record |
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
    /// The unlock itself failed: record kept.
    UnlockFailed(String),
}

/// What the state directory proves about when a dead run could have taken its lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// A lock created earlier (ms since the epoch) is not the run's.
    pub not_before_ms: u64,
    /// A lock created later is not the run's.
    pub not_after_ms: u64,
    /// A live run in the same directory and workspace whose lock would carry the same Who.
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

/// One recovery pass.
pub struct Recovery {
    /// The state directory.
    pub store: Store,
    /// The live incarnation of this owner (its running records are never recovered).
    pub me: Owner,
    /// Heartbeat TTL.
    pub ttl: Duration,
    /// The real terraform.
    pub terraform: PathBuf,
    /// Report only.
    pub dry_run: bool,
}

impl Recovery {
    /// Recovers every record whose run is over (in `only` when given). Corrupt records are set
    /// aside with a warning (not in a dry run). Returns each record's outcome; an error when the
    /// state directory's recovery lock cannot be taken (a dry run takes none).
    pub fn run(&self, only: Option<&Path>) -> Result<Vec<(PathBuf, Box<Record>, Outcome)>, String> {
        // A dry run changes nothing, so it needs no exclusivity (and works on a read-only view).
        let _lock = if self.dry_run {
            None
        } else {
            Some(self.store.lock_recovery(LOCK_WAIT).map_err(|e| {
                format!(
                    "another lock recovery in {} did not finish within {}s, or its lock file is unusable: {e}",
                    self.store.dir().display(),
                    LOCK_WAIT.as_secs()
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
                        record::set_aside_corrupt(&path, &problem);
                    }
                }
                Found::Unreadable(path, e) => record::warn_unreadable(&path, &e),
                Found::Future(path, v) => tracing::warn!(
                    file = %path.display(), version = v, this_version = record::FORMAT,
                    "lock-owner record of a newer tfinit format is left alone; upgrade this tfinit"
                ),
                Found::Record(path, rec) => {
                    if only.is_some_and(|d| Path::new(&rec.workdir) != d) {
                        continue;
                    }
                    let outcome = self.one(&path, &rec, &records);
                    out.push((path, rec, outcome));
                }
            }
        }
        Ok(out)
    }

    fn one(&self, path: &Path, rec: &Record, all: &[(PathBuf, Record)]) -> Outcome {
        let Some(why_dead) = super::run_dead(&self.store, &self.me, rec, self.ttl) else {
            return Outcome::OwnerAlive;
        };
        let workdir = Path::new(&rec.workdir);
        let backend = backend_type(workdir);
        let outcome = match backend.as_deref() {
            None | Some("local") | Some("pg") => {
                Outcome::NothingToRelease(backend.unwrap_or_else(|| "local".into()))
            }
            Some(b) if !lockinfo::probe_safe(b) => Outcome::Unsupported(b.to_string()),
            Some(b) => self.probe_and_decide(b, path, rec, all),
        };
        self.report(path, rec, &why_dead, &outcome);
        if !self.dry_run {
            match &outcome {
                Outcome::Unlocked(_)
                | Outcome::HeldByOther(..)
                | Outcome::Free
                | Outcome::NothingToRelease(_) => {
                    if let Err(e) = record::remove(path) {
                        tracing::warn!(record = %path.display(), error = %e, "cannot remove the record");
                    }
                }
                Outcome::Unsupported(_) => {
                    let aside = path.with_extension("json.manual");
                    if let Err(e) = fs::rename(path, &aside) {
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
        let orphans = &rec.in_progress;
        let base = format!(
            "run {} of {} ({}) `terraform {}` in {} (workspace {}) started at {} ms is over: {why_dead}",
            rec.run_id,
            rec.owner.name,
            rec.owner.incarnation(),
            rec.argv.join(" "),
            rec.workdir,
            rec.workspace,
            rec.started_ms,
        );
        let orphan_hint = if orphans.is_empty() {
            String::new()
        } else {
            format!(
                ". Resources that may exist outside the state (their create, update or destroy started and never completed): check them and import or delete: {}",
                orphans.join(", ")
            )
        };
        macro_rules! warn_record {
            ($($field:tt)*) => {
                tracing::warn!(
                    record = %path.display(), run = %rec.run_id, owner = %rec.owner.name,
                    incarnation = %rec.owner.incarnation(), pod_uid = ?rec.owner.pod_uid,
                    expected_who = %rec.who, workdir = %rec.workdir, workspace = %rec.workspace,
                    subcommand = %rec.subcommand, argv = ?rec.argv, started_ms = rec.started_ms,
                    ended = ?rec.ended, orphan_candidates = ?orphans, dry_run = self.dry_run,
                    $($field)*
                )
            };
        }
        match outcome {
            Outcome::Unlocked(i) => warn_record!(
                lock_id = %i.id, lock_path = %i.path, operation = %i.operation, who = %i.who,
                version = %i.version, created = %i.created, info = %i.info,
                "{base}: {} its state lock {} (Who {}, Created {}){orphan_hint}",
                if self.dry_run { "would force-unlock" } else { "force-unlocked" },
                i.id, i.who, i.created
            ),
            Outcome::HeldByOther(i, why) => warn_record!(
                lock_id = %i.id, lock_path = %i.path, operation = %i.operation, who = %i.who,
                version = %i.version, created = %i.created,
                "{base}: the state lock is not the dead run's ({why}): left alone{orphan_hint}"
            ),
            Outcome::Ambiguous(i, why) => warn_record!(
                lock_id = %i.id, lock_path = %i.path, operation = %i.operation, who = %i.who,
                version = %i.version, created = %i.created,
                "{base}: the state lock may not be the dead run's ({why}): left alone, record kept{orphan_hint}"
            ),
            Outcome::Free if orphans.is_empty() => tracing::info!(
                record = %path.display(), "{base}: the state lock is free; record removed"
            ),
            Outcome::Free => {
                warn_record!("{base}: the state lock is free; record removed{orphan_hint}")
            }
            Outcome::NothingToRelease(b) => {
                if orphans.is_empty() {
                    tracing::info!(record = %path.display(), backend = %b, "{base}: the {b} backend's lock ends with its process; record removed")
                } else {
                    warn_record!(backend = %b, "{base}: the {b} backend's lock ends with its process; record removed{orphan_hint}")
                }
            }
            Outcome::Unsupported(b) => warn_record!(
                backend = %b,
                "{base}: automatic recovery is not supported for the {b} backend (its force-unlock deletes any lock, whoever holds it); if terraform reports the lock held by {}, release it by hand with `terraform force-unlock`; record renamed to *.manual{orphan_hint}",
                rec.who
            ),
            Outcome::Unknown(msg) => warn_record!(
                probe = %msg,
                "{base}: could not read the state lock; nothing touched, will try again before the next run"
            ),
            Outcome::UnlockFailed(msg) => warn_record!(
                error = %msg,
                "{base}: force-unlock failed; record kept, will try again before the next run"
            ),
            Outcome::OwnerAlive => {}
        }
    }

    fn probe_and_decide(
        &self,
        backend: &str,
        path: &Path,
        rec: &Record,
        all: &[(PathBuf, Record)],
    ) -> Outcome {
        let workdir = Path::new(&rec.workdir);
        let probe = match run_terraform(
            &self.terraform,
            workdir,
            &rec.workspace,
            &["force-unlock", "-force", lockinfo::probe_id(backend)],
        ) {
            Ok((ok, output)) => lockinfo::parse_probe(backend, ok, &output),
            Err(e) => return Outcome::Unknown(e),
        };
        let info = match probe {
            Probe::Free => return Outcome::Free,
            Probe::Unknown(m) => return Outcome::Unknown(m),
            Probe::Held(info) => info,
        };
        let skew = CLOCK_SKEW.as_millis() as u64;
        let window = Window {
            not_before_ms: rec.started_ms.saturating_sub(skew),
            not_after_ms: super::last_alive_ms(&self.store, &self.me, rec, self.ttl)
                .saturating_add(skew),
            live_same_who: all
                .iter()
                .filter(|(p, r)| {
                    p != path
                        && r.workdir == rec.workdir
                        && r.workspace == rec.workspace
                        && r.who == info.who
                        && super::run_dead(&self.store, &self.me, r, self.ttl).is_none()
                })
                .map(|(_, r)| format!("{} of {}", r.run_id, r.owner.name))
                .next(),
        };
        match decide(rec, &info, &window) {
            Decision::NotOurs(why) => return Outcome::HeldByOther(info, why),
            Decision::Ambiguous(why) => return Outcome::Ambiguous(info, why),
            Decision::Unlock => {}
        }
        if self.dry_run {
            return Outcome::Unlocked(info);
        }
        match run_terraform(
            &self.terraform,
            workdir,
            &rec.workspace,
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
        .filter(|d| !d.is_empty())
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

/// Runs terraform with `args` in `workdir` and `workspace` (argv, no shell), non-interactive, with
/// a timeout. Returns whether it succeeded and its combined output.
fn run_terraform(
    terraform: &Path,
    workdir: &Path,
    workspace: &str,
    args: &[&str],
) -> Result<(bool, String), String> {
    let mut cmd = Command::new(terraform);
    cmd.args(args)
        .current_dir(workdir)
        .stdin(Stdio::null())
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

/// The identity `tfinit recover` acts as: the live init of this container when its heartbeat is
/// fresh (its running records are then left alone), else a new identity of our owner name (so
/// records of an earlier incarnation count as dead).
pub fn current_owner(store: &Store, name: &str, ttl: Duration) -> Owner {
    match store.read_heartbeat(name) {
        Some(hb) if record::age(hb.updated_ms) <= ttl => hb.owner,
        _ => Owner::current(name, None),
    }
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
    fn last_alive_comes_from_heartbeat_restart_or_end() {
        let dir = std::env::temp_dir().join(format!("tfinit-recover-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let store = Store::new(&dir);
        store.prepare().unwrap();
        let ttl = Duration::from_secs(30);
        let me = Owner::current("pod-b", None);
        // A run that started ten minutes ago.
        let t0 = record::now_ms() - 600_000;
        let mut r = rec();
        r.owner.started_ms = t0 - 60_000;
        r.started_ms = t0;
        r.updated_ms = t0;
        // No heartbeat: only the record's last write, plus one TTL.
        assert_eq!(
            crate::locks::last_alive_ms(&store, &me, &r, ttl),
            t0 + 30_000
        );
        // Its heartbeat: the last beat plus one TTL.
        store.heartbeat(&r.owner).unwrap();
        let hb = store.read_heartbeat("pod-a").unwrap();
        assert_eq!(
            crate::locks::last_alive_ms(&store, &me, &r, ttl),
            hb.updated_ms + 30_000
        );
        // Replaced by a later incarnation: it was gone when that one started.
        let later = Owner {
            started_ms: t0 + 5_000,
            ..r.owner.clone()
        };
        store.heartbeat(&later).unwrap();
        assert_eq!(
            crate::locks::last_alive_ms(&store, &me, &r, ttl),
            t0 + 5_000
        );
        // An earlier incarnation of ourselves: gone before we started.
        let me_again = Owner {
            started_ms: t0 + 7_000,
            ..r.owner.clone()
        };
        assert_eq!(
            crate::locks::last_alive_ms(&store, &me_again, &r, ttl),
            t0 + 7_000
        );
        // Seen dying: exactly then.
        let mut ended = r.clone();
        ended.ended = Some(Ended {
            ms: t0 + 900,
            how: "killed by SIGKILL".into(),
        });
        assert_eq!(
            crate::locks::last_alive_ms(&store, &me, &ended, ttl),
            t0 + 900
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
