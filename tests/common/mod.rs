//! Shared helpers of the integration tests: the binaries, PID namespaces, temp dirs, polling.
//! The one way to start tfinit as an init is [`launch`]; pods (a hostname, a uid, a state dir)
//! are [`pods`]; moto is [`moto`]; a memory cgroup is [`cgroup`]; the Kubernetes API stand-in is
//! [`apiserver`] (its certificates [`pki`]); a working directory of a
//! fixture configuration is [`config_dir`]. The per-suite harnesses (`pid1_init`, `shim`, `helper_init`, `s3_pods`,
//! `docker`, `fuse`, tests/fixtures/slow) build on these.
#![allow(dead_code)]

/// Generates one test per terraform shape for a scenario `fn name(shape: Shape)` of the file that
/// declares `#[macro_use] mod common;` (with `Shape` in scope there): `name::panicwrap` and
/// `name::single_process_tf_fork_0`.
#[allow(unused_macros)]
macro_rules! both_shapes {
    ($name:ident) => {
        mod $name {
            #[test]
            fn panicwrap() {
                super::$name(super::Shape::Panicwrap)
            }
            #[test]
            fn single_process_tf_fork_0() {
                super::$name(super::Shape::SingleProcess)
            }
        }
    };
}

/// [`both_shapes!`] plus `name::modern_terraform`: the scenario on the modern terraform too
/// ([`Shape::Modern`]; one SKIP line per test binary without one). For the named subset that runs
/// on both versions within the suite's time.
#[allow(unused_macros)]
macro_rules! all_shapes {
    ($name:ident) => {
        mod $name {
            #[test]
            fn panicwrap() {
                super::$name(super::Shape::Panicwrap)
            }
            #[test]
            fn single_process_tf_fork_0() {
                super::$name(super::Shape::SingleProcess)
            }
            #[test]
            fn modern_terraform() {
                super::$name(super::Shape::Modern)
            }
        }
    };
}

pub mod apiserver;
pub mod cgroup;
pub mod dockerfile;
pub mod fuse;
pub mod kube_cluster;
pub mod launch;
pub mod moto;
pub mod pki;
pub mod pods;
pub mod shim;
#[macro_use]
pub mod terraform;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How terraform runs: terraform 1.0.3's default panicwrap pair (a parent that forwards SIGTERM
/// to the worker it started) or its single process (`TF_FORK=0`), or a modern terraform (1.1 or
/// later: one process, as users run it today).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Default 1.0.3: `terraform` starts a copy of itself and forwards SIGTERM to it.
    Panicwrap,
    /// 1.0.3 with `TF_FORK=0`: one terraform process.
    SingleProcess,
    /// The modern terraform ([`terraform::Terraform::modern`]): one process by construction
    /// (panicwrap is gone since 1.1; it ignores TF_FORK).
    Modern,
}

impl Shape {
    /// Sets this shape's variables on `cmd` (TF_FORK removed or 0).
    pub fn apply(self, cmd: &mut Command) {
        match self {
            Shape::Panicwrap | Shape::Modern => cmd.env_remove("TF_FORK"),
            Shape::SingleProcess => cmd.env("TF_FORK", "0"),
        };
    }

    /// This shape's variables, for an environment list.
    pub fn env(self) -> Vec<(&'static str, String)> {
        match self {
            Shape::Panicwrap | Shape::Modern => vec![],
            Shape::SingleProcess => vec![("TF_FORK", "0".into())],
        }
    }

    /// How many terraform processes one run has in this shape.
    pub fn terraform_processes(self) -> usize {
        match self {
            Shape::Panicwrap => 2,
            Shape::SingleProcess | Shape::Modern => 1,
        }
    }

    /// The terraform this shape runs: 1.0.3 of the test dependencies, or the modern one; None
    /// (with a SKIP line, see [`terraform`]) when it is missing.
    pub fn terraform(self) -> Option<terraform::Terraform> {
        match self {
            Shape::Panicwrap | Shape::SingleProcess => terraform::Terraform::legacy(),
            Shape::Modern => terraform::Terraform::modern(),
        }
    }
}

/// The tfinit binary under test.
pub fn tfinit() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tfinit"))
}

/// The test helper binary.
pub fn helper() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tfinit-test-helper"))
}

/// Whether we are root. Tests that truly need it (changing uid, chown) check this through
/// [`require_root`]; PID namespaces do not need it: see [`unshare`].
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// How this process gets a new PID namespace: as root, or as a normal user inside a new user
/// namespace that maps it to root (`unshare --user --map-root-user`), or not at all (the reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Namespaces {
    /// Root: plain `unshare --pid`.
    Root,
    /// A normal user where the kernel allows unprivileged user namespaces.
    UserNamespace,
    /// Neither: why, for the skip line.
    Unavailable(String),
}

/// The one decision on how the suite makes PID namespaces, probed once per test binary: as root
/// directly; otherwise by trying `unshare --user --map-root-user --pid --fork --mount-proc true`
/// (the kernel may forbid unprivileged user namespaces: kernel.unprivileged_userns_clone=0,
/// user.max_user_namespaces=0, or an AppArmor/SELinux policy).
pub fn namespaces() -> &'static Namespaces {
    static PROBED: std::sync::OnceLock<Namespaces> = std::sync::OnceLock::new();
    PROBED.get_or_init(|| {
        if is_root() {
            return Namespaces::Root;
        }
        let probe = Command::new("unshare")
            .args([
                "--user",
                "--map-root-user",
                "--pid",
                "--fork",
                "--mount-proc",
            ])
            .arg("true")
            .stdin(Stdio::null())
            .output();
        match probe {
            Ok(o) if o.status.success() => Namespaces::UserNamespace,
            Ok(o) => Namespaces::Unavailable(format!(
                "root, or unprivileged user namespaces (`unshare --user --map-root-user --pid \
                 --fork --mount-proc true` failed: {})",
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => Namespaces::Unavailable(format!("unshare (util-linux): {e}")),
        }
    })
}

/// `unshare`, with `--user --map-root-user` first when this process is not root (see
/// [`namespaces`]), and an environment without inherited terraform settings ([`scrub`]); the
/// caller adds `--pid --fork ...`. Check [`can_unshare`] before using it.
pub fn unshare() -> Command {
    let mut c = Command::new("unshare");
    scrub(&mut c);
    if *namespaces() == Namespaces::UserNamespace {
        c.args(["--user", "--map-root-user"]);
    }
    c
}

/// `nsenter` into the PID and mount namespaces of `pid` (a process [`unshare`] started), through
/// its user namespace first when this process is not root (keeping our ids, which map to root
/// there; setgroups is denied in it): only there may a normal user join.
pub fn nsenter(pid: i32) -> Command {
    let mut c = Command::new("nsenter");
    scrub(&mut c).args(["--target", &pid.to_string()]);
    if *namespaces() == Namespaces::UserNamespace {
        c.args(["--user", "--preserve-credentials"]);
    }
    c.args(["--pid", "--mount", "--"]);
    c
}

/// Whether this process can start PID namespaces ([`namespaces`]); false is a one-line skip (a
/// failure under CI or TFINIT_REQUIRE_DEPS).
pub fn can_unshare() -> bool {
    match namespaces() {
        Namespaces::Root | Namespaces::UserNamespace => true,
        Namespaces::Unavailable(why) => require(false, why),
    }
}

/// For the few tests that truly need root (a pod of another uid, chown, Docker): true as root;
/// otherwise one line saying why, and the test returns early. Never a failure: a normal user
/// runs `cargo test` without them, and scripts/test.sh (root) runs them.
pub fn require_root(why: &str) -> bool {
    if is_root() {
        return true;
    }
    eprintln!("SKIP (needs root: {why})");
    false
}

/// Removes from `cmd` every `TFINIT_*` and `TF_*` variable this test process inherited (a
/// contributor's TF_WORKSPACE, TF_DATA_DIR or TF_CLI_ARGS changes what terraform and the init
/// do), points terraform's CLI configuration at /dev/null (not the contributor's
/// ~/.terraformrc) and turns off its update check. Values the test sets afterwards win.
pub fn scrub(cmd: &mut Command) -> &mut Command {
    for (k, _) in std::env::vars_os() {
        let k_text = k.to_string_lossy();
        if k_text.starts_with("TFINIT_") || k_text.starts_with("TF_") {
            cmd.env_remove(&k);
        }
    }
    cmd.env("TF_CLI_CONFIG_FILE", "/dev/null")
        .env("CHECKPOINT_DISABLE", "1")
}

/// Makes `cmd` start with every signal at its default disposition and none blocked, whatever
/// this test process inherited: `nohup` ignores SIGHUP, a shell's `cmd &` SIGINT and SIGQUIT.
/// For the runs whose signal state a test asserts.
pub fn default_signals(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // Computed before fork: the child calls only async-signal-safe functions.
    let last = libc::SIGRTMAX();
    // SAFETY: between fork and exec, only sigaction (through signal) and sigprocmask, both
    // async-signal-safe, on the child's own signal state; failures (SIGKILL, SIGSTOP, the
    // signals glibc reserves) leave those signals as they are, which is what the kernel allows.
    unsafe {
        cmd.pre_exec(move || {
            for s in 1..=last {
                libc::signal(s, libc::SIG_DFL);
            }
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            Ok(())
        })
    };
    cmd
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
    /// Creates `/tmp/tfinit-test-<name>-<pid>-<n>`, mode 0755, and sets this test process's
    /// umask to 022. Neither comes from the environment: pods of another uid (setpriv) must reach
    /// their files through it, which a private TMPDIR (mktemp -d makes 0700) or a umask of 077
    /// would forbid, and a long TMPDIR would push socket paths past their 108-byte limit.
    pub fn new(name: &str) -> TempDir {
        use std::os::unix::fs::PermissionsExt;
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
        let p = Path::new("/tmp").join(format!(
            "tfinit-test-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))
            .expect("chmod 0755 the temp dir");
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

/// A port nobody listens on now (the kernel's pick, released at once).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Whether curl(1) is there (a test dependency: scripts/install-test-deps.sh).
pub fn have_curl() -> bool {
    Command::new("curl").arg("--version").output().is_ok()
}

/// `curl URL`: the response's head and body, or None when nothing answers (yet).
pub fn curl(url: &str) -> Option<(String, String)> {
    let o = Command::new("curl")
        .args(["-sS", "--max-time", "5", "-D", "-", url])
        .output()
        .expect("curl");
    if !o.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    Some((head.to_string(), body.to_string()))
}

/// The value of series `series` (`name{labels}`) in metrics text.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
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
    let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    wait_output_until(child, Instant::now() + timeout, &format!("{cmd:?}"))
}

/// The command line of process `pid` (empty when it is gone).
pub fn cmdline(pid: i32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// A field of /proc/PID/status in KiB (`VmHWM`, `VmRSS`).
pub fn status_kib(pid: i32, field: &str) -> u64 {
    read(Path::new(&format!("/proc/{pid}/status")))
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Reads a file, or empty when missing.
pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// The one way to make a terraform working directory with a given configuration: copies the
/// `.tf` files of tests/fixtures/CONFIG (`tf/basic`, `slow`, `s3`, `kube`, ...) into `dest`
/// (created); returns `dest`.
pub fn config_dir(config: &str, dest: &Path) -> PathBuf {
    let src = repo().join("tests/fixtures").join(config);
    std::fs::create_dir_all(dest)
        .unwrap_or_else(|e| panic!("create the working directory {}: {e}", dest.display()));
    let entries = std::fs::read_dir(&src)
        .unwrap_or_else(|e| panic!("read the configuration {}: {e}", src.display()));
    for e in entries.flatten() {
        if e.path().extension().is_some_and(|x| x == "tf") {
            std::fs::copy(e.path(), dest.join(e.file_name())).unwrap_or_else(|err| {
                panic!("copy {} into {}: {err}", e.path().display(), dest.display())
            });
        }
    }
    dest.to_path_buf()
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
pub const TFINIT_VARS: [&str; 16] = [
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
    "TFINIT_RECORD_TIMEOUT",
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

/// Bytes a reader thread collects from a pipe while the process runs.
#[derive(Clone, Default)]
pub struct Captured(pub std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Captured {
    /// Starts the reader thread on `from`; join the handle to have every byte.
    pub fn collect(
        mut from: impl std::io::Read + Send + 'static,
    ) -> (Captured, std::thread::JoinHandle<()>) {
        let c = Captured::default();
        let sink = c.clone();
        let h = std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 16];
            loop {
                match from.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => sink.0.lock().unwrap().extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                }
            }
        });
        (c, h)
    }

    pub fn bytes(&self) -> Vec<u8> {
        self.0.lock().unwrap().clone()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
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
pub fn wait_output(child: Child, timeout: Duration) -> Output {
    wait_output_until(child, Instant::now() + timeout, "shim")
}

/// [`wait_output`] with an absolute `deadline` shared by several children, and `what` (the
/// child the test waited for) in the failure message.
pub fn wait_output_until(mut child: Child, deadline: Instant, what: &str) -> Output {
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
    let status = wait_child(
        &mut child,
        deadline.saturating_duration_since(Instant::now()),
        what,
    );
    Output {
        status,
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
    }
}
