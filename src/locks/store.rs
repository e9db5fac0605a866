//! Where lock-owner records and heartbeats live: one [`Store`] trait for every reader and writer
//! (the recorder thread, the recovery helper, `tfinit recover`), and [`FileStore`], its only
//! implementation, in TFINIT_STATE_DIR.
//!
//! Layout: `records/<owner>.<incarnation>.<run>.json`, one per state-locking run in flight (or
//! killed), and `owners/<owner>.json`, the heartbeat of the owner's current incarnation;
//! `recover.lock` serialises recoveries. Every write is atomic (temporary file, fsync, rename,
//! fsync of the directory), so a reader sees a whole file or none. Every call may block for as
//! long as the volume takes: only the recorder thread and helper processes call it, never the
//! PID-1 loop.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use super::record::{age, now_ms, parse_record, Found, Heartbeat, Owner, Record, FORMAT, MAX_FILE};

/// Why a record is set aside (renamed so no recovery reads it again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Aside {
    /// It cannot be read (`*.corrupt`); the text says why.
    Corrupt(String),
    /// Its lock must be released by hand (`*.manual`).
    Manual,
}

/// The exclusive right to recover records in a store; released on drop.
pub struct RecoveryLock {
    _held: Box<dyn Send>,
}

impl std::fmt::Debug for RecoveryLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecoveryLock")
    }
}

/// All storage of records and heartbeats. Every method may block on the volume.
pub trait Store: Send {
    /// Where the store is, for messages (the state directory).
    fn location(&self) -> String;

    /// Prepares the store for writing: creates what is missing, proves it writable, and removes
    /// hidden temporary files older than `stale_temp` (left by writers that died mid-write).
    fn open(&self, stale_temp: Duration) -> io::Result<()>;

    /// Every record, parsed or not, in a stable order.
    fn list(&self) -> Vec<Found>;

    /// Reads one record.
    fn read(&self, id: &Path) -> io::Result<Record>;

    /// Writes `record` atomically (creating or rewriting it) and returns its id.
    fn write(&self, record: &Record) -> io::Result<PathBuf>;

    /// Removes a record; a missing one is fine.
    fn remove(&self, id: &Path) -> io::Result<()>;

    /// Sets a record aside so no recovery reads it again; returns its new id.
    fn set_aside(&self, id: &Path, why: &Aside) -> io::Result<PathBuf>;

    /// Reads an owner's heartbeat; None when missing or unreadable.
    fn read_heartbeat(&self, name: &str) -> Option<Heartbeat>;

    /// Refreshes `owner`'s heartbeat.
    fn write_heartbeat(&self, owner: &Owner) -> io::Result<()>;

    /// Removes heartbeats of owners that have no record in `records` and have been silent for
    /// longer than `older_than` (pods of a Deployment come and go under new names).
    fn prune_heartbeats(&self, records: &[Record], me: &Owner, older_than: Duration);

    /// Takes the exclusive right to recover in this store, waiting up to `wait` for another
    /// recovery (another pod's, or a `tfinit recover`) to finish.
    fn lock_recovery(&self, wait: Duration) -> io::Result<RecoveryLock>;

    /// Sets every unreadable record aside and warns about records of a newer format; returns the
    /// parsed records. Never fails: a problem with one record is that record's warning.
    fn sweep(&self) -> Vec<(PathBuf, Record)> {
        let mut out = Vec::new();
        for f in self.list() {
            match f {
                Found::Record(p, r) => out.push((p, *r)),
                Found::Corrupt(p, problem) => set_aside_corrupt(self, &p, &problem),
                Found::Future(p, v) => tracing::warn!(
                    file = %p.display(), version = v, this_version = FORMAT,
                    "lock-owner record of a newer tfinit format is left alone; upgrade this tfinit, or recover that lock with the newer one"
                ),
                Found::Unreadable(p, e) => warn_unreadable(&p, &e),
            }
        }
        out
    }
}

/// The store in a directory (TFINIT_STATE_DIR).
#[derive(Debug, Clone)]
pub struct FileStore {
    dir: PathBuf,
}

impl FileStore {
    /// A store at `dir`; nothing is touched yet.
    pub fn new(dir: &Path) -> FileStore {
        FileStore {
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

    /// Where `record` is stored.
    pub fn path_of(&self, record: &Record) -> PathBuf {
        self.records_dir().join(format!(
            "{}.{}.{}.json",
            record.owner.name,
            record.owner.incarnation(),
            record.run_id
        ))
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
            .join(format!("{PROBE_PREFIX}{}", unique_suffix()));
        atomic_write(&probe, b"ok")?;
        fs::remove_file(&probe)
    }

    /// Removes hidden temporary files (of atomic writes and write probes) older than `older_than`
    /// in the store's directories; returns how many. A writer that died mid-write leaves them,
    /// and a crash-looping pod would pile them up.
    pub fn remove_stale_temp_files(&self, older_than: Duration) -> usize {
        let mut removed = 0;
        for dir in [self.records_dir(), self.owners_dir()] {
            let Ok(rd) = fs::read_dir(&dir) else { continue };
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !is_temp_name(&name) {
                    continue;
                }
                let old = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > older_than);
                if old && fs::remove_file(e.path()).is_ok() {
                    removed += 1;
                }
            }
        }
        removed
    }
}

/// Name prefix of the write probe.
const PROBE_PREFIX: &str = ".tfinit-write-test.";

/// Whether `name` is one of our hidden temporary files: `.NAME.tmp.SUFFIX` or a write probe.
fn is_temp_name(name: &str) -> bool {
    name.starts_with(PROBE_PREFIX) || (name.starts_with('.') && name[1..].contains(".tmp."))
}

impl Store for FileStore {
    fn location(&self) -> String {
        self.dir.display().to_string()
    }

    fn open(&self, stale_temp: Duration) -> io::Result<()> {
        self.prepare()?;
        let removed = self.remove_stale_temp_files(stale_temp);
        if removed > 0 {
            tracing::info!(state_dir = %self.dir.display(), files = removed, "removed temporary files left by writers that died mid-write");
        }
        Ok(())
    }

    fn list(&self) -> Vec<Found> {
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

    fn read(&self, id: &Path) -> io::Result<Record> {
        let bytes = read_limited(id)?;
        parse_record(&bytes).map_err(|p| io::Error::new(io::ErrorKind::InvalidData, p))
    }

    fn write(&self, record: &Record) -> io::Result<PathBuf> {
        let path = self.path_of(record);
        atomic_write(&path, &to_json(record))?;
        Ok(path)
    }

    fn remove(&self, id: &Path) -> io::Result<()> {
        remove(id)
    }

    fn set_aside(&self, id: &Path, why: &Aside) -> io::Result<PathBuf> {
        let aside = match why {
            Aside::Corrupt(_) => id.with_extension("json.corrupt"),
            Aside::Manual => id.with_extension("json.manual"),
        };
        fs::rename(id, &aside)?;
        Ok(aside)
    }

    fn read_heartbeat(&self, name: &str) -> Option<Heartbeat> {
        if !crate::config::valid_owner(name) {
            return None;
        }
        let bytes = read_limited(&self.owners_dir().join(format!("{name}.json"))).ok()?;
        let hb: Heartbeat = serde_json::from_slice(&bytes).ok()?;
        (hb.v == FORMAT && hb.owner.name == name).then_some(hb)
    }

    fn write_heartbeat(&self, owner: &Owner) -> io::Result<()> {
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

    fn prune_heartbeats(&self, records: &[Record], me: &Owner, older_than: Duration) {
        let Ok(rd) = fs::read_dir(self.owners_dir()) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let Some(owner) = name.strip_suffix(".json") else {
                continue;
            };
            if owner == me.name || records.iter().any(|r| r.owner.name == owner) {
                continue;
            }
            if let Some(hb) = self.read_heartbeat(owner) {
                if age(hb.updated_ms) > older_than {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }

    fn lock_recovery(&self, wait: Duration) -> io::Result<RecoveryLock> {
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
                Ok(lock) => {
                    return Ok(RecoveryLock {
                        _held: Box::new(lock),
                    })
                }
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

/// Sets an unreadable record aside (`*.corrupt`) so it is reported once and never stops anyone.
pub fn set_aside_corrupt<S: Store + ?Sized>(store: &S, path: &Path, problem: &str) {
    match store.set_aside(path, &Aside::Corrupt(problem.to_string())) {
        Ok(aside) => tracing::warn!(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::locks::record::sample;

    fn temp_store(name: &str) -> (PathBuf, FileStore) {
        let dir = std::env::temp_dir().join(format!("tfinit-rec-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let store = FileStore::new(&dir);
        store.prepare().unwrap();
        (dir, store)
    }

    #[test]
    fn create_update_list_remove() {
        let (dir, store) = temp_store("cycle");
        let owner = Owner::current("pod-a", None);
        let mut rec = sample(&owner);
        let path = store.write(&rec).unwrap();
        rec.in_progress = vec!["null_resource.a".into()];
        assert_eq!(store.write(&rec).unwrap(), path, "a rewrite keeps the file");
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
        store.remove(&path).unwrap();
        store.remove(&path).unwrap();
        store.write_heartbeat(&owner).unwrap();
        assert!(store
            .read_heartbeat("pod-a")
            .unwrap()
            .owner
            .same_incarnation(&owner));
        fs::remove_dir_all(&dir).unwrap();
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
        store
            .write_heartbeat(&Owner::current("fresh", None))
            .unwrap();
        let mut r = sample(&Owner::current("with-record", None));
        r.owner.name = "with-record".into();
        store.prune_heartbeats(&[r], &me, Duration::from_secs(60));
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
        store.write_heartbeat(&other).unwrap();
        fs::copy(dir.join("owners/pod-b.json"), dir.join("owners/pod-a.json")).unwrap();
        assert!(store.read_heartbeat("pod-a").is_none());
        assert!(store.read_heartbeat("../pod-b").is_none());
        fs::remove_dir_all(&dir).unwrap();
    }
}

#[cfg(test)]
mod temp_file_tests {
    use super::*;

    #[test]
    fn opening_removes_our_temp_files_older_than_one_ttl_and_nothing_else() {
        let dir = std::env::temp_dir().join(format!("tfinit-store-tmp-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let store = FileStore::new(&dir);
        store.prepare().unwrap();
        let two_hours_ago = SystemTime::now() - Duration::from_secs(7200);
        let make = |rel: &str, old: bool| {
            let p = dir.join(rel);
            let f = fs::File::create(&p).unwrap();
            if old {
                f.set_modified(two_hours_ago).unwrap();
            }
            p
        };
        let gone = [
            make("records/.pod-a.x.r1.json.tmp.1.2.3.4", true),
            make("records/.tfinit-write-test.1.2.3.4", true),
            make("owners/.pod-a.json.tmp.9.9.9.9", true),
        ];
        let kept = [
            make("records/.pod-a.x.r2.json.tmp.1.2.3.5", false),
            make("records/pod-a.x.r3.json", true),
            make("records/.hidden-by-someone-else", true),
            make("owners/pod-b.json", true),
        ];
        store.open(Duration::from_secs(3600)).unwrap();
        for p in &gone {
            assert!(!p.exists(), "{} is an old temp file", p.display());
        }
        for p in &kept {
            assert!(
                p.exists(),
                "{} is not an old temp file of ours",
                p.display()
            );
        }
        fs::remove_dir_all(&dir).unwrap();
    }
}
