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
}

impl Locks {
    /// Opens the state directory; an unusable one gives one warning and disables records.
    pub fn open(dir: &Path, owner: Owner, ttl: Duration, auto_unlock: bool) -> Locks {
        let store = Store::new(dir);
        let store = match store.prepare().and_then(|()| store.heartbeat(&owner)) {
            Ok(()) => {
                tracing::info!(state_dir = %dir.display(), owner = %owner.name, incarnation = %owner.incarnation(), "lock-owner records enabled");
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
        if let Err(e) = store.heartbeat(&self.owner) {
            tracing::warn!(state_dir = %store.dir().display(), error = %e, "cannot refresh the heartbeat; other pods may take this owner for dead after TFINIT_OWNER_TTL");
        }
    }

    /// Whether `workdir` has a record of a dead owner (so a recovery must run before terraform).
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
                    && owner_dead(store, &self.owner, &r, self.ttl).is_some()
            }
            _ => false,
        })
    }
}

/// Why a record's owner is dead, or None when it may be alive.
///
/// Dead: the record is from an earlier incarnation of our own name (the same name runs once); its
/// name's heartbeat belongs to another incarnation (it restarted); or its heartbeat is older than
/// the TTL (or missing, while the record itself is older than the TTL).
pub fn owner_dead(store: &Store, me: &Owner, rec: &Record, ttl: Duration) -> Option<String> {
    if rec.owner.same_incarnation(me) {
        return None;
    }
    if rec.owner.name == me.name {
        return Some(format!(
            "it is an earlier incarnation of this owner ({}), which restarted",
            me.name
        ));
    }
    match store.read_heartbeat(&rec.owner.name) {
        Some(hb) if !hb.owner.same_incarnation(&rec.owner) => Some(format!(
            "owner {} restarted since (its heartbeat is from incarnation {})",
            rec.owner.name,
            hb.owner.incarnation()
        )),
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

/// The `Who` terraform writes in its lock info for a run with environment `env`: `user@hostname`,
/// as Go's os/user without cgo finds the user (the passwd entry of our uid, else $USER when $USER
/// and $HOME are both set, else empty).
pub fn terraform_who(env: &[String]) -> String {
    let uid = nix::unistd::getuid();
    let user = passwd_name(uid.as_raw()).unwrap_or_else(|| {
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

/// The user name of `uid` in /etc/passwd, as Go's pure-Go lookup reads it.
fn passwd_name(uid: u32) -> Option<String> {
    let text = std::fs::read_to_string("/etc/passwd").ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        let _pw = f.next()?;
        let id: u32 = f.next()?.trim().parse().ok()?;
        (id == uid && !name.is_empty()).then(|| name.to_string())
    })
}
