//! The init's control socket against malformed clients. Raw UnixStream peers send garbage, an
//! unknown frame kind, an oversized length, bad JSON, a wrong version, a Signal frame before any
//! Request, 1 GiB of stream garbage, or start a run and disconnect. Each gets an error reply
//! (an `X` frame with code 125 and an error, then the end of the stream); the init (PID 1 of a
//! PID namespace) keeps serving a normal terraform run afterwards and never crashes.
//!
//! The frames are written by hand, from docs/protocol.md: one kind byte, a 4-byte big-endian
//! length, the payload.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use common::{wait_for, TempDir};

const TIMEOUT: Duration = Duration::from_secs(20);

/// tfinit as PID 1 (the shim tests' [`common::shim::ShimInit`]: a controller that waits for SIGTERM,
/// its log collected) in a temp dir of its own.
struct ProtocolInit {
    init: common::shim::ShimInit,
    tmp: TempDir,
}

impl ProtocolInit {
    fn start(name: &str) -> ProtocolInit {
        let tmp = TempDir::new(name);
        let init = common::shim::ShimInit::start(&tmp, &tmp.0, &[], None);
        ProtocolInit { init, tmp }
    }

    fn socket(&self) -> PathBuf {
        tfinit::config::socket_path(&self.init.run_dir)
    }

    fn log(&self) -> String {
        self.init.log()
    }

    fn connect(&self) -> UnixStream {
        let s = UnixStream::connect(self.socket()).expect("connect to the control socket");
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        s.set_write_timeout(Some(TIMEOUT)).unwrap();
        s
    }

    /// `tfinit status`, parsed (within the harness's deadline).
    fn status(&self) -> Result<Value, String> {
        self.init
            .try_status()
            .ok_or_else(|| format!("`tfinit status` failed; the init's log:\n{}", self.log()))
    }

    /// The init still runs and a normal terraform run through the shim works end to end.
    fn assert_serves(&self, after: &str) {
        assert!(
            std::fs::metadata(format!("/proc/{}", self.init.pid)).is_ok(),
            "after {after}: the init is gone\n{}",
            self.log()
        );
        let shim_dir = common::shim_dir(&self.tmp);
        let fake_dir = common::fake_terraform_dir(&self.tmp);
        let out = common::run_output(
            common::scrub(&mut Command::new(shim_dir.join("terraform")))
                .args(["plan", "-input=false"])
                .current_dir(&self.tmp.0)
                .env("PATH", common::path_with(&[&shim_dir, &fake_dir]))
                .env("TFINIT_RUN_DIR", self.tmp.join("run"))
                .env("FAKE_TF_ECHO", "1")
                .env("FAKE_TF_EXIT", "2")
                .stdin(Stdio::null()),
            TIMEOUT,
        );
        assert_eq!(
            out.status.code(),
            Some(2),
            "after {after}: a normal run fails: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "args: plan -input=false\n"
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            format!("cwd: {}\n", self.tmp.0.display())
        );
        let st = self.status().expect("status answers");
        assert_eq!(st["phase"], "running", "after {after}");
    }

    /// SIGTERM; the init must exit 0 without having panicked.
    fn stop(self) {
        self.init.stop()
    }

    /// The init's peak resident memory, in KiB.
    fn peak_rss_kib(&self) -> u64 {
        self.init.peak_rss_kib()
    }
}

fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![kind];
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Reads frames until the init closes the stream (a read timeout fails the test).
fn frames_until_closed(s: &mut UnixStream) -> Vec<(u8, Vec<u8>)> {
    let mut all = Vec::new();
    if let Err(e) = s.read_to_end(&mut all) {
        // The peer may reset a connection we were still writing to; what came before counts.
        assert!(
            e.kind() == std::io::ErrorKind::ConnectionReset,
            "the init neither answered nor closed the connection: {e}"
        );
    }
    let mut frames = Vec::new();
    let mut rest = all.as_slice();
    while rest.len() >= 5 {
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        assert!(rest.len() >= 5 + len, "a truncated frame from the init");
        frames.push((rest[0], rest[5..5 + len].to_vec()));
        rest = &rest[5 + len..];
    }
    assert!(rest.is_empty(), "trailing bytes from the init: {rest:?}");
    frames
}

/// Asserts the init answered with exactly one error `X` frame (code 125) mentioning `expect`,
/// then closed.
fn assert_error_reply(frames: &[(u8, Vec<u8>)], expect: &str) {
    assert_eq!(frames.len(), 1, "one frame, then the end: {frames:?}");
    let (kind, payload) = &frames[0];
    assert_eq!(*kind, b'X', "an exit frame");
    let note: Value = serde_json::from_slice(payload).expect("JSON exit note");
    assert_eq!(note["code"], 125, "{note}");
    let err = note["error"].as_str().unwrap_or_default();
    assert!(
        err.contains(expect),
        "error {err:?} should mention {expect:?}"
    );
}

/// Sends `bytes` on a fresh connection and returns what came back.
fn exchange(init: &ProtocolInit, bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut s = init.connect();
    // The init may close as soon as it has seen enough: a failed write is not the test's concern.
    let _ = s.write_all(bytes);
    frames_until_closed(&mut s)
}

#[test]
fn malformed_frames_get_an_error_reply_and_the_init_keeps_serving() {
    if !common::can_unshare() {
        return;
    }
    let init = ProtocolInit::start("proto-malformed");
    // The init inherits this process's stack limit, and with it the same request limit.
    let limit = tfinit::protocol::request_limit_here() as u32;
    let request = |v: Value| frame(b'R', v.to_string().as_bytes());
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "text garbage",
            b"hello, is this the init?\n".to_vec(),
            "unknown frame kind byte 0x68",
        ),
        (
            "an unknown frame kind",
            frame(b'Z', b"{}"),
            "unknown frame kind byte 0x5a",
        ),
        (
            "an oversized length",
            vec![b'R', 0xff, 0xff, 0xff, 0xff],
            "over the limit",
        ),
        (
            "a length just over the limit (what exec(2) takes here, plus 64 KiB)",
            [&[b'R'][..], &(limit + 1).to_be_bytes()].concat(),
            "over the limit",
        ),
        (
            "a request that is not JSON",
            frame(b'R', b"{\"v\":1,\"op\":"),
            "malformed request",
        ),
        (
            "a request of an unknown op",
            request(json!({"v": 1, "op": "format_disk"})),
            "malformed request",
        ),
        (
            "a request without a version",
            request(json!({"op": "status"})),
            "malformed request",
        ),
        (
            "a wrong version",
            request(json!({"v": 99, "op": "status"})),
            "protocol version 99 is not supported",
        ),
        (
            "a Signal frame before a Request",
            frame(b'S', br#"{"signal":15}"#),
            "unexpected Signal frame",
        ),
        (
            "a frame kind only the init sends",
            frame(b'O', b"output"),
            "unexpected Stdout frame",
        ),
        (
            "a run with a relative program",
            request(
                json!({"v": 1, "op": "run", "program": "terraform", "argv0": "terraform",
                "args": [], "cwd": "/", "env": []}),
            ),
            "not an absolute path",
        ),
        (
            "a run with a relative cwd",
            request(
                json!({"v": 1, "op": "run", "program": "/bin/true", "argv0": "terraform",
                "args": [], "cwd": "tf", "env": []}),
            ),
            "not an absolute path",
        ),
        (
            "a run with an empty argv0",
            request(
                json!({"v": 1, "op": "run", "program": "/bin/true", "argv0": "",
                "args": [], "cwd": "/", "env": []}),
            ),
            "argv0 is empty",
        ),
    ];
    for (what, bytes, expect) in cases {
        let frames = exchange(&init, &bytes);
        assert_error_reply(&frames, expect);
        init.assert_serves(what);
    }
    // Only the 13 normal runs started anything.
    assert_eq!(init.log().matches("terraform started").count(), 13);
    init.stop();
}

#[test]
fn a_valid_request_sent_one_byte_at_a_time_is_answered() {
    if !common::can_unshare() {
        return;
    }
    let init = ProtocolInit::start("proto-drip");
    let mut s = init.connect();
    for b in frame(b'R', br#"{"v":1,"op":"status"}"#) {
        s.write_all(&[b]).unwrap();
    }
    let frames = frames_until_closed(&mut s);
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].0, b'J', "a reply frame");
    let reply: Value = serde_json::from_slice(&frames[0].1).unwrap();
    assert_eq!(reply["ok"], true);
    assert_eq!(reply["status"]["pid"], 1);
    init.assert_serves("a request in 27 writes");
    init.stop();
}

#[test]
fn a_gibibyte_of_stream_garbage_is_cut_off_early_without_growing_the_init() {
    if !common::can_unshare() {
        return;
    }
    let init = ProtocolInit::start("proto-gib");
    let before = init.peak_rss_kib();
    // No frame at all; then a maximal frame header (the init's limit: it inherits this
    // process's stack limit) followed by an endless body.
    let limit = tfinit::protocol::request_limit_here() as u32;
    let headers: [(&str, Vec<u8>, &str); 2] = [
        (
            "bytes that are no frame",
            Vec::new(),
            "unknown frame kind byte 0x2a",
        ),
        (
            "a request of the largest size followed by more",
            [&[b'R'][..], &limit.to_be_bytes()].concat(),
            "malformed request",
        ),
    ];
    for (what, header, expect) in headers {
        let mut s = init.connect();
        let writer = s.try_clone().unwrap();
        let sent = std::thread::spawn(move || {
            let mut w = writer;
            let chunk = vec![b'*'; 1 << 20];
            let mut sent = header.len() as u64;
            if w.write_all(&header).is_err() {
                return sent;
            }
            while sent < 1 << 30 {
                if w.write_all(&chunk).is_err() {
                    break;
                }
                sent += chunk.len() as u64;
            }
            sent
        });
        let frames = frames_until_closed(&mut s);
        let sent = sent.join().unwrap();
        assert_error_reply(&frames, expect);
        assert!(
            sent < 64 << 20,
            "{what}: the init read {sent} bytes before closing the connection"
        );
        init.assert_serves(what);
    }
    let after = init.peak_rss_kib();
    assert!(
        after < before + 64 * 1024,
        "peak RSS grew from {before} KiB to {after} KiB"
    );
    init.stop();
}

#[test]
fn a_client_that_starts_a_run_and_disconnects_abandons_it_and_the_run_is_stopped() {
    if !common::can_unshare() {
        return;
    }
    let init = ProtocolInit::start("proto-disconnect");
    let fake = common::fake_terraform_dir(&init.tmp).join("terraform");
    let log = init.tmp.join("fake.log");
    let req = json!({
        "v": 1, "op": "run",
        "program": fake.display().to_string(), "argv0": "terraform",
        "args": ["apply", "-auto-approve"], "cwd": init.tmp.0.display().to_string(),
        "env": [
            format!("FAKE_TF_LOG={}", log.display()),
            "FAKE_TF_ON_TERM=graceful", "FAKE_TF_SLEEP_MS=120000", "FAKE_TF_STOP_MS=0"
        ],
    });
    {
        let mut s = init.connect();
        s.write_all(&frame(b'R', req.to_string().as_bytes()))
            .unwrap();
        // Wait until terraform runs, then hang up without reading anything.
        wait_for(TIMEOUT, "the fake terraform to start", || {
            common::read(&log).starts_with("pid ").then_some(())
        });
    }
    wait_for(TIMEOUT, "the abandoned run to end", || {
        let st = init.status().ok()?;
        st["runs"].as_array()?.is_empty().then_some(())
    });
    let l = init.log();
    assert!(
        l.contains("the shim is gone; terraform keeps running"),
        "{l}"
    );
    assert_eq!(l.matches("SIGTERM to terraform").count(), 1, "{l}");
    assert!(common::read(&log).contains("stopped-gracefully"));

    // A status request whose client hangs up before the reply can be written.
    for _ in 0..50 {
        let mut s = init.connect();
        s.write_all(&frame(b'R', br#"{"v":1,"op":"status"}"#))
            .unwrap();
        drop(s);
    }
    // Connections that send nothing at all.
    let idle: Vec<UnixStream> = (0..200).map(|_| init.connect()).collect();
    drop(idle);
    init.assert_serves("clients that hang up");
    init.stop();
}

#[test]
fn a_second_request_on_a_run_connection_ends_the_connection_not_the_run() {
    if !common::can_unshare() {
        return;
    }
    let init = ProtocolInit::start("proto-second");
    let fake = common::fake_terraform_dir(&init.tmp).join("terraform");
    let log = init.tmp.join("fake.log");
    let req = json!({
        "v": 1, "op": "run",
        "program": fake.display().to_string(), "argv0": "terraform",
        "args": ["plan"], "cwd": init.tmp.0.display().to_string(),
        "env": [
            format!("FAKE_TF_LOG={}", log.display()),
            "FAKE_TF_ON_TERM=graceful", "FAKE_TF_SLEEP_MS=120000", "FAKE_TF_STOP_MS=0"
        ],
    });
    let mut s = init.connect();
    s.write_all(&frame(b'R', req.to_string().as_bytes()))
        .unwrap();
    wait_for(TIMEOUT, "the fake terraform to start", || {
        common::read(&log).starts_with("pid ").then_some(())
    });
    // A malformed Signal note mid-run is ignored; a second Request is a protocol error.
    s.write_all(&frame(b'S', b"not json")).unwrap();
    s.write_all(&frame(b'R', br#"{"v":1,"op":"status"}"#))
        .unwrap();
    let frames = frames_until_closed(&mut s);
    assert!(
        frames.iter().all(|(k, _)| *k == b'O' || *k == b'E'),
        "no exit note for a run that was cut off: {frames:?}"
    );
    // The connection is gone, so the run is abandoned like any other: one SIGTERM.
    wait_for(TIMEOUT, "the run to end", || {
        let st = init.status().ok()?;
        st["runs"].as_array()?.is_empty().then_some(())
    });
    assert!(common::read(&log).contains("stopped-gracefully"));
    init.assert_serves("a second request mid-run");
    init.stop();
}
