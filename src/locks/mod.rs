//! Lock-owner records and safe recovery of state locks left by dead owners.
//!
//! The init writes a record for each state-locking run and refreshes its owner's heartbeat. Before
//! a state-locking run in a directory with a dead owner's record, a recovery helper probes the lock
//! and releases it only when terraform's own Lock Info proves the dead owner holds it.

pub mod book;
pub mod follower;
pub mod liveness;
pub mod lockinfo;
pub mod record;
pub mod recorder;
pub mod recover;
pub mod store;

use std::path::Path;
use std::time::Duration;

use crate::terraform::{env_value, Invocation};
use record::{Ended, Heartbeat, Owner, Record};

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

/// Whether a record's run may still hold its lock, as far as one observer can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunState {
    /// Over: the text says what proves it. Its lock may be probed and released.
    Over(String),
    /// It may be running: its lock is never touched.
    Alive,
    /// Not known yet: its owner's heartbeat has been watched for less than a TTL.
    Watching {
        /// How much longer the watch needs.
        left: Duration,
    },
}

/// Whether the run of a record with `rec` is over, for observer `me`, given what the kernel says
/// of its incarnation's lock file (`kernel`, see [`store::Store::incarnation_gone`]: Some(true)
/// every process of it is gone, Some(false) one still holds it, None nothing known) and what
/// `me` has seen of its heartbeat (`verdict`). The only proofs of an end are: the init saw its
/// terraform die (`ended`), the kernel freed the lock every process of its incarnation held, or
/// a read a full TTL after its heartbeat was first seen shows it unchanged (and the kernel does
/// not say a process of it lives). No wall-clock stamp is compared with any clock.
pub fn run_state(
    me: &Owner,
    rec: &Facts,
    kernel: Option<bool>,
    verdict: liveness::Verdict,
) -> RunState {
    if let Some(end) = &rec.ended {
        return RunState::Over(format!(
            "its terraform ended ({}) and may have left its lock",
            end.how
        ));
    }
    if rec.owner.same_incarnation(me) {
        return RunState::Alive;
    }
    if kernel == Some(false) {
        // A process of that incarnation holds its lock file: whatever its heartbeat does (an
        // init that died outside a PID namespace leaves its runs behind), it is alive.
        return RunState::Alive;
    }
    if kernel == Some(true) {
        return RunState::Over(format!(
            "every process of incarnation {} is gone (the kernel freed the lock file they all held)",
            rec.owner.incarnation()
        ));
    }
    match verdict {
        liveness::Verdict::Dead { watched } => RunState::Over(format!(
            "its owner's heartbeat did not change in {}s of watching",
            watched.as_secs()
        )),
        liveness::Verdict::Alive => RunState::Alive,
        liveness::Verdict::Watching { left } => RunState::Watching { left },
    }
}

/// The latest moment a dead run could have taken a lock, ms since the epoch on its owner's own
/// clock: a lock created later than this (plus clock skew) is not that run's. From the owner's
/// own stamps only (the lock's Created is stamped by the same node): when the init saw terraform
/// die, else the owner's last heartbeat or the record's last write, plus one TTL (it may have
/// lived that long unseen). `hb` is that incarnation's heartbeat.
pub fn last_alive_ms(rec: &Facts, hb: Option<&Heartbeat>, ttl: Duration) -> u64 {
    if let Some(end) = &rec.ended {
        return end.ms;
    }
    let own_beat = hb
        .filter(|hb| hb.owner.same_incarnation(&rec.owner))
        .map_or(0, |hb| hb.updated_ms);
    own_beat
        .max(rec.updated_ms)
        .saturating_add(ttl.as_millis() as u64)
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
