//! The shutdown timeline end to end: tfinit as PID 1 of a PID namespace, a provider-terraform
//! stand-in that runs a slow `terraform apply` (local-exec sleep) through the shim and SIGKILLs it
//! on SIGTERM, and the container's stop signal sent to PID 1 from outside.
//!
//! Deadline = first stop signal (or the controller's exit) + TFINIT_GRACE_PERIOD; runs get one
//! SIGTERM at deadline - TFINIT_STOP_TIMEOUT and SIGKILL to their group at deadline -
//! TFINIT_KILL_MARGIN; the init exits as soon as nothing is left, with the controller's code.
//!
//! Times are read from the init's JSON log (its timestamps), never measured with sleeps. Bounds
//! are generous: "not before its time" allows [`SLACK`], "right after" allows [`PROMPT`] (the
//! linger of leftover pipes is 2 s, so a run's leftovers holding the init would fail it).
//! Real-terraform tests run in both shapes of terraform 1.0.3: panicwrap (default) and one process
//! (TF_FORK=0); the graceful-stop ones (`all_shapes!`) also on the modern terraform
//! (tests/common/terraform.rs), one process as users run it today.
//! From the inside we check what must not happen: terraform never sees a second interrupt, the
//! controller's group signal never reaches it, and the provider plugin never gets SIGTERM/SIGINT.

#[macro_use]
mod common;
#[path = "fixtures/slow/mod.rs"]
mod slow;

use std::time::Duration;

use nix::sys::signal::Signal;

use slow::{Budget, Events, Shape, SlowInit, Spec, Workdir};

/// How early a timed step may seem to be logged: the deadline is computed from the log line that
/// began the timeline, whose timestamp is taken a little after the deadline was set (more under
/// load), so a step can appear that much early. The steps themselves are never early.
const SLACK: f64 = 0.25;
/// "Right after": the most the init may take to exit once the last process is gone.
const PROMPT: f64 = 1.0;
/// The exit code of the controller stand-in after SIGTERM.
const CONTROLLER_CODE: u8 = 7;

/// Starts the controller stand-in running the slow apply (`sleep` seconds) with the real terraform.
fn start_real(work: &Workdir, shape: Shape, budget: Budget, sleep: u32) -> SlowInit {
    let log = work.tmp.join("controller.log");
    SlowInit::start(
        &work.tmp,
        Spec {
            cwd: &work.dir,
            terraform_dir: work.terraform_dir.clone(),
            shape,
            budget,
            env: vec![],
            main: slow::controller(CONTROLLER_CODE, &log, &slow::apply(sleep)),
        },
    )
}

/// Starts the controller stand-in running an apply of the fake terraform that ignores SIGTERM
/// (logging to `tf_log`, sleeping two minutes), and waits until the fake has started.
fn start_ignoring_sigterm(
    tmp: &common::TempDir,
    tf_log: &std::path::Path,
    budget: Budget,
) -> SlowInit {
    SlowInit::with_fake_apply(tmp, tf_log, budget, "ignore", CONTROLLER_CODE)
}

/// Waits until the apply is in flight (its local-exec started) and checks the shape.
fn wait_in_flight(init: &SlowInit, work: &Workdir, shape: Shape) {
    common::wait_for(
        Duration::from_secs(60),
        "the slow local-exec to start (slow.started)",
        || work.started().then_some(()),
    );
    init.assert_shape(shape);
}

/// Asserts terraform saw at most one interrupt: the output never says "Two interrupts received".
fn assert_one_interrupt_at_most(init: &SlowInit) {
    let all = init.all_output();
    assert!(
        !all.contains("Two interrupts received"),
        "terraform got a second interrupt:\n{}",
        init.log_tail()
    );
}

/// Asserts that the run's "Interrupt received" comes only after the init's one SIGTERM to it:
/// the stop signal forwarded to the controller's group at step 1 did not reach terraform.
fn assert_interrupt_only_after(ev: &Events, sigterm_ts: f64) {
    let lines = ev.output_lines();
    let interrupts: Vec<_> = lines
        .iter()
        .filter(|(_, l)| l.contains("Interrupt received"))
        .collect();
    assert_eq!(
        interrupts.len(),
        1,
        "terraform reports exactly one interrupt; output:\n{}",
        ev.output()
    );
    assert!(
        interrupts[0].0 >= sigterm_ts,
        "terraform was interrupted before the init's SIGTERM (at {sigterm_ts}): {interrupts:?}"
    );
}

/// Asserts the signal and transition events carry what an operator needs (the list):
/// phase and seconds left everywhere, plus run id, pid, cwd and subcommand for a run's signals.
fn assert_logged_with_context(ev: &Events, work_dir: &std::path::Path) {
    let forwarded: Vec<_> = ev
        .all("signal forwarded")
        .into_iter()
        .filter(|e| e.str("signal") == Some("SIGTERM"))
        .collect();
    assert!(
        !forwarded.is_empty(),
        "the stop signal forwarded to the controller's group is logged; log:\n{}",
        ev.dump()
    );
    let mut checked = forwarded;
    for msg in [
        "shutdown:",
        "asking terraform runs to stop gracefully",
        "SIGKILL to everything left",
        "SIGTERM to terraform",
        "SIGKILL to terraform's process group",
        LEFTOVERS,
        "signalled",
    ] {
        checked.extend(ev.all(msg));
    }
    for e in &checked {
        assert_eq!(e.level(), "INFO", "logged at info: {}", e.v);
        assert_eq!(e.str("phase"), Some("stopping"), "phase in {}", e.v);
        assert!(e.num("seconds_left").is_some(), "seconds_left in {}", e.v);
    }
    for msg in [
        "SIGTERM to terraform",
        "SIGKILL to terraform's process group",
    ] {
        for e in ev.all(msg) {
            assert_eq!(e.str("run"), Some("r1"), "run id in {}", e.v);
            assert!(e.num("pid").is_some_and(|p| p > 1.0), "pid in {}", e.v);
            assert_eq!(e.str("subcommand"), Some("apply"), "subcommand in {}", e.v);
            assert_eq!(
                e.str("cwd"),
                Some(work_dir.to_str().unwrap()),
                "cwd in {}",
                e.v
            );
        }
    }
}

/// Asserts nothing was SIGKILLed while terraform ran: no kill step, no SIGKILL to a run's group.
/// (Once terraform has exited while stopping, the init SIGKILLs what it left in its group, such
/// as a local-exec's orphaned `sleep`, so that the init need not wait for it.)
fn no_sigkill_while_terraform_runs(ev: &Events) {
    let exited = ev.first("terraform exited").map_or(f64::INFINITY, |e| e.ts);
    let kills: Vec<_> =
        ev.0.iter()
            .filter(|e| {
                !e.has("stream")
                    && (e.message().starts_with("SIGKILL") || e.str("signal") == Some("SIGKILL"))
            })
            .filter(|e| !(e.message().starts_with(LEFTOVERS) && e.ts >= exited))
            .map(|e| e.v.to_string())
            .collect();
    assert!(
        kills.is_empty(),
        "nothing may be SIGKILLed here: {kills:#?}"
    );
}

/// The event of the SIGKILL to what an exited terraform left in its group while stopping.
const LEFTOVERS: &str = "SIGKILL to what terraform left";

// ----- grace long enough -----

/// SIGTERM mid-apply with a grace period longer than the apply: the controller stops (and kills
/// its shim), the abandoned apply runs to its end untouched, the state holds every resource, and
/// the init exits right after terraform, with the controller's exit code.
fn sigterm_mid_apply_with_enough_grace_lets_the_apply_finish_then_exits_with_the_controllers_code(
    shape: Shape,
) {
    if !slow::have_terraform() {
        return;
    }
    let work = Workdir::new("grace-enough");
    let budget = Budget {
        grace: 40.0,
        stop: 10.0,
        margin: 2.0,
    };
    let mut init = start_real(&work, shape, budget, 4);
    wait_in_flight(&init, &work, shape);
    init.signal(Signal::SIGTERM);
    let code = init.wait(Duration::from_secs(60));
    let ev = init.events();

    assert_eq!(
        code,
        i32::from(CONTROLLER_CODE),
        "the init exits with the controller's code; log:\n{}",
        init.log_tail()
    );
    let ctl = common::read(&work.tmp.join("controller.log"));
    assert!(
        ctl.contains("term") && ctl.contains("killed-child"),
        "the controller stopped and SIGKILLed its shim: {ctl}"
    );
    assert_eq!(
        work.state(),
        [
            "null_resource.after[0]",
            "null_resource.after[1]",
            "null_resource.slow"
        ],
        "the apply completed: every resource is in the state, none tainted"
    );
    assert!(!work.lock_info().exists(), "no lock is left");
    let exited = ev.one("terraform exited");
    assert_eq!(exited.str("exit"), Some("exit code 0"), "{}", ev.dump());
    assert!(ev.output().contains("Apply complete!"), "{}", ev.output());

    let gone = ev.one("tfinit exiting");
    assert!(
        gone.ts - exited.ts < PROMPT,
        "the init exits right after the last run ({:.3}s later)",
        gone.ts - exited.ts
    );
    // What must not happen: terraform is never signalled, nothing is killed, the graceful step
    // never comes (the init is gone long before it).
    assert!(ev.all("SIGTERM to terraform").is_empty(), "{}", ev.dump());
    assert!(ev.all("asking terraform runs").is_empty(), "{}", ev.dump());
    no_sigkill_while_terraform_runs(&ev);
    assert!(gone.ts < ev.deadline() - budget.stop);
    assert!(
        !init.all_output().contains("Interrupt received"),
        "the controller's stop signal reached terraform:\n{}",
        init.log_tail()
    );
    work.assert_provider_never_signalled();
}
both_shapes!(
    sigterm_mid_apply_with_enough_grace_lets_the_apply_finish_then_exits_with_the_controllers_code
);

// ----- grace too short -----

/// SIGTERM mid-apply with a grace period shorter than the apply: at deadline - stop timeout the
/// run gets its one SIGTERM, terraform reports the interrupt, stops, releases the lock and exits;
/// the init follows right after, long before the kill step.
fn sigterm_with_too_little_grace_stops_the_apply_gracefully_at_deadline_minus_stop_timeout(
    shape: Shape,
) {
    let Some(work) = Workdir::for_shape("grace-short", shape) else {
        return;
    };
    let budget = Budget {
        grace: 8.0,
        stop: 5.0,
        margin: 1.0,
    };
    let mut init = start_real(&work, shape, budget, 120);
    wait_in_flight(&init, &work, shape);
    init.signal(Signal::SIGTERM);
    let code = init.wait(Duration::from_secs(30));
    let ev = init.events();

    assert_eq!(code, i32::from(CONTROLLER_CODE), "{}", init.log_tail());
    let deadline = ev.deadline();
    let term = ev.one("SIGTERM to terraform");
    assert!(
        term.ts >= deadline - budget.stop - SLACK,
        "the graceful SIGTERM came {:.3}s before deadline - stop timeout",
        deadline - budget.stop - term.ts
    );
    assert!(term.ts < deadline - budget.margin, "{}", ev.dump());
    assert_interrupt_only_after(&ev, term.ts);
    assert_one_interrupt_at_most(&init);

    let exited = ev.one("terraform exited");
    assert_eq!(
        exited.str("exit"),
        Some("exit code 1"),
        "terraform stopped on its own after the interrupt; {}",
        ev.dump()
    );
    assert!(exited.ts >= term.ts);
    assert!(
        !work.lock_info().exists(),
        "terraform released the state lock (.terraform.tfstate.lock.info is gone)"
    );
    let state = work.state();
    assert!(
        !state.iter().any(|a| a.starts_with("null_resource.after")),
        "the apply was interrupted, not completed: {state:?}"
    );
    let gone = ev.one("tfinit exiting");
    assert!(
        gone.ts - exited.ts < PROMPT,
        "the init exits right after terraform ({:.3}s later), not after a linger or at a timer",
        gone.ts - exited.ts
    );
    assert!(gone.ts < deadline - budget.margin);
    no_sigkill_while_terraform_runs(&ev);
    work.assert_provider_never_signalled();
    assert_logged_with_context(&ev, &work.dir);
}
all_shapes!(
    sigterm_with_too_little_grace_stops_the_apply_gracefully_at_deadline_minus_stop_timeout
);

// ----- a run that ignores SIGTERM -----

/// A terraform that ignores SIGTERM (fake, FAKE_TF_ON_TERM=ignore) gets exactly one SIGTERM at
/// deadline - stop timeout, then SIGKILL to its group at deadline - kill margin, and the init is
/// gone before the deadline.
#[test]
fn a_run_that_ignores_sigterm_is_sigkilled_at_deadline_minus_margin_and_the_init_exits_before_the_deadline(
) {
    if !slow::have_root() {
        return;
    }
    let tmp = common::TempDir::new("ignore-term");
    let tf_log = tmp.join("fake-terraform.log");
    let budget = Budget {
        grace: 7.0,
        stop: 4.0,
        margin: 2.0,
    };
    let mut init = start_ignoring_sigterm(&tmp, &tf_log, budget);
    init.signal(Signal::SIGTERM);
    let code = init.wait(Duration::from_secs(30));
    let ev = init.events();

    assert_eq!(code, i32::from(CONTROLLER_CODE), "{}", init.log_tail());
    let deadline = ev.deadline();
    let term = ev.one("SIGTERM to terraform");
    assert!(term.ts >= deadline - budget.stop - SLACK, "{}", ev.dump());
    let kill = ev.one("SIGKILL to terraform's process group");
    assert!(
        kill.ts >= deadline - budget.margin - SLACK,
        "SIGKILL came {:.3}s before deadline - kill margin",
        deadline - budget.margin - kill.ts
    );
    assert!(kill.ts < deadline, "{}", ev.dump());
    let exited = ev.one("terraform exited");
    assert_eq!(exited.str("exit"), Some("killed by SIGKILL"));
    let gone = ev.one("tfinit exiting");
    assert!(
        gone.ts < deadline,
        "the init is gone {:.3}s after the deadline",
        gone.ts - deadline
    );
    assert!(gone.ts - kill.ts < PROMPT);
    assert!(
        !common::read(&tf_log).contains("done"),
        "fake terraform was not allowed to finish"
    );
    assert_logged_with_context(&ev, &tmp.0);
}

// ----- second and third signals -----

/// A second SIGTERM skips to the graceful step at once: the run gets its one SIGTERM right then,
/// not at deadline - stop timeout; terraform stops cleanly (one interrupt, no lock left).
fn a_second_sigterm_sends_the_graceful_stop_at_once(shape: Shape) {
    let Some(work) = Workdir::for_shape("second-signal", shape) else {
        return;
    };
    let budget = Budget {
        grace: 60.0,
        stop: 10.0,
        margin: 2.0,
    };
    let mut init = start_real(&work, shape, budget, 120);
    wait_in_flight(&init, &work, shape);
    init.signal(Signal::SIGTERM);
    init.wait_event(Duration::from_secs(10), "shutdown:");
    // The controller kills its shim: from then on terraform's output is in the init's log, with
    // times, so we can tell when terraform saw an interrupt.
    init.wait_event(Duration::from_secs(10), "the shim is gone");
    // Nothing happens to the run after the first signal...
    assert!(init.events().all("SIGTERM to terraform").is_empty());
    // ...but a new run is refused (step 2), with the documented code and a clear message.
    let refused = init.shim(&work.dir, &slow::apply(0));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(75), "{err}");
    assert!(
        err.contains("shutting down") && err.contains("terraform was not started"),
        "{err}"
    );
    assert_eq!(init.events().all("terraform started").len(), 1);
    init.signal(Signal::SIGTERM);
    let code = init.wait(Duration::from_secs(30));
    let ev = init.events();

    assert_eq!(code, i32::from(CONTROLLER_CODE), "{}", init.log_tail());
    let signals = ev.all("stop signal received");
    assert_eq!(signals.len(), 2, "{}", ev.dump());
    let term = ev.one("SIGTERM to terraform");
    assert!(
        term.ts >= signals[1].ts && term.ts - signals[1].ts < PROMPT,
        "...the second one sends the graceful SIGTERM at once ({:.3}s after it)",
        term.ts - signals[1].ts
    );
    assert!(term.ts < ev.deadline() - budget.stop - 10.0);
    assert_interrupt_only_after(&ev, term.ts);
    assert_one_interrupt_at_most(&init);
    assert_eq!(ev.one("terraform exited").str("exit"), Some("exit code 1"));
    assert!(!work.lock_info().exists(), "no lock is left");
    no_sigkill_while_terraform_runs(&ev);
    let gone = ev.one("tfinit exiting");
    assert!(gone.ts - ev.one("terraform exited").ts < PROMPT);
    work.assert_provider_never_signalled();
}
all_shapes!(a_second_sigterm_sends_the_graceful_stop_at_once);

/// A third stop signal (SIGINT here) skips to the kill step at once: a run that ignored its one
/// SIGTERM is SIGKILLed right then, and the init exits long before the deadline.
#[test]
fn a_third_stop_signal_sigkills_what_is_left_at_once() {
    if !slow::have_root() {
        return;
    }
    let tmp = common::TempDir::new("third-signal");
    let tf_log = tmp.join("fake-terraform.log");
    let budget = Budget {
        grace: 60.0,
        stop: 10.0,
        margin: 2.0,
    };
    let mut init = start_ignoring_sigterm(&tmp, &tf_log, budget);
    init.signal(Signal::SIGTERM);
    init.wait_event(Duration::from_secs(10), "shutdown:");
    init.signal(Signal::SIGTERM);
    init.wait_event(Duration::from_secs(10), "SIGTERM to terraform");
    // The second signal did not kill anything.
    no_sigkill_while_terraform_runs(&init.events());
    init.signal(Signal::SIGINT);
    let code = init.wait(Duration::from_secs(30));
    let ev = init.events();

    assert_eq!(code, i32::from(CONTROLLER_CODE), "{}", init.log_tail());
    let signals = ev.all("stop signal received");
    assert_eq!(signals.len(), 3, "{}", ev.dump());
    assert_eq!(signals[2].str("signal"), Some("SIGINT"));
    assert_eq!(
        ev.all("SIGTERM to terraform").len(),
        1,
        "the third signal does not send a second SIGTERM"
    );
    let kill = ev.one("SIGKILL to terraform's process group");
    assert!(
        kill.ts >= signals[2].ts && kill.ts - signals[2].ts < PROMPT,
        "SIGKILL at once after the third signal ({:.3}s)",
        kill.ts - signals[2].ts
    );
    assert_eq!(
        ev.one("terraform exited").str("exit"),
        Some("killed by SIGKILL")
    );
    let gone = ev.one("tfinit exiting");
    assert!(gone.ts < ev.deadline() - budget.stop, "{}", ev.dump());
}

// ----- the controller crashes -----

/// The controller dying on its own mid-apply starts the same timeline from that moment: its shim
/// (still attached) is left alone, the run gets its one SIGTERM at deadline - stop timeout, and
/// the init exits with 128+9 (the controller died of SIGKILL).
fn a_controller_crash_mid_apply_starts_the_timeline_and_the_init_exits_with_128_plus_the_signal(
    shape: Shape,
) {
    if !slow::have_terraform() {
        return;
    }
    let work = Workdir::new("controller-crash");
    let budget = Budget {
        grace: 8.0,
        stop: 5.0,
        margin: 1.0,
    };
    let mut init = start_real(&work, shape, budget, 120);
    wait_in_flight(&init, &work, shape);
    let helper = std::fs::canonicalize(common::helper()).unwrap();
    let controller = init
        .processes()
        .into_iter()
        .find(|p| p.exe.as_deref() == Some(helper.as_path()) && p.cmdline.contains(" controller "))
        .expect("the controller stand-in runs");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(controller.pid), Signal::SIGKILL)
        .expect("SIGKILL the controller");
    let code = init.wait(Duration::from_secs(30));
    let ev = init.events();

    assert_eq!(code, 128 + 9, "{}", init.log_tail());
    let began = ev.one("shutdown:");
    assert_eq!(began.str("cause"), Some("controller exited"));
    let crashed = ev.one("controller exited");
    assert!(began.ts - crashed.ts < PROMPT);
    assert!(ev.all("stop signal received").is_empty());
    let deadline = ev.deadline();
    let term = ev.one("SIGTERM to terraform");
    assert!(term.ts >= deadline - budget.stop - SLACK, "{}", ev.dump());
    // The shim stayed attached: terraform's output reached the container's stdout through it,
    // with one interrupt.
    let out = init.all_output();
    assert_eq!(
        out.matches("Interrupt received").count(),
        1,
        "{}",
        init.log_tail()
    );
    assert_one_interrupt_at_most(&init);
    let exited = ev.one("terraform exited");
    assert_eq!(exited.str("exit"), Some("exit code 1"));
    assert_eq!(exited.v["attached"], serde_json::Value::Bool(true));
    assert!(!work.lock_info().exists(), "no lock is left");
    let gone = ev.one("tfinit exiting");
    assert!(gone.ts - exited.ts < PROMPT, "{}", ev.dump());
    no_sigkill_while_terraform_runs(&ev);
    work.assert_provider_never_signalled();
}
both_shapes!(
    a_controller_crash_mid_apply_starts_the_timeline_and_the_init_exits_with_128_plus_the_signal
);

// ----- the budget must fit -----

/// TFINIT_STOP_TIMEOUT + TFINIT_KILL_MARGIN equal to TFINIT_GRACE_PERIOD (not smaller) stops the
/// init at start with exit code 2 and a message naming the three values; the controller never runs.
#[test]
fn a_budget_that_does_not_fit_the_grace_period_stops_the_init_at_start_with_exit_2() {
    let tmp = common::TempDir::new("budget");
    let marker = tmp.join("controller-ran");
    let out = common::run_output(
        common::scrub(&mut std::process::Command::new(common::tfinit()))
            .args(["--", "sh", "-c", "touch \"$0\""])
            .arg(&marker)
            .env("TFINIT_RUN_DIR", tmp.join("run"))
            .env("TFINIT_STATE_DIR", tmp.join("state"))
            .env("TFINIT_GRACE_PERIOD", "10s")
            .env("TFINIT_STOP_TIMEOUT", "9s")
            .env("TFINIT_KILL_MARGIN", "1s"),
        Duration::from_secs(20),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for needle in [
        "TFINIT_STOP_TIMEOUT (9s)",
        "TFINIT_KILL_MARGIN (1s)",
        "TFINIT_GRACE_PERIOD (10s)",
    ] {
        assert!(err.contains(needle), "{needle:?} missing from: {err}");
    }
    assert!(!marker.exists(), "the controller must not start");
}
