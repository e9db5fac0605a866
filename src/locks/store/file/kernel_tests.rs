//! What the kernel proves of an incarnation through its lock file, and the pruning of the
//! heartbeats of predecessors it proves gone: tested on /dev/shm, a local filesystem (tmpfs)
//! wherever TMPDIR is.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use super::tests::beat;
use super::FileStore;
use crate::locks::record::{now_ms, sample, FileId, Heartbeat, Owner, HEARTBEAT_FORMAT};
use crate::locks::store::fsio::{flock_free, local_filesystem};
use crate::locks::store::{Store, FILE_FORMAT};

/// A file store in a fresh directory `tfinit-<name>-<pid>` on /dev/shm: the kernel's proof holds
/// on a local filesystem only, and tmpfs is one wherever TMPDIR is.
fn shm_store(name: &str) -> (std::path::PathBuf, FileStore) {
    let dir = Path::new("/dev/shm").join(format!("tfinit-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let store = FileStore::new(&dir);
    store.prepare().unwrap();
    (dir, store)
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
    let (dir, store) = shm_store("gone");
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
fn a_predecessor_the_kernel_proves_gone_is_pruned_at_once_and_only_then() {
    let (dir, store) = shm_store("prune-gone");
    let me = Owner::current("pod-a", None);
    let (pred, other_boot) = (
        Owner {
            started_ms: me.started_ms - 1_000,
            ..me.clone()
        },
        Owner {
            boot_id: "other-boot".into(),
            started_ms: 7,
            ..me.clone()
        },
    );
    let (held, id) = store
        .hold_incarnation_lock(&pred)
        .unwrap()
        .expect("tmpfs is local");
    for (o, file) in [(&pred, Some(id)), (&other_boot, Some(id))] {
        let hb = Heartbeat {
            lock_file: file,
            ..beat(o, 1, now_ms())
        };
        store.write_heartbeat(&hb).unwrap();
    }
    let hour = Duration::from_secs(3600);
    let kept = |what: &str| {
        for o in [&pred, &other_boot] {
            assert!(store.read_heartbeat(o).unwrap().is_some(), "{what}: {o:?}");
        }
    };
    store.prune_heartbeats(&[], &me, hour, true);
    kept("its flock is held");
    drop(held);
    store.prune_heartbeats(&[], &me, hour, false);
    kept("a record may not have been listed");
    store.prune_heartbeats(&[sample(&pred)], &me, hour, true);
    kept("it has a record");
    // Through the opening's own tidy: a record it cannot read (a newer tfinit's file) may be the
    // predecessor's, so the listing is not whole.
    let newer = store.incarnation_path(&Owner::current("pod-y", None));
    let text = format!("{{\"v\":{},\"records\":[]}}", FILE_FORMAT + 1);
    fs::write(&newer, text).unwrap();
    store.tidy(&me, hour);
    kept("a newer tfinit's record was not read");
    fs::remove_file(&newer).unwrap();
    store.tidy(&me, hour);
    assert!(
        store.read_heartbeat(&pred).unwrap().is_none(),
        "gone, pruned"
    );
    assert!(!store.lock_path(&pred).exists(), "its lock file too");
    assert!(
        store.read_heartbeat(&other_boot).unwrap().is_some(),
        "another boot's: no proof, kept until silent for `older_than`"
    );
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_free_lock_file_that_replaced_the_owners_proves_nothing() {
    let (dir, store) = shm_store("replaced");
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
