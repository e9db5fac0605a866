//! A FUSE passthrough for the storage tests: `tests/support/delayfs.py` (fusepy over Debian's
//! libfuse2, installed by scripts/install-test-deps.sh) mirrors a backing directory, and
//! [`DelayFs`] steers it: a delay per operation, EIO or a held request per path prefix, and a
//! hang (the daemon stopped with SIGSTOP, so it reads no request and every wait stays killable).
//!
//! Dropping a [`DelayFs`] kills the daemon (closing /dev/fuse aborts the connection and fails
//! every request, held ones included) and detaches the mount, so a failed test never leaves a
//! hung mount behind.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

use super::{deps, read, repo, require, TempDir};

/// The operations a write of tfinit's is made of (create, fsync, rename, directory fsync), plus
/// the mkdir and unlink of set-up and removal.
pub const SLOW_OPS: [&str; 6] = ["create", "rename", "unlink", "fsync", "fsyncdir", "mkdir"];

/// What the daemon does to requests; the JSON of its control file.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    /// Sleep this long before each operation of [`SLOW_OPS`].
    pub delay: Duration,
    /// EIO for every operation on a path under these prefixes (`/owners/`, `/records/`).
    pub fail: Vec<&'static str>,
    /// Read every request on a path under these prefixes and keep it until the rule is lifted.
    pub hold: Vec<&'static str>,
}

impl Rules {
    /// Every slow operation takes `delay`.
    pub fn delay(delay: Duration) -> Rules {
        Rules {
            delay,
            ..Rules::default()
        }
    }
}

/// The FUSE passthrough, mounted.
pub struct DelayFs {
    /// The directory mirrored: read what is "on disk" here, never through the mount.
    pub backing: PathBuf,
    /// Where it is mounted: use this as TFINIT_STATE_DIR.
    pub mount: PathBuf,
    control: PathBuf,
    ops_log: PathBuf,
    daemon: Child,
    tmp: TempDir,
}

/// Why a FUSE mount cannot be made here, or None when it can be tried.
fn missing_precondition(python: &Path) -> Option<String> {
    if !super::is_root() {
        return Some("root (FUSE mounts with allow_other)".into());
    }
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        return Some(format!("/dev/fuse cannot be opened ({e})"));
    }
    let fusepy = Command::new(python)
        .args(["-c", "import fuse"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !fusepy.is_ok_and(|s| s.success()) {
        return Some(format!(
            "fusepy and libfuse2 for {} (scripts/install-test-deps.sh)",
            python.display()
        ));
    }
    None
}

impl DelayFs {
    /// Mounts an empty passthrough passing everything through at once; None (after one SKIP
    /// line, or a panic under CI) when FUSE is not usable by this user on this machine.
    pub fn mount(name: &str) -> Option<DelayFs> {
        let python = deps().join("bin/python");
        if let Some(what) = missing_precondition(&python) {
            require(false, &what);
            return None;
        }
        let tmp = TempDir::new(name);
        let (backing, mount) = (tmp.join("backing"), tmp.join("mnt"));
        std::fs::create_dir_all(&backing).expect("create the backing directory");
        std::fs::create_dir_all(&mount).expect("create the mount point");
        let control = tmp.join("control.json");
        let daemon = Command::new(python)
            .arg(repo().join("tests/support/delayfs.py"))
            .args([&backing, &mount, &control])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(tmp.join("delayfs.log")).expect("create delayfs.log"))
            .spawn()
            .expect("start delayfs.py");
        let fs = DelayFs {
            backing,
            mount,
            ops_log: tmp.join("ops.log"),
            control,
            daemon,
            tmp,
        };
        fs.set(&Rules::default());
        let ready = PathBuf::from(format!("{}.ready", fs.control.display()));
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !ready.exists() {
            if std::time::Instant::now() >= deadline {
                let why = read(&fs.tmp.join("delayfs.log"));
                require(
                    false,
                    &format!("a FUSE mount by this user (delayfs: {why})"),
                );
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Some(fs)
    }

    /// Replaces the rules; they apply from the daemon's next request (a held request re-reads
    /// them every 20 ms). Every operation is logged (see [`DelayFs::ops`]).
    pub fn set(&self, rules: &Rules) {
        let body = json!({
            "delay_ms": rules.delay.as_millis() as u64,
            "delay_ops": SLOW_OPS,
            "fail": rules.fail,
            "hold": rules.hold,
            "log": self.ops_log,
        });
        let tmp = PathBuf::from(format!("{}.tmp", self.control.display()));
        std::fs::write(&tmp, body.to_string()).expect("write the delayfs control file");
        std::fs::rename(&tmp, &self.control).expect("rename the delayfs control file");
    }

    /// Stops the daemon (SIGSTOP): it reads no request until [`DelayFs::resume`], as a network
    /// volume whose server went away; a caller blocked on it still dies of SIGKILL.
    /// Returns once every thread of the daemon is stopped: kill(2) only queues the stop, and a
    /// daemon thread still running could take one more request in between.
    pub fn hang(&self) {
        let pid = self.daemon.id() as i32;
        kill(Pid::from_raw(pid), Signal::SIGSTOP).expect("SIGSTOP delayfs");
        super::wait_for(
            Duration::from_secs(10),
            "every delayfs thread to be stopped after SIGSTOP",
            || all_threads_stopped(pid).then_some(()),
        );
    }

    /// Lets a hung daemon read requests again (SIGCONT).
    pub fn resume(&self) {
        kill(Pid::from_raw(self.daemon.id() as i32), Signal::SIGCONT).expect("SIGCONT delayfs");
    }

    /// The operations served so far, one per line: `UNIX_TIME OP PATH [PATH]` (logged when the
    /// request is read, before its delay).
    pub fn ops(&self) -> Vec<(f64, String, String)> {
        read(&self.ops_log)
            .lines()
            .filter_map(|l| {
                let mut f = l.splitn(3, ' ');
                let ts = f.next()?.parse().ok()?;
                Some((ts, f.next()?.to_string(), f.next()?.to_string()))
            })
            .collect()
    }

    /// The JSON lock-owner records in the backing directory (what is on disk), by file name (each
    /// record of an incarnation's file with that file's name).
    pub fn records(&self) -> Vec<(String, Value)> {
        let mut out: Vec<(String, Value)> = std::fs::read_dir(self.backing.join("records"))
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| {
                        let name = e.file_name().to_string_lossy().to_string();
                        if name.starts_with('.') || !name.ends_with(".json") {
                            return None;
                        }
                        let v = serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok()?;
                        Some((name, v))
                    })
                    .flat_map(|(name, v)| {
                        super::pods::records_in(v)
                            .into_iter()
                            .map(move |r| (name.clone(), r))
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

impl Drop for DelayFs {
    fn drop(&mut self) {
        // SIGKILL works on a stopped process too; closing /dev/fuse fails every request.
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.mount)
            .stderr(Stdio::null())
            .status();
    }
}

/// Whether every thread of `pid` is stopped (state `T` in /proc/PID/task/TID/stat).
fn all_threads_stopped(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|t| {
        let stat = read(&t.path().join("stat"));
        // The state is the field after the command's closing parenthesis.
        stat.rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next())
            == Some('T')
    })
}
