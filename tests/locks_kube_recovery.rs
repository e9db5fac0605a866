//! The Lease store end to end: a pod with no volume at all (TFINIT_STATE_DIR does not exist),
//! whose records go to the stand-in Kubernetes API over HTTPS with nothing set but the service
//! account (TFINIT_STORE left at `auto`), is SIGKILLed mid-apply; a replacement pod with another
//! name, on another node and with no volume either, finds the dead run's record in a Lease and
//! releases the stuck lock within TTL + 5 s. And the negative: a live pod's lock, held for two
//! TTLs, is never released by another pod that watches its heartbeat Lease. terraform with the
//! s3 backend on moto (tests/common/s3_pods.rs), the API stand-in of
//! tests/common/kube_cluster.rs.

#[macro_use]
mod common;
#[path = "common/s3_pods.rs"]
mod s3_pods;

use std::time::Duration;

use common::kube_cluster::{self, Cluster};
use common::pods::{
    apply_once, apply_until_success, attempts, now_ms, parse_rfc3339_ms, Pod, PodSpec, STEP,
};
use common::wait_for;
use s3_pods::*;
use serde_json::json;
use tfinit::kube::ROLE_RULE;

each_terraform!(a_pod_with_no_volume_killed_mid_apply_is_recovered_through_leases);

fn a_pod_with_no_volume_killed_mid_apply_is_recovered_through_leases(tf: &Terraform) {
    if !have_deps() || !kube_cluster::have_deps() {
        return;
    }
    let w = S3World::with("kube-kill", tf, S3Lock::Table);
    let c = Cluster::start("kube-kill-api");

    let mut env = c.pod_env();
    env.push(("TF_VAR_sleep", "30".into()));
    let mut pod_a = Pod::start(
        &w,
        PodSpec {
            name: "pod-a",
            uid: None,
            script: apply_once(&w.tmp.join("pod-a.out"), "-var=token=hunter2"),
            env,
        },
    );
    let rec = c.wait_in_progress("pod-a", &["null_resource.a"]);
    wait_for(STEP, "pod-a's lock in the backend", || w.held());
    assert_eq!(rec["owner"]["name"], "pod-a");
    assert!(w.records().is_empty(), "nothing written to files");
    let log = pod_a.log();
    assert!(
        log.contains("lock-owner records go to the Kubernetes API"),
        "{log}"
    );

    pod_a.kill();
    let lock = w.held().expect("the lock is stuck after the pod died");
    assert_eq!(lock["Who"], rec["who"]);

    // pod-b: another name, another node, no volume; it finds pod-a's record in its Lease and
    // watches pod-a's heartbeat Lease for pod-a's TTL before it releases anything.
    let out = w.tmp.join("pod-b.out");
    let mut env = c.pod_env();
    env.push(("TF_VAR_sleep", "0".into()));
    let b_started = now_ms();
    let mut pod_b = Pod::start_on_other_node(
        &w,
        PodSpec {
            name: "pod-b",
            uid: None,
            script: apply_until_success(&out, 30),
            env,
        },
        "00000000-0000-4000-8000-00000000000b",
    );
    let st = pod_b.wait();
    let log = pod_b.log();
    assert!(st.success(), "pod-b never succeeded: {log}");
    let tries = attempts(&out);
    let ok = tries.last().unwrap();
    assert!(ok.ok, "{tries:?}");
    // When the lock was released: the stamp of pod-b's force-unlock line (the apply that follows
    // in the same attempt is terraform's time, not the recovery's).
    let released = log
        .lines()
        .find(|l| l.contains("force-unlocked"))
        .and_then(|l| l.split_whitespace().next())
        .map(parse_rfc3339_ms)
        .unwrap_or_else(|| panic!("pod-b force-unlocked the lock: {log}"));
    let ttl = TTL.as_millis() as u64;
    eprintln!(
        "{}: released {} ms after pod-b started (TTL {ttl} ms)",
        tf.version(),
        released.saturating_sub(b_started)
    );
    assert!(
        released >= b_started + ttl,
        "released before pod-b could know pod-a dead: {} ms after pod-b started; {tries:?}",
        released.saturating_sub(b_started)
    );
    let within = Duration::from_secs(5).as_millis() as u64;
    assert!(
        released <= b_started + ttl + within,
        "not recovered within TTL + 5 s: {} ms after pod-b started; {tries:?}\n{log}",
        released - b_started
    );
    assert!(w.held().is_none(), "the lock is released");
    assert!(
        c.record_leases().is_empty(),
        "the dead run's record is resolved"
    );
}

#[test]
fn a_live_pods_lock_is_never_released_by_another_pod_watching_its_heartbeat_lease() {
    if !have_deps() || !kube_cluster::have_deps() {
        return;
    }
    let w = S3World::new("kube-live");
    let c = Cluster::start("kube-live-api");
    // pod-a's apply lasts two TTLs: only its heartbeat Lease tells pod-b that it is alive.
    let a_out = w.tmp.join("pod-a.out");
    let mut env = c.pod_env();
    env.push(("TF_VAR_sleep", (2 * TTL.as_secs()).to_string()));
    let mut pod_a = Pod::start(
        &w,
        PodSpec {
            name: "pod-a",
            uid: None,
            script: apply_once(&a_out, ""),
            env,
        },
    );
    let lock = wait_for(STEP, "pod-a's lock", || w.held());
    wait_for(STEP, "pod-a's record Lease", || c.record_leases().pop());
    let b_out = w.tmp.join("pod-b.out");
    let mut env = c.pod_env();
    env.push(("TF_VAR_sleep", "0".into()));
    let mut pod_b = Pod::start_on_other_node(
        &w,
        PodSpec {
            name: "pod-b",
            uid: None,
            script: apply_until_success(&b_out, 30),
            env,
        },
        "00000000-0000-4000-8000-00000000000b",
    );
    assert!(pod_a.wait().success(), "{}", pod_a.log());
    let a_done: Vec<u64> = common::read(&a_out)
        .lines()
        .filter_map(|l| l.strip_prefix("done 0 ").map(|t| t.trim().parse().unwrap()))
        .collect();
    assert_eq!(
        a_done.len(),
        1,
        "pod-a's apply succeeded: {}",
        common::read(&a_out)
    );
    assert!(pod_b.wait().success(), "{}", pod_b.log());
    let tries = attempts(&b_out);
    assert!(
        tries.iter().any(|t| !t.ok),
        "pod-b overlapped pod-a's apply: {tries:?}"
    );
    for t in tries.iter().filter(|t| t.end < a_done[0]) {
        assert!(
            !t.ok,
            "attempt {} succeeded during pod-a's apply: {tries:?}",
            t.n
        );
    }
    assert!(tries.last().unwrap().ok);
    let log = pod_b.log();
    assert!(!log.contains("force-unlock"), "{log}");
    assert!(
        !common::read(&a_out.with_extension("out.1")).contains("Error releasing the state lock"),
        "pod-a released its own lock ({})",
        lock["ID"]
    );
    assert!(c.record_leases().is_empty());
    w.assert_state_consistent();
}

/// A pod whose API server fails every list of Leases from its start (a control-plane upgrade):
/// `TFINIT_STORE=auto` picks no store yet, and what the Leases hold is unknown, not nothing. A
/// record of an earlier container of this pod may be there, so no state-locking terraform starts
/// (75, the controller retries) until the API answers; then the Leases are chosen and the apply
/// runs with its record. Before issue 24's fix the runs started without records.
#[test]
fn a_pod_whose_api_never_answered_refuses_locking_runs_until_it_answers() {
    if !have_deps() || !kube_cluster::have_deps() {
        return;
    }
    let w = S3World::new("kube-unlisted");
    let c = Cluster::start("kube-unlisted-api");
    c.api
        .faults(json!({"fail": {"list leases": {"code": 503}}}));
    let out = w.tmp.join("pod-a.out");
    let mut env = c.pod_env();
    env.push(("TF_VAR_sleep", "0".into()));
    let mut pod_a = Pod::start(
        &w,
        PodSpec {
            name: "pod-a",
            uid: None,
            script: apply_until_success(&out, 60),
            env,
        },
    );
    wait_for(
        STEP,
        "pod-a's warning that its store can neither be written nor listed",
        || {
            pod_a
                .log()
                .contains("can neither be written nor listed")
                .then_some(())
        },
    );
    // Two attempts refused before terraform started: no lock, no record.
    wait_for(STEP, "two refused attempts", || {
        (attempts(&out).len() >= 2).then_some(())
    });
    let first = common::read(&out.with_extension("out.1"));
    assert!(
        first.contains("terraform was not started") && first.contains("exit code 75"),
        "{first}"
    );
    assert!(attempts(&out).iter().all(|t| !t.ok));
    assert!(w.held().is_none(), "terraform never took its lock");
    assert!(w.records().is_empty(), "nothing written to files");
    // The API answers: the Leases are chosen, and the next attempt runs with a record.
    c.api.faults(json!({}));
    let st = pod_a.wait();
    let log = pod_a.log();
    assert!(st.success(), "pod-a never succeeded: {log}");
    assert!(
        log.contains("lock-owner records go to the Kubernetes API"),
        "{log}"
    );
    assert!(attempts(&out).last().unwrap().ok);
    assert!(!log.contains("starts without a lock-owner record"), "{log}");
    w.assert_state_consistent();
}

/// The service account's rights on Leases are removed while a pod's apply runs: every heartbeat
/// is refused (403). One error says so with the Role rule to restore, each refusal is counted in
/// `tfinit_heartbeat_write_failures_total{reason="denied"}`, and the fence stops the apply (its
/// one SIGTERM, SIGKILL at 9/10 of the TTL) before another pod could take the pod for dead.
#[test]
fn rights_removed_while_a_pod_runs_are_one_error_a_metric_and_the_fence() {
    if !have_deps() || !kube_cluster::have_deps() || !common::have_curl() {
        return;
    }
    let w = S3World::new("kube-403");
    let c = Cluster::start("kube-403-api");
    let port = common::free_port();
    let out = w.tmp.join("pod-a.out");
    let mut env = c.pod_env();
    env.push(("TF_VAR_sleep", (10 * TTL.as_secs()).to_string()));
    env.push(("TFINIT_METRICS_ADDR", format!("127.0.0.1:{port}")));
    let mut pod_a = Pod::start(
        &w,
        PodSpec {
            name: "pod-a",
            uid: None,
            // The controller lives on after the apply, so the refusals go on.
            script: format!("{}; sleep 30", apply_once(&out, "")),
            env,
        },
    );
    wait_for(STEP, "pod-a's record Lease", || c.record_leases().pop());
    wait_for(STEP, "pod-a's lock", || w.held());
    let url = format!("http://127.0.0.1:{port}/metrics");
    let denied = "tfinit_heartbeat_write_failures_total{reason=\"denied\"}";
    let (_, before) = wait_for(STEP, "the metrics", || common::curl(&url));
    assert_eq!(common::metric(&before, denied), Some(0.0), "{before}");

    c.api
        .faults(json!({"forbid": ["update leases", "create leases"]}));
    let fenced = wait_for(STEP, "the fence's graceful stop", || {
        let log = pod_a.log();
        log.contains("the heartbeat has not landed").then_some(log)
    });
    // terraform got its one SIGTERM and ended within the fence: gracefully, releasing its own
    // lock, or, when it could not finish within the TTL's last third (0.7 s at this TTL, under
    // load), SIGKILLed at 9/10 of it, its lock left for the next pod's recovery.
    assert!(
        fenced.contains("SIGTERM to terraform") && fenced.contains("(fence)"),
        "{fenced}"
    );
    wait_for(STEP, "the apply's end", || {
        common::read(&out).contains("done").then_some(())
    });
    let log = pod_a.log();
    let applied = common::read(&out.with_extension("out.1"));
    if w.held().is_some() {
        assert!(
            log.contains("are SIGKILLed now"),
            "a lock left without the fence's kill: {log}"
        );
    } else {
        assert!(applied.contains("Interrupt received"), "{applied}");
    }
    // Tried again every TTL/3: each refusal counted, the error said once.
    wait_for(STEP, "three refused heartbeats counted", || {
        let (_, text) = common::curl(&url)?;
        (common::metric(&text, denied)? >= 3.0).then_some(())
    });
    let log = pod_a.log();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("heartbeat could not be written"))
        .collect();
    assert_eq!(said.len(), 1, "one error, not one per heartbeat: {log}");
    assert!(
        said[0].contains("denied") && said[0].contains(ROLE_RULE),
        "{}",
        said[0]
    );
    pod_a.kill();
}
