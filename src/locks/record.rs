//! Lock-owner records and heartbeats: what they hold and how they are checked (format documented
//! in docs/records.md). Where they are stored is `locks::store`.

use std::borrow::Cow;
use std::fs;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::names::{valid_owner, valid_run_id, valid_workspace};
use super::record_id::RecordId;

/// Format version of records written by this tfinit. A file with a newer version is left alone.
/// Version 2 came with liveness by observation (heartbeats with sequence numbers, one per
/// incarnation): a tfinit of version 1 leaves version-2 records alone, since it would judge
/// their owners by wall-clock stamps and a heartbeat file it does not read. Version 3 added the
/// owner's `nonce` to the incarnation, so the names of its heartbeat files: a tfinit of version
/// 2 would look for a heartbeat under a name without it, find none, and take a live owner for dead.
/// Version 4 added the owner's TTL (`ttl_ms`), which every observer must judge the owner by: a
/// tfinit of version 3 would judge a version-4 owner by its own TTL, which may be shorter.
pub const FORMAT: u32 = 4;

/// The oldest record format this tfinit reads (its owners are judged by the shared heartbeat
/// file of their name, `owners/<name>.json`, when it is that incarnation's).
pub const OLDEST_FORMAT: u32 = 1;

/// Format version of heartbeats (`owners/<name>.<incarnation>.json`). The fields added since
/// (`ttl_ms`, `lock_file`) are optional: an older tfinit still reads a newer heartbeat and sees it
/// change (it only ever reads one to judge an owner of a record it reads, or a live tfinit on a
/// lock's host, and a live owner's beats change whatever else the file holds).
pub const HEARTBEAT_FORMAT: u32 = 2;

/// Largest record or heartbeat file read; anything bigger is not ours (this tfinit caps what it
/// writes far below: [`Record::fitted`]).
pub(super) const MAX_FILE: u64 = 1 << 20;

/// Most bytes `argv`, and separately `in_progress`, take in a record file (as JSON, pretty
/// printed). The rest of a record is a few kilobytes at most (paths, names), so a record stays far
/// below [`MAX_FILE`] whatever terraform was given: a `terraform state rm` of 25,000 addresses,
/// an apply with 30,000 resources in flight.
pub const LIST_BUDGET: usize = 128 * 1024;

/// How the marker entry starts that stands for the entries a list could not keep: `… 24812 more
/// arguments not recorded`. No resource address starts with it (an address starts with a letter:
/// a type, `data.` or `module.`), and nothing in a recovery reads `argv` or `in_progress` but to
/// print them.
pub const OMITTED_MARK: &str = "\u{2026} ";

/// Milliseconds since the Unix epoch (the simulation's node clock in its thread:
/// [`crate::mutation::at_wall_ms`]).
pub fn now_ms() -> u64 {
    if let Some(ms) = crate::mutation::wall_ms() {
        return ms;
    }
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// How long ago `ms` was, saturating at zero for clocks that disagree.
pub fn age(ms: u64) -> Duration {
    Duration::from_millis(now_ms().saturating_sub(ms))
}

/// Appends `n` in decimal.
fn push_decimal(s: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[i..] {
        s.push(char::from(d));
    }
}

/// The longest incarnation: 8 hex digits (or `noboot`), a u64 of ms, a signed i32, 8 hex digits.
const INCARNATION_LEN: usize = 8 + 1 + 20 + 1 + 11 + 1 + 8;

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
    /// Random bits drawn at start, part of the incarnation: two inits on one node that start in
    /// the same millisecond as PID 1 (two `hostNetwork` pods with one owner name) are two
    /// incarnations with a heartbeat file each. Absent in records of format 1 and 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<u32>,
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
            nonce: Some(crate::sys::random_u32()),
        }
    }

    /// A short string that differs between incarnations of the same name:
    /// `boot-started_ms-pid[-nonce]`, `boot` the boot id's first 8 hex digits (or `noboot`).
    pub fn incarnation(&self) -> String {
        let mut s = String::with_capacity(INCARNATION_LEN);
        self.push_incarnation(&mut s);
        s
    }

    /// The incarnation's key: `name/incarnation`, unique per incarnation.
    pub fn key(&self) -> String {
        let mut s = String::with_capacity(self.name.len() + 1 + INCARNATION_LEN);
        s.push_str(&self.name);
        s.push('/');
        self.push_incarnation(&mut s);
        s
    }

    /// Appends [`Self::incarnation`] to `s`, in one buffer and without `fmt`: keys are made for
    /// every heartbeat of every scan and for each judgement of the recovery, and the three
    /// allocations and two `format!`s of each were 20 % of the simulation's instructions (this
    /// way 14 %; a stack buffer pushed once was no better in test builds, 15 %).
    fn push_incarnation(&self, s: &mut String) {
        let start = s.len();
        for b in self.boot_id.bytes().filter(u8::is_ascii_hexdigit).take(8) {
            s.push(char::from(b));
        }
        if s.len() == start {
            s.push_str("noboot");
        }
        s.push('-');
        push_decimal(s, self.started_ms);
        s.push('-');
        if self.pid < 0 {
            s.push('-');
        }
        push_decimal(s, u64::from(self.pid.unsigned_abs()));
        if let Some(nonce) = self.nonce {
            s.push('-');
            for shift in (0..8).rev() {
                s.push(char::from(
                    b"0123456789abcdef"[(nonce >> (shift * 4)) as usize & 0xf],
                ));
            }
        }
    }

    /// Whether `other` is this very incarnation.
    pub fn same_incarnation(&self, other: &Owner) -> bool {
        self.name == other.name
            && self.boot_id == other.boot_id
            && self.started_ms == other.started_ms
            && self.pid == other.pid
            && self.pod_uid == other.pod_uid
            && self.nonce == other.nonce
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
    /// The owner's TFINIT_OWNER_TTL, ms (format 4): what observers judge its heartbeat by when
    /// the heartbeat itself is missing. None in records of format 1 to 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// The run's TF_DATA_DIR, as an absolute path, when it set one: where terraform stored the
    /// backend settings that name the state its lock guards (`locks::state`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<String>,
}

impl Record {
    /// The owner's TTL this record states, if it states one.
    pub fn owner_ttl(&self) -> Option<Duration> {
        self.ttl_ms.filter(|ms| *ms > 0).map(Duration::from_millis)
    }
}

impl Record {
    /// This record as it is written: `argv` and `in_progress` each keep the longest prefix that
    /// fits in [`LIST_BUDGET`], and a last marker entry ([`OMITTED_MARK`]) counts what they
    /// dropped. `FileStore::write` writes nothing else, so no record is ever too large to be read
    /// back (a record read as corrupt would be set aside while its owner lives).
    pub fn fitted(&self) -> Cow<'_, Record> {
        self.fitted_within(LIST_BUDGET)
    }

    /// [`Record::fitted`] with `budget` bytes for each list instead of [`LIST_BUDGET`] (a store
    /// whose objects are smaller than a file may be: the Kubernetes store's annotations).
    pub fn fitted_within(&self, budget: usize) -> Cow<'_, Record> {
        let argv = fit(&self.argv, "arguments", budget);
        let in_progress = fit(&self.in_progress, "resources in progress", budget);
        if argv.is_none() && in_progress.is_none() {
            return Cow::Borrowed(self);
        }
        // Only a record over the budget is copied: a rare, large one.
        let mut fitted = self.clone();
        if let Some(a) = argv {
            fitted.argv = a;
        }
        if let Some(p) = in_progress {
            fitted.in_progress = p;
        }
        Cow::Owned(fitted)
    }
}

/// `list` cut to fit in `budget` bytes with a marker entry counting the rest (`what`:
/// `arguments`), or None when it fits whole.
fn fit(list: &[String], what: &str, budget: usize) -> Option<Vec<String>> {
    // Room left for the marker itself when the list is cut.
    const MARKER_ROOM: usize = 128;
    let mut used = 0;
    let mut cut_at = None;
    for (i, entry) in list.iter().enumerate() {
        used += json_len(entry);
        if cut_at.is_none() && used > budget.saturating_sub(MARKER_ROOM) {
            cut_at = Some(i);
        }
        if used > budget {
            let keep = cut_at.unwrap_or(i);
            let mut fitted = list[..keep].to_vec();
            fitted.push(format!(
                "{OMITTED_MARK}{} more {what} not recorded",
                list.len() - keep
            ));
            return Some(fitted);
        }
    }
    None
}

/// The bytes `entry` takes in a pretty-printed list: its JSON string (escapes included), the
/// indentation, the comma and the line break.
fn json_len(entry: &str) -> usize {
    const PRETTY_LIST_ITEM: usize = "    ,\n".len();
    serde_json::to_string(entry).map_or(entry.len() * 6 + 2, |s| s.len()) + PRETTY_LIST_ITEM
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
    /// The hostname this incarnation's terraform runs see: the host part of their locks' Who.
    /// A lock whose Who names the host of a live tfinit is never released (its unrecorded runs
    /// lock as that Who too).
    #[serde(default)]
    pub host: String,
    /// The incarnation's TFINIT_OWNER_TTL, ms: observers watch this heartbeat for this long (or
    /// their own TTL, whichever is longer) before they call the incarnation dead, since this is
    /// what its fence counts by. None in heartbeats of tfinits before record format 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// The device and inode of the lock file the incarnation holds (with `holds_lock`): a free
    /// flock proves the incarnation gone only on this very file, never on a file that replaced it
    /// at the same path (a restore from a backup, a person's `cp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_file: Option<FileId>,
}

impl Heartbeat {
    /// The owner's TTL this heartbeat states, if it states one.
    pub fn owner_ttl(&self) -> Option<Duration> {
        self.ttl_ms.filter(|ms| *ms > 0).map(Duration::from_millis)
    }
}

/// A file by what it is (device and inode): the one type the wire and the heartbeats share.
pub use crate::protocol::FileId;

/// A record file found on disk.
#[derive(Debug)]
pub enum Found {
    /// Parsed.
    Record(RecordId, Box<Record>),
    /// A regular file of at most [`MAX_FILE`] bytes that is no record of a version we know: no
    /// live tfinit leaves one (its writes are atomic, fitted and checked to read back), so it is
    /// set aside (`set_aside_corrupt`). The text says why it is not a record.
    Corrupt(RecordId, String),
    /// A newer format: left alone.
    Future(RecordId, u32),
    /// Not readable by this uid (another uid's record): left alone.
    Unreadable(RecordId, String),
    /// Not read, and left where it is: it may be a live owner's, or moving it could hurt.
    LeftAlone(RecordId, Unread),
    /// The listing itself got no answer (the records directory could not be read, the API did
    /// not answer or refused): which records there are is unknown, not "none". The text says
    /// why.
    Unlisted(String),
}

/// Why a file in `records/` was left alone unread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unread {
    /// Not a regular file (the text: `a FIFO`, `a symbolic link`, ...): never opened for reading
    /// (a FIFO would block the reader for good) nor followed; a person removes it.
    NotRegular(&'static str),
    /// Larger than [`MAX_FILE`] (its size): a tfinit older than the record cap writes records this
    /// large, and may still be alive and running that terraform.
    TooLarge(u64),
    /// Reading it failed (an I/O error; on NFS a stale handle while its owner replaced it): it is
    /// read again by the next sweep or recovery.
    Failed(String),
}

/// Why bytes found as a record file are not a record this tfinit reads. A reader tells a
/// record of a newer format ([`RecordError::future`]: left alone, for the tfinit that wrote it)
/// from a damaged one (set aside).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// Not JSON, or not the shape of a record (serde_json's message).
    #[error("not a record: {0}")]
    NotARecord(String),
    /// A format version this tfinit does not read: older than [`OLDEST_FORMAT`], or newer than
    /// [`FORMAT`] (a newer tfinit's).
    #[error(
        "format version {v} (this tfinit reads {} to {})",
        OLDEST_FORMAT,
        FORMAT
    )]
    Version {
        /// The version the file states.
        v: u32,
    },
    /// An owner name that is not one (it becomes a file name).
    #[error("invalid owner name {0:?}")]
    Owner(String),
    /// A run id that is not what the init makes (it becomes a file name).
    #[error("invalid run id {0:?} (tfinit writes r1, r2, ...)")]
    RunId(String),
    /// A working directory that is not an absolute path.
    #[error("workdir {0:?} is not an absolute path")]
    Workdir(String),
    /// A workspace name that is not one.
    #[error("invalid workspace name {0:?}")]
    Workspace(String),
    /// A TF_DATA_DIR that is not an absolute path.
    #[error("data_dir {0:?} is not an absolute path")]
    DataDir(String),
}

impl RecordError {
    /// The format version of a record written by a newer tfinit, which this one leaves alone
    /// rather than set aside as corrupt.
    pub fn future(&self) -> Option<u32> {
        match self {
            RecordError::Version { v } if *v > FORMAT => Some(*v),
            _ => None,
        }
    }
}

/// Parses a record file's bytes. Besides JSON shape and version, the fields that become paths or
/// command arguments are checked, so a damaged or hand-made file cannot steer a recovery.
pub fn parse_record(bytes: &[u8]) -> Result<Record, RecordError> {
    #[derive(Deserialize)]
    struct Version {
        v: u32,
    }
    let not_a_record = |e: serde_json::Error| RecordError::NotARecord(e.to_string());
    let version: Version = serde_json::from_slice(bytes).map_err(not_a_record)?;
    if !(OLDEST_FORMAT..=FORMAT).contains(&version.v) {
        return Err(RecordError::Version { v: version.v });
    }
    let rec: Record = serde_json::from_slice(bytes).map_err(not_a_record)?;
    check_record(rec)
}

/// A record read some other way (an entry of an incarnation's file) checked as [`parse_record`]
/// checks a file's: its version, and the fields that become paths or command arguments.
pub fn check_record(rec: Record) -> Result<Record, RecordError> {
    if !(OLDEST_FORMAT..=FORMAT).contains(&rec.v) {
        return Err(RecordError::Version { v: rec.v });
    }
    if !valid_owner(&rec.owner.name) {
        return Err(RecordError::Owner(rec.owner.name));
    }
    // The run id is part of the file name a recovery writes the record back to (`needs_person`):
    // it must be what the init makes, `r` and a number, and no path.
    if !valid_run_id(&rec.run_id) {
        return Err(RecordError::RunId(rec.run_id));
    }
    if !Path::new(&rec.workdir).is_absolute() {
        return Err(RecordError::Workdir(rec.workdir));
    }
    if !valid_workspace(&rec.workspace) {
        return Err(RecordError::Workspace(rec.workspace));
    }
    // It becomes a recovery's TF_DATA_DIR: an absolute path, as the init writes it.
    if let Some(d) = rec
        .data_dir
        .as_deref()
        .filter(|d| !Path::new(d).is_absolute())
    {
        return Err(RecordError::DataDir(d.to_string()));
    }
    Ok(rec)
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
        ttl_ms: Some(30_000),
        data_dir: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "mutation")]
    #[test]
    fn the_wall_clock_is_the_simulations_where_it_set_one() {
        let host = now_ms();
        let set = crate::mutation::at_wall_ms(7);
        assert_eq!(now_ms(), 7);
        drop(set);
        assert!(now_ms() >= host, "the host's clock again");
    }

    #[test]
    fn an_incarnation_key_is_the_name_the_boot_ids_first_hex_digits_the_start_the_pid_and_the_nonce(
    ) {
        let mut o = Owner {
            name: "pod-a".into(),
            boot_id: "0f1e-2d3c-4b5a-6978-zz".into(),
            started_ms: 1_700_000_000_123,
            pid: 1,
            pod_uid: None,
            nonce: Some(0xab),
        };
        // The key names files and Leases that earlier tfinits wrote: it must not change.
        assert_eq!(o.incarnation(), "0f1e2d3c-1700000000123-1-000000ab");
        assert_eq!(o.key(), "pod-a/0f1e2d3c-1700000000123-1-000000ab");
        o.nonce = None;
        o.boot_id = "ghij".into();
        o.pid = 4_000_000;
        assert_eq!(o.key(), "pod-a/noboot-1700000000123-4000000");
        o.boot_id = "é1".into();
        assert_eq!(o.incarnation(), "1-1700000000123-4000000");
        // The numbers' edges, as `format!` writes them (the longest one included).
        o.boot_id = "0123456789abcdef".into();
        assert_eq!(
            o.incarnation(),
            "01234567-1700000000123-4000000",
            "eight hex digits at most"
        );
        for (ms, pid, nonce) in [
            (0, 0, 0),
            (u64::MAX, i32::MIN, u32::MAX),
            (9, i32::MAX, 0xfeed),
        ] {
            o.started_ms = ms;
            o.pid = pid;
            o.nonce = Some(nonce);
            assert_eq!(o.incarnation(), format!("01234567-{ms}-{pid}-{nonce:08x}"));
        }
    }

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
        let mut run = sample(&owner);
        run.run_id = "r1/../../../../etc/x".into();
        for r in [bad_name, relative, ws, run] {
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

    #[test]
    fn only_a_newer_format_is_left_for_the_tfinit_that_wrote_it() {
        let ok = serde_json::to_vec(&sample(&Owner::current("pod-a", None))).unwrap();
        let mut v: serde_json::Value = serde_json::from_slice(&ok).unwrap();
        let with_version = |version: u32| {
            let mut v = v.clone();
            v["v"] = serde_json::json!(version);
            parse_record(&serde_json::to_vec(&v).unwrap()).unwrap_err()
        };
        let newer = with_version(FORMAT + 1);
        assert_eq!(newer.future(), Some(FORMAT + 1));
        // Its message is the one a person reads in the warning and in a corrupt file's report.
        assert_eq!(
            newer.to_string(),
            format!(
                "format version {} (this tfinit reads {OLDEST_FORMAT} to {FORMAT})",
                FORMAT + 1
            )
        );
        assert_eq!(with_version(OLDEST_FORMAT - 1).future(), None);
        // Damaged or not JSON: corrupt, whatever the version.
        v["owner"]["name"] = serde_json::json!("../x");
        let bad = parse_record(&serde_json::to_vec(&v).unwrap()).unwrap_err();
        assert_eq!(bad, RecordError::Owner("../x".into()));
        assert_eq!(bad.future(), None);
        assert_eq!(parse_record(b"{").unwrap_err().future(), None);
    }

    #[test]
    fn a_record_within_the_budget_is_written_as_it_is() {
        let mut rec = sample(&Owner::current("pod-a", None));
        rec.argv = vec!["x".repeat(1000); 100];
        rec.in_progress = vec!["null_resource.a".into(); 1000];
        assert!(matches!(rec.fitted(), Cow::Borrowed(_)));
    }

    #[test]
    fn lists_over_the_budget_keep_their_start_and_count_the_rest() {
        let mut rec = sample(&Owner::current("pod-a", None));
        // One argument larger than the whole budget: only the marker stays after it.
        rec.argv = vec![
            "apply".into(),
            "y".repeat(LIST_BUDGET),
            "-auto-approve".into(),
        ];
        // Control characters take six bytes each in JSON: the budget counts the escaped size.
        rec.in_progress = vec!["\u{1}".repeat(1000); 100];
        let fitted = rec.fitted().into_owned();
        assert_eq!(
            fitted.argv,
            [
                "apply",
                &format!("{OMITTED_MARK}2 more arguments not recorded")
            ]
        );
        let json = serde_json::to_string_pretty(&fitted.in_progress).unwrap();
        assert!(json.len() <= LIST_BUDGET, "{} bytes", json.len());
        let kept = fitted.in_progress.len() - 1;
        assert!(kept >= 15, "{kept}");
        assert_eq!(
            fitted.in_progress[kept],
            format!(
                "{OMITTED_MARK}{} more resources in progress not recorded",
                100 - kept
            )
        );
        // Fitting again changes nothing: a recovery may write a record it read back.
        assert!(matches!(fitted.fitted(), Cow::Borrowed(_)));
        // No resource address starts like the marker.
        assert!(!OMITTED_MARK.starts_with(|c: char| c.is_ascii_alphanumeric()));
    }
}
