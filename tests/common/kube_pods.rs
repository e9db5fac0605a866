//! Worlds on terraform's `kubernetes` backend (provider-terraform's default: the state in a
//! Secret, the lock in a Lease) against the API stand-in (tests/fixtures/kube/apiserver.py), for
//! tests/kubernetes.rs (records in a shared TFINIT_STATE_DIR) and tests/kubernetes_leases.rs
//! (records in Leases, pods with no volume): terraform's objects on the stand-in, a working
//! directory initialised on it, and the checks of both.
#![allow(dead_code)]

use std::fs;
use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common;
use crate::common::apiserver::{self, ApiServer};
use crate::common::deps;
use crate::common::kube_cluster::Cluster;
use crate::common::pods::{self, now_ms, text, Place, STEP};
use crate::common::terraform::Terraform;

/// TFINIT_OWNER_TTL of the pods (short, so a dead owner is seen dead quickly).
pub const TTL: Duration = Duration::from_secs(3);

/// The pods' uid in tests/kubernetes.rs: no passwd entry, so terraform's Who is `@<hostname>`.
pub const UID: u32 = 2000;

/// The backend's namespace and secret suffix (tests/fixtures/kube/main.tf), the cluster's
/// namespace too.
pub use crate::common::kube_cluster::NS;

/// Whether everything these tests need is here.
pub fn have_deps() -> bool {
    common::pods::have_pod_deps("the pods run as uid 2000 (setpriv) on a volume chowned to it")
        && common::require(
            apiserver::have_python(),
            "python3 (the Kubernetes API stand-in)",
        )
}

// ----- the API stand-in (tests/common/apiserver.rs): terraform's objects on it -----

/// What terraform's backend stores on the stand-in, and the checks of these tests.
impl ApiServer {
    pub fn lease_path(ws: &str) -> String {
        format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/lock-tfstate-{ws}-tfinit")
    }

    pub fn secret_path(ws: &str) -> String {
        format!("/api/v1/namespaces/{NS}/secrets/tfstate-{ws}-tfinit")
    }

    /// The workspace's Lease, if it exists.
    pub fn lease(&self, ws: &str) -> Option<Value> {
        let (code, v) = self.call("GET", &Self::lease_path(ws), None, "application/json");
        (code == 200).then_some(v)
    }

    /// The Lock Info of the workspace's lock, if held.
    pub fn lock(&self, ws: &str) -> Option<Value> {
        let lease = self.lease(ws)?;
        let holder = lease["spec"]["holderIdentity"].as_str()?;
        let info: Value = serde_json::from_str(
            lease["metadata"]["annotations"]["app.terraform.io/lock-info"].as_str()?,
        )
        .unwrap();
        assert_eq!(info["ID"], holder, "holderIdentity is the lock id");
        Some(info)
    }

    pub fn secret_exists(&self, ws: &str) -> bool {
        self.call("GET", &Self::secret_path(ws), None, "application/json")
            .0
            == 200
    }

    /// The workspace's Lease held by `info`, as terraform's Lock writes it: created, or updated
    /// when it exists (terraform's Unlock leaves the Lease without a holder).
    pub fn plant_lock(&self, ws: &str, info: &Value) {
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
    pub fn assert_only_the_served_surface(&self) {
        let log = common::read(&self.log);
        assert!(!log.contains("OUTSIDE"), "{log}");
        assert!(log.contains("leases"), "terraform used the stand-in: {log}");
    }
}

// ----- the world -----

/// The stand-in of a world: plain http (terraform's backend alone), or a cluster whose HTTPS API
/// port serves tfinit's Lease store and whose admin port (plain http, never faulted, not in the
/// request log) serves terraform's backend, so that the faults a test sets for tfinit's Leases
/// never reach terraform's own lock Lease.
pub enum Standin {
    /// tests/kubernetes.rs: records in TFINIT_STATE_DIR, terraform on the one port.
    Plain(ApiServer),
    /// tests/kubernetes_leases.rs: records in Leases of the HTTPS port.
    Cluster(Cluster),
}

/// One test's world: a stand-in, a working directory initialised on it, a shared state dir.
pub struct KubeWorld {
    place: Place,
    standin: Standin,
    kubeconfig: PathBuf,
}

impl std::ops::Deref for KubeWorld {
    type Target = Place;
    fn deref(&self) -> &Place {
        &self.place
    }
}

impl KubeWorld {
    /// Starts the plain stand-in and `terraform init`s the working directory on it with
    /// terraform 1.0.3 (as root, before any pod), with the given extra workspaces.
    pub fn new(name: &str, workspaces: &[&str]) -> KubeWorld {
        let place = Place::new(name, Some("kube"), TTL);
        let api = ApiServer::start(&place.tmp, NS);
        KubeWorld::init(place, Standin::Plain(api), workspaces)
    }

    /// A world of `tf` in a cluster: tfinit's pods reach the HTTPS API with the service account
    /// ([`Cluster::pod_env`]), terraform's backend the admin port.
    /// With the given extra workspaces.
    pub fn in_cluster(name: &str, tf: &Terraform, workspaces: &[&str]) -> KubeWorld {
        let mut place = Place::new(name, Some("kube"), TTL);
        place.terraform_dir = tf.dir();
        let cluster = Cluster::start(&format!("{name}-api"));
        KubeWorld::init(place, Standin::Cluster(cluster), workspaces)
    }

    fn init(place: Place, standin: Standin, workspaces: &[&str]) -> KubeWorld {
        let kubeconfig = place.tmp.join("kubeconfig");
        let w = KubeWorld {
            place,
            standin,
            kubeconfig,
        };
        w.write_kubeconfig(w.api().admin_port);
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

    /// The stand-in (in a cluster, its admin view through [`ApiServer::call`]).
    pub fn api(&self) -> &ApiServer {
        match &self.standin {
            Standin::Plain(api) => api,
            Standin::Cluster(c) => &c.api,
        }
    }

    /// The cluster of a world made by [`KubeWorld::in_cluster`].
    pub fn cluster(&self) -> &Cluster {
        match &self.standin {
            Standin::Cluster(c) => c,
            Standin::Plain(_) => panic!("a world of the plain stand-in has no cluster"),
        }
    }

    /// A kubeconfig as a service account's: the server, a bearer token, the namespace.
    pub fn write_kubeconfig(&self, port: u16) {
        let cfg = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n    server: http://127.0.0.1:{port}\n\
             users:\n- name: controller\n  user:\n    token: stand-in-token\ncontexts:\n- name: standin\n  context:\n    cluster: standin\n    user: controller\n    namespace: {NS}\n\
             current-context: standin\n"
        );
        fs::write(&self.kubeconfig, cfg).unwrap();
    }

    /// The real terraform, directly (not through tfinit), as root, in workspace `workspace` (the
    /// selected one when empty).
    pub fn terraform(&self, args: &[&str], workspace: &str) -> Output {
        let mut c = self.terraform_command(args);
        if !workspace.is_empty() {
            c.env("TF_WORKSPACE", workspace);
        }
        common::run_output(&mut c, STEP)
    }

    /// Asserts the workspace is whole: lock free, nothing left to do, every resource in its state.
    pub fn assert_state_consistent(&self, workspace: &str) {
        assert_eq!(self.api().lock(workspace), None, "the lock must be free");
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
        self.api().assert_only_the_served_surface();
    }

    /// A record of pod-a's dead run (its heartbeat long stale) and the Lock Info its lock would
    /// carry (created while it ran).
    pub fn plant_dead_run(&self, workspace: &str) -> (PathBuf, Value) {
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
    pub fn recover(&self) -> (i32, String) {
        let o = pods::recover_by_hand(self, &[], &[]);
        (o.status.code().unwrap_or(-1), text(&o))
    }
}
