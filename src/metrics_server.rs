//! `GET /metrics` over HTTP on `TFINIT_METRICS_ADDR`, served by a thread of its own.
//!
//! The loop never sees a scraper: this thread accepts, reads the request and writes the text of
//! [`Metrics::render`], which reads only atomics the loop updates. A scraper that connects and
//! never reads (or never writes its request) holds one connection thread until its timeout, never
//! the loop. The accept blocks, so an idle init has no wake-up for it. The thread is started after
//! main blocked every signal, inherits that mask and changes nothing in it (signals stay for the
//! loop's signalfd).
//!
//! HTTP is the smallest subset Prometheus needs: one request per connection (`Connection:
//! close`), `GET` or `HEAD` of `/metrics`, 404 for other paths, 405 for other methods. A library
//! would bring a thread pool and a parser this does not need (see the note in Cargo.toml).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::metrics::{Metrics, CONTENT_TYPE};

/// How long a scraper may take to send its request, and to take the answer.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Connections served at once; one more is closed at once (a scraper is one process, and each
/// connection holds a thread until it is done or timed out).
const MAX_CONNECTIONS: usize = 8;

/// The longest request head read.
const MAX_HEAD: usize = 8 << 10;

/// Parses `TFINIT_METRICS_ADDR`: `:9102` (every address), `127.0.0.1:9102`, `[::]:9102`, or a
/// host name and port. Resolving a host name happens here, at start-up, never on the loop.
/// Strictly: the port is decimal digits without a sign or leading zeros (std's parser would take
/// `+80`), an IPv6 address is in brackets (`::1:80` could be either), and a host of digits and
/// dots must be an IPv4 address (the resolver would read `10.1` as 10.0.0.1).
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    const FORM: &str = "must be HOST:PORT or :PORT with a port from 0 to 65535 in digits, and an \
                        IPv6 address in brackets ([::1]:9102)";
    let (host, port) = s.rsplit_once(':').ok_or(FORM)?;
    let port = strict_port(port).ok_or(FORM)?;
    if host.is_empty() {
        return Ok(SocketAddr::from(([0, 0, 0, 0], port)));
    }
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        let ip: std::net::Ipv6Addr = v6
            .parse()
            .map_err(|_| format!("[{v6}] is not an IPv6 address"))?;
        return Ok(SocketAddr::from((ip, port)));
    }
    if host.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        let ip: std::net::Ipv4Addr = host
            .parse()
            .map_err(|_| format!("{host} is not an IPv4 address (four numbers: 127.0.0.1)"))?;
        return Ok(SocketAddr::from((ip, port)));
    }
    if !host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    {
        return Err(FORM.into());
    }
    (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot be resolved ({e})"))?
        .next()
        .ok_or_else(|| "resolves to no address".to_string())
}

/// A port as written in an address: 1 to 5 decimal digits, no sign, no leading zero (but `0`,
/// which asks the kernel for a free port), at most 65535.
fn strict_port(p: &str) -> Option<u16> {
    let digits = !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    let canonical = p == "0" || !p.starts_with('0');
    (digits && canonical).then(|| p.parse().ok()).flatten()
}

/// Binds `addr` and starts the thread that serves `metrics` there; returns the address bound
/// (the port the kernel chose for port 0). Fails when the address cannot be bound (in use, not
/// ours) or the thread cannot start.
pub fn start(addr: SocketAddr, metrics: Arc<Metrics>) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    std::thread::Builder::new()
        .name("tfinit-metrics".into())
        .spawn(move || serve(&listener, &metrics))?;
    Ok(bound)
}

fn serve(listener: &TcpListener, metrics: &Arc<Metrics>) {
    let busy = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        // An accept error (a connection reset before it was taken, out of descriptors) concerns
        // that connection only.
        let Ok(conn) = conn else { continue };
        if busy.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            busy.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let (metrics, done) = (Arc::clone(metrics), Arc::clone(&busy));
        let spawned = std::thread::Builder::new()
            .name("tfinit-scrape".into())
            .spawn(move || {
                // A scraper that went away is no concern of the init's.
                let _ = answer(conn, &metrics);
                done.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            busy.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Reads one request on `conn` and answers it.
fn answer(mut conn: TcpStream, metrics: &Metrics) -> io::Result<()> {
    conn.set_read_timeout(Some(TIMEOUT))?;
    conn.set_write_timeout(Some(TIMEOUT))?;
    let head = read_head(&mut conn)?;
    let (status, body) = respond(&head, metrics);
    let head_only = head.starts_with("HEAD ");
    let content_type = if status == 200 {
        CONTENT_TYPE
    } else {
        "text/plain; charset=utf-8"
    };
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Bad Request",
    };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if status == 405 {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    conn.write_all(out.as_bytes())?;
    if !head_only {
        conn.write_all(body.as_bytes())?;
    }
    conn.flush()
}

/// The request head (up to the blank line), at most [`MAX_HEAD`] bytes.
fn read_head(conn: &mut TcpStream) -> io::Result<String> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.ends_with(b"\n\n") {
        if head.len() >= MAX_HEAD {
            break;
        }
        let n = conn.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// The status and body for request `head`.
fn respond(head: &str, metrics: &Metrics) -> (u16, String) {
    let mut words = head.lines().next().unwrap_or("").split_whitespace();
    let (Some(method), Some(target)) = (words.next(), words.next()) else {
        return (
            400,
            "not an HTTP request: tfinit serves GET /metrics\n".into(),
        );
    };
    let path = target.split('?').next().unwrap_or(target);
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => (200, metrics.render()),
        ("GET" | "HEAD", _) => (404, "tfinit serves /metrics only\n".into()),
        _ => (405, "tfinit serves GET /metrics only\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn addresses_take_a_port_with_or_without_a_host() {
        assert_eq!(
            parse_addr(":9102").unwrap(),
            "0.0.0.0:9102".parse().unwrap()
        );
        assert_eq!(
            parse_addr("127.0.0.1:0").unwrap(),
            "127.0.0.1:0".parse().unwrap()
        );
        assert_eq!(parse_addr("[::1]:9").unwrap(), "[::1]:9".parse().unwrap());
        assert_eq!(
            parse_addr(":65535").unwrap(),
            "0.0.0.0:65535".parse().unwrap()
        );
        assert_eq!(
            parse_addr("localhost:9102").unwrap().port(),
            9102,
            "a host name is resolved"
        );
        for bad in [
            "9102",
            ":http",
            "127.0.0.1:99999",
            "",
            ":",
            ":+80",
            ":-80",
            ": 80",
            ":080",
            ":65536",
            "127.0.0.1:+80",
            "::1:80",
            "[::1]:+80",
            "[nope]:80",
            "10.1:80",
            "1.2.3.4.5:80",
            "local host:80",
        ] {
            assert!(parse_addr(bad).is_err(), "{bad:?}");
        }
    }

    fn get(addr: SocketAddr, request: &str) -> String {
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn metrics_are_served_and_other_requests_are_refused_by_name() {
        let m = Arc::new(Metrics::new("t"));
        m.reaped(7);
        let addr = start("127.0.0.1:0".parse().unwrap(), m).unwrap();
        let ok = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains("application/openmetrics-text"), "{ok}");
        assert!(ok.contains("tfinit_zombies_reaped_total 7"), "{ok}");
        assert!(ok.ends_with("# EOF\n"), "{ok}");
        let head = get(addr, "HEAD /metrics HTTP/1.0\r\n\r\n");
        assert!(
            head.starts_with("HTTP/1.1 200") && !head.contains("# EOF"),
            "{head}"
        );
        assert!(get(addr, "GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        let post = get(addr, "POST /metrics HTTP/1.1\r\n\r\n");
        assert!(post.starts_with("HTTP/1.1 405") && post.contains("Allow: GET, HEAD"));
        assert!(get(addr, "\r\n\r\n").starts_with("HTTP/1.1 400"));
    }

    #[test]
    fn clients_that_never_send_or_never_read_do_not_hold_up_the_next_scrape() {
        let m = Arc::new(Metrics::new("t"));
        let addr = start("127.0.0.1:0".parse().unwrap(), m).unwrap();
        // One that never writes its request, one that asks and never reads.
        let _silent = TcpStream::connect(addr).unwrap();
        let mut deaf = TcpStream::connect(addr).unwrap();
        deaf.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let t = Instant::now();
        let ok = get(addr, "GET /metrics HTTP/1.1\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(
            t.elapsed() < TIMEOUT,
            "served while the others wait: {:?}",
            t.elapsed()
        );
    }

    #[test]
    fn a_port_in_use_is_an_error_to_report() {
        let held = TcpListener::bind("127.0.0.1:0").unwrap();
        let e = start(held.local_addr().unwrap(), Arc::new(Metrics::new("t"))).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
    }
}
