//! The PID-1 core with real processes: tfinit runs as PID 1 of a new PID namespace (as in a
//! container) and as a plain child subreaper, with the test helper as its child checking from the
//! inside: zombie reaping, signal forwarding and rewriting, a clean signal state for the child,
//! exit-code relay, stragglers at exit, and the logs.

mod common;
use common::TFINIT_VARS;

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{helper, read, tfinit, wait_for, TempDir};

/// Generous bound for anything that should take well under a second.
const SOON: Duration = Duration::from_secs(20);

/// The 20,000-orphan bursts run one at a time: two at once would come close to the host's pid_max.
static BURST: Mutex<()> = Mutex::new(());

/// How tfinit runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum As {
    /// PID 1 of a new PID namespace with its own /proc (unshare), as in a container.
    Pid1,
    /// A plain process of the host: it must register as child subreaper to get orphans.
    Subreaper,
}

const BOTH: [As; 2] = [As::Pid1, As::Subreaper];

/// A running tfinit with its output collected in the background.
struct Init {
    how: As,
    child: Child,
    /// tfinit's pid as the host (this test) sees it, found when first needed (a short-lived
    /// tfinit may be gone before anyone looks).
    pid: std::cell::OnceCell<i32>,
    out: JoinHandle<String>,
    err: JoinHandle<String>,
}

/// What a finished tfinit left.
struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Finished {
    fn code(&self) -> Option<i32> {
        self.status.code()
    }
}

/// A command for `tfinit ARGS` run `how`, with a private run and state directory in `tmp`.
fn command(how: As, tmp: &TempDir) -> Command {
    let mut c = match how {
        As::Pid1 => common::pid1(None),
        As::Subreaper => Command::new(tfinit()),
    };
    isolate(&mut c, tmp);
    c
}

/// Clears every TFINIT_* variable and points the run and state directories into `tmp`.
fn isolate(c: &mut Command, tmp: &TempDir) {
    for v in TFINIT_VARS {
        c.env_remove(v);
    }
    let state = tmp.join("state");
    std::fs::create_dir_all(&state).unwrap();
    c.env("TFINIT_RUN_DIR", tmp.join("run"))
        .env("TFINIT_STATE_DIR", state)
        .env("TFINIT_OWNER", "pid1-test");
}

fn collect(mut r: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        String::from_utf8_lossy(&v).into_owned()
    })
}

/// Starts `cmd` (built by [`command`] or by hand for `how`) and finds tfinit's host pid.
fn start_cmd(how: As, mut cmd: Command) -> Init {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn tfinit");
    let out = collect(child.stdout.take().unwrap());
    let err = collect(child.stderr.take().unwrap());
    Init {
        how,
        child,
        pid: std::cell::OnceCell::new(),
        out,
        err,
    }
}

/// Starts `tfinit [env] -- ARGS` run `how`.
fn start(how: As, tmp: &TempDir, env: &[(&str, &str)], args: &[&OsStr]) -> Init {
    let mut cmd = command(how, tmp);
    cmd.envs(env.iter().copied()).args(args);
    start_cmd(how, cmd)
}

impl Init {
    /// tfinit's host pid: the child we started, or under unshare --fork, unshare's child once it
    /// has exec'd tfinit.
    fn pid(&self) -> i32 {
        *self.pid.get_or_init(|| match self.how {
            As::Subreaper => self.child.id() as i32,
            As::Pid1 => {
                let unshare = self.child.id() as i32;
                let want = std::fs::canonicalize(tfinit()).unwrap();
                wait_for(SOON, "tfinit to start under unshare", || {
                    children_of(unshare).into_iter().find(|p| {
                        std::fs::read_link(format!("/proc/{p}/exe")).ok().as_ref() == Some(&want)
                    })
                })
            }
        })
    }

    /// Sends `sig` to tfinit itself.
    fn signal(&self, sig: i32) {
        let pid = self.pid();
        // SAFETY: kill(2) with plain integers.
        let rc = unsafe { libc::kill(pid, sig) };
        assert_eq!(rc, 0, "kill({pid}, {sig}) failed");
    }

    /// The host pid of the process tfinit's namespace knows as `ns_pid`.
    fn host_pid(&self, ns_pid: i32) -> i32 {
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
    fn wait(mut self, timeout: Duration) -> Finished {
        let status = common::wait_child(&mut self.child, timeout, "tfinit");
        Finished {
            status,
            stdout: self.out.join().unwrap(),
            stderr: self.err.join().unwrap(),
        }
    }
}

fn all_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
                .collect()
        })
        .unwrap_or_default()
}

/// The field after `name:` in /proc/PID/status.
fn status_field(pid: i32, name: &str) -> Option<String> {
    read(Path::new(&format!("/proc/{pid}/status")))
        .lines()
        .find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(':')
                .map(|v| v.trim().to_string())
        })
}

/// The pid of `pid` in its innermost PID namespace.
fn nspid(pid: i32) -> Option<i32> {
    status_field(pid, "NSpid")?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

fn children_of(parent: i32) -> Vec<i32> {
    all_pids()
        .into_iter()
        .filter(|p| status_field(*p, "PPid").and_then(|v| v.parse().ok()) == Some(parent))
        .collect()
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// The lines of a signals report.
fn lines(p: &Path) -> Vec<String> {
    read(p).lines().map(str::to_string).collect()
}

/// Waits until the report holds `line`.
fn wait_line(p: &Path, line: &str) {
    wait_for(SOON, &format!("{line:?} in {}", p.display()), || {
        lines(p).iter().any(|l| l == line).then_some(())
    });
}

/// Waits for the `ready ROLE PID` line and returns PID (as tfinit's namespace sees it).
fn ready_pid(p: &Path, role: &str) -> i32 {
    let prefix = format!("ready {role} ");
    wait_for(SOON, &format!("{role} ready in {}", p.display()), || {
        lines(p)
            .iter()
            .find_map(|l| l.strip_prefix(&prefix).and_then(|v| v.parse().ok()))
    })
}

fn sig(name: &str) -> i32 {
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

/// The name the helper records for a signal.
fn recorded(name: &str) -> String {
    match name {
        "IO" => "SIGIO".into(),
        "RTMAX" => format!("SIGRTMIN+{}", libc::SIGRTMAX() - libc::SIGRTMIN()),
        n => format!("SIG{n}"),
    }
}

/// Starts `tfinit -- helper signals OUT --member [extra]` and waits until both processes are ready.
/// Returns the init, the report path, and the host pids of main and member.
fn start_signals(
    how: As,
    tmp: &TempDir,
    env: &[(&str, &str)],
    extra: &[&str],
) -> (Init, PathBuf, i32, i32) {
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
fn helper_arg() -> &'static OsStr {
    use std::sync::OnceLock;
    static H: OnceLock<PathBuf> = OnceLock::new();
    H.get_or_init(helper).as_os_str()
}

/// kill(2) from the test itself (bypassing the init).
fn kill(pid: i32, sig: i32) {
    // SAFETY: kill(2) with plain integers.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig}) failed");
}

fn alive(pid: i32) -> bool {
    // A zombie is dead for our purpose.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z')),
        Err(_) => false,
    }
}

// ----- reaping -----

fn burst_leaves_no_zombie(how: As) {
    let _one_at_a_time = BURST.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = TempDir::new("burst");
    let mut argv = vec![os("--"), helper_arg()];
    argv.extend(["orphans", "20000", "--check-adopter", "--deadline-s", "60"].map(os));
    if how == As::Subreaper {
        // On a shared host, count only the zombies tfinit would have to reap.
        argv.extend(["--scope", "parent"].map(os));
    }
    let done = start(how, &tmp, &[], &argv).wait(Duration::from_secs(120));
    assert_eq!(
        done.code(),
        Some(0),
        "the helper found zombies or orphans that escaped tfinit\nstdout: {}\nstderr: {}",
        done.stdout,
        done.stderr
    );
    assert!(
        done.stdout.contains("orphans=20000 forked=20000") && done.stdout.contains("zombies=0"),
        "{}",
        done.stdout
    );
}

#[test]
fn a_burst_of_20000_orphans_leaves_no_zombie_when_tfinit_is_pid_1() {
    burst_leaves_no_zombie(As::Pid1);
}

#[test]
fn a_burst_of_20000_orphans_comes_to_tfinit_as_subreaper_and_leaves_no_zombie() {
    burst_leaves_no_zombie(As::Subreaper);
}

#[test]
fn without_a_reaper_orphans_stay_zombies_and_the_helper_says_so() {
    // The helper's check can fail: under a PID 1 that never reaps, it must report zombies.
    let mut c = Command::new("unshare");
    c.args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .arg(helper())
        .args(["no-reap", "--"])
        .arg(helper())
        .args(["orphans", "200", "--deadline-s", "2"]);
    let out = common::run_output(&mut c, Duration::from_secs(30));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("zombies=") && !stdout.contains("zombies=0"),
        "{stdout}"
    );
}

#[test]
fn orphans_that_escape_to_another_process_fail_the_adopter_check() {
    // The helper as PID 1 itself has no parent in its namespace: its orphans go to itself, not
    // to its parent, and --check-adopter must notice.
    let mut c = Command::new("unshare");
    c.args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .arg(helper())
        .args(["orphans", "50", "--check-adopter", "--deadline-s", "2"]);
    let out = common::run_output(&mut c, Duration::from_secs(30));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(4), "{stdout}");
}

// ----- signals -----

/// What tfinit forwards as it is (README: every catchable signal but CHLD, PIPE, TTIN, TTOU).
const FORWARDED: [&str; 18] = [
    "HUP", "QUIT", "USR1", "USR2", "ALRM", "STKFLT", "CONT", "TSTP", "URG", "XCPU", "XFSZ",
    "VTALRM", "PROF", "WINCH", "IO", "PWR", "RTMIN+2", "RTMAX",
];

fn every_forwarded_signal_reaches_the_group(how: As) {
    let tmp = TempDir::new("fwd");
    let (init, out, _, _) = start_signals(how, &tmp, &[], &["--exit-on", "TERM"]);
    for name in FORWARDED {
        init.signal(sig(name));
        wait_line(&out, &format!("main {}", recorded(name)));
        wait_line(&out, &format!("member {}", recorded(name)));
    }
    // SIGINT is forwarded too, and starts the shutdown; SIGTERM then ends the helper.
    init.signal(libc::SIGINT);
    wait_line(&out, "main SIGINT");
    wait_line(&out, "member SIGINT");
    init.signal(libc::SIGTERM);
    let done = init.wait(SOON);
    assert_eq!(done.code(), Some(0), "{}", done.stderr);
    let l = lines(&out);
    for role in ["main", "member"] {
        assert!(l.contains(&format!("{role} SIGTERM")), "{l:?}");
        for name in FORWARDED {
            let n = l
                .iter()
                .filter(|x| **x == format!("{role} {}", recorded(name)))
                .count();
            assert_eq!(n, 1, "{role} got {name} {n} times: {l:?}");
        }
    }
    assert!(
        done.stderr.contains("stop signal received"),
        "{}",
        done.stderr
    );
}

#[test]
fn every_forwarded_signal_reaches_the_whole_process_group_when_tfinit_is_pid_1() {
    every_forwarded_signal_reaches_the_group(As::Pid1);
}

#[test]
fn every_forwarded_signal_reaches_the_whole_process_group_as_subreaper() {
    every_forwarded_signal_reaches_the_group(As::Subreaper);
}

fn stop_signal_reaches_the_group_and_starts_the_shutdown(how: As, name: &str) {
    let tmp = TempDir::new("stop");
    let (init, out, main, member) = start_signals(how, &tmp, &[], &["--exit-on", name]);
    let t0 = Instant::now();
    init.signal(sig(name));
    let done = init.wait(SOON);
    assert_eq!(done.code(), Some(0), "{}", done.stderr);
    let l = lines(&out);
    assert!(l.contains(&format!("main SIG{name}")), "{l:?}");
    assert!(l.contains(&format!("member SIG{name}")), "{l:?}");
    assert!(!alive(main) && !alive(member));
    assert!(
        done.stderr
            .contains(&format!("stop signal received signal=SIG{name}"))
            && done.stderr.contains("cause=\"stop signal\""),
        "{}",
        done.stderr
    );
    // Both exited at once: the init did not wait for any timer.
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
}

#[test]
fn sigterm_reaches_the_group_and_starts_the_shutdown_when_tfinit_is_pid_1() {
    stop_signal_reaches_the_group_and_starts_the_shutdown(As::Pid1, "TERM");
}

#[test]
fn sigint_reaches_the_group_and_starts_the_shutdown_when_tfinit_is_pid_1() {
    stop_signal_reaches_the_group_and_starts_the_shutdown(As::Pid1, "INT");
}

#[test]
fn sigterm_and_sigint_reach_the_group_and_start_the_shutdown_as_subreaper() {
    stop_signal_reaches_the_group_and_starts_the_shutdown(As::Subreaper, "TERM");
    stop_signal_reaches_the_group_and_starts_the_shutdown(As::Subreaper, "INT");
}

#[test]
fn with_forward_child_only_the_main_child_gets_signals() {
    for how in BOTH {
        let tmp = TempDir::new("fwd-child");
        let (init, out, _, member) = start_signals(
            how,
            &tmp,
            &[("TFINIT_FORWARD", "child")],
            &["--exit-on", "TERM"],
        );
        for name in ["HUP", "USR1", "QUIT"] {
            init.signal(sig(name));
            wait_line(&out, &format!("main SIG{name}"));
        }
        // A marker sent straight to the member, numbered above the others: the helper records
        // pending signals lowest first, so once the marker is in, a forwarded one would be too.
        kill(member, libc::SIGWINCH);
        wait_line(&out, "member SIGWINCH");
        let l = lines(&out);
        for name in ["HUP", "USR1", "QUIT"] {
            assert!(
                !l.contains(&format!("member SIG{name}")),
                "{how:?}: member got {name}: {l:?}"
            );
        }
        // SIGTERM goes to the main child only; once it has exited, the member left in its group
        // gets its SIGTERM as a leftover, at once (not at the kill step, 28 s later).
        init.signal(libc::SIGTERM);
        let done = init.wait(SOON);
        assert_eq!(done.code(), Some(0), "{}", done.stderr);
        let l = lines(&out);
        for role in ["main", "member"] {
            assert!(l.contains(&format!("{role} SIGTERM")), "{how:?}: {l:?}");
        }
        assert!(
            done.stderr.contains("controller's leftover processes"),
            "{}",
            done.stderr
        );
        assert!(
            !done.stderr.contains("SIGKILL to everything left"),
            "{}",
            done.stderr
        );
    }
}

#[test]
fn rewrites_turn_term_into_int_and_usr1_into_hup() {
    for how in BOTH {
        let tmp = TempDir::new("rewrite");
        let (init, out, main, _) =
            start_signals(how, &tmp, &[("TFINIT_REWRITE", "TERM:INT,USR1:HUP")], &[]);
        init.signal(libc::SIGUSR1);
        wait_line(&out, "main SIGHUP");
        wait_line(&out, "member SIGHUP");
        init.signal(libc::SIGTERM);
        wait_line(&out, "main SIGINT");
        wait_line(&out, "member SIGINT");
        // Marker (forwarded as it is, numbered above TERM and USR1; see the forward-child test).
        init.signal(libc::SIGWINCH);
        wait_line(&out, "main SIGWINCH");
        wait_line(&out, "member SIGWINCH");
        let l = lines(&out);
        assert!(
            !l.iter()
                .any(|x| x.ends_with(" SIGTERM") || x.ends_with(" SIGUSR1")),
            "{how:?}: an original signal got through: {l:?}"
        );
        // The rewritten SIGTERM still started the shutdown.
        kill(-main, libc::SIGKILL);
        let done = init.wait(SOON);
        assert_eq!(done.code(), Some(128 + libc::SIGKILL), "{}", done.stderr);
        assert!(
            done.stderr.contains("stop signal received signal=SIGTERM"),
            "{}",
            done.stderr
        );
    }
}

#[test]
fn signals_only_the_init_s_own_io_can_raise_are_not_forwarded() {
    for how in BOTH {
        let tmp = TempDir::new("self-inflicted");
        let (init, out, _, _) = start_signals(how, &tmp, &[], &["--exit-on", "TERM"]);
        for name in ["PIPE", "TTIN", "TTOU"] {
            init.signal(sig(name));
        }
        // tfinit handles pending signals lowest first, and WINCH is above all three.
        init.signal(libc::SIGWINCH);
        wait_line(&out, "main SIGWINCH");
        wait_line(&out, "member SIGWINCH");
        init.signal(libc::SIGTERM);
        let done = init.wait(SOON);
        assert_eq!(done.code(), Some(0), "{}", done.stderr);
        let l = lines(&out);
        for name in ["PIPE", "TTIN", "TTOU"] {
            assert!(
                !l.iter().any(|x| x.ends_with(&format!(" SIG{name}"))),
                "{how:?}: {name} forwarded: {l:?}"
            );
        }
    }
}

// ----- the child's signal state -----

fn mask_of(done: &Finished) -> (String, String) {
    let get = |k: &str| {
        done.stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("helper: {k}:")))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| panic!("no {k} in {:?}", done.stdout))
    };
    (get("SigBlk"), get("SigIgn"))
}

const NONE: &str = "0000000000000000";

#[test]
fn the_child_starts_with_no_blocked_and_no_ignored_signal() {
    for how in BOTH {
        let tmp = TempDir::new("mask");
        let done = start(how, &tmp, &[], &[os("--"), helper_arg(), os("mask")]).wait(SOON);
        assert_eq!(done.code(), Some(0), "{}", done.stderr);
        assert_eq!(mask_of(&done), (NONE.into(), NONE.into()), "{how:?}");
    }
}

#[test]
fn the_child_gets_no_ignored_signal_even_when_tfinit_was_started_with_some_ignored() {
    const TRAP: &str = "trap '' INT QUIT; exec \"$0\" \"$@\"";
    // Control: the same shell start gives a program SIGINT and SIGQUIT ignored (bits 2 and 3),
    // so the helper does see ignored signals when there are some.
    let mut direct = Command::new("sh");
    direct.args(["-c", TRAP]).arg(helper()).arg("mask");
    let out = common::run_output(&mut direct, SOON);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("SigIgn:\t0000000000000006"), "{stdout}");

    for how in BOTH {
        let tmp = TempDir::new("mask-trap");
        let mut cmd = match how {
            As::Pid1 => {
                let mut c = Command::new("unshare");
                c.args(["--pid", "--fork", "--mount-proc", "--kill-child"]);
                c
            }
            As::Subreaper => Command::new("env"),
        };
        cmd.args(["sh", "-c", TRAP])
            .arg(tfinit())
            .arg("--")
            .arg(helper())
            .arg("mask");
        isolate(&mut cmd, &tmp);
        let done = start_cmd(how, cmd).wait(SOON);
        assert_eq!(done.code(), Some(0), "{}", done.stderr);
        assert_eq!(mask_of(&done), (NONE.into(), NONE.into()), "{how:?}");
    }
}

#[test]
fn the_init_blocks_the_signals_it_reads_but_its_child_runs_with_none_blocked() {
    let tmp = TempDir::new("mask-live");
    let init = start(
        As::Subreaper,
        &tmp,
        &[],
        &[os("--"), os("sleep"), os("600")],
    );
    let child = wait_for(SOON, "sleep to start", || {
        children_of(init.pid()).into_iter().next()
    });
    wait_for(SOON, "sleep to exec", || {
        (std::fs::read_link(format!("/proc/{child}/exe"))
            .ok()?
            .file_name()?
            == "sleep")
            .then_some(())
    });
    let init_blk = status_field(init.pid(), "SigBlk").unwrap();
    let child_blk = status_field(child, "SigBlk").unwrap();
    assert_ne!(
        init_blk, NONE,
        "tfinit blocks what it reads through its signalfd"
    );
    assert_eq!(child_blk, NONE);
    init.signal(libc::SIGTERM);
    let done = init.wait(SOON);
    assert_eq!(done.code(), Some(128 + libc::SIGTERM), "{}", done.stderr);
}

// ----- exit codes -----

#[test]
fn the_exit_code_is_the_child_s_or_128_plus_the_signal_that_killed_it() {
    for how in BOTH {
        for (script, want) in [
            ("exit 0", 0),
            ("exit 3", 3),
            ("kill -KILL $$", 128 + libc::SIGKILL),
            ("kill -TERM $$", 128 + libc::SIGTERM),
            ("kill -USR1 $$", 128 + libc::SIGUSR1),
        ] {
            let tmp = TempDir::new("exit");
            let done =
                start(how, &tmp, &[], &[os("--"), os("sh"), os("-c"), os(script)]).wait(SOON);
            assert_eq!(done.code(), Some(want), "{how:?} {script}: {}", done.stderr);
        }
    }
}

#[test]
fn a_missing_command_exits_127_and_names_it() {
    for how in BOTH {
        for cmd in [
            "/nonexistent/tfinit-no-such-program",
            "tfinit-no-such-program-on-path",
        ] {
            let tmp = TempDir::new("missing");
            let done = start(how, &tmp, &[], &[os("--"), os(cmd)]).wait(SOON);
            assert_eq!(done.code(), Some(127), "{how:?}: {}", done.stderr);
            assert!(done.stderr.contains(cmd), "{}", done.stderr);
            assert!(done.stderr.contains("not found"), "{}", done.stderr);
        }
    }
}

#[test]
fn a_command_that_is_not_executable_exits_126_and_names_it() {
    for how in BOTH {
        let tmp = TempDir::new("noexec");
        let file = tmp.join("not-executable");
        std::fs::write(&file, "#!/bin/sh\nexit 0\n").unwrap();
        let done = start(how, &tmp, &[], &[os("--"), file.as_os_str()]).wait(SOON);
        assert_eq!(done.code(), Some(126), "{how:?}: {}", done.stderr);
        assert!(
            done.stderr.contains(&file.display().to_string()),
            "{}",
            done.stderr
        );
        assert!(done.stderr.contains("permission denied"), "{}", done.stderr);
    }
}

// ----- stragglers when the controller exits -----

/// `sh -c` that starts `helper signals OUT ARGS` in the background (same process group), waits
/// until it is ready, and exits 0: the helper is left behind in the controller's group.
fn leave_a_straggler(out: &Path, helper_args: &str) -> Vec<String> {
    let script = format!(
        "\"$0\" signals \"$1\" {helper_args} & i=0; until grep -q '^ready main' \"$1\" 2>/dev/null; do \
         i=$((i+1)); [ $i -gt 2000 ] && exit 9; sleep 0.01; done; exit 0"
    );
    vec![
        "--".into(),
        "sh".into(),
        "-c".into(),
        script,
        helper().display().to_string(),
        out.display().to_string(),
    ]
}

fn start_with_straggler(
    how: As,
    tmp: &TempDir,
    env: &[(&str, &str)],
    helper_args: &str,
) -> (Init, PathBuf) {
    let out = tmp.join("straggler.out");
    let args = leave_a_straggler(&out, helper_args);
    let argv: Vec<&OsStr> = args.iter().map(|a| os(a)).collect();
    (start(how, tmp, env, &argv), out)
}

#[test]
fn a_straggler_in_the_controller_s_group_gets_sigterm_when_the_controller_exits() {
    for how in BOTH {
        let tmp = TempDir::new("straggler");
        let (init, out) = start_with_straggler(
            how,
            &tmp,
            &[("TFINIT_GRACE_PERIOD", "60s")],
            "--exit-on TERM",
        );
        // As a subreaper its pid is the host's; as PID 1 the namespace dies with tfinit anyway
        // (and tfinit may be gone before a lookup), so only the log can tell there.
        let straggler = (how == As::Subreaper).then(|| ready_pid(&out, "main"));
        ready_pid(&out, "main");
        let t0 = Instant::now();
        let done = init.wait(SOON);
        let took = t0.elapsed();
        assert_eq!(done.code(), Some(0), "{how:?}: {}", done.stderr);
        assert_eq!(
            lines(&out).iter().filter(|l| *l == "main SIGTERM").count(),
            1,
            "{:?}",
            lines(&out)
        );
        assert!(!straggler.is_some_and(alive), "the straggler survived");
        assert!(
            done.stderr.contains("controller's leftover processes"),
            "{}",
            done.stderr
        );
        // It left on SIGTERM: nothing waited for the 60 s grace period or its kill step.
        assert!(took < Duration::from_secs(10), "{how:?}: took {took:?}");
        assert!(
            !done.stderr.contains("SIGKILL to everything left"),
            "{}",
            done.stderr
        );
    }
}

#[test]
fn a_straggler_that_ignores_sigterm_is_killed_at_the_kill_step_and_the_init_exits_then() {
    // Kill step at deadline - margin = controller exit + 3s - 1s.
    let env = [
        ("TFINIT_GRACE_PERIOD", "3s"),
        ("TFINIT_STOP_TIMEOUT", "1s"),
        ("TFINIT_KILL_MARGIN", "1s"),
    ];
    for how in BOTH {
        let tmp = TempDir::new("stubborn");
        let (init, out) = start_with_straggler(how, &tmp, &env, "");
        // As a subreaper its pid is the host's; as PID 1 the namespace dies with tfinit anyway
        // (and tfinit may be gone before a lookup), so only the log can tell there.
        let straggler = (how == As::Subreaper).then(|| ready_pid(&out, "main"));
        ready_pid(&out, "main");
        let t0 = Instant::now();
        let done = init.wait(SOON);
        let took = t0.elapsed();
        assert_eq!(
            done.code(),
            Some(0),
            "{how:?}: the controller's code: {}",
            done.stderr
        );
        let l = lines(&out);
        assert_eq!(
            l.iter().filter(|x| *x == "main SIGTERM").count(),
            1,
            "exactly one SIGTERM: {l:?}"
        );
        assert!(
            done.stderr.contains("SIGKILL to everything left"),
            "{}",
            done.stderr
        );
        assert!(!straggler.is_some_and(alive), "the straggler survived");
        // Not before the kill step (2 s after the controller exited), and promptly after it.
        assert!(
            took >= Duration::from_millis(1500),
            "{how:?}: killed too early: {took:?}"
        );
        assert!(
            took < Duration::from_secs(5),
            "{how:?}: exited late: {took:?}"
        );
    }
}

#[test]
fn with_nothing_left_the_init_exits_at_once() {
    for how in BOTH {
        let tmp = TempDir::new("prompt");
        let t0 = Instant::now();
        let done = start(
            how,
            &tmp,
            &[("TFINIT_GRACE_PERIOD", "60s")],
            &[os("--"), os("true")],
        )
        .wait(SOON);
        let took = t0.elapsed();
        assert_eq!(done.code(), Some(0), "{}", done.stderr);
        assert!(
            took < Duration::from_secs(5),
            "{how:?}: took {took:?} with a 60s grace period"
        );
        assert!(!done.stderr.contains("leftover"), "{}", done.stderr);
    }
}

// ----- logs -----

#[test]
fn json_logs_are_one_object_per_line_and_show_signals_and_exits_at_debug() {
    let tmp = TempDir::new("json");
    let env = [("TFINIT_LOG_FORMAT", "json"), ("TFINIT_LOG", "debug")];
    let (init, out, _, _) = start_signals(As::Pid1, &tmp, &env, &["--exit-on", "TERM"]);
    init.signal(libc::SIGHUP);
    wait_line(&out, "main SIGHUP");
    wait_line(&out, "member SIGHUP");
    init.signal(libc::SIGTERM);
    let done = init.wait(SOON);
    assert_eq!(done.code(), Some(0), "{}", done.stderr);
    let events: Vec<serde_json::Value> = done
        .stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let has = |level: &str, msg: &str, key: &str, val: &str| {
        events.iter().any(|e| {
            e["level"] == level && e["message"] == msg && (key.is_empty() || e[key] == val)
        })
    };
    assert!(
        has("DEBUG", "signal received", "signal", "SIGHUP"),
        "{}",
        done.stderr
    );
    assert!(
        has("DEBUG", "signal forwarded", "signal", "SIGHUP"),
        "{}",
        done.stderr
    );
    assert!(
        has("INFO", "stop signal received", "signal", "SIGTERM"),
        "{}",
        done.stderr
    );
    assert!(
        has("INFO", "controller exited", "exit", "exit code 0"),
        "{}",
        done.stderr
    );
    // The member is reaped by the init (its parent exited first or right after).
    assert!(has("DEBUG", "reaped", "", ""), "{}", done.stderr);
    assert!(has("INFO", "tfinit exiting", "", ""), "{}", done.stderr);
}

#[test]
fn at_the_default_level_text_logs_leave_out_signal_details() {
    let tmp = TempDir::new("text");
    let (init, out, _, _) = start_signals(As::Subreaper, &tmp, &[], &["--exit-on", "TERM"]);
    init.signal(libc::SIGHUP);
    wait_line(&out, "main SIGHUP");
    init.signal(libc::SIGTERM);
    let done = init.wait(SOON);
    assert_eq!(done.code(), Some(0), "{}", done.stderr);
    assert!(
        done.stderr.contains("INFO controller exited"),
        "{}",
        done.stderr
    );
    assert!(!done.stderr.contains("DEBUG"), "{}", done.stderr);
    // Nothing about SIGHUP: its receipt and forward are debug lines.
    assert!(!done.stderr.contains("SIGHUP"), "{}", done.stderr);
    assert!(done
        .stderr
        .lines()
        .all(|l| serde_json::from_str::<serde_json::Value>(l).is_err()));
}
