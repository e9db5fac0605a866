//! tfinit-test-helper: programs that run as tfinit's children in the integration tests and check
//! from the inside. Every line it prints starts with `helper:`.
//!
//! Modes (first argument):
//! - `orphans N [--settle-ms M]`: a spawner forks N children and exits at once, so the N become
//!   orphans of the init; they exit immediately. Then polls /proc until no zombie is left (exit 0)
//!   or the deadline passes (exit 1, printing how many remain).
//! - `no-reap -- CMD...`: runs CMD and never reaps anything else (a broken PID 1, for the
//!   negative test); exits with CMD's status.
//! - `signals OUT [--member] [--exit-on SIG]`: records each signal received as a line in OUT
//!   (`main SIGHUP`, and `member SIGHUP` from a second process of the same group with --member);
//!   writes `ready` first. Exits 0 on --exit-on's signal (default SIGTERM... only when given).
//! - `mask`: prints its SigBlk and SigIgn lines from /proc/self/status.
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
use std::sync::atomic::{AtomicI32, Ordering};
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
    nix::sys::signal::Signal::try_from(s)
        .map(|x| x.as_str().to_string())
        .unwrap_or_else(|_| format!("SIG{s}"))
}

fn append(path: &str, line: &str) {
    if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(f, "{line}");
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
            let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
            for l in s
                .lines()
                .filter(|l| l.starts_with("SigBlk") || l.starts_with("SigIgn"))
            {
                println!("helper: {l}");
            }
            ExitCode::SUCCESS
        }
        Some("controller") => controller(&args[2..]),
        _ => {
            eprintln!("helper: unknown mode {:?}", args.get(1));
            ExitCode::from(2)
        }
    }
}

fn zombies() -> usize {
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
            std::fs::read_to_string(e.path().join("stat"))
                .ok()
                .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('Z')))
                .unwrap_or(false)
        })
        .count()
}

fn orphans(args: &[String]) -> ExitCode {
    let n: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(100);
    let deadline_s: u64 = args
        .iter()
        .position(|a| a == "--deadline-s")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let start = Instant::now();
    // SAFETY: single-threaded test program; the child only forks and _exits.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            for _ in 0..n {
                // SAFETY: as above; grandchildren _exit at once.
                match unsafe { nix::unistd::fork() } {
                    Ok(nix::unistd::ForkResult::Child) => unsafe { libc::_exit(0) },
                    Ok(_) => {}
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
            unsafe { libc::_exit(0) }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            let _ = nix::sys::wait::waitpid(child, None);
        }
        Err(e) => {
            println!("helper: fork failed: {e}");
            return ExitCode::from(3);
        }
    }
    let spawned = start.elapsed();
    let deadline = Instant::now() + Duration::from_secs(deadline_s);
    loop {
        let z = zombies();
        if z == 0 {
            println!(
                "helper: orphans={n} spawn_ms={} reaped_ms={} zombies=0",
                spawned.as_millis(),
                start.elapsed().as_millis()
            );
            return ExitCode::SUCCESS;
        }
        if Instant::now() >= deadline {
            println!("helper: orphans={n} zombies={z} after {}s", deadline_s);
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
    let sigs = catchable();
    install_recorders(&sigs);
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
        // SAFETY: pause() just waits for a signal.
        unsafe { libc::pause() };
        let s = LAST_SIGNAL.swap(0, Ordering::SeqCst);
        if s != 0 {
            append(&out, &format!("{role} {}", signame(s)));
            if Some(s) == exit_on {
                return ExitCode::SUCCESS;
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
    let on_term = env("FAKE_TF_ON_TERM").unwrap_or_default();
    match on_term.as_str() {
        "ignore" => {
            // SAFETY: SIG_IGN installs no code of ours.
            unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
        }
        "graceful" => install_recorders(&[libc::SIGTERM, libc::SIGINT]),
        _ => {}
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
