//! `GET /metrics` over HTTP on `TFINIT_METRICS_ADDR`, served by a thread of its own.
//!
//! The loop never sees a scraper: this thread accepts, reads the request and writes the text of
//! [`Metrics::render`], which reads only atomics the loop updates. It serves up to
//! [`MAX_CONNECTIONS`] clients at once on non-blocking sockets with one poll(2), and each gets
//! [`DEADLINE`] for the whole exchange (reading its request head and writing our answer): a
//! client that drips its request a byte at a time, or never reads the answer, is closed when its
//! time is up. When every place is taken, a new client closes the oldest one still sending its
//! request (or else the oldest), so that a scrape is answered while others drip. accept(2)
//! failing (out of descriptors) takes the listener out of the poll set until a client is closed
//! or [`ACCEPT_RETRY`] passes, never a spin: one warning while clients wait, counted in
//! `tfinit_accept_pauses_total`. Without clients, poll(2) waits with no timeout: an idle init has
//! no wake-up for it. The thread is started after main blocked every signal, inherits that mask
//! and changes nothing in it (signals stay for the loop's signalfd).
//!
//! HTTP is the smallest subset Prometheus needs: one request per connection (`Connection:
//! close`), `GET` or `HEAD` of `/metrics`, 404 for other paths, 405 for other methods, 431 for a
//! request head over [`MAX_HEAD`]. A library would bring a thread pool and a parser this does not
//! need (see the note in Cargo.toml).

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::duration::fmt_duration;
use crate::metrics::{Dropped, Listener, Metrics, Pause, CONTENT_TYPE};
use crate::throttle::Throttle;

/// How long one client may take for the whole exchange: sending its request head, and taking
/// the answer. Prometheus sends its request at once and reads the answer at once.
const DEADLINE: Duration = Duration::from_secs(10);

/// Clients served at once (a scraper is one process, making one request at a time).
const MAX_CONNECTIONS: usize = 8;

/// The longest request head read; a longer one is answered 431.
const MAX_HEAD: usize = 8 << 10;

/// How long the listener stays out of the poll set after accept(2) failed.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// Parses `TFINIT_METRICS_ADDR`: `:9102` (every address), `127.0.0.1:9102`, `[::]:9102`, or a
/// host name and port, the name looked up in `/etc/hosts` only (tfinit has no DNS resolver:
/// [`crate::ip`]), here, at start-up, never on the loop. Strictly: the port is decimal digits
/// without a sign or leading zeros (std's parser would take `+80`), an IPv6 address is in
/// brackets (`::1:80` could be either), and a host of digits and dots must be an IPv4 address (a
/// resolver would read `10.1` as 10.0.0.1).
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    const FORM: &str = "must be HOST:PORT or :PORT with a port from 0 to 65535 in digits, and an \
                        IPv6 address in brackets ([::1]:9102)";
    let (host, port) = s.rsplit_once(':').ok_or(FORM)?;
    let port = strict_port(port).ok_or(FORM)?;
    if host.is_empty() {
        return Ok(SocketAddr::from(([0, 0, 0, 0], port)));
    }
    if host.starts_with('[') {
        return match crate::ip::parse(host) {
            Some(ip) => Ok(SocketAddr::from((ip, port))),
            None => Err(format!("{host} is not an IPv6 address in brackets")),
        };
    }
    if host.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return match crate::ip::parse(host) {
            Some(ip) => Ok(SocketAddr::from((ip, port))),
            None => Err(format!(
                "{host} is not an IPv4 address (four numbers: 127.0.0.1)"
            )),
        };
    }
    if !host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    {
        return Err(FORM.into());
    }
    let hosts = crate::ip::HOSTS;
    match crate::ip::lookup_in_hosts(host) {
        Ok(Some(ip)) => Ok(SocketAddr::from((ip, port))),
        Ok(None) => Err(format!(
            "{host} is not in {hosts}: host names are looked up in {hosts} only (tfinit has no DNS \
             resolver); give an IP address (127.0.0.1:{port}, [::1]:{port}) or :{port} for every \
             address"
        )),
        Err(e) => Err(format!(
            "{host} cannot be looked up: {hosts} cannot be read ({e}); give an IP address \
             (127.0.0.1:{port}) or :{port} for every address"
        )),
    }
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
    listener.set_nonblocking(true)?;
    let server = Server {
        listener,
        metrics,
        clients: VecDeque::new(),
        accepting: Accepting::Yes,
        waiting: None,
        warn: Throttle::per_minute(),
    };
    std::thread::Builder::new()
        .name("tfinit-metrics".into())
        .spawn(move || server.serve())?;
    Ok(bound)
}

/// Whether the listener is in the poll set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Accepting {
    /// In it.
    Yes,
    /// Out of it after accept(2) failed: back at `retry`, or when a client is closed.
    Failed {
        /// When accepting is tried again.
        retry: Instant,
    },
}

/// A time during which clients waited in the listen queue (accept(2) failed): from the first
/// failure until the queue was found empty.
#[derive(Debug, Clone, Copy)]
struct Waiting {
    since: Instant,
    failures: u64,
}

/// Where an exchange is.
#[derive(Debug)]
enum Exchange {
    /// Reading the request head.
    Reading {
        /// What came so far.
        head: Vec<u8>,
    },
    /// Writing the answer.
    Writing {
        /// The whole answer.
        out: Vec<u8>,
        /// How much of it was written.
        sent: usize,
        /// Whether the client may still be sending (its head was cut off at [`MAX_HEAD`]): then
        /// the answer is followed by [`Exchange::Lingering`], not by a close that would reset the
        /// connection and lose the answer in the client's kernel.
        linger: bool,
    },
    /// Answered and shut down for writing: what the client still sends is read and dropped until
    /// it closes (or its deadline).
    Lingering,
}

/// One client.
#[derive(Debug)]
struct Client {
    /// Non-blocking.
    sock: TcpStream,
    /// When it is closed, done or not.
    deadline: Instant,
    phase: Exchange,
}

/// The server's state, owned by its thread.
struct Server {
    listener: TcpListener,
    metrics: Arc<Metrics>,
    /// Oldest first.
    clients: VecDeque<Client>,
    accepting: Accepting,
    waiting: Option<Waiting>,
    /// For the warning that accepting failed, should waits come and go quickly.
    warn: Throttle,
}

impl Server {
    /// Serves until the process exits.
    fn serve(mut self) {
        loop {
            let now = Instant::now();
            self.expire(now);
            if let Accepting::Failed { retry } = self.accepting {
                if retry <= now {
                    self.accepting = Accepting::Yes;
                }
            }
            let listening = self.accepting == Accepting::Yes;
            let ready = self.wait(now);
            let (listener_ready, clients_ready) = match ready.split_first() {
                Some((l, rest)) if listening => (*l, rest),
                _ => (false, &ready[..]),
            };
            // The clients first (the readiness is in their order), then new ones.
            let before = self.clients.len();
            let metrics = &self.metrics;
            let mut i = 0;
            self.clients.retain_mut(|c| {
                let ready = clients_ready.get(i) == Some(&true);
                i += 1;
                !(ready && c.progress(metrics))
            });
            if self.clients.len() < before {
                self.freed();
            }
            if listener_ready {
                self.accept_some();
            } else if listening {
                // Polled and not ready: nobody waits in the queue.
                self.queue_empty();
            }
        }
    }

    /// Waits until the listener or a client is ready, or the nearest deadline; which are ready,
    /// the listener first when it was polled, then the clients in order.
    fn wait(&self, now: Instant) -> Vec<bool> {
        let mut fds = Vec::with_capacity(self.clients.len() + 1);
        if self.accepting == Accepting::Yes {
            fds.push(PollFd::new(self.listener.as_fd(), PollFlags::POLLIN));
        }
        for c in &self.clients {
            let flags = match c.phase {
                Exchange::Reading { .. } => PollFlags::POLLIN,
                Exchange::Writing { .. } => PollFlags::POLLOUT,
                Exchange::Lingering => PollFlags::POLLIN,
            };
            fds.push(PollFd::new(c.sock.as_fd(), flags));
        }
        let retry = match self.accepting {
            Accepting::Failed { retry } => Some(retry),
            Accepting::Yes => None,
        };
        let next = self.clients.iter().map(|c| c.deadline).chain(retry).min();
        let timeout = match next {
            None => PollTimeout::NONE,
            Some(t) => {
                // Rounded up, so as not to wake a millisecond early and spin.
                let ms = t.saturating_duration_since(now).as_millis().min(60_000) as u16;
                PollTimeout::from(ms.saturating_add(1))
            }
        };
        match poll(&mut fds, timeout) {
            Ok(_) => fds
                .iter()
                .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
                .collect(),
            // Every signal is blocked in this thread, so no EINTR; ENOMEM: nothing is ready, and
            // a short pause keeps a failing poll(2) from spinning this thread.
            Err(_) => {
                std::thread::sleep(Duration::from_millis(10));
                vec![false; fds.len()]
            }
        }
    }

    /// Closes the clients whose time is up.
    fn expire(&mut self, now: Instant) {
        let before = self.clients.len();
        self.clients.retain(|c| c.deadline > now);
        for _ in self.clients.len()..before {
            self.metrics.dropped(Listener::Metrics, Dropped::Deadline);
        }
        if self.clients.len() < before {
            self.freed();
        }
    }

    /// A client was closed: a descriptor is free, so accepting is tried again at once.
    fn freed(&mut self) {
        if let Accepting::Failed { .. } = self.accepting {
            self.accepting = Accepting::Yes;
        }
    }

    /// Accepts up to [`MAX_CONNECTIONS`] pending clients (the ones after them wait for the next
    /// round, after these were read: a flood cannot close a scrape before its request is read),
    /// and moves each on at once (its request is usually there already).
    fn accept_some(&mut self) {
        for _ in 0..MAX_CONNECTIONS {
            let sock = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return self.queue_empty(),
                Err(e) => {
                    let errno = Errno::from_raw(e.raw_os_error().unwrap_or(0));
                    if matches!(errno, Errno::EINTR | Errno::ECONNABORTED | Errno::EPROTO) {
                        continue;
                    }
                    return self.pause(errno, &e);
                }
            };
            if sock.set_nonblocking(true).is_err() {
                continue;
            }
            if self.clients.len() >= MAX_CONNECTIONS {
                self.evict();
            }
            let now = Instant::now();
            let mut c = Client {
                sock,
                deadline: now + DEADLINE,
                phase: Exchange::Reading {
                    head: Vec::with_capacity(512),
                },
            };
            if !c.progress(&self.metrics) {
                self.clients.push_back(c);
            }
        }
    }

    /// The listen queue is empty: a wait, if one was under way, is over.
    fn queue_empty(&mut self) {
        if let Some(w) = self.waiting.take() {
            tracing::info!(
                waited_seconds = w.since.elapsed().as_secs_f64(),
                failed_accepts = w.failures,
                "the metrics server's waiting clients were all accepted"
            );
        }
    }

    /// Closes the oldest client still sending its request (or else the oldest) for a new one.
    fn evict(&mut self) {
        let i = self
            .clients
            .iter()
            .position(|c| matches!(c.phase, Exchange::Reading { .. }))
            .unwrap_or(0);
        self.clients.remove(i);
        self.metrics.dropped(Listener::Metrics, Dropped::Evicted);
    }

    /// accept(2) failed with `errno`: out of the poll set for a while; one warning and one count
    /// per wait.
    fn pause(&mut self, errno: Errno, e: &io::Error) {
        let now = Instant::now();
        self.accepting = Accepting::Failed {
            retry: now + ACCEPT_RETRY,
        };
        if let Some(w) = &mut self.waiting {
            w.failures += 1;
            return;
        }
        self.waiting = Some(Waiting {
            since: now,
            failures: 1,
        });
        let why = match errno {
            Errno::EMFILE | Errno::ENFILE => Pause::Descriptors,
            _ => Pause::Error,
        };
        self.metrics.accept_paused(Listener::Metrics, why);
        if let Some(held_back) = self.warn.allow(now) {
            tracing::warn!(
                error = %e, held_back,
                "accept on the metrics address failed: scrapers wait in the listen queue, and accepting is tried again when a client is closed or after {}",
                fmt_duration(ACCEPT_RETRY)
            );
        }
    }
}

impl Client {
    /// Moves the exchange on as far as the socket allows; true once it is over (answered, or the
    /// client gone).
    fn progress(&mut self, metrics: &Metrics) -> bool {
        loop {
            match &mut self.phase {
                Exchange::Reading { head } => {
                    let mut buf = [0u8; 1024];
                    match (&self.sock).read(&mut buf) {
                        // The client finished sending: answer what came.
                        Ok(0) => {}
                        Ok(n) => {
                            head.extend_from_slice(&buf[..n]);
                            if !is_whole(head) && head.len() <= MAX_HEAD {
                                continue;
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(_) => return true,
                    }
                    let linger = head.len() > MAX_HEAD;
                    let out = answer(head, metrics);
                    self.phase = Exchange::Writing {
                        out,
                        sent: 0,
                        linger,
                    };
                }
                Exchange::Writing { out, sent, linger } => {
                    match (&self.sock).write(&out[*sent..]) {
                        Ok(0) => return true,
                        Ok(n) => {
                            *sent += n;
                            if *sent < out.len() {
                                continue;
                            }
                            if !*linger || self.sock.shutdown(std::net::Shutdown::Write).is_err() {
                                return true;
                            }
                            self.phase = Exchange::Lingering;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(_) => return true,
                    }
                }
                Exchange::Lingering => {
                    // A few reads per turn: a client that keeps sending cannot hold the thread.
                    let mut buf = [0u8; 4096];
                    for _ in 0..16 {
                        match (&self.sock).read(&mut buf) {
                            Ok(0) => return true,
                            Ok(_) => {}
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(_) => return true,
                        }
                    }
                    return false;
                }
            }
        }
    }
}

/// Whether `head` holds a whole request head (up to its blank line).
fn is_whole(head: &[u8]) -> bool {
    head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n")
}

/// The whole answer to request `head`: status line, headers and (but for HEAD) the body.
fn answer(head: &[u8], metrics: &Metrics) -> Vec<u8> {
    let (status, body) = if head.len() > MAX_HEAD {
        (
            431,
            format!("the request head is over {MAX_HEAD} bytes: tfinit serves GET /metrics\n"),
        )
    } else {
        respond(&String::from_utf8_lossy(head), metrics)
    };
    let head_only = head.starts_with(b"HEAD ");
    let content_type = if status == 200 {
        CONTENT_TYPE
    } else {
        "text/plain; charset=utf-8"
    };
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
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
    let mut out = out.into_bytes();
    if !head_only {
        out.extend_from_slice(body.as_bytes());
    }
    out
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
            "a host name is looked up in /etc/hosts"
        );
        let e = parse_addr("no-such-host.invalid:9102").unwrap_err();
        assert!(e.contains("/etc/hosts only"), "{e}");
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
            t.elapsed() < DEADLINE,
            "served while the others wait: {:?}",
            t.elapsed()
        );
    }

    #[test]
    fn a_scrape_is_answered_while_more_clients_than_places_drip_their_requests() {
        let m = Arc::new(Metrics::new("t"));
        let addr = start("127.0.0.1:0".parse().unwrap(), Arc::clone(&m)).unwrap();
        // Twice as many drippers as places, each sending a byte every 50 ms, never a whole head.
        let drippers: Vec<TcpStream> = (0..2 * MAX_CONNECTIONS)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let dripping = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut drippers = drippers;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for d in &mut drippers {
                        let _ = d.write_all(b"G");
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        for _ in 0..3 {
            let t = Instant::now();
            let ok = get(addr, "GET /metrics HTTP/1.1\r\n\r\n");
            assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
            assert!(t.elapsed() < DEADLINE, "{:?}", t.elapsed());
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        dripping.join().unwrap();
        let t = m.render();
        let evicted = "tfinit_connections_dropped_total{listener=\"metrics\",reason=\"evicted\"} ";
        let n: f64 = t
            .lines()
            .find_map(|l| l.strip_prefix(evicted)?.parse().ok())
            .unwrap_or(0.0);
        assert!(n >= 1.0, "the drippers beyond the places were evicted: {t}");
    }

    #[test]
    fn a_request_head_over_the_limit_is_answered_431() {
        let m = Arc::new(Metrics::new("t"));
        let addr = start("127.0.0.1:0".parse().unwrap(), m).unwrap();
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(16 << 10));
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // The server answers once it has read past the limit, and may close before the rest.
        let _ = c.write_all(long.as_bytes());
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out);
        let out = String::from_utf8_lossy(&out);
        assert!(
            out.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
            "{out}"
        );
        // Just under the limit is still read whole and answered by what it asks.
        let under = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_HEAD - 64));
        assert!(get(addr, &under).starts_with("HTTP/1.1 404"));
    }

    #[test]
    fn a_port_in_use_is_an_error_to_report() {
        let held = TcpListener::bind("127.0.0.1:0").unwrap();
        let e = start(held.local_addr().unwrap(), Arc::new(Metrics::new("t"))).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
    }
}
