//! The file system calls the store is built on: opening only regular files, reading with a
//! size cap, atomic writes, removals, and flock tests.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use nix::fcntl::{fcntl, FcntlArg, Flock, FlockArg, OFlag};
use serde::Serialize;

use super::{Aside, RecordId};
use crate::locks::record::{now_ms, MAX_FILE};

/// Whether the flock of the file at `path` is free (Some(true)), held (Some(false)), or unknown:
/// for cleaning only, never a proof (it does not know which file is at the path).
pub(super) fn flock_free(path: &Path) -> Option<bool> {
    let (f, _) = open_regular(path, fs::OpenOptions::new().read(true)).ok()?;
    if !local_filesystem(&f) {
        return None;
    }
    test_flock(f)
}

/// Tries `f`'s exclusive flock without waiting: Some(true) it was free (and is released at
/// once), Some(false) someone holds it, None an error.
pub(super) fn test_flock(f: fs::File) -> Option<bool> {
    match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
        // Dropped at once: unlocked, and nothing of that incarnation can take it again.
        Ok(_free) => Some(true),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Some(false),
        Err(_) => None,
    }
}

/// Whether `file` is on a filesystem whose flocks live in this kernel alone (so a free flock
/// proves its holders gone): ext2/3/4, xfs, btrfs, tmpfs, overlayfs. Not NFS, CIFS, Ceph or FUSE,
/// whose locks a server keeps or emulates per process.
pub(super) fn local_filesystem(file: &fs::File) -> bool {
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

pub(super) fn to_json<T: Serialize>(v: &T) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(v).unwrap_or_else(|_| b"{}".to_vec());
    out.push(b'\n');
    out
}

/// Why a file of the state directory was not read.
#[derive(Debug)]
pub(super) enum ReadError {
    /// Opening or reading it failed.
    Io(io::Error),
    /// It is not a regular file: what it is (`a FIFO`).
    NotRegular(&'static str),
    /// It is larger than [`MAX_FILE`]: its size.
    TooLarge(u64),
}

impl ReadError {
    /// This error as an io::Error whose message names `path` and says what to do.
    pub(super) fn into_io(self, path: &Path) -> io::Error {
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
pub(super) fn kind_of(t: fs::FileType) -> &'static str {
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
pub(super) fn open_regular(
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
pub(super) fn read_limited(path: &Path) -> Result<Vec<u8>, ReadError> {
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
pub(super) fn aside_path(id: &Path, why: &Aside) -> PathBuf {
    match why {
        Aside::Corrupt(_) => id.with_extension("json.corrupt"),
        Aside::Manual => id.with_extension("json.manual"),
    }
}

/// The temporary file of an atomic write of `path`: `.<name>.tmp.<suffix>` beside it.
pub(super) fn temp_path(path: &Path, suffix: &str) -> PathBuf {
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
pub(super) fn unique_suffix() -> String {
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

/// The suffix of [`unique_suffix`] from its parts (at most `SUFFIX_MAX` bytes: `nanos` is below
/// 10^9).
pub(super) fn suffix_of(pid: u32, ms: u64, nanos: u32, n: u64) -> String {
    format!("{pid}.{ms}.{nanos}.{n}")
}

/// The file of `id`, or the error of an id another store made (a caller's bug).
pub(super) fn file_of(id: &RecordId) -> io::Result<&Path> {
    id.as_file().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{id} is not a record file of a state directory"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::super::file::RECOVER_LOCK;
    use super::super::*;
    use super::*;
    use crate::locks::names::{
        owner_problem, valid_run_id, INCARNATION_MAX, MAX_OWNER_LEN, NAME_MAX, SUFFIX_MAX,
    };
    use crate::locks::record::Unread;
    use crate::locks::record::{sample, OMITTED_MARK};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

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
            Found::LeftAlone(p, why) if p.as_file() == Some(path) => Some(why),
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
        let file = store.incarnation_path(&rec.owner);
        let size = fs::metadata(&file).unwrap().len();
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
        assert!(
            file.exists() && store.read(&path).is_ok(),
            "a live record was set aside"
        );
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
        let e = store.read(&RecordId::file(&fifo)).unwrap_err().to_string();
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
            let e = store.read(&RecordId::file(l)).unwrap_err().to_string();
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
