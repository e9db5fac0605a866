//! Reaping: orphans come to tfinit (as PID 1 or as subreaper) and leave no zombie; stragglers
//! in the controller's group are stopped when the controller exits, and nothing is waited for
//! when nothing is left.
//!
//! The PID-1 core with real processes: tfinit runs as PID 1 of a new PID namespace (as in a
//! container) and as a plain child subreaper, with the test helper as its child checking from the
//! inside: zombie reaping, signal forwarding and rewriting, a clean signal state for the child,
//! exit-code relay, stragglers at exit, and the logs.

mod common;
#[path = "common/pid1_init.rs"]
mod pid1_init;

use common::{helper, TempDir};
use pid1_init::*;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The 20,000-orphan bursts run one at a time: two at once would come close to the host's pid_max.
static BURST: Mutex<()> = Mutex::new(());

fn burst_leaves_no_zombie(how: As) {
    let _one_at_a_time = BURST.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = TempDir::new("burst");
    let mut argv = vec![os("--"), helper_arg()];
    argv.extend(["orphans", "20000", "--check-adopter", "--deadline-s", "60"].map(os));
    if how == As::Subreaper {
        // On a shared host, count only the zombies tfinit would have to reap.
        argv.extend(["--scope", "parent"].map(os));
    }
    let done = start(how, &tmp, &[], &argv).wait(Duration::from_secs(120));
    assert_eq!(
        done.code(),
        Some(0),
        "the helper found zombies or orphans that escaped tfinit\nstdout: {}\nstderr: {}",
        done.stdout,
        done.stderr
    );
    assert!(
        done.stdout.contains("orphans=20000 forked=20000") && done.stdout.contains("zombies=0"),
        "{}",
        done.stdout
    );
}

#[test]
fn a_burst_of_20000_orphans_leaves_no_zombie_when_tfinit_is_pid_1() {
    if !common::can_unshare() {
        return;
    }
    burst_leaves_no_zombie(As::Pid1);
}

#[test]
fn a_burst_of_20000_orphans_comes_to_tfinit_as_subreaper_and_leaves_no_zombie() {
    burst_leaves_no_zombie(As::Subreaper);
}

#[test]
fn without_a_reaper_orphans_stay_zombies_and_the_helper_says_so() {
    if !common::can_unshare() {
        return;
    }
    // The helper's check can fail: under a PID 1 that never reaps, it must report zombies.
    let mut c = common::unshare();
    c.args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .arg(helper())
        .args(["no-reap", "--"])
        .arg(helper())
        .args(["orphans", "200", "--deadline-s", "2"]);
    let out = common::run_output(&mut c, Duration::from_secs(30));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("zombies=") && !stdout.contains("zombies=0"),
        "{stdout}"
    );
}

#[test]
fn orphans_that_escape_to_another_process_fail_the_adopter_check() {
    if !common::can_unshare() {
        return;
    }
    // The helper as PID 1 itself has no parent in its namespace: its orphans go to itself, not
    // to its parent, and --check-adopter must notice.
    let mut c = common::unshare();
    c.args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .arg(helper())
        .args(["orphans", "50", "--check-adopter", "--deadline-s", "2"]);
    let out = common::run_output(&mut c, Duration::from_secs(30));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(4), "{stdout}");
}

/// `sh -c` that starts `helper signals OUT ARGS` in the background (same process group), waits
/// until it is ready, and exits 0: the helper is left behind in the controller's group.
fn leave_a_straggler(out: &Path, helper_args: &str) -> Vec<String> {
    let script = format!(
        "\"$0\" signals \"$1\" {helper_args} & i=0; until grep -q '^ready main' \"$1\" 2>/dev/null; do \
         i=$((i+1)); [ $i -gt 2000 ] && exit 9; sleep 0.01; done; exit 0"
    );
    vec![
        "--".into(),
        "sh".into(),
        "-c".into(),
        script,
        helper().display().to_string(),
        out.display().to_string(),
    ]
}

fn start_with_straggler(
    how: As,
    tmp: &TempDir,
    env: &[(&str, &str)],
    helper_args: &str,
) -> (Pid1Init, PathBuf) {
    let out = tmp.join("straggler.out");
    let args = leave_a_straggler(&out, helper_args);
    let argv: Vec<&OsStr> = args.iter().map(|a| os(a)).collect();
    (start(how, tmp, env, &argv), out)
}

#[test]
fn a_straggler_in_the_controller_s_group_gets_sigterm_when_the_controller_exits() {
    for how in both() {
        let tmp = TempDir::new("straggler");
        let (init, out) = start_with_straggler(
            how,
            &tmp,
            &[("TFINIT_GRACE_PERIOD", "60s")],
            "--exit-on TERM",
        );
        // As a subreaper its pid is the host's; as PID 1 the namespace dies with tfinit anyway
        // (and tfinit may be gone before a lookup), so only the log can tell there.
        let straggler = (how == As::Subreaper).then(|| ready_pid(&out, "main"));
        ready_pid(&out, "main");
        let t0 = Instant::now();
        let done = init.wait(SOON);
        let took = t0.elapsed();
        assert_eq!(done.code(), Some(0), "{how:?}: {}", done.stderr);
        assert_eq!(
            lines(&out).iter().filter(|l| *l == "main SIGTERM").count(),
            1,
            "{:?}",
            lines(&out)
        );
        assert!(!straggler.is_some_and(alive), "the straggler survived");
        assert!(
            done.stderr.contains("controller's leftover processes"),
            "{}",
            done.stderr
        );
        // It left on SIGTERM: nothing waited for the 60 s grace period or its kill step.
        assert!(took < Duration::from_secs(10), "{how:?}: took {took:?}");
        assert!(
            !done.stderr.contains("SIGKILL to everything left"),
            "{}",
            done.stderr
        );
    }
}

#[test]
fn a_straggler_that_ignores_sigterm_is_killed_at_the_kill_step_and_the_init_exits_then() {
    // Kill step at deadline - margin = controller exit + 4s - 1s (the least budget: the margin
    // at least 1s, the stop timeout 1s more, the grace period over both).
    let env = [
        ("TFINIT_GRACE_PERIOD", "4s"),
        ("TFINIT_STOP_TIMEOUT", "2s"),
        ("TFINIT_KILL_MARGIN", "1s"),
    ];
    for how in both() {
        let tmp = TempDir::new("stubborn");
        let (init, out) = start_with_straggler(how, &tmp, &env, "");
        // As a subreaper its pid is the host's; as PID 1 the namespace dies with tfinit anyway
        // (and tfinit may be gone before a lookup), so only the log can tell there.
        let straggler = (how == As::Subreaper).then(|| ready_pid(&out, "main"));
        ready_pid(&out, "main");
        let t0 = Instant::now();
        let done = init.wait(SOON);
        let took = t0.elapsed();
        assert_eq!(
            done.code(),
            Some(0),
            "{how:?}: the controller's code: {}",
            done.stderr
        );
        let l = lines(&out);
        assert_eq!(
            l.iter().filter(|x| *x == "main SIGTERM").count(),
            1,
            "exactly one SIGTERM: {l:?}"
        );
        assert!(
            done.stderr.contains("SIGKILL to everything left"),
            "{}",
            done.stderr
        );
        assert!(!straggler.is_some_and(alive), "the straggler survived");
        // Not before the kill step (3 s after the controller exited), and promptly after it.
        assert!(
            took >= Duration::from_millis(2500),
            "{how:?}: killed too early: {took:?}"
        );
        assert!(
            took < Duration::from_secs(6),
            "{how:?}: exited late: {took:?}"
        );
    }
}

#[test]
fn with_nothing_left_the_init_exits_at_once() {
    for how in both() {
        let tmp = TempDir::new("prompt");
        let t0 = Instant::now();
        let done = start(
            how,
            &tmp,
            &[("TFINIT_GRACE_PERIOD", "60s")],
            &[os("--"), os("true")],
        )
        .wait(SOON);
        let took = t0.elapsed();
        assert_eq!(done.code(), Some(0), "{}", done.stderr);
        assert!(
            took < Duration::from_secs(5),
            "{how:?}: took {took:?} with a 60s grace period"
        );
        assert!(!done.stderr.contains("leftover"), "{}", done.stderr);
    }
}
