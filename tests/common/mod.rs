//! Shared helpers of the integration tests: the binaries, PID namespaces, temp dirs, polling.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The tfinit binary under test.
pub fn tfinit() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tfinit"))
}

/// The test helper binary.
pub fn helper() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tfinit-test-helper"))
}

/// Whether we are root (PID-namespace tests need it).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Fails (under CI or TFINIT_REQUIRE_DEPS) or skips with one line when a precondition is missing.
/// Returns true when the test should go on.
pub fn require(ok: bool, what: &str) -> bool {
    if ok {
        return true;
    }
    if std::env::var_os("TFINIT_REQUIRE_DEPS").is_some() || std::env::var_os("CI").is_some() {
        panic!("missing test precondition: {what} (run scripts/test.sh, which installs it)");
    }
    eprintln!("SKIP: {what}");
    false
}

/// Root of the repository.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The test dependencies directory (scripts/install-test-deps.sh fills it).
pub fn deps() -> PathBuf {
    std::env::var_os("TFINIT_TEST_DEPS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".test-deps"))
}

/// A fresh temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// Creates `/tmp/tfinit-test-<name>-<pid>-<n>`.
    pub fn new(name: &str) -> TempDir {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "tfinit-test-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    /// A path inside.
    pub fn join(&self, p: &str) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("TFINIT_KEEP_TEMP").is_none() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A command that runs `tfinit ARGS` as PID 1 of a new PID namespace (and mount namespace, so
/// /proc shows only that namespace). With `uts`, also a new UTS namespace named `hostname`.
pub fn pid1(hostname: Option<&str>) -> Command {
    let mut c = Command::new("unshare");
    c.args(["--pid", "--fork", "--mount-proc", "--kill-child"]);
    if let Some(h) = hostname {
        c.arg("--uts");
        c.arg("sh")
            .arg("-c")
            .arg(format!("hostname {h} && exec \"$0\" \"$@\""));
    }
    c.arg(tfinit());
    c
}

/// Polls `f` every 10 ms until it returns Some or `timeout` passes (then panics with `what`).
pub fn wait_for<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for a child with a deadline; kills it and panics on timeout.
pub fn wait_child(child: &mut Child, timeout: Duration, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            return st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs a command to completion with a deadline, capturing output.
pub fn run_output(cmd: &mut Command, timeout: Duration) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let status = wait_child(&mut child, timeout, "command");
    Output {
        status,
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
    }
}

/// Reads a file, or empty when missing.
pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// A directory with a `terraform` symlink to tfinit (the shim), to put first on PATH.
pub fn shim_dir(tmp: &TempDir) -> PathBuf {
    let d = tmp.join("shim");
    std::fs::create_dir_all(&d).unwrap();
    let _ = std::os::unix::fs::symlink(tfinit(), d.join("terraform"));
    d
}

/// A directory with a fake `terraform` (the helper under that name), to put after the shim.
pub fn fake_terraform_dir(tmp: &TempDir) -> PathBuf {
    let d = tmp.join("fake");
    std::fs::create_dir_all(&d).unwrap();
    let _ = std::os::unix::fs::symlink(helper(), d.join("terraform"));
    d
}

/// PATH with `dirs` first.
pub fn path_with(dirs: &[&Path]) -> String {
    let mut parts: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    parts.push(std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()));
    parts.join(":")
}

/// Every variable tfinit reads, removed so the caller's environment cannot change a test.
pub const TFINIT_VARS: [&str; 15] = [
    "TFINIT_FORWARD",
    "TFINIT_REWRITE",
    "TFINIT_GRACE_PERIOD",
    "TFINIT_STOP_TIMEOUT",
    "TFINIT_KILL_MARGIN",
    "TFINIT_LOG",
    "TFINIT_LOG_FORMAT",
    "TFINIT_RUN_DIR",
    "TFINIT_STATE_DIR",
    "TFINIT_OWNER",
    "TFINIT_OWNER_TTL",
    "TFINIT_FORCE_UNLOCK",
    "TFINIT_TERRAFORM",
    "TFINIT_POD_UID",
    "POD_UID",
];

/// The pids of `pid`'s children (its main thread's), from /proc.
pub fn children_of(pid: i32) -> Vec<i32> {
    read(Path::new(&format!("/proc/{pid}/task/{pid}/children")))
        .split_whitespace()
        .filter_map(|s| s.parse().ok())
        .collect()
}

/// Collects everything read from `pipe` (a child's stderr) in the background.
pub fn collect(
    mut pipe: impl std::io::Read + Send + 'static,
) -> (
    std::sync::Arc<std::sync::Mutex<String>>,
    std::thread::JoinHandle<()>,
) {
    let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = text.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    (text, reader)
}

/// The host pid of the tfinit that `unshare` (pid `unshare`) started as its child, waiting for
/// it at most `within`.
pub fn tfinit_under(unshare: i32, within: Duration) -> i32 {
    let want = std::fs::canonicalize(tfinit()).unwrap();
    wait_for(within, "tfinit to start under unshare", || {
        children_of(unshare)
            .into_iter()
            .find(|p| std::fs::read_link(format!("/proc/{p}/exe")).ok().as_ref() == Some(&want))
    })
}

/// Raises this process's soft open-files limit to its hard limit (the init, started from here,
/// inherits it and raises its own the same way); false (a skip, or a failure under CI) when the
/// hard limit is below `need`: so many descriptors are open at once.
pub fn enough_descriptors(need: u64) -> bool {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid, writable rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return false;
        }
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
    require(
        lim.rlim_max >= need,
        &format!(
            "an open-files hard limit of at least {need} (ulimit -Hn is {})",
            lim.rlim_max
        ),
    )
}

/// Collects a child's stdout and stderr in threads and waits for it with a deadline.
pub fn wait_output(mut child: Child, timeout: Duration) -> Output {
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let status = wait_child(&mut child, timeout, "shim");
    Output {
        status,
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
    }
}
