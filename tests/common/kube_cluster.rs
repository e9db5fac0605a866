//! One test's Kubernetes cluster for the tests of tfinit's client and Lease store: a CA made
//! with openssl, the stand-in API server serving HTTPS with its certificate
//! (tests/fixtures/kube/apiserver.py), and a pod's service-account directory.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use tfinit::kube::{Client, Config, Deadlines};

use super::apiserver::{self, ApiServer};
use super::pki::{self, Pki};
use super::TempDir;

/// The pod's namespace.
pub const NS: &str = "tfinit";

/// The deadlines of the clients of these tests (short: a hung server costs the test this).
pub const DEADLINES: Deadlines = Deadlines {
    connect: Duration::from_secs(2),
    request: Duration::from_secs(3),
};

/// Whether everything these tests need is here; one line when not.
pub fn have_deps() -> bool {
    super::require(
        pki::have_openssl() && apiserver::have_python(),
        "openssl and python3 (the HTTPS Kubernetes API stand-in)",
    )
}

/// One test's cluster: a CA, the stand-in serving HTTPS with its certificate, and a pod's
/// service-account directory (token, ca.crt, namespace).
pub struct Cluster {
    pub tmp: TempDir,
    pub pki: Pki,
    pub api: ApiServer,
    /// The tokens the server accepts (one a line).
    pub tokens: PathBuf,
    /// The pod's service-account directory.
    pub sa: PathBuf,
}

impl Cluster {
    pub fn start(name: &str) -> Cluster {
        let tmp = TempDir::new(name);
        let pki = Pki::new(&tmp.0, "cluster");
        let tokens = tmp.join("tokens");
        std::fs::write(&tokens, "token-1\n").unwrap();
        let api = ApiServer::start_tls(&tmp, NS, &pki, &tokens);
        let sa = tmp.join("serviceaccount");
        std::fs::create_dir_all(&sa).unwrap();
        std::fs::write(sa.join("token"), "token-1\n").unwrap();
        std::fs::copy(&pki.ca, sa.join("ca.crt")).unwrap();
        std::fs::write(sa.join("namespace"), format!("{NS}\n")).unwrap();
        Cluster {
            tmp,
            pki,
            api,
            tokens,
            sa,
        }
    }

    /// A client of the pod, with `deadlines`.
    pub fn client_with(&self, deadlines: Deadlines) -> Client {
        let config = Config::from_dir("127.0.0.1", &self.api.port.to_string(), &self.sa)
            .expect("the service account directory is valid");
        Client::new(config, deadlines)
    }

    pub fn client(&self) -> Client {
        self.client_with(DEADLINES)
    }

    /// A pod's environment that makes its records go to this cluster's API with nothing set but
    /// the service account (TFINIT_STORE left at `auto`): the kubelet's variables, the
    /// service-account directory, and no usable state directory (a pod with no volume).
    pub fn pod_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1".into()),
            ("KUBERNETES_SERVICE_PORT", self.api.port.to_string()),
            ("TFINIT_SERVICE_ACCOUNT_DIR", self.sa.display().to_string()),
            ("TFINIT_STATE_DIR", "/nonexistent/tfinit-no-volume".into()),
        ]
    }

    /// The records in tfinit's record Leases (the API's admin view), parsed.
    pub fn record_leases(&self) -> Vec<Value> {
        let path = format!(
            "/apis/coordination.k8s.io/v1/namespaces/{NS}/leases?labelSelector=tfinit.dev%2Fkind%3Drecord"
        );
        let (code, list) = self.api.call("GET", &path, None, "application/json");
        assert_eq!(code, 200, "{list}");
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|l| {
                serde_json::from_str(l["metadata"]["annotations"]["tfinit.dev/record"].as_str()?)
                    .ok()
            })
            .collect()
    }

    /// Waits (up to [`super::pods::STEP`]) until `owner`'s record Lease shows exactly
    /// `in_progress`; returns that record.
    pub fn wait_in_progress(&self, owner: &str, in_progress: &[&str]) -> Value {
        super::wait_for(
            super::pods::STEP,
            &format!("{owner}'s record Lease with {in_progress:?} in progress"),
            || {
                self.record_leases().into_iter().find(|r| {
                    r["owner"]["name"] == owner
                        && r["in_progress"] == serde_json::json!(in_progress)
                })
            },
        )
    }

    /// The codes the server answered, in order (0: lost).
    pub fn codes(&self) -> Vec<u16> {
        self.api.requests().iter().map(|r| r.2).collect()
    }
}
