//! `tfinit status`: each run with its pid, cwd and redacted argv; a clear error without an init.
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

use std::process::Command;
use std::time::SystemTime;

use nix::sys::signal::Signal;
use serde_json::Value;

use common::shim::*;
use common::{wait_for, TempDir};

#[test]
fn status_lists_each_run_with_its_pid_cwd_and_redacted_argv() {
    if !fake_available() {
        return;
    }
    let (tmp, init, tf) = fake_setup("shim-status", &[]);
    let t0 = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let dirs = [tmp.join("a"), tmp.join("b")];
    let logs = [tmp.join("a.log"), tmp.join("b.log")];
    let argvs: [&[&str]; 2] = [
        &[
            "apply",
            "-var",
            "password=hunter2",
            "-var-file=secret.tfvars",
            "-backend-config=access_key=AKIASECRET",
            "-auto-approve",
        ],
        &["plan", "-input=false"],
    ];
    let mut runs = Vec::new();
    for i in 0..2 {
        std::fs::create_dir_all(&dirs[i]).unwrap();
        let mut cmd = tf.shim(&dirs[i], argvs[i]);
        cmd.env("FAKE_TF_LOG", &logs[i])
            .env("FAKE_TF_SLEEP_MS", "120000")
            .env("FAKE_TF_ON_TERM", "graceful")
            .env("FAKE_TF_STOP_MS", "120000");
        runs.push(Running::start(cmd, false));
        fake_started(&logs[i]);
    }
    let (pid_a, pgid_a) = fake_started(&logs[0]);

    // From inside the namespace, as an operator would (kubectl exec).
    let mut cmd = common::nsenter(init.pid);
    cmd.arg(common::tfinit())
        .arg("status")
        .env("TFINIT_RUN_DIR", &init.run_dir);
    let o = run(cmd, None, SHORT);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let raw = text(&o.stdout);
    let st: Value = serde_json::from_str(&raw).expect("status is JSON");
    assert_eq!(st["v"], 1);
    assert_eq!(st["pid"], 1, "the init's pid in its namespace");
    assert_eq!(st["phase"], "running");
    assert!(st["main_pid"].as_i64().is_some_and(|p| p > 1));
    let list = st["runs"].as_array().unwrap();
    assert_eq!(list.len(), 2, "{raw}");
    let a = list
        .iter()
        .find(|r| r["subcommand"] == "apply")
        .expect("the apply run");
    assert!(a["id"].as_str().is_some_and(|s| s.starts_with('r')));
    assert_eq!(a["pid"], pid_a);
    assert_eq!(a["pgid"], pgid_a);
    assert_eq!(pid_a, pgid_a, "terraform leads its own process group");
    assert_eq!(a["cwd"], dirs[0].display().to_string());
    assert_eq!(
        a["argv"],
        serde_json::json!([
            "apply",
            "-var",
            "<redacted>",
            "-var-file=<redacted>",
            "-backend-config=<redacted>",
            "-auto-approve"
        ])
    );
    let started = a["started_unix"].as_f64().unwrap();
    assert!(
        started >= t0 - 1.0 && started <= t0 + 60.0,
        "{started} vs {t0}"
    );
    assert_eq!(a["attached"], true);
    assert_eq!(a["stop_requested"], false);
    for secret in ["hunter2", "AKIASECRET", "secret.tfvars"] {
        assert!(!raw.contains(secret), "{secret} in {raw}");
    }
    let b = list.iter().find(|r| r["subcommand"] == "plan").unwrap();
    assert_eq!(b["cwd"], dirs[1].display().to_string());
    assert_eq!(b["argv"], serde_json::json!(["plan", "-input=false"]));

    // Abandoned: no longer attached, asked to stop.
    runs[0].signal(Signal::SIGKILL);
    wait_for(SHORT, "the apply run to show as detached", || {
        let st = init.try_status()?;
        let a = st["runs"]
            .as_array()?
            .iter()
            .find(|r| r["subcommand"] == "apply")?
            .clone();
        (a["attached"] == false && a["stop_requested"] == true).then_some(())
    });
    // The namespace first (both fakes die with it), then the shims and the temp dir.
    drop(init);
    drop(runs);
}

#[test]
fn status_without_an_init_fails_with_a_clear_error() {
    let tmp = TempDir::new("shim-status-none");
    let mut cmd = Command::new(common::tfinit());
    common::scrub(&mut cmd)
        .arg("status")
        .env("TFINIT_RUN_DIR", tmp.join("none"));
    let o = run(cmd, None, SHORT);
    assert_eq!(o.status.code(), Some(3));
    assert!(o.stdout.is_empty());
    let err = text(&o.stderr);
    assert!(
        err.contains("no tfinit init answers on")
            && err.contains(
                &tfinit::config::socket_path(&tmp.join("none"))
                    .display()
                    .to_string()
            ),
        "{err}"
    );
}
