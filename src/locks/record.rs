//! Lock-owner records and heartbeats: what they hold and how they are checked (format documented
//! in docs/records.md). Where they are stored is `locks::store`.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Format version of records written by this tfinit. A file with a newer version is left alone.
/// Version 2 came with liveness by observation (heartbeats with sequence numbers, one per
/// incarnation): a tfinit of version 1 leaves version-2 records alone, since it would judge
/// their owners by wall-clock stamps and a heartbeat file it does not read.
pub const FORMAT: u32 = 2;

/// The oldest record format this tfinit reads (its owners are judged by the shared heartbeat
/// file of their name, `owners/<name>.json`, when it is that incarnation's).
pub const OLDEST_FORMAT: u32 = 1;

/// Format version of heartbeats (`owners/<name>.<incarnation>.json`).
pub const HEARTBEAT_FORMAT: u32 = 2;

/// Largest record or heartbeat file read; anything bigger is not ours.
pub(super) const MAX_FILE: u64 = 1 << 20;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// How long ago `ms` was, saturating at zero for clocks that disagree.
pub fn age(ms: u64) -> Duration {
    Duration::from_millis(now_ms().saturating_sub(ms))
}

/// Who ran terraform: one incarnation of an owner (a pod, a container restart of it).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Owner {
    /// TFINIT_OWNER (default: the hostname, i.e. the pod name).
    pub name: String,
    /// /proc/sys/kernel/random/boot_id of the node.
    pub boot_id: String,
    /// When this init started, ms since the epoch.
    pub started_ms: u64,
    /// The init's pid (1 in a container).
    pub pid: i32,
    /// The pod's UID from the downward API, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
}

impl Owner {
    /// This process's identity.
    pub fn current(name: &str, pod_uid: Option<String>) -> Owner {
        let boot_id = fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        Owner {
            name: name.to_string(),
            boot_id,
            started_ms: now_ms(),
            pid: std::process::id() as i32,
            pod_uid,
        }
    }

    /// A short string that differs between incarnations of the same name.
    pub fn incarnation(&self) -> String {
        let boot: String = self
            .boot_id
            .chars()
            .filter(|c| c.is_ascii_hexdigit())
            .take(8)
            .collect();
        format!(
            "{}-{}-{}",
            if boot.is_empty() { "noboot" } else { &boot },
            self.started_ms,
            self.pid
        )
    }

    /// The incarnation's key: `name/incarnation`, unique per incarnation.
    pub fn key(&self) -> String {
        format!("{}/{}", self.name, self.incarnation())
    }

    /// Whether `other` is this very incarnation.
    pub fn same_incarnation(&self, other: &Owner) -> bool {
        self.name == other.name
            && self.boot_id == other.boot_id
            && self.started_ms == other.started_ms
            && self.pid == other.pid
            && self.pod_uid == other.pod_uid
    }
}

/// How a run whose record is kept ended (the init saw terraform die, so the run is over even
/// while its owner lives on).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Ended {
    /// When the init reaped terraform, ms since the epoch.
    pub ms: u64,
    /// Why the record was kept: `killed by SIGKILL`, `exit code 255 (...)`, ...
    pub how: String,
}

/// A state-locking run in flight, as left on disk.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Record {
    /// Format version: [`FORMAT`].
    pub v: u32,
    /// Who ran it.
    pub owner: Owner,
    /// The lock's `Who` terraform writes for this run: `user@hostname` (user empty without a
    /// passwd entry and without $USER/$HOME).
    pub who: String,
    /// Run id.
    pub run_id: String,
    /// The shim's working directory.
    #[serde(default)]
    pub cwd: String,
    /// Where terraform works (cwd + -chdir): where its backend configuration is.
    pub workdir: String,
    /// The terraform workspace whose state the run locks.
    #[serde(default = "default_workspace")]
    pub workspace: String,
    /// The terraform subcommand.
    pub subcommand: String,
    /// argv, redacted.
    pub argv: Vec<String>,
    /// When the run started (just before terraform was started), ms since the epoch.
    pub started_ms: u64,
    /// Resources whose create/update/destroy started and did not complete.
    #[serde(default)]
    pub in_progress: Vec<String>,
    /// Last write, ms since the epoch.
    pub updated_ms: u64,
    /// Set when terraform died in a way that may leave its lock (the record is then kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<Ended>,
    /// Set when recovery found the lock held by this dead run but no terraform command can
    /// release it (the state is missing): a person must. The record is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needs_person: Option<NeedsPerson>,
}

/// Why a record waits for a person, and who told them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NeedsPerson {
    /// The incarnation whose recovery reported it: automatic recovery in that incarnation does
    /// not probe or report it again (a later incarnation does, once).
    pub reported_by: String,
    /// When, ms since the epoch.
    pub ms: u64,
    /// The lock id that is stuck.
    pub lock_id: String,
    /// The command that releases the lock by hand.
    pub command: String,
}

fn default_workspace() -> String {
    "default".to_string()
}

/// An incarnation's heartbeat.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Heartbeat {
    /// Format version: [`HEARTBEAT_FORMAT`] (1 in the shared file of the first format).
    pub v: u32,
    /// The incarnation alive.
    pub owner: Owner,
    /// Grows by one with every beat: what observers watch change.
    #[serde(default)]
    pub seq: u64,
    /// Last refresh, ms since the epoch: for people to read; no decision compares it with a clock.
    pub updated_ms: u64,
    /// Whether every terraform run of this incarnation holds its lock file
    /// (`owners/<name>.<incarnation>.lock`), so that the lock being free proves them all gone.
    #[serde(default)]
    pub holds_lock: bool,
}

impl Heartbeat {
    /// What observers compare between two reads.
    pub fn token(&self) -> crate::locks::liveness::Token {
        crate::locks::liveness::Token {
            seq: self.seq,
            updated_ms: self.updated_ms,
        }
    }
}

/// A record file found on disk.
#[derive(Debug)]
pub enum Found {
    /// Parsed.
    Record(PathBuf, Box<Record>),
    /// Not a record we can read (renamed aside by `set_aside_corrupt`).
    Corrupt(PathBuf, String),
    /// A newer format: left alone.
    Future(PathBuf, u32),
    /// Not readable by this uid (another uid's record): left alone.
    Unreadable(PathBuf, String),
}

/// Parses a record file's bytes. Besides JSON shape and version, the fields that become paths or
/// command arguments are checked, so a damaged or hand-made file cannot steer a recovery.
pub fn parse_record(bytes: &[u8]) -> Result<Record, String> {
    #[derive(Deserialize)]
    struct Version {
        v: u32,
    }
    let version: Version =
        serde_json::from_slice(bytes).map_err(|e| format!("not a record: {e}"))?;
    if !(OLDEST_FORMAT..=FORMAT).contains(&version.v) {
        return Err(format!(
            "format version {} (this tfinit reads {OLDEST_FORMAT} to {FORMAT})",
            version.v
        ));
    }
    let rec: Record = serde_json::from_slice(bytes).map_err(|e| format!("not a record: {e}"))?;
    if !crate::config::valid_owner(&rec.owner.name) {
        return Err(format!("invalid owner name {:?}", rec.owner.name));
    }
    if !Path::new(&rec.workdir).is_absolute() {
        return Err(format!("workdir {:?} is not an absolute path", rec.workdir));
    }
    if !valid_workspace(&rec.workspace) {
        return Err(format!("invalid workspace name {:?}", rec.workspace));
    }
    Ok(rec)
}

/// Whether `s` can be a terraform workspace name (terraform allows URL path segment characters).
pub fn valid_workspace(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && !s.starts_with('-')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '~' | '+'))
}

/// A record for unit tests: `owner`'s apply (run r1) in /tf/x, Who `@pod-a`, started now.
#[cfg(test)]
pub(crate) fn sample(owner: &Owner) -> Record {
    Record {
        v: FORMAT,
        owner: owner.clone(),
        who: "@pod-a".into(),
        run_id: "r1".into(),
        cwd: "/tf/x".into(),
        workdir: "/tf/x".into(),
        workspace: "default".into(),
        subcommand: "apply".into(),
        argv: vec!["apply".into()],
        started_ms: now_ms(),
        in_progress: vec![],
        updated_ms: now_ms(),
        ended: None,
        needs_person: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_that_could_steer_a_recovery_are_corrupt() {
        let owner = Owner::current("pod-a", None);
        let ok = serde_json::to_vec(&sample(&owner)).unwrap();
        assert!(parse_record(&ok).is_ok());
        let mut bad_name = sample(&owner);
        bad_name.owner.name = "../../etc/passwd".into();
        let mut relative = sample(&owner);
        relative.workdir = "tf/x".into();
        let mut ws = sample(&owner);
        ws.workspace = "-lock=false".into();
        for r in [bad_name, relative, ws] {
            assert!(
                parse_record(&serde_json::to_vec(&r).unwrap()).is_err(),
                "{r:?}"
            );
        }
        // Fields added later default, so a minimal v1 record still reads.
        let mut v: serde_json::Value = serde_json::from_slice(&ok).unwrap();
        for k in ["cwd", "workspace", "in_progress", "ended"] {
            v.as_object_mut().unwrap().remove(k);
        }
        let r = parse_record(&serde_json::to_vec(&v).unwrap()).unwrap();
        assert_eq!(r.workspace, "default");
        // Truncated at any byte: never a record.
        for cut in 0..ok.len() - 1 {
            assert!(parse_record(&ok[..cut]).is_err(), "cut at {cut}");
        }
    }
}
