//! Bad input to a running init (tfinit as PID 1 of a PID namespace, as in a container): a state
//! directory that is a file, read-only or on a full disk; a regular file where the control socket
//! goes; peers sending a gibibyte of garbage; terraform printing a gibibyte without a newline;
//! a thousand shims connecting at once. Each time the init must keep working (a normal run
//! through the shim succeeds afterwards and the init exits cleanly), and its messages must name
//! the path and say what to do.
//!
//! (The TFINIT_* variables with garbage values are tests/config_errors.rs.)

mod common;
use common::{collect, tfinit_under, TFINIT_VARS};

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{fake_terraform_dir, helper, read, shim_dir, tfinit, wait_for, TempDir};
use tfinit::protocol::{self, Envelope, ExitNote, Kind, Request, RunRequest, MAX_PAYLOAD};

/// Generous bound for anything that should take a second or two.
const SOON: Duration = Duration::from_secs(60);

/// A gibibyte.
const GIB: u64 = 1 << 30;

/// The heavy tests (a thousand processes, gibibytes through pipes) run one at a time: the machine
/// has two cores and a pid space shared with everything else running.
static HEAVY: Mutex<()> = Mutex::new(());

fn heavy() -> std::sync::MutexGuard<'static, ()> {
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

/// A tfinit running as PID 1, its controller a `helper signals` that exits on SIGTERM.
struct Init {
    child: Child,
    /// tfinit's pid as this test sees it.
    pid: i32,
    stderr: Arc<Mutex<String>>,
    reader: Option<JoinHandle<()>>,
    run_dir: PathBuf,
    shim: PathBuf,
    fake: PathBuf,
    work: PathBuf,
}

/// How to start it.
#[derive(Default)]
struct Setup<'a> {
    /// Shell commands run inside the namespace (as root, in its own mount namespace) before
    /// tfinit is exec'd: mounts.
    before: &'a str,
    /// Shell commands run by the controller before it becomes `helper signals`.
    controller_first: &'a str,
    /// TFINIT_STATE_DIR (default: an empty directory).
    state_dir: Option<&'a Path>,
    /// TFINIT_RUN_DIR (default: a fresh path).
    run_dir: Option<&'a Path>,
}

/// A field of /proc/PID/status in KiB (`VmHWM`, `VmRSS`).
fn status_kib(pid: i32, field: &str) -> u64 {
    read(Path::new(&format!("/proc/{pid}/status")))
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

impl Init {
    fn start(tmp: &TempDir, setup: Setup<'_>) -> Init {
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
        let mut c = Command::new("unshare");
        c.args(["--pid", "--fork", "--mount-proc", "--kill-child"]);
        if !setup.before.is_empty() {
            c.args([
                "sh",
                "-c",
                &format!("set -e; {}; exec \"$0\" \"$@\"", setup.before),
            ]);
        }
        c.arg(tfinit()).arg("--");
        let h = helper();
        let signals = format!(
            "{} signals {} --exit-on TERM",
            sh_quote(&h),
            sh_quote(&signals_log)
        );
        if setup.controller_first.is_empty() {
            c.arg(&h)
                .arg("signals")
                .arg(&signals_log)
                .args(["--exit-on", "TERM"]);
        } else {
            c.args([
                "sh",
                "-c",
                &format!("{}; exec {signals}", setup.controller_first),
            ]);
        }
        for v in TFINIT_VARS {
            c.env_remove(v);
        }
        c.env("TFINIT_RUN_DIR", &run_dir)
            .env("TFINIT_STATE_DIR", &state_dir)
            .env("TFINIT_OWNER", "bad-input")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("spawn unshare");
        let (stderr, reader) = collect(child.stderr.take().unwrap());
        let pid = tfinit_under(child.id() as i32, Duration::from_secs(60));
        let init = Init {
            child,
            pid,
            stderr,
            reader: Some(reader),
            run_dir,
            shim: shim_dir(tmp),
            fake: fake_terraform_dir(tmp),
            work,
        };
        wait_for(SOON, "the controller to be ready", || {
            read(&signals_log).contains("ready main").then_some(())
        });
        init
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits until the init's log has a line containing every one of `parts`; returns it.
    fn log_line(&self, parts: &[&str]) -> String {
        wait_for(SOON, &format!("a log line with {parts:?}"), || {
            self.stderr()
                .lines()
                .find(|l| parts.iter().all(|p| l.contains(p)))
                .map(str::to_string)
        })
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) with plain integers.
        let rc = unsafe { libc::kill(self.pid, sig) };
        assert_eq!(rc, 0, "kill({}, {sig})", self.pid);
    }

    /// The init's peak resident set so far, KiB.
    fn peak_rss_kib(&self) -> u64 {
        status_kib(self.pid, "VmHWM")
    }

    fn socket(&self) -> PathBuf {
        self.run_dir.join("tfinit.sock")
    }

    /// `terraform ARGS` through the shim (the fake terraform behind it), from outside the
    /// namespace: the shim only needs the socket.
    fn shim(&self, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut c = Command::new(self.shim.join("terraform"));
        c.args(args)
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
    fn assert_runs_work(&self, tmp: &TempDir) {
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
    fn stop(mut self) -> (ExitStatus, String) {
        self.signal(libc::SIGTERM);
        let status = common::wait_child(&mut self.child, SOON, "tfinit after SIGTERM");
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        (status, self.stderr())
    }

    /// Stops the init and checks it ended cleanly (it kept working to the end).
    fn stop_cleanly(self) -> String {
        let (status, log) = self.stop();
        assert_eq!(status.code(), Some(0), "tfinit log:\n{log}");
        assert!(!log.contains("panicked"), "{log}");
        log
    }
}

impl Drop for Init {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn unique() -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    N.fetch_add(1, Ordering::SeqCst)
}

fn sh_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}

/// The `pid P pgid G` the fake terraform logged first.
fn fake_pid_pgid(log: &Path) -> (i32, i32) {
    let text = read(log);
    let line = text
        .lines()
        .find(|l| l.starts_with("pid "))
        .unwrap_or_else(|| panic!("the fake terraform logged no pid: {text:?}"));
    let f: Vec<&str> = line.split(' ').collect();
    (f[1].parse().unwrap(), f[3].parse().unwrap())
}

fn root() -> bool {
    common::require(common::is_root(), "root (PID and mount namespaces)")
}

// ----- the state directory -----

#[test]
fn a_state_dir_that_is_a_file_is_named_in_a_warning_and_runs_still_work() {
    if !root() {
        return;
    }
    let tmp = TempDir::new("bad-state-file");
    let file = tmp.join("state-is-a-file");
    std::fs::write(&file, "not a directory\n").unwrap();
    let init = Init::start(
        &tmp,
        Setup {
            state_dir: Some(&file),
            ..Setup::default()
        },
    );
    let line = init.log_line(&["TFINIT_STATE_DIR is not usable", file.to_str().unwrap()]);
    assert!(line.contains("Mount a writable volume"), "no hint: {line}");
    init.assert_runs_work(&tmp);
    init.stop_cleanly();
    assert_eq!(read(&file), "not a directory\n", "the file was changed");
}

#[test]
fn a_read_only_state_dir_is_named_in_a_warning_and_runs_still_work() {
    if !root() {
        return;
    }
    let tmp = TempDir::new("bad-state-ro");
    let dir = tmp.join("state-ro");
    std::fs::create_dir_all(&dir).unwrap();
    let d = sh_quote(&dir);
    let init = Init::start(
        &tmp,
        Setup {
            before: &format!("mount --bind {d} {d} && mount -o remount,bind,ro {d}"),
            state_dir: Some(&dir),
            ..Setup::default()
        },
    );
    let line = init.log_line(&["TFINIT_STATE_DIR is not usable", dir.to_str().unwrap()]);
    assert!(line.contains("Read-only file system"), "no cause: {line}");
    assert!(line.contains("Mount a writable volume"), "no hint: {line}");
    init.assert_runs_work(&tmp);
    init.stop_cleanly();
    // The read-only mount was the namespace's own: underneath, nothing was written.
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
    assert!(
        left.is_empty(),
        "files appeared under the read-only mount: {left:?}"
    );
}

/// Fills the filesystem under `dir` (a tiny tmpfs) until it reports ENOSPC.
fn fill(dir: &str) -> String {
    format!("dd if=/dev/zero of={dir}/fill bs=1024 2>/dev/null || true")
}

#[test]
fn a_state_dir_on_a_full_disk_at_start_is_named_in_a_warning_and_runs_still_work() {
    if !root() {
        return;
    }
    let tmp = TempDir::new("bad-state-full");
    let dir = tmp.join("state-full");
    std::fs::create_dir_all(&dir).unwrap();
    let d = sh_quote(&dir);
    let init = Init::start(
        &tmp,
        Setup {
            before: &format!("mount -t tmpfs -o size=16k tmpfs {d} && {}", fill(&d)),
            state_dir: Some(&dir),
            ..Setup::default()
        },
    );
    let line = init.log_line(&["TFINIT_STATE_DIR is not usable", dir.to_str().unwrap()]);
    assert!(line.contains("No space left on device"), "no cause: {line}");
    assert!(line.contains("Mount a writable volume"), "no hint: {line}");
    init.assert_runs_work(&tmp);
    init.stop_cleanly();
}

#[test]
fn a_state_dir_that_fills_up_while_running_costs_the_records_but_not_the_runs() {
    if !root() {
        return;
    }
    let tmp = TempDir::new("bad-state-fills");
    let dir = tmp.join("state-fills");
    std::fs::create_dir_all(&dir).unwrap();
    let d = sh_quote(&dir);
    let filled = tmp.join("filled");
    let init = Init::start(
        &tmp,
        Setup {
            before: &format!("mount -t tmpfs -o size=16k tmpfs {d}"),
            // The controller fills the disk after the init has set up its records.
            controller_first: &format!("{} && touch {}", fill(&d), sh_quote(&filled)),
            state_dir: Some(&dir),
            ..Setup::default()
        },
    );
    init.log_line(&["lock-owner records enabled", dir.to_str().unwrap()]);
    assert!(filled.exists(), "the controller did not fill the disk");
    assert!(!init.stderr().contains("not usable"), "{}", init.stderr());
    // A state-locking run: its record cannot be written; terraform runs all the same.
    init.assert_runs_work(&tmp);
    let line = init.log_line(&["lock-owner record", dir.to_str().unwrap(), "No space left"]);
    assert!(
        line.contains("free space") || line.contains("TFINIT_STATE_DIR"),
        "no hint about what to do: {line}"
    );
    // And again: a full disk is not a reason to stop accepting runs.
    init.assert_runs_work(&tmp);
    init.stop_cleanly();
}

// ----- the control socket -----

#[test]
fn a_regular_file_at_the_socket_path_is_kept_and_named_and_shims_run_terraform_directly() {
    if !root() {
        return;
    }
    let tmp = TempDir::new("bad-sock-file");
    let run = tmp.join("run");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::set_permissions(&run, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let sock = run.join("tfinit.sock");
    std::fs::write(&sock, "somebody's file\n").unwrap();
    let init = Init::start(
        &tmp,
        Setup {
            run_dir: Some(&run),
            ..Setup::default()
        },
    );
    let line = init.log_line(&["control socket", sock.to_str().unwrap()]);
    assert!(line.contains("is not a socket"), "{line}");
    assert!(line.contains("remove it"), "no hint: {line}");
    assert!(
        line.contains("falls back"),
        "does not say what happens: {line}"
    );

    // The shim cannot reach the init and runs terraform itself (exec: same pid), with a warning
    // that names the socket.
    let log = tmp.join("fake.log");
    let mut cmd = init.shim(
        &["plan"],
        &[
            ("FAKE_TF_ECHO", "1"),
            ("FAKE_TF_EXIT", "4"),
            ("FAKE_TF_LOG", log.to_str().unwrap()),
        ],
    );
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    let shim_pid = child.id() as i32;
    let out = common::wait_output(child, SOON);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "args: plan\n");
    assert!(stderr.contains(sock.to_str().unwrap()), "{stderr}");
    assert!(stderr.contains("directly"), "{stderr}");
    assert_eq!(
        fake_pid_pgid(&log).0,
        shim_pid,
        "terraform was not run by the shim itself"
    );

    // The init still supervises its controller and exits cleanly; the file was never touched.
    init.stop_cleanly();
    assert_eq!(read(&sock), "somebody's file\n");
    assert!(std::fs::symlink_metadata(&sock).unwrap().is_file());
}

/// Writes `header` then filler bytes (`fill`, never a newline) until `total` bytes were accepted
/// or the peer stopped taking them; returns how many were accepted.
fn flood(mut sock: UnixStream, header: &[u8], fill: u8, total: u64) -> u64 {
    let chunk = vec![fill; 1 << 20];
    let mut sent = 0u64;
    if sock.write_all(header).is_err() {
        return 0;
    }
    sent += header.len() as u64;
    while sent < total {
        let n = chunk.len().min((total - sent) as usize);
        match sock.write(&chunk[..n]) {
            Ok(0) | Err(_) => break,
            Ok(k) => sent += k as u64,
        }
    }
    sent
}

/// Reads frames until the init's Exit note; the note and the stdout bytes before it.
fn read_until_exit(sock: &mut UnixStream) -> (ExitNote, Vec<u8>) {
    let mut payload = Vec::new();
    let mut stdout = Vec::new();
    loop {
        match tfinit::client::read_frame(sock, &mut payload) {
            Ok(Some(Kind::Exit)) => {
                return (serde_json::from_slice(&payload).expect("exit note"), stdout)
            }
            Ok(Some(Kind::Stdout)) => stdout.extend_from_slice(&payload),
            Ok(Some(_)) => {}
            Ok(None) => panic!("the init closed the connection without an exit note"),
            Err(e) => panic!("reading the init's answer: {e}"),
        }
    }
}

#[test]
fn a_gibibyte_of_garbage_from_a_peer_is_refused_early_and_never_buffered() {
    if !root() {
        return;
    }
    let _g = heavy();
    let tmp = TempDir::new("bad-garbage");
    let init = Init::start(&tmp, Setup::default());
    let before = init.peak_rss_kib();
    let max = (MAX_PAYLOAD as u32).to_be_bytes();
    let cases: [(&str, Vec<u8>, &str); 3] = [
        (
            "bytes that are no frame",
            Vec::new(),
            "unknown frame kind byte 0x78",
        ),
        (
            "a request frame of the largest size, filled with garbage",
            vec![b'R', max[0], max[1], max[2], max[3]],
            "malformed request",
        ),
        (
            "a request frame announcing 4 GiB",
            vec![b'R', 0xff, 0xff, 0xff, 0xff],
            "over the limit",
        ),
    ];
    for (what, header, problem) in cases {
        let mut sock = UnixStream::connect(init.socket()).unwrap();
        sock.set_read_timeout(Some(SOON)).unwrap();
        sock.set_write_timeout(Some(SOON)).unwrap();
        let writer = sock.try_clone().unwrap();
        let sender = std::thread::spawn(move || flood(writer, &header, b'x', GIB));
        let (note, _) = read_until_exit(&mut sock);
        assert_eq!(note.code, protocol::EXIT_INIT_ERROR, "{what}: {note:?}");
        let error = note.error.unwrap_or_default();
        assert!(error.contains(problem), "{what}: {error}");
        // Then the init closes: no more frames, and the flood stops being accepted.
        let mut rest = Vec::new();
        let _ = sock.read_to_end(&mut rest);
        assert!(
            rest.is_empty(),
            "{what}: more after the exit note: {rest:?}"
        );
        let accepted = sender.join().unwrap();
        assert!(
            accepted < GIB / 16,
            "{what}: the init took {accepted} bytes of garbage"
        );
        init.log_line(&["bad client request", problem]);
    }
    let peak = init.peak_rss_kib();
    eprintln!("bad_input: garbage peers: init peak RSS {before} KiB before, {peak} KiB after");
    // One frame (4 MiB) and its copy at most, never the gibibyte.
    assert!(
        peak < before + 24 * 1024,
        "peak RSS grew from {before} to {peak} KiB"
    );
    init.assert_runs_work(&tmp);
    init.stop_cleanly();
}

#[test]
fn a_gibibyte_of_garbage_signal_frames_during_a_run_is_read_and_dropped_and_the_run_ends_normally()
{
    if !root() {
        return;
    }
    let _g = heavy();
    let tmp = TempDir::new("bad-garbage-run");
    let init = Init::start(&tmp, Setup::default());
    let before = init.peak_rss_kib();
    let log = tmp.join("fake.log");
    // The fake terraform echoes its stdin (a pipe this test holds) and exits 7 at its end.
    // O_CLOEXEC: processes other tests start meanwhile must not hold the write end open.
    let (stdin_r, stdin_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let request = Envelope {
        v: protocol::VERSION,
        request: Request::Run(RunRequest {
            program: init.fake.join("terraform").to_str().unwrap().into(),
            argv0: "terraform".into(),
            args: vec!["apply".into(), "-auto-approve".into()],
            cwd: init.work.to_str().unwrap().into(),
            env: vec![
                "FAKE_TF_STDIN=1".into(),
                "FAKE_TF_EXIT=7".into(),
                format!("FAKE_TF_LOG={}", log.display()),
            ],
        }),
    };
    let mut frame = Vec::new();
    protocol::encode_json(Kind::Request, &request, &mut frame);
    let mut sock = UnixStream::connect(init.socket()).unwrap();
    sock.set_read_timeout(Some(SOON)).unwrap();
    sock.set_write_timeout(Some(SOON)).unwrap();
    let sent = tfinit::sys::send_with_fd(sock.as_fd(), &frame, stdin_r.as_fd()).unwrap();
    sock.write_all(&frame[sent..]).unwrap();
    drop(stdin_r);
    wait_for(SOON, "terraform to start", || {
        read(&log).contains("pid ").then_some(())
    });
    // 256 Signal frames of 4 MiB each whose payload is not JSON: each is read and dropped.
    let mut garbage = Vec::with_capacity(protocol::HEADER + MAX_PAYLOAD);
    protocol::encode(Kind::Signal, &vec![b'x'; MAX_PAYLOAD], &mut garbage);
    let started = Instant::now();
    let mut total = 0u64;
    while total < GIB {
        sock.write_all(&garbage).expect("the init stopped reading");
        total += garbage.len() as u64;
    }
    let secs = started.elapsed().as_secs_f64();
    let mut w = std::fs::File::from(stdin_w);
    w.write_all(b"still here\n").unwrap();
    drop(w);
    let (note, stdout) = read_until_exit(&mut sock);
    assert_eq!(note.code, 7, "{note:?}");
    assert_eq!(note.error, None);
    assert_eq!(stdout, b"still here\n");
    assert!(
        !read(&log).contains("signal"),
        "garbage became a signal: {}",
        read(&log)
    );
    let peak = init.peak_rss_kib();
    eprintln!(
        "bad_input: {total} bytes of garbage frames read in {secs:.1}s; init peak RSS {before} KiB before, {peak} KiB after"
    );
    assert!(
        peak < before + 24 * 1024,
        "peak RSS grew from {before} to {peak} KiB"
    );
    init.assert_runs_work(&tmp);
    init.stop_cleanly();
}

#[test]
fn terraform_printing_a_gibibyte_without_a_newline_is_relayed_whole_without_buffering_it() {
    if !root() {
        return;
    }
    let _g = heavy();
    let tmp = TempDir::new("bad-long-line");
    let init = Init::start(&tmp, Setup::default());
    let before = init.peak_rss_kib();
    // `apply` takes the state lock, so the init follows the output for resources in progress.
    let mut cmd = init.shim(
        &["apply", "-auto-approve"],
        &[
            ("FAKE_TF_OUT_BYTES", &GIB.to_string()),
            ("FAKE_TF_EXIT", "5"),
        ],
    );
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd.spawn().unwrap();
    let mut out = child.stdout.take().unwrap();
    let counter = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 20];
        let xs = vec![b'x'; 1 << 20];
        let (mut n, mut other) = (0u64, 0u64);
        while let Ok(k) = out.read(&mut buf) {
            if k == 0 {
                break;
            }
            n += k as u64;
            // Slice comparison is a memcmp: fast even in a debug build.
            if buf[..k] != xs[..k] {
                other += 1;
            }
        }
        (n, other)
    });
    let mut err = child.stderr.take().unwrap();
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let status = common::wait_child(&mut child, Duration::from_secs(300), "shim");
    let (n, other) = counter.join().unwrap();
    let stderr = err_t.join().unwrap();
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(status.code(), Some(5), "{stderr}");
    assert_eq!(n, GIB, "bytes relayed");
    assert_eq!(other, 0, "reads with bytes other than the ones printed");
    let peak = init.peak_rss_kib();
    eprintln!(
        "bad_input: 1 GiB line relayed in {secs:.1}s; init peak RSS {before} KiB before, {peak} KiB after"
    );
    // Output queued for the shim is capped (backpressure) and the follower keeps 64 KiB of a line.
    assert!(
        peak < before + 24 * 1024,
        "peak RSS grew from {before} to {peak} KiB"
    );
    init.assert_runs_work(&tmp);
    init.stop_cleanly();
}

// ----- many clients -----

/// Connections waiting in the listen queue of the socket at `path` (ss's Recv-Q of a listener).
fn pending_connections(path: &Path) -> Option<usize> {
    let out = Command::new("ss")
        .args(["-xlnH", "src"])
        .arg(path)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let path = path.to_str()?;
    let line = text.lines().find(|l| l.contains(path))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

#[test]
fn a_thousand_shims_connecting_at_once_all_get_their_own_output_and_exit_code() {
    // The test holds two pipes per shim; the init a socket, two pipes and a stdin per run.
    if !root()
        || !common::enough_descriptors(8192)
        || !common::require(
            Command::new("ss").arg("-V").output().is_ok(),
            "ss (iproute2)",
        )
    {
        return;
    }
    let _g = heavy();
    const N: usize = 1000;
    let tmp = TempDir::new("bad-thousand");
    let init = Init::start(&tmp, Setup::default());
    let before = init.peak_rss_kib();
    // Stop the init so that every shim's connection waits in the listen queue, then let it go.
    init.signal(libc::SIGSTOP);
    let mut shims = Vec::with_capacity(N);
    for i in 0..N {
        let code = (i % 100).to_string();
        let mut c = init.shim(
            &["plan", &format!("-var=i={i}")],
            &[
                ("FAKE_TF_ECHO", "1"),
                ("FAKE_TF_EXIT", &code),
                ("FAKE_TF_SLEEP_MS", "300"),
            ],
        );
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        shims.push(c.spawn().expect("spawn shim"));
    }
    let sock = init.socket();
    wait_for(SOON, "all shims to be waiting in the listen queue", || {
        (pending_connections(&sock)? >= N).then_some(())
    });
    let started = Instant::now();
    init.signal(libc::SIGCONT);
    let outputs: Vec<Output> = shims
        .into_iter()
        .map(|c| common::wait_output(c, SOON))
        .collect();
    let secs = started.elapsed().as_secs_f64();
    for (i, out) in outputs.iter().enumerate() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some((i % 100) as i32),
            "shim {i}: {stderr}"
        );
        // The -var value is redacted in logs, not in what terraform gets.
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("args: plan -var=i={i}\n"),
            "shim {i}"
        );
        assert!(!stderr.contains("directly"), "shim {i} fell back: {stderr}");
    }
    let peak = init.peak_rss_kib();
    eprintln!(
        "bad_input: {N} shims at once: all done {secs:.1}s after the init resumed; init peak RSS {before} KiB before, {peak} KiB after"
    );
    assert!(peak < 64 * 1024, "the init's peak RSS was {peak} KiB");
    let log = init.stop_cleanly();
    assert!(
        !log.contains("accept on the control socket failed"),
        "{log}"
    );
}
