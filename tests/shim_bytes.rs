//! The shim relays exactly: shim runs are compared with direct runs of the same terraform in the
//! same environment (same stdout bytes, stderr bytes and exit code), at any size and any reader
//! speed, with argv[0] and exit codes (128+N for death by signal N) passed through.
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

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use common::shim::*;
use common::{wait_for, TempDir};

both_shapes!(init_apply_output_plan_and_console_match_a_direct_run_byte_for_byte);

fn init_apply_output_plan_and_console_match_a_direct_run_byte_for_byte(shape: Shape) {
    let Some((bin, plugin_dir)) = real_terraform() else {
        return;
    };
    let tmp = TempDir::new("shim-bytes");
    let init = ShimInit::start(&tmp, &tmp.0, &[], None);
    let tf = Tf::new(&tmp, &init.run_dir, &bin, &shape.env());
    let direct = fixture("basic", &tmp.join("direct"));
    let shimmed = fixture("basic", &tmp.join("shim"));
    let both = |args: &[&str]| {
        let d = run(tf.direct(&direct, args), None, LONG);
        let s = run(tf.shim(&shimmed, args), None, LONG);
        (d, s)
    };

    let (d, s) = both(&["init", "-no-color", "-input=false", &plugin_dir]);
    assert_same_run("init", &d, &s);
    assert!(text(&s.stdout).contains("Terraform has been successfully initialized!"));

    // The null provider gives each resource a random id: mask each directory's own id (read from
    // its state) and the rounded durations, nothing else.
    let (d, s) = both(&["apply", "-auto-approve", "-no-color", "-input=false"]);
    assert_eq!(
        d.status.code(),
        Some(0),
        "direct apply: {}",
        text(&d.stderr)
    );
    let id_of = |dir: &Path| {
        instance(&state(dir), "a").expect("null_resource.a in the state")["attributes"]["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (id_d, id_s) = (id_of(&direct), id_of(&shimmed));
    let masked = |o: &Output, id: &str| {
        let t = text(&o.stdout);
        assert!(
            t.contains(&format!("[id={id}]")),
            "apply printed its id:\n{t}"
        );
        let mut m = o.clone();
        m.stdout = mask_durations(&t.replace(id, "<ID>")).into_bytes();
        m
    };
    assert_same_run("apply", &masked(&d, &id_d), &masked(&s, &id_s));
    assert!(!lock_info(&shimmed).exists(), "no lock left by the apply");

    // From here on both directories hold the same state, so the output must be identical.
    std::fs::copy(
        shimmed.join("terraform.tfstate"),
        direct.join("terraform.tfstate"),
    )
    .unwrap();
    let (d, s) = both(&["output", "-json"]);
    assert_same_run("output -json", &d, &s);
    let outputs: Value = serde_json::from_slice(&s.stdout).expect("output -json is JSON");
    assert_eq!(outputs["id"]["value"], Value::String(id_s.clone()));

    let (d, s) = both(&["plan", "-detailed-exitcode", "-no-color", "-input=false"]);
    assert_same_run("plan -detailed-exitcode, no changes", &d, &s);
    assert_eq!(s.status.code(), Some(0));

    let args = [
        "plan",
        "-detailed-exitcode",
        "-no-color",
        "-input=false",
        "-var",
        "generation=2",
    ];
    let (d, s) = both(&args);
    assert_same_run("plan -detailed-exitcode, changes", &d, &s);
    assert_eq!(s.status.code(), Some(2), "{}", text(&s.stderr));
    assert!(text(&s.stdout).contains("must be replaced"));

    let (d, s) = both(&["plan", "-no-color", "-input=false", "-var", "nope=1"]);
    assert_same_run("plan with an undeclared variable", &d, &s);
    assert_eq!(s.status.code(), Some(1));
    assert!(
        text(&s.stderr).contains("undeclared variable"),
        "{}",
        text(&s.stderr)
    );

    // stdin is the caller's: console reads an expression from it.
    let input = b"null_resource.a.id\n".as_slice();
    let d = run(tf.direct(&direct, &["console"]), Some(input), LONG);
    let s = run(tf.shim(&shimmed, &["console"]), Some(input), LONG);
    assert_same_run("console", &d, &s);
    assert_eq!(text(&s.stdout), format!("\"{id_s}\"\n"));

    let log = init.log();
    assert_eq!(log.matches("terraform started").count(), 7, "{log}");
    init.stop();
}

both_shapes!(a_plan_and_a_show_json_of_several_megabytes_arrive_complete_and_identical);

fn a_plan_and_a_show_json_of_several_megabytes_arrive_complete_and_identical(shape: Shape) {
    let Some((bin, plugin_dir)) = real_terraform() else {
        return;
    };
    let tmp = TempDir::new("shim-big");
    let init = ShimInit::start(&tmp, &tmp.0, &[], None);
    let tf = Tf::new(&tmp, &init.run_dir, &bin, &shape.env());
    let direct = fixture("big", &tmp.join("direct"));
    let shimmed = fixture("big", &tmp.join("shim"));
    for dir in [&direct, &shimmed] {
        let o = run(
            tf.direct(dir, &["init", "-no-color", "-input=false", &plugin_dir]),
            None,
            LONG,
        );
        assert!(o.status.success(), "init: {}", text(&o.stderr));
    }
    let plan = ["plan", "-no-color", "-input=false", "-out=plan.bin"];
    let d = run(tf.direct(&direct, &plan), None, LONG);
    let s = run(tf.shim(&shimmed, &plan), None, LONG);
    assert_same_run("plan of 1000 resources", &d, &s);
    assert!(
        s.stdout.len() > 2_000_000,
        "plan is {} bytes",
        s.stdout.len()
    );

    let show = ["show", "-json", "plan.bin"];
    let d = run(tf.direct(&shimmed, &show), None, LONG);
    let s = run(tf.shim(&shimmed, &show), None, LONG);
    assert_same_run("show -json of that plan", &d, &s);
    assert!(
        s.stdout.len() > 4_000_000,
        "show -json is {} bytes",
        s.stdout.len()
    );
    let doc: Value = serde_json::from_slice(&s.stdout).expect("show -json is one JSON document");
    assert_eq!(doc["resource_changes"].as_array().map(Vec::len), Some(1000));
    init.stop();
}

#[test]
fn fifty_megabytes_of_output_arrive_complete_and_identical() {
    if !fake_available() {
        return;
    }
    let (tmp, init, tf) = fake_setup("shim-50mb", &[]);
    const N: usize = 50 << 20;
    let peak_before = init.peak_rss_kib();
    let mut cmd = tf.shim(&tmp.0, &["show", "-json"]);
    cmd.env("FAKE_TF_OUT_BYTES", N.to_string())
        .env("FAKE_TF_ECHO", "1");
    let s = run(cmd, None, LONG);
    // The relay buffers about the high-water mark (1 MiB) per shim, not a stream's worth.
    let grown = init.peak_rss_kib() - peak_before;
    assert!(grown < 4096, "the init's peak RSS grew by {grown} KiB");
    let mut cmd = tf.direct(&tmp.0, &["show", "-json"]);
    cmd.env("FAKE_TF_OUT_BYTES", N.to_string())
        .env("FAKE_TF_ECHO", "1");
    let d = run(cmd, None, LONG);
    assert_eq!(s.stdout.len(), N + "args: show -json\n".len());
    assert!(s.stdout[..N].iter().all(|&b| b == b'x'));
    assert_same_run("50 MB of stdout", &d, &s);
    init.stop();
}

#[test]
fn a_reader_slower_than_terraform_gets_every_byte_even_long_after_terraform_exited() {
    if !fake_available() {
        return;
    }
    let (tmp, init, tf) = fake_setup("shim-slow-reader", &[]);
    const N: usize = 4 << 20;
    let mut cmd = tf.shim(&tmp.0, &["show", "-json"]);
    cmd.env("FAKE_TF_OUT_BYTES", N.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().unwrap();
    let mut out = child.stdout.take().unwrap();
    // A caller that reads 32 KiB every 100 ms: terraform finishes writing and exits while the
    // last megabytes still wait in the init's pipe and queue, for longer than the init waits for
    // the pipes of an exited terraform to end (2 s) before it closes them.
    let mut got = Vec::with_capacity(N);
    let mut buf = vec![0u8; 32 << 10];
    let mut exited_seen: Option<Instant> = None;
    let reading = Instant::now();
    loop {
        assert!(
            reading.elapsed() < LONG,
            "the shim's output did not end within {LONG:?} ({} of {N} bytes read)",
            got.len()
        );
        let n = out.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        if exited_seen.is_none() && init.log().contains("terraform exited run=r1") {
            exited_seen = Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let st = common::wait_child(&mut child, SHORT, "the shim");
    let lag = exited_seen
        .expect("terraform exited while the caller read")
        .elapsed();
    assert!(
        lag > Duration::from_secs(3),
        "precondition: the caller was still reading well after terraform exited ({lag:?})"
    );
    assert_eq!(st.code(), Some(0));
    assert_eq!(got.len(), N, "every byte arrived");
    assert!(got.iter().all(|&b| b == b'x'));
    init.stop();
}

#[test]
fn argv0_reaches_terraform_as_the_shim_was_invoked_terraform_or_tofu() {
    if !fake_available() {
        return;
    }
    let (tmp, init, tf) = fake_setup("shim-argv0", &[]);
    // tofu: a shim named tofu first on PATH, a fake named tofu after it.
    let tofu_shim = tmp.join("tofu-shim");
    let tofu_fake = tmp.join("tofu-fake");
    for (d, target) in [
        (&tofu_shim, common::tfinit()),
        (&tofu_fake, common::helper()),
    ] {
        std::fs::create_dir_all(d).unwrap();
        std::os::unix::fs::symlink(target, d.join("tofu")).unwrap();
    }
    let log = tmp.join("fake.log");
    let cases: Vec<(&str, Command, &str)> = vec![
        ("by name", tf.shim(&tmp.0, &["plan"]), "terraform"),
        (
            "by path",
            {
                let mut c = Command::new(&tf.shim);
                common::scrub(&mut c).arg("plan");
                c
            },
            tf.shim.to_str().unwrap(),
        ),
        (
            "tfinit terraform --",
            {
                let mut c = Command::new(common::tfinit());
                common::scrub(&mut c).args(["terraform", "--", "plan"]);
                c
            },
            "terraform",
        ),
        (
            "tofu",
            {
                let mut c = Command::new(tofu_shim.join("tofu"));
                common::scrub(&mut c).arg0("tofu").arg("plan");
                c
            },
            "tofu",
        ),
    ];
    for (what, mut cmd, argv0) in cases {
        let _ = std::fs::remove_file(&log);
        cmd.current_dir(&tmp.0)
            .env("FAKE_TF_LOG", &log)
            .env("FAKE_TF_STDIN", "1");
        for (k, v) in &tf.env {
            cmd.env(k, v);
        }
        cmd.env(
            "PATH",
            common::path_with(&[
                &common::shim_dir(&tmp),
                &tofu_shim,
                &tmp.join("fake"),
                &tofu_fake,
            ]),
        );
        // The fake blocks reading stdin until the test closes it: time to read its argv.
        let r = Running::start(cmd, true);
        let (pid, _) = fake_started(&log);
        let host = init.host_pid(pid).expect("the fake terraform's pid");
        let argv = common::cmdline(host);
        assert_eq!(argv, vec![argv0.to_string(), "plan".into()], "{what}");
        let o = r.wait(SHORT);
        assert_eq!(o.status.code(), Some(0), "{what}: {}", text(&o.stderr));
    }
    init.stop();
}

#[test]
fn exit_codes_are_relayed_exactly_and_death_by_signal_n_is_128_plus_n() {
    if !fake_available() {
        return;
    }
    let (tmp, init, tf) = fake_setup("shim-exit", &[]);
    for code in [0, 1, 2, 3, 42, 126, 127, 255] {
        let mut cmd = tf.shim(&tmp.0, &["apply"]);
        cmd.env("FAKE_TF_EXIT", code.to_string());
        let o = run(cmd, None, SHORT);
        assert_eq!(o.status.code(), Some(code), "{}", text(&o.stderr));
        assert!(o.stderr.is_empty(), "nothing added: {}", text(&o.stderr));
    }
    let log = tmp.join("fake.log");
    for sig in [Signal::SIGUSR1, Signal::SIGKILL, Signal::SIGTERM] {
        let _ = std::fs::remove_file(&log);
        let mut cmd = tf.shim(&tmp.0, &["apply"]);
        cmd.env("FAKE_TF_LOG", &log).env("FAKE_TF_STDIN", "1");
        let r = Running::start(cmd, true);
        let (pid, _) = fake_started(&log);
        let host = init.host_pid(pid).expect("the fake terraform's pid");
        kill(Pid::from_raw(host), sig).unwrap();
        let o = r.wait(SHORT);
        assert_eq!(o.status.code(), Some(128 + sig as i32), "{sig}");
        // The shim itself exits normally with that code: it was not signalled.
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&o.status),
            None
        );
    }
    init.stop();
}

#[test]
fn two_hundred_fifty_six_concurrent_runs_each_get_their_own_output_and_exit_code() {
    if !fake_available() {
        return;
    }
    const N: usize = 256;
    let (tmp, init, tf) = fake_setup("shim-256", &[]);
    let dirs: Vec<PathBuf> = (0..8)
        .map(|i| {
            let d = tmp.join(&format!("d{i}"));
            std::fs::create_dir_all(&d).unwrap();
            d
        })
        .collect();
    let mut runs: Vec<Running> = (0..N)
        .map(|i| {
            let var = format!("i={i}");
            let mut cmd = tf.shim(&dirs[i % 8], &["plan", "-var", &var]);
            cmd.env("FAKE_TF_STDIN", "1")
                .env("FAKE_TF_ECHO", "1")
                .env("FAKE_TF_EXIT", (i % 5).to_string());
            let mut r = Running::start(cmd, true);
            r.stdin
                .as_mut()
                .unwrap()
                .write_all(format!("input {i}\n").as_bytes())
                .unwrap();
            r
        })
        .collect();
    // Each fake blocks on its stdin until the test closes it: all N are in flight together.
    wait_for(LONG, "256 runs in flight at once", || {
        (init.run_count() == N).then_some(())
    });
    for r in &mut runs {
        drop(r.stdin.take());
    }
    let outs: Vec<Output> = runs
        .into_iter()
        .map(|r| std::thread::spawn(move || r.wait(LONG)))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    for (i, o) in outs.iter().enumerate() {
        assert_eq!(
            o.status.code(),
            Some((i % 5) as i32),
            "run {i}: {}",
            text(&o.stderr)
        );
        assert_eq!(
            text(&o.stdout),
            format!("input {i}\nargs: plan -var i={i}\n"),
            "run {i}"
        );
        assert_eq!(
            text(&o.stderr),
            format!("cwd: {}\n", dirs[i % 8].display()),
            "run {i}"
        );
    }
    wait_for(SHORT, "every run to end", || {
        (init.run_count() == 0).then_some(())
    });
    init.stop();
}
