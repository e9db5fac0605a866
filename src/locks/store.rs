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
//!
//! Anything else may sit in the directory (a FIFO, a device, a symbolic link to anywhere, a file
//! of gigabytes): files are opened with `O_NOFOLLOW | O_NONBLOCK` and used only when `fstat` says
//! they are regular files ([`open_regular`]), so no entry can block a reader or steer it
//! elsewhere; an entry that is not a regular file is named in a warning and left for a person.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::fcntl::{fcntl, FcntlArg, Flock, FlockArg, OFlag};
use serde::{Deserialize, Serialize};

use super::names::valid_owner;
use super::record::{
    age, now_ms, parse_record, FileId, Found, Heartbeat, Owner, Record, Unread, FORMAT,
    HEARTBEAT_FORMAT, MAX_FILE,
};
use crate::mutation::{self, Guard};
use std::os::fd::OwnedFd;

/// The file `recover.lock` in the state directory: flock of one recovery at a time.
const RECOVER_LOCK: &str = "recover.lock";

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

    /// Writes `record` atomically (creating or rewriting it) and returns its id. What is written
    /// is [`Record::fitted`], and only when it reads back, so every record file can be read.
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

    /// The heartbeats of every incarnation (current format), to tell which hosts live tfinits
    /// run on.
    fn heartbeats(&self) -> Vec<Heartbeat>;

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
    /// descriptor is closed). With the descriptor, the file's device and inode: the heartbeat
    /// names them, so that a free flock proves something only on this very file.
    fn hold_incarnation_lock(&self, me: &Owner) -> io::Result<Option<(OwnedFd, FileId)>>;

    /// Whether the kernel proves every process of `owner` gone: its lock file is on a local
    /// filesystem of this kernel, it is the file `file` (device and inode, as the incarnation's
    /// heartbeat names it: a file that replaced it at that path proves nothing), and its flock is
    /// free. Some(false): it is held (alive); None: nothing proven (network filesystem, no lock
    /// file, another file, an error). Callers go through [`kernel_proof`], which checks the rest.
    fn incarnation_gone(&self, owner: &Owner, file: FileId) -> Option<bool>;

    /// What the kernel proves of `owner` for observer `me`, given `hb`, that incarnation's
    /// heartbeat as just read: Some(true) every process of it is gone, Some(false) one holds its
    /// lock file (alive), None nothing. Only for an incarnation of this kernel (boot id) whose
    /// heartbeat says it held its lock file and names that file's device and inode (a heartbeat
    /// of a tfinit before record format 4 names none: its owner is watched instead).
    fn kernel_proof(&self, me: &Owner, owner: &Owner, hb: Option<&Heartbeat>) -> Option<bool> {
        kernel_proof_with(me, owner, hb, |file| self.incarnation_gone(owner, file))
    }

    /// Takes the exclusive right to recover in this store, waiting up to `wait` for another
    /// recovery (another pod's, or a `tfinit recover`) to finish.
    fn lock_recovery(&self, wait: Duration) -> io::Result<RecoveryLock>;

    /// Sets corrupt records aside (only those: no live owner has one, see [`Found::Corrupt`]) and
    /// warns about the files left alone; returns the parsed records. Never fails: a problem with
    /// one record is that record's warning.
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
                Found::LeftAlone(p, why) => warn_left_alone(&p, &why),
            }
        }
        out
    }
}

/// [`Store::kernel_proof`]'s rule, given `gone`, the store's [`Store::incarnation_gone`] for
/// `owner` (the simulation calls it with its model of the kernel).
pub fn kernel_proof_with(
    me: &Owner,
    owner: &Owner,
    hb: Option<&Heartbeat>,
    gone: impl FnOnce(FileId) -> Option<bool>,
) -> Option<bool> {
    let hb = hb.filter(|h| h.holds_lock && h.owner.same_incarnation(owner))?;
    let file = match hb.lock_file {
        Some(file) => file,
        // Without the inode check (mutation builds only), whatever file is at the path will do.
        None if !mutation::on(Guard::LockFileInode) => FileId { dev: 0, ino: 0 },
        None => return None,
    };
    if owner.boot_id.is_empty() || owner.boot_id != me.boot_id {
        return None;
    }
    gone(file)
}

/// Whether the file found at an incarnation's lock path (`found`, by `fstat` of the descriptor
/// whose flock is tested) is the one the incarnation locked (`locked`, as its heartbeat names
/// it): only then does its flock say anything of the incarnation.
pub fn same_lock_file(found: FileId, locked: FileId) -> bool {
    found == locked || !mutation::on(Guard::LockFileInode)
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
                Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::NotFound => {}
                Err(ReadError::Io(e)) if e.kind() == io::ErrorKind::PermissionDenied => {
                    out.push(Found::Unreadable(path, e.to_string()))
                }
                // Only a file read whole can be proven corrupt; anything else is left alone.
                Err(ReadError::Io(e)) => {
                    out.push(Found::LeftAlone(path, Unread::Failed(e.to_string())))
                }
                Err(ReadError::NotRegular(kind)) => {
                    out.push(Found::LeftAlone(path, Unread::NotRegular(kind)))
                }
                Err(ReadError::TooLarge(size)) => {
                    out.push(Found::LeftAlone(path, Unread::TooLarge(size)))
                }
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
        let bytes = read_limited(id).map_err(|e| e.into_io(id))?;
        parse_record(&bytes).map_err(|p| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is not a lock-owner record: {p}", id.display()),
            )
        })
    }

    fn write(&self, record: &Record) -> io::Result<PathBuf> {
        let path = self.path_of(record);
        let bytes = to_json(&*record.fitted());
        // What would not read back is refused here, with its reason, rather than written for
        // every reader to find corrupt.
        let problem = if bytes.len() as u64 > MAX_FILE {
            Some(format!(
                "it would be {} bytes, more than the {MAX_FILE} a reader takes (its paths or names are that long)",
                bytes.len()
            ))
        } else {
            parse_record(&bytes).err()
        };
        if let Some(problem) = problem {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "lock-owner record {} not written, it would not read back: {problem}",
                    path.display()
                ),
            ));
        }
        atomic_write(&path, &bytes)?;
        Ok(path)
    }

    fn remove(&self, id: &Path) -> io::Result<()> {
        remove(id)
    }

    fn set_aside(&self, id: &Path, why: &Aside) -> io::Result<PathBuf> {
        let aside = aside_path(id, why);
        fs::rename(id, &aside)?;
        Ok(aside)
    }

    fn read_heartbeat(&self, owner: &Owner) -> Option<Heartbeat> {
        if !valid_owner(&owner.name) {
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

    fn heartbeats(&self) -> Vec<Heartbeat> {
        let Ok(rd) = fs::read_dir(self.owners_dir()) else {
            return Vec::new();
        };
        rd.flatten()
            .filter_map(|e| {
                let file = e.file_name().to_string_lossy().into_owned();
                let stem = file.strip_suffix(".json")?;
                let bytes = read_limited(&e.path()).ok()?;
                let hb: Heartbeat = serde_json::from_slice(&bytes).ok()?;
                let own_file = stem == format!("{}.{}", hb.owner.name, hb.owner.incarnation());
                (hb.v == HEARTBEAT_FORMAT && own_file).then_some(hb)
            })
            .collect()
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
        Ok(Some((fd, id)))
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

/// Whether `file` is on a filesystem whose flocks live in this kernel alone (so a free flock
/// proves its holders gone): ext2/3/4, xfs, btrfs, tmpfs, overlayfs. Not NFS, CIFS, Ceph or FUSE,
/// whose locks a server keeps or emulates per process.
/// Whether the flock of the file at `path` is free (Some(true)), held (Some(false)), or unknown:
/// for cleaning only, never a proof (it does not know which file is at the path).
fn flock_free(path: &Path) -> Option<bool> {
    let (f, _) = open_regular(path, fs::OpenOptions::new().read(true)).ok()?;
    if !local_filesystem(&f) {
        return None;
    }
    test_flock(f)
}

/// Tries `f`'s exclusive flock without waiting: Some(true) it was free (and is released at
/// once), Some(false) someone holds it, None an error.
fn test_flock(f: fs::File) -> Option<bool> {
    match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
        // Dropped at once: unlocked, and nothing of that incarnation can take it again.
        Ok(_free) => Some(true),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Some(false),
        Err(_) => None,
    }
}

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
        | Found::Unreadable(p, _)
        | Found::LeftAlone(p, _) => p,
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

/// Warns about a file in `records/` that was left alone unread, saying what to do.
pub fn warn_left_alone(path: &Path, why: &Unread) {
    match why {
        Unread::NotRegular(kind) => tracing::warn!(
            file = %path.display(), kind,
            "lock-owner record is not a regular file and is left alone: tfinit never opens, follows or renames it; remove it"
        ),
        Unread::TooLarge(bytes) => tracing::warn!(
            file = %path.display(), bytes, limit = MAX_FILE,
            "lock-owner record is larger than tfinit reads and is left alone: a tfinit older than the record size cap may have written it and may still run that terraform; once its owner is gone, check the file by hand (it names the working directory and the lock's Who), then delete it"
        ),
        Unread::Failed(error) => tracing::warn!(
            file = %path.display(), error,
            "lock-owner record could not be read and is left alone; it is read again by the next recovery: check the volume"
        ),
    }
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

/// Why a file of the state directory was not read.
#[derive(Debug)]
enum ReadError {
    /// Opening or reading it failed.
    Io(io::Error),
    /// It is not a regular file: what it is (`a FIFO`).
    NotRegular(&'static str),
    /// It is larger than [`MAX_FILE`]: its size.
    TooLarge(u64),
}

impl ReadError {
    /// This error as an io::Error whose message names `path` and says what to do.
    fn into_io(self, path: &Path) -> io::Error {
        match self {
            ReadError::Io(e) => io::Error::new(e.kind(), format!("{}: {e}", path.display())),
            ReadError::NotRegular(kind) => io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is {kind}, not a regular file: tfinit opens nothing else in TFINIT_STATE_DIR and follows no link there; remove it",
                    path.display()
                ),
            ),
            ReadError::TooLarge(size) => io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} is {size} bytes, more than the {MAX_FILE} tfinit reads: check it by hand, then delete it",
                    path.display()
                ),
            ),
        }
    }
}

/// What a file system entry is, for messages: `a FIFO`, `a directory`, ...
fn kind_of(t: fs::FileType) -> &'static str {
    if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_char_device() {
        "a character device"
    } else {
        "of an unknown kind"
    }
}

/// Opens `path` with `options` when it is a regular file, and returns it with its metadata.
/// `O_NOFOLLOW`: a symbolic link is refused, never followed (it could point anywhere).
/// `O_NONBLOCK`: opening a FIFO returns at once (for reading; for writing it fails with ENXIO)
/// instead of waiting for good for a writer or a reader, and so does a device that waits for a
/// carrier. `O_NOCTTY`: a terminal device never becomes the init's controlling terminal.
/// `fstat` of the open file then decides, race-free; when the open itself fails, `lstat` says
/// whether an entry that is not a regular file was the reason.
fn open_regular(
    path: &Path,
    options: &mut fs::OpenOptions,
) -> Result<(fs::File, fs::Metadata), ReadError> {
    let file = options
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match fs::symlink_metadata(path) {
            Ok(m) if !m.file_type().is_file() => ReadError::NotRegular(kind_of(m.file_type())),
            _ => ReadError::Io(e),
        })?;
    let meta = file.metadata().map_err(ReadError::Io)?;
    if !meta.file_type().is_file() {
        return Err(ReadError::NotRegular(kind_of(meta.file_type())));
    }
    // O_NONBLOCK was for the open. Local file systems ignore it on regular files, but a FUSE or
    // network file system sees the flags a file is open with: read and write it as usual.
    let flags = fcntl(&file, FcntlArg::F_GETFL).map_err(|e| ReadError::Io(e.into()))?;
    fcntl(
        &file,
        FcntlArg::F_SETFL(OFlag::from_bits_retain(flags) - OFlag::O_NONBLOCK),
    )
    .map_err(|e| ReadError::Io(e.into()))?;
    Ok((file, meta))
}

/// Reads a record or heartbeat: a regular file (see [`open_regular`]) of at most [`MAX_FILE`]
/// bytes.
fn read_limited(path: &Path) -> Result<Vec<u8>, ReadError> {
    let (f, meta) = open_regular(path, fs::OpenOptions::new().read(true))?;
    if meta.len() > MAX_FILE {
        return Err(ReadError::TooLarge(meta.len()));
    }
    let mut buf = Vec::new();
    // One byte more than the limit: a file that grew since fstat is too large as well.
    f.take(MAX_FILE + 1)
        .read_to_end(&mut buf)
        .map_err(ReadError::Io)?;
    if buf.len() as u64 > MAX_FILE {
        return Err(ReadError::TooLarge(buf.len() as u64));
    }
    Ok(buf)
}

/// Where a set-aside record goes: `<name>.json.corrupt` or `<name>.json.manual` beside it.
fn aside_path(id: &Path, why: &Aside) -> PathBuf {
    match why {
        Aside::Corrupt(_) => id.with_extension("json.corrupt"),
        Aside::Manual => id.with_extension("json.manual"),
    }
}

/// The temporary file of an atomic write of `path`: `.<name>.tmp.<suffix>` beside it.
fn temp_path(path: &Path, suffix: &str) -> PathBuf {
    let dir = path.parent().unwrap_or(Path::new("."));
    dir.join(format!(
        ".{}.tmp.{suffix}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file"),
    ))
}

/// Writes `bytes` to `path` atomically: temp file in the same directory, fsync, rename, fsync dir.
pub fn atomic_write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = temp_path(path, &unique_suffix());
    let result = (|| {
        // A new file (O_EXCL): whatever already has the name (a FIFO, a link) is never opened.
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
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
    suffix_of(
        std::process::id(),
        now_ms(),
        nanos,
        N.fetch_add(1, Ordering::Relaxed),
    )
}

/// The suffix of [`unique_suffix`] from its parts (at most [`SUFFIX_MAX`] bytes: `nanos` is below
/// 10^9).
fn suffix_of(pid: u32, ms: u64, nanos: u32, n: u64) -> String {
    format!("{pid}.{ms}.{nanos}.{n}")
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
        // The proof holds on a local filesystem only: /dev/shm (tmpfs) is one wherever TMPDIR is.
        let dir = Path::new("/dev/shm").join(format!("tfinit-gone-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let store = FileStore::new(&dir);
        store.prepare().unwrap();
        assert!(local_filesystem(&fs::File::open(&dir).unwrap()));
        let a = Owner::current("pod-a", None);
        let nowhere = FileId { dev: 0, ino: 0 };
        assert_eq!(
            store.incarnation_gone(&a, nowhere),
            None,
            "no lock file: nothing proven"
        );
        let lock = store.lock_path(&a);
        fs::write(&lock, b"").unwrap();
        let id = FileId::of(&fs::File::open(&lock).unwrap()).unwrap();
        // The holder exits at once, but a background child it started inherits the lock and
        // lives on: like an init that died while one of its terraform runs had not.
        let marker = dir.join("child-done");
        let mut holder = flock_holder(
            &lock,
            &format!("(sleep 1; touch {}) & exit 0", marker.display()),
        );
        holder.wait().unwrap();
        assert_eq!(
            store.incarnation_gone(&a, id),
            Some(false),
            "its child holds it"
        );
        wait_until("the child to finish", || marker.exists());
        wait_until("the flock to be free", || {
            store.incarnation_gone(&a, id) == Some(true)
        });
        // Our own lock: held for the life of this process.
        let me = Owner {
            started_ms: a.started_ms + 1,
            ..a.clone()
        };
        let (_fd, mine) = store
            .hold_incarnation_lock(&me)
            .unwrap()
            .expect("a local filesystem");
        assert_eq!(store.incarnation_gone(&me, mine), Some(false));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_free_lock_file_that_replaced_the_owners_proves_nothing() {
        let dir = Path::new("/dev/shm").join(format!("tfinit-replaced-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let store = FileStore::new(&dir);
        store.prepare().unwrap();
        let me = Owner::current("pod-a", None);
        let (_held, id) = store.hold_incarnation_lock(&me).unwrap().unwrap();
        let hb = Heartbeat {
            v: HEARTBEAT_FORMAT,
            owner: me.clone(),
            seq: 1,
            updated_ms: now_ms(),
            holds_lock: true,
            host: "pod-a".into(),
            ttl_ms: Some(30_000),
            lock_file: Some(id),
        };
        let observer = Owner {
            started_ms: me.started_ms + 1,
            ..me.clone()
        };
        assert_eq!(store.kernel_proof(&observer, &me, Some(&hb)), Some(false));
        // owners/ restored from a backup: a new file (new inode) at the lock's path, which no
        // process holds, while the owner still holds the old one.
        let path = store.lock_path(&me);
        let restored = dir.join("owners").join("restored");
        fs::write(&restored, b"").unwrap();
        fs::rename(&restored, &path).unwrap();
        assert_eq!(flock_free(&path), Some(true), "the new file is free");
        assert_eq!(
            store.kernel_proof(&observer, &me, Some(&hb)),
            None,
            "another file proves nothing"
        );
        // A heartbeat that names no file (an older tfinit) proves nothing either.
        let older = Heartbeat {
            lock_file: None,
            ..hb.clone()
        };
        assert_eq!(store.kernel_proof(&observer, &me, Some(&older)), None);
        // Another boot: nothing.
        let elsewhere = Owner {
            boot_id: "other-boot".into(),
            ..observer.clone()
        };
        assert_eq!(store.kernel_proof(&elsewhere, &me, Some(&hb)), None);
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

#[cfg(test)]
mod bad_entry_tests {
    use super::*;
    use crate::locks::names::{
        owner_problem, valid_run_id, INCARNATION_MAX, MAX_OWNER_LEN, NAME_MAX, SUFFIX_MAX,
    };
    use crate::locks::record::{sample, OMITTED_MARK};
    use std::sync::mpsc;

    /// How long a call that must not block may take (it takes milliseconds).
    const PROMPTLY: Duration = Duration::from_secs(5);

    fn temp_store(name: &str) -> (PathBuf, FileStore) {
        let dir = std::env::temp_dir().join(format!("tfinit-bad-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let store = FileStore::new(&dir);
        store.prepare().unwrap();
        (dir, store)
    }

    fn mkfifo(path: &Path) {
        nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    }

    /// Runs `f` on a thread and waits for its answer until `PROMPTLY` passes; on time-out,
    /// `unblock` runs (so the thread can finish) and the test fails, naming `what`.
    fn promptly<T: Send + 'static>(
        what: &str,
        f: impl FnOnce() -> T + Send + 'static,
        unblock: impl FnOnce(),
    ) -> T {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        match rx.recv_timeout(PROMPTLY) {
            Ok(v) => v,
            Err(_) => {
                unblock();
                panic!("{what} still blocked after {PROMPTLY:?}");
            }
        }
    }

    /// Opens a FIFO for writing without blocking, which lets a reader blocked in open(2) go on.
    fn open_fifo_for_writing(path: &Path) {
        let _ = fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path);
    }

    fn left_alone<'a>(found: &'a [Found], path: &Path) -> Option<&'a Unread> {
        found.iter().find_map(|f| match f {
            Found::LeftAlone(p, why) if p == path => Some(why),
            _ => None,
        })
    }

    #[test]
    fn a_record_of_25000_arguments_and_30000_resources_in_progress_reads_back_with_markers() {
        let (dir, store) = temp_store("big");
        let mut rec = sample(&Owner::current("pod-a", None));
        rec.subcommand = "state rm".into();
        rec.argv = ["state".to_string(), "rm".to_string()]
            .into_iter()
            .chain((0..25_000).map(|i| format!("null_resource.r_{i:0>24}")))
            .collect();
        assert_eq!(rec.argv[2].len(), 40);
        rec.in_progress = (0..30_000)
            .map(|i| format!("null_resource.r_{i:0>24}"))
            .collect();
        let path = store.write(&rec).unwrap();
        let size = fs::metadata(&path).unwrap().len();
        assert!(
            size < MAX_FILE / 2,
            "{size} bytes is not far below {MAX_FILE}"
        );

        let back = store.read(&path).unwrap();
        assert_eq!(back.argv[..3], rec.argv[..3], "the start is kept as it was");
        let kept = back.argv.len() - 1;
        assert!(kept > 1000, "only {kept} arguments kept");
        assert_eq!(
            back.argv.last().unwrap(),
            &format!(
                "{OMITTED_MARK}{} more arguments not recorded",
                rec.argv.len() - kept
            )
        );
        let kept = back.in_progress.len() - 1;
        assert_eq!(back.in_progress[..kept], rec.in_progress[..kept]);
        assert_eq!(
            back.in_progress.last().unwrap(),
            &format!(
                "{OMITTED_MARK}{} more resources in progress not recorded",
                rec.in_progress.len() - kept
            )
        );
        // The sweep, and so every recovery, reads it as the record it is.
        let swept = store.sweep();
        assert_eq!(swept.len(), 1, "{:?}", store.list());
        assert!(path.exists(), "a live record was set aside");
        // Written again (a recovery marking it), it stays the same.
        store.write(&back).unwrap();
        assert_eq!(store.read(&path).unwrap(), back);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_record_that_would_not_read_back_is_refused_not_written() {
        let (dir, store) = temp_store("refused");
        let mut rec = sample(&Owner::current("pod-a", None));
        rec.workdir = "relative/dir".into();
        let e = store.write(&rec).unwrap_err().to_string();
        assert!(
            e.contains("not written") && e.contains("relative/dir"),
            "{e}"
        );
        rec.workdir = format!("/{}", "d".repeat(MAX_FILE as usize));
        let e = store.write(&rec).unwrap_err().to_string();
        assert!(e.contains("bytes, more than"), "{e}");
        assert!(store.list().is_empty(), "{:?}", store.list());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_fifo_in_records_does_not_block_listing_and_is_reported_and_left_in_place() {
        let (dir, store) = temp_store("fifo");
        let good = store
            .write(&sample(&Owner::current("pod-a", None)))
            .unwrap();
        let fifo = dir.join("records/x.json");
        mkfifo(&fifo);
        let s = store.clone();
        let found = promptly(
            "list() with a FIFO in records/",
            move || s.list(),
            || open_fifo_for_writing(&fifo),
        );
        assert_eq!(
            left_alone(&found, &fifo),
            Some(&Unread::NotRegular("a FIFO")),
            "{found:?}"
        );
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found
                .iter()
                .any(|f| matches!(f, Found::Record(p, _) if *p == good)),
            "{found:?}"
        );
        let s = store.clone();
        let swept = promptly(
            "sweep() with a FIFO in records/",
            move || s.sweep(),
            || open_fifo_for_writing(&fifo),
        );
        assert_eq!(swept.len(), 1);
        assert!(
            fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(),
            "the FIFO was moved"
        );
        let e = store.read(&fifo).unwrap_err().to_string();
        assert!(
            e.contains(fifo.to_str().unwrap()) && e.contains("a FIFO") && e.contains("remove it"),
            "{e}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reading_a_fifo_heartbeat_or_record_returns_at_once() {
        let (dir, _store) = temp_store("readfifo");
        let fifo = dir.join("owners/pod-b.json");
        mkfifo(&fifo);
        let f = fifo.clone();
        let read = promptly(
            "reading a FIFO",
            move || read_limited(&f),
            || open_fifo_for_writing(&fifo),
        );
        assert!(
            matches!(read, Err(ReadError::NotRegular("a FIFO"))),
            "{read:?}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn recover_lock_as_a_fifo_fails_fast_naming_it() {
        let (dir, store) = temp_store("lockfifo");
        let lock = dir.join(RECOVER_LOCK);
        mkfifo(&lock);
        let s = store.clone();
        let started = Instant::now();
        let result = promptly(
            "lock_recovery() with a FIFO as recover.lock",
            move || s.lock_recovery(Duration::from_secs(250)).map(drop),
            || {
                // A reader lets the blocked open for writing go on.
                let _ = fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(&lock);
            },
        );
        let e = result.unwrap_err().to_string();
        assert!(started.elapsed() < PROMPTLY);
        assert!(
            e.contains(lock.to_str().unwrap()) && e.contains("a FIFO") && e.contains("remove it"),
            "{e}"
        );
        // Also with a reader on the FIFO, where open(2) for writing succeeds: fstat refuses it.
        let reader = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&lock)
            .unwrap();
        let e = store.lock_recovery(Duration::ZERO).unwrap_err().to_string();
        assert!(e.contains("a FIFO"), "{e}");
        drop(reader);
        // Negative case: once it is removed, the lock is taken again.
        fs::remove_file(&lock).unwrap();
        assert!(store.lock_recovery(Duration::ZERO).is_ok());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn symbolic_links_in_the_state_directory_are_never_followed() {
        let (dir, store) = temp_store("link");
        let target = dir.join("elsewhere.json");
        let good = sample(&Owner::current("pod-a", None));
        fs::write(&target, serde_json::to_vec(&good).unwrap()).unwrap();
        let link = dir.join("records/a.json");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let passwd = dir.join("records/p.json");
        std::os::unix::fs::symlink("/etc/passwd", &passwd).unwrap();

        let found = store.list();
        for l in [&link, &passwd] {
            assert_eq!(
                left_alone(&found, l),
                Some(&Unread::NotRegular("a symbolic link")),
                "{found:?}"
            );
        }
        assert!(store.sweep().is_empty(), "a record was read through a link");
        for l in [&link, &passwd] {
            assert!(fs::symlink_metadata(l).unwrap().is_symlink(), "{l:?} moved");
            let e = store.read(l).unwrap_err().to_string();
            assert!(
                e.contains("a symbolic link") && e.contains("remove it"),
                "{e}"
            );
        }
        // recover.lock as a link: refused, and the file it points to is not created.
        let lock_target = dir.join("lock-target");
        std::os::unix::fs::symlink(&lock_target, dir.join(RECOVER_LOCK)).unwrap();
        let e = store.lock_recovery(Duration::ZERO).unwrap_err().to_string();
        assert!(e.contains("a symbolic link"), "{e}");
        assert!(!lock_target.exists(), "the lock's link was followed");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_oversized_record_is_left_in_place_not_set_aside() {
        let (dir, store) = temp_store("oversized");
        // As a tfinit older than the cap wrote it while its owner may live: valid, only large.
        let mut rec = sample(&Owner::current("pod-old", None));
        rec.argv = vec!["x".repeat(40); 30_000];
        let path = dir.join("records/pod-old.x.r1.json");
        fs::write(&path, serde_json::to_vec_pretty(&rec).unwrap()).unwrap();
        let found = store.list();
        assert!(
            matches!(left_alone(&found, &path), Some(Unread::TooLarge(n)) if *n > MAX_FILE),
            "{found:?}"
        );
        store.sweep();
        assert!(path.exists(), "an oversized record was set aside");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_entry_that_is_not_a_directory_where_records_go_is_named_at_open() {
        let dir = std::env::temp_dir().join(format!("tfinit-bad-subdir-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        mkfifo(&dir.join("records"));
        let e = FileStore::new(&dir)
            .open(Duration::from_secs(3600))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("records") && e.contains("a FIFO") && e.contains("remove it"),
            "{e}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_fifo_named_like_a_temporary_file_is_left_alone_at_open() {
        let (dir, store) = temp_store("tmpfifo");
        let fifo = dir.join("records/.pod-a.x.r1.json.tmp.1.2.3.4");
        mkfifo(&fifo);
        let s = store.clone();
        promptly(
            "open() with a FIFO named like a temporary file",
            move || s.open(Duration::ZERO),
            || open_fifo_for_writing(&fifo),
        )
        .unwrap();
        assert!(fs::symlink_metadata(&fifo).is_ok(), "the FIFO was removed");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_longest_owner_name_gives_file_names_of_at_most_255_bytes() {
        assert_eq!(
            MAX_OWNER_LEN, 109,
            "the arithmetic in MAX_OWNER_LEN's comment"
        );
        let name = "o".repeat(MAX_OWNER_LEN);
        assert_eq!(owner_problem(&name), None);
        let refused = owner_problem(&format!("{name}o")).unwrap();
        assert!(
            refused.contains("110") && refused.contains("109"),
            "{refused}"
        );

        // Every part at its longest.
        let owner = Owner {
            name: name.clone(),
            boot_id: "ffffffff-ffff-ffff-ffff-ffffffffffff".into(),
            started_ms: u64::MAX,
            pid: i32::MIN,
            pod_uid: None,
            nonce: Some(u32::MAX),
        };
        assert_eq!(owner.incarnation().len(), INCARNATION_MAX);
        let mut rec = sample(&owner);
        rec.run_id = format!("r{}", u64::MAX);
        assert!(valid_run_id(&rec.run_id));
        let store = FileStore::new(Path::new("/state"));
        let record = store.path_of(&rec);
        let suffix = suffix_of(u32::MAX, u64::MAX, 999_999_999, u64::MAX);
        assert_eq!(suffix.len(), SUFFIX_MAX);
        let incarnation = owner.incarnation();
        let heartbeat = store
            .owners_dir()
            .join(format!("{name}.{incarnation}.json"));
        let heartbeat_lock = store
            .owners_dir()
            .join(format!("{name}.{incarnation}.lock"));
        let names = [
            temp_path(&record, &suffix),
            record.clone(),
            aside_path(&record, &Aside::Corrupt(String::new())),
            aside_path(&record, &Aside::Manual),
            heartbeat.clone(),
            heartbeat_lock,
            temp_path(&heartbeat, &suffix),
            store.owners_dir().join(format!("{name}.json")),
        ];
        let len = |p: &PathBuf| p.file_name().unwrap().len();
        assert_eq!(
            len(&names[0]),
            NAME_MAX,
            "the longest is a record's temporary file"
        );
        for p in &names {
            assert!(len(p) <= NAME_MAX, "{} bytes: {}", len(p), p.display());
        }

        // And the file system agrees: each can be created, one byte more cannot.
        let dir = std::env::temp_dir().join(format!("tfinit-names-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        for p in &names {
            fs::File::create(dir.join(p.file_name().unwrap())).unwrap();
        }
        let too_long = dir.join(format!(
            "{}x",
            names[0].file_name().unwrap().to_str().unwrap()
        ));
        let e = fs::File::create(too_long).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENAMETOOLONG));
        fs::remove_dir_all(&dir).unwrap();
    }
}
