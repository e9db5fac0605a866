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

use super::record::{
    age, now_ms, parse_record, Found, Heartbeat, Owner, Record, FORMAT, HEARTBEAT_FORMAT, MAX_FILE,
};

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

    /// Reads one incarnation's heartbeat (`owners/<name>.<incarnation>.json`; for an incarnation
    /// of the first format, the shared `owners/<name>.json` when it is that incarnation's); None
    /// when missing or unreadable.
    fn read_heartbeat(&self, owner: &Owner) -> Option<Heartbeat>;

    /// The heartbeats of every incarnation named `name` (to tell that two live inits share it).
    fn heartbeats_named(&self, name: &str) -> Vec<Heartbeat>;

    /// Writes `hb`, its incarnation's heartbeat.
    fn write_heartbeat(&self, hb: &Heartbeat) -> io::Result<()>;

    /// Removes heartbeats (and incarnation lock files) of incarnations that have no record in
    /// `records` and whose heartbeat says it was last written longer than `older_than` ago by
    /// this node's clock: cleaning only (pods of a Deployment come and go under new names), never
    /// a liveness decision, since an incarnation with no record has no lock to lose.
    fn prune_heartbeats(&self, records: &[Record], me: &Owner, older_than: Duration);

    /// Takes this incarnation's lock file (`owners/<name>.<incarnation>.lock`) with an exclusive
    /// flock, kept for the life of the process, and returns a descriptor of it (close-on-exec)
    /// that every terraform run inherits: the kernel frees the flock only once the last process
    /// holding the descriptor is gone. None when the state directory is not on a local
    /// filesystem: there a free flock proves nothing, and a descriptor every terraform holds
    /// would make each one's exit wait on the volume (FUSE and NFS talk to their server when a
    /// descriptor is closed).
    fn hold_incarnation_lock(&self, me: &Owner) -> io::Result<Option<std::os::fd::OwnedFd>>;

    /// Whether the kernel proves every process of `owner` gone: its lock file is on a local
    /// filesystem of this kernel and its flock is free. Some(false): it is held (alive); None:
    /// nothing proven (network filesystem, no lock file, an error). The caller checks that the
    /// incarnation ran on this kernel (boot id) and that its heartbeat says it held the lock.
    fn incarnation_gone(&self, owner: &Owner) -> Option<bool>;

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

    /// The lock file every process of incarnation `owner` holds.
    fn lock_path(&self, owner: &Owner) -> PathBuf {
        self.owners_dir()
            .join(format!("{}.{}.lock", owner.name, owner.incarnation()))
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

    fn read_heartbeat(&self, owner: &Owner) -> Option<Heartbeat> {
        if !crate::config::valid_owner(&owner.name) {
            return None;
        }
        let read = |file: String| -> Option<Heartbeat> {
            let bytes = read_limited(&self.owners_dir().join(file)).ok()?;
            serde_json::from_slice::<Heartbeat>(&bytes).ok()
        };
        let own = read(format!("{}.{}.json", owner.name, owner.incarnation()))
            .filter(|hb| hb.v == HEARTBEAT_FORMAT && hb.owner.same_incarnation(owner));
        own.or_else(|| {
            read(format!("{}.json", owner.name))
                .filter(|hb| hb.v == 1 && hb.owner.same_incarnation(owner))
        })
    }

    fn heartbeats_named(&self, name: &str) -> Vec<Heartbeat> {
        let Ok(rd) = fs::read_dir(self.owners_dir()) else {
            return Vec::new();
        };
        let prefix = format!("{name}.");
        let mut out: Vec<Heartbeat> = rd
            .flatten()
            .filter_map(|e| {
                let file = e.file_name().to_string_lossy().into_owned();
                let rest = file.strip_prefix(&prefix)?.strip_suffix(".json")?;
                // `<name>.<incarnation>.json`; a longer name that starts with ours has more dots.
                if rest.is_empty() || rest.contains('.') {
                    return None;
                }
                let bytes = read_limited(&e.path()).ok()?;
                let hb: Heartbeat = serde_json::from_slice(&bytes).ok()?;
                (hb.v == HEARTBEAT_FORMAT
                    && hb.owner.name == name
                    && hb.owner.incarnation() == rest)
                    .then_some(hb)
            })
            .collect();
        out.sort_by_key(|hb| hb.owner.incarnation());
        out
    }

    fn write_heartbeat(&self, hb: &Heartbeat) -> io::Result<()> {
        atomic_write(
            &self
                .owners_dir()
                .join(format!("{}.{}.json", hb.owner.name, hb.owner.incarnation())),
            &to_json(hb),
        )
    }

    fn prune_heartbeats(&self, records: &[Record], me: &Owner, older_than: Duration) {
        let Ok(rd) = fs::read_dir(self.owners_dir()) else {
            return;
        };
        for e in rd.flatten() {
            let file = e.file_name().to_string_lossy().to_string();
            if file.starts_with('.') || !file.ends_with(".json") {
                continue;
            }
            let Ok(bytes) = read_limited(&e.path()) else {
                continue;
            };
            let Ok(hb) = serde_json::from_slice::<Heartbeat>(&bytes) else {
                continue;
            };
            if hb.owner.same_incarnation(me)
                || records.iter().any(|r| r.owner.same_incarnation(&hb.owner))
                || age(hb.updated_ms) <= older_than
            {
                continue;
            }
            // The lock file goes first, and only when no process holds it.
            if hb.v == HEARTBEAT_FORMAT {
                let lock = self.lock_path(&hb.owner);
                if lock.exists() && self.incarnation_gone(&hb.owner) != Some(true) {
                    continue;
                }
                let _ = fs::remove_file(&lock);
            }
            let _ = fs::remove_file(e.path());
        }
    }

    fn hold_incarnation_lock(&self, me: &Owner) -> io::Result<Option<std::os::fd::OwnedFd>> {
        use std::os::fd::AsFd;
        if !fs::File::open(self.owners_dir()).is_ok_and(|d| local_filesystem(&d)) {
            return Ok(None);
        }
        let path = self.lock_path(me);
        let file = open_regular(&path, true)?;
        let lock = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
            io::Error::other(format!(
                "cannot flock {}: {e} (another process holds this incarnation's lock file?)",
                path.display()
            ))
        })?;
        let fd = lock.as_fd().try_clone_to_owned()?;
        // Never unlocked: the flock must last until the last process holding `fd` (this init
        // and every terraform run it started) is gone, and the kernel frees it then. Dropping
        // the Flock would unlock it for every holder at once.
        std::mem::forget(lock);
        Ok(Some(fd))
    }

    fn incarnation_gone(&self, owner: &Owner) -> Option<bool> {
        let path = self.lock_path(owner);
        let file = open_regular(&path, false).ok()?;
        if !local_filesystem(&file) {
            return None;
        }
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            // Dropped at once: unlocked, and nothing of that incarnation can take it again.
            Ok(_free) => Some(true),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Some(false),
            Err(_) => None,
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

/// Opens a file of the state directory for reading and locking without following a symbolic link
/// or blocking on a FIFO, and accepts a regular file only (a FIFO or device there would hang
/// storage for good). `create` creates a missing one (mode 0600).
fn open_regular(path: &Path, create: bool) -> io::Result<fs::File> {
    let mut opts = fs::OpenOptions::new();
    opts.read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC);
    if create {
        opts.write(true).create(true).truncate(false).mode(0o600);
    }
    let file = opts.open(path)?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(io::Error::other(format!(
            "{} is not a regular file ({kind:?}): remove it",
            path.display()
        )));
    }
    Ok(file)
}

/// Whether `file` is on a filesystem whose flocks live in this kernel alone (so a free flock
/// proves its holders gone): ext2/3/4, xfs, btrfs, tmpfs, overlayfs. Not NFS, CIFS, Ceph or FUSE,
/// whose locks a server keeps or emulates per process.
fn local_filesystem(file: &fs::File) -> bool {
    use nix::sys::statfs::{
        fstatfs, BTRFS_SUPER_MAGIC, EXT4_SUPER_MAGIC, OVERLAYFS_SUPER_MAGIC, TMPFS_MAGIC,
        XFS_SUPER_MAGIC,
    };
    fstatfs(file).is_ok_and(|s| {
        [
            EXT4_SUPER_MAGIC,
            XFS_SUPER_MAGIC,
            BTRFS_SUPER_MAGIC,
            TMPFS_MAGIC,
            OVERLAYFS_SUPER_MAGIC,
        ]
        .contains(&s.filesystem_type())
    })
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
        store.write_heartbeat(&beat(&owner, 1, now_ms())).unwrap();
        assert!(store
            .read_heartbeat(&owner)
            .unwrap()
            .owner
            .same_incarnation(&owner));
        fs::remove_dir_all(&dir).unwrap();
    }

    fn beat(owner: &Owner, seq: u64, updated_ms: u64) -> Heartbeat {
        Heartbeat {
            v: HEARTBEAT_FORMAT,
            owner: owner.clone(),
            seq,
            updated_ms,
            holds_lock: true,
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
            let o = Owner::current(name, None);
            store
                .write_heartbeat(&beat(&o, 3, now_ms() - 3_600_000))
                .unwrap();
            o
        };
        let gone = old("gone");
        let with_record = old("with-record");
        let me_old = Owner { ..me.clone() };
        store
            .write_heartbeat(&beat(&me_old, 1, now_ms() - 3_600_000))
            .unwrap();
        let fresh = Owner::current("fresh", None);
        store.write_heartbeat(&beat(&fresh, 1, now_ms())).unwrap();
        let r = sample(&with_record);
        store.prune_heartbeats(&[r], &me, Duration::from_secs(60));
        assert!(store.read_heartbeat(&gone).is_none());
        for kept in [&with_record, &me, &fresh] {
            assert!(store.read_heartbeat(kept).is_some(), "{kept:?}");
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn each_incarnation_has_its_own_heartbeat_and_a_first_format_one_is_read_for_its_own() {
        let (dir, store) = temp_store("hbname");
        let a1 = Owner::current("pod-a", None);
        let a2 = Owner {
            started_ms: a1.started_ms + 1,
            ..a1.clone()
        };
        store.write_heartbeat(&beat(&a1, 5, 1)).unwrap();
        store.write_heartbeat(&beat(&a2, 7, 2)).unwrap();
        assert_eq!(store.read_heartbeat(&a1).unwrap().seq, 5);
        assert_eq!(store.read_heartbeat(&a2).unwrap().seq, 7);
        assert_eq!(store.heartbeats_named("pod-a").len(), 2);
        assert!(store.heartbeats_named("pod").is_empty(), "no prefix match");
        // A file copied under another incarnation's name is not that incarnation's.
        let a3 = Owner {
            started_ms: a1.started_ms + 2,
            ..a1.clone()
        };
        fs::copy(
            dir.join(format!("owners/pod-a.{}.json", a1.incarnation())),
            dir.join(format!("owners/pod-a.{}.json", a3.incarnation())),
        )
        .unwrap();
        assert!(store.read_heartbeat(&a3).is_none());
        // The shared file of the first format counts only for the incarnation it names.
        let legacy = Heartbeat {
            v: 1,
            seq: 0,
            holds_lock: false,
            ..beat(&a3, 0, 9)
        };
        atomic_write(&dir.join("owners/pod-a.json"), &to_json(&legacy)).unwrap();
        assert_eq!(store.read_heartbeat(&a3).unwrap().updated_ms, 9);
        let bad_name = Owner {
            name: "../pod-b".into(),
            ..a1.clone()
        };
        assert!(store.read_heartbeat(&bad_name).is_none());
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Runs `flock(1)` holding `lock` around `script` (whose background children inherit it).
    fn flock_holder(lock: &Path, script: &str) -> std::process::Child {
        std::process::Command::new("flock")
            .arg("-x")
            .arg(lock)
            .args(["sh", "-c", script])
            .spawn()
            .expect("flock(1) from util-linux")
    }

    fn wait_until(what: &str, f: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn the_kernel_proves_an_incarnation_gone_only_when_its_last_process_is() {
        let (dir, store) = temp_store("gone");
        if !local_filesystem(&fs::File::open(&dir).unwrap()) {
            eprintln!("SKIP: {} is not on a local filesystem", dir.display());
            return;
        }
        let a = Owner::current("pod-a", None);
        assert_eq!(
            store.incarnation_gone(&a),
            None,
            "no lock file: nothing proven"
        );
        let lock = store.lock_path(&a);
        fs::write(&lock, b"").unwrap();
        // The holder exits at once, but a background child it started inherits the lock and
        // lives on: like an init that died while one of its terraform runs had not.
        let marker = dir.join("child-done");
        let mut holder = flock_holder(
            &lock,
            &format!("(sleep 1; touch {}) & exit 0", marker.display()),
        );
        holder.wait().unwrap();
        assert_eq!(
            store.incarnation_gone(&a),
            Some(false),
            "its child holds it"
        );
        wait_until("the child to finish", || marker.exists());
        wait_until("the flock to be free", || {
            store.incarnation_gone(&a) == Some(true)
        });
        // Our own lock: held for the life of this process.
        let me = Owner {
            started_ms: a.started_ms + 1,
            ..a.clone()
        };
        let _fd = store
            .hold_incarnation_lock(&me)
            .unwrap()
            .expect("a local filesystem");
        assert_eq!(store.incarnation_gone(&me), Some(false));
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
