//! Lock-owner records and heartbeats in TFINIT_STATE_DIR (format documented in docs/records.md).
//!
//! Layout: `records/<owner>.<incarnation>.<run>.json`, one per state-locking run in flight (or
//! killed), and `owners/<owner>.json`, the heartbeat of the owner's current incarnation;
//! `recover.lock` serialises recoveries. Every write is atomic (temporary file, fsync, rename,
//! fsync of the directory), so a reader sees a whole file or none.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

/// Format version of records and heartbeats. A file with a newer version is left alone.
pub const FORMAT: u32 = 1;

/// Largest record or heartbeat file read; anything bigger is not ours.
const MAX_FILE: u64 = 1 << 20;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
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
}

fn default_workspace() -> String {
    "default".to_string()
}

/// An owner's heartbeat.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Heartbeat {
    /// Format version.
    pub v: u32,
    /// The incarnation alive.
    pub owner: Owner,
    /// Last refresh, ms since the epoch.
    pub updated_ms: u64,
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
    if version.v != FORMAT {
        return Err(format!(
            "format version {} (this tfinit reads {FORMAT})",
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

/// The state directory.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

/// A record written for a run in flight.
#[derive(Debug)]
pub struct RecordHandle {
    /// The file.
    pub path: PathBuf,
    /// The content last written.
    pub record: Record,
    /// The in-progress set changed since the last write.
    pub dirty: bool,
    /// Last write.
    pub written: Instant,
}

/// The exclusive right to recover records in a state directory; released on drop.
#[derive(Debug)]
pub struct RecoveryLock {
    _lock: Flock<fs::File>,
}

impl Store {
    /// A store at `dir`; nothing is touched yet.
    pub fn new(dir: &Path) -> Store {
        Store {
            dir: dir.to_path_buf(),
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn records_dir(&self) -> PathBuf {
        self.dir.join("records")
    }

    fn owners_dir(&self) -> PathBuf {
        self.dir.join("owners")
    }

    /// Creates the subdirectories and proves the directory writable.
    pub fn prepare(&self) -> io::Result<()> {
        if !self.dir.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "does not exist or is not a directory",
            ));
        }
        fs::create_dir_all(self.records_dir())?;
        fs::create_dir_all(self.owners_dir())?;
        let probe = self
            .records_dir()
            .join(format!(".tfinit-write-test.{}", unique_suffix()));
        atomic_write(&probe, b"ok")?;
        fs::remove_file(&probe)
    }

    /// Refreshes `owner`'s heartbeat.
    pub fn heartbeat(&self, owner: &Owner) -> io::Result<()> {
        let hb = Heartbeat {
            v: FORMAT,
            owner: owner.clone(),
            updated_ms: now_ms(),
        };
        atomic_write(
            &self.owners_dir().join(format!("{}.json", owner.name)),
            &to_json(&hb),
        )
    }

    /// Reads an owner's heartbeat; None when missing or unreadable.
    pub fn read_heartbeat(&self, name: &str) -> Option<Heartbeat> {
        if !crate::config::valid_owner(name) {
            return None;
        }
        let bytes = read_limited(&self.owners_dir().join(format!("{name}.json"))).ok()?;
        let hb: Heartbeat = serde_json::from_slice(&bytes).ok()?;
        (hb.v == FORMAT && hb.owner.name == name).then_some(hb)
    }

    /// Writes a new record and returns its handle.
    pub fn create(&self, record: Record) -> io::Result<RecordHandle> {
        let name = format!(
            "{}.{}.{}.json",
            record.owner.name,
            record.owner.incarnation(),
            record.run_id
        );
        let path = self.records_dir().join(name);
        atomic_write(&path, &to_json(&record))?;
        Ok(RecordHandle {
            path,
            record,
            dirty: false,
            written: Instant::now(),
        })
    }

    /// Rewrites a record (its in-progress set changed, or its run ended).
    pub fn update(&self, handle: &mut RecordHandle) -> io::Result<()> {
        handle.record.updated_ms = now_ms();
        atomic_write(&handle.path, &to_json(&handle.record))?;
        handle.dirty = false;
        handle.written = Instant::now();
        Ok(())
    }

    /// Every record file, parsed or not.
    pub fn list(&self) -> Vec<Found> {
        let Ok(entries) = fs::read_dir(self.records_dir()) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for e in entries.flatten() {
            let path = e.path();
            let hidden = e.file_name().to_string_lossy().starts_with('.');
            if hidden || path.extension().and_then(|x| x.to_str()) != Some("json") {
                continue;
            }
            match read_limited(&path) {
                // Removed since readdir (its run ended): not a problem.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                    out.push(Found::Unreadable(path, e.to_string()))
                }
                Err(e) => out.push(Found::Corrupt(path, format!("unreadable: {e}"))),
                Ok(bytes) => match parse_record(&bytes) {
                    Ok(r) => out.push(Found::Record(path, Box::new(r))),
                    Err(problem) => match future_version(&bytes) {
                        Some(v) => out.push(Found::Future(path, v)),
                        None => out.push(Found::Corrupt(path, problem)),
                    },
                },
            }
        }
        out.sort_by(|a, b| found_path(a).cmp(found_path(b)));
        out
    }

    /// Sets every unreadable record aside and warns about records of a newer format; returns the
    /// parsed records. Never fails: a problem with one file is that file's warning.
    pub fn sweep(&self) -> Vec<(PathBuf, Record)> {
        let mut out = Vec::new();
        for f in self.list() {
            match f {
                Found::Record(p, r) => out.push((p, *r)),
                Found::Corrupt(p, problem) => set_aside_corrupt(&p, &problem),
                Found::Future(p, v) => tracing::warn!(
                    file = %p.display(), version = v, this_version = FORMAT,
                    "lock-owner record of a newer tfinit format is left alone; upgrade this tfinit, or recover that lock with the newer one"
                ),
                Found::Unreadable(p, e) => warn_unreadable(&p, &e),
            }
        }
        out
    }

    /// Removes heartbeats of owners that have no record left and have been silent for longer than
    /// `older_than` (pods of a Deployment come and go under new names; a PVC would collect them).
    pub fn prune_heartbeats(
        &self,
        records: &[(PathBuf, Record)],
        me: &Owner,
        older_than: Duration,
    ) {
        let Ok(rd) = fs::read_dir(self.owners_dir()) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let Some(owner) = name.strip_suffix(".json") else {
                continue;
            };
            if owner == me.name || records.iter().any(|(_, r)| r.owner.name == owner) {
                continue;
            }
            if let Some(hb) = self.read_heartbeat(owner) {
                if age(hb.updated_ms) > older_than {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }

    /// Takes the exclusive right to recover in this directory (flock on `recover.lock`), waiting
    /// up to `wait` for another recovery (another pod's, or a `tfinit recover`) to finish.
    pub fn lock_recovery(&self, wait: Duration) -> io::Result<RecoveryLock> {
        let path = self.dir.join("recover.lock");
        let deadline = Instant::now() + wait;
        loop {
            let file = fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o600)
                .open(&path)?;
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => return Ok(RecoveryLock { _lock: lock }),
                Err((_, nix::errno::Errno::EWOULDBLOCK)) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err((_, e)) => {
                    return Err(io::Error::other(format!(
                        "cannot lock {}: {e}",
                        path.display()
                    )))
                }
            }
        }
    }
}

fn found_path(f: &Found) -> &Path {
    match f {
        Found::Record(p, _)
        | Found::Corrupt(p, _)
        | Found::Future(p, _)
        | Found::Unreadable(p, _) => p,
    }
}

fn future_version(bytes: &[u8]) -> Option<u32> {
    #[derive(Deserialize)]
    struct Version {
        v: u32,
    }
    serde_json::from_slice::<Version>(bytes)
        .ok()
        .map(|v| v.v)
        .filter(|v| *v > FORMAT)
}

/// Warns about a record this uid may not read (pods sharing a state directory must share a uid).
pub fn warn_unreadable(path: &Path, error: &str) {
    tracing::warn!(
        file = %path.display(), error,
        "lock-owner record is not readable by this uid and is left alone: pods sharing TFINIT_STATE_DIR must run as the same uid"
    );
}

/// Renames an unreadable record aside (`*.corrupt`) so it is reported once and never stops anyone.
pub fn set_aside_corrupt(path: &Path, problem: &str) {
    let aside = path.with_extension("json.corrupt");
    match fs::rename(path, &aside) {
        Ok(()) => tracing::warn!(
            file = %path.display(),
            renamed_to = %aside.display(),
            problem,
            "lock-owner record cannot be read and was renamed aside; check it by hand, then delete it"
        ),
        // Another pod set it aside first.
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(file = %path.display(), problem, error = %e, "lock-owner record cannot be read, nor renamed aside")
        }
    }
}

/// Removes a record file; a missing one is fine.
pub fn remove(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => {
            if let Some(parent) = path.parent() {
                let _ = fs::File::open(parent).and_then(|d| d.sync_all());
            }
            Ok(())
        }
    }
}

fn to_json<T: Serialize>(v: &T) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(v).unwrap_or_else(|_| b"{}".to_vec());
    out.push(b'\n');
    out
}

fn read_limited(path: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let f = fs::File::open(path)?;
    let mut buf = Vec::new();
    f.take(MAX_FILE).read_to_end(&mut buf)?;
    Ok(buf)
}

/// Writes `bytes` to `path` atomically: temp file in the same directory, fsync, rename, fsync dir.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.tmp.{}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file"),
        unique_suffix()
    ));
    let result = (|| {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// A name suffix no other writer uses: pods sharing the directory all run as pid 1 of their own
/// PID namespace, so the pid alone would collide.
fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{}.{}.{}.{}",
        std::process::id(),
        now_ms(),
        nanos,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// How long ago `ms` was, saturating at zero for clocks that disagree.
pub fn age(ms: u64) -> Duration {
    Duration::from_millis(now_ms().saturating_sub(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(owner: &Owner) -> Record {
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
        }
    }

    fn temp_store(name: &str) -> (PathBuf, Store) {
        let dir = std::env::temp_dir().join(format!("tfinit-rec-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let store = Store::new(&dir);
        store.prepare().unwrap();
        (dir, store)
    }

    #[test]
    fn create_update_list_remove() {
        let (dir, store) = temp_store("cycle");
        let owner = Owner::current("pod-a", None);
        let mut h = store.create(sample(&owner)).unwrap();
        h.record.in_progress = vec!["null_resource.a".into()];
        store.update(&mut h).unwrap();
        let found = store.list();
        assert_eq!(found.len(), 1);
        match &found[0] {
            Found::Record(_, r) => assert_eq!(r.in_progress, vec!["null_resource.a"]),
            other => panic!("{other:?}"),
        }
        fs::write(dir.join("records/bad.json"), b"{\"v\":1,\"owner\":").unwrap();
        fs::write(
            dir.join("records/next.json"),
            b"{\"v\":7,\"whatever\":true}",
        )
        .unwrap();
        fs::write(dir.join("records/empty.json"), b"").unwrap();
        let found = store.list();
        assert_eq!(
            found
                .iter()
                .filter(|f| matches!(f, Found::Corrupt(..)))
                .count(),
            2
        );
        assert_eq!(
            found
                .iter()
                .filter(|f| matches!(f, Found::Future(_, 7)))
                .count(),
            1
        );
        // The sweep sets the corrupt ones aside, leaves the future one, returns the good one.
        let good = store.sweep();
        assert_eq!(good.len(), 1);
        assert!(dir.join("records/bad.json.corrupt").exists());
        assert!(dir.join("records/empty.json.corrupt").exists());
        assert!(dir.join("records/next.json").exists());
        remove(&h.path).unwrap();
        remove(&h.path).unwrap();
        store.heartbeat(&owner).unwrap();
        assert!(store
            .read_heartbeat("pod-a")
            .unwrap()
            .owner
            .same_incarnation(&owner));
        fs::remove_dir_all(&dir).unwrap();
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

    #[test]
    fn only_one_recovery_at_a_time() {
        let (dir, store) = temp_store("flock");
        let held = store.lock_recovery(Duration::ZERO).unwrap();
        let t = Instant::now();
        assert!(store.lock_recovery(Duration::from_millis(300)).is_err());
        assert!(t.elapsed() >= Duration::from_millis(300));
        drop(held);
        assert!(store.lock_recovery(Duration::ZERO).is_ok());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn silent_heartbeats_without_records_are_pruned() {
        let (dir, store) = temp_store("prune");
        let me = Owner::current("pod-me", None);
        let old = |name: &str| {
            let hb = Heartbeat {
                v: FORMAT,
                owner: Owner::current(name, None),
                updated_ms: now_ms() - 3_600_000,
            };
            atomic_write(&dir.join(format!("owners/{name}.json")), &to_json(&hb)).unwrap();
        };
        old("gone");
        old("with-record");
        old("pod-me");
        store.heartbeat(&Owner::current("fresh", None)).unwrap();
        let mut r = sample(&Owner::current("with-record", None));
        r.owner.name = "with-record".into();
        store.prune_heartbeats(&[(dir.join("x"), r)], &me, Duration::from_secs(60));
        assert!(store.read_heartbeat("gone").is_none());
        for kept in ["with-record", "pod-me", "fresh"] {
            assert!(store.read_heartbeat(kept).is_some(), "{kept}");
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_heartbeat_file_under_another_name_is_ignored() {
        let (dir, store) = temp_store("hbname");
        let other = Owner::current("pod-b", None);
        store.heartbeat(&other).unwrap();
        fs::copy(dir.join("owners/pod-b.json"), dir.join("owners/pod-a.json")).unwrap();
        assert!(store.read_heartbeat("pod-a").is_none());
        assert!(store.read_heartbeat("../pod-b").is_none());
        fs::remove_dir_all(&dir).unwrap();
    }
}
