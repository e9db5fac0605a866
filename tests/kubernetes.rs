//! Stuck state locks on terraform's `kubernetes` backend (provider-terraform's default), end to
//! end: real terraform 1.0.3, in both of its shapes, against a STAND-IN of the Kubernetes API
//! (tests/fixtures/kube/apiserver.py). No real API server can be installed on the offline test
//! machines; the stand-in serves exactly the calls this backend makes (secrets and
//! coordination.k8s.io/v1 leases: get, list with labelSelector=tfstate=true, create, update,
//! delete; plus the merge patch of `kubectl patch`), with the real server's `Status` errors
//! (NotFound, AlreadyExists, Conflict on a stale resourceVersion, Forbidden, a create in a missing
//! namespace) and `kind`/`apiVersion` on every answer. Each test checks that terraform called
//! nothing outside that surface.
//!
//! Pods, controllers and records are those of tests/locks_*.rs (tests/common/pods.rs); the world
//! (the stand-in, terraform's objects on it) is tests/common/kube_pods.rs, which
//! tests/kubernetes_leases.rs shares. The rules
//! are in docs/records.md; what terraform prints in each case is quoted in
//! docs/notes/terraform-facts.md.

mod common;
#[path = "common/kube_pods.rs"]
mod kube_pods;

use serde_json::{json, Value};

use common::apiserver::ApiServer;
use common::pods::{
    apply_once, apply_until_success, attempts, heartbeat_ms, now_ms, parse_rfc3339_ms, text,
    wrapped_terraform, Pod, PodSpec, RETRY, STEP,
};
use common::wait_for;
use kube_pods::{have_deps, KubeWorld, NS, TTL, UID};

/// The merge patch the needs-a-person error tells a person to apply (what terraform's Unlock does).
const RELEASE_PATCH: &str = r#"{"metadata":{"annotations":{"app.terraform.io/lock-info":null}},"spec":{"holderIdentity":null}}"#;

/// Polls until pod `owner`'s heartbeat is older than the TTL (it is dead for everyone).
fn wait_dead(w: &KubeWorld, owner: &str) {
    let hb = heartbeat_ms(&w.state, owner);
    wait_for(TTL * 3, "the dead pod's heartbeat to pass the TTL", || {
        (now_ms() > hb + TTL.as_millis() as u64 + 200).then_some(())
    });
}

/// No escape code anywhere in what tfinit wrote.
fn assert_no_escape_codes(log: &str) {
    assert!(!log.contains('\u{1b}'), "escape codes in: {log:?}");
}

// ----- the tests -----

/// A pod SIGKILLed mid-apply; the next pod finds the stale Lease, releases it and reconciles.
/// Panicwrap: the default workspace; TF_FORK=0: a non-default one. Both as uid 2000 without a
/// passwd entry.
fn a_pod_killed_mid_apply_is_recovered_by_the_next_pod(single_process: bool) {
    if !have_deps() {
        return;
    }
    let workspace = if single_process { "staging" } else { "default" };
    let extra: &[&str] = if single_process { &["staging"] } else { &[] };
    let w = KubeWorld::new("kube-kill", extra);
    let mut env = vec![("TF_WORKSPACE", workspace.to_string())];
    if single_process {
        env.push(("TF_FORK", "0".into()));
    }
    let mut env_a = env.clone();
    env_a.push(("TF_VAR_sleep", "30".into()));
    let mut pod_a = Pod::start(
        &w,
        PodSpec {
            name: "pod-a",
            uid: Some(UID),
            script: apply_once(&w.tmp.join("pod-a.out"), ""),
            env: env_a,
        },
    );
    let rec = w.wait_in_progress("pod-a", &["null_resource.a"]);
    let lock = wait_for(STEP, "pod-a's Lease", || w.api().lock(workspace));
    assert_eq!(
        wrapped_terraform(&w.ws).is_some(),
        !single_process,
        "the shape under test runs"
    );
    assert_eq!(rec["who"], "@pod-a", "uid {UID} has no passwd entry");
    assert_eq!(rec["workspace"], workspace);
    assert_eq!(lock["Who"], rec["who"]);
    assert_eq!(lock["Path"], "", "Path is empty on this backend");
    let kill_ms = now_ms();
    pod_a.kill();
    assert_eq!(
        w.api().lock(workspace),
        Some(lock.clone()),
        "stuck after the kill"
    );

    let out = w.tmp.join("pod-b.out");
    let mut pod_b = Pod::start(
        &w,
        PodSpec {
            name: "pod-b",
            uid: Some(UID),
            script: apply_until_success(&out, 30),
            env: [env, vec![("TF_VAR_sleep", "0".into())]].concat(),
        },
    );
    let st = pod_b.wait();
    let log = pod_b.log();
    assert!(st.success(), "pod-b never succeeded: {log}");
    let tries = attempts(&out);
    let longest_fail = tries
        .iter()
        .filter(|t| !t.ok)
        .map(|t| t.end - t.start)
        .max()
        .unwrap_or(0);
    let bound = kill_ms + (TTL + RETRY).as_millis() as u64 + longest_fail + 1000;
    let ok = tries.last().unwrap();
    assert!(
        ok.start <= bound,
        "reconciled {} ms after the kill: {tries:?}",
        ok.start - kill_ms
    );
    assert!(log.contains("force-unlocked its state lock"), "{log}");
    assert!(log.contains(lock["ID"].as_str().unwrap()), "{log}");
    assert_no_escape_codes(&log);
    assert!(w.records().is_empty(), "record removed: {:?}", w.records());
    w.assert_state_consistent(workspace);
}

#[test]
fn a_pod_killed_mid_apply_is_recovered_by_the_next_pod_panicwrap() {
    a_pod_killed_mid_apply_is_recovered_by_the_next_pod(false);
}

#[test]
fn a_pod_killed_mid_apply_is_recovered_by_the_next_pod_in_another_workspace_single_process() {
    a_pod_killed_mid_apply_is_recovered_by_the_next_pod(true);
}

#[test]
fn a_foreign_holders_lock_is_never_unlocked() {
    if !have_deps() {
        return;
    }
    let w = KubeWorld::new("kube-foreign", &[]);
    // A dead pod's record, and the lock held by somebody's laptop since then.
    let (rec, mut info) = w.plant_dead_run("default");
    info["Who"] = json!("root@laptop");
    w.api().plant_lock("default", &info);
    let out = w.tmp.join("pod-b.out");
    let mut pod_b = Pod::start(
        &w,
        PodSpec {
            name: "pod-b",
            uid: Some(UID),
            script: apply_once(&out, "-lock-timeout=0s"),
            env: vec![("TF_VAR_sleep", "0".into())],
        },
    );
    pod_b.wait();
    let log = pod_b.log();
    let apply = common::read(&w.tmp.join("pod-b.out.1"));
    assert!(apply.contains("Error acquiring the state lock"), "{apply}");
    assert!(apply.contains("Who:       root@laptop"), "{apply}");
    assert_eq!(
        w.api().lock("default"),
        Some(info.clone()),
        "the laptop's lock is untouched"
    );
    assert!(
        log.contains(r#"its Who "root@laptop" is not the dead run's "@pod-a""#),
        "{log}"
    );
    assert!(!log.contains("force-unlocked"), "{log}");
    assert!(!rec.exists(), "a record whose run holds no lock is removed");
    // By hand too.
    let (rec, _) = w.plant_dead_run("default");
    let (code, out) = w.recover();
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("held by root@laptop is not the dead run's"),
        "{out}"
    );
    assert!(!rec.exists());
    assert_eq!(
        w.api().lock("default"),
        Some(info),
        "`tfinit recover` leaves it too"
    );
    w.api().assert_only_the_served_surface();
}

#[test]
fn a_live_owners_lock_during_a_rolling_update_is_never_unlocked() {
    if !have_deps() {
        return;
    }
    let w = KubeWorld::new("kube-rolling", &[]);
    // pod-a's apply lasts two TTLs: only its heartbeat tells pod-b that it is alive.
    let a_out = w.tmp.join("pod-a.out");
    let mut pod_a = Pod::start(
        &w,
        PodSpec {
            name: "pod-a",
            uid: Some(UID),
            script: apply_once(&a_out, ""),
            env: vec![("TF_VAR_sleep", (2 * TTL.as_secs() + 1).to_string())],
        },
    );
    let lock = wait_for(STEP, "pod-a's Lease", || w.api().lock("default"));
    let b_out = w.tmp.join("pod-b.out");
    let mut pod_b = Pod::start(
        &w,
        PodSpec {
            name: "pod-b",
            uid: Some(UID),
            script: apply_until_success(&b_out, 30),
            env: vec![("TF_VAR_sleep", "0".into())],
        },
    );
    // While pod-a's apply runs, its lock stays exactly its own: pod-b's only once pod-a's
    // terraform released it and exited (pod-b force-unlocks nothing: checked below).
    wait_for(
        STEP + 2 * TTL,
        "pod-a's apply to end (`done` in its output)",
        || {
            pod_a.assert_its_lock_while_it_runs(w.api().lock("default"), &lock);
            common::read(&a_out).contains("done").then_some(())
        },
    );
    pod_a.wait();
    assert!(
        common::read(&a_out).starts_with("done 0 "),
        "pod-a's apply succeeded"
    );
    assert!(pod_b.wait().success(), "{}", pod_b.log());
    let log = pod_b.log();
    assert!(!log.contains("force-unlock"), "{log}");
    let tries = attempts(&b_out);
    assert!(
        tries.len() > 1 && !tries[0].ok,
        "pod-b waited for pod-a: {tries:?}"
    );
    w.assert_state_consistent("default");
}

/// Edge cases 2 and 3 of the issue: a kill inside `init` (recorded: it takes the lock) while
/// the state Secret is missing leaves a Lease no terraform command can release; tfinit says once
/// per incarnation what to run, `tfinit recover` lists it, and after the patch its probe creates
/// the missing Secret and frees the record.
#[test]
fn a_kill_inside_init_with_the_state_missing_needs_a_person_and_says_how() {
    if !have_deps() {
        return;
    }
    let w = KubeWorld::new("kube-person", &[]);
    // The Secret was deleted; the next init creates it, under the lock. The stand-in holds the
    // create unanswered, so the pod dies inside that window.
    w.api().delete(&ApiServer::secret_path("default"));
    w.api().faults(json!({"stall": ["create secrets"]}));
    let mut pod_a = Pod::start(
        &w,
        PodSpec {
            name: "pod-a",
            uid: Some(UID),
            script: "terraform init -input=false -no-color".into(),
            env: vec![],
        },
    );
    let lock = wait_for(STEP, "init's Lease", || w.api().lock("default"));
    let recs = w.records();
    assert_eq!(recs.len(), 1, "init is recorded: {recs:?}");
    assert_eq!(recs[0].1["subcommand"], "init");
    assert_eq!(
        (lock["Operation"].as_str(), lock["Who"].as_str()),
        (Some("init"), Some("@pod-a"))
    );
    pod_a.kill();
    w.api().faults(json!({}));
    assert!(!w.api().secret_exists("default"));
    wait_dead(&w, "pod-a");

    // pod-b: two runs, both stopped by the lock; one error, with the command.
    let mut pod_b = Pod::start(
        &w,
        PodSpec {
            name: "pod-b",
            uid: Some(UID),
            script: "terraform apply -auto-approve -input=false -no-color; terraform apply -auto-approve -input=false -no-color; true".into(),
            env: vec![("TF_VAR_sleep", "0".into())],
        },
    );
    pod_b.wait();
    let log = pod_b.log();
    let command = format!(
        "kubectl -n {NS} patch lease lock-tfstate-default-tfinit --type=merge -p '{RELEASE_PATCH}'"
    );
    assert_eq!(
        log.matches("a person must").count(),
        1,
        "one error per incarnation: {log}"
    );
    assert!(log.contains(&command), "{log}");
    assert!(log.contains("Workspace default has no state"), "{log}");
    assert!(
        !log.contains("force-unlock failed") && !log.contains("force-unlocked"),
        "{log}"
    );
    assert_no_escape_codes(&log);
    assert_eq!(
        w.api().lock("default"),
        Some(lock.clone()),
        "no unlock tried"
    );
    let recs = w.records();
    assert_eq!(recs.len(), 1, "kept as .json: {recs:?}");
    assert_eq!(recs[0].1["needs_person"]["command"], command.as_str());
    assert_eq!(recs[0].1["needs_person"]["lock_id"], lock["ID"]);

    // A new incarnation says it once more.
    let mut pod_c = Pod::start(
        &w,
        PodSpec {
            name: "pod-c",
            uid: Some(UID),
            script: "terraform plan -input=false -no-color -lock-timeout=0s; true".into(),
            env: vec![("TF_VAR_sleep", "0".into())],
        },
    );
    pod_c.wait();
    assert_eq!(
        pod_c.log().matches("a person must").count(),
        1,
        "{}",
        pod_c.log()
    );

    // By hand: listed, exit 1.
    let (code, out) = w.recover();
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("NEEDS A PERSON") && out.contains(&command),
        "{out}"
    );
    assert_no_escape_codes(&out);

    // The person runs the command (its merge patch); the next recovery's probe finds the lock
    // free, and, being a terraform that loads the state, creates the missing Secret on the way.
    let patch: Value = serde_json::from_str(RELEASE_PATCH).unwrap();
    let (code, v) = w.api().call(
        "PATCH",
        &ApiServer::lease_path("default"),
        Some(&patch),
        "application/merge-patch+json",
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(w.api().lock("default"), None);
    let (code, out) = w.recover();
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("lock free; record removed"), "{out}");
    assert!(w.records().is_empty());
    assert!(
        w.api().secret_exists("default"),
        "the probe created the missing state Secret"
    );
    let apply = w.terraform(
        &["apply", "-auto-approve", "-input=false", "-no-color"],
        "default",
    );
    assert!(apply.status.success(), "{}", text(&apply));
    w.assert_state_consistent("default");
}

/// Edge case 1 (a Lease deleted by hand is free) and the cases that stay "cannot tell": each
/// touches nothing, keeps the record, and `tfinit recover` exits 1 naming the cause.
#[test]
fn what_cannot_be_told_is_left_alone_and_a_deleted_lease_is_free() {
    if !have_deps() {
        return;
    }
    let w = KubeWorld::new("kube-unknown", &[]);
    let (rec, info) = w.plant_dead_run("default");
    w.api().plant_lock("default", &info);
    let created = parse_rfc3339_ms(info["Created"].as_str().unwrap());
    assert!(created > now_ms() - 60_000);
    let cannot_tell = |what: &str, expect: &str| {
        let (code, out) = w.recover();
        assert_eq!(code, 1, "{what}: {out}");
        assert!(out.contains(expect), "{what}: {out}");
        assert_no_escape_codes(&out);
        assert!(rec.exists(), "{what}: record kept");
    };
    w.api().faults(json!({"forbid": ["get leases"]}));
    cannot_tell(
        "Forbidden lease",
        r#"leases.coordination.k8s.io "lock-tfstate-default-tfinit" is forbidden"#,
    );
    w.api().faults(json!({"forbid": ["get secrets"]}));
    cannot_tell(
        "Forbidden secret",
        r#"secrets "tfstate-default-tfinit" is forbidden"#,
    );
    w.api().faults(json!({}));
    assert_eq!(w.api().lock("default"), Some(info.clone()));
    w.write_kubeconfig(1);
    cannot_tell("unreachable", "connect: connection refused");
    w.write_kubeconfig(w.api().port);
    // The Secret missing under the dead run's lock: not free (a person must release it).
    w.api().delete(&ApiServer::secret_path("default"));
    cannot_tell("missing Secret", "NEEDS A PERSON");
    assert_eq!(
        w.api().lock("default"),
        Some(info.clone()),
        "lock untouched"
    );
    w.api().namespace(NS, false);
    cannot_tell("missing namespace", r#"namespaces "tfinit" not found"#);

    // The namespace back, the state written, then the Lease deleted by hand: free.
    w.api().namespace(NS, true);
    let apply = w.terraform(
        &["apply", "-auto-approve", "-input=false", "-no-color"],
        "default",
    );
    assert!(apply.status.success(), "{}", text(&apply));
    w.api().delete(&ApiServer::lease_path("default"));
    let (code, out) = w.recover();
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("lock free; record removed"), "{out}");
    assert!(!rec.exists());
    w.assert_state_consistent("default");
}
