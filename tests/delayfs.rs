//! The FUSE passthrough of the storage tests (tests/common/fuse.rs, tests/support/delayfs.py)
//! does what tests/storage.rs relies on: it mirrors its backing directory, delays the slow
//! operations, fails and holds requests per path prefix, and hangs while stopped; dropping it
//! leaves no mount behind, even with a request held.

mod common;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::fuse::{DelayFs, Rules};

/// Writes `path` through the mount in a thread; the receiver gets the result when it is done.
fn write_in_background(path: PathBuf) -> mpsc::Receiver<std::io::Result<()>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(std::fs::write(&path, b"x"));
    });
    rx
}

fn mounted(p: &Path) -> bool {
    common::read(Path::new("/proc/self/mountinfo")).contains(&format!(" {} ", p.display()))
}

#[test]
fn delayfs_mirrors_delays_fails_holds_and_hangs() {
    if !common::require_root("FUSE mounts of the delay filesystem") {
        return;
    }
    let Some(fs) = DelayFs::mount("delayfs-self") else {
        return;
    };
    let mount = fs.mount.clone();
    std::fs::create_dir_all(mount.join("records")).unwrap();
    std::fs::create_dir_all(mount.join("owners")).unwrap();
    std::fs::write(mount.join("records/a.json"), b"{}").unwrap();
    assert_eq!(common::read(&fs.backing.join("records/a.json")), "{}");

    // A delay applies to each slow operation: creating a file is at least one.
    fs.set(&Rules::delay(Duration::from_millis(300)));
    let t = Instant::now();
    std::fs::write(mount.join("records/b.json"), b"{}").unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    // Reads are never delayed: under a delay of 5 s, a read that waited for it would take 5 s;
    // the bound is the configured delay, not a guess at how fast an undelayed read is.
    fs.set(&Rules::delay(Duration::from_secs(5)));
    let t = Instant::now();
    assert_eq!(common::read(&mount.join("records/a.json")), "{}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "a read waited for the 5 s delay: {:?}",
        t.elapsed()
    );

    // EIO under one prefix only.
    fs.set(&Rules {
        fail: vec!["/owners/"],
        ..Rules::default()
    });
    let err = std::fs::write(mount.join("owners/x.json"), b"{}").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    std::fs::write(mount.join("records/c.json"), b"{}").unwrap();

    // A hold keeps the request until the rule is lifted; other paths are served meanwhile.
    fs.set(&Rules {
        hold: vec!["/records/"],
        ..Rules::default()
    });
    let held = write_in_background(mount.join("records/d.json"));
    assert!(
        held.recv_timeout(Duration::from_millis(500)).is_err(),
        "held"
    );
    std::fs::write(mount.join("owners/y.json"), b"{}").unwrap();
    fs.set(&Rules::default());
    held.recv_timeout(Duration::from_secs(5))
        .expect("the held write ends once the hold is lifted")
        .unwrap();

    // A hang stops every request until the daemon resumes.
    fs.hang();
    let hung = write_in_background(mount.join("owners/z.json"));
    assert!(
        hung.recv_timeout(Duration::from_millis(500)).is_err(),
        "hung"
    );
    fs.resume();
    hung.recv_timeout(Duration::from_secs(5))
        .expect("the hung write ends once the daemon resumes")
        .unwrap();
    let ops = fs.ops();
    assert!(
        ops.iter()
            .any(|(_, op, p)| op == "create" && p == "/owners/z.json"),
        "{ops:?}"
    );

    // Dropped with a request held: the mount is gone and the caller gets an error, not a hang.
    fs.set(&Rules {
        hold: vec!["/records/"],
        ..Rules::default()
    });
    let stuck = write_in_background(mount.join("records/e.json"));
    assert!(stuck.recv_timeout(Duration::from_millis(300)).is_err());
    drop(fs);
    let end = stuck
        .recv_timeout(Duration::from_secs(5))
        .expect("a held request ends when the passthrough is dropped");
    assert!(end.is_err(), "the connection was aborted: {end:?}");
    assert!(
        !mounted(&mount),
        "no mount left behind at {}",
        mount.display()
    );
}
