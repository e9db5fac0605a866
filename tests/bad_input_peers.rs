//! Hostile or huge input from peers and terraform is refused early or relayed without buffering,
//! and a thousand shims at once all get their own answer.
//!
//! Bad input to a running init (tfinit as PID 1 of a PID namespace, as in a container): a state
//! directory that is a file, read-only or on a full disk; a regular file where the control socket
//! goes; peers sending a gibibyte of garbage; terraform printing a gibibyte without a newline;
//! a thousand shims connecting at once. Each time the init must keep working (a normal run
//! through the shim succeeds afterwards and the init exits cleanly), and its messages must name
//! the path and say what to do.
//!
//! (The TFINIT_* variables with garbage values are tests/config_errors.rs.)

mod common;
#[path = "common/helper_init.rs"]
mod helper_init;

use common::{read, wait_for, TempDir};
use helper_init::*;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use tfinit::protocol::{self, Envelope, ExitNote, Kind, Request, RunRequest};

/// A gibibyte.
const GIB: u64 = 1 << 30;

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
    let init = HelperInit::start(&tmp, Setup::default());
    let before = init.peak_rss_kib();
    // The init's request limit: it inherits this process's stack limit.
    let max = (protocol::request_limit_here() as u32).to_be_bytes();
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
    // One frame (the request limit) and what parsing it costs at most, never the gibibyte.
    assert!(
        peak < before + 24 * 1024,
        "peak RSS grew from {before} to {peak} KiB"
    );
    init.assert_runs_work(&tmp);
    init.stop_cleanly();
}

#[test]
fn a_request_carrying_too_many_descriptors_is_refused_and_every_descriptor_is_closed() {
    if !root() {
        return;
    }
    let tmp = TempDir::new("bad-many-fds");
    let init = HelperInit::start(&tmp, Setup::default());
    // Copies of one pipe's write end travel with the request: more than the init takes. Once the
    // init closed every copy it received, and ours are closed, the read end reads end of file.
    // O_CLOEXEC: processes other tests start meanwhile must not hold the write end open.
    let (pipe_r, pipe_w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK).unwrap();
    let request = Envelope {
        v: protocol::VERSION,
        request: Request::Status,
    };
    let mut frame = Vec::new();
    protocol::encode_json(Kind::Request, &request, &mut frame);
    let mut sock = UnixStream::connect(init.socket()).unwrap();
    sock.set_read_timeout(Some(SOON)).unwrap();
    let copies = vec![std::os::fd::AsRawFd::as_raw_fd(&pipe_w); tfinit::sys::MAX_FDS * 4];
    {
        use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
        let cmsg = [ControlMessage::ScmRights(&copies)];
        let iov = [std::io::IoSlice::new(&frame)];
        let sent = sendmsg::<()>(
            std::os::fd::AsRawFd::as_raw_fd(&sock),
            &iov,
            &cmsg,
            MsgFlags::empty(),
            None,
        )
        .unwrap();
        assert_eq!(sent, frame.len());
    }
    drop(pipe_w);
    let (note, _) = read_until_exit(&mut sock);
    assert_eq!(note.code, protocol::EXIT_INIT_ERROR, "{note:?}");
    assert!(
        note.error
            .as_deref()
            .is_some_and(|e| e.contains("file descriptors")),
        "the error names the descriptors: {note:?}"
    );
    wait_for(
        SOON,
        "every passed descriptor to be closed in the init",
        || {
            let mut b = [0u8; 1];
            matches!(nix::unistd::read(&pipe_r, &mut b), Ok(0)).then_some(())
        },
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
    let init = HelperInit::start(&tmp, Setup::default());
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
            workspace: None,
            cwd_id: None,
            workdir_id: None,
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
    // Signal frames of the largest size (the init's request limit: it inherits this process's
    // stack limit) whose payload is not JSON: each is read and dropped.
    let largest = protocol::request_limit_here();
    let mut garbage = Vec::with_capacity(protocol::HEADER + largest);
    protocol::encode(Kind::Signal, &vec![b'x'; largest], &mut garbage);
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
    let init = HelperInit::start(&tmp, Setup::default());
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
    let init = HelperInit::start(&tmp, Setup::default());
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
    // One deadline for all, from what the runs are asked to do: even one after the other, the
    // N runs of FAKE_TF_SLEEP_MS each end within N x 300 ms, plus SOON for the init's own work.
    // Not a per-shim window: a loaded machine delays the last shims, not the init's promise.
    let deadline = started + Duration::from_millis(N as u64 * 300) + SOON;
    let outputs: Vec<Output> = shims
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            common::wait_output_until(
                c,
                deadline,
                &format!("shim {i} of {N} (all due {N} x 300 ms + {SOON:?} after SIGCONT)"),
            )
        })
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
