//! The shim keeps the caller's work alive: terraform runs as the init's child (stdin, its own
//! process group), so a SIGKILL of the shim or its controller does not kill an apply, an
//! abandoned run is stopped gracefully, and a shim without an init runs terraform directly.
//!
//! The terraform shim end to end. tfinit runs as PID 1 of a PID namespace (`common::launch`); a
//! `terraform` symlink to tfinit comes first on PATH, and the real terraform 1.0.3 (.test-deps/bin)
//! or the helper's fake terraform comes after it. Shim runs are compared with direct runs of the
//! same terraform in the same environment: same stdout bytes, stderr bytes and exit code.
//!
//! The shims run in this test process, outside the PID namespace, and reach the init through its
//! socket (TFINIT_RUN_DIR): the test can then signal or SIGKILL a shim by its pid. The one test
//! about a controller killing its shim during shutdown runs the helper's `controller` (the
//! provider-terraform stand-in) as the init's child instead.
//!
//! Real-terraform tests run in both process shapes of terraform 1.0.3 (`both_shapes!`):
//! `NAME::panicwrap` (the default: a wrapper process and a wrapped child) and
//! `NAME::single_process_tf_fork_0` (TF_FORK=0). The harness is tests/common/shim.rs.

#[macro_use]
mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use common::shim::*;
use common::{wait_for, TempDir};

both_shapes!(sigkill_of_the_shim_during_shutdown_leaves_the_apply_running_to_completion);

/// The controller is SIGKILLing its shim because the container is stopping (the init forwarded
/// the SIGTERM to it): the init is in its shutdown phase, terraform keeps running and completes
/// within the grace period, its remaining output goes to the init's log.
fn sigkill_of_the_shim_during_shutdown_leaves_the_apply_running_to_completion(shape: Shape) {
    let Some((bin, plugin_dir)) = real_terraform() else {
        return;
    };
    let tmp = TempDir::new("shim-shutdown-kill");
    let work = fixture("slow", &tmp.join("work"));
    let shim_dir = common::shim_dir(&tmp);
    let tf = Tf::new(&tmp, &tmp.join("run"), &bin, &shape.env());
    init_workspace(&tf, &work, &plugin_dir);

    let controller_log = tmp.join("controller.log");
    let controller: Vec<String> = [
        common::helper().display().to_string(),
        "controller".into(),
        "--on-term".into(),
        "kill".into(),
        "--exit-code".into(),
        "0".into(),
        "--log".into(),
        controller_log.display().to_string(),
        "--".into(),
        "terraform".into(),
        "apply".into(),
        "-auto-approve".into(),
        "-no-color".into(),
        "-input=false".into(),
        "-var".into(),
        "sleep=4".into(),
    ]
    .into();
    let mut env = vec![
        ("PATH", common::path_with(&[&shim_dir, &bin])),
        ("TFINIT_GRACE_PERIOD", "90s".to_string()),
    ];
    env.extend(shape.env());
    let mut init = ShimInit::start(&tmp, &work, &env, Some(controller));

    // The shim relays the apply to the controller's stdout, which is the init's.
    wait_for(LONG, "the apply's provisioner to start", || {
        init.out.text().contains("Executing:").then_some(())
    });
    let t0 = Instant::now();
    init.signal(Signal::SIGTERM);
    wait_for(SHORT, "the controller to SIGKILL its shim", || {
        common::read(&controller_log)
            .contains("killed-child")
            .then_some(())
    });
    init.wait_log("the shim is gone; terraform keeps running", SHORT);

    // Stopping: a new run is refused, and nothing is started for it.
    let refused = run(tf.shim(&work, &["version"]), None, SHORT);
    assert_eq!(refused.status.code(), Some(75), "{}", text(&refused.stderr));
    assert!(text(&refused.stderr).contains("shutting down"));
    assert!(refused.stdout.is_empty());

    let code = init.wait_exit(LONG);
    let log = init.log();
    assert_eq!(code, 0, "the controller's exit code");
    assert!(
        t0.elapsed() < Duration::from_secs(70),
        "finished before the graceful step"
    );
    assert!(
        log_line(&log, "terraform exited run=r1").contains("exit=exit code 0"),
        "terraform completed by itself: {log}"
    );
    let gone_at = log.find("the shim is gone").unwrap();
    let complete_at = log
        .find("Apply complete! Resources: 1 added")
        .expect("the rest of the apply's output is in the init's log");
    assert!(gone_at < complete_at, "logged after the shim was gone");
    assert!(
        !init.out.text().contains("Apply complete!"),
        "the dead shim relayed nothing after its death"
    );
    for never in [
        "SIGTERM to terraform",
        "SIGKILL to terraform",
        "Interrupt received",
    ] {
        assert!(!log.contains(never), "{never:?} in the log:\n{log}");
    }
    assert_eq!(
        log.matches("terraform started").count(),
        1,
        "the refused run never started"
    );
    let st = state(&work);
    let a = instance(&st, "a").expect("null_resource.a in the state");
    assert!(a["attributes"]["id"]
        .as_str()
        .is_some_and(|s| !s.is_empty()));
    assert!(a.get("status").is_none(), "not tainted: {a}");
    assert!(!lock_info(&work).exists(), "the lock was released");
}

both_shapes!(an_abandoned_apply_stops_gracefully_with_consistent_state_and_no_lock);

/// The caller gave up on a run outside shutdown (a reconcile timeout): the shim is SIGKILLed, the
/// init sends terraform one SIGTERM, terraform stops gracefully, saves state and unlocks.
fn an_abandoned_apply_stops_gracefully_with_consistent_state_and_no_lock(shape: Shape) {
    let Some(SlowApply {
        tmp: _tmp,
        init,
        tf,
        work,
        apply,
    }) = slow_apply_through_the_shim(shape, "shim-abandoned")
    else {
        return;
    };
    assert!(lock_info(&work).exists(), "the apply holds the lock");
    wait_for(SHORT, "the provisioner's `sleep 30` to run", || {
        init.processes()
            .iter()
            .any(|(_, cmd)| cmd == "sleep 30")
            .then_some(())
    });
    apply.signal(Signal::SIGKILL);
    let shim = apply.wait(SHORT);
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&shim.status),
        Some(9)
    );

    init.wait_log("terraform exited run=r1", LONG);
    wait_for(SHORT, "the run to end", || {
        (init.run_count() == 0).then_some(())
    });
    let log = init.log();
    assert_eq!(log.matches("SIGTERM to terraform").count(), 1, "{log}");
    assert_eq!(
        log.matches("Interrupt received.").count(),
        1,
        "the apply reported the interrupt once (in the init's log: the shim is gone)\n{log}"
    );
    assert!(!log.contains("Two interrupts received"), "{log}");
    assert!(
        log_line(&log, "terraform exited run=r1").contains("exit=exit code 1"),
        "terraform stopped by itself: {log}"
    );
    assert!(
        !log.contains("SIGKILL to terraform's process group"),
        "it stopped within TFINIT_STOP_TIMEOUT: {log}"
    );
    let st = state(&work);
    let a = instance(&st, "a").expect("the interrupted resource is recorded");
    assert_eq!(a["status"], "tainted", "{a}");
    assert!(!lock_info(&work).exists(), "no lock info left");
    // And the lock itself is free: a plan that may not wait for it succeeds.
    let plan = run(
        tf.direct(
            &work,
            &["plan", "-no-color", "-input=false", "-lock-timeout=0s"],
        ),
        None,
        LONG,
    );
    assert_eq!(plan.status.code(), Some(0), "{}", text(&plan.stderr));

    // terraform's graceful stop SIGKILLs the provisioner's shell, orphaning its `sleep 30` in
    // terraform's process group: once terraform has stopped, that leftover is killed too.
    assert!(
        !init.processes().iter().any(|(_, cmd)| cmd == "sleep 30"),
        "the orphaned `sleep 30` is gone"
    );
    // Logged just after the kill, which the test may see first: waited for, not read at once.
    init.wait_log("SIGKILL to what terraform left in its process group", SHORT);
    init.stop();
}

both_shapes!(sixteen_concurrent_applies_in_separate_dirs_all_complete);

fn sixteen_concurrent_applies_in_separate_dirs_all_complete(shape: Shape) {
    let Some((bin, plugin_dir)) = real_terraform() else {
        return;
    };
    const N: usize = 16;
    let tmp = TempDir::new("shim-16");
    let init = ShimInit::start(&tmp, &tmp.0, &[], None);
    let tf = Tf::new(&tmp, &init.run_dir, &bin, &shape.env());
    let go = tmp.join("go");
    let dirs: Vec<PathBuf> = (0..N)
        .map(|i| fixture("barrier", &tmp.join(&format!("w{i}"))))
        .collect();
    let inits: Vec<Running> = dirs
        .iter()
        .map(|d| {
            Running::start(
                tf.shim(d, &["init", "-no-color", "-input=false", &plugin_dir]),
                false,
            )
        })
        .collect();
    for r in inits {
        let o = r.wait(LONG);
        assert!(o.status.success(), "init: {}", text(&o.stderr));
    }
    let go_var = format!("go={}", go.display());
    let applies: Vec<Running> = dirs
        .iter()
        .map(|d| {
            Running::start(
                tf.shim(
                    d,
                    &[
                        "apply",
                        "-auto-approve",
                        "-no-color",
                        "-input=false",
                        "-var",
                        &go_var,
                    ],
                ),
                false,
            )
        })
        .collect();
    // Every apply waits in its provisioner until `go` exists: all N are in flight at once.
    wait_for(LONG, "16 applies in flight at once", || {
        (init.run_count() == N && applies.iter().all(|a| a.out.text().contains("Executing:")))
            .then_some(())
    });
    std::fs::write(&go, b"").unwrap();
    for (r, d) in applies.into_iter().zip(&dirs) {
        let o = r.wait(LONG);
        assert_eq!(
            o.status.code(),
            Some(0),
            "apply in {}: {}",
            d.display(),
            text(&o.stderr)
        );
        assert!(text(&o.stdout).contains("Apply complete! Resources: 1 added"));
        let id = instance(&state(d), "a").unwrap()["attributes"]["id"].clone();
        assert!(
            text(&o.stdout).contains(&format!("id = {id}")),
            "its own id"
        );
    }
    init.stop();
}

#[test]
fn a_shim_without_an_init_warns_once_and_runs_terraform_directly() {
    if !fake_available() {
        return;
    }
    let tmp = TempDir::new("shim-fallback");
    let fake = common::fake_terraform_dir(&tmp);
    // No init: nothing listens in this run directory.
    let tf = Tf::new(&tmp, &tmp.join("no-init"), &fake, &[]);
    let log = tmp.join("fake.log");
    let with = |mut c: Command| {
        c.env("FAKE_TF_ECHO", "1")
            .env("FAKE_TF_EXIT", "3")
            .env("FAKE_TF_LOG", &log);
        c
    };
    let d = run(
        with(tf.direct(&tmp.0, &["plan", "-input=false"])),
        None,
        SHORT,
    );
    std::fs::remove_file(&log).unwrap();
    let r = Running::start(with(tf.shim(&tmp.0, &["plan", "-input=false"])), false);
    let shim_pid = r.pid().as_raw();
    let s = r.wait(SHORT);

    assert_eq!(s.status.code(), Some(3));
    assert_eq!(s.stdout, d.stdout);
    let stderr = text(&s.stderr);
    let (warning, rest) = stderr.split_once('\n').unwrap();
    assert!(
        warning.starts_with("tfinit: warning: no tfinit init answers on")
            && warning.contains("running")
            && warning.contains("directly"),
        "{warning}"
    );
    assert_eq!(
        rest.as_bytes(),
        d.stderr.as_slice(),
        "then terraform's own stderr, only"
    );
    // Directly: terraform replaced the shim (same pid), nobody in between.
    let (pid, _) = fake_started(&log);
    assert_eq!(pid, shim_pid);

    // The real terraform too, when it is there.
    if let Some((bin, _)) = real_terraform() {
        let tf = Tf::new(&tmp, &tmp.join("no-init"), &bin, &[]);
        let d = run(tf.direct(&tmp.0, &["version"]), None, LONG);
        let s = run(tf.shim(&tmp.0, &["version"]), None, LONG);
        assert_eq!(s.status.code(), Some(0));
        assert_eq!(text(&s.stdout), text(&d.stdout));
        assert_eq!(
            text(&s.stderr).lines().count(),
            1 + text(&d.stderr).lines().count()
        );
    }
}

#[test]
fn a_client_of_another_uid_is_refused_and_the_init_keeps_serving() {
    if !fake_available()
        || !common::require_root("a client of uid 4321 (setpriv)")
        || !common::require(
            Path::new("/usr/bin/setpriv").exists(),
            "setpriv (util-linux)",
        )
    {
        return;
    }
    let (tmp, init, tf) = fake_setup("shim-uid", &[]);
    // Let uid 4321 reach the socket (the init makes it 0700/0600): only the init's check is left.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&init.run_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        tfinit::config::socket_path(&init.run_dir),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    let log = tmp.join("fake.log");
    let mut cmd = Command::new("/usr/bin/setpriv");
    common::scrub(&mut cmd)
        .args(["--reuid", "4321", "--regid", "4321", "--clear-groups", "--"])
        .arg(&tf.shim)
        .args(["apply", "-auto-approve"])
        .current_dir(&tmp.0)
        .env("FAKE_TF_LOG", &log)
        .env("FAKE_TF_ECHO", "1");
    for (k, v) in &tf.env {
        cmd.env(k, v);
    }
    let s = run(cmd, None, SHORT);
    let stderr = text(&s.stderr);
    assert_eq!(s.status.code(), Some(125), "{stderr}");
    assert!(
        stderr.contains("refused") && stderr.contains("uid 4321"),
        "{stderr}"
    );
    assert!(!stderr.contains("directly"), "not the fallback: {stderr}");
    assert!(s.stdout.is_empty());
    assert!(!log.exists(), "terraform was not started");
    // The init answers the client first and logs after; its log comes through a pipe.
    init.wait_log("refused a client of another uid", SHORT);

    // The init still serves its own user.
    let mut cmd = tf.shim(&tmp.0, &["plan"]);
    cmd.env("FAKE_TF_ECHO", "1");
    let ok = run(cmd, None, SHORT);
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok.stderr));
    assert_eq!(text(&ok.stdout), "args: plan\n");
    init.stop();
}

#[test]
fn stdin_is_passed_to_terraform_which_runs_as_the_init_child_in_its_own_group() {
    if !fake_available() {
        return;
    }
    let (tmp, init, tf) = fake_setup("shim-stdin", &[]);
    let log = tmp.join("fake.log");
    let mut cmd = tf.shim(&tmp.0, &["console"]);
    cmd.env("FAKE_TF_STDIN", "1").env("FAKE_TF_LOG", &log);
    let mut r = Running::start(cmd, true);
    // While it waits for its input: a child of the init (PID 1), leading its own process group.
    let (pid, pgid) = fake_started(&log);
    assert_eq!(pid, pgid);
    let host = init.host_pid(pid).expect("the fake terraform's pid");
    let ppid = std::fs::read_to_string(format!("/proc/{host}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("PPid:").map(|v| v.trim().to_string()));
    assert_eq!(
        ppid,
        Some(init.pid.to_string()),
        "terraform's parent is the init"
    );
    let input: Vec<u8> = (0..200_000u32)
        .flat_map(|i| format!("{i}\n").into_bytes())
        .collect();
    r.stdin.take().unwrap().write_all(&input).unwrap();
    let o = r.wait(SHORT);
    assert_eq!(o.status.code(), Some(0));
    assert!(o.stdout == input, "stdin came back byte for byte");
    init.stop();
}
