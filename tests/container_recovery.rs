//! A container killed mid-apply leaves a lock the next container on the same state volume
//! recovers.
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
use std::time::{Duration, Instant};

#[test]
fn a_container_killed_mid_apply_leaves_a_lock_that_the_next_container_on_the_same_state_volume_recovers(
) {
    let _serial = serial();
    if !have_docker() || !have_scenario_deps() {
        return;
    }
    let ws = Workspace::new("recover");
    // A dead owner is one whose heartbeat is older than the TTL. 6 s, not less: the first
    // container must keep its lock until it is killed, and an owner whose heartbeat has not landed
    // for 2/3 of the TTL stops its runs (the fence). With 3 s, a CI-like run at load 5-14 saw the
    // state volume's heartbeat not land for 2 s (fsync behind the builds' writes), the fence
    // stopped the apply and its lock was released before the kill.
    let ttl = ("TFINIT_OWNER_TTL", "6s");
    let first_host = "tfinit-test-pod-old";
    let first = start_apply(
        &ws,
        "recover-old",
        first_host,
        &[ttl, ("TF_VAR_sleep", "120")],
    );
    let held = ws.moto.locks(&ws.key).remove(0);
    assert_eq!(
        held["Who"],
        format!("@{first_host}"),
        "uid 2000 has no passwd entry: Who is @hostname"
    );
    assert_eq!(
        ws.records().len(),
        1,
        "the run has a lock-owner record on the state volume"
    );

    first.kill();

    assert_eq!(
        ws.moto.locks(&ws.key),
        vec![held.clone()],
        "SIGKILL of the whole container leaves the lock behind"
    );
    assert_eq!(ws.records().len(), 1, "and the record with it");
    drop(first);

    // A replacement pod: another hostname, the same workspace and state volume, a quick creation.
    let second = Container::run(
        "recover-new",
        tfinit_image(),
        "tfinit-test-pod-new",
        &ws.state_dir.0,
        &ws.env(&[ttl, ("TF_VAR_sleep", "1")]),
    );
    let t0 = Instant::now();
    second.wait_log("provider: reconciled", Duration::from_secs(120));
    eprintln!(
        "measured: the replacement container reconciled {:?} after it started (TFINIT_OWNER_TTL=6s)",
        t0.elapsed()
    );

    let logs = second.logs();
    let id = held["ID"].as_str().expect("a lock ID");
    assert!(
        logs.lines()
            .any(|l| l.contains("force-unlocked its state lock") && l.contains(id)),
        "tfinit released exactly the dead owner's lock {id}:\n{logs}"
    );
    assert!(
        logs.contains("Apply complete! Resources: 1 added"),
        "the workspace reconciled:\n{logs}"
    );
    assert_eq!(
        ws.moto.locks(&ws.key),
        Vec::<Value>::new(),
        "no lock is left"
    );
    let inst = ws.instances();
    assert_eq!(inst.len(), 1, "the resource is in the state");
    assert!(
        inst[0].get("status").is_none(),
        "created by the new pod, not tainted: {inst:?}"
    );
    assert_eq!(
        ws.records(),
        Vec::<PathBuf>::new(),
        "the dead owner's record is gone"
    );
}
