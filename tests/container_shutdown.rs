//! `docker stop` of a container mid-apply: the apply completes within the grace period, or
//! terraform is stopped gracefully before Docker's SIGKILL.
//!
//! tfinit in a real container runtime (Docker), as users adopt it: the image is built with the
//! repository's Dockerfile (through scripts/build-image.sh) on top of a FROM-scratch stand-in for a
//! provider-terraform image (busybox, terraform 1.0.3, the null provider, and a controller stand-in
//! that runs terraform from PATH and SIGKILLs it when SIGTERM cancels its context). State and lock
//! live on a moto server on the host (host network). Checked from the outside: `docker stop` and
//! `docker kill` timings and exit codes, the lock table, the state, the lock-owner records on the
//! state volume, and the container's logs.
//!
//! Without a Docker engine every test here says so in one line and passes (set
//! TFINIT_REQUIRE_DOCKER=1 to make that a failure). Containers and images are named `tfinit-test-*`
//! with this process's pid, removed when a test ends (containers) or the test binary exits
//! (images), and left-overs of test processes that died are removed at the next run.

mod common;
#[path = "common/docker.rs"]
mod docker;

use docker::*;
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

#[test]
fn docker_stop_during_a_slow_apply_lets_the_apply_complete_and_exits_early_with_the_controllers_code(
) {
    let _serial = serial();
    if !have_docker() || !have_scenario_deps() {
        return;
    }
    let ws = Workspace::new("complete");
    // Default budget: 30 s grace, terraform's SIGTERM at 20 s. The creation takes 12 s.
    let c = start_apply(
        &ws,
        "complete",
        "tfinit-test-pod-complete",
        &[("TF_VAR_sleep", "12")],
    );

    let took = c.stop(30);
    eprintln!("measured: docker stop -t 30 during the apply took {took:?}");

    let logs = c.logs();
    assert_eq!(
        c.exit_code(),
        CONTROLLER_EXIT,
        "the controller's exit code is relayed"
    );
    assert!(
        took < Duration::from_secs(20),
        "the container exits once the apply is done, long before the 30 s timeout: took {took:?}"
    );
    assert!(
        logs.contains("provider: SIGKILL to pid"),
        "the controller killed its terraform (the shim)"
    );
    assert!(
        logs.contains("Apply complete! Resources: 1 added"),
        "the apply completed:\n{logs}"
    );
    assert!(
        !logs.contains("Interrupt received"),
        "terraform must not be interrupted:\n{logs}"
    );
    assert!(
        !logs.contains("SIGKILL to terraform"),
        "terraform must not be killed:\n{logs}"
    );
    assert_eq!(
        ws.moto.locks(&ws.key),
        Vec::<Value>::new(),
        "no lock is left"
    );
    let inst = ws.instances();
    assert_eq!(inst.len(), 1, "the resource is in the state");
    assert!(inst[0].get("status").is_none(), "and not tainted: {inst:?}");
    assert_eq!(
        ws.records(),
        Vec::<PathBuf>::new(),
        "the lock-owner record is removed"
    );
}

#[test]
fn docker_stop_with_a_short_timeout_stops_terraform_gracefully_before_dockers_sigkill() {
    let _serial = serial();
    if !have_docker() || !have_scenario_deps() {
        return;
    }
    let ws = Workspace::new("graceful");
    // The budget of `docker stop -t 8`: terraform's SIGTERM at 8 - 5 = 3 s, SIGKILL at 7 s. The
    // creation would take 2 minutes.
    let c = start_apply(
        &ws,
        "graceful",
        "tfinit-test-pod-graceful",
        &[
            ("TF_VAR_sleep", "120"),
            ("TFINIT_GRACE_PERIOD", "8s"),
            ("TFINIT_STOP_TIMEOUT", "5s"),
            ("TFINIT_KILL_MARGIN", "1s"),
        ],
    );

    let took = c.stop(8);
    eprintln!("measured: docker stop -t 8 during the apply took {took:?}");

    let logs = c.logs();
    assert_eq!(
        c.exit_code(),
        CONTROLLER_EXIT,
        "tfinit exits with the controller's code, not Docker's SIGKILL (137):\n{logs}"
    );
    assert!(
        took < Duration::from_secs(8),
        "the container exits before Docker's SIGKILL: took {took:?}"
    );
    assert!(
        took >= Duration::from_millis(2500),
        "terraform is left alone until its step 3 s into the stop, not stopped at once: took {took:?}"
    );
    assert!(
        logs.contains("SIGTERM to terraform (graceful stop"),
        "tfinit asked terraform to stop:\n{logs}"
    );
    assert!(
        logs.contains("Interrupt received"),
        "terraform stopped gracefully:\n{logs}"
    );
    assert!(
        !logs.contains("Two interrupts received"),
        "terraform got exactly one interrupt:\n{logs}"
    );
    assert!(
        !logs.contains("SIGKILL to terraform"),
        "terraform must not be killed:\n{logs}"
    );
    assert_eq!(
        ws.moto.locks(&ws.key),
        Vec::<Value>::new(),
        "no lock is left"
    );
    assert!(
        logs.lines().any(|l| l.contains("terraform exited")
            && l.contains("subcommand=apply")
            && l.contains("exit=exit code 1")),
        "terraform exited by itself after the interrupt (exit code 1, not a signal):\n{logs}"
    );
    assert_eq!(
        ws.records(),
        Vec::<PathBuf>::new(),
        "terraform exited by itself: no record is kept"
    );
}
