//! Exit codes (the child's, 128+N, 126, 127 with the command named) and the logs (JSON lines,
//! text at the default level).
//!
//! The PID-1 core with real processes: tfinit runs as PID 1 of a new PID namespace (as in a
//! container) and as a plain child subreaper, with the test helper as its child checking from the
//! inside: zombie reaping, signal forwarding and rewriting, a clean signal state for the child,
//! exit-code relay, stragglers at exit, and the logs.

mod common;
#[path = "common/pid1_init.rs"]
mod pid1_init;

use common::TempDir;
use pid1_init::*;

#[test]
fn the_exit_code_is_the_child_s_or_128_plus_the_signal_that_killed_it() {
    for how in both() {
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
    for how in both() {
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
    for how in both() {
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

#[test]
fn json_logs_are_one_object_per_line_and_show_signals_and_exits_at_debug() {
    if !common::can_unshare() {
        return;
    }
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
