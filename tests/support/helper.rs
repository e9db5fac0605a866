//! tfinit-test-helper: programs that run as tfinit's children in the integration tests and check
//! from the inside. Every line it prints starts with `helper:`.
//!
//! Modes (first argument):
//! - `orphans N [--deadline-s S] [--check-adopter] [--scope all|parent]`: a spawner forks N
//!   children (retrying while fork fails with EAGAIN, for up to 30 s) and exits, so the N become
//!   orphans; they exit immediately. One more orphan, the witness, waits until it is adopted and
//!   reports its new parent. Then polls /proc until no zombie is left (exit 0) or the deadline
//!   passes (exit 1, printing how many remain). Prints `helper: orphans=N forked=K adopted_by=P
//!   parent=Q spawn_ms=.. reaped_ms=.. zombies=0`. --check-adopter: exit 4 unless the orphans were
//!   adopted by our own parent (the init under test). --scope parent counts only zombies whose
//!   parent is our parent (for a subreaper on a shared host); the default counts every zombie in
//!   /proc (all of a PID namespace). Exit 5 when fewer than N could be forked.
//! - `no-reap -- CMD...`: runs CMD and never reaps anything else (a broken PID 1, for the
//!   negative test); exits with CMD's status.
//! - `signals OUT [--member] [--exit-on SIG]`: records each signal received as a line in OUT
//!   (`main SIGHUP`, and `member SIGHUP` from a second process of the same group with --member;
//!   real-time signals as `SIGRTMIN+N`); writes `ready main PID` (and `ready member PID`) first.
//!   Every catchable signal is blocked except inside sigsuspend, so none is lost and signals
//!   pending together are recorded in the kernel's delivery order (lowest number first).
//!   Exits 0 after recording --exit-on's signal (only when given).
//! - `mask`: prints the SigBlk and SigIgn it had at exec, in /proc/self/status's format (captured
//!   before Rust's runtime starts, because that runtime ignores SIGPIPE).
//! - `controller [--on-term kill|term|wait] [--exit-code N] [--log FILE] -- CMD...`: a controller
//!   stand-in that runs CMD (e.g. `terraform apply`) found on PATH, like Go's exec.CommandContext
//!   in provider-terraform: on SIGTERM it SIGKILLs (or SIGTERMs, or leaves) CMD, then exits N.
//!   Without a signal it exits with CMD's code. Lines in --log: `started PID`, `term`, `child-exit CODE`.
//! - As argv0 `terraform` (fake terraform for tests and benchmarks, steered by env):
//!   FAKE_TF_OUT_BYTES=N writes N bytes to stdout; FAKE_TF_SLEEP_MS=N sleeps; FAKE_TF_ON_TERM=
//!   graceful|ignore (graceful: prints "Interrupt received" and exits 1 after FAKE_TF_STOP_MS);
//!   FAKE_TF_EXIT=N exit code; FAKE_TF_LOG=FILE appends `pid PID pgid PGID args ...` and signals.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

static LAST_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn record(sig: libc::c_int) {
    LAST_SIGNAL.store(sig, Ordering::SeqCst);
}

fn install_recorders(signals: &[i32]) {
    for &s in signals {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(s, record as *const () as libc::sighandler_t);
        }
    }
}

fn signame(s: i32) -> String {
    let rtmin = libc::SIGRTMIN();
    match nix::sys::signal::Signal::try_from(s) {
        Ok(x) => x.as_str().to_string(),
        Err(_) if s == rtmin => "SIGRTMIN".to_string(),
        Err(_) if s > rtmin && s <= libc::SIGRTMAX() => format!("SIGRTMIN+{}", s - rtmin),
        Err(_) => format!("SIG{s}"),
    }
}

/// Deliveries received by `signals` mode and not yet recorded: entry N-1 for signal N. A count,
/// not a flag: one sigsuspend can return after several deliveries of the same queued real-time
/// signal, and each must give its own line (the load test counts them exactly).
static PENDING: [AtomicU32; 64] = [const { AtomicU32::new(0) }; 64];

extern "C" fn mark_pending(sig: libc::c_int) {
    if (1..=64).contains(&sig) {
        PENDING[(sig - 1) as usize].fetch_add(1, Ordering::SeqCst);
    }
}

/// The signal mask and ignored set at exec, in /proc/self/status's bit layout (bit N-1 = signal N).
static EXEC_SIGBLK: AtomicU64 = AtomicU64::new(0);
static EXEC_SIGIGN: AtomicU64 = AtomicU64::new(0);

/// Runs before Rust's runtime (which sets SIGPIPE to SIG_IGN), so `mask` reports what the process
/// was given by whoever exec'd it.
#[used]
#[link_section = ".init_array"]
static CAPTURE_SIGNAL_STATE_AT_EXEC: extern "C" fn() = capture_signal_state_at_exec;

extern "C" fn capture_signal_state_at_exec() {
    let (mut blk, mut ign) = (0u64, 0u64);
    // SAFETY: sigprocmask and sigaction only read our state into zeroed, writable structs.
    unsafe {
        let mut mask: libc::sigset_t = std::mem::zeroed();
        libc::sigprocmask(libc::SIG_BLOCK, std::ptr::null(), &mut mask);
        for s in 1..=64 {
            if libc::sigismember(&mask, s) == 1 {
                blk |= 1 << (s - 1);
            }
            let mut sa: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(s, std::ptr::null(), &mut sa) == 0
                && sa.sa_sigaction == libc::SIG_IGN
            {
                ign |= 1 << (s - 1);
            }
        }
    }
    EXEC_SIGBLK.store(blk, Ordering::SeqCst);
    EXEC_SIGIGN.store(ign, Ordering::SeqCst);
}

/// Appends `line` with one write(2): processes sharing the file (main and member) never interleave.
fn append(path: &str, line: &str) {
    if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(path) {
        let _ = f.write_all(format!("{line}\n").as_bytes());
    }
}

fn catchable() -> Vec<i32> {
    (1..=31)
        .filter(|&s| {
            s != libc::SIGKILL
                && s != libc::SIGSTOP
                && s != libc::SIGCHLD
                && s != libc::SIGSEGV
                && s != libc::SIGBUS
                && s != libc::SIGFPE
                && s != libc::SIGILL
                && s != libc::SIGTRAP
                && s != libc::SIGSYS
                && s != libc::SIGABRT
        })
        .collect()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let name = Path::new(&args[0])
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("");
    if name == "terraform" || name == "tofu" {
        return fake_terraform(&args[1..]);
    }
    match args.get(1).map(String::as_str) {
        Some("orphans") => orphans(&args[2..]),
        Some("no-reap") => no_reap(&args[2..]),
        Some("signals") => signals(&args[2..]),
        Some("mask") => {
            println!(
                "helper: SigBlk:\t{:016x}",
                EXEC_SIGBLK.load(Ordering::SeqCst)
            );
            println!(
                "helper: SigIgn:\t{:016x}",
                EXEC_SIGIGN.load(Ordering::SeqCst)
            );
            ExitCode::SUCCESS
        }
        Some("controller") => controller(&args[2..]),
        _ => {
            eprintln!("helper: unknown mode {:?}", args.get(1));
            ExitCode::from(2)
        }
    }
}

/// Zombies in /proc; with `parent`, only those whose parent is that pid.
fn zombies(parent: Option<i32>) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .chars()
                .all(|c| c.is_ascii_digit())
        })
        .filter(|e| {
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                return false;
            };
            // After the command's ")": state, ppid, ...
            let mut rest = stat.rsplit_once(") ").map_or("", |(_, r)| r).split(' ');
            let state = rest.next().unwrap_or("");
            let ppid = rest.next().and_then(|p| p.parse::<i32>().ok());
            state == "Z" && parent.is_none_or(|p| ppid == Some(p))
        })
        .count()
}

/// Writes `tag` and `n` as one line to `fd`. Async-signal-safe: no allocation, one write(2).
fn write_tagged(fd: libc::c_int, tag: u8, n: i64) {
    let mut buf = [0u8; 32];
    let mut digits = [0u8; 20];
    let (mut v, mut k) = (n.unsigned_abs(), 0);
    loop {
        digits[k] = b'0' + (v % 10) as u8;
        k += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    let mut len = 0;
    buf[len] = tag;
    len += 1;
    if n < 0 {
        buf[len] = b'-';
        len += 1;
    }
    while k > 0 {
        k -= 1;
        buf[len] = digits[k];
        len += 1;
    }
    buf[len] = b'\n';
    len += 1;
    // SAFETY: buf is valid for len bytes; a short or failed write only loses the report.
    unsafe { libc::write(fd, buf.as_ptr().cast(), len) };
}

/// The spawner: forks the witness and `n` children that exit at once, reports, exits. Runs in a
/// forked child of a single-threaded program, so it sticks to async-signal-safe calls.
fn spawner(n: usize, report: libc::c_int) -> ! {
    // SAFETY: getpid, getppid, fork, usleep, write and _exit are async-signal-safe; the children
    // call nothing else either.
    unsafe {
        let me = libc::getpid();
        if libc::fork() == 0 {
            // The witness: wait (up to 30 s) until our parent, the spawner, is gone.
            let mut waited = 0;
            while libc::getppid() == me && waited < 30_000 {
                libc::usleep(1000);
                waited += 1;
            }
            write_tagged(report, b'A', libc::getppid() as i64);
            libc::_exit(0);
        }
        let give_up = Instant::now() + Duration::from_secs(30);
        let mut forked = 0usize;
        while forked < n {
            match libc::fork() {
                0 => libc::_exit(0),
                -1 if Instant::now() < give_up => {
                    libc::usleep(1000);
                }
                -1 => break,
                _ => forked += 1,
            }
        }
        write_tagged(report, b'N', forked as i64);
        libc::_exit(0)
    }
}

fn orphans(args: &[String]) -> ExitCode {
    let n: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(100);
    let get = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
    };
    let deadline_s: u64 = get("--deadline-s")
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let check_adopter = args.iter().any(|a| a == "--check-adopter");
    let parent = nix::unistd::getppid().as_raw();
    let scope = (get("--scope").map(String::as_str) == Some("parent")).then_some(parent);
    let (report_rd, report_wr) = match nix::unistd::pipe() {
        Ok(p) => p,
        Err(e) => {
            println!("helper: pipe failed: {e}");
            return ExitCode::from(3);
        }
    };
    let start = Instant::now();
    // SAFETY: single-threaded test program; the child runs `spawner`, which only forks and _exits.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            use std::os::fd::AsRawFd;
            spawner(n, report_wr.as_raw_fd())
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            drop(report_wr);
            let _ = nix::sys::wait::waitpid(child, None);
        }
        Err(e) => {
            println!("helper: fork failed: {e}");
            return ExitCode::from(3);
        }
    }
    let spawned = start.elapsed();
    // EOF once the witness (adopted) and the spawner have written and exited.
    let mut report = String::new();
    let _ = std::fs::File::from(report_rd).read_to_string(&mut report);
    let field = |tag: char| {
        report
            .lines()
            .find_map(|l| l.strip_prefix(tag).and_then(|v| v.parse::<i64>().ok()))
            .unwrap_or(-1)
    };
    let (forked, adopted_by) = (field('N'), field('A'));
    if forked != n as i64 {
        println!("helper: orphans={n} forked={forked}: could not fork them all");
        return ExitCode::from(5);
    }
    if check_adopter && adopted_by != parent as i64 {
        println!(
            "helper: orphans={n} adopted_by={adopted_by} parent={parent}: the orphans went to another process than our parent"
        );
        return ExitCode::from(4);
    }
    let deadline = Instant::now() + Duration::from_secs(deadline_s);
    loop {
        let z = zombies(scope);
        if z == 0 {
            println!(
                "helper: orphans={n} forked={forked} adopted_by={adopted_by} parent={parent} spawn_ms={} reaped_ms={} zombies=0",
                spawned.as_millis(),
                start.elapsed().as_millis()
            );
            return ExitCode::SUCCESS;
        }
        if Instant::now() >= deadline {
            println!(
                "helper: orphans={n} forked={forked} adopted_by={adopted_by} parent={parent} zombies={z} after {deadline_s}s"
            );
            return ExitCode::from(1);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn no_reap(args: &[String]) -> ExitCode {
    let cmd = args
        .iter()
        .skip_while(|a| *a != "--")
        .skip(1)
        .cloned()
        .collect::<Vec<_>>();
    let Some((prog, rest)) = cmd.split_first() else {
        return ExitCode::from(2);
    };
    let mut child = match Command::new(prog).args(rest).spawn() {
        Ok(c) => c,
        Err(e) => {
            println!("helper: cannot run {prog}: {e}");
            return ExitCode::from(127);
        }
    };
    // Waits for its own child only: every orphan stays a zombie.
    let st = child.wait().map(|s| s.code().unwrap_or(1)).unwrap_or(1);
    ExitCode::from(st as u8)
}

fn signals(args: &[String]) -> ExitCode {
    let Some(out) = args.first().cloned() else {
        return ExitCode::from(2);
    };
    let member = args.iter().any(|a| a == "--member");
    let exit_on = args
        .iter()
        .position(|a| a == "--exit-on")
        .and_then(|i| args.get(i + 1))
        .map(|s| {
            format!("SIG{}", s.trim_start_matches("SIG"))
                .parse::<nix::sys::signal::Signal>()
                .map(|s| s as i32)
                .unwrap_or(0)
        });
    let mut sigs = catchable();
    sigs.extend(libc::SIGRTMIN()..=libc::SIGRTMAX());
    // Block them all, then wait in sigsuspend, which unblocks atomically: a signal that arrives
    // while we write a line stays pending instead of being lost before the next wait.
    // SAFETY: sigset operations on a zeroed local set; sigaction installs a handler that only
    // does an atomic fetch_or (async-signal-safe).
    let old_mask = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in &sigs {
            libc::sigaddset(&mut set, s);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &set, &mut old);
        for &s in &sigs {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = mark_pending as *const () as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            sa.sa_flags = libc::SA_RESTART;
            libc::sigaction(s, &sa, std::ptr::null_mut());
        }
        old
    };
    let role = if member {
        // SAFETY: single-threaded; the child continues as an ordinary process of the same group.
        match unsafe { nix::unistd::fork() } {
            Ok(nix::unistd::ForkResult::Child) => "member",
            _ => "main",
        }
    } else {
        "main"
    };
    append(&out, &format!("ready {role} {}", std::process::id()));
    loop {
        // SAFETY: sigsuspend waits with `old_mask` (a valid set) until a handler has run.
        unsafe { libc::sigsuspend(&old_mask) };
        for (i, count) in PENDING.iter().enumerate() {
            let s = i as i32 + 1;
            for _ in 0..count.swap(0, Ordering::SeqCst) {
                append(&out, &format!("{role} {}", signame(s)));
                if Some(s) == exit_on {
                    return ExitCode::SUCCESS;
                }
            }
        }
    }
}

fn controller(args: &[String]) -> ExitCode {
    let get = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let on_term = get("--on-term").unwrap_or_else(|| "kill".into());
    let exit_code: u8 = get("--exit-code").and_then(|s| s.parse().ok()).unwrap_or(0);
    let log = get("--log");
    let cmd: Vec<String> = args
        .iter()
        .skip_while(|a| *a != "--")
        .skip(1)
        .cloned()
        .collect();
    let Some((prog, rest)) = cmd.split_first() else {
        return ExitCode::from(2);
    };
    install_recorders(&[libc::SIGTERM, libc::SIGINT]);
    let mut child = match Command::new(prog).args(rest).spawn() {
        Ok(c) => c,
        Err(e) => {
            println!("helper: cannot run {prog}: {e}");
            return ExitCode::from(127);
        }
    };
    if let Some(l) = &log {
        append(l, &format!("started {}", child.id()));
    }
    loop {
        match child.try_wait() {
            Ok(Some(st)) => {
                let code = st.code().unwrap_or_else(|| {
                    128 + std::os::unix::process::ExitStatusExt::signal(&st).unwrap_or(0)
                });
                if let Some(l) = &log {
                    append(l, &format!("child-exit {code}"));
                }
                if LAST_SIGNAL.load(Ordering::SeqCst) != 0 {
                    return ExitCode::from(exit_code);
                }
                return ExitCode::from(code as u8);
            }
            Ok(None) => {}
            Err(_) => return ExitCode::from(1),
        }
        if LAST_SIGNAL.load(Ordering::SeqCst) != 0 {
            if let Some(l) = &log {
                append(l, "term");
            }
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            match on_term.as_str() {
                "kill" => {
                    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                    let _ = child.wait();
                    if let Some(l) = &log {
                        append(l, "killed-child");
                    }
                    return ExitCode::from(exit_code);
                }
                "term" => {
                    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
                    LAST_SIGNAL.store(-1, Ordering::SeqCst);
                }
                _ => {}
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn fake_terraform(args: &[String]) -> ExitCode {
    let env = |k: &str| std::env::var(k).ok();
    let log = env("FAKE_TF_LOG");
    // The handlers before the `pid` line: tests wait for that line, then signal us. Written
    // first, a SIGTERM sent in between under load took the default action (the process died
    // without `stopped-gracefully`: shim_protocol's abandoned-run test failed so in a CI-like run).
    let on_term = env("FAKE_TF_ON_TERM").unwrap_or_default();
    match on_term.as_str() {
        "ignore" => {
            // SAFETY: SIG_IGN installs no code of ours.
            unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
        }
        "graceful" => install_recorders(&[libc::SIGTERM, libc::SIGINT]),
        _ => {}
    }
    if let Some(l) = &log {
        append(
            l,
            &format!(
                "pid {} pgid {} args {}",
                std::process::id(),
                nix::unistd::getpgrp(),
                args.join(" ")
            ),
        );
    }
    if env("FAKE_TF_STDIN").is_some() {
        let mut s = String::new();
        let _ = std::io::stdin().read_to_string(&mut s);
        print!("{s}");
    }
    if let Some(n) = env("FAKE_TF_OUT_BYTES").and_then(|s| s.parse::<u64>().ok()) {
        let chunk = vec![b'x'; 1 << 16];
        let mut out = std::io::stdout().lock();
        let mut left = n;
        while left > 0 {
            let k = left.min(chunk.len() as u64) as usize;
            if out.write_all(&chunk[..k]).is_err() {
                return ExitCode::from(141);
            }
            left -= k as u64;
        }
    }
    if env("FAKE_TF_ECHO").is_some() {
        println!("args: {}", args.join(" "));
        eprintln!(
            "cwd: {}",
            std::env::current_dir()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        );
    }
    let sleep_ms: u64 = env("FAKE_TF_SLEEP_MS")
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let deadline = Instant::now() + Duration::from_millis(sleep_ms);
    let mut terms = 0;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
        let s = LAST_SIGNAL.swap(0, Ordering::SeqCst);
        if s != 0 {
            terms += 1;
            if let Some(l) = &log {
                append(l, &format!("signal {}", signame(s)));
            }
            if terms >= 2 {
                eprintln!("Two interrupts received. Exiting immediately.");
                return ExitCode::from(1);
            }
            eprintln!("Interrupt received. Gracefully shutting down...");
            let stop_ms: u64 = env("FAKE_TF_STOP_MS")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            let stop_deadline = Instant::now() + Duration::from_millis(stop_ms);
            while Instant::now() < stop_deadline {
                std::thread::sleep(Duration::from_millis(5));
                let s2 = LAST_SIGNAL.swap(0, Ordering::SeqCst);
                if s2 != 0 {
                    if let Some(l) = &log {
                        append(l, &format!("signal {}", signame(s2)));
                    }
                    eprintln!("Two interrupts received. Exiting immediately.");
                    return ExitCode::from(1);
                }
            }
            if let Some(l) = &log {
                append(l, "stopped-gracefully");
            }
            return ExitCode::from(1);
        }
    }
    if let Some(l) = &log {
        append(l, "done");
    }
    ExitCode::from(
        env("FAKE_TF_EXIT")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
    )
}
