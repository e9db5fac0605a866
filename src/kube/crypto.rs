//! The TLS algorithms offered to the API server: rustls's ring provider, trimmed to what a
//! Kubernetes API server speaks, so that the static binary does not carry the rest (measured in
//! Cargo.toml's note on rustls).
//!
//! kube-apiserver is Go's crypto/tls: it always accepts AES-GCM (TLS 1.3 and 1.2 with ECDHE) and
//! the P-256 and P-384 key exchanges, and its certificates are RSA (kubeadm, most managed
//! clusters) or ECDSA P-256/P-384 (k3s, kind, cert-manager). Left out: ChaCha20-Poly1305 (for
//! CPUs without AES instructions, which servers have), X25519 and Ed25519 certificates (Go
//! prefers X25519 but accepts P-256; no cluster CA signs with Ed25519), and every private-key
//! operation (tfinit authenticates with a bearer token, never a client certificate). These cut
//! about 110 KB of ring's code and tables out of the binary.

use std::sync::Arc;

use rustls::crypto::ring::{cipher_suite, kx_group};
use rustls::crypto::{
    CryptoProvider, GetRandomFailed, KeyProvider, SecureRandom, WebPkiSupportedAlgorithms,
};
use rustls::pki_types::PrivateKeyDer;
use rustls::sign::SigningKey;
use rustls::SignatureScheme;
use webpki::ring as algs;

/// The provider of every connection to the API server.
pub(super) fn provider() -> Arc<CryptoProvider> {
    Arc::new(CryptoProvider {
        cipher_suites: vec![
            cipher_suite::TLS13_AES_128_GCM_SHA256,
            cipher_suite::TLS13_AES_256_GCM_SHA384,
            cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
            cipher_suite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
            cipher_suite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        ],
        kx_groups: vec![kx_group::SECP256R1, kx_group::SECP384R1],
        signature_verification_algorithms: SIGNATURES,
        secure_random: &Random,
        key_provider: &NoClientKeys,
    })
}

/// The signatures a server's certificate chain and handshake may use: rustls's ring list without
/// Ed25519.
static SIGNATURES: WebPkiSupportedAlgorithms = WebPkiSupportedAlgorithms {
    all: &[
        algs::ECDSA_P256_SHA256,
        algs::ECDSA_P256_SHA384,
        algs::ECDSA_P384_SHA256,
        algs::ECDSA_P384_SHA384,
        algs::RSA_PSS_2048_8192_SHA256_LEGACY_KEY,
        algs::RSA_PSS_2048_8192_SHA384_LEGACY_KEY,
        algs::RSA_PSS_2048_8192_SHA512_LEGACY_KEY,
        algs::RSA_PKCS1_2048_8192_SHA256,
        algs::RSA_PKCS1_2048_8192_SHA384,
        algs::RSA_PKCS1_2048_8192_SHA512,
        algs::RSA_PKCS1_2048_8192_SHA256_ABSENT_PARAMS,
        algs::RSA_PKCS1_2048_8192_SHA384_ABSENT_PARAMS,
        algs::RSA_PKCS1_2048_8192_SHA512_ABSENT_PARAMS,
    ],
    mapping: &[
        // In TLS 1.2 the scheme does not fix the curve (in 1.3 it does).
        (
            SignatureScheme::ECDSA_NISTP384_SHA384,
            &[algs::ECDSA_P384_SHA384, algs::ECDSA_P256_SHA384],
        ),
        (
            SignatureScheme::ECDSA_NISTP256_SHA256,
            &[algs::ECDSA_P256_SHA256, algs::ECDSA_P384_SHA256],
        ),
        (
            SignatureScheme::RSA_PSS_SHA512,
            &[algs::RSA_PSS_2048_8192_SHA512_LEGACY_KEY],
        ),
        (
            SignatureScheme::RSA_PSS_SHA384,
            &[algs::RSA_PSS_2048_8192_SHA384_LEGACY_KEY],
        ),
        (
            SignatureScheme::RSA_PSS_SHA256,
            &[algs::RSA_PSS_2048_8192_SHA256_LEGACY_KEY],
        ),
        (
            SignatureScheme::RSA_PKCS1_SHA512,
            &[algs::RSA_PKCS1_2048_8192_SHA512],
        ),
        (
            SignatureScheme::RSA_PKCS1_SHA384,
            &[algs::RSA_PKCS1_2048_8192_SHA384],
        ),
        (
            SignatureScheme::RSA_PKCS1_SHA256,
            &[algs::RSA_PKCS1_2048_8192_SHA256],
        ),
    ],
};

/// The kernel's randomness, through ring (what rustls's own ring provider uses).
#[derive(Debug)]
struct Random;

impl SecureRandom for Random {
    fn fill(&self, buf: &mut [u8]) -> Result<(), GetRandomFailed> {
        use ring::rand::SecureRandom as _;
        ring::rand::SystemRandom::new()
            .fill(buf)
            .map_err(|_| GetRandomFailed)
    }
}

/// No private keys: tfinit never presents a client certificate.
#[derive(Debug)]
struct NoClientKeys;

impl KeyProvider for NoClientKeys {
    fn load_private_key(
        &self,
        _key: PrivateKeyDer<'static>,
    ) -> Result<Arc<dyn SigningKey>, rustls::Error> {
        Err(rustls::Error::General(
            "tfinit authenticates with the service account's token, never a client key".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_provider_is_consistent_and_offers_no_chacha_or_x25519() {
        let p = provider();
        let suites: Vec<String> = p
            .cipher_suites
            .iter()
            .map(|s| format!("{:?}", s.suite()))
            .collect();
        assert!(suites.iter().all(|s| s.contains("AES")), "{suites:?}");
        assert!(suites.iter().any(|s| s.starts_with("TLS13")), "{suites:?}");
        let groups: Vec<String> = p
            .kx_groups
            .iter()
            .map(|g| format!("{:?}", g.name()))
            .collect();
        assert_eq!(groups, ["secp256r1", "secp384r1"]);
        // A client config builds from it, for TLS 1.3 and 1.2.
        rustls::ClientConfig::builder_with_provider(p)
            .with_protocol_versions(rustls::ALL_VERSIONS)
            .expect("the provider covers both versions");
    }
}
