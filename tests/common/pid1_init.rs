//! The PID-1 tests' harness (tests/pid1_*.rs): tfinit as PID 1 of a new PID namespace or as a
//! plain child subreaper ([`As`], [`start`]), with the test helper as its child reporting from
//! the inside, and readers of /proc.
#![allow(dead_code)]

use crate::common;
use crate::common::{helper, read, wait_for, Captured, TempDir};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::thread::JoinHandle;
use std::time::Duration;

/// Generous bound for anything that should take well under a second.
pub const SOON: Duration = Duration::from_secs(20);

pub use crate::common::launch::As;
use crate::common::launch::{self, Config, Launch, Out};

/// Both ways; only as subreaper (with a one-line skip) where PID namespaces cannot be made.
pub fn both() -> Vec<As> {
    if common::can_unshare() {
        vec![As::Pid1, As::Subreaper]
    } else {
        vec![As::Subreaper]
    }
}

/// A running tfinit with its output collected in the background.
pub struct Pid1Init {
    pub how: As,
    pub child: Child,
    /// tfinit's pid as the host (this test) sees it, found when first needed (a short-lived
    /// tfinit may be gone before anyone looks).
    pub pid: std::cell::OnceCell<i32>,
    pub out: Captured,
    pub err: Captured,
    /// The threads filling `out` and `err`, done at end of file.
    pub readers: Vec<JoinHandle<()>>,
}

/// What a finished tfinit left.
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
}

/// How to start `tfinit ARGS` run `how`, with a private run and state directory in `tmp` (the
/// caller may add to it before [`start_launch`]).
pub fn launch(how: As, tmp: &TempDir, args: &[&OsStr]) -> Launch {
    let config =
        Config::dirs(&tmp.join("run"), &tmp.join("state")).set("TFINIT_OWNER", "pid1-test");
    let mut l = Launch::new(how, config, &[] as &[&str]);
    l.args = args.iter().map(|a| a.to_os_string()).collect();
    l
}

/// Starts tfinit as `l` says, its output collected; its host pid is found when first needed.
pub fn start_launch(mut l: Launch) -> Pid1Init {
    l.stdout = Out::Piped;
    l.stderr = Out::Piped;
    let mut child = l.spawn();
    let (out, h1) = Captured::collect(child.stdout.take().unwrap());
    let (err, h2) = Captured::collect(child.stderr.take().unwrap());
    Pid1Init {
        how: l.how,
        child,
        pid: std::cell::OnceCell::new(),
        out,
        err,
        readers: vec![h1, h2],
    }
}

/// Starts `tfinit [env] -- ARGS` run `how`.
pub fn start(how: As, tmp: &TempDir, env: &[(&str, &str)], args: &[&OsStr]) -> Pid1Init {
    let mut l = launch(how, tmp, args);
    l.config = l.config.with(env);
    start_launch(l)
}

impl Pid1Init {
    /// tfinit's host pid: the child we started, or under unshare --fork, unshare's child once it
    /// has exec'd tfinit.
    pub fn pid(&self) -> i32 {
        *self
            .pid
            .get_or_init(|| launch::host_pid(self.how, &self.child, SOON))
    }

    /// Sends `sig` to tfinit itself.
    pub fn signal(&self, sig: i32) {
        let pid = self.pid();
        // SAFETY: kill(2) with plain integers.
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(rc, 0, "kill({pid}, {sig}) failed");
    }

    /// The host pid of the process tfinit's namespace knows as `ns_pid`.
    pub fn host_pid(&self, ns_pid: i32) -> i32 {
        match self.how {
            As::Subreaper => ns_pid,
            As::Pid1 => {
                let ns = std::fs::read_link(format!("/proc/{}/ns/pid", self.pid())).unwrap();
                wait_for(
                    SOON,
                    "the host pid of a process in tfinit's namespace",
                    || {
                        all_pids().into_iter().find(|p| {
                            std::fs::read_link(format!("/proc/{p}/ns/pid"))
                                .ok()
                                .as_ref()
                                == Some(&ns)
                                && nspid(*p) == Some(ns_pid)
                        })
                    },
                )
            }
        }
    }

    /// Waits (with a deadline) until tfinit has exited.
    pub fn wait(mut self, timeout: Duration) -> Finished {
        let status = common::wait_child(&mut self.child, timeout, "tfinit");
        for r in self.readers {
            r.join().expect("an output reader thread");
        }
        Finished {
            status,
            stdout: self.out.text(),
            stderr: self.err.text(),
        }
    }
}

pub fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
                .collect()
        })
        .unwrap_or_default()
}

/// The field after `name:` in /proc/PID/status.
pub fn status_field(pid: i32, name: &str) -> Option<String> {
    read(Path::new(&format!("/proc/{pid}/status")))
        .lines()
        .find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(':')
                .map(|v| v.trim().to_string())
        })
}

/// The pid of `pid` in its innermost PID namespace.
pub fn nspid(pid: i32) -> Option<i32> {
    status_field(pid, "NSpid")?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

pub fn children_of(parent: i32) -> Vec<i32> {
    all_pids()
        .into_iter()
        .filter(|p| status_field(*p, "PPid").and_then(|v| v.parse().ok()) == Some(parent))
        .collect()
}

pub fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// The lines of a signals report.
pub fn lines(p: &Path) -> Vec<String> {
    read(p).lines().map(str::to_string).collect()
}

/// Waits until the report holds `line`.
pub fn wait_line(p: &Path, line: &str) {
    wait_for(SOON, &format!("{line:?} in {}", p.display()), || {
        lines(p).iter().any(|l| l == line).then_some(())
    });
}

/// Waits for the `ready ROLE PID` line and returns PID (as tfinit's namespace sees it).
pub fn ready_pid(p: &Path, role: &str) -> i32 {
    let prefix = format!("ready {role} ");
    wait_for(SOON, &format!("{role} ready in {}", p.display()), || {
        lines(p)
            .iter()
            .find_map(|l| l.strip_prefix(&prefix).and_then(|v| v.parse().ok()))
    })
}

pub fn sig(name: &str) -> i32 {
    match name {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "ALRM" => libc::SIGALRM,
        "TERM" => libc::SIGTERM,
        "STKFLT" => libc::SIGSTKFLT,
        "CONT" => libc::SIGCONT,
        "TSTP" => libc::SIGTSTP,
        "URG" => libc::SIGURG,
        "XCPU" => libc::SIGXCPU,
        "XFSZ" => libc::SIGXFSZ,
        "VTALRM" => libc::SIGVTALRM,
        "PROF" => libc::SIGPROF,
        "WINCH" => libc::SIGWINCH,
        "IO" => libc::SIGIO,
        "PWR" => libc::SIGPWR,
        "PIPE" => libc::SIGPIPE,
        "TTIN" => libc::SIGTTIN,
        "TTOU" => libc::SIGTTOU,
        "RTMIN+2" => libc::SIGRTMIN() + 2,
        "RTMAX" => libc::SIGRTMAX(),
        other => panic!("unknown signal {other}"),
    }
}

/// Starts `tfinit -- helper signals OUT --member [extra]` and waits until both processes are ready.
/// Returns the init, the report path, and the host pids of main and member.
pub fn start_signals(
    how: As,
    tmp: &TempDir,
    env: &[(&str, &str)],
    extra: &[&str],
) -> (Pid1Init, PathBuf, i32, i32) {
    let out = tmp.join("signals.out");
    let mut args: Vec<&OsStr> = vec![
        os("--"),
        helper_arg(),
        os("signals"),
        out.as_os_str(),
        os("--member"),
    ];
    args.extend(extra.iter().map(|s| os(s)));
    let init = start(how, tmp, env, &args);
    let main = ready_pid(&out, "main");
    let member = ready_pid(&out, "member");
    let (main, member) = (init.host_pid(main), init.host_pid(member));
    (init, out, main, member)
}

/// The helper binary's path, as an argument.
pub fn helper_arg() -> &'static OsStr {
    use std::sync::OnceLock;
    static H: OnceLock<PathBuf> = OnceLock::new();
    H.get_or_init(helper).as_os_str()
}

/// kill(2) from the test itself (bypassing the init).
pub fn kill(pid: i32, sig: i32) {
    // SAFETY: kill(2) with plain integers.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig}) failed");
}

pub fn alive(pid: i32) -> bool {
    // A zombie is dead for our purpose.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z')),
        Err(_) => false,
    }
}
