//! Signals through the shim: SIGTERM and SIGINT to a shim reach terraform as exactly one SIGTERM;
//! an abandoned run gets one SIGTERM, and its process group is killed only after the stop
//! timeout or once terraform has stopped.
//!
//! The terraform shim end to end. tfinit runs as PID 1 of a PID namespace (`common::launch`); a
//! `terraform` symlink to tfinit comes first on PATH, and the real terraform 1.0.3 (.test-deps/bin)
//! or the helper's fake terraform comes after it. Shim runs are compared with direct runs of the
//! same terraform in the same environment: same stdout bytes, stderr bytes and exit code.
//!
//! The shims run in this test process, outside the PID namespace, and reach the init through its
//! socket (TFINIT_RUN_DIR): the test can then signal or SIGKILL a shim by its pid. The one test
//! about a controller killing its shim during shutdown runs the helper's `controller` (the
//! provider-terraform stand-in) as the init's child instead.
//!
//! Real-terraform tests run in both process shapes of terraform 1.0.3 (`both_shapes!`):
//! `NAME::panicwrap` (the default: a wrapper process and a wrapped child) and
//! `NAME::single_process_tf_fork_0` (TF_FORK=0). The harness is tests/common/shim.rs.

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use common::shim::*;
use common::wait_for;

all_shapes!(sigterm_and_sigint_to_the_shim_interrupt_the_apply_once_never_twice);

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

#[test]
fn an_abandoned_run_that_ignores_sigterm_has_its_group_killed_after_the_stop_timeout() {
    if !fake_available() {
        return;
    }
    let stop_timeout = Duration::from_secs(2);
    let (tmp, init, tf) = fake_setup(
        "shim-abandon-ignore",
        // The least stop timeout the default 2 s kill margin allows is 3 s: a margin of 1 s.
        &[
            ("TFINIT_STOP_TIMEOUT", "2s".to_string()),
            ("TFINIT_KILL_MARGIN", "1s".to_string()),
        ],
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
    // Logged just after the kill, which the test may see first: waited for, not read at once.
    init.wait_log("SIGKILL to what terraform left in its process group", SHORT);
    let l = init.log();
    assert!(
        !l.contains("SIGKILL to terraform's process group"),
        "terraform itself stopped: {l}"
    );
    init.stop();
}
