//! The stand-in Kubernetes API server (tests/fixtures/kube/apiserver.py, whose header lists what
//! it serves and its switches), started for one test and killed on drop (and by the kernel if the
//! test thread dies without unwinding). Plain http for terraform's kubernetes backend
//! (tests/kubernetes.rs); HTTPS with a bearer token for tfinit's own client
//! (tests/kube_client.rs). The test's own calls ([`ApiServer::call`]) go to the admin port:
//! plain http, no token, no fault, not in the request log.

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::pki::Pki;
use super::{repo, wait_for, TempDir};

/// The interpreter of the stand-in.
pub const PYTHON: &str = "/usr/bin/python3";

/// How long the stand-in may take to listen, and to answer the test's own calls.
const STEP: Duration = Duration::from_secs(30);

/// Whether the stand-in can run here.
pub fn have_python() -> bool {
    Path::new(PYTHON).exists()
}

/// One running stand-in.
pub struct ApiServer {
    child: Child,
    /// The API's port (https in TLS mode).
    pub port: u16,
    /// The port of /_admin/ and of the test's own calls (the API port in plain mode).
    pub admin_port: u16,
    /// Its log (stdout and stderr).
    pub log: PathBuf,
}

impl ApiServer {
    /// Plain http, no authentication, `namespace` existing.
    pub fn start(tmp: &TempDir, namespace: &str) -> ApiServer {
        ApiServer::spawn(tmp, namespace, None, &[])
    }

    /// HTTPS with `pki`'s server certificate; the bearer tokens accepted are the lines of
    /// `tokens` (read on every request).
    pub fn start_tls(tmp: &TempDir, namespace: &str, pki: &Pki, tokens: &Path) -> ApiServer {
        ApiServer::spawn(tmp, namespace, Some((pki, tokens)), &[])
    }

    /// The same, with more of the stand-in's options (`--tls12-only`).
    pub fn start_tls_with(
        tmp: &TempDir,
        namespace: &str,
        pki: &Pki,
        tokens: &Path,
        options: &[&str],
    ) -> ApiServer {
        ApiServer::spawn(tmp, namespace, Some((pki, tokens)), options)
    }

    fn spawn(
        tmp: &TempDir,
        namespace: &str,
        tls: Option<(&Pki, &Path)>,
        options: &[&str],
    ) -> ApiServer {
        let port_file = tmp.join("apiserver.port");
        let admin_file = tmp.join("apiserver.admin-port");
        let log = tmp.join("apiserver.log");
        let mut cmd = Command::new(PYTHON);
        cmd.arg(repo().join("tests/fixtures/kube/apiserver.py"))
            .arg(&port_file)
            .arg(namespace)
            .stdin(Stdio::null())
            .stdout(fs::File::create(&log).unwrap())
            .stderr(fs::File::options().append(true).open(&log).unwrap());
        if let Some((pki, tokens)) = tls {
            cmd.arg("--tls")
                .args([&pki.cert, &pki.key])
                .arg("--token-file")
                .arg(tokens)
                .arg("--admin-port-file")
                .arg(&admin_file)
                .args(options);
        }
        // SAFETY: prctl is async-signal-safe and touches no memory of ours.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn().expect("start the API stand-in");
        let read_port =
            |f: &Path| -> Option<u16> { fs::read_to_string(f).ok()?.trim().parse().ok() };
        let port = wait_for(STEP, "the API stand-in's port file", || {
            read_port(&port_file)
        });
        let admin_port = match tls {
            Some(_) => wait_for(STEP, "the API stand-in's admin port file", || {
                read_port(&admin_file)
            }),
            None => port,
        };
        ApiServer {
            child,
            port,
            admin_port,
            log,
        }
    }

    /// One request of the test's own on the admin port; the answer's status and JSON body.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        ctype: &str,
    ) -> (u16, Value) {
        let mut s =
            TcpStream::connect(("127.0.0.1", self.admin_port)).expect("connect to the stand-in");
        s.set_read_timeout(Some(STEP)).unwrap();
        let body = body.map(Value::to_string).unwrap_or_default();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        let code = resp.split_whitespace().nth(1).unwrap().parse().unwrap();
        let (_, json) = resp.split_once("\r\n\r\n").unwrap();
        (code, serde_json::from_str(json).unwrap_or(Value::Null))
    }

    /// DELETE of an object, which must succeed.
    pub fn delete(&self, path: &str) {
        let (code, v) = self.call("DELETE", path, None, "application/json");
        assert_eq!(code, 200, "DELETE {path}: {v}");
    }

    /// Switches faults of the stand-in (see its header); `{}` clears them.
    pub fn faults(&self, f: Value) {
        let (code, v) = self.call("PUT", "/_admin/faults", Some(&f), "application/json");
        assert_eq!(code, 200, "set faults {f}: {v}");
    }

    /// Makes `namespace` exist or not (deleting it deletes its objects, as the real one does).
    pub fn namespace(&self, namespace: &str, exists: bool) {
        let method = if exists { "PUT" } else { "DELETE" };
        let path = format!("/_admin/namespaces/{namespace}");
        assert_eq!(self.call(method, &path, None, "application/json").0, 200);
    }

    /// The API requests served so far: `(verb, name, code)`, code 0 for a lost answer.
    pub fn requests(&self) -> Vec<(String, String, u16)> {
        let (code, v) = self.call("GET", "/_admin/requests", None, "application/json");
        assert_eq!(code, 200, "{v}");
        v["requests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["verb"].as_str().unwrap().to_string(),
                    r["name"].as_str().unwrap().to_string(),
                    r["code"].as_u64().unwrap() as u16,
                )
            })
            .collect()
    }

    /// Forgets the requests served so far.
    pub fn clear_requests(&self) {
        assert_eq!(
            self.call("DELETE", "/_admin/requests", None, "application/json")
                .0,
            200
        );
    }

    /// The stand-in's log so far.
    pub fn log_text(&self) -> String {
        super::read(&self.log)
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
