//! Lock-owner records and safe recovery of state locks left by dead owners.
//!
//! The init writes a record for each state-locking run and refreshes its owner's heartbeat. Before
//! a state-locking run in a directory with a dead owner's record, a recovery helper probes the lock
//! and releases it only when terraform's own Lock Info proves the dead owner holds it.

pub mod book;
pub mod follower;
pub mod lockinfo;
pub mod record;
pub mod recorder;
pub mod recover;
pub mod store;

use std::path::Path;
use std::time::Duration;

use crate::terraform::{env_value, Invocation};
use record::{Ended, Heartbeat, Owner, Record};
use store::Store;

/// What the liveness rules read of a record: its owner, its last write and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// Who ran it.
    pub owner: Owner,
    /// Its last write, ms since the epoch.
    pub updated_ms: u64,
    /// Set when the init saw terraform die.
    pub ended: Option<Ended>,
    /// The incarnation that reported the record as needing a person, if one did.
    pub needs_person_by: Option<String>,
}

impl Facts {
    /// The facts of `rec`.
    pub fn of(rec: &Record) -> Facts {
        Facts {
            owner: rec.owner.clone(),
            updated_ms: rec.updated_ms,
            ended: rec.ended.clone(),
            needs_person_by: rec.needs_person.as_ref().map(|n| n.reported_by.clone()),
        }
    }
}

/// [`run_dead_at`] now, with the owner's heartbeat read from `store`.
pub fn run_dead(store: &dyn Store, me: &Owner, rec: &Record, ttl: Duration) -> Option<String> {
    let hb = store.read_heartbeat(&rec.owner.name);
    run_dead_at(me, &Facts::of(rec), hb.as_ref(), ttl, record::now_ms())
}

/// [`last_alive_ms_at`] with the owner's heartbeat read from `store`.
pub fn last_alive_ms(store: &dyn Store, me: &Owner, rec: &Record, ttl: Duration) -> u64 {
    let hb = store.read_heartbeat(&rec.owner.name);
    last_alive_ms_at(me, &Facts::of(rec), hb.as_ref(), ttl)
}

/// Whether the init's automatic recovery should look at a record before a run in its directory:
/// its run is over, and it is not a record this incarnation already reported as needing a person
/// (that lock cannot be released by terraform; probing again would only repeat the error).
pub fn wants_recovery_at(
    me: &Owner,
    rec: &Facts,
    hb: Option<&Heartbeat>,
    ttl: Duration,
    now_ms: u64,
) -> bool {
    run_dead_at(me, rec, hb, ttl, now_ms).is_some()
        && rec.needs_person_by.as_deref() != Some(me.incarnation().as_str())
}

/// Why a record's run is over at `now_ms`, or None when it may still run (then its lock is never
/// touched). `hb` is the heartbeat of the record's owner name, as last read.
///
/// Over: terraform was seen dying (`ended`), or its owner is dead (see [`owner_dead`]).
pub fn run_dead_at(
    me: &Owner,
    rec: &Facts,
    hb: Option<&Heartbeat>,
    ttl: Duration,
    now_ms: u64,
) -> Option<String> {
    if let Some(end) = &rec.ended {
        return Some(format!(
            "its terraform ended ({}) and may have left its lock",
            end.how
        ));
    }
    owner_dead_at(me, rec, hb, ttl, now_ms)
}

/// Why a record's owner is dead at `now_ms` given its name's heartbeat `hb`, or None when it may be
/// alive.
///
/// Dead: the record is from an earlier incarnation of our own name (the same name runs once),
/// unless another incarnation of that name refreshed its heartbeat since we started (two live
/// owners share a name: a misconfiguration, and then nothing is dead); its name's heartbeat
/// belongs to a later incarnation (it restarted); or its heartbeat is older than the TTL (or
/// missing, while the record itself is older than the TTL).
pub fn owner_dead_at(
    me: &Owner,
    rec: &Facts,
    hb: Option<&Heartbeat>,
    ttl: Duration,
    now_ms: u64,
) -> Option<String> {
    let age = |ms: u64| Duration::from_millis(now_ms.saturating_sub(ms));
    if rec.owner.same_incarnation(me) {
        return None;
    }
    if rec.owner.name == me.name {
        if let Some(hb) = hb {
            if !hb.owner.same_incarnation(me)
                && hb.updated_ms > me.started_ms
                && age(hb.updated_ms) <= ttl
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
            let age = age(rec.updated_ms.max(hb.updated_ms));
            (age > ttl).then(|| {
                format!(
                    "it has no heartbeat of its own and nothing of it is newer than {}s",
                    age.as_secs()
                )
            })
        }
        Some(hb) => {
            let age = age(hb.updated_ms);
            (age > ttl).then(|| {
                format!(
                    "its heartbeat is {}s old (TFINIT_OWNER_TTL is {}s)",
                    age.as_secs(),
                    ttl.as_secs()
                )
            })
        }
        None => {
            let age = age(rec.updated_ms);
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
/// unseen); the start of the incarnation that replaced it; and the record's own last write. `hb` is
/// the heartbeat of the record's owner name.
pub fn last_alive_ms_at(me: &Owner, rec: &Facts, hb: Option<&Heartbeat>, ttl: Duration) -> u64 {
    if let Some(end) = &rec.ended {
        return end.ms;
    }
    let ttl_ms = ttl.as_millis() as u64;
    if rec.owner.name == me.name && !rec.owner.same_incarnation(me) {
        // An earlier incarnation of ours was gone before this one started.
        return me.started_ms.max(rec.updated_ms);
    }
    match hb {
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

/// The terraform workspace a run of `invocation` with environment `env` works on:
/// `workspace new|delete|select NAME` lock NAME's state; otherwise $TF_WORKSPACE, else `stored`
/// (the workspace `terraform workspace select` stored in the data directory, which the shim reads
/// and sends: see [`stored_workspace`]), else `default`. Pure: reads no file.
pub fn workspace_of(invocation: &Invocation, env: &[String], stored: Option<&str>) -> String {
    if let Some(n) = invocation
        .workspace_arg()
        .filter(|n| record::valid_workspace(n))
    {
        return n.to_string();
    }
    if let Some(w) = env_value(env, "TF_WORKSPACE").filter(|w| record::valid_workspace(w)) {
        return w.to_string();
    }
    match stored.filter(|w| record::valid_workspace(w)) {
        Some(w) => w.to_string(),
        None => "default".to_string(),
    }
}

/// The workspace stored in the data directory of `workdir` (`$TF_DATA_DIR/environment`, default
/// `.terraform/environment`), if there is a valid one. Reads a file in a working directory: only
/// the shim calls it, in its own process, never the init's loop.
pub fn stored_workspace(env: &[String], workdir: &Path) -> Option<String> {
    let data_dir = env_value(env, "TF_DATA_DIR").unwrap_or(".terraform");
    let stored = std::fs::read_to_string(workdir.join(data_dir).join("environment")).ok()?;
    let stored = stored.trim();
    record::valid_workspace(stored).then(|| stored.to_string())
}

/// The `Who` terraform writes in its lock info for a run with environment `env`: `user@hostname`,
/// as Go's os/user without cgo finds the user (the passwd entry of our uid, else $USER when $USER
/// and $HOME are both set, else empty). terraform binaries are built without cgo. Reads
/// /etc/passwd: never on the PID-1 loop (there, [`who_for`] with the recorder's answer).
pub fn terraform_who(env: &[String]) -> String {
    who_for(passwd_user().as_deref(), &crate::config::hostname(), env)
}

/// The passwd entry's user name of our uid, as Go's pure-Go os/user finds it (reads /etc/passwd).
pub fn passwd_user() -> Option<String> {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd_name(&passwd, nix::unistd::getuid().as_raw())
}

/// The lock's `Who` for a run with environment `env`, given our uid's passwd user name (see
/// [`passwd_user`]) and the hostname: no I/O.
pub fn who_for(passwd_user: Option<&str>, host: &str, env: &[String]) -> String {
    let user = passwd_user.map(str::to_string).unwrap_or_else(|| {
        let get = |k: &str| {
            env.iter()
                .find_map(|kv| kv.strip_prefix(k).and_then(|r| r.strip_prefix('=')))
        };
        match (get("USER"), get("HOME")) {
            (Some(u), Some(h)) if !u.is_empty() && !h.is_empty() => u.to_string(),
            _ => String::new(),
        }
    });
    format!("{user}@{host}")
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
        let run = |args: &[&str], env: &[&str], stored: Option<&str>| {
            let env = s(env);
            workspace_of(&Invocation::parse(&s(args), &env), &env, stored)
        };
        let dir = std::env::temp_dir().join(format!("tfinit-ws-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join(".terraform")).unwrap();
        assert_eq!(stored_workspace(&[], &dir), None);
        assert_eq!(run(&["apply"], &[], None), "default");
        std::fs::write(dir.join(".terraform/environment"), "staging\n").unwrap();
        let stored = stored_workspace(&[], &dir);
        assert_eq!(stored.as_deref(), Some("staging"));
        assert_eq!(run(&["apply"], &[], stored.as_deref()), "staging");
        assert_eq!(
            run(&["apply"], &["TF_WORKSPACE=prod"], stored.as_deref()),
            "prod"
        );
        assert_eq!(
            run(
                &["workspace", "new", "-lock-timeout=1s", "feature"],
                &["TF_WORKSPACE=prod"],
                stored.as_deref()
            ),
            "feature"
        );
        // NAME is the first operand as Go's flag package reads it: `-lock-timeout 1s` takes the
        // next argument as its value, so `1s` is no workspace.
        assert_eq!(
            run(
                &["workspace", "new", "-lock-timeout", "1s", "feature"],
                &[],
                stored.as_deref()
            ),
            "feature"
        );
        // `select -or-create` creates NAME under NAME's lock; `env` is the old name of `workspace`.
        assert_eq!(
            run(
                &["workspace", "select", "-or-create", "feature"],
                &[],
                stored.as_deref()
            ),
            "feature"
        );
        assert_eq!(
            run(&["env", "new", "--", "feature"], &[], stored.as_deref()),
            "feature"
        );
        // TF_DATA_DIR moves the file; the default one is then not read.
        std::fs::create_dir_all(dir.join("data")).unwrap();
        std::fs::write(dir.join("data/environment"), "other").unwrap();
        assert_eq!(
            stored_workspace(&s(&["TF_DATA_DIR=data"]), &dir).as_deref(),
            Some("other")
        );
        // A stored value that is no valid workspace name is not used, read or sent.
        std::fs::write(dir.join(".terraform/environment"), "../../etc").unwrap();
        assert_eq!(stored_workspace(&[], &dir), None);
        assert_eq!(run(&["plan"], &[], Some("../../etc")), "default");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
