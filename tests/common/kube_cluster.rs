//! One test's Kubernetes cluster for the tests of tfinit's client and Lease store: a CA made
//! with openssl, the stand-in API server serving HTTPS with its certificate
//! (tests/fixtures/kube/apiserver.py), and a pod's service-account directory.

use std::path::PathBuf;
use std::time::Duration;

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

    /// The codes the server answered, in order (0: lost).
    pub fn codes(&self) -> Vec<u16> {
        self.api.requests().iter().map(|r| r.2).collect()
    }
}
