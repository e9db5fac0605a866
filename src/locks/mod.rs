//! Lock-owner records and safe recovery of state locks left by dead owners.
//!
//! The init writes a record for each state-locking run and refreshes its owner's heartbeat. Before
//! a state-locking run in a directory with a dead owner's record, a recovery helper probes the lock
//! and releases it only when terraform's own Lock Info proves the dead owner holds it.

pub mod follower;
pub mod lockinfo;
pub mod record;
pub mod recover;

use std::path::Path;
use std::time::{Duration, Instant};

use record::{Owner, Record, Store};

/// How long the heartbeat of an owner without records is kept after it went silent.
const HEARTBEAT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// The init's side of lock-owner records: the store (when usable), who we are, the heartbeat timer.
#[derive(Debug)]
pub struct Locks {
    /// The state directory, when usable.
    pub store: Option<Store>,
    /// This incarnation.
    pub owner: Owner,
    /// Heartbeat age after which an owner is dead.
    pub ttl: Duration,
    /// Whether automatic force-unlock is on.
    pub auto_unlock: bool,
    next_heartbeat: Instant,
    /// Whether the last heartbeat failed (warn once per failure streak, not every period).
    heartbeat_failing: bool,
}

impl Locks {
    /// Opens the state directory; an unusable one gives one warning and disables records.
    pub fn open(dir: &Path, owner: Owner, ttl: Duration, auto_unlock: bool) -> Locks {
        let store = Store::new(dir);
        let store = match store.prepare().and_then(|()| store.heartbeat(&owner)) {
            Ok(()) => {
                tracing::info!(state_dir = %dir.display(), owner = %owner.name, incarnation = %owner.incarnation(), "lock-owner records enabled");
                // Unreadable records are set aside now, so each is reported once.
                let records = store.sweep();
                store.prune_heartbeats(&records, &owner, HEARTBEAT_RETENTION.max(ttl));
                let stale = records
                    .iter()
                    .filter(|(_, r)| run_dead(&store, &owner, r, ttl).is_some())
                    .count();
                if stale > 0 {
                    tracing::info!(
                        records = stale,
                        auto = auto_unlock,
                        "lock-owner records of dead owners found: each is checked before the next state-locking run in its directory{}",
                        if auto_unlock { "" } else { " (TFINIT_FORCE_UNLOCK=off: run `tfinit recover` by hand)" }
                    );
                }
                Some(store)
            }
            Err(e) => {
                tracing::warn!(
                    state_dir = %dir.display(),
                    error = %e,
                    "TFINIT_STATE_DIR is not usable: tfinit keeps working without lock-owner records, so a \
                     state lock left by this pod's death will not be released automatically. Mount a \
                     writable volume there (emptyDir for container restarts, a PVC for pod replacement) \
                     or set TFINIT_STATE_DIR to one"
                );
                None
            }
        };
        Locks {
            store,
            owner,
            ttl,
            auto_unlock,
            next_heartbeat: Instant::now() + ttl / 3,
            heartbeat_failing: false,
        }
    }

    /// When the heartbeat is next due.
    pub fn next_heartbeat(&self) -> Option<Instant> {
        self.store.as_ref().map(|_| self.next_heartbeat)
    }

    /// Refreshes the heartbeat if due.
    pub fn tick(&mut self, now: Instant) {
        let Some(store) = &self.store else { return };
        if now < self.next_heartbeat {
            return;
        }
        self.next_heartbeat = now + self.ttl / 3;
        match store.heartbeat(&self.owner) {
            Ok(()) => {
                if std::mem::replace(&mut self.heartbeat_failing, false) {
                    tracing::info!(state_dir = %store.dir().display(), "heartbeat refreshed again");
                }
            }
            Err(e) => {
                if !std::mem::replace(&mut self.heartbeat_failing, true) {
                    tracing::warn!(state_dir = %store.dir().display(), error = %e, "cannot refresh the heartbeat; other pods may take this owner for dead after TFINIT_OWNER_TTL and release its locks");
                }
            }
        }
    }

    /// Whether `workdir` has a record of a dead owner or a killed run (so a recovery must run
    /// before terraform).
    pub fn needs_recovery(&self, workdir: &Path) -> bool {
        let Some(store) = &self.store else {
            return false;
        };
        if !self.auto_unlock {
            return false;
        }
        store.list().into_iter().any(|f| match f {
            record::Found::Record(_, r) => {
                Path::new(&r.workdir) == workdir
                    && run_dead(store, &self.owner, &r, self.ttl).is_some()
            }
            _ => false,
        })
    }
}

/// Why a record's run is over, or None when it may still run (then its lock is never touched).
///
/// Over: terraform was seen dying (`ended`), or its owner is dead (see [`owner_dead`]).
pub fn run_dead(store: &Store, me: &Owner, rec: &Record, ttl: Duration) -> Option<String> {
    if let Some(end) = &rec.ended {
        return Some(format!(
            "its terraform ended ({}) and may have left its lock",
            end.how
        ));
    }
    owner_dead(store, me, rec, ttl)
}

/// Why a record's owner is dead, or None when it may be alive.
///
/// Dead: the record is from an earlier incarnation of our own name (the same name runs once),
/// unless another incarnation of that name refreshed its heartbeat since we started (two live
/// owners share a name: a misconfiguration, and then nothing is dead); its name's heartbeat
/// belongs to a later incarnation (it restarted); or its heartbeat is older than the TTL (or
/// missing, while the record itself is older than the TTL).
pub fn owner_dead(store: &Store, me: &Owner, rec: &Record, ttl: Duration) -> Option<String> {
    if rec.owner.same_incarnation(me) {
        return None;
    }
    let hb = store.read_heartbeat(&rec.owner.name);
    if rec.owner.name == me.name {
        if let Some(hb) = &hb {
            if !hb.owner.same_incarnation(me)
                && hb.updated_ms > me.started_ms
                && record::age(hb.updated_ms) <= ttl
            {
                tracing::warn!(
                    owner = %me.name, other = %hb.owner.incarnation(), me = %me.incarnation(),
                    "another live tfinit uses this owner name and the same TFINIT_STATE_DIR: give each pod its own TFINIT_OWNER (the default, the hostname, is unique per pod); their records are left alone"
                );
                return None;
            }
        }
        return Some(format!(
            "it is an earlier incarnation of this owner ({}), which restarted",
            me.name
        ));
    }
    match hb {
        Some(hb) if !hb.owner.same_incarnation(&rec.owner) => {
            if hb.owner.started_ms > rec.owner.started_ms {
                return Some(format!(
                    "owner {} restarted since (its heartbeat is from incarnation {})",
                    rec.owner.name,
                    hb.owner.incarnation()
                ));
            }
            // A heartbeat older than the record's incarnation: that incarnation never wrote
            // one (its directory was not writable then?). Judge by age, like a missing one.
            let age = record::age(rec.updated_ms.max(hb.updated_ms));
            (age > ttl).then(|| {
                format!(
                    "it has no heartbeat of its own and nothing of it is newer than {}s",
                    age.as_secs()
                )
            })
        }
        Some(hb) => {
            let age = record::age(hb.updated_ms);
            (age > ttl).then(|| {
                format!(
                    "its heartbeat is {}s old (TFINIT_OWNER_TTL is {}s)",
                    age.as_secs(),
                    ttl.as_secs()
                )
            })
        }
        None => {
            let age = record::age(rec.updated_ms);
            (age > ttl).then(|| {
                format!(
                    "it has no heartbeat and the record is {}s old",
                    age.as_secs()
                )
            })
        }
    }
}

/// The latest moment a dead run could have taken a lock, ms since the epoch: a lock created later
/// than this (plus clock skew) is not that run's. From what the state directory proves: when the
/// init saw terraform die; the owner's last heartbeat plus one TTL (it may have lived that long
/// unseen); the start of the incarnation that replaced it; and the record's own last write.
pub fn last_alive_ms(store: &Store, me: &Owner, rec: &Record, ttl: Duration) -> u64 {
    if let Some(end) = &rec.ended {
        return end.ms;
    }
    let ttl_ms = ttl.as_millis() as u64;
    if rec.owner.name == me.name && !rec.owner.same_incarnation(me) {
        // An earlier incarnation of ours was gone before this one started.
        return me.started_ms.max(rec.updated_ms);
    }
    match store.read_heartbeat(&rec.owner.name) {
        Some(hb) if hb.owner.same_incarnation(&rec.owner) => {
            hb.updated_ms.max(rec.updated_ms).saturating_add(ttl_ms)
        }
        Some(hb) if hb.owner.started_ms > rec.owner.started_ms => {
            hb.owner.started_ms.max(rec.updated_ms)
        }
        // No heartbeat of its own: only the record's last write proves it was alive.
        _ => rec.updated_ms.saturating_add(ttl_ms),
    }
}

/// The terraform workspace a run with `args` and environment `env` works on in `workdir`:
/// `workspace new|delete NAME` lock NAME's state; otherwise $TF_WORKSPACE, else the workspace
/// `terraform workspace select` stored in the data directory, else `default`.
pub fn workspace_of(args: &[String], subcommand: &str, env: &[String], workdir: &Path) -> String {
    let get = |k: &str| {
        env.iter()
            .find_map(|kv| kv.strip_prefix(k).and_then(|r| r.strip_prefix('=')))
            .filter(|v| !v.is_empty())
    };
    if subcommand == "workspace new" || subcommand == "workspace delete" {
        let verb = subcommand.trim_start_matches("workspace ");
        let name = args
            .iter()
            .skip_while(|a| *a != "workspace")
            .skip_while(|a| *a != verb)
            .skip(1)
            .find(|a| !a.starts_with('-'));
        if let Some(n) = name.filter(|n| record::valid_workspace(n)) {
            return n.clone();
        }
    }
    if let Some(w) = get("TF_WORKSPACE").filter(|w| record::valid_workspace(w)) {
        return w.to_string();
    }
    let data_dir = get("TF_DATA_DIR").unwrap_or(".terraform");
    let stored = std::fs::read_to_string(workdir.join(data_dir).join("environment"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    if record::valid_workspace(&stored) {
        stored
    } else {
        "default".to_string()
    }
}

/// The `Who` terraform writes in its lock info for a run with environment `env`: `user@hostname`,
/// as Go's os/user without cgo finds the user (the passwd entry of our uid, else $USER when $USER
/// and $HOME are both set, else empty). terraform binaries are built without cgo.
pub fn terraform_who(env: &[String]) -> String {
    let uid = nix::unistd::getuid();
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let user = passwd_name(&passwd, uid.as_raw()).unwrap_or_else(|| {
        let get = |k: &str| {
            env.iter()
                .find_map(|kv| kv.strip_prefix(k).and_then(|r| r.strip_prefix('=')))
        };
        match (get("USER"), get("HOME")) {
            (Some(u), Some(h)) if !u.is_empty() && !h.is_empty() => u.to_string(),
            _ => String::new(),
        }
    });
    format!("{user}@{}", crate::config::hostname())
}

/// The user name of `uid` in passwd text, exactly as Go's pure-Go lookup (os/user,
/// lookup_unix.go) reads it: lines trimmed, `#` comments skipped, at least 6 colons, the uid field
/// equal to the decimal uid as a string, a name not starting with `+` or `-`, numeric uid and gid.
fn passwd_name(text: &str, uid: u32) -> Option<String> {
    let want = uid.to_string();
    let numeric = |s: &str| {
        let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
        !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
    };
    text.lines().find_map(|line| {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.matches(':').count() < 6 {
            return None;
        }
        let parts: Vec<&str> = line.splitn(7, ':').collect();
        let name = parts[0];
        let ok = parts.len() >= 6
            && parts[2] == want
            && !name.is_empty()
            && !name.starts_with(['+', '-'])
            && numeric(parts[2])
            && numeric(parts[3]);
        ok.then(|| name.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwd_lookup_matches_go() {
        let text =
            "# comment\nroot:x:0:0:root:/root:/bin/bash\n  app:x:1000:1000::/home/app:/bin/sh\n\
                    +nis:x:2000:2000::/:/bin/sh\nshort:x:3000:3000\nzero:x:0042:1::/:/bin/sh\n\
                    badgid:x:5000:g::/:/bin/sh\n";
        assert_eq!(passwd_name(text, 0).as_deref(), Some("root"));
        assert_eq!(passwd_name(text, 1000).as_deref(), Some("app"));
        assert_eq!(passwd_name(text, 2000), None, "+ entries are NIS markers");
        assert_eq!(passwd_name(text, 3000), None, "fewer than 6 colons");
        assert_eq!(passwd_name(text, 42), None, "uid compared as a string");
        assert_eq!(passwd_name(text, 5000), None, "gid must be numeric");
        assert_eq!(passwd_name(text, 4321), None);
    }

    #[test]
    fn workspace_from_args_env_and_data_dir() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let dir = std::env::temp_dir().join(format!("tfinit-ws-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join(".terraform")).unwrap();
        assert_eq!(workspace_of(&s(&["apply"]), "apply", &[], &dir), "default");
        std::fs::write(dir.join(".terraform/environment"), "staging").unwrap();
        assert_eq!(workspace_of(&s(&["apply"]), "apply", &[], &dir), "staging");
        assert_eq!(
            workspace_of(&s(&["apply"]), "apply", &s(&["TF_WORKSPACE=prod"]), &dir),
            "prod"
        );
        assert_eq!(
            workspace_of(
                &s(&["workspace", "new", "-lock-timeout=1s", "feature"]),
                "workspace new",
                &s(&["TF_WORKSPACE=prod"]),
                &dir
            ),
            "feature"
        );
        std::fs::write(dir.join(".terraform/environment"), "../../etc").unwrap();
        assert_eq!(workspace_of(&s(&["plan"]), "plan", &[], &dir), "default");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
