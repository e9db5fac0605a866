//! TFINIT_MAX_RUNS end to end, with the real terraform 1.0.3 in both shapes (panicwrap and
//! TF_FORK=0) against tfinit as PID 1 of a PID namespace: runs over the cap wait in the state
//! `queued` (status, metrics, one info line each), start in arrival order as terraform processes
//! are reaped, never more than the cap at once; read-only commands never wait; a queued run ends
//! without terraform ever starting when its shim leaves, when `tfinit cancel` names it (75), and
//! on `tfinit drain` (75). (A cap of 0 is refused at start: tests/config_errors.rs.)

#[macro_use]
mod common;
#[path = "fixtures/slow/mod.rs"]
mod slow;

use std::collections::BTreeSet;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use slow::{Budget, Shape, SlowInit, Workdir};

const BUDGET: Budget = Budget {
    grace: 20.0,
    stop: 5.0,
    margin: 1.0,
};

/// The shim's exit code when the init refuses to start terraform (EX_TEMPFAIL).
const EXIT_REFUSED: i32 = 75;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Starts the init with TFINIT_MAX_RUNS=`max` in `work`'s temp dir; its controller waits for
/// SIGTERM and exits 0.
fn start(work: &Workdir, shape: Shape, max: usize) -> SlowInit {
    let tf_dir = slow::terraform().parent().unwrap().to_path_buf();
    let env = vec![("TFINIT_MAX_RUNS", max.to_string())];
    SlowInit::with_waiting_controller(&work.tmp, &work.dir, tf_dir, shape, BUDGET, env)
}

/// Starts `terraform ARGS` through the shim in `dir` (output collected at the end: small).
fn spawn_shim(init: &SlowInit, dir: &std::path::Path, args: &[String]) -> Child {
    init.shim_command(dir, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the shim")
}

/// The runs in `tfinit status`, as (id, state).
fn runs(init: &SlowInit) -> Vec<(String, String)> {
    let s = init.status();
    s["runs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["id"].as_str().unwrap_or("").to_string(),
                r["state"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// How many terraform runs have a live terraform process: the distinct process groups of the
/// real terraform's processes in the namespace (a panicwrap run has two processes in one group).
fn live_runs(init: &SlowInit) -> usize {
    let tf = std::fs::canonicalize(slow::terraform()).unwrap_or_else(|_| slow::terraform());
    let is_terraform = |pid: i32| {
        std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .as_deref()
            == Some(tf.as_path())
    };
    // A scan of /proc is not a snapshot: on a loaded machine it takes long enough for a run to
    // be reaped and the next one to start in it, and it would see both. So each terraform it
    // saw counts only if it is still there once the scan is over (a process that started during
    // the scan and is still there is counted, one that ended is not: never more than were live).
    init.processes()
        .iter()
        .filter(|p| p.exe.as_deref() == Some(tf.as_path()))
        .collect::<Vec<_>>()
        .into_iter()
        .filter(|p| is_terraform(p.pid))
        .map(|p| p.pgid)
        .collect::<BTreeSet<_>>()
        .len()
}

/// One value of `tfinit metrics`.
fn metric(init: &SlowInit, series: &str) -> Option<f64> {
    let out = init.client(&["metrics"]);
    text(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// 8 applies under TFINIT_MAX_RUNS=2, each in its own working directory, started one after the
/// other (each visible in `tfinit status` before the next): never more than 2 live terraform
/// runs (polled in /proc and in status while they run), the others `queued` in status and
/// metrics with one info line each naming the cap and the position; a `terraform version`
/// asked meanwhile is not queued; all 8 finish with exit 0, started in arrival order.
fn eight_applies_under_a_cap_of_two_never_exceed_two_and_start_in_arrival_order(shape: Shape) {
    if !slow::have_terraform() {
        return;
    }
    let works: Vec<Workdir> = (0..8).map(|i| Workdir::new(&format!("cap-{i}"))).collect();
    let mut init = start(&works[0], shape, 2);
    let mut max_live = 0;
    let mut max_running = 0;
    let mut observe = |init: &SlowInit| {
        let live = live_runs(init);
        let running = runs(init).iter().filter(|(_, s)| s == "running").count();
        max_live = max_live.max(live);
        max_running = max_running.max(running);
    };
    let mut shims = Vec::new();
    for (i, work) in works.iter().enumerate() {
        shims.push(spawn_shim(&init, &work.dir, &slow::apply(2)));
        let id = format!("r{}", i + 1);
        common::wait_for(
            Duration::from_secs(60),
            &format!("{id} in tfinit status"),
            || {
                observe(&init);
                runs(&init).iter().any(|(r, _)| *r == id).then_some(())
            },
        );
    }
    // Some wait now: they are queued, in status and in the metrics.
    let queued = runs(&init).iter().filter(|(_, s)| s == "queued").count();
    assert!(queued >= 4, "runs queued behind the cap: {:?}", runs(&init));
    assert!(
        metric(&init, "tfinit_runs{state=\"queued\"}").is_some_and(|n| n >= 1.0),
        "{}",
        text(&init.client(&["metrics"]).stdout)
    );

    // A read-only command under a full cap does not wait.
    let t0 = Instant::now();
    let version = init.shim(&works[0].dir, &["version".to_string()]);
    assert_eq!(version.status.code(), Some(0), "{}", text(&version.stderr));
    assert!(text(&version.stdout).contains("Terraform v1.0.3"));
    assert!(
        runs(&init).iter().any(|(_, s)| s == "queued"),
        "the queue was still there while `version` ran ({:?} after)",
        t0.elapsed()
    );

    // All finish, polled against a deadline; the cap holds throughout.
    let deadline = Instant::now() + Duration::from_secs(240);
    for (i, shim) in shims.iter_mut().enumerate() {
        loop {
            observe(&init);
            if shim.try_wait().expect("try_wait").is_some() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "apply {i} still runs; {}",
                init.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    for (i, shim) in shims.into_iter().enumerate() {
        let out = shim.wait_with_output().expect("shim output");
        assert_eq!(
            out.status.code(),
            Some(0),
            "apply {i}: {}",
            text(&out.stderr)
        );
        assert!(text(&out.stdout).contains("Apply complete!"), "apply {i}");
    }
    // The init's own account, in the order its one loop thread did things: never more than 2
    // applies between their start and their reaping.
    let ev = init.events();
    let applies: BTreeSet<String> = ev
        .all("terraform started")
        .into_iter()
        .filter(|e| e.str("subcommand") == Some("apply"))
        .filter_map(|e| e.str("run").map(str::to_string))
        .collect();
    let (mut live, mut most) = (0i32, 0i32);
    for e in &ev.0 {
        let Some(run) = e.str("run").filter(|r| applies.contains(*r)) else {
            continue;
        };
        match e.message() {
            "terraform started" => live += 1,
            "terraform exited" => live -= 1,
            _ => continue,
        }
        most = most.max(live);
        assert!(
            live <= 2,
            "{run}: {live} applies live at once; log:\n{}",
            ev.dump()
        );
    }
    assert_eq!(most, 2, "the cap was used: the test proves something");
    assert!(
        max_live <= 2,
        "{max_live} terraform runs were live at once (in /proc)"
    );
    assert!(max_running <= 2, "{max_running} runs were running at once");
    assert_eq!(max_live, 2, "the cap was used: the test proves something");
    for work in &works {
        assert_eq!(
            work.state(),
            [
                "null_resource.after[0]",
                "null_resource.after[1]",
                "null_resource.slow"
            ]
        );
    }

    let started: Vec<String> = ev
        .all("terraform started")
        .into_iter()
        .filter(|e| e.str("subcommand") == Some("apply"))
        .map(|e| e.str("run").unwrap_or("").to_string())
        .collect();
    let arrival: Vec<String> = (1..=8).map(|i| format!("r{i}")).collect();
    assert_eq!(started, arrival, "start order; log:\n{}", ev.dump());
    let queued_lines = ev.all("terraform run queued");
    assert!(queued_lines.len() >= 4, "{}", ev.dump());
    for e in &queued_lines {
        assert_eq!(e.level(), "INFO");
        assert_eq!(e.num("max_runs"), Some(2.0), "{}", e.v);
        assert!(e.num("position").is_some_and(|p| p >= 1.0), "{}", e.v);
        assert!(e.message().contains("TFINIT_MAX_RUNS=2"), "{}", e.v);
    }
    assert!(
        ev.all("terraform started")
            .iter()
            .any(|e| e.str("subcommand") == Some("version")),
        "version ran"
    );

    init.signal(Signal::SIGTERM);
    assert_eq!(init.wait(Duration::from_secs(30)), 0, "{}", init.log_tail());
}
both_shapes!(eight_applies_under_a_cap_of_two_never_exceed_two_and_start_in_arrival_order);

/// Under TFINIT_MAX_RUNS=1 with one apply in flight, later applies are `queued` and end without
/// terraform ever starting for them: one whose shim is killed is dropped, one `tfinit cancel`
/// names exits 75 saying it was cancelled, and `tfinit drain` refuses the last with 75; the
/// first goes on throughout.
fn queued_runs_end_without_starting_on_drain_on_cancel_and_when_their_shim_leaves(shape: Shape) {
    if !slow::have_terraform() {
        return;
    }
    let first = Workdir::new("cap-drain-1");
    let second = Workdir::new("cap-drain-2");
    let mut init = start(&first, shape, 1);
    let running = spawn_shim(&init, &first.dir, &slow::apply(120));
    common::wait_for(Duration::from_secs(60), "the first apply in flight", || {
        first.started().then_some(())
    });
    init.assert_shape(shape);
    let queued = spawn_shim(&init, &second.dir, &slow::apply(0));
    common::wait_for(Duration::from_secs(20), "r2 queued", || {
        runs(&init)
            .contains(&("r2".to_string(), "queued".to_string()))
            .then_some(())
    });

    // A queued run whose shim is killed (a reconcile timeout) is dropped.
    let mut leaving = spawn_shim(&init, &second.dir, &slow::apply(0));
    common::wait_for(Duration::from_secs(20), "r3 queued", || {
        runs(&init)
            .contains(&("r3".to_string(), "queued".to_string()))
            .then_some(())
    });
    leaving.kill().expect("kill the shim");
    let _ = leaving.wait();
    common::wait_for(Duration::from_secs(20), "r3 dropped", || {
        (!runs(&init).iter().any(|(id, _)| id == "r3")).then_some(())
    });
    // A queued run cancelled: its shim exits 75 and says so.
    let cancelled = spawn_shim(&init, &second.dir, &slow::apply(0));
    common::wait_for(Duration::from_secs(20), "r4 queued", || {
        runs(&init)
            .contains(&("r4".to_string(), "queued".to_string()))
            .then_some(())
    });
    let out = init.client(&["cancel", "r4"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("r4: ended before terraform started (it was queued)"),
        "{}",
        text(&out.stdout)
    );
    let out = cancelled.wait_with_output().expect("cancelled shim");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(EXIT_REFUSED), "{err}");
    assert!(
        err.contains("the run was cancelled (tfinit cancel) before terraform started"),
        "{err}"
    );

    let drained = init.client(&["drain"]);
    assert!(drained.status.success(), "{}", text(&drained.stderr));
    let mut queued = queued;
    common::wait_child(&mut queued, Duration::from_secs(20), "the queued shim");
    let out = queued.wait_with_output().expect("queued shim output");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(EXIT_REFUSED), "{err}");
    assert!(
        err.contains("draining") && err.contains("terraform was not started"),
        "{err}"
    );
    assert!(!second.started(), "the queued apply ran");
    assert_eq!(second.state(), Vec::<String>::new());
    let ev = init.events();
    assert_eq!(ev.all("terraform started").len(), 1, "{}", ev.dump());
    let refused = ev.all("terraform run refused before it started");
    let refused: Vec<(&str, &str)> = refused
        .iter()
        .map(|e| (e.str("run").unwrap_or(""), e.str("state").unwrap_or("")))
        .collect();
    assert_eq!(
        refused,
        [("r4", "queued"), ("r2", "queued")],
        "{}",
        ev.dump()
    );
    assert_eq!(
        runs(&init),
        [("r1".to_string(), "running".to_string())],
        "the run in flight goes on"
    );

    // Clean up as an operator would: two stop signals stop the first apply gracefully at once.
    init.signal(Signal::SIGTERM);
    init.wait_event(Duration::from_secs(10), "shutdown:");
    init.signal(Signal::SIGTERM);
    assert_eq!(init.wait(Duration::from_secs(60)), 0, "{}", init.log_tail());
    drop(running);
    assert!(
        !first.lock_info().exists(),
        "the first apply released its lock"
    );
}
both_shapes!(queued_runs_end_without_starting_on_drain_on_cancel_and_when_their_shim_leaves);
