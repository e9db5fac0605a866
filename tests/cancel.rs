//! `tfinit cancel` end to end, with the real terraform 1.0.3 in both shapes (panicwrap and
//! TF_FORK=0) against tfinit as PID 1 of a PID namespace. The shim is run by the test itself, so
//! its exit code is what a controller would see.
//!
//! - graceful: terraform gets exactly one SIGTERM (a second cancel sends nothing), the shim exits
//!   with terraform's own code, the local backend's lock is released and the run's lock-owner
//!   record removed; the provider plugin never gets a signal; the metrics count the cancel.
//! - `--force` (here by `--workdir`): terraform's process group is SIGKILLed, the provider
//!   processes are gone too, the shim exits 137, the record is kept for recovery.
//! - during shutdown: refused (exit 1) saying the shutdown stops every run itself; nothing sent.
//! - `--workdir` through a symbolic link, either way: a directory is matched by what it is (device
//!   and inode), not by the text that reached it; a sibling directory matches nothing.
//! - bad input: an unknown id, a malformed id, a directory with no run.

#[macro_use]
mod common;
#[path = "fixtures/slow/mod.rs"]
mod slow;

use std::process::{Child, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;

use slow::{Budget, Shape, SlowInit, Workdir};

const BUDGET: Budget = Budget {
    grace: 20.0,
    stop: 5.0,
    margin: 1.0,
};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Starts the init in `work`'s temp dir; its controller waits for SIGTERM and exits 0.
fn start(work: &Workdir, shape: Shape) -> SlowInit {
    let tf_dir = slow::terraform().parent().unwrap().to_path_buf();
    SlowInit::with_waiting_controller(&work.tmp, &work.dir, tf_dir, shape, BUDGET, vec![])
}

/// Starts a two-minute apply through the shim in `work` and waits until it is in flight (its
/// local-exec started) with the shape under test.
fn apply_in_flight(init: &SlowInit, work: &Workdir, shape: Shape) -> Child {
    let shim = init
        .shim_command(&work.dir, &slow::apply(120))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the shim");
    common::wait_for(Duration::from_secs(60), "the apply in flight", || {
        work.started().then_some(())
    });
    init.assert_shape(shape);
    shim
}

/// The shim's exit and output, waited for against a deadline.
fn finish(mut shim: Child) -> std::process::Output {
    common::wait_child(&mut shim, Duration::from_secs(60), "the shim");
    shim.wait_with_output().expect("shim output")
}

/// One value of `tfinit metrics`.
fn metric(init: &SlowInit, series: &str) -> Option<f64> {
    let out = init.client(&["metrics"]);
    text(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// `tfinit cancel r1` mid-apply: the one graceful SIGTERM; terraform stops, saves its state and
/// releases its lock; the shim exits with terraform's own code; the record is removed.
fn a_graceful_cancel_stops_the_apply_with_one_sigterm_and_leaves_no_lock(shape: Shape) {
    if !slow::have_terraform() {
        return;
    }
    let work = Workdir::new("cancel-graceful");
    let mut init = start(&work, shape);
    let shim = apply_in_flight(&init, &work, shape);
    assert!(work.lock_info().exists(), "the apply holds its lock");
    let state_dir = work.tmp.join("state");
    common::wait_for(Duration::from_secs(20), "the run's record", || {
        (common::pods::records(&state_dir).len() == 1).then_some(())
    });
    let status = init.status();
    assert_eq!(
        status["runs"][0]["id"], "r1",
        "status shows the run id: {status}"
    );

    let out = init.client(&["cancel", "r1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(said.starts_with("r1: SIGTERM sent to terraform"), "{said}");

    // Asked again while it stops (or once it is gone): never a second SIGTERM.
    let again = init.client(&["cancel", "r1"]);
    match again.status.code() {
        // Still stopping, or exited with its output still being drained: nothing is sent.
        Some(0) => assert!(
            text(&again.stdout).contains("asked to stop already")
                || text(&again.stdout).contains("terraform exited already"),
            "{}",
            text(&again.stdout)
        ),
        Some(1) => assert!(
            text(&again.stderr).contains("no run r1"),
            "{}",
            text(&again.stderr)
        ),
        other => panic!("second cancel: {other:?} {}", text(&again.stderr)),
    }

    let out = finish(shim);
    let ev = init.events();
    let exited = ev.one("terraform exited");
    let code = exited
        .str("exit")
        .and_then(|e| e.strip_prefix("exit code "))
        .and_then(|c| c.parse::<i32>().ok())
        .unwrap_or_else(|| panic!("terraform exited by itself: {}", exited.v));
    assert_eq!(
        out.status.code(),
        Some(code),
        "the shim exits with terraform's code"
    );
    assert_ne!(code, 0, "an interrupted apply fails");
    let all = text(&out.stdout) + &text(&out.stderr);
    assert!(all.contains("Interrupt received"), "{all}");
    assert!(!all.contains("Two interrupts received"), "{all}");
    let terms = ev.all("SIGTERM to terraform");
    assert_eq!(terms.len(), 1, "exactly one SIGTERM: {}", ev.dump());
    assert_eq!(terms[0].str("reason"), Some("tfinit cancel"));
    assert_eq!(terms[0].str("run"), Some("r1"));
    assert!(ev.all("SIGKILL to terraform's process group").is_empty());
    work.assert_provider_never_signalled();
    assert!(
        !work.lock_info().exists(),
        "the graceful stop released the lock"
    );
    common::wait_for(Duration::from_secs(20), "the record removed", || {
        common::pods::records(&state_dir).is_empty().then_some(())
    });
    assert_eq!(
        metric(&init, "tfinit_cancels_total{how=\"graceful\"}"),
        Some(1.0)
    );
    assert_eq!(
        metric(&init, "tfinit_cancels_total{how=\"force\"}"),
        Some(0.0)
    );
    assert_eq!(
        metric(
            &init,
            "tfinit_runs_total{subcommand=\"apply\",outcome=\"stopped_gracefully\"}"
        ),
        Some(1.0)
    );

    init.signal(Signal::SIGTERM);
    assert_eq!(init.wait(Duration::from_secs(30)), 0, "{}", init.log_tail());
}
both_shapes!(a_graceful_cancel_stops_the_apply_with_one_sigterm_and_leaves_no_lock);

/// `tfinit cancel --force --workdir DIR`: SIGKILL to terraform's whole process group at once (no
/// SIGTERM); the provider processes are gone too; the shim exits 137; the record stays for
/// recovery.
fn a_forced_cancel_kills_the_group_and_keeps_the_record(shape: Shape) {
    if !slow::have_terraform() {
        return;
    }
    let work = Workdir::new("cancel-force");
    let mut init = start(&work, shape);
    let shim = apply_in_flight(&init, &work, shape);
    let state_dir = work.tmp.join("state");
    common::wait_for(Duration::from_secs(20), "the run's record", || {
        (common::pods::records(&state_dir).len() == 1).then_some(())
    });
    let pgid = init
        .processes()
        .into_iter()
        .find(|p| p.cmdline.contains("terraform-provider-null"))
        .map(|p| p.pgid)
        .expect("the provider runs");

    let dir = work.dir.to_str().unwrap();
    let out = init.client(&["cancel", "--force", "--workdir", dir]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("r1: SIGKILL sent to terraform's process group"),
        "{}",
        text(&out.stdout)
    );
    let out = finish(shim);
    assert_eq!(out.status.code(), Some(137), "{}", text(&out.stderr));
    common::wait_for(
        Duration::from_secs(10),
        "terraform's group to be gone",
        || {
            init.processes()
                .iter()
                .all(|p| p.pgid != pgid && !p.cmdline.contains("terraform-provider-null"))
                .then_some(())
        },
    );
    let ev = init.events();
    assert!(ev.all("SIGTERM to terraform").is_empty(), "{}", ev.dump());
    let kill = ev.one("SIGKILL to terraform's process group");
    assert_eq!(kill.str("reason"), Some("tfinit cancel --force"));
    // The recorder marks it ended beside the loop: polled.
    let ended = common::wait_for(Duration::from_secs(20), "the record marked ended", || {
        let records = common::pods::records(&state_dir);
        assert_eq!(records.len(), 1, "the killed run's record is kept");
        records[0].1["ended"]["how"].as_str().map(str::to_string)
    });
    assert!(ended.contains("SIGKILL"), "{ended}");
    assert_eq!(
        metric(&init, "tfinit_cancels_total{how=\"force\"}"),
        Some(1.0)
    );

    init.signal(Signal::SIGTERM);
    assert_eq!(init.wait(Duration::from_secs(30)), 0, "{}", init.log_tail());
}
both_shapes!(a_forced_cancel_kills_the_group_and_keeps_the_record);

/// A cancel while the init shuts down is refused (exit 1) and says why: the timeline stops every
/// run itself. Nothing is sent until its graceful step.
fn a_cancel_during_shutdown_is_refused_and_the_timeline_decides(shape: Shape) {
    if !slow::have_terraform() {
        return;
    }
    let work = Workdir::new("cancel-shutdown");
    let mut init = start(&work, shape);
    let shim = apply_in_flight(&init, &work, shape);
    init.signal(Signal::SIGTERM);
    init.wait_event(Duration::from_secs(10), "shutdown:");

    let out = init.client(&["cancel", "r1"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot cancel: the init is shutting down and stops every run itself")
            && err.contains("nothing was sent"),
        "{err}"
    );
    assert!(init.events().all("SIGTERM to terraform").is_empty());
    assert_eq!(init.status()["runs"][0]["stop_requested"], false);

    // A second stop signal jumps to the graceful step: one SIGTERM, from the timeline.
    init.signal(Signal::SIGTERM);
    let out = finish(shim);
    assert_ne!(out.status.code(), Some(0));
    assert_eq!(init.wait(Duration::from_secs(30)), 0, "{}", init.log_tail());
    let ev = init.events();
    let terms = ev.all("SIGTERM to terraform");
    assert_eq!(terms.len(), 1, "{}", ev.dump());
    assert_eq!(
        terms[0].str("reason"),
        Some("shutdown deadline approaching")
    );
    assert!(!work.lock_info().exists());
}
both_shapes!(a_cancel_during_shutdown_is_refused_and_the_timeline_decides);

/// Bad input: an unknown id (exit 1, naming it and `tfinit status`), a malformed id (exit 2), a
/// directory where no run works (exit 1), no init (exit 3).
#[test]
fn a_cancel_of_an_unknown_run_or_directory_says_so_and_sends_nothing() {
    if !slow::have_root() {
        return;
    }
    let tmp = common::TempDir::new("cancel-unknown");
    let tf_dir = common::fake_terraform_dir(&tmp);
    let shape = Shape::SingleProcess;
    let mut init = SlowInit::with_waiting_controller(&tmp, &tmp.0, tf_dir, shape, BUDGET, vec![]);

    let out = init.client(&["cancel", "r99"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no run r99") && err.contains("`tfinit status` lists the runs"),
        "{err}"
    );
    assert!(text(&out.stdout).is_empty());

    let out = init.client(&["cancel", "7"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("\"7\" is not a run id: ids are r and"),
        "{err}"
    );
    // Leading zeros are refused, not read as another id (r00004 is not r4).
    let out = init.client(&["cancel", "r00004"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("\"r00004\" is not a run id") && err.contains("without leading zeros"),
        "{err}"
    );

    let nowhere = tmp.join("nowhere");
    let out = init.client(&["cancel", "--workdir", nowhere.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("no run in {}", nowhere.display())),
        "{err}"
    );

    let usage = init.client(&["cancel"]);
    assert_eq!(usage.status.code(), Some(2), "clap's usage error");
    let out = common::run_output(
        std::process::Command::new(common::tfinit())
            .args(["cancel", "r1"])
            .env("TFINIT_RUN_DIR", tmp.join("no-init")),
        Duration::from_secs(10),
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));

    assert!(init.events().all("tfinit cancel").is_empty());
    init.signal(Signal::SIGTERM);
    assert_eq!(init.wait(Duration::from_secs(30)), 0, "{}", init.log_tail());
}

/// `tfinit cancel --workdir` names a directory by what it is: the shim stats the run's
/// directories and the cancel client its `--workdir` (device and inode), and the init compares the
/// numbers. A run started with `-chdir=link` (a symbolic link to `real`) is cancelled by `real`'s
/// path, whose text it never had; a run started with `-chdir=<real>` by the link's path; a sibling
/// directory cancels nothing (exit 1) and the run goes on.
#[test]
fn a_cancel_by_directory_finds_a_run_started_through_a_symbolic_link_and_the_other_way_round() {
    if !slow::have_root() {
        return;
    }
    let tmp = common::TempDir::new("cancel-link");
    let tf_dir = common::fake_terraform_dir(&tmp);
    let (real, link, other) = (tmp.join("real"), tmp.join("link"), tmp.join("other"));
    std::fs::create_dir_all(&real).unwrap();
    std::fs::create_dir_all(&other).unwrap();
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let shape = Shape::SingleProcess;
    let mut init = SlowInit::with_waiting_controller(&tmp, &tmp.0, tf_dir, shape, BUDGET, vec![]);
    let rounds = [
        (1, "-chdir=link".to_string(), &real),
        (2, format!("-chdir={}", real.display()), &link),
    ];
    for (n, chdir, asked) in rounds {
        let log = tmp.join(&format!("fake-terraform-{n}.log"));
        let shim = init
            .shim_command(&tmp.0, &[chdir.clone(), "plan".into()])
            .env("FAKE_TF_SLEEP_MS", "120000")
            .env("FAKE_TF_ON_TERM", "graceful")
            .env("FAKE_TF_LOG", &log)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the shim");
        common::wait_for(Duration::from_secs(20), "the fake terraform", || {
            common::read(&log).contains("args").then_some(())
        });

        let out = init.client(&["cancel", "--workdir", other.to_str().unwrap()]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{chdir}: {err}");
        assert!(
            err.contains(&format!("no run in {}", other.display())),
            "{chdir}: {err}"
        );
        assert_eq!(init.status()["runs"][0]["stop_requested"], false);

        let out = init.client(&["cancel", "--workdir", asked.to_str().unwrap()]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{chdir}, cancelled by {}: {}",
            asked.display(),
            text(&out.stderr)
        );
        let said = text(&out.stdout);
        assert!(
            said.starts_with(&format!("r{n}: SIGTERM sent to terraform")),
            "{said}"
        );
        let out = finish(shim);
        assert_eq!(
            out.status.code(),
            Some(1),
            "the fake terraform stops gracefully: {}",
            text(&out.stderr)
        );
    }
    let terms = init.events().all("SIGTERM to terraform").len();
    assert_eq!(terms, 2, "{}", init.log_tail());
    init.signal(Signal::SIGTERM);
    assert_eq!(init.wait(Duration::from_secs(30)), 0, "{}", init.log_tail());
}

/// Only the init's own uid (or root) may cancel: the control socket's peer check refuses a client
/// of another uid even when it can reach the socket, and the run goes on untouched; the init's
/// own user cancels it.
#[test]
fn a_cancel_from_another_uid_is_refused_by_the_peer_check() {
    if !slow::have_root()
        || !common::require_root("a client of uid 4321 (setpriv)")
        || !common::require(
            std::path::Path::new("/usr/bin/setpriv").exists(),
            "setpriv (util-linux)",
        )
    {
        return;
    }
    let tmp = common::TempDir::new("cancel-uid");
    let tf_log = tmp.join("fake-terraform.log");
    let mut init = SlowInit::with_fake_apply(&tmp, &tf_log, BUDGET, "graceful", 7);
    // Let uid 4321 reach the socket (the init makes it 0700/0600): only the init's check is left.
    use std::os::unix::fs::PermissionsExt;
    let run_dir = tmp.join("run");
    std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        tfinit::config::socket_path(&run_dir),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    let mut cmd = std::process::Command::new("/usr/bin/setpriv");
    common::scrub(&mut cmd)
        .args(["--reuid", "4321", "--regid", "4321", "--clear-groups", "--"])
        .arg(common::tfinit())
        .args(["cancel", "r1"])
        .env("TFINIT_RUN_DIR", &run_dir);
    let out = common::run_output(&mut cmd, Duration::from_secs(20));
    let err = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "refused by the init (1), not \"no init answers\" (3): {err}"
    );
    assert!(err.contains("refused") && err.contains("uid 4321"), "{err}");
    assert!(!err.contains("tfinit: tfinit:"), "one prefix: {err}");
    let ev = init.events();
    assert!(ev.all("SIGTERM to terraform").is_empty(), "{}", ev.dump());
    let status = init.status();
    assert_eq!(status["runs"][0]["state"], "running", "{status}");
    assert_eq!(status["runs"][0]["stop_requested"], false, "{status}");

    let out = init.client(&["cancel", "r1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    init.wait_event(Duration::from_secs(20), "terraform exited");
    assert_eq!(init.events().all("SIGTERM to terraform").len(), 1);
    // The controller stand-in ends with its terraform, and the init with it, maybe between a
    // look and a signal: the SIGTERM is only for an init still there (ESRCH otherwise).
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(init.host_pid), Signal::SIGTERM);
    init.wait(Duration::from_secs(30));
}
