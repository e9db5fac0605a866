//! Certificates for the HTTPS stand-in API server, made by the `openssl` command line as a
//! cluster's would be: a CA (what the service account's `ca.crt` holds) and a server certificate
//! it signs, for 127.0.0.1 and localhost unless told otherwise, with ECDSA P-256 keys (k3s, kind)
//! or RSA 2048 (kubeadm). A second [`Pki`] is another CA: its `ca.crt` does not verify the first
//! one's server.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The names of the default server certificate.
const LOCAL: &str = "IP:127.0.0.1,DNS:localhost";

/// The `openssl` these helpers run.
pub const OPENSSL: &str = "openssl";

/// Whether `openssl` runs here.
pub fn have_openssl() -> bool {
    Command::new(OPENSSL)
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The kind of keys of a [`Pki`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// ECDSA on P-256.
    EcP256,
    /// RSA, 2048 bits.
    Rsa2048,
}

impl KeyKind {
    /// `openssl req`'s arguments for a new key of this kind.
    fn newkey(self) -> &'static [&'static str] {
        match self {
            KeyKind::EcP256 => &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"],
            KeyKind::Rsa2048 => &["-newkey", "rsa:2048"],
        }
    }
}

/// A CA and a server certificate it signed, as PEM files.
pub struct Pki {
    /// The CA's certificate (the service account's `ca.crt`).
    pub ca: PathBuf,
    /// The server's certificate.
    pub cert: PathBuf,
    /// The server's private key.
    pub key: PathBuf,
}

impl Pki {
    /// A CA `name` and a server certificate for 127.0.0.1 and localhost (P-256), in `dir/name/`.
    pub fn new(dir: &Path, name: &str) -> Pki {
        Pki::make(dir, name, LOCAL, KeyKind::EcP256)
    }

    /// The same with RSA keys, as kubeadm makes them.
    pub fn rsa(dir: &Path, name: &str) -> Pki {
        Pki::make(dir, name, LOCAL, KeyKind::Rsa2048)
    }

    /// A CA `name` and a server certificate whose subjectAltName is `san` (`DNS:x,IP:y`).
    pub fn for_names(dir: &Path, name: &str, san: &str) -> Pki {
        Pki::make(dir, name, san, KeyKind::EcP256)
    }

    fn make(dir: &Path, name: &str, san: &str, kind: KeyKind) -> Pki {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        let p = |f: &str| d.join(f);
        let newkey = kind.newkey();
        openssl(
            Command::new(OPENSSL)
                .args(["req", "-x509"])
                .args(newkey)
                .arg("-nodes")
                .arg("-keyout")
                .arg(p("ca.key"))
                .arg("-out")
                .arg(p("ca.crt"))
                .args(["-days", "2", "-subj", &format!("/CN=tfinit-test-{name}-ca")])
                .args(["-addext", "basicConstraints=critical,CA:TRUE"])
                .args(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]),
        );
        openssl(
            Command::new(OPENSSL)
                .args(["req", "-new"])
                .args(newkey)
                .arg("-nodes")
                .arg("-keyout")
                .arg(p("server.key"))
                .arg("-out")
                .arg(p("server.csr"))
                .args(["-subj", "/CN=kube-apiserver"]),
        );
        std::fs::write(
            p("server.ext"),
            format!(
                "subjectAltName={san}\nbasicConstraints=critical,CA:FALSE\n\
                 keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
            ),
        )
        .unwrap();
        openssl(
            Command::new(OPENSSL)
                .args(["x509", "-req", "-days", "2", "-set_serial", "2"])
                .arg("-in")
                .arg(p("server.csr"))
                .arg("-CA")
                .arg(p("ca.crt"))
                .arg("-CAkey")
                .arg(p("ca.key"))
                .arg("-extfile")
                .arg(p("server.ext"))
                .arg("-out")
                .arg(p("server.crt")),
        );
        Pki {
            ca: p("ca.crt"),
            cert: p("server.crt"),
            key: p("server.key"),
        }
    }
}

/// Runs one openssl command, which must succeed within a minute.
fn openssl(cmd: &mut Command) {
    let out = super::run_output(
        cmd.stdin(std::process::Stdio::null()),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
