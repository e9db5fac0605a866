//! The Lease store on terraform's `kubernetes` backend (provider-terraform's default: the state in
//! a Secret, the lock in a Lease), end to end, on terraform 1.0.3 (panicwrap) and the modern one
//! (`each_terraform!`). Pods have no volume at all (TFINIT_STATE_DIR does not exist) and nothing
//! set but the service account (TFINIT_STORE left at `auto`): their records go to Leases of the
//! HTTPS stand-in (tests/common/kube_cluster.rs), terraform's backend to its admin port (plain
//! http, never faulted: tests/common/kube_pods.rs says why).
//!
//! - A pod SIGKILLed mid-apply is recovered by a replacement with another name, on another node,
//!   within TTL + 5 s of the kill; a live pod's lock, held for two TTLs, is never released.
//! - A rolling update: the new pod starts while the old one applies; the old one gets SIGTERM and
//!   its grace, its terraform releases its own lock; nothing is force-unlocked, and the new pod's
//!   runs go on once the lock is free.
//! - `tfinit recover` by hand, inside a live pod's container with its service account: it
//!   releases a dead pod's lock and leaves the live pod's alone.
//! - The rights on Leases removed mid-apply (the stand-in answers 403 from then on, to every verb
//!   or to updates only): the owner's heartbeat cannot land, the owner's fence stops its run, and
//!   no other pod releases the run's lock while the run lives, not even one that can still read
//!   the records and watch the heartbeat stop.

#[macro_use]
mod common;
#[path = "common/kube_pods.rs"]
mod kube_pods;

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::{json, Value};

use common::kube_cluster;
use common::pods::{
    self, apply_once, apply_until_success, attempts, now_ms, parse_rfc3339_ms, text,
    wrapped_terraform, Pod, PodSpec, RETRY, STEP,
};
use common::terraform::Terraform;
use common::wait_for;
use kube_pods::{KubeWorld, TTL};

each_terraform!(a_pod_with_no_volume_killed_mid_apply_is_recovered_through_leases);
each_terraform!(a_live_pods_lock_is_never_released_through_leases);
each_terraform!(a_rolling_update_releases_no_lock_while_the_old_pod_lives);

/// The boot id of the node the replacement pods run on.
const OTHER_NODE: &str = "00000000-0000-4000-8000-00000000000b";

/// Whether everything these tests need is here.
fn have_deps() -> bool {
    kube_pods::have_deps() && kube_cluster::have_deps()
}

/// A world of terraform 1.0.3 in a cluster, with `workspaces`; None (a SKIP line) without the
/// dependencies.
fn legacy_world(name: &str, workspaces: &[&str]) -> Option<KubeWorld> {
    if !have_deps() {
        return None;
    }
    let tf = Terraform::legacy()?;
    Some(KubeWorld::in_cluster(name, &tf, workspaces))
}

/// A pod of `w` in its cluster, with the service account and `env`, running `script`; on another
/// node when `other_node`.
fn pod(
    w: &KubeWorld,
    name: &str,
    script: String,
    env: &[(&'static str, String)],
    other_node: bool,
) -> Pod {
    let spec = PodSpec {
        name,
        uid: None,
        script,
        env: [w.cluster().pod_env(), env.to_vec()].concat(),
    };
    if other_node {
        Pod::start_on_other_node(w, spec, OTHER_NODE)
    } else {
        Pod::start(w, spec)
    }
}

/// The stamp of the first line of `log` that contains `what`, ms since the epoch.
fn stamp_of(log: &str, what: &str) -> Option<u64> {
    log.lines()
        .find(|l| l.contains(what))
        .and_then(|l| l.split_whitespace().next())
        .map(parse_rfc3339_ms)
}

/// Starts pod-a's apply (`sleep` seconds in null_resource.a; then its controller runs `then`) and
/// waits until its record Lease shows null_resource.a in progress and terraform holds the Lease
/// lock; returns the pod, the record and the lock.
fn pod_a_mid_apply(
    w: &KubeWorld,
    sleep: u64,
    env: &[(&'static str, String)],
    then: &str,
) -> (Pod, Value, Value) {
    let c = w.cluster();
    let env = [
        vec![
            ("TF_VAR_sleep", sleep.to_string()),
            ("TF_WORKSPACE", "default".to_string()),
        ],
        env.to_vec(),
    ]
    .concat();
    let pod_a = pod(
        w,
        "pod-a",
        format!("{}{then}", apply_once(&w.tmp.join("pod-a.out"), "")),
        &env,
        false,
    );
    let rec = c.wait_in_progress("pod-a", &["null_resource.a"]);
    let lock = wait_for(STEP, "pod-a's lock in terraform's Lease", || {
        w.api().lock("default")
    });
    assert_eq!(rec["owner"]["name"], "pod-a");
    assert_eq!(lock["Who"], rec["who"], "the record names the lock's Who");
    assert!(w.records().is_empty(), "nothing written to files");
    let log = pod_a.log();
    assert!(
        log.contains("lock-owner records go to the Kubernetes API"),
        "{log}"
    );
    (pod_a, rec, lock)
}

fn a_pod_with_no_volume_killed_mid_apply_is_recovered_through_leases(tf: &Terraform) {
    if !have_deps() {
        return;
    }
    let w = KubeWorld::in_cluster("kl-kill", tf, &[]);
    let (mut pod_a, _, lock) = pod_a_mid_apply(&w, 30, &[], "");
    assert_eq!(
        wrapped_terraform(&w.ws).is_some(),
        tf.panicwrap(),
        "the shape under test runs"
    );
    let killed = now_ms();
    pod_a.kill();
    assert_eq!(
        w.api().lock("default"),
        Some(lock.clone()),
        "stuck after the kill"
    );

    // pod-b: another name, another node, no volume; only pod-a's heartbeat Lease can tell it
    // that pod-a is dead, after watching it unchanged for pod-a's TTL.
    let out = w.tmp.join("pod-b.out");
    let b_started = now_ms();
    let env = [("TF_VAR_sleep", "0".to_string())];
    let mut pod_b = pod(&w, "pod-b", apply_until_success(&out, 30), &env, true);
    let st = pod_b.wait();
    let log = pod_b.log();
    assert!(st.success(), "pod-b never succeeded: {log}");
    let tries = attempts(&out);
    assert!(tries.last().unwrap().ok, "{tries:?}");
    // The release is the stamp of pod-b's force-unlock line, not the end of the apply after it.
    let released = stamp_of(&log, "force-unlocked")
        .unwrap_or_else(|| panic!("pod-b force-unlocked the lock: {log}"));
    assert!(log.contains(lock["ID"].as_str().unwrap()), "{log}");
    let ttl = TTL.as_millis() as u64;
    assert!(
        released >= b_started + ttl,
        "released before pod-b could know pod-a dead: {} ms after pod-b started; {tries:?}",
        released.saturating_sub(b_started)
    );
    assert!(
        released <= killed + ttl + 5_000,
        "not recovered within TTL + 5 s of the kill: {} ms; {tries:?}\n{log}",
        released - killed
    );
    assert!(
        w.cluster().record_leases().is_empty(),
        "the dead run's record is resolved"
    );
    w.assert_state_consistent("default");
}

fn a_live_pods_lock_is_never_released_through_leases(tf: &Terraform) {
    if !have_deps() {
        return;
    }
    let w = KubeWorld::in_cluster("kl-live", tf, &[]);
    // pod-a's apply lasts two TTLs and more: only its heartbeat Lease tells pod-b it is alive.
    let (mut pod_a, _, lock) = pod_a_mid_apply(&w, 2 * TTL.as_secs() + 1, &[], "");
    let b_out = w.tmp.join("pod-b.out");
    let env = [("TF_VAR_sleep", "0".to_string())];
    let mut pod_b = pod(&w, "pod-b", apply_until_success(&b_out, 30), &env, true);
    let a_out = w.tmp.join("pod-a.out");
    // The lock may change hands before pod-a's script writes "done": its terraform released the
    // lock and exited, and pod-b's next attempt took it (a CI-like run under load 33 saw that by
    // 9 s). Whether it changed hands while pod-a's terraform still held it is what the checks
    // after the loop decide: pod-a's terraform released its own lock without an error (a lock
    // force-unlocked under it would fail its release) and pod-b's tfinit force-unlocked nothing.
    let mut changed = None;
    wait_for(STEP + 2 * TTL, "pod-a's apply to end", || {
        if let Some(now) = w.api().lock("default") {
            if now != lock && changed.is_none() && !common::read(&a_out).contains("done") {
                changed = Some(now);
            }
        }
        common::read(&a_out).contains("done").then_some(())
    });
    assert!(pod_a.wait().success(), "{}", pod_a.log());
    let a_done: u64 = common::read(&a_out)
        .strip_prefix("done 0 ")
        .unwrap_or_else(|| panic!("pod-a's apply succeeded: {}", common::read(&a_out)))
        .trim()
        .parse()
        .unwrap();
    assert!(pod_b.wait().success(), "{}", pod_b.log());
    let tries = attempts(&b_out);
    assert!(
        tries.iter().any(|t| !t.ok),
        "pod-b met pod-a's lock: {tries:?}"
    );
    for t in tries.iter().filter(|t| t.end < a_done) {
        assert!(
            !t.ok,
            "attempt {} succeeded during pod-a's apply: {tries:?}",
            t.n
        );
    }
    let log = pod_b.log();
    assert!(
        !log.contains("force-unlock"),
        "pod-b force-unlocked (the lock changed to {changed:?} before pod-a's done): {log}"
    );
    let a_attempt = common::read(&a_out.with_extension("out.1"));
    assert!(
        !a_attempt.contains("Error releasing the state lock"),
        "pod-a released its own lock (it changed to {changed:?} before pod-a's done): {a_attempt}"
    );
    assert!(w.cluster().record_leases().is_empty());
    w.assert_state_consistent("default");
}

/// The old pod's shutdown: SIGTERM, then TFINIT_GRACE_PERIOD; its runs get their SIGTERM at
/// grace − TFINIT_STOP_TIMEOUT (4 s: after pod-b met the lock) and SIGKILL at grace −
/// TFINIT_KILL_MARGIN (10 s: terraform has 6 s to stop and release its lock; it takes well under
/// one).
const GRACE: [(&str, &str); 3] = [
    ("TFINIT_GRACE_PERIOD", "12s"),
    ("TFINIT_STOP_TIMEOUT", "8s"),
    ("TFINIT_KILL_MARGIN", "2s"),
];

fn a_rolling_update_releases_no_lock_while_the_old_pod_lives(tf: &Terraform) {
    if !have_deps() {
        return;
    }
    let w = KubeWorld::in_cluster("kl-rolling", tf, &[]);
    let grace: Vec<(&'static str, String)> =
        GRACE.iter().map(|(k, v)| (*k, v.to_string())).collect();
    let (mut pod_a, _, lock) = pod_a_mid_apply(&w, 30, &grace, "");
    // The new pod starts while the old one applies (maxSurge: both run), on another node.
    let b_out = w.tmp.join("pod-b.out");
    let env = [("TF_VAR_sleep", "0".to_string())];
    let mut pod_b = pod(&w, "pod-b", apply_until_success(&b_out, 40), &env, true);
    wait_for(STEP, "pod-b to meet pod-a's lock", || {
        attempts(&b_out).first().map(|t| assert!(!t.ok, "{t:?}"))
    });
    // The old pod is deleted: SIGTERM, and its grace.
    let term = now_ms();
    pod_a.signal(Signal::SIGTERM);
    let mut freed = None;
    let deadline = Instant::now() + STEP;
    while pod_a.alive() {
        assert!(Instant::now() < deadline, "pod-a ended within its grace");
        match w.api().lock("default") {
            Some(now) if now["ID"] == lock["ID"] => {}
            Some(now) => assert!(
                freed.is_some(),
                "pod-a's lock replaced while it lived: {now}"
            ),
            None => {
                freed.get_or_insert(now_ms());
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let ended = now_ms();
    let a_log = pod_a.log();
    assert!(
        ended - term < 12_000 + 2_000,
        "pod-a ended within its grace: {} ms\n{a_log}",
        ended - term
    );
    let a_apply = common::read(&w.tmp.join("pod-a.out.1"));
    assert!(
        !a_apply.contains("Error releasing the state lock"),
        "{a_apply}"
    );
    // Its SIGTERM came at grace − STOP_TIMEOUT; it stopped before the SIGKILL at grace − KILL_MARGIN.
    let asked = stamp_of(&a_log, "SIGTERM to terraform (graceful stop")
        .unwrap_or_else(|| panic!("terraform got its graceful SIGTERM: {a_log}"));
    let exited =
        stamp_of(&a_log, "terraform exited").unwrap_or_else(|| panic!("terraform exited: {a_log}"));
    assert!(
        asked < exited && exited < term + 10_000,
        "terraform stopped within its grace: {a_log}"
    );
    assert!(pod_b.wait().success(), "{}", pod_b.log());
    let log = pod_b.log();
    assert!(
        !log.contains("force-unlock"),
        "nothing released by pod-b: {log}"
    );
    let tries = attempts(&b_out);
    let ok = tries.last().unwrap();
    assert!(ok.ok, "{tries:?}");
    let freed = freed.unwrap_or(ended);
    for t in tries.iter().filter(|t| t.end < freed) {
        assert!(
            !t.ok,
            "attempt {} succeeded while pod-a held the lock: {tries:?}",
            t.n
        );
    }
    // Its next attempt after the release: at most one failed attempt and one pause later.
    let longest_fail = tries
        .iter()
        .filter(|t| !t.ok)
        .map(|t| t.end - t.start)
        .max()
        .unwrap_or(0);
    assert!(
        ok.start <= freed + longest_fail + RETRY.as_millis() as u64 + 1_000,
        "pod-b's runs went on once pod-a released (freed {} ms, pod-b's success started {} ms after the SIGTERM): {tries:?}",
        freed - term,
        ok.start - term
    );
    assert!(w.cluster().record_leases().is_empty());
    w.assert_state_consistent("default");
}

#[test]
fn recover_by_hand_in_a_pod_releases_a_dead_pods_lock_and_leaves_a_live_pods_alone() {
    let Some(w) = legacy_world("kl-hand", &["staging"]) else {
        return;
    };
    // pod-a mid-apply in the default workspace; pod-b, on another node, mid-apply in staging for
    // the whole test (its run's recovery before it starts finds pod-a alive and leaves it).
    let (mut pod_a, _, dead_lock) = pod_a_mid_apply(&w, 30, &[], "");
    let env = [
        ("TF_VAR_sleep", "60".to_string()),
        ("TF_WORKSPACE", "staging".to_string()),
    ];
    let pod_b = pod(
        &w,
        "pod-b",
        apply_once(&w.tmp.join("pod-b.out"), ""),
        &env,
        true,
    );
    let c = w.cluster();
    c.wait_in_progress("pod-b", &["null_resource.a"]);
    let live_lock = wait_for(STEP, "pod-b's lock", || w.api().lock("staging"));
    assert_eq!(
        w.api().lock("default"),
        Some(dead_lock.clone()),
        "pod-b left pod-a's lock"
    );
    // pod-a dies; its lock is stuck.
    pod_a.kill();

    // A person runs `kubectl exec pod-b -- tfinit recover`: pod-b's namespaces, its service
    // account (the variables the kubelet gives every container), no volume.
    let sa: Vec<(&str, String)> = c.pod_env();
    let sa: Vec<(&str, &str)> = sa.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let started = Instant::now();
    let out = pods::recover_in_pod(&w, &pod_b, &[], &sa);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(
        started.elapsed() >= TTL,
        "it watched the heartbeats for a TTL before calling anyone dead: {said}"
    );
    assert!(said.contains("force-unlocked"), "{said}");
    assert!(said.contains(dead_lock["ID"].as_str().unwrap()), "{said}");
    assert!(
        !said.contains(live_lock["ID"].as_str().unwrap()),
        "pod-b's lock is not touched: {said}"
    );
    assert_eq!(
        w.api().lock("default"),
        None,
        "the dead pod's lock is released"
    );
    assert_eq!(
        w.api().lock("staging"),
        Some(live_lock),
        "the live pod's lock is kept"
    );
    let left: Vec<Value> = c.record_leases();
    assert_eq!(
        left.len(),
        1,
        "pod-a's record resolved, pod-b's kept: {left:?}"
    );
    assert_eq!(left[0]["owner"]["name"], "pod-b");
    drop(pod_b);
}

/// The rights on Leases removed mid-apply: the stand-in answers 403 to `verbs` on Leases from
/// then on (terraform's backend, on the admin port, keeps its own rights). pod-a's heartbeat
/// cannot land, so its fence stops its run (SIGTERM at 2/3 of the TTL after the last heartbeat
/// that landed, SIGKILL at 9/10) while pod-a itself lives on; pod-b, on another node from then on,
/// never releases the run's lock while the run lives.
fn rights_removed_mid_apply(name: &str, verbs: &[&str]) -> Option<(KubeWorld, Pod, String)> {
    let w = legacy_world(name, &[])?;
    let (mut pod_a, _, lock) = pod_a_mid_apply(&w, 30, &[], "; sleep 60");
    let c = w.cluster();
    let forbid: Vec<String> = verbs.iter().map(|v| format!("{v} leases")).collect();
    c.api.faults(json!({ "forbid": forbid }));
    let removed = now_ms();
    let b_out = w.tmp.join("pod-b.out");
    let env = [("TF_VAR_sleep", "0".to_string())];
    let mut pod_b = pod(&w, "pod-b", apply_until_success(&b_out, 40), &env, true);
    let a_out = w.tmp.join("pod-a.out");
    wait_for(TTL * 4, "the fence to stop pod-a's run", || {
        if !common::read(&a_out).contains("done") {
            // pod-a's own lock, or none once its terraform released it on the way out; pod-b's
            // only after pod-a's terraform exited, as the stamps checked below allow.
            pod_a.assert_its_lock_while_it_runs(w.api().lock("default"), &lock);
            return None;
        }
        Some(())
    });
    assert!(pod_a.alive(), "pod-a lives on: {}", pod_a.log());
    let a_log = pod_a.log();
    assert!(
        a_log.contains("the heartbeat did not land (fence)"),
        "the fence stopped the run: {a_log}"
    );
    let exited = stamp_of(&a_log, "terraform exited")
        .unwrap_or_else(|| panic!("pod-a's terraform exited: {a_log}"));
    assert!(
        exited <= removed + TTL.as_millis() as u64 + 1_000,
        "the fence stopped the run {} ms after the rights went",
        exited.saturating_sub(removed)
    );
    assert!(
        !common::read(&a_out).starts_with("done 0 "),
        "the fenced apply did not succeed"
    );
    // The rights come back; pod-b's runs go on. A lock it force-unlocked was released after the
    // run that held it had ended.
    c.api.faults(json!({}));
    assert!(pod_b.wait().success(), "{}", pod_b.log());
    let log = pod_b.log();
    if let Some(at) = stamp_of(&log, "force-unlocked") {
        assert!(
            at > exited,
            "pod-b released pod-a's lock while pod-a's run lived: {log}"
        );
    }
    w.assert_state_consistent("default");
    Some((w, pod_a, log))
}

#[test]
fn rights_on_leases_removed_mid_apply_fence_the_run_and_no_pod_releases_its_lock() {
    let verbs = ["get", "list", "create", "update", "delete", "patch"];
    let Some((_w, pod_a, _)) = rights_removed_mid_apply("kl-403", &verbs) else {
        return;
    };
    // The heartbeat's failure is one error naming the Role rule that would let it land.
    let log = pod_a.log();
    let said: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("heartbeat could not be written"))
        .collect();
    assert_eq!(said.len(), 1, "said once: {log}");
    assert!(
        said[0].contains("403 Forbidden") && said[0].contains(tfinit::kube::ROLE_RULE),
        "{}",
        said[0]
    );
}

/// Only updates forbidden: pod-b still lists and reads every Lease, so it sees pod-a's record and
/// watches pod-a's heartbeat stop; the fence has stopped pod-a's run before pod-b can take pod-a
/// for dead.
#[test]
fn updates_of_leases_forbidden_mid_apply_fence_the_run_before_another_pod_may_call_it_dead() {
    let Some((_w, _pod_a, b_log)) = rights_removed_mid_apply("kl-403u", &["update"]) else {
        return;
    };
    assert!(
        b_log.contains("to tell whether owner pod-a"),
        "pod-b watched pod-a's heartbeat: {b_log}"
    );
}

/// tfinit connects to the API server's IP only (it links no resolver): a host name in
/// KUBERNETES_SERVICE_HOST, which the kubelet never writes, is refused at start with one warning
/// naming the variable, its value and what to do; records go to TFINIT_STATE_DIR and nothing is
/// sent to the API.
#[test]
fn a_host_name_in_kubernetes_service_host_is_refused_at_start() {
    if !have_deps() {
        return;
    }
    let c = kube_cluster::Cluster::start("kl-name-api");
    let place = pods::Place::new("kl-name", None, TTL);
    let mut env = c.pod_env();
    for (k, v) in &mut env {
        if *k == "KUBERNETES_SERVICE_HOST" {
            *v = "kubernetes.default.svc".into();
        }
    }
    let mut p = Pod::start(
        &place,
        PodSpec {
            name: "pod-a",
            uid: None,
            script: "true".into(),
            env,
        },
    );
    assert!(p.wait().success(), "{}", p.log());
    let log = p.log();
    let line = log
        .lines()
        .find(|l| l.contains("lock-owner records go to TFINIT_STATE_DIR"))
        .unwrap_or_else(|| panic!("one line says where records go: {log}"));
    assert!(line.contains(" WARN "), "a warning: {line}");
    for part in [
        r#"KUBERNETES_SERVICE_HOST="kubernetes.default.svc" is not an IP address"#,
        "no DNS lookup",
        "remove the setting that overrides the kubelet's value",
    ] {
        assert!(line.contains(part), "{part:?} in {line}");
    }
    assert!(
        !log.contains("lock-owner records go to the Kubernetes API"),
        "{log}"
    );
    assert!(
        c.codes().is_empty(),
        "nothing sent to the API: {:?}",
        c.codes()
    );
}
