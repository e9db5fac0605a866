//! Drain control end to end (what a preStop hook runs): `tfinit drain [--wait] [--timeout D]`,
//! `tfinit resume`, `tfinit status`, against tfinit as PID 1 of a PID namespace.
//!
//! Draining refuses new terraform runs (the shim exits 75 with a message saying terraform was not
//! started) without stopping the controller; runs in flight go on untouched. `--wait` returns 0
//! once none is in flight, or 1 after its timeout listing the runs still going. Real-terraform
//! tests run in both shapes: panicwrap (default) and one process (TF_FORK=0).

#[macro_use]
mod common;
#[path = "fixtures/slow/mod.rs"]
mod slow;

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use slow::{Budget, Shape, SlowInit, Spec, Workdir};

/// The shim's documented exit code when the init refuses to start terraform (EX_TEMPFAIL).
const EXIT_REFUSED: i32 = 75;

const BUDGET: Budget = Budget {
    grace: 20.0,
    stop: 5.0,
    margin: 1.0,
};

fn real_terraform_dir() -> std::path::PathBuf {
    slow::terraform().parent().unwrap().to_path_buf()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Draining refuses a new run with exit code 75 and a message saying terraform was not started,
/// without signalling the controller; `tfinit resume` accepts runs again.
fn drain_refuses_new_runs_with_exit_75_and_resume_accepts_them_again(shape: Shape) {
    if !slow::have_terraform() {
        return;
    }
    let work = Workdir::new("drain-refuse");
    let tf_dir = real_terraform_dir();
    let mut init =
        SlowInit::with_waiting_controller(&work.tmp, &work.dir, tf_dir, shape, BUDGET, vec![]);
    // Where the waiting controller notes each signal it gets (after its `ready` line).
    let ctl_signals = work.tmp.join("controller-signals.log");

    let drained = init.client(&["drain"]);
    assert!(drained.status.success(), "{}", text(&drained.stderr));
    assert_eq!(init.status()["phase"], "draining");

    let refused = init.shim(&work.dir, &slow::apply(0));
    let err = text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(EXIT_REFUSED), "{err}");
    assert!(
        err.contains("draining") && err.contains("terraform was not started"),
        "the shim says why: {err}"
    );
    // Terraform really was not started.
    assert!(!work.started(), "the local-exec ran");
    assert_eq!(work.state(), Vec::<String>::new());
    let ev = init.events();
    assert!(ev.all("terraform started").is_empty(), "{}", ev.dump());
    assert_eq!(ev.all("terraform run refused").len(), 1, "{}", ev.dump());
    // Draining does not stop the controller.
    assert!(
        common::read(&ctl_signals)
            .lines()
            .all(|l| l.starts_with("ready")),
        "the controller got a signal: {}",
        common::read(&ctl_signals)
    );

    let resumed = init.client(&["resume"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    assert_eq!(init.status()["phase"], "running");
    let ran = init.shim(&work.dir, &slow::apply(0));
    assert_eq!(ran.status.code(), Some(0), "{}", text(&ran.stderr));
    assert!(text(&ran.stdout).contains("Apply complete!"));
    assert_eq!(
        work.state(),
        [
            "null_resource.after[0]",
            "null_resource.after[1]",
            "null_resource.slow"
        ]
    );

    init.signal(Signal::SIGTERM);
    assert_eq!(init.wait(Duration::from_secs(30)), 0, "{}", init.log_tail());
}
both_shapes!(drain_refuses_new_runs_with_exit_75_and_resume_accepts_them_again);

/// `tfinit drain --wait` returns 0 only once the last run in flight has ended by itself: the run
/// is never signalled, it completes, and the controller is never stopped.
fn drain_wait_returns_once_the_last_run_in_flight_has_ended(shape: Shape) {
    if !slow::have_terraform() {
        return;
    }
    let work = Workdir::new("drain-wait");
    let ctl_log = work.tmp.join("controller.log");
    let mut init = SlowInit::start(
        &work.tmp,
        Spec {
            cwd: &work.dir,
            terraform_dir: real_terraform_dir(),
            shape,
            budget: BUDGET,
            env: vec![],
            main: slow::controller(7, &ctl_log, &slow::apply(4)),
        },
    );
    common::wait_for(Duration::from_secs(60), "the apply to be in flight", || {
        work.started().then_some(())
    });
    init.assert_shape(shape);

    let mut waiter = init
        .client_command(&["drain", "--wait"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start tfinit drain --wait");
    let status = common::wait_for(Duration::from_secs(10), "the init to drain", || {
        Some(init.status()).filter(|s| s["phase"] == "draining")
    });
    assert_eq!(status["runs"][0]["id"], "r1", "{status}");
    // A new run is refused meanwhile.
    assert_eq!(
        init.shim(&work.dir, &slow::apply(0)).status.code(),
        Some(EXIT_REFUSED)
    );
    let st = common::wait_child(&mut waiter, Duration::from_secs(60), "tfinit drain --wait");
    let returned = slow::now_unix();
    let out = waiter.wait_with_output().expect("drain output");
    assert_eq!(st.code(), Some(0), "{}", text(&out.stderr));

    let code = init.wait(Duration::from_secs(30));
    let ev = init.events();
    let exited = ev.one("terraform exited");
    assert!(
        returned >= exited.ts,
        "drain --wait returned {:.3}s before the run ended",
        exited.ts - returned
    );
    assert_eq!(exited.str("exit"), Some("exit code 0"));
    assert_eq!(
        work.state(),
        [
            "null_resource.after[0]",
            "null_resource.after[1]",
            "null_resource.slow"
        ],
        "the run in flight completed"
    );
    assert!(ev.all("SIGTERM to terraform").is_empty(), "{}", ev.dump());
    let ctl = common::read(&ctl_log);
    assert!(!ctl.contains("term"), "the controller was stopped: {ctl}");
    assert_eq!(code, 0, "the controller exited with terraform's code");
    assert!(init.all_output().contains("Apply complete!"));
}
both_shapes!(drain_wait_returns_once_the_last_run_in_flight_has_ended);

/// `tfinit drain --wait --timeout 1s` with a run that goes on exits 1 after the timeout, listing
/// the run (id, subcommand, directory); the run is not touched.
fn drain_wait_gives_up_after_its_timeout_listing_the_runs_still_going(shape: Shape) {
    if !slow::have_terraform() {
        return;
    }
    let work = Workdir::new("drain-timeout");
    let mut init = SlowInit::start(
        &work.tmp,
        Spec {
            cwd: &work.dir,
            terraform_dir: real_terraform_dir(),
            shape,
            budget: BUDGET,
            env: vec![],
            main: slow::controller(7, &work.tmp.join("controller.log"), &slow::apply(120)),
        },
    );
    common::wait_for(Duration::from_secs(60), "the apply to be in flight", || {
        work.started().then_some(())
    });
    init.assert_shape(shape);

    let t0 = Instant::now();
    let out = init.client(&["drain", "--wait", "--timeout", "1s"]);
    let waited = t0.elapsed();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(waited >= Duration::from_secs(1), "gave up after {waited:?}");
    assert!(err.contains("timed out"), "{err}");
    let listed = err
        .lines()
        .find(|l| l.contains("r1"))
        .unwrap_or_else(|| panic!("run r1 not listed: {err}"));
    assert!(
        listed.contains("apply") && listed.contains(work.dir.to_str().unwrap()),
        "{listed}"
    );
    assert!(init.events().all("SIGTERM to terraform").is_empty());
    assert!(work.lock_info().exists(), "the run still holds its lock");

    // Clean up the way an operator would: two stop signals stop the run gracefully at once.
    init.signal(Signal::SIGTERM);
    init.wait_event(Duration::from_secs(10), "shutdown:");
    init.signal(Signal::SIGTERM);
    assert_eq!(init.wait(Duration::from_secs(30)), 7, "{}", init.log_tail());
    assert!(!work.lock_info().exists());
}
both_shapes!(drain_wait_gives_up_after_its_timeout_listing_the_runs_still_going);

/// `tfinit status` shows the phase (running, draining, stopping), and once stopping the deadline
/// and the seconds left; `tfinit resume` cannot undo stopping.
#[test]
fn status_shows_the_phase_the_deadline_and_the_seconds_left() {
    if !slow::have_root() {
        return;
    }
    let tmp = common::TempDir::new("status");
    let tf_log = tmp.join("fake-terraform.log");
    let mut init = SlowInit::with_fake_apply(&tmp, &tf_log, BUDGET, "graceful", 7);

    let s = init.status();
    assert_eq!(s["phase"], "running", "{s}");
    assert!(
        s["deadline_unix"].is_null() && s["seconds_left"].is_null(),
        "{s}"
    );
    assert_eq!(s["runs"].as_array().map(Vec::len), Some(1), "{s}");
    assert_eq!(s["runs"][0]["subcommand"], "apply");
    assert_eq!(s["runs"][0]["attached"], true);

    assert!(init.client(&["drain"]).status.success());
    let s = init.status();
    assert_eq!(s["phase"], "draining", "{s}");
    assert!(
        s["deadline_unix"].is_null(),
        "draining has no deadline: {s}"
    );
    assert!(init.client(&["resume"]).status.success());
    assert_eq!(init.status()["phase"], "running");

    init.signal(Signal::SIGTERM);
    let deadline = {
        init.wait_event(Duration::from_secs(10), "shutdown:");
        init.events().deadline()
    };
    let asked = slow::now_unix();
    let s = init.status();
    assert_eq!(s["phase"], "stopping", "{s}");
    let shown = s["deadline_unix"].as_f64().expect("a deadline");
    assert!(
        (shown - deadline).abs() < 0.5,
        "status deadline {shown} vs logged {deadline}"
    );
    let left = s["seconds_left"].as_f64().expect("seconds left");
    assert!(left > 0.0 && left <= BUDGET.grace, "{s}");
    assert!(
        (left - (deadline - asked)).abs() < 1.0,
        "seconds_left {left} vs {}",
        deadline - asked
    );

    let resume = init.client(&["resume"]);
    assert_eq!(resume.status.code(), Some(1));
    assert!(
        text(&resume.stderr).contains("cannot resume: the init is stopping"),
        "{}",
        text(&resume.stderr)
    );
    assert_eq!(init.status()["phase"], "stopping");

    // A second stop signal ends it: the fake terraform stops gracefully at once.
    init.signal(Signal::SIGTERM);
    assert_eq!(init.wait(Duration::from_secs(30)), 7, "{}", init.log_tail());
}
