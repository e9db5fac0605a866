//! The terraform shim end to end. tfinit runs as PID 1 of a PID namespace (`common::pid1`); a
//! `terraform` symlink to tfinit comes first on PATH, and the real terraform 1.0.3 (.test-deps/bin)
//! or the helper's fake terraform comes after it. Shim runs are compared with direct runs of the
//! same terraform in the same environment: same stdout bytes, stderr bytes and exit code.
//!
//! The shims run in this test process, outside the PID namespace, and reach the init through its
//! socket (TFINIT_RUN_DIR): the test can then signal or SIGKILL a shim by its pid. The one test
//! about a controller killing its shim during shutdown runs the helper's `controller` (the
//! provider-terraform stand-in) as the init's child instead.
//!
//! Real-terraform tests run in both process shapes of terraform 1.0.3: module `panicwrap` (the
//! default: a wrapper process and a wrapped child) and module `single_process` (TF_FORK=0).

mod common;

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use common::{wait_for, TempDir};

/// Deadline for anything that runs real terraform (2 cores, other builds running).
const LONG: Duration = Duration::from_secs(180);
/// Deadline for the init's own reactions.
const SHORT: Duration = Duration::from_secs(20);

// ----- harness -----

/// Bytes a reader thread collects from a pipe while the process runs.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn collect(mut from: impl Read + Send + 'static) -> (Captured, JoinHandle<()>) {
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

    fn bytes(&self) -> Vec<u8> {
        self.0.lock().unwrap().clone()
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// A process started with its stdout and stderr collected as they come.
struct Running {
    child: Child,
    stdin: Option<ChildStdin>,
    out: Captured,
    err: Captured,
    readers: Vec<JoinHandle<()>>,
}

impl Running {
    /// Starts `cmd`; its stdin is a pipe when `piped_stdin`, else /dev/null.
    fn start(mut cmd: Command, piped_stdin: bool) -> Running {
        cmd.stdin(if piped_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
        let (out, h1) = Captured::collect(child.stdout.take().unwrap());
        let (err, h2) = Captured::collect(child.stderr.take().unwrap());
        Running {
            stdin: child.stdin.take(),
            child,
            out,
            err,
            readers: vec![h1, h2],
        }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    fn signal(&self, s: Signal) {
        kill(self.pid(), s).unwrap_or_else(|e| panic!("kill {s} the shim: {e}"));
    }

    /// Waits for the exit and the end of both streams.
    fn wait(mut self, timeout: Duration) -> Output {
        drop(self.stdin.take());
        let status = common::wait_child(&mut self.child, timeout, "shim or terraform run");
        for h in self.readers.drain(..) {
            h.join().unwrap();
        }
        Output {
            status,
            stdout: self.out.bytes(),
            stderr: self.err.bytes(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs `cmd` to completion with `stdin` as its input (None: /dev/null).
fn run(cmd: Command, stdin: Option<&[u8]>, timeout: Duration) -> Output {
    let mut r = Running::start(cmd, stdin.is_some());
    if let (Some(bytes), Some(mut w)) = (stdin, r.stdin.take()) {
        w.write_all(bytes).expect("write the run's stdin");
    }
    r.wait(timeout)
}

/// tfinit as PID 1 of a new PID namespace, its stdout and stderr (the log, at debug) collected.
struct Init {
    unshare: Child,
    /// tfinit's pid as seen from the test (1 inside its namespace).
    pid: i32,
    run_dir: PathBuf,
    out: Captured,
    log: Captured,
    readers: Vec<JoinHandle<()>>,
    status: Option<ExitStatus>,
}

impl Init {
    /// Starts `tfinit -- CONTROLLER` in `cwd` with `env` added; the default controller waits for
    /// SIGTERM and exits 0. Returns once the control socket answers `tfinit status`.
    fn start(
        tmp: &TempDir,
        cwd: &Path,
        env: &[(&str, String)],
        controller: Option<Vec<String>>,
    ) -> Init {
        let run_dir = tmp.join("run");
        let state_dir = tmp.join("state");
        std::fs::create_dir_all(&state_dir).unwrap();
        let controller = controller.unwrap_or_else(|| {
            vec![
                common::helper().display().to_string(),
                "signals".into(),
                tmp.join("controller-signals.log").display().to_string(),
                "--exit-on".into(),
                "TERM".into(),
            ]
        });
        let mut cmd = common::pid1(None);
        cmd.arg("--")
            .args(&controller)
            .current_dir(cwd)
            .env("TFINIT_RUN_DIR", &run_dir)
            .env("TFINIT_STATE_DIR", &state_dir)
            .env("TFINIT_LOG", "debug")
            .env("CHECKPOINT_DISABLE", "1")
            .env_remove("TF_FORK")
            .env_remove("TF_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut unshare = cmd.spawn().expect("start unshare");
        let (out, h1) = Captured::collect(unshare.stdout.take().unwrap());
        let (log, h2) = Captured::collect(unshare.stderr.take().unwrap());
        let upid = unshare.id();
        let pid = common::tfinit_under(upid as i32, SHORT);
        let init = Init {
            unshare,
            pid,
            run_dir,
            out,
            log,
            readers: vec![h1, h2],
            status: None,
        };
        wait_for(SHORT, "the init's control socket to answer", || {
            init.try_status()
        });
        let ns_pid = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("NSpid:"))
            .map(|l| l.split_whitespace().last().unwrap_or("").to_string());
        assert_eq!(
            ns_pid.as_deref(),
            Some("1"),
            "tfinit is PID 1 of its namespace"
        );
        init
    }

    fn log(&self) -> String {
        self.log.text()
    }

    fn count(&self, needle: &str) -> usize {
        self.log().matches(needle).count()
    }

    fn wait_log(&self, needle: &str, timeout: Duration) {
        wait_for(timeout, &format!("the init to log {needle:?}"), || {
            self.log().contains(needle).then_some(())
        });
    }

    /// `tfinit status` against this init, parsed; None when it fails.
    fn try_status(&self) -> Option<Value> {
        let mut cmd = Command::new(common::tfinit());
        cmd.arg("status").env("TFINIT_RUN_DIR", &self.run_dir);
        let out = run(cmd, None, SHORT);
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    fn run_count(&self) -> usize {
        self.try_status()
            .and_then(|s| s["runs"].as_array().map(Vec::len))
            .unwrap_or(usize::MAX)
    }

    /// The pid, as seen from the test, of the process with pid `ns_pid` in the init's namespace.
    fn host_pid(&self, ns_pid: i32) -> Option<i32> {
        let ns = std::fs::read_link(format!("/proc/{}/ns/pid", self.pid)).ok()?;
        for e in std::fs::read_dir("/proc").ok()?.flatten() {
            let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(st) = std::fs::read_to_string(format!("/proc/{p}/status")) else {
                continue;
            };
            let inner = st
                .lines()
                .find(|l| l.starts_with("NSpid:"))
                .and_then(|l| l.split_whitespace().last())
                .and_then(|s| s.parse::<i32>().ok());
            if inner == Some(ns_pid)
                && std::fs::read_link(format!("/proc/{p}/ns/pid"))
                    .ok()
                    .as_ref()
                    == Some(&ns)
            {
                return Some(p);
            }
        }
        None
    }

    /// Command lines of the processes in the init's namespace, by their pid as seen from here.
    fn processes(&self) -> Vec<(i32, String)> {
        let Ok(ns) = std::fs::read_link(format!("/proc/{}/ns/pid", self.pid)) else {
            return Vec::new();
        };
        let mut found = Vec::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(p) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            if std::fs::read_link(format!("/proc/{p}/ns/pid"))
                .ok()
                .as_ref()
                != Some(&ns)
                || gone(p)
            {
                continue;
            }
            let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            let args: Vec<String> = cmdline
                .split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(text)
                .collect();
            found.push((p, args.join(" ")));
        }
        found
    }

    /// The init's peak resident memory (VmHWM), in KiB.
    fn peak_rss_kib(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM of the init")
    }

    /// Sends the init a signal.
    fn signal(&self, s: Signal) {
        kill(Pid::from_raw(self.pid), s).expect("signal the init");
    }

    /// Waits for the init to exit by itself; returns its exit code.
    fn wait_exit(&mut self, timeout: Duration) -> i32 {
        let st = common::wait_child(&mut self.unshare, timeout, "tfinit (PID 1)");
        self.status = Some(st);
        for h in self.readers.drain(..) {
            h.join().unwrap();
        }
        assert!(
            !self.log().contains("panicked"),
            "the init panicked:\n{}",
            self.log()
        );
        st.code().unwrap_or(-1)
    }

    /// SIGTERM to the init (no run in flight): it must exit 0 promptly.
    fn stop(mut self) {
        self.signal(Signal::SIGTERM);
        let code = self.wait_exit(SHORT);
        assert_eq!(code, 0, "the init's exit code; log:\n{}", self.log());
    }
}

impl Drop for Init {
    fn drop(&mut self) {
        if self.status.is_none() {
            // SIGKILL of unshare; --kill-child takes the whole namespace with it.
            let _ = self.unshare.kill();
            let _ = self.unshare.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "----- init log (end) -----\n{}\n----- init stdout (end) -----\n{}",
                tail(&self.log(), 20_000),
                tail(&self.out.text(), 5_000)
            );
        }
    }
}

/// terraform's process shape.
#[derive(Debug, Clone, Copy)]
enum Shape {
    /// 1.0.3's default: a panicwrap parent re-executes itself as the wrapped child.
    Panicwrap,
    /// TF_FORK=0: one process.
    SingleProcess,
}

impl Shape {
    fn env(self) -> Vec<(&'static str, String)> {
        match self {
            Shape::Panicwrap => vec![],
            Shape::SingleProcess => vec![("TF_FORK", "0".into())],
        }
    }
}

/// Runs terraform through the shim or directly, with the identical environment: PATH = the shim
/// directory, then the directory of the terraform to run, then the test's PATH.
struct Tf {
    shim: PathBuf,
    real: PathBuf,
    env: Vec<(String, String)>,
}

impl Tf {
    fn new(tmp: &TempDir, run_dir: &Path, tf_dir: &Path, env: &[(&str, String)]) -> Tf {
        let shim_dir = common::shim_dir(tmp);
        let mut all = vec![
            ("PATH".to_string(), common::path_with(&[&shim_dir, tf_dir])),
            ("TFINIT_RUN_DIR".to_string(), run_dir.display().to_string()),
            ("CHECKPOINT_DISABLE".to_string(), "1".to_string()),
        ];
        all.extend(env.iter().map(|(k, v)| (k.to_string(), v.clone())));
        Tf {
            shim: shim_dir.join("terraform"),
            real: tf_dir.join("terraform"),
            env: all,
        }
    }

    fn command(&self, program: &Path, cwd: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(program);
        c.arg0("terraform")
            .args(args)
            .current_dir(cwd)
            .env_remove("TF_FORK")
            .env_remove("TF_LOG");
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }

    /// `terraform ARGS` through the shim (argv[0] "terraform", as Go's exec.Command gives it).
    fn shim(&self, cwd: &Path, args: &[&str]) -> Command {
        self.command(&self.shim, cwd, args)
    }

    /// The same terraform, run directly.
    fn direct(&self, cwd: &Path, args: &[&str]) -> Command {
        self.command(&self.real, cwd, args)
    }
}

/// terraform 1.0.3 and the null provider from .test-deps, or None (skip) when missing.
fn real_terraform() -> Option<(PathBuf, String)> {
    let bin = common::deps().join("bin");
    let plugins = common::deps().join("plugins");
    let ok = bin.join("terraform").is_file()
        && plugins
            .join("registry.terraform.io/hashicorp/null/2.1.2")
            .is_dir();
    common::require(
        ok && common::is_root(),
        "root, and terraform 1.0.3 + the null provider in .test-deps (scripts/install-test-deps.sh)",
    )
    .then(|| (bin, format!("-plugin-dir={}", plugins.display())))
}

fn fake_available() -> bool {
    common::require(common::is_root(), "root (PID namespaces)")
}

/// Copies tests/fixtures/tf/NAME into `dest`.
fn fixture(name: &str, dest: &Path) -> PathBuf {
    std::fs::create_dir_all(dest).unwrap();
    let src = common::repo().join("tests/fixtures/tf").join(name);
    for e in std::fs::read_dir(&src).unwrap().flatten() {
        std::fs::copy(e.path(), dest.join(e.file_name())).unwrap();
    }
    dest.to_path_buf()
}

/// The last `n` bytes of `s` (or so: cut at a character boundary).
/// `terraform init` of `work`, run directly (not through the shim), with the null provider.
fn init_workspace(tf: &Tf, work: &Path, plugin_dir: &str) {
    let o = run(
        tf.direct(work, &["init", "-no-color", "-input=false", plugin_dir]),
        None,
        LONG,
    );
    assert!(o.status.success(), "init: {}", text(&o.stderr));
}

/// A real apply of the `slow` fixture running through the shim, its provisioner started.
struct SlowApply {
    tmp: TempDir,
    init: Init,
    tf: Tf,
    work: PathBuf,
    apply: Running,
}

/// Starts an init, initialises the `slow` fixture and runs its apply through the shim until the
/// provisioner runs; `None` without a real terraform.
fn slow_apply_through_the_shim(shape: Shape, name: &str) -> Option<SlowApply> {
    let (bin, plugin_dir) = real_terraform()?;
    let tmp = TempDir::new(name);
    let init = Init::start(&tmp, &tmp.0, &[], None);
    let tf = Tf::new(&tmp, &init.run_dir, &bin, &shape.env());
    let work = fixture("slow", &tmp.join("work"));
    init_workspace(&tf, &work, &plugin_dir);
    let apply = Running::start(
        tf.shim(
            &work,
            &["apply", "-auto-approve", "-no-color", "-input=false"],
        ),
        false,
    );
    wait_for(LONG, "the apply's provisioner to start", || {
        apply.out.text().contains("Executing:").then_some(())
    });
    Some(SlowApply {
        tmp,
        init,
        tf,
        work,
        apply,
    })
}

fn tail(s: &str, n: usize) -> &str {
    let mut i = s.len().saturating_sub(n);
    while !s.is_char_boundary(i) {
        i += 1;
    }
    &s[i..]
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Asserts that two runs printed the same bytes on each stream and exited the same way.
fn assert_same_run(what: &str, direct: &Output, shim: &Output) {
    assert_eq!(
        shim.status.code(),
        direct.status.code(),
        "{what}: exit code through the shim vs direct\nshim stderr:\n{}\ndirect stderr:\n{}",
        text(&shim.stderr),
        text(&direct.stderr)
    );
    assert!(
        shim.stdout == direct.stdout,
        "{what}: stdout differs ({} bytes through the shim, {} direct)\n--- shim:\n{}\n--- direct:\n{}",
        shim.stdout.len(),
        direct.stdout.len(),
        text(&shim.stdout),
        text(&direct.stdout)
    );
    assert!(
        shim.stderr == direct.stderr,
        "{what}: stderr differs\n--- shim:\n{}\n--- direct:\n{}",
        text(&shim.stderr),
        text(&direct.stderr)
    );
}

/// Replaces the digits of every "after Ns" (terraform rounds both ends of an operation to whole
/// seconds, so a 10 ms creation prints "after 1s" when it straddles a half second).
fn mask_durations(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("after ") {
        let (head, tail) = rest.split_at(i + "after ".len());
        out.push_str(head);
        let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 && tail[digits..].starts_with('s') {
            out.push('N');
            rest = &tail[digits..];
        } else {
            rest = tail;
        }
    }
    out.push_str(rest);
    out
}

/// The state file of `dir`, parsed.
fn state(dir: &Path) -> Value {
    let raw = std::fs::read_to_string(dir.join("terraform.tfstate"))
        .unwrap_or_else(|e| panic!("read {}/terraform.tfstate: {e}", dir.display()));
    serde_json::from_str(&raw).unwrap_or_else(|e| {
        panic!(
            "{}/terraform.tfstate is not valid JSON ({e}):\n{raw}",
            dir.display()
        )
    })
}

/// The first instance of `null_resource.NAME` in a state document.
fn instance<'a>(state: &'a Value, name: &str) -> Option<&'a Value> {
    state["resources"]
        .as_array()?
        .iter()
        .find(|r| r["type"] == "null_resource" && r["name"] == name)?["instances"]
        .get(0)
}

fn lock_info(dir: &Path) -> PathBuf {
    dir.join(".terraform.tfstate.lock.info")
}

/// The first line of `log` that contains `needle` (empty when none).
fn log_line(log: &str, needle: &str) -> String {
    log.lines()
        .find(|l| l.contains(needle))
        .unwrap_or_default()
        .to_string()
}

/// Lines `signal ...` a fake terraform wrote to its FAKE_TF_LOG.
fn fake_signals(log: &Path) -> Vec<String> {
    common::read(log)
        .lines()
        .filter(|l| l.starts_with("signal "))
        .map(str::to_string)
        .collect()
}

/// Waits for a fake terraform's first log line and returns its pid and pgid (namespace pids).
fn fake_started(log: &Path) -> (i32, i32) {
    wait_for(SHORT, "the fake terraform to start", || {
        let l = common::read(log);
        let first = l.lines().next()?.to_string();
        let f: Vec<&str> = first.split_whitespace().collect();
        (f.len() >= 4 && f[0] == "pid" && f[2] == "pgid")
            .then(|| (f[1].parse().ok(), f[3].parse().ok()))
            .and_then(|(a, b)| Some((a?, b?)))
    })
}

/// Whether a pid (as seen from the test) is gone or a zombie.
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(") ")
            .is_some_and(|(_, r)| r.starts_with('Z') || r.starts_with('X')),
    }
}

// ----- real terraform: parametrised over both process shapes -----

macro_rules! both_shapes {
    ($($name:ident),* $(,)?) => {
        mod panicwrap {
            $(#[test] fn $name() { super::$name(super::Shape::Panicwrap) })*
        }
        mod single_process {
            $(#[test] fn $name() { super::$name(super::Shape::SingleProcess) })*
        }
    };
}

both_shapes!(
    init_apply_output_plan_and_console_match_a_direct_run_byte_for_byte,
    a_plan_and_a_show_json_of_several_megabytes_arrive_complete_and_identical,
    sigkill_of_the_shim_during_shutdown_leaves_the_apply_running_to_completion,
    an_abandoned_apply_stops_gracefully_with_consistent_state_and_no_lock,
    sigterm_and_sigint_to_the_shim_interrupt_the_apply_once_never_twice,
    sixteen_concurrent_applies_in_separate_dirs_all_complete,
);

fn init_apply_output_plan_and_console_match_a_direct_run_byte_for_byte(shape: Shape) {
    let Some((bin, plugin_dir)) = real_terraform() else {
        return;
    };
    let tmp = TempDir::new("shim-bytes");
    let init = Init::start(&tmp, &tmp.0, &[], None);
    let tf = Tf::new(&tmp, &init.run_dir, &bin, &shape.env());
    let direct = fixture("basic", &tmp.join("direct"));
    let shimmed = fixture("basic", &tmp.join("shim"));
    let both = |args: &[&str]| {
        let d = run(tf.direct(&direct, args), None, LONG);
        let s = run(tf.shim(&shimmed, args), None, LONG);
        (d, s)
    };

    let (d, s) = both(&["init", "-no-color", "-input=false", &plugin_dir]);
    assert_same_run("init", &d, &s);
    assert!(text(&s.stdout).contains("Terraform has been successfully initialized!"));

    // The null provider gives each resource a random id: mask each directory's own id (read from
    // its state) and the rounded durations, nothing else.
    let (d, s) = both(&["apply", "-auto-approve", "-no-color", "-input=false"]);
    assert_eq!(
        d.status.code(),
        Some(0),
        "direct apply: {}",
        text(&d.stderr)
    );
    let id_of = |dir: &Path| {
        instance(&state(dir), "a").expect("null_resource.a in the state")["attributes"]["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (id_d, id_s) = (id_of(&direct), id_of(&shimmed));
    let masked = |o: &Output, id: &str| {
        let t = text(&o.stdout);
        assert!(
            t.contains(&format!("[id={id}]")),
            "apply printed its id:\n{t}"
        );
        let mut m = o.clone();
        m.stdout = mask_durations(&t.replace(id, "<ID>")).into_bytes();
        m
    };
    assert_same_run("apply", &masked(&d, &id_d), &masked(&s, &id_s));
    assert!(!lock_info(&shimmed).exists(), "no lock left by the apply");

    // From here on both directories hold the same state, so the output must be identical.
    std::fs::copy(
        shimmed.join("terraform.tfstate"),
        direct.join("terraform.tfstate"),
    )
    .unwrap();
    let (d, s) = both(&["output", "-json"]);
    assert_same_run("output -json", &d, &s);
    let outputs: Value = serde_json::from_slice(&s.stdout).expect("output -json is JSON");
    assert_eq!(outputs["id"]["value"], Value::String(id_s.clone()));

    let (d, s) = both(&["plan", "-detailed-exitcode", "-no-color", "-input=false"]);
    assert_same_run("plan -detailed-exitcode, no changes", &d, &s);
    assert_eq!(s.status.code(), Some(0));

    let args = [
        "plan",
        "-detailed-exitcode",
        "-no-color",
        "-input=false",
        "-var",
        "generation=2",
    ];
    let (d, s) = both(&args);
    assert_same_run("plan -detailed-exitcode, changes", &d, &s);
    assert_eq!(s.status.code(), Some(2), "{}", text(&s.stderr));
    assert!(text(&s.stdout).contains("must be replaced"));

    let (d, s) = both(&["plan", "-no-color", "-input=false", "-var", "nope=1"]);
    assert_same_run("plan with an undeclared variable", &d, &s);
    assert_eq!(s.status.code(), Some(1));
    assert!(
        text(&s.stderr).contains("undeclared variable"),
        "{}",
        text(&s.stderr)
    );

    // stdin is the caller's: console reads an expression from it.
    let input = b"null_resource.a.id\n".as_slice();
    let d = run(tf.direct(&direct, &["console"]), Some(input), LONG);
    let s = run(tf.shim(&shimmed, &["console"]), Some(input), LONG);
    assert_same_run("console", &d, &s);
    assert_eq!(text(&s.stdout), format!("\"{id_s}\"\n"));

    let log = init.log();
    assert_eq!(log.matches("terraform started").count(), 7, "{log}");
    init.stop();
}

fn a_plan_and_a_show_json_of_several_megabytes_arrive_complete_and_identical(shape: Shape) {
    let Some((bin, plugin_dir)) = real_terraform() else {
        return;
    };
    let tmp = TempDir::new("shim-big");
    let init = Init::start(&tmp, &tmp.0, &[], None);
    let tf = Tf::new(&tmp, &init.run_dir, &bin, &shape.env());
    let direct = fixture("big", &tmp.join("direct"));
    let shimmed = fixture("big", &tmp.join("shim"));
    for dir in [&direct, &shimmed] {
        let o = run(
            tf.direct(dir, &["init", "-no-color", "-input=false", &plugin_dir]),
            None,
            LONG,
        );
        assert!(o.status.success(), "init: {}", text(&o.stderr));
    }
    let plan = ["plan", "-no-color", "-input=false", "-out=plan.bin"];
    let d = run(tf.direct(&direct, &plan), None, LONG);
    let s = run(tf.shim(&shimmed, &plan), None, LONG);
    assert_same_run("plan of 1000 resources", &d, &s);
    assert!(
        s.stdout.len() > 2_000_000,
        "plan is {} bytes",
        s.stdout.len()
    );

    let show = ["show", "-json", "plan.bin"];
    let d = run(tf.direct(&shimmed, &show), None, LONG);
    let s = run(tf.shim(&shimmed, &show), None, LONG);
    assert_same_run("show -json of that plan", &d, &s);
    assert!(
        s.stdout.len() > 4_000_000,
        "show -json is {} bytes",
        s.stdout.len()
    );
    let doc: Value = serde_json::from_slice(&s.stdout).expect("show -json is one JSON document");
    assert_eq!(doc["resource_changes"].as_array().map(Vec::len), Some(1000));
    init.stop();
}

/// The controller is SIGKILLing its shim because the container is stopping (the init forwarded
/// the SIGTERM to it): the init is in its shutdown phase, terraform keeps running and completes
/// within the grace period, its remaining output goes to the init's log.
fn sigkill_of_the_shim_during_shutdown_leaves_the_apply_running_to_completion(shape: Shape) {
    let Some((bin, plugin_dir)) = real_terraform() else {
        return;
    };
    let tmp = TempDir::new("shim-shutdown-kill");
    let work = fixture("slow", &tmp.join("work"));
    let shim_dir = common::shim_dir(&tmp);
    let tf = Tf::new(&tmp, &tmp.join("run"), &bin, &shape.env());
    init_workspace(&tf, &work, &plugin_dir);

    let controller_log = tmp.join("controller.log");
    let controller: Vec<String> = [
        common::helper().display().to_string(),
        "controller".into(),
        "--on-term".into(),
        "kill".into(),
        "--exit-code".into(),
        "0".into(),
        "--log".into(),
        controller_log.display().to_string(),
        "--".into(),
        "terraform".into(),
        "apply".into(),
        "-auto-approve".into(),
        "-no-color".into(),
        "-input=false".into(),
        "-var".into(),
        "sleep=4".into(),
    ]
    .into();
    let mut env = vec![
        ("PATH", common::path_with(&[&shim_dir, &bin])),
        ("TFINIT_GRACE_PERIOD", "90s".to_string()),
    ];
    env.extend(shape.env());
    let mut init = Init::start(&tmp, &work, &env, Some(controller));

    // The shim relays the apply to the controller's stdout, which is the init's.
    wait_for(LONG, "the apply's provisioner to start", || {
        init.out.text().contains("Executing:").then_some(())
    });
    let t0 = Instant::now();
    init.signal(Signal::SIGTERM);
    wait_for(SHORT, "the controller to SIGKILL its shim", || {
        common::read(&controller_log)
            .contains("killed-child")
            .then_some(())
    });
    init.wait_log("the shim is gone; terraform keeps running", SHORT);

    // Stopping: a new run is refused, and nothing is started for it.
    let refused = run(tf.shim(&work, &["version"]), None, SHORT);
    assert_eq!(refused.status.code(), Some(75), "{}", text(&refused.stderr));
    assert!(text(&refused.stderr).contains("shutting down"));
    assert!(refused.stdout.is_empty());

    let code = init.wait_exit(LONG);
    let log = init.log();
    assert_eq!(code, 0, "the controller's exit code");
    assert!(
        t0.elapsed() < Duration::from_secs(70),
        "finished before the graceful step"
    );
    assert!(
        log_line(&log, "terraform exited run=r1").contains("exit=exit code 0"),
        "terraform completed by itself: {log}"
    );
    let gone_at = log.find("the shim is gone").unwrap();
    let complete_at = log
        .find("Apply complete! Resources: 1 added")
        .expect("the rest of the apply's output is in the init's log");
    assert!(gone_at < complete_at, "logged after the shim was gone");
    assert!(
        !init.out.text().contains("Apply complete!"),
        "the dead shim relayed nothing after its death"
    );
    for never in [
        "SIGTERM to terraform",
        "SIGKILL to terraform",
        "Interrupt received",
    ] {
        assert!(!log.contains(never), "{never:?} in the log:\n{log}");
    }
    assert_eq!(
        log.matches("terraform started").count(),
        1,
        "the refused run never started"
    );
    let st = state(&work);
    let a = instance(&st, "a").expect("null_resource.a in the state");
    assert!(a["attributes"]["id"]
        .as_str()
        .is_some_and(|s| !s.is_empty()));
    assert!(a.get("status").is_none(), "not tainted: {a}");
    assert!(!lock_info(&work).exists(), "the lock was released");
}

/// The caller gave up on a run outside shutdown (a reconcile timeout): the shim is SIGKILLed, the
/// init sends terraform one SIGTERM, terraform stops gracefully, saves state and unlocks.
fn an_abandoned_apply_stops_gracefully_with_consistent_state_and_no_lock(shape: Shape) {
    let Some(SlowApply {
        tmp: _tmp,
        init,
        tf,
        work,
        apply,
    }) = slow_apply_through_the_shim(shape, "shim-abandoned")
    else {
        return;
    };
    assert!(lock_info(&work).exists(), "the apply holds the lock");
    wait_for(SHORT, "the provisioner's `sleep 30` to run", || {
        init.processes()
            .iter()
            .any(|(_, cmd)| cmd == "sleep 30")
            .then_some(())
    });
    apply.signal(Signal::SIGKILL);
    let shim = apply.wait(SHORT);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&shim.status),
        Some(9)
    );

    init.wait_log("terraform exited run=r1", LONG);
    wait_for(SHORT, "the run to end", || {
        (init.run_count() == 0).then_some(())
    });
    let log = init.log();
    assert_eq!(log.matches("SIGTERM to terraform").count(), 1, "{log}");
    assert_eq!(
        log.matches("Interrupt received.").count(),
        1,
        "the apply reported the interrupt once (in the init's log: the shim is gone)\n{log}"
    );
    assert!(!log.contains("Two interrupts received"), "{log}");
    assert!(
        log_line(&log, "terraform exited run=r1").contains("exit=exit code 1"),
        "terraform stopped by itself: {log}"
    );
    assert!(
        !log.contains("SIGKILL to terraform's process group"),
        "it stopped within TFINIT_STOP_TIMEOUT: {log}"
    );
    let st = state(&work);
    let a = instance(&st, "a").expect("the interrupted resource is recorded");
    assert_eq!(a["status"], "tainted", "{a}");
    assert!(!lock_info(&work).exists(), "no lock info left");
    // And the lock itself is free: a plan that may not wait for it succeeds.
    let plan = run(
        tf.direct(
            &work,
            &["plan", "-no-color", "-input=false", "-lock-timeout=0s"],
        ),
        None,
        LONG,
    );
    assert_eq!(plan.status.code(), Some(0), "{}", text(&plan.stderr));

    // terraform's graceful stop SIGKILLs the provisioner's shell, orphaning its `sleep 30` in
    // terraform's process group: once terraform has stopped, that leftover is killed too.
    assert!(
        !init.processes().iter().any(|(_, cmd)| cmd == "sleep 30"),
        "the orphaned `sleep 30` is gone"
    );
    assert!(
        init.log()
            .contains("SIGKILL to what terraform left in its process group"),
        "{}",
        init.log()
    );
    init.stop();
}

fn sigterm_and_sigint_to_the_shim_interrupt_the_apply_once_never_twice(shape: Shape) {
    let Some(SlowApply {
        tmp: _tmp,
        init,
        tf: _,
        work,
        apply,
    }) = slow_apply_through_the_shim(shape, "shim-interrupt")
    else {
        return;
    };
    // A burst, as an impatient caller would send: each would be a second interrupt for terraform.
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGTERM] {
        apply.signal(s);
    }
    let out = apply.wait(LONG);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stdout.matches("Interrupt received.").count(), 1, "{stdout}");
    assert!(!stderr.contains("Two interrupts received"), "{stderr}");
    let log = init.log();
    assert_eq!(log.matches("SIGTERM to terraform").count(), 1, "{log}");
    assert!(
        log.contains("already asked to stop once"),
        "the later signals reached the init and were not passed on: {log}"
    );
    assert!(!lock_info(&work).exists(), "the lock was released");
    state(&work);
    init.stop();
}

fn sixteen_concurrent_applies_in_separate_dirs_all_complete(shape: Shape) {
    let Some((bin, plugin_dir)) = real_terraform() else {
        return;
    };
    const N: usize = 16;
    let tmp = TempDir::new("shim-16");
    let init = Init::start(&tmp, &tmp.0, &[], None);
    let tf = Tf::new(&tmp, &init.run_dir, &bin, &shape.env());
    let go = tmp.join("go");
    let dirs: Vec<PathBuf> = (0..N)
        .map(|i| fixture("barrier", &tmp.join(&format!("w{i}"))))
        .collect();
    let inits: Vec<Running> = dirs
        .iter()
        .map(|d| {
            Running::start(
                tf.shim(d, &["init", "-no-color", "-input=false", &plugin_dir]),
                false,
            )
        })
        .collect();
    for r in inits {
        let o = r.wait(LONG);
        assert!(o.status.success(), "init: {}", text(&o.stderr));
    }
    let go_var = format!("go={}", go.display());
    let applies: Vec<Running> = dirs
        .iter()
        .map(|d| {
            Running::start(
                tf.shim(
                    d,
                    &[
                        "apply",
                        "-auto-approve",
                        "-no-color",
                        "-input=false",
                        "-var",
                        &go_var,
                    ],
                ),
                false,
            )
        })
        .collect();
    // Every apply waits in its provisioner until `go` exists: all N are in flight at once.
    wait_for(LONG, "16 applies in flight at once", || {
        (init.run_count() == N && applies.iter().all(|a| a.out.text().contains("Executing:")))
            .then_some(())
    });
    std::fs::write(&go, b"").unwrap();
    for (r, d) in applies.into_iter().zip(&dirs) {
        let o = r.wait(LONG);
        assert_eq!(
            o.status.code(),
            Some(0),
            "apply in {}: {}",
            d.display(),
            text(&o.stderr)
        );
        assert!(text(&o.stdout).contains("Apply complete! Resources: 1 added"));
        let id = instance(&state(d), "a").unwrap()["attributes"]["id"].clone();
        assert!(
            text(&o.stdout).contains(&format!("id = {id}")),
            "its own id"
        );
    }
    init.stop();
}

// ----- fake terraform -----

/// A fake-terraform setup: the init, a Tf running the helper as `terraform`, and its log file.
fn fake_setup(name: &str, init_env: &[(&str, String)]) -> (TempDir, Init, Tf) {
    let tmp = TempDir::new(name);
    let init = Init::start(&tmp, &tmp.0, init_env, None);
    let fake = common::fake_terraform_dir(&tmp);
    let tf = Tf::new(&tmp, &init.run_dir, &fake, &[]);
    (tmp, init, tf)
}

#[test]
fn fifty_megabytes_of_output_arrive_complete_and_identical() {
    if !fake_available() {
        return;
    }
    let (tmp, init, tf) = fake_setup("shim-50mb", &[]);
    const N: usize = 50 << 20;
    let peak_before = init.peak_rss_kib();
    let mut cmd = tf.shim(&tmp.0, &["show", "-json"]);
    cmd.env("FAKE_TF_OUT_BYTES", N.to_string())
        .env("FAKE_TF_ECHO", "1");
    let s = run(cmd, None, LONG);
    // The relay buffers about the high-water mark (1 MiB) per shim, not a stream's worth.
    let grown = init.peak_rss_kib() - peak_before;
    assert!(grown < 4096, "the init's peak RSS grew by {grown} KiB");
    let mut cmd = tf.direct(&tmp.0, &["show", "-json"]);
    cmd.env("FAKE_TF_OUT_BYTES", N.to_string())
        .env("FAKE_TF_ECHO", "1");
    let d = run(cmd, None, LONG);
    assert_eq!(s.stdout.len(), N + "args: show -json\n".len());
    assert!(s.stdout[..N].iter().all(|&b| b == b'x'));
    assert_same_run("50 MB of stdout", &d, &s);
    init.stop();
}

#[test]
fn a_reader_slower_than_terraform_gets_every_byte_even_long_after_terraform_exited() {
    if !fake_available() {
        return;
    }
    let (tmp, init, tf) = fake_setup("shim-slow-reader", &[]);
    const N: usize = 4 << 20;
    let mut cmd = tf.shim(&tmp.0, &["show", "-json"]);
    cmd.env("FAKE_TF_OUT_BYTES", N.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().unwrap();
    let mut out = child.stdout.take().unwrap();
    // A caller that reads 32 KiB every 100 ms: terraform finishes writing and exits while the
    // last megabytes still wait in the init's pipe and queue, for longer than the init waits for
    // the pipes of an exited terraform to end (2 s) before it closes them.
    let mut got = Vec::with_capacity(N);
    let mut buf = vec![0u8; 32 << 10];
    let mut exited_seen: Option<Instant> = None;
    loop {
        let n = out.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        if exited_seen.is_none() && init.log().contains("terraform exited run=r1") {
            exited_seen = Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let st = common::wait_child(&mut child, SHORT, "the shim");
    let lag = exited_seen
        .expect("terraform exited while the caller read")
        .elapsed();
    assert!(
        lag > Duration::from_secs(3),
        "precondition: the caller was still reading well after terraform exited ({lag:?})"
    );
    assert_eq!(st.code(), Some(0));
    assert_eq!(got.len(), N, "every byte arrived");
    assert!(got.iter().all(|&b| b == b'x'));
    init.stop();
}

#[test]
fn a_shim_without_an_init_warns_once_and_runs_terraform_directly() {
    if !fake_available() {
        return;
    }
    let tmp = TempDir::new("shim-fallback");
    let fake = common::fake_terraform_dir(&tmp);
    // No init: nothing listens in this run directory.
    let tf = Tf::new(&tmp, &tmp.join("no-init"), &fake, &[]);
    let log = tmp.join("fake.log");
    let with = |mut c: Command| {
        c.env("FAKE_TF_ECHO", "1")
            .env("FAKE_TF_EXIT", "3")
            .env("FAKE_TF_LOG", &log);
        c
    };
    let d = run(
        with(tf.direct(&tmp.0, &["plan", "-input=false"])),
        None,
        SHORT,
    );
    std::fs::remove_file(&log).unwrap();
    let r = Running::start(with(tf.shim(&tmp.0, &["plan", "-input=false"])), false);
    let shim_pid = r.pid().as_raw();
    let s = r.wait(SHORT);

    assert_eq!(s.status.code(), Some(3));
    assert_eq!(s.stdout, d.stdout);
    let stderr = text(&s.stderr);
    let (warning, rest) = stderr.split_once('\n').unwrap();
    assert!(
        warning.starts_with("tfinit: warning: no tfinit init answers on")
            && warning.contains("running")
            && warning.contains("directly"),
        "{warning}"
    );
    assert_eq!(
        rest.as_bytes(),
        d.stderr.as_slice(),
        "then terraform's own stderr, only"
    );
    // Directly: terraform replaced the shim (same pid), nobody in between.
    let (pid, _) = fake_started(&log);
    assert_eq!(pid, shim_pid);

    // The real terraform too, when it is there.
    if let Some((bin, _)) = real_terraform() {
        let tf = Tf::new(&tmp, &tmp.join("no-init"), &bin, &[]);
        let d = run(tf.direct(&tmp.0, &["version"]), None, LONG);
        let s = run(tf.shim(&tmp.0, &["version"]), None, LONG);
        assert_eq!(s.status.code(), Some(0));
        assert_eq!(text(&s.stdout), text(&d.stdout));
        assert_eq!(
            text(&s.stderr).lines().count(),
            1 + text(&d.stderr).lines().count()
        );
    }
}

#[test]
fn a_client_of_another_uid_is_refused_and_the_init_keeps_serving() {
    if !fake_available()
        || !common::require(
            Path::new("/usr/bin/setpriv").exists(),
            "setpriv (util-linux)",
        )
    {
        return;
    }
    let (tmp, init, tf) = fake_setup("shim-uid", &[]);
    // Let uid 4321 reach the socket (the init makes it 0700/0600): only the init's check is left.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&init.run_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        init.run_dir.join("tfinit.sock"),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    let log = tmp.join("fake.log");
    let mut cmd = Command::new("/usr/bin/setpriv");
    cmd.args(["--reuid", "4321", "--regid", "4321", "--clear-groups", "--"])
        .arg(&tf.shim)
        .args(["apply", "-auto-approve"])
        .current_dir(&tmp.0)
        .env("FAKE_TF_LOG", &log)
        .env("FAKE_TF_ECHO", "1");
    for (k, v) in &tf.env {
        cmd.env(k, v);
    }
    let s = run(cmd, None, SHORT);
    let stderr = text(&s.stderr);
    assert_eq!(s.status.code(), Some(125), "{stderr}");
    assert!(
        stderr.contains("refused") && stderr.contains("uid 4321"),
        "{stderr}"
    );
    assert!(!stderr.contains("directly"), "not the fallback: {stderr}");
    assert!(s.stdout.is_empty());
    assert!(!log.exists(), "terraform was not started");
    assert!(init.log().contains("refused a client of another uid"));

    // The init still serves its own user.
    let mut cmd = tf.shim(&tmp.0, &["plan"]);
    cmd.env("FAKE_TF_ECHO", "1");
    let ok = run(cmd, None, SHORT);
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok.stderr));
    assert_eq!(text(&ok.stdout), "args: plan\n");
    init.stop();
}

#[test]
fn argv0_reaches_terraform_as_the_shim_was_invoked_terraform_or_tofu() {
    if !fake_available() {
        return;
    }
    let (tmp, init, tf) = fake_setup("shim-argv0", &[]);
    // tofu: a shim named tofu first on PATH, a fake named tofu after it.
    let tofu_shim = tmp.join("tofu-shim");
    let tofu_fake = tmp.join("tofu-fake");
    for (d, target) in [
        (&tofu_shim, common::tfinit()),
        (&tofu_fake, common::helper()),
    ] {
        std::fs::create_dir_all(d).unwrap();
        std::os::unix::fs::symlink(target, d.join("tofu")).unwrap();
    }
    let log = tmp.join("fake.log");
    let cases: Vec<(&str, Command, &str)> = vec![
        ("by name", tf.shim(&tmp.0, &["plan"]), "terraform"),
        (
            "by path",
            {
                let mut c = Command::new(&tf.shim);
                c.arg("plan");
                c
            },
            tf.shim.to_str().unwrap(),
        ),
        (
            "tfinit terraform --",
            {
                let mut c = Command::new(common::tfinit());
                c.args(["terraform", "--", "plan"]);
                c
            },
            "terraform",
        ),
        (
            "tofu",
            {
                let mut c = Command::new(tofu_shim.join("tofu"));
                c.arg0("tofu").arg("plan");
                c
            },
            "tofu",
        ),
    ];
    for (what, mut cmd, argv0) in cases {
        let _ = std::fs::remove_file(&log);
        cmd.current_dir(&tmp.0)
            .env("FAKE_TF_LOG", &log)
            .env("FAKE_TF_STDIN", "1");
        for (k, v) in &tf.env {
            cmd.env(k, v);
        }
        cmd.env(
            "PATH",
            common::path_with(&[
                &common::shim_dir(&tmp),
                &tofu_shim,
                &tmp.join("fake"),
                &tofu_fake,
            ]),
        );
        // The fake blocks reading stdin until the test closes it: time to read its argv.
        let r = Running::start(cmd, true);
        let (pid, _) = fake_started(&log);
        let host = init.host_pid(pid).expect("the fake terraform's pid");
        let cmdline = std::fs::read(format!("/proc/{host}/cmdline")).unwrap();
        let argv: Vec<String> = cmdline
            .split(|&b| b == 0)
            .filter(|a| !a.is_empty())
            .map(text)
            .collect();
        assert_eq!(argv, vec![argv0.to_string(), "plan".into()], "{what}");
        let o = r.wait(SHORT);
        assert_eq!(o.status.code(), Some(0), "{what}: {}", text(&o.stderr));
    }
    init.stop();
}

#[test]
fn exit_codes_are_relayed_exactly_and_death_by_signal_n_is_128_plus_n() {
    if !fake_available() {
        return;
    }
    let (tmp, init, tf) = fake_setup("shim-exit", &[]);
    for code in [0, 1, 2, 3, 42, 126, 127, 255] {
        let mut cmd = tf.shim(&tmp.0, &["apply"]);
        cmd.env("FAKE_TF_EXIT", code.to_string());
        let o = run(cmd, None, SHORT);
        assert_eq!(o.status.code(), Some(code), "{}", text(&o.stderr));
        assert!(o.stderr.is_empty(), "nothing added: {}", text(&o.stderr));
    }
    let log = tmp.join("fake.log");
    for sig in [Signal::SIGUSR1, Signal::SIGKILL, Signal::SIGTERM] {
        let _ = std::fs::remove_file(&log);
        let mut cmd = tf.shim(&tmp.0, &["apply"]);
        cmd.env("FAKE_TF_LOG", &log).env("FAKE_TF_STDIN", "1");
        let r = Running::start(cmd, true);
        let (pid, _) = fake_started(&log);
        let host = init.host_pid(pid).expect("the fake terraform's pid");
        kill(Pid::from_raw(host), sig).unwrap();
        let o = r.wait(SHORT);
        assert_eq!(o.status.code(), Some(128 + sig as i32), "{sig}");
        // The shim itself exits normally with that code: it was not signalled.
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&o.status),
            None
        );
    }
    init.stop();
}

#[test]
fn status_lists_each_run_with_its_pid_cwd_and_redacted_argv() {
    if !fake_available() {
        return;
    }
    let (tmp, init, tf) = fake_setup("shim-status", &[]);
    let t0 = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let dirs = [tmp.join("a"), tmp.join("b")];
    let logs = [tmp.join("a.log"), tmp.join("b.log")];
    let argvs: [&[&str]; 2] = [
        &[
            "apply",
            "-var",
            "password=hunter2",
            "-var-file=secret.tfvars",
            "-backend-config=access_key=AKIASECRET",
            "-auto-approve",
        ],
        &["plan", "-input=false"],
    ];
    let mut runs = Vec::new();
    for i in 0..2 {
        std::fs::create_dir_all(&dirs[i]).unwrap();
        let mut cmd = tf.shim(&dirs[i], argvs[i]);
        cmd.env("FAKE_TF_LOG", &logs[i])
            .env("FAKE_TF_SLEEP_MS", "120000")
            .env("FAKE_TF_ON_TERM", "graceful")
            .env("FAKE_TF_STOP_MS", "120000");
        runs.push(Running::start(cmd, false));
        fake_started(&logs[i]);
    }
    let (pid_a, pgid_a) = fake_started(&logs[0]);

    // From inside the namespace, as an operator would (kubectl exec).
    let mut cmd = Command::new("nsenter");
    cmd.args(["--target", &init.pid.to_string(), "--pid", "--mount", "--"])
        .arg(common::tfinit())
        .arg("status")
        .env("TFINIT_RUN_DIR", &init.run_dir);
    let o = run(cmd, None, SHORT);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let raw = text(&o.stdout);
    let st: Value = serde_json::from_str(&raw).expect("status is JSON");
    assert_eq!(st["v"], 1);
    assert_eq!(st["pid"], 1, "the init's pid in its namespace");
    assert_eq!(st["phase"], "running");
    assert!(st["main_pid"].as_i64().is_some_and(|p| p > 1));
    let list = st["runs"].as_array().unwrap();
    assert_eq!(list.len(), 2, "{raw}");
    let a = list
        .iter()
        .find(|r| r["subcommand"] == "apply")
        .expect("the apply run");
    assert!(a["id"].as_str().is_some_and(|s| s.starts_with('r')));
    assert_eq!(a["pid"], pid_a);
    assert_eq!(a["pgid"], pgid_a);
    assert_eq!(pid_a, pgid_a, "terraform leads its own process group");
    assert_eq!(a["cwd"], dirs[0].display().to_string());
    assert_eq!(
        a["argv"],
        serde_json::json!([
            "apply",
            "-var",
            "<redacted>",
            "-var-file=<redacted>",
            "-backend-config=<redacted>",
            "-auto-approve"
        ])
    );
    let started = a["started_unix"].as_f64().unwrap();
    assert!(
        started >= t0 - 1.0 && started <= t0 + 60.0,
        "{started} vs {t0}"
    );
    assert_eq!(a["attached"], true);
    assert_eq!(a["stop_requested"], false);
    for secret in ["hunter2", "AKIASECRET", "secret.tfvars"] {
        assert!(!raw.contains(secret), "{secret} in {raw}");
    }
    let b = list.iter().find(|r| r["subcommand"] == "plan").unwrap();
    assert_eq!(b["cwd"], dirs[1].display().to_string());
    assert_eq!(b["argv"], serde_json::json!(["plan", "-input=false"]));

    // Abandoned: no longer attached, asked to stop.
    runs[0].signal(Signal::SIGKILL);
    wait_for(SHORT, "the apply run to show as detached", || {
        let st = init.try_status()?;
        let a = st["runs"]
            .as_array()?
            .iter()
            .find(|r| r["subcommand"] == "apply")?
            .clone();
        (a["attached"] == false && a["stop_requested"] == true).then_some(())
    });
    // The namespace first (both fakes die with it), then the shims and the temp dir.
    drop(init);
    drop(runs);
}

#[test]
fn status_without_an_init_fails_with_a_clear_error() {
    let tmp = TempDir::new("shim-status-none");
    let mut cmd = Command::new(common::tfinit());
    cmd.arg("status").env("TFINIT_RUN_DIR", tmp.join("none"));
    let o = run(cmd, None, SHORT);
    assert_eq!(o.status.code(), Some(3));
    assert!(o.stdout.is_empty());
    let err = text(&o.stderr);
    assert!(
        err.contains("no tfinit init answers on")
            && err.contains(&tmp.join("none/tfinit.sock").display().to_string()),
        "{err}"
    );
}

#[test]
fn two_hundred_fifty_six_concurrent_runs_each_get_their_own_output_and_exit_code() {
    if !fake_available() {
        return;
    }
    const N: usize = 256;
    let (tmp, init, tf) = fake_setup("shim-256", &[]);
    let dirs: Vec<PathBuf> = (0..8)
        .map(|i| {
            let d = tmp.join(&format!("d{i}"));
            std::fs::create_dir_all(&d).unwrap();
            d
        })
        .collect();
    let mut runs: Vec<Running> = (0..N)
        .map(|i| {
            let var = format!("i={i}");
            let mut cmd = tf.shim(&dirs[i % 8], &["plan", "-var", &var]);
            cmd.env("FAKE_TF_STDIN", "1")
                .env("FAKE_TF_ECHO", "1")
                .env("FAKE_TF_EXIT", (i % 5).to_string());
            let mut r = Running::start(cmd, true);
            r.stdin
                .as_mut()
                .unwrap()
                .write_all(format!("input {i}\n").as_bytes())
                .unwrap();
            r
        })
        .collect();
    // Each fake blocks on its stdin until the test closes it: all N are in flight together.
    wait_for(LONG, "256 runs in flight at once", || {
        (init.run_count() == N).then_some(())
    });
    for r in &mut runs {
        drop(r.stdin.take());
    }
    let outs: Vec<Output> = runs
        .into_iter()
        .map(|r| std::thread::spawn(move || r.wait(LONG)))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    for (i, o) in outs.iter().enumerate() {
        assert_eq!(
            o.status.code(),
            Some((i % 5) as i32),
            "run {i}: {}",
            text(&o.stderr)
        );
        assert_eq!(
            text(&o.stdout),
            format!("input {i}\nargs: plan -var i={i}\n"),
            "run {i}"
        );
        assert_eq!(
            text(&o.stderr),
            format!("cwd: {}\n", dirs[i % 8].display()),
            "run {i}"
        );
    }
    wait_for(SHORT, "every run to end", || {
        (init.run_count() == 0).then_some(())
    });
    init.stop();
}

#[test]
fn sigterm_and_sigint_to_the_shim_reach_terraform_as_exactly_one_sigterm() {
    if !fake_available() {
        return;
    }
    for first in [Signal::SIGTERM, Signal::SIGINT] {
        let (tmp, init, tf) = fake_setup("shim-signals", &[]);
        let log = tmp.join("fake.log");
        let mut cmd = tf.shim(&tmp.0, &["apply"]);
        cmd.env("FAKE_TF_LOG", &log)
            .env("FAKE_TF_ON_TERM", "graceful")
            .env("FAKE_TF_SLEEP_MS", "120000")
            .env("FAKE_TF_STOP_MS", "4000");
        let r = Running::start(cmd, false);
        fake_started(&log);
        r.signal(first);
        init.wait_log("SIGTERM to terraform", SHORT);
        wait_for(SHORT, "terraform to receive the SIGTERM", || {
            (!fake_signals(&log).is_empty()).then_some(())
        });
        // More, one at a time, each seen by the init while terraform is still stopping.
        for (n, s) in [
            Signal::SIGINT,
            Signal::SIGTERM,
            Signal::SIGTERM,
            Signal::SIGINT,
        ]
        .into_iter()
        .enumerate()
        {
            r.signal(s);
            wait_for(SHORT, "the init to drop the repeated stop signal", || {
                (init.count("already asked to stop once") > n).then_some(())
            });
        }
        let o = r.wait(SHORT);
        assert_eq!(
            o.status.code(),
            Some(1),
            "terraform's graceful-stop exit code"
        );
        assert_eq!(fake_signals(&log), vec!["signal SIGTERM"], "first {first}");
        assert!(common::read(&log).contains("stopped-gracefully"));
        let err = text(&o.stderr);
        assert_eq!(err.matches("Interrupt received").count(), 1, "{err}");
        assert!(!err.contains("Two interrupts"), "{err}");
        assert_eq!(init.count("SIGTERM to terraform"), 1);
        init.stop();
    }
}

#[test]
fn an_abandoned_run_gets_exactly_one_sigterm_and_no_sigkill_when_it_stops() {
    if !fake_available() {
        return;
    }
    let (tmp, init, tf) = fake_setup("shim-abandon-graceful", &[]);
    let log = tmp.join("fake.log");
    let mut cmd = tf.shim(&tmp.0, &["apply"]);
    cmd.env("FAKE_TF_LOG", &log)
        .env("FAKE_TF_ON_TERM", "graceful")
        .env("FAKE_TF_SLEEP_MS", "120000")
        .env("FAKE_TF_STOP_MS", "500");
    let r = Running::start(cmd, false);
    fake_started(&log);
    r.signal(Signal::SIGKILL);
    r.wait(SHORT);
    wait_for(SHORT, "the abandoned run to end", || {
        (init.run_count() == 0).then_some(())
    });
    assert_eq!(fake_signals(&log), vec!["signal SIGTERM"]);
    assert!(common::read(&log).contains("stopped-gracefully"));
    let l = init.log();
    assert!(
        l.contains("the shim is gone; terraform keeps running"),
        "{l}"
    );
    assert!(
        l.contains("Interrupt received"),
        "its output went to the log: {l}"
    );
    assert!(!l.contains("SIGKILL to terraform"), "{l}");
    init.stop();
}

/// Runs `apply` through the shim with a terraform that first starts a `sleep 600` in its own
/// process group, then execs the fake terraform with `fake_env`; with `ignore_term` both ignore
/// SIGTERM. Returns the run, the fake's log and the group member's pid (in the init's namespace).
fn apply_with_a_group_member(
    tmp: &TempDir,
    tf: &Tf,
    ignore_term: bool,
    fake_env: &[(&str, &str)],
) -> (Running, PathBuf, i32) {
    let script = tmp.join("tf-with-member");
    let trap = if ignore_term { "trap '' TERM\n" } else { "" };
    std::fs::write(
        &script,
        format!("#!/bin/sh\n{trap}sleep 600 &\necho \"$!\" > \"$MEMBER_PID\"\nexec \"$FAKE_TF\" \"$@\"\n"),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let log = tmp.join("fake.log");
    let member_file = tmp.join("member.pid");
    let mut cmd = tf.shim(&tmp.0, &["apply"]);
    cmd.env("TFINIT_TERRAFORM", &script)
        .env("FAKE_TF", tmp.join("fake/terraform"))
        .env("MEMBER_PID", &member_file)
        .env("FAKE_TF_LOG", &log)
        .envs(fake_env.iter().copied());
    let r = Running::start(cmd, false);
    let member: i32 = wait_for(SHORT, "the group member's pid", || {
        common::read(&member_file).trim().parse().ok()
    });
    (r, log, member)
}

#[test]
fn an_abandoned_run_that_ignores_sigterm_has_its_group_killed_after_the_stop_timeout() {
    if !fake_available() {
        return;
    }
    let stop_timeout = Duration::from_secs(2);
    let (tmp, init, tf) = fake_setup(
        "shim-abandon-ignore",
        &[("TFINIT_STOP_TIMEOUT", "2s".to_string())],
    );
    // terraform and one more member of its process group, both ignoring SIGTERM.
    let (r, log, member) = apply_with_a_group_member(
        &tmp,
        &tf,
        true,
        &[
            ("FAKE_TF_ON_TERM", "ignore"),
            ("FAKE_TF_SLEEP_MS", "120000"),
        ],
    );
    let (pid, pgid) = fake_started(&log);
    let (tf_host, member_host) = (
        init.host_pid(pid).expect("terraform's pid"),
        init.host_pid(member).expect("the member's pid"),
    );
    assert_eq!(pid, pgid);

    let t0 = Instant::now();
    r.signal(Signal::SIGKILL);
    r.wait(SHORT);
    init.wait_log("SIGTERM to terraform", SHORT);
    assert!(
        !gone(tf_host) && !gone(member_host),
        "SIGTERM is ignored: both still run"
    );
    wait_for(
        stop_timeout + SHORT,
        "terraform's group to be killed",
        || (gone(tf_host) && gone(member_host)).then_some(()),
    );
    let took = t0.elapsed();
    assert!(
        took >= stop_timeout,
        "not before TFINIT_STOP_TIMEOUT: {took:?}"
    );
    assert!(took < stop_timeout + Duration::from_secs(5), "{took:?}");
    wait_for(SHORT, "the run to end", || {
        (init.run_count() == 0).then_some(())
    });
    let l = init.log();
    assert_eq!(l.matches("SIGTERM to terraform").count(), 1, "{l}");
    assert!(l.contains("SIGKILL to terraform's process group"), "{l}");
    assert!(
        l.contains("abandoned run did not stop within TFINIT_STOP_TIMEOUT"),
        "{l}"
    );
    assert!(l.contains("killed by SIGKILL"), "{l}");
    init.stop();
}

#[test]
fn an_abandoned_runs_leftover_group_members_are_killed_once_terraform_has_stopped() {
    if !fake_available() {
        return;
    }
    let (tmp, init, tf) = fake_setup(
        "shim-abandon-leftover",
        &[("TFINIT_STOP_TIMEOUT", "20s".to_string())],
    );
    // terraform stops at once on SIGTERM, leaving a member of its group behind (as its graceful
    // stop leaves a local-exec command's children), which holds its output pipes open.
    let (r, log, member) = apply_with_a_group_member(
        &tmp,
        &tf,
        false,
        &[
            ("FAKE_TF_ON_TERM", "graceful"),
            ("FAKE_TF_SLEEP_MS", "120000"),
            ("FAKE_TF_STOP_MS", "0"),
        ],
    );
    fake_started(&log);
    let member_host = init.host_pid(member).expect("the member's pid");
    let t0 = Instant::now();
    r.signal(Signal::SIGKILL);
    r.wait(SHORT);
    wait_for(SHORT, "the abandoned run to end", || {
        (init.run_count() == 0).then_some(())
    });
    assert!(common::read(&log).contains("stopped-gracefully"));
    assert!(
        gone(member_host),
        "the leftover member was killed with the run"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "not held until TFINIT_STOP_TIMEOUT (20s): {:?}",
        t0.elapsed()
    );
    let l = init.log();
    assert!(
        l.contains("SIGKILL to what terraform left in its process group"),
        "{l}"
    );
    assert!(
        !l.contains("SIGKILL to terraform's process group"),
        "terraform itself stopped: {l}"
    );
    init.stop();
}

#[test]
fn stdin_is_passed_to_terraform_which_runs_as_the_init_child_in_its_own_group() {
    if !fake_available() {
        return;
    }
    let (tmp, init, tf) = fake_setup("shim-stdin", &[]);
    let log = tmp.join("fake.log");
    let mut cmd = tf.shim(&tmp.0, &["console"]);
    cmd.env("FAKE_TF_STDIN", "1").env("FAKE_TF_LOG", &log);
    let mut r = Running::start(cmd, true);
    // While it waits for its input: a child of the init (PID 1), leading its own process group.
    let (pid, pgid) = fake_started(&log);
    assert_eq!(pid, pgid);
    let host = init.host_pid(pid).expect("the fake terraform's pid");
    let ppid = std::fs::read_to_string(format!("/proc/{host}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("PPid:").map(|v| v.trim().to_string()));
    assert_eq!(
        ppid,
        Some(init.pid.to_string()),
        "terraform's parent is the init"
    );
    let input: Vec<u8> = (0..200_000u32)
        .flat_map(|i| format!("{i}\n").into_bytes())
        .collect();
    r.stdin.take().unwrap().write_all(&input).unwrap();
    let o = r.wait(SHORT);
    assert_eq!(o.status.code(), Some(0));
    assert!(o.stdout == input, "stdin came back byte for byte");
    init.stop();
}
