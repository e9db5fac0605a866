//! Signal forwarding: every forwarded signal reaches the whole process group (or only the main
//! child), stop signals start the shutdown, rewrites apply, and signals only the init's own I/O
//! can raise are not forwarded.
//!
//! The PID-1 core with real processes: tfinit runs as PID 1 of a new PID namespace (as in a
//! container) and as a plain child subreaper, with the test helper as its child checking from the
//! inside: zombie reaping, signal forwarding and rewriting, a clean signal state for the child,
//! exit-code relay, stragglers at exit, and the logs.

mod common;
#[path = "common/pid1_init.rs"]
mod pid1_init;

use common::TempDir;
use pid1_init::*;
use std::time::{Duration, Instant};

/// The name the helper records for a signal.
fn recorded(name: &str) -> String {
    match name {
        "IO" => "SIGIO".into(),
        "RTMAX" => format!("SIGRTMIN+{}", libc::SIGRTMAX() - libc::SIGRTMIN()),
        n => format!("SIG{n}"),
    }
}

/// What tfinit forwards as it is (README: every catchable signal but CHLD, PIPE, TTIN, TTOU).
const FORWARDED: [&str; 18] = [
    "HUP", "QUIT", "USR1", "USR2", "ALRM", "STKFLT", "CONT", "TSTP", "URG", "XCPU", "XFSZ",
    "VTALRM", "PROF", "WINCH", "IO", "PWR", "RTMIN+2", "RTMAX",
];

fn every_forwarded_signal_reaches_the_group(how: As) {
    let tmp = TempDir::new("fwd");
    let (init, out, _, _) = start_signals(how, &tmp, &[], &["--exit-on", "TERM"]);
    for name in FORWARDED {
        init.signal(sig(name));
        wait_line(&out, &format!("main {}", recorded(name)));
        wait_line(&out, &format!("member {}", recorded(name)));
    }
    // SIGINT is forwarded too, and starts the shutdown; SIGTERM then ends the helper.
    init.signal(libc::SIGINT);
    wait_line(&out, "main SIGINT");
    wait_line(&out, "member SIGINT");
    init.signal(libc::SIGTERM);
    let done = init.wait(SOON);
    assert_eq!(done.code(), Some(0), "{}", done.stderr);
    let l = lines(&out);
    for role in ["main", "member"] {
        assert!(l.contains(&format!("{role} SIGTERM")), "{l:?}");
        for name in FORWARDED {
            let n = l
                .iter()
                .filter(|x| **x == format!("{role} {}", recorded(name)))
                .count();
            assert_eq!(n, 1, "{role} got {name} {n} times: {l:?}");
        }
    }
    assert!(
        done.stderr.contains("stop signal received"),
        "{}",
        done.stderr
    );
}

#[test]
fn every_forwarded_signal_reaches_the_whole_process_group_when_tfinit_is_pid_1() {
    if !common::can_unshare() {
        return;
    }
    every_forwarded_signal_reaches_the_group(As::Pid1);
}

#[test]
fn every_forwarded_signal_reaches_the_whole_process_group_as_subreaper() {
    every_forwarded_signal_reaches_the_group(As::Subreaper);
}

fn stop_signal_reaches_the_group_and_starts_the_shutdown(how: As, name: &str) {
    let tmp = TempDir::new("stop");
    let (init, out, main, member) = start_signals(how, &tmp, &[], &["--exit-on", name]);
    let t0 = Instant::now();
    init.signal(sig(name));
    let done = init.wait(SOON);
    assert_eq!(done.code(), Some(0), "{}", done.stderr);
    let l = lines(&out);
    assert!(l.contains(&format!("main SIG{name}")), "{l:?}");
    assert!(l.contains(&format!("member SIG{name}")), "{l:?}");
    assert!(!alive(main) && !alive(member));
    assert!(
        done.stderr
            .contains(&format!("stop signal received signal=SIG{name}"))
            && done.stderr.contains("cause=\"stop signal\""),
        "{}",
        done.stderr
    );
    // Both exited at once: the init did not wait for any timer.
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
}

#[test]
fn sigterm_reaches_the_group_and_starts_the_shutdown_when_tfinit_is_pid_1() {
    if !common::can_unshare() {
        return;
    }
    stop_signal_reaches_the_group_and_starts_the_shutdown(As::Pid1, "TERM");
}

#[test]
fn sigint_reaches_the_group_and_starts_the_shutdown_when_tfinit_is_pid_1() {
    if !common::can_unshare() {
        return;
    }
    stop_signal_reaches_the_group_and_starts_the_shutdown(As::Pid1, "INT");
}

#[test]
fn sigterm_and_sigint_reach_the_group_and_start_the_shutdown_as_subreaper() {
    stop_signal_reaches_the_group_and_starts_the_shutdown(As::Subreaper, "TERM");
    stop_signal_reaches_the_group_and_starts_the_shutdown(As::Subreaper, "INT");
}

#[test]
fn with_forward_child_only_the_main_child_gets_signals() {
    for how in both() {
        let tmp = TempDir::new("fwd-child");
        let (init, out, _, member) = start_signals(
            how,
            &tmp,
            &[("TFINIT_FORWARD", "child")],
            &["--exit-on", "TERM"],
        );
        for name in ["HUP", "USR1", "QUIT"] {
            init.signal(sig(name));
            wait_line(&out, &format!("main SIG{name}"));
        }
        // A marker sent straight to the member, numbered above the others: the helper records
        // pending signals lowest first, so once the marker is in, a forwarded one would be too.
        kill(member, libc::SIGWINCH);
        wait_line(&out, "member SIGWINCH");
        let l = lines(&out);
        for name in ["HUP", "USR1", "QUIT"] {
            assert!(
                !l.contains(&format!("member SIG{name}")),
                "{how:?}: member got {name}: {l:?}"
            );
        }
        // SIGTERM goes to the main child only; once it has exited, the member left in its group
        // gets its SIGTERM as a leftover, at once (not at the kill step, 28 s later).
        init.signal(libc::SIGTERM);
        let done = init.wait(SOON);
        assert_eq!(done.code(), Some(0), "{}", done.stderr);
        let l = lines(&out);
        for role in ["main", "member"] {
            assert!(l.contains(&format!("{role} SIGTERM")), "{how:?}: {l:?}");
        }
        assert!(
            done.stderr.contains("controller's leftover processes"),
            "{}",
            done.stderr
        );
        assert!(
            !done.stderr.contains("SIGKILL to everything left"),
            "{}",
            done.stderr
        );
    }
}

#[test]
fn rewrites_turn_term_into_int_and_usr1_into_hup() {
    for how in both() {
        let tmp = TempDir::new("rewrite");
        let (init, out, main, _) =
            start_signals(how, &tmp, &[("TFINIT_REWRITE", "TERM:INT,USR1:HUP")], &[]);
        init.signal(libc::SIGUSR1);
        wait_line(&out, "main SIGHUP");
        wait_line(&out, "member SIGHUP");
        init.signal(libc::SIGTERM);
        wait_line(&out, "main SIGINT");
        wait_line(&out, "member SIGINT");
        // Marker (forwarded as it is, numbered above TERM and USR1; see the forward-child test).
        init.signal(libc::SIGWINCH);
        wait_line(&out, "main SIGWINCH");
        wait_line(&out, "member SIGWINCH");
        let l = lines(&out);
        assert!(
            !l.iter()
                .any(|x| x.ends_with(" SIGTERM") || x.ends_with(" SIGUSR1")),
            "{how:?}: an original signal got through: {l:?}"
        );
        // The rewritten SIGTERM still started the shutdown.
        kill(-main, libc::SIGKILL);
        let done = init.wait(SOON);
        assert_eq!(done.code(), Some(128 + libc::SIGKILL), "{}", done.stderr);
        assert!(
            done.stderr.contains("stop signal received signal=SIGTERM"),
            "{}",
            done.stderr
        );
    }
}

#[test]
fn signals_only_the_init_s_own_io_can_raise_are_not_forwarded() {
    for how in both() {
        let tmp = TempDir::new("self-inflicted");
        let (init, out, _, _) = start_signals(how, &tmp, &[], &["--exit-on", "TERM"]);
        for name in ["PIPE", "TTIN", "TTOU"] {
            init.signal(sig(name));
        }
        // tfinit handles pending signals lowest first, and WINCH is above all three.
        init.signal(libc::SIGWINCH);
        wait_line(&out, "main SIGWINCH");
        wait_line(&out, "member SIGWINCH");
        init.signal(libc::SIGTERM);
        let done = init.wait(SOON);
        assert_eq!(done.code(), Some(0), "{}", done.stderr);
        let l = lines(&out);
        for name in ["PIPE", "TTIN", "TTOU"] {
            assert!(
                !l.iter().any(|x| x.ends_with(&format!(" SIG{name}"))),
                "{how:?}: {name} forwarded: {l:?}"
            );
        }
    }
}

/// The `seq` of the init's heartbeat (owner `pid1-test`, as `pid1_init::launch` names it), once
/// there is one.
fn beat_seq(state: &std::path::Path) -> Option<u64> {
    let file = common::pods::heartbeat_file(state, "pid1-test")?;
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(file).ok()?).ok()?;
    v["seq"].as_u64()
}

/// A wake-up that only forwarded signals leaves the timers to their own wake-up
/// (src/init/event_loop.rs), and that one still comes however many signals arrive between:
/// during a storm of SIGUSR1s (one every 2 ms for 4 s) the heartbeat, a timer every TTL/3 (1 s
/// here), keeps landing, and the signals keep reaching the controller; afterwards the loop
/// sleeps between its timers again.
#[test]
fn the_heartbeat_goes_on_through_a_storm_of_forwarded_signals() {
    let tmp = TempDir::new("storm");
    let state = tmp.join("state");
    let (init, out, _, _) = start_signals(
        As::Subreaper,
        &tmp,
        &[("TFINIT_OWNER_TTL", "3s")],
        &["--exit-on", "TERM"],
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = loop {
        if let Some(seq) = beat_seq(&state) {
            break seq;
        }
        assert!(
            Instant::now() < deadline,
            "no heartbeat in {}",
            state.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let storm_end = Instant::now() + Duration::from_secs(4);
    let mut sent = 0;
    while Instant::now() < storm_end {
        init.signal(libc::SIGUSR1);
        sent += 1;
        std::thread::sleep(Duration::from_millis(2));
    }
    let after = beat_seq(&state).expect("the heartbeat is still there");
    assert!(
        after >= first + 2,
        "heartbeat seq {first} -> {after} over a 4 s storm of {sent} SIGUSR1s (one beat a second)"
    );
    wait_line(&out, "main SIGUSR1");
    // And the loop sleeps again between its timers: one that kept a timer gone by (the nearest
    // timer not computed again) would wake every millisecond, or spin.
    let pid = init.pid();
    let (switches, ticks) = loop_activity(pid);
    std::thread::sleep(Duration::from_secs(2));
    let (switches_after, ticks_after) = loop_activity(pid);
    let (woke, cpu) = (switches_after - switches, ticks_after - ticks);
    eprintln!("after the storm: {woke} wake-ups, {cpu} ticks in 2 s");
    assert!(
        woke < 100 && cpu < 20,
        "after the storm the loop woke {woke} times and ran {cpu} clock ticks in 2 s (timers every second)"
    );
    init.signal(libc::SIGTERM);
    let done = init.wait(SOON);
    assert_eq!(done.code(), Some(0), "{}", done.stderr);
}

/// The loop thread's (the init's main thread) context switches, voluntary and not, and its CPU
/// time in clock ticks (user + system), from /proc.
fn loop_activity(pid: i32) -> (u64, u64) {
    let task = format!("/proc/{pid}/task/{pid}");
    let status = std::fs::read_to_string(format!("{task}/status")).expect("the init's status");
    let switches = status
        .lines()
        .filter(|l| l.contains("ctxt_switches:"))
        .map(|l| l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap())
        .sum();
    let stat = std::fs::read_to_string(format!("{task}/stat")).expect("the init's stat");
    // Fields after the command's closing parenthesis: state is the first, utime the 12th.
    let mut rest = stat.rsplit_once(')').unwrap().1.split_whitespace().skip(11);
    let mut tick = || rest.next().unwrap().parse::<u64>().unwrap();
    (switches, tick() + tick())
}
