//! tfinit as PID 1 with the test helper's `signals` as its controller, for the bad-input and load
//! tests (tests/bad_input_*.rs, tests/load.rs): the fake terraform after the shim, a state dir
//! and a socket path a test can spoil ([`Setup`]), and readers of its memory and CPU time.
#![allow(dead_code)]

use crate::common;
use crate::common::launch::{self, As, Config, Launch, Out};
use crate::common::Captured;
use crate::common::{fake_terraform_dir, helper, read, shim_dir, wait_for, TempDir};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

/// Generous bound for anything that should take a second or two.
pub const SOON: Duration = Duration::from_secs(60);

/// The heavy tests (a thousand processes, gibibytes through pipes) run one at a time: the machine
/// has two cores and a pid space shared with everything else running.
pub static HEAVY: Mutex<()> = Mutex::new(());

pub fn heavy() -> std::sync::MutexGuard<'static, ()> {
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

/// A tfinit running as PID 1, its controller a `helper signals` that exits on SIGTERM.
pub struct HelperInit {
    pub child: Child,
    /// tfinit's pid as this test sees it.
    pub pid: i32,
    pub stderr: Captured,
    pub reader: Option<JoinHandle<()>>,
    pub run_dir: PathBuf,
    /// TFINIT_STATE_DIR.
    pub state_dir: PathBuf,
    /// What the controller recorded (`ready main PID`, `main SIGRTMIN+1`, ...).
    pub signals_log: PathBuf,
    pub shim: PathBuf,
    pub fake: PathBuf,
    pub work: PathBuf,
}

/// How to start it.
#[derive(Default)]
pub struct Setup<'a> {
    /// Shell commands run inside the namespace (as root, in its own mount namespace) before
    /// tfinit is exec'd: mounts.
    pub before: &'a str,
    /// Shell commands run by the controller before it becomes `helper signals`.
    pub controller_first: &'a str,
    /// TFINIT_STATE_DIR (default: an empty directory).
    pub state_dir: Option<&'a Path>,
    /// TFINIT_RUN_DIR (default: a fresh path).
    pub run_dir: Option<&'a Path>,
    /// TFINIT_OWNER (default: bad-input).
    pub owner: Option<&'a str>,
    /// More variables of the init.
    pub env: &'a [(&'a str, &'a str)],
}

/// The init's resources as /proc shows them.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    /// Peak resident set (VmHWM), KiB.
    pub peak_rss_kib: u64,
    /// Resident set now (VmRSS), KiB.
    pub rss_kib: u64,
    /// User + system CPU time, ms.
    pub cpu_ms: u64,
}

/// Children of `pid` named terraform.
pub fn terraform_children_of(pid: i32) -> usize {
    common::children_of(pid)
        .into_iter()
        .filter(|p| read(Path::new(&format!("/proc/{p}/comm"))).trim() == "terraform")
        .count()
}

pub use crate::common::status_kib;

impl HelperInit {
    pub fn start(tmp: &TempDir, setup: Setup<'_>) -> HelperInit {
        let run_dir = setup
            .run_dir
            .map(Path::to_path_buf)
            .unwrap_or_else(|| tmp.join("run"));
        let state_dir = match setup.state_dir {
            Some(d) => d.to_path_buf(),
            None => {
                let d = tmp.join("state");
                std::fs::create_dir_all(&d).unwrap();
                d
            }
        };
        let work = tmp.join("work");
        std::fs::create_dir_all(&work).unwrap();
        let signals_log = tmp.join("controller.log");
        let h = helper();
        let signals = format!(
            "{} signals {} --exit-on TERM",
            sh_quote(&h),
            sh_quote(&signals_log)
        );
        let controller: Vec<OsString> = if setup.controller_first.is_empty() {
            vec![
                h.into(),
                "signals".into(),
                signals_log.clone().into(),
                "--exit-on".into(),
                "TERM".into(),
            ]
        } else {
            vec![
                "sh".into(),
                "-c".into(),
                format!("{}\nexec {signals}", setup.controller_first).into(),
            ]
        };
        // The state dir may be a test's own (unusable on purpose): not created here.
        let config = Config::default()
            .set("TFINIT_RUN_DIR", &run_dir)
            .set("TFINIT_STATE_DIR", &state_dir)
            .set("TFINIT_OWNER", setup.owner.unwrap_or("bad-input"))
            .with(setup.env);
        let mut l = Launch::new(As::Pid1, config, &controller);
        if !setup.before.is_empty() {
            l.prelude = Some(setup.before.to_string());
        }
        l.stderr = Out::Piped;
        let mut child = l.spawn();
        let (stderr, reader) = Captured::collect(child.stderr.take().unwrap());
        let pid = launch::host_pid(As::Pid1, &child, Duration::from_secs(60));
        let init = HelperInit {
            child,
            pid,
            stderr,
            reader: Some(reader),
            run_dir,
            state_dir,
            signals_log: signals_log.clone(),
            shim: shim_dir(tmp),
            fake: fake_terraform_dir(tmp),
            work,
        };
        wait_for(SOON, "the controller to be ready", || {
            read(&signals_log).contains("ready main").then_some(())
        });
        init
    }

    /// The init's RSS and CPU time (/proc/PID/status and /proc/PID/stat: the same files the
    /// namespace sees as /proc/1/...).
    pub fn usage(&self) -> Usage {
        let stat = read(Path::new(&format!("/proc/{}/stat", self.pid)));
        // After the command's ")": state is field 3, utime field 14, stime field 15.
        let fields: Vec<&str> = stat
            .rsplit_once(") ")
            .map_or("", |(_, r)| r)
            .split(' ')
            .collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        // SAFETY: sysconf with a valid name.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
        Usage {
            peak_rss_kib: status_kib(self.pid, "VmHWM"),
            rss_kib: status_kib(self.pid, "VmRSS"),
            cpu_ms: ticks * 1000 / hz,
        }
    }

    /// terraform processes the init is the parent of now.
    pub fn terraform_children(&self) -> usize {
        terraform_children_of(self.pid)
    }

    pub fn stderr(&self) -> String {
        self.stderr.text()
    }

    /// Waits until the init's log has a line containing every one of `parts`; returns it.
    pub fn log_line(&self, parts: &[&str]) -> String {
        wait_for(SOON, &format!("a log line with {parts:?}"), || {
            self.stderr()
                .lines()
                .find(|l| parts.iter().all(|p| l.contains(p)))
                .map(str::to_string)
        })
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) with plain integers.
        let rc = unsafe { libc::kill(self.pid, sig) };
        assert_eq!(rc, 0, "kill({}, {sig})", self.pid);
    }

    /// The init's peak resident set so far, KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        status_kib(self.pid, "VmHWM")
    }

    pub fn socket(&self) -> PathBuf {
        tfinit::config::socket_path(&self.run_dir)
    }

    /// `terraform ARGS` through the shim (the fake terraform behind it), from outside the
    /// namespace: the shim only needs the socket.
    pub fn shim(&self, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut c = Command::new(self.shim.join("terraform"));
        common::scrub(&mut c)
            .args(args)
            .current_dir(&self.work)
            .env("PATH", common::path_with(&[&self.shim, &self.fake]))
            .env("TFINIT_RUN_DIR", &self.run_dir)
            .env_remove("TFINIT_TERRAFORM")
            .envs(env.iter().copied())
            .stdin(Stdio::null());
        c
    }

    /// A normal state-locking run through the shim works: terraform was started by the init (in
    /// a process group of its own), its output and exit code come back, no fallback warning.
    pub fn assert_runs_work(&self, tmp: &TempDir) {
        let log = tmp.join(&format!("fake-{}.log", unique()));
        let out = common::run_output(
            &mut self.shim(
                &["apply", "-auto-approve"],
                &[
                    ("FAKE_TF_ECHO", "1"),
                    ("FAKE_TF_EXIT", "3"),
                    ("FAKE_TF_LOG", log.to_str().unwrap()),
                ],
            ),
            SOON,
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(3),
            "stdout {stdout:?} stderr {stderr:?}"
        );
        assert_eq!(stdout, "args: apply -auto-approve\n");
        assert!(stderr.contains("cwd: "), "{stderr:?}");
        assert!(
            !stderr.contains("directly"),
            "the shim fell back: {stderr:?}"
        );
        let (pid, pgid) = fake_pid_pgid(&log);
        assert_eq!(pid, pgid, "terraform is not in a process group of its own");
    }

    /// SIGTERM: the controller exits 0 on it, so the init must exit 0 soon after.
    pub fn stop(mut self) -> (ExitStatus, String) {
        self.signal(libc::SIGTERM);
        let status = common::wait_child(&mut self.child, SOON, "tfinit after SIGTERM");
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        (status, self.stderr())
    }

    /// Stops the init and checks it ended cleanly (it kept working to the end).
    pub fn stop_cleanly(self) -> String {
        let (status, log) = self.stop();
        assert_eq!(status.code(), Some(0), "tfinit log:\n{log}");
        assert!(!log.contains("panicked"), "{log}");
        log
    }
}

impl Drop for HelperInit {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub fn unique() -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    N.fetch_add(1, Ordering::SeqCst)
}

pub fn sh_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}

/// The `pid P pgid G` the fake terraform logged first.
pub fn fake_pid_pgid(log: &Path) -> (i32, i32) {
    let text = read(log);
    let line = text
        .lines()
        .find(|l| l.starts_with("pid "))
        .unwrap_or_else(|| panic!("the fake terraform logged no pid: {text:?}"));
    let f: Vec<&str> = line.split(' ').collect();
    (f[1].parse().unwrap(), f[3].parse().unwrap())
}

pub fn root() -> bool {
    common::can_unshare()
}

/// Fills the filesystem under `dir` (a tiny tmpfs) until it reports ENOSPC.
pub fn fill(dir: &str) -> String {
    format!("dd if=/dev/zero of={dir}/fill bs=1024 2>/dev/null || true")
}
