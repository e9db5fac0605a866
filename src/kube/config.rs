//! Where the API server is and who we are to it, found as client-go's `rest.InClusterConfig`
//! finds it: the server from `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT` (the kubelet
//! sets both in every pod, the host an IP address: tfinit connects to it without any name lookup,
//! see [`crate::ip`]; an IPv6 host goes in brackets), and the pod's service account in a
//! directory of three files: `token` (the bearer token, re-read while running: see
//! [`super::token`]), `ca.crt` (the only certificate authority the server is verified against)
//! and `namespace` (where the pod's Leases live).
//!
//! The directory is `/var/run/secrets/kubernetes.io/serviceaccount` unless
//! `TFINIT_SERVICE_ACCOUNT_DIR` names another: tests run many "pods" on one machine. The three
//! variables are read in [`Config::in_cluster`] only.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use ureq::tls::{parse_pem, Certificate, PemItem};

/// Where the kubelet mounts the pod's service account.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The variable that points tfinit at another service-account directory.
pub const SERVICE_ACCOUNT_DIR_VAR: &str = "TFINIT_SERVICE_ACCOUNT_DIR";

/// How to reach the API server and authenticate to it, validated.
#[derive(Clone)]
pub struct Config {
    /// `https://HOST:PORT`, an IPv6 host in brackets.
    server: String,
    /// The same address, which the client connects to (never a name: no lookup).
    addr: SocketAddr,
    /// The pod's namespace (the `namespace` file).
    namespace: String,
    /// The `token` file, re-read while running.
    token_path: PathBuf,
    /// The token as read now (not empty).
    token: String,
    /// The `ca.crt` file (for messages).
    ca_path: PathBuf,
    /// Its certificates (at least one that rustls can use).
    ca: Vec<Certificate<'static>>,
}

impl std::fmt::Debug for Config {
    // The token is a credential: never in a log line or a panic message.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("server", &self.server)
            .field("namespace", &self.namespace)
            .field("token_path", &self.token_path)
            .field("ca_path", &self.ca_path)
            .finish_non_exhaustive()
    }
}

/// Why there is no usable in-cluster configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Not in a pod (or the variables were removed): the Kubernetes API cannot be found.
    #[error(
        "{var} is not set: not in a Kubernetes pod, so the API server cannot be found (the kubelet \
         sets KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT in every pod)"
    )]
    NotInCluster {
        /// The variable that is missing or empty.
        var: &'static str,
    },
    /// `KUBERNETES_SERVICE_HOST` is a name: tfinit connects to an IP only (it has no resolver).
    #[error(
        "KUBERNETES_SERVICE_HOST={value:?} is not an IP address: tfinit reaches the API server at \
         an IP only, with no DNS lookup (the kubelet sets the kubernetes Service's ClusterIP, for \
         example 10.96.0.1 or fd00::1, in every pod); remove the setting that overrides the \
         kubelet's value, or set the API server's IP address"
    )]
    NotAnIp {
        /// The value as given.
        value: String,
    },
    /// `KUBERNETES_SERVICE_PORT` is not a port.
    #[error(
        "KUBERNETES_SERVICE_PORT={value:?} is not a port: it must be a number from 1 to 65535 \
         (for example 443), as the kubelet sets it"
    )]
    InvalidPort {
        /// The value as given.
        value: String,
    },
    /// A file of the service account cannot be read (the directory is not mounted, most often).
    #[error(
        "cannot read the service account's {what} {path}: {source}; mount the service account \
         (automountServiceAccountToken: true, the default) or set TFINIT_SERVICE_ACCOUNT_DIR to a \
         directory holding token, ca.crt and namespace"
    )]
    Unreadable {
        /// `token`, `ca.crt` or `namespace`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file of the service account is empty.
    #[error(
        "the service account's {what} {path} is empty; mount the service account \
         (automountServiceAccountToken: true) or set TFINIT_SERVICE_ACCOUNT_DIR to a directory \
         holding token, ca.crt and namespace"
    )]
    Empty {
        /// `token`, `ca.crt` or `namespace`.
        what: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// `ca.crt` holds no certificate rustls can use: the server could not be verified.
    #[error(
        "{path} holds no usable CA certificate ({detail}); the API server cannot be verified and \
         tfinit never skips verification: mount the cluster's ca.crt there"
    )]
    InvalidCa {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// `namespace` does not hold a namespace name.
    #[error(
        "{path} holds {value:?}, not a namespace name (lowercase letters, digits and '-', at \
         most 63, for example tfinit); mount the service account, whose namespace file the \
         kubelet writes"
    )]
    InvalidNamespace {
        /// The file.
        path: PathBuf,
        /// What it holds (trimmed).
        value: String,
    },
}

impl Config {
    /// The configuration of the pod this process runs in: `KUBERNETES_SERVICE_HOST`,
    /// `KUBERNETES_SERVICE_PORT`, and the service-account directory (`TFINIT_SERVICE_ACCOUNT_DIR`
    /// or [`SERVICE_ACCOUNT_DIR`]). The only place these variables are read.
    pub fn in_cluster() -> Result<Config, ConfigError> {
        let var = |name: &'static str| {
            std::env::var(name)
                .ok()
                .filter(|v| !v.is_empty())
                .ok_or(ConfigError::NotInCluster { var: name })
        };
        let host = var("KUBERNETES_SERVICE_HOST")?;
        let port = var("KUBERNETES_SERVICE_PORT")?;
        let dir = std::env::var_os(SERVICE_ACCOUNT_DIR_VAR)
            .filter(|d| !d.is_empty())
            .map_or_else(|| PathBuf::from(SERVICE_ACCOUNT_DIR), PathBuf::from);
        Config::from_dir(&host, &port, &dir)
    }

    /// The configuration of a server at `host`:`port` (an IP address; IPv6 bare or in brackets)
    /// and the service account whose `token`, `ca.crt` and `namespace` are in `dir`.
    pub fn from_dir(host: &str, port: &str, dir: &Path) -> Result<Config, ConfigError> {
        let ip =
            crate::ip::parse(host).ok_or_else(|| ConfigError::NotAnIp { value: host.into() })?;
        let port_number: u16 = port
            .parse()
            .ok()
            .filter(|p| *p != 0 && !port.starts_with('+'))
            .ok_or_else(|| ConfigError::InvalidPort { value: port.into() })?;
        let token_path = dir.join("token");
        let token = super::token::read(&token_path).map_err(|e| match e {
            super::token::ReadError::Io(source) => ConfigError::Unreadable {
                what: "token",
                path: token_path.clone(),
                source,
            },
            super::token::ReadError::Empty => ConfigError::Empty {
                what: "token",
                path: token_path.clone(),
            },
        })?;
        let ca_path = dir.join("ca.crt");
        let ca = read_ca(&ca_path)?;
        let ns_path = dir.join("namespace");
        let namespace =
            std::fs::read_to_string(&ns_path).map_err(|source| ConfigError::Unreadable {
                what: "namespace",
                path: ns_path.clone(),
                source,
            })?;
        let namespace = namespace.trim().to_string();
        if namespace.is_empty() {
            return Err(ConfigError::Empty {
                what: "namespace",
                path: ns_path,
            });
        }
        if !is_namespace(&namespace) {
            return Err(ConfigError::InvalidNamespace {
                path: ns_path,
                value: namespace,
            });
        }
        Ok(Config {
            server: server_url(ip, port_number),
            addr: SocketAddr::from((ip, port_number)),
            namespace,
            token_path,
            token,
            ca_path,
            ca,
        })
    }

    /// `https://HOST:PORT`.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The pod's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The token file.
    pub fn token_path(&self) -> &Path {
        &self.token_path
    }

    /// The CA file.
    pub fn ca_path(&self) -> &Path {
        &self.ca_path
    }

    /// The parts the client takes over.
    pub(super) fn into_parts(self) -> Parts {
        Parts {
            server: self.server,
            addr: self.addr,
            namespace: self.namespace,
            token_path: self.token_path,
            token: self.token,
            ca_path: self.ca_path,
            ca: self.ca,
        }
    }
}

/// A [`Config`] taken apart by the client.
pub(super) struct Parts {
    pub server: String,
    pub addr: SocketAddr,
    pub namespace: String,
    pub token_path: PathBuf,
    pub token: String,
    pub ca_path: PathBuf,
    pub ca: Vec<Certificate<'static>>,
}

/// `https://host:port` as Go's `net.JoinHostPort` writes it: an IPv6 address in brackets.
fn server_url(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v4) => format!("https://{v4}:{port}"),
        IpAddr::V6(v6) => format!("https://[{v6}]:{port}"),
    }
}

/// The certificates of `path`, refused unless rustls accepts at least one as a trust anchor (it
/// skips the ones it cannot use; an empty set would fail every connection with a vaguer error).
fn read_ca(path: &Path) -> Result<Vec<Certificate<'static>>, ConfigError> {
    let pem = std::fs::read(path).map_err(|source| ConfigError::Unreadable {
        what: "ca.crt",
        path: path.to_path_buf(),
        source,
    })?;
    if pem.iter().all(u8::is_ascii_whitespace) {
        return Err(ConfigError::Empty {
            what: "ca.crt",
            path: path.to_path_buf(),
        });
    }
    let invalid = |detail: String| ConfigError::InvalidCa {
        path: path.to_path_buf(),
        detail,
    };
    let mut certs = Vec::new();
    for item in parse_pem(&pem) {
        match item {
            Ok(PemItem::Certificate(c)) => certs.push(c),
            Ok(_) => {}
            Err(e) => return Err(invalid(format!("not PEM: {e}"))),
        }
    }
    if certs.is_empty() {
        return Err(invalid("no BEGIN CERTIFICATE block".into()));
    }
    let mut roots = rustls::RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(
        certs
            .iter()
            .map(|c| rustls::pki_types::CertificateDer::from(c.der())),
    );
    if added == 0 {
        return Err(invalid(format!(
            "{} certificate(s), none usable as a trust anchor",
            certs.len()
        )));
    }
    Ok(certs)
}

/// Whether `s` is a namespace name (an RFC 1123 label: what the API server accepts).
fn is_namespace(s: &str) -> bool {
    s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_urls_bracket_ipv6_hosts_as_go_does() {
        let ip = |s| crate::ip::parse(s).unwrap();
        assert_eq!(server_url(ip("10.96.0.1"), 443), "https://10.96.0.1:443");
        assert_eq!(server_url(ip("fd00::1"), 443), "https://[fd00::1]:443");
        assert_eq!(server_url(ip("[fd00::1]"), 6443), "https://[fd00::1]:6443");
    }

    #[test]
    fn namespaces_are_rfc1123_labels() {
        assert!(is_namespace("tfinit"));
        assert!(is_namespace("crossplane-system"));
        assert!(!is_namespace("Tfinit"));
        assert!(!is_namespace("-a"));
        assert!(!is_namespace("a.b"));
        assert!(!is_namespace(&"a".repeat(64)));
    }

    fn dir_with(token: &str, ca: &[u8], ns: &str) -> PathBuf {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let d = std::env::temp_dir().join(format!(
            "tfinit-kube-config-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("token"), token).unwrap();
        std::fs::write(d.join("ca.crt"), ca).unwrap();
        std::fs::write(d.join("namespace"), ns).unwrap();
        d
    }

    #[test]
    fn a_bad_port_a_missing_token_and_a_bad_ca_are_each_named() {
        let mut made = Vec::new();
        let mut dir_with = |token: &str, ca: &[u8], ns: &str| {
            made.push(dir_with(token, ca, ns));
            made.last().unwrap().clone()
        };
        let d = dir_with("t", b"", "ns");
        let e = Config::from_dir("10.0.0.1", "+443", &d).unwrap_err();
        assert!(matches!(e, ConfigError::InvalidPort { .. }), "{e}");
        let e = Config::from_dir("10.0.0.1", "0", &d).unwrap_err();
        assert!(matches!(e, ConfigError::InvalidPort { .. }), "{e}");
        let e = Config::from_dir("10.0.0.1", "443", &d.join("absent")).unwrap_err();
        assert!(
            matches!(e, ConfigError::Unreadable { what: "token", .. }),
            "{e}"
        );
        assert!(e.to_string().contains("TFINIT_SERVICE_ACCOUNT_DIR"), "{e}");
        let e = Config::from_dir("10.0.0.1", "443", &d).unwrap_err();
        assert!(
            matches!(e, ConfigError::Empty { what: "ca.crt", .. }),
            "{e}"
        );

        let d = dir_with("\n", b"x", "ns");
        let e = Config::from_dir("10.0.0.1", "443", &d).unwrap_err();
        assert!(matches!(e, ConfigError::Empty { what: "token", .. }), "{e}");

        let d = dir_with("t", b"not a certificate\n", "ns");
        let e = Config::from_dir("10.0.0.1", "443", &d).unwrap_err();
        assert!(matches!(e, ConfigError::InvalidCa { .. }), "{e}");

        // PEM armour around bytes that are no certificate: parsed, then refused by rustls.
        let d = dir_with(
            "t",
            b"-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n",
            "ns",
        );
        let e = Config::from_dir("10.0.0.1", "443", &d).unwrap_err();
        assert!(matches!(e, ConfigError::InvalidCa { .. }), "{e}");
        assert!(e.to_string().contains("never skips verification"), "{e}");

        // The CA is read before the namespace: a bad namespace needs a good CA, which the
        // integration tests make (tests/kube_client.rs).
        for d in made {
            std::fs::remove_dir_all(d).unwrap();
        }
    }
}
