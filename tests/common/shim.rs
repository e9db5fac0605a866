//! The shim tests' harness (tests/shim_*.rs): tfinit as PID 1 of a PID namespace
//! ([`ShimInit`]), processes whose output is collected as it comes ([`Running`]), terraform run
//! through the shim or directly in the same environment ([`Tf`]), and readers of state, logs and
//! /proc. See tests/shim_survival.rs for how the shim tests are set up.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Output, Stdio};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use crate::common::launch::{self, As, Config, Launch, Out};
pub use crate::common::Captured;
pub use crate::common::Shape;
use crate::common::{self, wait_for, TempDir};
/// Deadline for anything that runs real terraform (2 cores, other builds running).
pub const LONG: Duration = Duration::from_secs(180);

/// Deadline for the init's own reactions.
pub const SHORT: Duration = Duration::from_secs(20);

// ----- harness -----

/// A process started with its stdout and stderr collected as they come.
pub struct Running {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    pub out: Captured,
    pub err: Captured,
    pub readers: Vec<JoinHandle<()>>,
}

impl Running {
    /// Starts `cmd`; its stdin is a pipe when `piped_stdin`, else /dev/null.
    pub fn start(mut cmd: Command, piped_stdin: bool) -> Running {
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

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    pub fn signal(&self, s: Signal) {
        kill(self.pid(), s).unwrap_or_else(|e| panic!("kill {s} the shim: {e}"));
    }

    /// Waits for the exit and the end of both streams.
    pub fn wait(mut self, timeout: Duration) -> Output {
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
pub fn run(cmd: Command, stdin: Option<&[u8]>, timeout: Duration) -> Output {
    let mut r = Running::start(cmd, stdin.is_some());
    if let (Some(bytes), Some(mut w)) = (stdin, r.stdin.take()) {
        w.write_all(bytes).expect("write the run's stdin");
    }
    r.wait(timeout)
}

/// tfinit as PID 1 of a new PID namespace, its stdout and stderr (the log, at debug) collected.
pub struct ShimInit {
    pub unshare: Child,
    /// tfinit's pid as seen from the test (1 inside its namespace).
    pub pid: i32,
    pub run_dir: PathBuf,
    pub out: Captured,
    pub log: Captured,
    pub readers: Vec<JoinHandle<()>>,
    pub status: Option<ExitStatus>,
}

impl ShimInit {
    /// Starts `tfinit -- CONTROLLER` in `cwd` with `env` added; the default controller waits for
    /// SIGTERM and exits 0. Returns once the control socket answers `tfinit status`.
    pub fn start(
        tmp: &TempDir,
        cwd: &Path,
        env: &[(&str, String)],
        controller: Option<Vec<String>>,
    ) -> ShimInit {
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
        let config = Config::dirs(&run_dir, &state_dir)
            .set("TFINIT_LOG", "debug")
            .with(env);
        let mut l = Launch::new(As::Pid1, config, &controller);
        l.cwd = Some(cwd.to_path_buf());
        l.stdout = Out::Piped;
        l.stderr = Out::Piped;
        let mut unshare = l.spawn();
        let (out, h1) = Captured::collect(unshare.stdout.take().unwrap());
        let (log, h2) = Captured::collect(unshare.stderr.take().unwrap());
        let pid = launch::host_pid(As::Pid1, &unshare, SHORT);
        let init = ShimInit {
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

    pub fn log(&self) -> String {
        self.log.text()
    }

    pub fn count(&self, needle: &str) -> usize {
        self.log().matches(needle).count()
    }

    pub fn wait_log(&self, needle: &str, timeout: Duration) {
        wait_for(timeout, &format!("the init to log {needle:?}"), || {
            self.log().contains(needle).then_some(())
        });
    }

    /// `tfinit status` against this init, parsed; None when it fails.
    pub fn try_status(&self) -> Option<Value> {
        let mut cmd = Command::new(common::tfinit());
        cmd.arg("status").env("TFINIT_RUN_DIR", &self.run_dir);
        let out = run(cmd, None, SHORT);
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    pub fn run_count(&self) -> usize {
        self.try_status()
            .and_then(|s| s["runs"].as_array().map(Vec::len))
            .unwrap_or(usize::MAX)
    }

    /// The pid, as seen from the test, of the process with pid `ns_pid` in the init's namespace.
    pub fn host_pid(&self, ns_pid: i32) -> Option<i32> {
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
    pub fn processes(&self) -> Vec<(i32, String)> {
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
            found.push((p, common::cmdline(p).join(" ")));
        }
        found
    }

    /// The init's peak resident memory (VmHWM), in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        common::status_kib(self.pid, "VmHWM")
    }

    /// Sends the init a signal.
    pub fn signal(&self, s: Signal) {
        kill(Pid::from_raw(self.pid), s).expect("signal the init");
    }

    /// Waits for the init to exit by itself; returns its exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> i32 {
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
    pub fn stop(mut self) {
        self.signal(Signal::SIGTERM);
        let code = self.wait_exit(SHORT);
        assert_eq!(code, 0, "the init's exit code; log:\n{}", self.log());
    }
}

impl Drop for ShimInit {
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

/// Runs terraform through the shim or directly, with the identical environment: PATH = the shim
/// directory, then the directory of the terraform to run, then the test's PATH.
pub struct Tf {
    pub shim: PathBuf,
    pub real: PathBuf,
    pub env: Vec<(String, String)>,
}

impl Tf {
    pub fn new(tmp: &TempDir, run_dir: &Path, tf_dir: &Path, env: &[(&str, String)]) -> Tf {
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

    pub fn command(&self, program: &Path, cwd: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(program);
        common::scrub(&mut c)
            .arg0("terraform")
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
    pub fn shim(&self, cwd: &Path, args: &[&str]) -> Command {
        self.command(&self.shim, cwd, args)
    }

    /// The same terraform, run directly.
    pub fn direct(&self, cwd: &Path, args: &[&str]) -> Command {
        self.command(&self.real, cwd, args)
    }
}

/// terraform 1.0.3 and the null provider from .test-deps, or None (skip) when missing: the
/// directory of its `terraform` and init's `-plugin-dir=` argument.
pub fn real_terraform() -> Option<(PathBuf, String)> {
    real_terraform_for(Shape::Panicwrap)
}

/// [`real_terraform`] of the terraform `shape` runs (the modern one for [`Shape::Modern`]).
pub fn real_terraform_for(shape: Shape) -> Option<(PathBuf, String)> {
    if !common::can_unshare() {
        return None;
    }
    let tf = shape.terraform()?;
    Some((tf.dir(), common::terraform::plugin_dir_arg()))
}

pub fn fake_available() -> bool {
    common::can_unshare()
}

/// Copies tests/fixtures/tf/NAME into `dest`.
pub fn fixture(name: &str, dest: &Path) -> PathBuf {
    common::config_dir(&format!("tf/{name}"), dest)
}

/// The last `n` bytes of `s` (or so: cut at a character boundary).
/// `terraform init` of `work`, run directly (not through the shim), with the null provider.
pub fn init_workspace(tf: &Tf, work: &Path, plugin_dir: &str) {
    let o = run(
        tf.direct(work, &["init", "-no-color", "-input=false", plugin_dir]),
        None,
        LONG,
    );
    assert!(o.status.success(), "init: {}", text(&o.stderr));
}

/// A real apply of the `slow` fixture running through the shim, its provisioner started.
pub struct SlowApply {
    pub tmp: TempDir,
    pub init: ShimInit,
    pub tf: Tf,
    pub work: PathBuf,
    pub apply: Running,
}

/// Starts an init, initialises the `slow` fixture and runs its apply through the shim until the
/// provisioner runs; `None` without a real terraform.
pub fn slow_apply_through_the_shim(shape: Shape, name: &str) -> Option<SlowApply> {
    let (bin, plugin_dir) = real_terraform_for(shape)?;
    let tmp = TempDir::new(name);
    let init = ShimInit::start(&tmp, &tmp.0, &[], None);
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
    // The run is the shape and the version under test (so each is really covered). Polled: a
    // process terraform is starting (local-exec's sh) runs terraform's binary until its exec.
    let exe = std::fs::canonicalize(bin.join("terraform")).expect("the real terraform");
    let running = || {
        init.processes()
            .into_iter()
            .filter(|(p, _)| {
                std::fs::read_link(format!("/proc/{p}/exe")).ok().as_ref() == Some(&exe)
            })
            .count()
    };
    let shaped = (0..200).any(|_| {
        let ok = running() == shape.terraform_processes();
        if !ok {
            std::thread::sleep(Duration::from_millis(10));
        }
        ok
    });
    assert!(
        shaped,
        "{} processes of {} in shape {shape:?} (want {}): {:?}",
        running(),
        exe.display(),
        shape.terraform_processes(),
        init.processes()
    );
    Some(SlowApply {
        tmp,
        init,
        tf,
        work,
        apply,
    })
}

pub fn tail(s: &str, n: usize) -> &str {
    let mut i = s.len().saturating_sub(n);
    while !s.is_char_boundary(i) {
        i += 1;
    }
    &s[i..]
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Asserts that two runs printed the same bytes on each stream and exited the same way.
pub fn assert_same_run(what: &str, direct: &Output, shim: &Output) {
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
pub fn mask_durations(s: &str) -> String {
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
pub fn state(dir: &Path) -> Value {
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
pub fn instance<'a>(state: &'a Value, name: &str) -> Option<&'a Value> {
    state["resources"]
        .as_array()?
        .iter()
        .find(|r| r["type"] == "null_resource" && r["name"] == name)?["instances"]
        .get(0)
}

pub fn lock_info(dir: &Path) -> PathBuf {
    dir.join(".terraform.tfstate.lock.info")
}

/// The first line of `log` that contains `needle` (empty when none).
pub fn log_line(log: &str, needle: &str) -> String {
    log.lines()
        .find(|l| l.contains(needle))
        .unwrap_or_default()
        .to_string()
}

/// Lines `signal ...` a fake terraform wrote to its FAKE_TF_LOG.
pub fn fake_signals(log: &Path) -> Vec<String> {
    common::read(log)
        .lines()
        .filter(|l| l.starts_with("signal "))
        .map(str::to_string)
        .collect()
}

/// Waits for a fake terraform's first log line and returns its pid and pgid (namespace pids).
pub fn fake_started(log: &Path) -> (i32, i32) {
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
pub fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(") ")
            .is_some_and(|(_, r)| r.starts_with('Z') || r.starts_with('X')),
    }
}

/// A fake-terraform setup: the init, a Tf running the helper as `terraform`, and its log file.
pub fn fake_setup(name: &str, init_env: &[(&str, String)]) -> (TempDir, ShimInit, Tf) {
    let tmp = TempDir::new(name);
    let init = ShimInit::start(&tmp, &tmp.0, init_env, None);
    let fake = common::fake_terraform_dir(&tmp);
    let tf = Tf::new(&tmp, &init.run_dir, &fake, &[]);
    (tmp, init, tf)
}

/// Runs `apply` through the shim with a terraform that first starts a `sleep 600` in its own
/// process group, then execs the fake terraform with `fake_env`; with `ignore_term` both ignore
/// SIGTERM. Returns the run, the fake's log and the group member's pid (in the init's namespace).
pub fn apply_with_a_group_member(
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
