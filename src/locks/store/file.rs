//! [`FileStore`]: the store in TFINIT_STATE_DIR, its layout and every read and write of it.

use std::fs;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};

use super::fsio::{
    aside_path, atomic_write, file_of, flock_free, kind_of, local_filesystem, open_regular,
    read_limited, remove, test_flock, to_json, unique_suffix, ReadError,
};
use super::kernel::same_lock_file;
use super::{Aside, Change, RecordId, RecoveryLock, Store};
use crate::locks::names::valid_owner;
use crate::locks::record::{age, FileId, Found, Heartbeat, Owner, Record, HEARTBEAT_FORMAT};
use std::os::fd::OwnedFd;

/// The file `recover.lock` in the state directory: flock of one recovery at a time.
pub(super) const RECOVER_LOCK: &str = "recover.lock";

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

    pub(super) fn records_dir(&self) -> PathBuf {
        self.dir.join("records")
    }

    pub(super) fn owners_dir(&self) -> PathBuf {
        self.dir.join("owners")
    }

    /// The lock file every process of incarnation `owner` holds.
    fn lock_path(&self, owner: &Owner) -> PathBuf {
        self.owners_dir()
            .join(format!("{}.{}.lock", owner.name, owner.incarnation()))
    }

    /// The `*.json` files of `owners/` (stem, path): none when the directory is missing (no
    /// heartbeat was written), Err when it cannot be read.
    fn heartbeat_files(&self) -> io::Result<Vec<(String, PathBuf)>> {
        let rd = match fs::read_dir(self.owners_dir()) {
            Ok(rd) => rd,
            Err(e) if no_records_here(&e) => return Ok(Vec::new()),
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("{}: {e}", self.owners_dir().display()),
                ))
            }
        };
        let mut out = Vec::new();
        for e in rd {
            let e = e?;
            let file = e.file_name().to_string_lossy().into_owned();
            if let Some(stem) = file.strip_suffix(".json") {
                out.push((stem.to_string(), e.path()));
            }
        }
        Ok(out)
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
        // The state directory itself may be a link (to where a volume is mounted); what is inside
        // is tfinit's own and must be what tfinit made.
        if !self.dir.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "does not exist or is not a directory",
            ));
        }
        for sub in [self.records_dir(), self.owners_dir()] {
            match fs::symlink_metadata(&sub) {
                Ok(m) if m.is_dir() => {}
                Ok(m) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "{} is {}, not a directory: tfinit uses nothing else there and follows no link inside TFINIT_STATE_DIR; remove it (tfinit creates the directory)",
                            sub.display(),
                            kind_of(m.file_type())
                        ),
                    ))
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => fs::create_dir_all(&sub)?,
                Err(e) => return Err(e),
            }
        }
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
                // lstat: a link is not followed, a FIFO not opened.
                let Ok(meta) = e.metadata() else { continue };
                if !meta.file_type().is_file() {
                    tracing::warn!(
                        file = %e.path().display(), kind = kind_of(meta.file_type()),
                        "a file named like a tfinit temporary file in TFINIT_STATE_DIR is not a regular file and is left alone; remove it"
                    );
                    continue;
                }
                let old = meta
                    .modified()
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
        self.list_records()
    }

    fn read(&self, id: &RecordId) -> io::Result<Record> {
        self.read_record(id)
    }

    fn write(&self, record: &Record) -> io::Result<RecordId> {
        let put = [Change::Put(Box::new(record.clone()))];
        self.apply_changes(&put)
            .pop()
            .unwrap_or_else(|| Err(io::Error::other("no change was made")))
    }

    fn apply(&self, changes: &[Change]) -> Vec<io::Result<RecordId>> {
        self.apply_changes(changes)
    }

    fn remove(&self, id: &RecordId) -> io::Result<()> {
        if id.as_member().is_some() {
            let remove = [Change::Remove(id.clone())];
            return self
                .apply_changes(&remove)
                .pop()
                .unwrap_or_else(|| Err(io::Error::other("no change was made")))
                .map(|_| ());
        }
        remove(file_of(id)?)
    }

    fn set_aside(&self, id: &RecordId, why: &Aside) -> io::Result<RecordId> {
        if let Some((file, key)) = id.as_member() {
            return self.set_member_aside(file, key, why);
        }
        let path = file_of(id)?;
        let aside = aside_path(path, why);
        fs::rename(path, &aside)?;
        Ok(RecordId::file(aside))
    }

    fn read_heartbeat(&self, owner: &Owner) -> io::Result<Option<Heartbeat>> {
        if !valid_owner(&owner.name) {
            return Ok(None);
        }
        let read = |file: String| read_beat(&self.owners_dir().join(file));
        let own = read(format!("{}.{}.json", owner.name, owner.incarnation()))?
            .filter(|hb| hb.v == HEARTBEAT_FORMAT && hb.owner.same_incarnation(owner));
        if own.is_some() {
            return Ok(own);
        }
        Ok(read(format!("{}.json", owner.name))?
            .filter(|hb| hb.v == 1 && hb.owner.same_incarnation(owner)))
    }

    fn heartbeats(&self) -> io::Result<Vec<Heartbeat>> {
        let mut out = Vec::new();
        for (stem, path) in self.heartbeat_files()? {
            if let Some(hb) = read_beat(&path)? {
                let own_file = stem == format!("{}.{}", hb.owner.name, hb.owner.incarnation());
                if hb.v == HEARTBEAT_FORMAT && own_file {
                    out.push(hb);
                }
            }
        }
        Ok(out)
    }

    fn heartbeats_named(&self, name: &str) -> io::Result<Vec<Heartbeat>> {
        let prefix = format!("{name}.");
        let mut out = Vec::new();
        for (stem, path) in self.heartbeat_files()? {
            // `<name>.<incarnation>.json`; a longer name that starts with ours has more dots.
            let Some(rest) = stem.strip_prefix(&prefix) else {
                continue;
            };
            if rest.is_empty() || rest.contains('.') {
                continue;
            }
            if let Some(hb) = read_beat(&path)? {
                if hb.v == HEARTBEAT_FORMAT
                    && hb.owner.name == name
                    && hb.owner.incarnation() == rest
                {
                    out.push(hb);
                }
            }
        }
        out.sort_by_key(|hb| hb.owner.incarnation());
        Ok(out)
    }

    fn write_heartbeat(&self, hb: &Heartbeat) -> io::Result<()> {
        atomic_write(
            &self
                .owners_dir()
                .join(format!("{}.{}.json", hb.owner.name, hb.owner.incarnation())),
            &to_json(hb),
        )
    }

    fn prune_heartbeats(
        &self,
        records: &[Record],
        me: &Owner,
        older_than: Duration,
        listed_all: bool,
    ) {
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
            {
                continue;
            }
            // A restarted container's predecessors go at once, proven gone by their lock files;
            // the rest (other nodes, network volumes, older formats) after `older_than`.
            let gone = || listed_all && self.kernel_proof(me, &hb.owner, Some(&hb)) == Some(true);
            if age(hb.updated_ms) <= older_than && !gone() {
                continue;
            }
            // The lock file goes first, and only when no process holds it (cleaning: whatever
            // file is at the path, a held one stays).
            if hb.v == HEARTBEAT_FORMAT {
                let lock = self.lock_path(&hb.owner);
                if lock.exists() && flock_free(&lock) != Some(true) {
                    continue;
                }
                let _ = fs::remove_file(&lock);
            }
            let _ = fs::remove_file(e.path());
        }
    }

    fn hold_incarnation_lock(&self, me: &Owner) -> io::Result<Option<(OwnedFd, FileId)>> {
        use std::os::fd::AsFd;
        if !fs::File::open(self.owners_dir()).is_ok_and(|d| local_filesystem(&d)) {
            return Ok(None);
        }
        let path = self.lock_path(me);
        let (file, _) = open_regular(
            &path,
            fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600),
        )
        .map_err(|e| e.into_io(&path))?;
        let id = FileId::of(&file)?;
        // Never unlocked: the flock must last until the last process holding this descriptor
        // (this init and every terraform run it started) is gone, and the kernel frees it then
        // (an unlock would free it for every holder at once).
        crate::sys::flock_exclusive_now(file.as_fd()).map_err(|e| {
            io::Error::other(format!(
                "cannot flock {}: {e} (another process holds this incarnation's lock file?)",
                path.display()
            ))
        })?;
        Ok(Some((OwnedFd::from(file), id)))
    }

    fn incarnation_gone(&self, owner: &Owner, file: FileId) -> Option<bool> {
        let path = self.lock_path(owner);
        let (f, _) = open_regular(&path, fs::OpenOptions::new().read(true)).ok()?;
        // The very file the incarnation locked, checked on the descriptor we test: while any of
        // its processes holds that file, its inode cannot be freed and reused, so the same device
        // and inode is the same file.
        if !same_lock_file(FileId::of(&f).ok()?, file) || !local_filesystem(&f) {
            return None;
        }
        test_flock(f)
    }

    fn lock_recovery(&self, wait: Duration) -> io::Result<RecoveryLock> {
        let path = self.dir.join(RECOVER_LOCK);
        let deadline = Instant::now() + wait;
        loop {
            let (file, _) = open_regular(
                &path,
                fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .mode(0o600),
            )
            .map_err(|e| e.into_io(&path))?;
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => {
                    return Ok(RecoveryLock {
                        _held: Box::new(lock),
                        fence: None,
                    })
                }
                Err((_, nix::errno::Errno::EWOULDBLOCK)) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "{} is held by another lock recovery (another pod's, or a `tfinit recover`) that did not finish within {}s",
                            path.display(),
                            wait.as_secs()
                        ),
                    ))
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

/// Whether a directory that cannot be read holds no records as an answer: it does not exist
/// (no volume mounted, nothing written yet), is not a directory, or is not this uid's to read
/// (so nothing of this uid's was written there).
pub(super) fn no_records_here(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory | io::ErrorKind::PermissionDenied
    )
}

/// One heartbeat file: Ok(None) when it is missing or holds no heartbeat (not a regular file,
/// too large, not JSON: its owner's next beat replaces it); Err when the volume gave no answer.
fn read_beat(path: &Path) -> io::Result<Option<Heartbeat>> {
    match read_limited(path) {
        Ok(bytes) => Ok(serde_json::from_slice(&bytes).ok()),
        Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e @ ReadError::Io(_)) => Err(e.into_io(path)),
        Err(ReadError::NotRegular(_) | ReadError::TooLarge(_)) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use super::*;
    use crate::locks::record::now_ms;
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
            .unwrap()
            .owner
            .same_incarnation(&owner));
        fs::remove_dir_all(&dir).unwrap();
    }

    pub(super) fn beat(owner: &Owner, seq: u64, updated_ms: u64) -> Heartbeat {
        Heartbeat {
            v: HEARTBEAT_FORMAT,
            owner: owner.clone(),
            seq,
            updated_ms,
            holds_lock: true,
            host: String::new(),
            ttl_ms: Some(30_000),
            lock_file: None,
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
        store.prune_heartbeats(&[r], &me, Duration::from_secs(60), true);
        assert!(store.read_heartbeat(&gone).unwrap().is_none());
        for kept in [&with_record, &me, &fresh] {
            assert!(store.read_heartbeat(kept).unwrap().is_some(), "{kept:?}");
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
        assert_eq!(store.read_heartbeat(&a1).unwrap().unwrap().seq, 5);
        assert_eq!(store.read_heartbeat(&a2).unwrap().unwrap().seq, 7);
        assert_eq!(store.heartbeats_named("pod-a").unwrap().len(), 2);
        assert!(
            store.heartbeats_named("pod").unwrap().is_empty(),
            "no prefix match"
        );
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
        assert!(store.read_heartbeat(&a3).unwrap().is_none());
        // The shared file of the first format counts only for the incarnation it names.
        let legacy = Heartbeat {
            v: 1,
            seq: 0,
            holds_lock: false,
            ..beat(&a3, 0, 9)
        };
        atomic_write(&dir.join("owners/pod-a.json"), &to_json(&legacy)).unwrap();
        assert_eq!(store.read_heartbeat(&a3).unwrap().unwrap().updated_ms, 9);
        let bad_name = Owner {
            name: "../pod-b".into(),
            ..a1.clone()
        };
        assert!(store.read_heartbeat(&bad_name).unwrap().is_none());
        fs::remove_dir_all(&dir).unwrap();
    }
}

#[cfg(test)]
mod kernel_tests;

#[cfg(test)]
mod temp_file_tests {
    use super::*;
    use std::time::SystemTime;

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
