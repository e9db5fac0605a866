//! Lease names. A Lease's name must be a DNS subdomain (RFC 1123): at most 253 characters,
//! lowercase letters, digits, '-' and '.', every dot-separated part starting and ending with a
//! letter or digit. [`lease_name`] makes one from any pod name and a suffix: the plain
//! `POD-SUFFIX` when that is valid (a pod's name is a DNS subdomain already, so this is the
//! usual case and a person reads it at once), else a readable rest of the pod name, a hash of
//! both inputs, and the suffix.
//!
//! The hash is the first 16 hex digits (64 bits) of SHA-256 over the pod name, a zero byte and
//! the suffix: deterministic across versions and machines (a replacement pod computes the same
//! name), and two inputs share a name with odds of 2^-64 per pair, far below anything a
//! namespace holds. SHA-256 comes from ring, which rustls links already: no new code.

/// The longest name the API accepts.
pub const MAX_NAME: usize = 253;

/// Hex digits of the hash in a hashed name.
const HASH_HEX: usize = 16;

/// Whether `s` is a DNS subdomain (RFC 1123), what the API requires of a Lease's name.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_NAME && s.split('.').all(is_label)
}

/// One dot-separated part: letters, digits and '-', starting and ending with a letter or digit.
fn is_label(l: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let b = l.as_bytes();
    !b.is_empty()
        && alnum(b[0])
        && alnum(b[b.len() - 1])
        && b.iter().all(|&c| alnum(c) || c == b'-')
}

/// A valid Lease name for `pod` and `suffix` (`tfinit`, a record's id, ...): `POD-SUFFIX` when
/// that is a DNS subdomain, else `READABLE-HASH-SUFFIX` (or `HASH-SUFFIX` when nothing of the pod
/// name is readable), where READABLE is the pod name lowercased with other characters as '-',
/// cut to fit, and SUFFIX the suffix made valid the same way.
pub fn lease_name(pod: &str, suffix: &str) -> String {
    let plain = format!("{pod}-{suffix}");
    if is_dns_subdomain(&plain) {
        return plain;
    }
    let hash = hash_hex(pod, suffix);
    // At most half the room to the suffix: a long suffix still leaves the pod readable.
    let suffix = cut(&sanitize(suffix), (MAX_NAME - HASH_HEX - 2) / 2);
    let room = MAX_NAME - HASH_HEX - 2 - suffix.len();
    let readable = cut(&sanitize(pod), room);
    let parts = [readable.as_str(), hash.as_str(), suffix.as_str()];
    let name = parts
        .iter()
        .filter(|p| !p.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join("-");
    debug_assert!(is_dns_subdomain(&name), "{name}");
    name
}

/// The longest label value the API accepts.
pub const MAX_LABEL_VALUE: usize = 63;

/// Whether `s` is a valid label value: at most 63 characters of letters, digits, '-', '_' and
/// '.', starting and ending with a letter or digit (the empty value is valid too).
pub fn is_label_value(s: &str) -> bool {
    let b = s.as_bytes();
    s.len() <= MAX_LABEL_VALUE
        && (b.is_empty()
            || (b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))))
}

/// A label value standing for `s`: `s` itself when it is a valid one, else the [`HASH_HEX`] hex
/// digits of its hash (the same on every machine, so a selector made elsewhere finds it).
pub fn label_value(s: &str) -> String {
    if is_label_value(s) {
        s.to_string()
    } else {
        hash_hex(s, "")
    }
}

/// The first [`HASH_HEX`] hex digits of SHA-256(pod, 0, suffix).
fn hash_hex(pod: &str, suffix: &str) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(pod.as_bytes());
    ctx.update(&[0]);
    ctx.update(suffix.as_bytes());
    ctx.finish()
        .as_ref()
        .iter()
        .take(HASH_HEX / 2)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `s` made a DNS subdomain, or empty: lowercase, other characters as '-', empty parts dropped,
/// and every part trimmed of '-' at its ends.
fn sanitize(s: &str) -> String {
    let mapped: String = s
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '.') => c,
            _ => '-',
        })
        .collect();
    mapped
        .split('.')
        .map(|l| l.trim_matches('-'))
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(".")
}

/// A sanitized `s` cut to at most `max` bytes (it is ASCII), still valid (or empty).
fn cut(s: &str, max: usize) -> String {
    let head = &s[..s.len().min(max)];
    head.trim_end_matches(['-', '.']).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_kept_when_valid_and_hashed_when_not() {
        assert_eq!(label_value("pod-a"), "pod-a");
        assert_eq!(label_value("Pod_A.1"), "Pod_A.1");
        for bad in ["-a", "a b", "é", &"a".repeat(64)] {
            let v = label_value(bad);
            assert!(is_label_value(&v) && v.len() == HASH_HEX, "{bad:?}: {v}");
            assert_eq!(v, label_value(bad), "the same everywhere");
        }
        assert_ne!(label_value("-a"), label_value("-b"));
    }

    #[test]
    fn dns_subdomains_are_recognised() {
        assert!(is_dns_subdomain("a"));
        assert!(is_dns_subdomain("provider-terraform-7d9f8-x2b4q"));
        assert!(is_dns_subdomain("a.b-c.d9"));
        assert!(is_dns_subdomain(&"a".repeat(253)));
        for bad in [
            "",
            "A",
            "-a",
            "a-",
            "a..b",
            ".a",
            "a.",
            "a_b",
            "a b",
            "é",
            &"a".repeat(254),
        ] {
            assert!(!is_dns_subdomain(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_valid_pod_name_is_kept_as_it_is() {
        assert_eq!(
            lease_name("provider-terraform-7d9f8-x2b4q", "tfinit"),
            "provider-terraform-7d9f8-x2b4q-tfinit"
        );
        assert_eq!(lease_name("web.0", "r-12"), "web.0-r-12");
    }

    #[test]
    fn odd_pod_names_are_made_valid_with_a_hash() {
        for pod in [
            "",
            "-",
            "My_Pod",
            "pod.",
            "a..b",
            "héllo wörld",
            "..--..",
            "UPPER",
            "\u{0}\n",
        ] {
            let name = lease_name(pod, "tfinit");
            assert!(is_dns_subdomain(&name), "{pod:?} -> {name:?}");
            assert!(name.ends_with("-tfinit"), "{name}");
        }
        assert!(lease_name("My_Pod", "tfinit").starts_with("my-pod-"));
        // Two pods that sanitize alike still differ by their hash.
        assert_ne!(lease_name("My_Pod", "x"), lease_name("my-pod_", "x"));
        assert_ne!(lease_name("My_Pod", "x"), lease_name("My_Pod", "y"));
        assert_ne!(lease_name("a\u{0}b", "c"), lease_name("a", "b\u{0}c"));
    }

    #[test]
    fn long_names_are_cut_to_253_and_stay_distinct() {
        let pod = "p".repeat(253);
        let name = lease_name(&pod, "tfinit");
        assert_eq!(name.len(), 253, "{name}");
        assert!(is_dns_subdomain(&name));
        assert!(name.ends_with("-tfinit"));
        let other = lease_name(&format!("{}q", "p".repeat(252)), "tfinit");
        assert_eq!(other.len(), 253);
        assert_ne!(name, other);
        // Exactly at the limit, nothing to hash.
        let pod = "a".repeat(253 - "-tfinit".len());
        assert_eq!(lease_name(&pod, "tfinit"), format!("{pod}-tfinit"));
        // One more: hashed.
        let pod = "a".repeat(254 - "-tfinit".len());
        let name = lease_name(&pod, "tfinit");
        assert!(is_dns_subdomain(&name) && name != format!("{pod}-tfinit"));
        // A cut that would end on '.' or '-' is trimmed.
        let pod = format!("{}.b", "a".repeat(228));
        assert!(is_dns_subdomain(&lease_name(&pod, "tfinit-x")));
        // An absurd suffix is cut too, and the pod still shows.
        let name = lease_name("pod", &"S".repeat(400));
        assert!(
            is_dns_subdomain(&name) && name.starts_with("pod-"),
            "{name}"
        );
    }

    #[test]
    fn names_are_deterministic() {
        // The same on every machine and version (checked against Python's hashlib): a
        // replacement pod finds its predecessor's.
        assert_eq!(
            lease_name("My_Pod", "tfinit"),
            "my-pod-1aed32240f990fc0-tfinit"
        );
    }
}
