//! IP addresses in settings, and the one way a host name becomes one: `/etc/hosts`.
//!
//! tfinit has no DNS resolver, on purpose: glibc's (getaddrinfo and the NSS modules it loads)
//! would be linked into the static binary only for two settings, and it cannot work in a static
//! binary anyway (NSS modules are shared libraries). Neither setting needs it: the kubelet sets
//! `KUBERNETES_SERVICE_HOST` to the `kubernetes` Service's ClusterIP in every pod, and
//! `TFINIT_METRICS_ADDR` is a local address to bind (an IP, or a name the pod's own `/etc/hosts`
//! holds, such as `localhost` or the pod's hostname, which the kubelet writes there).

use std::net::IpAddr;
use std::path::Path;

/// The hosts file names are looked up in.
pub const HOSTS: &str = "/etc/hosts";

/// `s` as an IP address: IPv4 as four decimal numbers (`10.96.0.1`; std's parser refuses
/// `10.1` and leading zeros, which C's `inet_aton` would read otherwise), IPv6 bare or in
/// brackets (`fd00::1`, `[fd00::1]`). The one parser of addresses in settings and in
/// `/etc/hosts`.
pub fn parse(s: &str) -> Option<IpAddr> {
    match s.strip_prefix('[').and_then(|v| v.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().ok().map(IpAddr::V6),
        None => s.parse().ok(),
    }
}

/// The first address `/etc/hosts` gives `name` (case-insensitively, as glibc matches), if any.
/// Read at start-up only, never on the PID-1 loop.
pub fn lookup_in_hosts(name: &str) -> std::io::Result<Option<IpAddr>> {
    lookup_in_file(Path::new(HOSTS), name)
}

/// [`lookup_in_hosts`] in `file`.
pub fn lookup_in_file(file: &Path, name: &str) -> std::io::Result<Option<IpAddr>> {
    Ok(lookup(&std::fs::read_to_string(file)?, name))
}

/// The first address of the hosts-file `text` for `name`: each line `ADDRESS NAME [ALIAS...]`,
/// `#` to the end of a line a comment; a line whose address does not parse (an IPv6 address with
/// a zone, `fe80::1%eth0`) is skipped.
fn lookup(text: &str, name: &str) -> Option<IpAddr> {
    text.lines().find_map(|line| {
        let line = line.split('#').next().unwrap_or("");
        let mut fields = line.split_ascii_whitespace();
        let ip = parse(fields.next()?)?;
        fields.any(|n| n.eq_ignore_ascii_case(name)).then_some(ip)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn addresses_parse_strictly_and_ipv6_may_be_bracketed() {
        assert_eq!(
            parse("10.96.0.1"),
            Some(IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1)))
        );
        assert_eq!(parse("fd00::1"), "fd00::1".parse().ok());
        assert_eq!(parse("[fd00::1]"), "fd00::1".parse().ok());
        for bad in [
            "10.1",
            "010.0.0.1",
            "kubernetes.default.svc",
            "[10.0.0.1]",
            "",
            "1.2.3.4.5",
            "::1]",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn names_are_found_in_a_hosts_file_and_nowhere_else() {
        let hosts = "# comment localhost\n127.0.0.1\tlocalhost\n::1 localhost ip6-localhost\n\
                     fe80::1%eth0 zoned\n10.244.1.7 pod-a.tfinit.svc pod-a # the kubelet's\n\
                     bogus metrics\n";
        assert_eq!(
            lookup(hosts, "localhost"),
            Some(IpAddr::V4(Ipv4Addr::LOCALHOST))
        );
        assert_eq!(
            lookup(hosts, "IP6-LOCALHOST"),
            Some(IpAddr::V6(Ipv6Addr::LOCALHOST))
        );
        assert_eq!(lookup(hosts, "pod-a"), parse("10.244.1.7"));
        assert_eq!(lookup(hosts, "zoned"), None, "a zone is no address of ours");
        assert_eq!(
            lookup(hosts, "metrics"),
            None,
            "a line with no address is skipped"
        );
        assert_eq!(lookup(hosts, "comment"), None, "comments are not names");
        assert_eq!(lookup(hosts, "example.com"), None);
        let dir = std::env::temp_dir().join(format!("tfinit-ip-hosts-{}", std::process::id()));
        std::fs::write(&dir, hosts).unwrap();
        assert_eq!(lookup_in_file(&dir, "pod-a").unwrap(), parse("10.244.1.7"));
        std::fs::remove_file(&dir).unwrap();
        assert!(
            lookup_in_file(&dir, "pod-a").is_err(),
            "a missing file is an error"
        );
    }
}
