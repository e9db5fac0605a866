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
//! Pods, controllers and records are those of tests/locks_*.rs (tests/common/pods.rs). The rules
//! are in docs/records.md; what terraform prints in each case is quoted in
//! docs/notes/terraform-facts.md.

mod common;

use std::fs;
use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use serde_json::{json, Value};

use common::apiserver::{self, ApiServer};
use common::pods::{
    self, apply_once, apply_until_success, attempts, heartbeat_ms, now_ms, parse_rfc3339_ms, text,
    wrapped_terraform, Place, Pod, PodSpec, RETRY, STEP,
};
use common::{deps, wait_for};

/// TFINIT_OWNER_TTL of the pods (short, so a dead owner is seen dead quickly).
const TTL: Duration = Duration::from_secs(3);

/// The pods' uid: no passwd entry, so terraform's Who is `@<hostname>`.
const UID: u32 = 2000;

/// The backend's namespace and secret suffix (tests/fixtures/kube/main.tf).
const NS: &str = "tfinit";

/// The merge patch the needs-a-person error tells a person to apply (what terraform's Unlock does).
const RELEASE_PATCH: &str = r#"{"metadata":{"annotations":{"app.terraform.io/lock-info":null}},"spec":{"holderIdentity":null}}"#;

/// Whether everything these tests need is here.
fn have_deps() -> bool {
    common::pods::have_pod_deps("the pods run as uid 2000 (setpriv) on a volume chowned to it")
        && common::require(
            apiserver::have_python(),
            "python3 (the Kubernetes API stand-in)",
        )
}

// ----- the API stand-in (tests/common/apiserver.rs): terraform's objects on it -----

/// What terraform's backend stores on the stand-in, and the checks of these tests.
impl ApiServer {
    fn lease_path(ws: &str) -> String {
        format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/lock-tfstate-{ws}-tfinit")
    }

    fn secret_path(ws: &str) -> String {
        format!("/api/v1/namespaces/{NS}/secrets/tfstate-{ws}-tfinit")
    }

    /// The workspace's Lease, if it exists.
    fn lease(&self, ws: &str) -> Option<Value> {
        let (code, v) = self.call("GET", &Self::lease_path(ws), None, "application/json");
        (code == 200).then_some(v)
    }

    /// The Lock Info of the workspace's lock, if held.
    fn lock(&self, ws: &str) -> Option<Value> {
        let lease = self.lease(ws)?;
        let holder = lease["spec"]["holderIdentity"].as_str()?;
        let info: Value = serde_json::from_str(
            lease["metadata"]["annotations"]["app.terraform.io/lock-info"].as_str()?,
        )
        .unwrap();
        assert_eq!(info["ID"], holder, "holderIdentity is the lock id");
        Some(info)
    }

    fn secret_exists(&self, ws: &str) -> bool {
        self.call("GET", &Self::secret_path(ws), None, "application/json")
            .0
            == 200
    }

    /// The workspace's Lease held by `info`, as terraform's Lock writes it: created, or updated
    /// when it exists (terraform's Unlock leaves the Lease without a holder).
    fn plant_lock(&self, ws: &str, info: &Value) {
        if let Some(mut lease) = self.lease(ws) {
            lease["spec"]["holderIdentity"] = info["ID"].clone();
            lease["metadata"]["annotations"]["app.terraform.io/lock-info"] =
                json!(info.to_string());
            let (code, v) = self.call(
                "PUT",
                &Self::lease_path(ws),
                Some(&lease),
                "application/json",
            );
            assert_eq!(code, 200, "update the lease: {v}");
            return;
        }
        let lease = json!({
            "metadata": {
                "name": format!("lock-tfstate-{ws}-tfinit"),
                "labels": {"tfstate": "true", "tfstateSecretSuffix": "tfinit", "tfstateWorkspace": ws, "app.kubernetes.io/managed-by": "terraform"},
                "annotations": {"app.terraform.io/lock-info": info.to_string()},
            },
            "spec": {"holderIdentity": info["ID"]},
        });
        let path = format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases");
        let (code, v) = self.call("POST", &path, Some(&lease), "application/json");
        assert_eq!(code, 201, "plant the lease: {v}");
    }

    /// Asserts terraform called nothing outside the served surface (no discovery, no version).
    fn assert_only_the_served_surface(&self) {
        let log = common::read(&self.log);
        assert!(!log.contains("OUTSIDE"), "{log}");
        assert!(log.contains("leases"), "terraform used the stand-in: {log}");
    }
}

// ----- the world -----

/// One test's world: a stand-in, a working directory initialised on it, a shared state dir.
struct KubeWorld {
    place: Place,
    api: ApiServer,
    kubeconfig: PathBuf,
}

impl std::ops::Deref for KubeWorld {
    type Target = Place;
    fn deref(&self) -> &Place {
        &self.place
    }
}

impl KubeWorld {
    /// Starts the stand-in and `terraform init`s the working directory on it (as root, before
    /// any pod), with the given extra workspaces.
    fn new(name: &str, workspaces: &[&str]) -> KubeWorld {
        let place = Place::new(name, Some("kube"), TTL);
        let api = ApiServer::start(&place.tmp, NS);
        let kubeconfig = place.tmp.join("kubeconfig");
        let w = KubeWorld {
            place,
            api,
            kubeconfig,
        };
        w.write_kubeconfig(w.api.port);
        let out = w.terraform(
            &[
                "init",
                "-input=false",
                "-no-color",
                &format!("-plugin-dir={}", deps().join("plugins").display()),
                &format!("-backend-config=config_path={}", w.kubeconfig.display()),
            ],
            "default",
        );
        assert!(out.status.success(), "terraform init: {}", text(&out));
        for extra in workspaces {
            let out = w.terraform(&["workspace", "new", "-no-color", extra], "");
            assert!(out.status.success(), "workspace new: {}", text(&out));
        }
        pods::chown(&w.tmp.0, UID);
        w
    }

    /// A kubeconfig as a service account's: the server, a bearer token, the namespace.
    fn write_kubeconfig(&self, port: u16) {
        let cfg = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n    server: http://127.0.0.1:{port}\n\
             users:\n- name: controller\n  user:\n    token: stand-in-token\ncontexts:\n- name: standin\n  context:\n    cluster: standin\n    user: controller\n    namespace: {NS}\n\
             current-context: standin\n"
        );
        fs::write(&self.kubeconfig, cfg).unwrap();
    }

    /// The real terraform, directly (not through tfinit), as root, in workspace `workspace` (the
    /// selected one when empty).
    fn terraform(&self, args: &[&str], workspace: &str) -> Output {
        let mut c = self.terraform_command(args);
        if !workspace.is_empty() {
            c.env("TF_WORKSPACE", workspace);
        }
        common::run_output(&mut c, STEP)
    }

    /// Asserts the workspace is whole: lock free, nothing left to do, every resource in its state.
    fn assert_state_consistent(&self, workspace: &str) {
        assert_eq!(self.api.lock(workspace), None, "the lock must be free");
        let plan = self.terraform(
            &[
                "plan",
                "-detailed-exitcode",
                "-input=false",
                "-no-color",
                "-lock-timeout=0s",
            ],
            workspace,
        );
        assert_eq!(
            plan.status.code(),
            Some(0),
            "nothing to do: {}",
            text(&plan)
        );
        let list = self.terraform(&["state", "list"], workspace);
        let names = String::from_utf8_lossy(&list.stdout).to_string();
        for r in ["null_resource.a", "null_resource.b", "null_resource.c"] {
            assert!(names.lines().any(|l| l == r), "{r} in state: {names}");
        }
        self.api.assert_only_the_served_surface();
    }

    /// A record of pod-a's dead run (its heartbeat long stale) and the Lock Info its lock would
    /// carry (created while it ran).
    fn plant_dead_run(&self, workspace: &str) -> (PathBuf, Value) {
        let started = now_ms() - 60_000;
        let owner =
            json!({"name": "pod-a", "boot_id": "0", "started_ms": started - 1000, "pid": 1});
        let rec = pods::plant_record(
            &self.state,
            UID,
            "pod-a.0-1-1.r1.json",
            &json!({
                "v": 4, "ttl_ms": TTL.as_millis() as u64, "owner": owner, "who": "@pod-a", "run_id": "r1", "cwd": self.ws,
                "workdir": self.ws, "workspace": workspace, "subcommand": "apply",
                "argv": ["apply", "-auto-approve"], "started_ms": started,
                "in_progress": ["null_resource.a"], "updated_ms": started,
            }),
        );
        pods::plant_heartbeat(
            &self.state,
            UID,
            "pod-a",
            // Its TTL stated (heartbeats of record format 4 do): without it the owner would be
            // judged by TFINIT_OLDER_OWNER_TTL (a year), alive for these tests.
            &json!({"v": 1, "owner": owner, "updated_ms": started + 1000, "ttl_ms": TTL.as_millis() as u64}),
        );
        let info = json!({
            "ID": "e2b7f19a-9b4c-e624-55c2-9de7d0e67a50", "Operation": "OperationTypeApply",
            "Info": "", "Who": "@pod-a", "Version": "1.0.3", "Path": "",
            "Created": pods::rfc3339(now_ms() - 30_000),
        });
        (rec, info)
    }

    /// `tfinit recover` by hand: its exit code and output.
    fn recover(&self) -> (i32, String) {
        let o = pods::recover_by_hand(self, &[], &[]);
        (o.status.code().unwrap_or(-1), text(&o))
    }
}

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
    let lock = wait_for(STEP, "pod-a's Lease", || w.api.lock(workspace));
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
        w.api.lock(workspace),
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
    w.api.plant_lock("default", &info);
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
        w.api.lock("default"),
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
        w.api.lock("default"),
        Some(info),
        "`tfinit recover` leaves it too"
    );
    w.api.assert_only_the_served_surface();
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
    let lock = wait_for(STEP, "pod-a's Lease", || w.api.lock("default"));
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
    // While pod-a's apply runs, its lock stays exactly its own.
    wait_for(
        STEP + 2 * TTL,
        "pod-a's apply to end (`done` in its output)",
        || {
            if let Some(now) = w.api.lock("default") {
                assert_eq!(now, lock, "pod-a's lock changed while pod-a lived");
            }
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
    w.api.delete(&ApiServer::secret_path("default"));
    w.api.faults(json!({"stall": ["create secrets"]}));
    let mut pod_a = Pod::start(
        &w,
        PodSpec {
            name: "pod-a",
            uid: Some(UID),
            script: "terraform init -input=false -no-color".into(),
            env: vec![],
        },
    );
    let lock = wait_for(STEP, "init's Lease", || w.api.lock("default"));
    let recs = w.records();
    assert_eq!(recs.len(), 1, "init is recorded: {recs:?}");
    assert_eq!(recs[0].1["subcommand"], "init");
    assert_eq!(
        (lock["Operation"].as_str(), lock["Who"].as_str()),
        (Some("init"), Some("@pod-a"))
    );
    pod_a.kill();
    w.api.faults(json!({}));
    assert!(!w.api.secret_exists("default"));
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
    assert_eq!(w.api.lock("default"), Some(lock.clone()), "no unlock tried");
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
    let (code, v) = w.api.call(
        "PATCH",
        &ApiServer::lease_path("default"),
        Some(&patch),
        "application/merge-patch+json",
    );
    assert_eq!(code, 200, "{v}");
    assert_eq!(w.api.lock("default"), None);
    let (code, out) = w.recover();
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("lock free; record removed"), "{out}");
    assert!(w.records().is_empty());
    assert!(
        w.api.secret_exists("default"),
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
    w.api.plant_lock("default", &info);
    let created = parse_rfc3339_ms(info["Created"].as_str().unwrap());
    assert!(created > now_ms() - 60_000);
    let cannot_tell = |what: &str, expect: &str| {
        let (code, out) = w.recover();
        assert_eq!(code, 1, "{what}: {out}");
        assert!(out.contains(expect), "{what}: {out}");
        assert_no_escape_codes(&out);
        assert!(rec.exists(), "{what}: record kept");
    };
    w.api.faults(json!({"forbid": ["get leases"]}));
    cannot_tell(
        "Forbidden lease",
        r#"leases.coordination.k8s.io "lock-tfstate-default-tfinit" is forbidden"#,
    );
    w.api.faults(json!({"forbid": ["get secrets"]}));
    cannot_tell(
        "Forbidden secret",
        r#"secrets "tfstate-default-tfinit" is forbidden"#,
    );
    w.api.faults(json!({}));
    assert_eq!(w.api.lock("default"), Some(info.clone()));
    w.write_kubeconfig(1);
    cannot_tell("unreachable", "connect: connection refused");
    w.write_kubeconfig(w.api.port);
    // The Secret missing under the dead run's lock: not free (a person must release it).
    w.api.delete(&ApiServer::secret_path("default"));
    cannot_tell("missing Secret", "NEEDS A PERSON");
    assert_eq!(w.api.lock("default"), Some(info.clone()), "lock untouched");
    w.api.namespace(NS, false);
    cannot_tell("missing namespace", r#"namespaces "tfinit" not found"#);

    // The namespace back, the state written, then the Lease deleted by hand: free.
    w.api.namespace(NS, true);
    let apply = w.terraform(
        &["apply", "-auto-approve", "-input=false", "-no-color"],
        "default",
    );
    assert!(apply.status.success(), "{}", text(&apply));
    w.api.delete(&ApiServer::lease_path("default"));
    let (code, out) = w.recover();
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("lock free; record removed"), "{out}");
    assert!(!rec.exists());
    w.assert_state_consistent("default");
}
