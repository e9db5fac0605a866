//! The child's signal state: no signal blocked or ignored, whatever tfinit inherited (scripts/test.sh
//! runs this file once more under nohup); the init blocks the signals it reads.
//!
//! The PID-1 core with real processes: tfinit runs as PID 1 of a new PID namespace (as in a
//! container) and as a plain child subreaper, with the test helper as its child checking from the
//! inside: zombie reaping, signal forwarding and rewriting, a clean signal state for the child,
//! exit-code relay, stragglers at exit, and the logs.

mod common;
#[path = "common/pid1_init.rs"]
mod pid1_init;

use common::{helper, wait_for, TempDir};
use pid1_init::*;
use std::process::Command;

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
    for how in both() {
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
    // so the helper does see ignored signals when there are some. The control starts from
    // default dispositions, so that exactly those two are ignored whatever this test inherited
    // (under nohup, SIGHUP is ignored too).
    let mut direct = Command::new("sh");
    direct.args(["-c", TRAP]).arg(helper()).arg("mask");
    common::default_signals(&mut direct);
    let out = common::run_output(&mut direct, SOON);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("SigIgn:\t0000000000000006"), "{stdout}");

    for how in both() {
        let tmp = TempDir::new("mask-trap");
        // The same shell start in front of tfinit: it inherits SIGINT and SIGQUIT ignored.
        let mut l = launch(how, &tmp, &[os("--"), helper_arg(), os("mask")]);
        l.prelude = Some("trap '' INT QUIT".into());
        let done = start_launch(l).wait(SOON);
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
