//! Clients that attack PID 1 (issue 26): a buggy or hostile process of the init's own uid (the
//! controller, terraform, a module's `local-exec`) must not kill the init, spin it or fill its
//! log, which would take every terraform run in the container with it.
//!
//! - Half-sent requests: connections that announce a large request and never finish it. The
//!   init's memory stays within the bound docs/protocol.md states (`tfinit::init::memory_bound`),
//!   also inside a memory cgroup of that size when the test can make one; each connection gets an
//!   answer; a normal run goes through meanwhile.
//! - 300 idle connections under an open-files limit of 256: the init neither spins (CPU) nor
//!   floods its log (one warning), and a shim's run starts once descriptors free.
//! - 44 connections more than the init serves: they wait in the listen queue, the loop idle,
//!   and come in as others close.
//! - Clients dripping their HTTP request a byte a second into every place of the metrics server:
//!   scrapes are answered throughout, and the drippers are closed.
//!
//! tfinit runs as PID 1 of its own PID namespace (`helper_init`), its controller the test helper.
//! The figures each attack leaves (memory, CPU share, log lines, latency) are printed; the
//! asserted bounds are the issue's, generous on purpose (CPU under 25 % of a core, under 200 log
//! lines): speed belongs in the benchmarks.

mod common;
#[path = "common/helper_init.rs"]
mod helper_init;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::cgroup::MemoryCgroup;
use common::{free_port, read, wait_for, TempDir};
use helper_init::*;
use tfinit::protocol::{self, ExitNote, Kind};

/// The bounds during an attack.
const MAX_CPU_SHARE: f64 = 0.25;
const MAX_LOG_LINES: usize = 200;

/// How long the init gives a client to send its whole request, and how many connections it
/// serves at once (src/init/bounds.rs).
const REQUEST_DEADLINE: Duration = Duration::from_secs(10);
const MAX_CONNECTIONS: usize = 1024;

/// The share of one core the init used over `window` (a measurement, not a wait for anything).
fn cpu_share(init: &HelperInit, window: Duration) -> f64 {
    let (t0, u0) = (Instant::now(), init.usage());
    std::thread::sleep(window);
    let (t1, u1) = (Instant::now(), init.usage());
    (u1.cpu_ms - u0.cpu_ms) as f64 / (t1 - t0).as_millis().max(1) as f64
}

/// Lines the init logged so far.
fn log_lines(init: &HelperInit) -> usize {
    init.stderr().lines().count()
}

/// Whether the init still runs (a zombie does not).
fn alive(pid: i32) -> bool {
    read(Path::new(&format!("/proc/{pid}/stat")))
        .rsplit_once(") ")
        .is_some_and(|(_, rest)| !rest.starts_with('Z'))
}

/// The exit note the init answered on `sock` (read until it closes, at most `within`), if any.
fn answer_of(sock: &mut UnixStream, within: Duration) -> Option<ExitNote> {
    sock.set_read_timeout(Some(within)).unwrap();
    let mut payload = Vec::new();
    loop {
        match tfinit::client::read_frame(sock, &mut payload) {
            Ok(Some(Kind::Exit)) => return serde_json::from_slice(&payload).ok(),
            Ok(Some(_)) => continue,
            Ok(None) | Err(_) => return None,
        }
    }
}

/// `n` connections to `socket`, each sending a request header that announces `len` bytes and
/// then `len - 1` of them, never the last, all at once. Returns the connections once every
/// writer has sent everything or was stopped by the init.
fn half_sent(socket: &Path, n: usize, len: usize) -> Vec<UnixStream> {
    let writers: Vec<_> = (0..n)
        .map(|_| {
            let socket = socket.to_path_buf();
            std::thread::spawn(move || {
                let sock = UnixStream::connect(&socket).expect("connect to the control socket");
                sock.set_write_timeout(Some(SOON)).unwrap();
                let mut w = &sock;
                let mut header = vec![b'R'];
                header.extend_from_slice(&(len as u32).to_be_bytes());
                if w.write_all(&header).is_ok() {
                    let chunk = vec![b'x'; 64 << 10];
                    let mut left = len - 1;
                    while left > 0 {
                        let k = left.min(chunk.len());
                        if w.write_all(&chunk[..k]).is_err() {
                            break;
                        }
                        left -= k;
                    }
                }
                sock
            })
        })
        .collect();
    writers.into_iter().map(|w| w.join().unwrap()).collect()
}

#[test]
fn half_sent_requests_keep_the_init_within_its_memory_bound_and_each_gets_an_answer() {
    if !root() || !common::enough_descriptors(4096) {
        return;
    }
    let _g = heavy();
    let tmp = TempDir::new("hostile-half");
    let init = HelperInit::start(&tmp, Setup::default());
    // The init inherits this process's stack limit, so its request limit is ours.
    let limit = protocol::request_limit_here();
    let bound_kib = (tfinit::init::memory_bound(limit) / 1024) as u64;
    let idle = init.usage();
    // Inside a memory cgroup of (about) the bound: the old init took 64 x 4 MiB here and was
    // OOM-killed in 256 MiB; this attack made it take 1,024 x the request limit.
    let cgroup_limit = (idle.rss_kib + bound_kib + 16 * 1024) * 1024;
    let cgroup = match MemoryCgroup::new("tfinit-test-hostile", cgroup_limit) {
        Ok(g) => {
            g.add(init.pid);
            Some(g)
        }
        Err(why) => {
            eprintln!("SKIP (the memory cgroup part only): {why}");
            None
        }
    };
    let lines_before = log_lines(&init);
    let started = Instant::now();
    let cpu0 = init.usage().cpu_ms;
    // The attack (64 x 4 MiB), then as many connections as the init serves, each
    // announcing a request of the largest size the init takes.
    let mut conns = half_sent(&init.socket(), 64, 4 << 20);
    conns.extend(half_sent(&init.socket(), MAX_CONNECTIONS, limit));
    let sent_in = started.elapsed();
    assert!(alive(init.pid), "the init died during the attack");
    // A normal run goes through while the half-sent requests are held: they cannot keep a whole
    // request out.
    let t = Instant::now();
    init.assert_runs_work(&tmp);
    let run_took = t.elapsed();
    let burst_cpu_ms = init.usage().cpu_ms - cpu0;
    // While they are held (well within the request deadline): the CPU share of a waiting init.
    let cpu_share = cpu_share(&init, Duration::from_secs(3));
    let held = init.usage();
    // Every connection is answered: at once when over the limit or out of room (exit 125 or
    // 75), the ones held after the request deadline (125).
    let mut codes = std::collections::BTreeMap::<String, usize>::new();
    for (i, c) in conns.iter_mut().enumerate() {
        let note = answer_of(c, REQUEST_DEADLINE + SOON)
            .unwrap_or_else(|| panic!("connection {i} got no answer\n{}", init.stderr()));
        let error = note.error.unwrap_or_default();
        let what = if error.contains("over the limit") {
            "over the limit"
        } else if error.contains("try again") {
            "refused for now"
        } else if error.contains("did not come whole within 10s") {
            "too slow"
        } else {
            panic!("connection {i}: unexpected answer {}: {error}", note.code)
        };
        let code = if what == "refused for now" { 75 } else { 125 };
        assert_eq!(note.code, code, "{error}");
        *codes.entry(what.to_string()).or_default() += 1;
    }
    let after = init.usage();
    let lines = log_lines(&init) - lines_before;
    eprintln!(
        "hostile: half-sent requests (64 x 4 MiB, then {MAX_CONNECTIONS} x {limit} bytes, sent in {sent_in:.1?}): \
         answers {codes:?}; init RSS {} KiB idle, {} KiB while held, peak {} KiB (+{} KiB; bound +{bound_kib} KiB); \
         {burst_cpu_ms} ms of CPU to read them, then {:.1} % of a core while they were held; {lines} log lines; \
         a normal run took {run_took:.1?} meanwhile",
        idle.rss_kib,
        held.rss_kib,
        after.peak_rss_kib,
        after.peak_rss_kib.saturating_sub(idle.rss_kib),
        cpu_share * 100.0,
    );
    assert_eq!(codes.get("over the limit"), Some(&64), "{codes:?}");
    assert!(
        codes.get("too slow").is_some_and(|n| *n >= 1),
        "some were held until the deadline: {codes:?}"
    );
    assert!(
        after.peak_rss_kib <= idle.rss_kib + bound_kib,
        "peak RSS {} KiB is over the idle {} KiB plus the bound {bound_kib} KiB",
        after.peak_rss_kib,
        idle.rss_kib
    );
    assert!(
        lines < MAX_LOG_LINES,
        "{lines} log lines:\n{}",
        init.stderr()
    );
    assert!(cpu_share < MAX_CPU_SHARE, "CPU {cpu_share:.2} of a core");
    if let Some(g) = &cgroup {
        assert!(alive(init.pid), "killed in {}", g.path().display());
        assert_eq!(g.oom_kills(), 0, "OOM kills in {}", g.path().display());
        eprintln!(
            "hostile: the init stayed alive in a memory cgroup of {} KiB ({})",
            cgroup_limit / 1024,
            g.path().display()
        );
    }
    init.stop_cleanly();
}

/// The soft and hard open-files limits of `pid`, from /proc.
fn open_files_limit(pid: i32) -> Option<(u64, u64)> {
    let limits = read(Path::new(&format!("/proc/{pid}/limits")));
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let mut w = line["Max open files".len()..].split_whitespace();
    Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
}

#[test]
fn idle_connections_past_the_descriptor_limit_neither_spin_nor_flood_and_a_run_starts_once_one_frees(
) {
    if !root() || !common::enough_descriptors(2048) {
        return;
    }
    let _g = heavy();
    let tmp = TempDir::new("hostile-emfile");
    let init = HelperInit::start(
        &tmp,
        Setup {
            before: "ulimit -n 256",
            ..Setup::default()
        },
    );
    assert_eq!(open_files_limit(init.pid), Some((256, 256)));
    // The attack comes once the store is open: a store that cannot even list its records for
    // want of descriptors refuses state-locking runs (75) until its next try, TTL/3 later (its
    // records are unknown), which is the store's concern, not the control socket's.
    init.log_line(&["lock-owner records enabled"]);
    let lines_before = log_lines(&init);
    let attack = Instant::now();
    let mut conns: Vec<UnixStream> = (0..300)
        .map(|_| UnixStream::connect(init.socket()).expect("connect (the listen queue takes it)"))
        .collect();
    init.log_line(&["accept on the control socket failed"]);
    let paused_after = attack.elapsed();
    // While they sit there: the init's CPU share over a while, well within the request deadline.
    let share = cpu_share(&init, Duration::from_secs(3));
    let lines_during = log_lines(&init) - lines_before;
    // A shim asks for a run: it waits in the listen queue behind the attackers.
    let log = tmp.join("fake.log");
    let mut shim = init.shim(
        &["apply", "-auto-approve"],
        &[
            ("FAKE_TF_ECHO", "1"),
            ("FAKE_TF_EXIT", "3"),
            ("FAKE_TF_LOG", log.to_str().unwrap()),
        ],
    );
    shim.stdout(Stdio::piped()).stderr(Stdio::piped());
    let shim = shim.spawn().unwrap();
    // Descriptors free: the first 100 attackers (accepted first) leave.
    let freed = Instant::now();
    conns.drain(..100);
    let out = common::wait_output(shim, SOON);
    let run_after = freed.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}\n{}", init.stderr());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "args: apply -auto-approve\n"
    );
    assert!(!stderr.contains("directly"), "the shim fell back: {stderr}");
    // One pause of the listener was counted, for want of descriptors.
    let metrics = common::run_output(
        common::scrub(&mut Command::new(common::tfinit()))
            .arg("metrics")
            .env("TFINIT_RUN_DIR", &init.run_dir),
        SOON,
    );
    let text = String::from_utf8_lossy(&metrics.stdout);
    assert!(
        text.contains(
            "tfinit_accept_pauses_total{listener=\"control\",reason=\"descriptors\"} 1\n"
        ),
        "{text}"
    );
    // The attackers left are closed at the request deadline, each answered.
    let mut answered = 0;
    for c in &mut conns {
        if answer_of(c, REQUEST_DEADLINE + SOON)
            .and_then(|n| n.error)
            .is_some_and(|e| e.contains("did not come whole"))
        {
            answered += 1;
        }
    }
    let log_text = init.stderr();
    let lines_total = log_lines(&init) - lines_before;
    let warnings = log_text
        .matches("accept on the control socket failed")
        .count();
    eprintln!(
        "hostile: 300 idle connections under ulimit -n 256: accepting paused {paused_after:.1?} after they came; \
         init CPU {:.1} % of a core over 3 s; {lines_during} log lines then, {lines_total} in all ({warnings} accept warning); \
         a shim's run ended {run_after:.1?} after 100 connections closed; {answered} of the other {} answered at the deadline",
        share * 100.0,
        conns.len()
    );
    assert!(share < MAX_CPU_SHARE, "CPU {share:.2} of a core");
    assert_eq!(warnings, 1, "one warning for the whole time:\n{log_text}");
    assert!(
        lines_total < MAX_LOG_LINES,
        "{lines_total} lines:\n{log_text}"
    );
    assert_eq!(
        answered,
        conns.len(),
        "every idle client is answered and closed"
    );
    init.stop_cleanly();
}

#[test]
fn connections_past_the_cap_wait_in_the_listen_queue_and_come_in_as_others_close() {
    if !root() || !common::enough_descriptors(4096) {
        return;
    }
    let _g = heavy();
    let tmp = TempDir::new("hostile-cap");
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let init = HelperInit::start(
        &tmp,
        Setup {
            env: &[("TFINIT_METRICS_ADDR", &format!("127.0.0.1:{port}"))],
            ..Setup::default()
        },
    );
    let get = "GET /metrics HTTP/1.1\r\n\r\n";
    let metric = |name: &str| -> Option<f64> {
        let text = scrape(addr, get)?;
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    };
    wait_for(SOON, "the metrics server", || scrape(addr, get));
    let lines_before = log_lines(&init);
    let mut conns: Vec<UnixStream> = (0..MAX_CONNECTIONS + 44)
        .map(|_| UnixStream::connect(init.socket()).expect("connect (the listen queue takes it)"))
        .collect();
    let open = "tfinit_control_connections";
    let cap = MAX_CONNECTIONS as f64;
    wait_for(SOON, "the most connections open", || {
        (metric(open)? == cap).then_some(())
    });
    init.log_line(&["the control socket has its most open connections"]);
    // Not one more while they stay (the test's own measurement window, not a wait for an event).
    let share = cpu_share(&init, Duration::from_secs(2));
    assert_eq!(metric(open), Some(cap), "the cap holds");
    // 50 leave: the 44 waiting come in, and a shim's run with them.
    conns.drain(..50);
    let out = common::run_output(
        &mut init.shim(&["plan"], &[("FAKE_TF_ECHO", "1"), ("FAKE_TF_EXIT", "2")]),
        SOON,
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pauses = "tfinit_accept_pauses_total{listener=\"control\",reason=\"connections\"}";
    assert_eq!(metric(pauses), Some(1.0), "one pause for the whole wait");
    // Every one left was accepted (the 44 that waited too): each is answered at the deadline.
    for (i, c) in conns.iter_mut().enumerate() {
        let note = answer_of(c, REQUEST_DEADLINE + SOON);
        assert!(
            note.and_then(|n| n.error)
                .is_some_and(|e| e.contains("did not come whole")),
            "connection {i} of those left was not answered"
        );
    }
    let lines = log_lines(&init) - lines_before;
    eprintln!(
        "hostile: {} connections against the cap of {MAX_CONNECTIONS}: {:.1} % of a core while 44 waited; {lines} log lines",
        MAX_CONNECTIONS + 44,
        share * 100.0
    );
    assert!(share < MAX_CPU_SHARE, "CPU {share:.2} of a core");
    assert!(lines < MAX_LOG_LINES);
    drop(conns);
    init.stop_cleanly();
}

/// `GET /metrics` on `addr` with a raw request: the answer, or None when none came in 5 s.
fn scrape(addr: SocketAddr, request: &str) -> Option<String> {
    let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    c.set_write_timeout(Some(Duration::from_secs(5))).ok()?;
    let _ = c.write_all(request.as_bytes());
    let mut out = Vec::new();
    c.read_to_end(&mut out).ok()?;
    Some(String::from_utf8_lossy(&out).into_owned())
}

#[test]
fn clients_dripping_their_requests_into_every_place_do_not_keep_metrics_from_being_scraped() {
    if !root() {
        return;
    }
    let tmp = TempDir::new("hostile-drip");
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let init = HelperInit::start(
        &tmp,
        Setup {
            env: &[("TFINIT_METRICS_ADDR", &format!("127.0.0.1:{port}"))],
            ..Setup::default()
        },
    );
    let get = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    wait_for(SOON, "the metrics server", || scrape(addr, get));
    // A request line over the head limit is told so, not sent away as an unknown path.
    let long = scrape(
        addr,
        &format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(16 << 10)),
    );
    assert!(
        long.as_deref()
            .is_some_and(|a| a.starts_with("HTTP/1.1 431 ")),
        "{long:?}"
    );
    let lines_before = log_lines(&init);
    let cpu0 = init.usage().cpu_ms;
    // Twice as many drippers as the server has places, a byte a second each.
    let mut drippers: Vec<Option<TcpStream>> = (0..16)
        .map(|_| Some(TcpStream::connect(addr).unwrap()))
        .collect();
    let started = Instant::now();
    let (mut answered, mut asked, mut slowest) = (0, 0, Duration::ZERO);
    let mut next_drip = started;
    while started.elapsed() < Duration::from_secs(6) {
        if Instant::now() >= next_drip {
            for d in &mut drippers {
                if d.as_mut().is_some_and(|s| s.write_all(b"G").is_err()) {
                    *d = None;
                }
            }
            next_drip += Duration::from_secs(1);
        }
        let t = Instant::now();
        asked += 1;
        if scrape(addr, get)
            .is_some_and(|a| a.starts_with("HTTP/1.1 200 ") && a.ends_with("# EOF\n"))
        {
            answered += 1;
        }
        slowest = slowest.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(250));
    }
    let cpu = (init.usage().cpu_ms - cpu0) as f64 / started.elapsed().as_millis() as f64;
    // Each dripper is closed: evicted for a scrape, or at the deadline of the whole exchange.
    let mut closed = 0;
    for d in drippers.iter_mut().flatten() {
        d.set_read_timeout(Some(REQUEST_DEADLINE + SOON)).unwrap();
        let mut b = [0u8; 64];
        if matches!(d.read(&mut b), Ok(0) | Err(_)) {
            closed += 1;
        }
    }
    let lines = log_lines(&init) - lines_before;
    eprintln!(
        "hostile: 16 clients dripping a byte a second into the 8 places of /metrics: {answered} of {asked} scrapes answered, \
         the slowest in {slowest:.1?}; init CPU {:.1} % of a core; {lines} log lines; {closed} drippers closed",
        cpu * 100.0
    );
    assert_eq!(
        answered, asked,
        "every scrape is answered while others drip"
    );
    assert!(cpu < MAX_CPU_SHARE, "CPU {cpu:.2} of a core");
    assert!(lines < MAX_LOG_LINES);
    assert_eq!(closed, drippers.iter().flatten().count());
    init.stop_cleanly();
}
