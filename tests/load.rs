//! Load on a running init (tfinit as PID 1 of a PID namespace, as in a container): 256
//! terraform runs at once through the shim (the fake terraform), 16 real terraform runs at once,
//! and signals to the init during a burst of 10,000 orphan exits. Every run must get exactly its
//! own output and exit code, every signal must reach the controller exactly once, every orphan
//! must be reaped; the init's RSS and CPU time are reported (`cargo test --test load --
//! --nocapture` shows the `load:` lines; docs/reliability.md has the figures).

mod common;
#[path = "common/helper_init.rs"]
mod helper_init;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{fake_terraform_dir, helper, read, shim_dir, wait_for, TempDir};
use helper_init::*;

/// Generous bound for anything that should take a few seconds.
const SOON: Duration = Duration::from_secs(120);
/// A removal is one unlink plus a directory fsync on a local disk; this is room for a loaded machine.
const RECORDS_DRAIN: Duration = Duration::from_secs(10);

/// The load tests' init: owner `load`, `env` added, the controller running `controller_first`
/// (shell) first when not empty.
fn load_setup<'a>(env: &'a [(&'a str, &'a str)], controller_first: &'a str) -> Setup<'a> {
    Setup {
        controller_first,
        owner: Some("load"),
        env,
        ..Setup::default()
    }
}

/// Record files left in the state directory.
fn records(state_dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(state_dir.join("records"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// Waits until no record is left. The recorder removes a run's record after the loop has seen it
/// exit, beside the loop, so the last removals may land just after the shims returned.
fn assert_records_drain(state_dir: &Path) {
    let deadline = std::time::Instant::now() + RECORDS_DRAIN;
    while !records(state_dir).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "records left behind {RECORDS_DRAIN:?} after every run ended: {:?}",
            records(state_dir)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn two_hundred_fifty_six_runs_at_once_through_the_shim_each_get_their_own_output_and_exit_code() {
    if !root() || !common::enough_descriptors(4096) {
        return;
    }
    let _g = heavy();
    const N: usize = 256;
    let tmp = TempDir::new("load-256");
    let init = HelperInit::start(&tmp, load_setup(&[], ""));
    let shim = shim_dir(&tmp);
    let fake = fake_terraform_dir(&tmp);
    let path = common::path_with(&[&shim, &fake]);
    let before = init.usage();
    let started = Instant::now();
    // Each fake terraform first reads its stdin (the shim's, passed to it through the init) to
    // the end: all 256 are running at once before any of them is let go.
    let mut shims = Vec::with_capacity(N);
    for i in 0..N {
        let work = tmp.join(&format!("work/{i}"));
        std::fs::create_dir_all(&work).unwrap();
        // Even runs take the state lock (records, output followed), odd ones do not.
        let args: Vec<String> = if i % 2 == 0 {
            vec![
                "apply".into(),
                "-auto-approve".into(),
                format!("-var=i={i}"),
            ]
        } else {
            vec!["output".into(), "-json".into(), format!("run{i}")]
        };
        let mut c = Command::new(shim.join("terraform"));
        common::scrub(&mut c)
            .args(&args)
            .current_dir(&work)
            .env("PATH", &path)
            .env("TFINIT_RUN_DIR", &init.run_dir)
            .env_remove("TFINIT_TERRAFORM")
            .env("FAKE_TF_STDIN", "1")
            .env("FAKE_TF_OUT_BYTES", (997 * i).to_string())
            .env("FAKE_TF_ECHO", "1")
            .env("FAKE_TF_EXIT", i.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        shims.push((c.spawn().expect("spawn shim"), args));
    }
    wait_for(SOON, "all 256 terraform runs to be running at once", || {
        (init.terraform_children() == N).then_some(())
    });
    let all_running = started.elapsed().as_secs_f64();
    let during = init.usage();
    let mut waiting = Vec::with_capacity(N);
    for (i, (mut child, args)) in shims.into_iter().enumerate() {
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(format!("stdin of run {i}\n").as_bytes())
            .unwrap();
        drop(stdin);
        waiting.push((child, args));
    }
    let outputs: Vec<(Output, Vec<String>)> = waiting
        .into_iter()
        .map(|(c, a)| (common::wait_output(c, SOON), a))
        .collect();
    let secs = started.elapsed().as_secs_f64();
    let after = init.usage();
    for (i, (out, args)) in outputs.iter().enumerate() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(i as i32), "run {i}: {stderr}");
        let mut want = format!("stdin of run {i}\n").into_bytes();
        want.extend(vec![b'x'; 997 * i]);
        want.extend(format!("args: {}\n", args.join(" ")).into_bytes());
        assert!(
            out.stdout == want,
            "run {i}: wrong stdout ({} bytes, want {})",
            out.stdout.len(),
            want.len()
        );
        let cwd = tmp.join(&format!("work/{i}"));
        assert_eq!(stderr, format!("cwd: {}\n", cwd.display()), "run {i}");
    }
    // Every state-locking run ended normally: no record is left behind.
    assert_records_drain(&init.state_dir);
    eprintln!(
        "load: {N} runs at once: all running after {all_running:.1}s, all done after {secs:.1}s; init RSS {} KiB before, {} KiB with all running, peak {} KiB; init CPU {} ms for the lot",
        before.rss_kib,
        during.rss_kib,
        after.peak_rss_kib,
        after.cpu_ms - before.cpu_ms
    );
    assert!(
        after.peak_rss_kib < 64 * 1024,
        "init peak RSS {} KiB",
        after.peak_rss_kib
    );
    init.stop_cleanly();
}

fn terraform_bin() -> PathBuf {
    common::deps().join("bin/terraform")
}

fn plugins() -> PathBuf {
    common::deps().join("plugins")
}

#[test]
fn sixteen_real_terraform_runs_at_once_through_the_shim_all_get_their_plan_and_exit_code() {
    if !root()
        || !common::require(
            terraform_bin().exists() && plugins().is_dir(),
            "terraform and the null provider in .test-deps (scripts/install-test-deps.sh)",
        )
    {
        return;
    }
    let _g = heavy();
    const N: usize = 16;
    let tmp = TempDir::new("load-real");
    let init = HelperInit::start(&tmp, load_setup(&[], ""));
    let shim = shim_dir(&tmp);
    let bin = terraform_bin().parent().unwrap().to_path_buf();
    let path = common::path_with(&[&shim, &bin]);
    let dirs: Vec<PathBuf> = (0..N)
        .map(|i| {
            let d = tmp.join(&format!("tf/{i}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(
                d.join("main.tf"),
                format!("resource \"null_resource\" \"n\" {{\n  triggers = {{\n    run = \"run-{i}\"\n  }}\n}}\n"),
            )
            .unwrap();
            d
        })
        .collect();
    let terraform = |dir: &Path, args: &[&str]| -> Child {
        common::scrub(&mut Command::new(shim.join("terraform")))
            .args(args)
            .current_dir(dir)
            .env("PATH", &path)
            .env("TFINIT_RUN_DIR", &init.run_dir)
            .env_remove("TFINIT_TERRAFORM")
            .env("CHECKPOINT_DISABLE", "1")
            .env("TF_IN_AUTOMATION", "1")
            .env_remove("TF_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn shim")
    };
    let before = init.usage();
    let started = Instant::now();
    let plugin_dir = format!("-plugin-dir={}", plugins().display());
    let inits: Vec<Child> = dirs
        .iter()
        .map(|d| terraform(d, &["init", "-input=false", "-no-color", &plugin_dir]))
        .collect();
    for (i, c) in inits.into_iter().enumerate() {
        let out = common::wait_output(c, Duration::from_secs(300));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "init {i}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("Terraform has been successfully initialized"),
            "init {i}: {stdout}"
        );
    }
    let inited = started.elapsed().as_secs_f64();
    // plan -detailed-exitcode exits 2 when there are changes: an exit code that is not 0 must
    // come back as it is.
    let plans: Vec<Child> = dirs
        .iter()
        .map(|d| {
            terraform(
                d,
                &["plan", "-input=false", "-no-color", "-detailed-exitcode"],
            )
        })
        .collect();
    // How many run at once: terraform processes whose parent is the init, sampled until all end.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (done, pid) = (done.clone(), init.pid);
        std::thread::spawn(move || {
            let mut peak = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                peak = peak.max(terraform_children_of(pid));
                std::thread::sleep(Duration::from_millis(20));
            }
            peak
        })
    };
    let outputs: Vec<Output> = plans
        .into_iter()
        .map(|c| common::wait_output(c, Duration::from_secs(300)))
        .collect();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let peak_running = sampler.join().unwrap();
    let secs = started.elapsed().as_secs_f64();
    let after = init.usage();
    for (i, out) in outputs.iter().enumerate() {
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(2),
            "plan {i}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("null_resource.n will be created"),
            "plan {i}: {stdout}"
        );
        assert!(
            stdout.contains(&format!("\"run\" = \"run-{i}\"")),
            "plan {i} shows another run's plan: {stdout}"
        );
        assert!(
            stdout.contains("Plan: 1 to add, 0 to change, 0 to destroy."),
            "plan {i}: {stdout}"
        );
        // Each plan in its own directory: its own state lock, never another's.
        assert!(
            !stdout.contains("Error acquiring the state lock"),
            "plan {i}: {stdout}"
        );
    }
    assert_records_drain(&init.state_dir);
    // Each plan takes seconds and all 16 were asked for within milliseconds.
    assert!(
        peak_running >= N / 2,
        "only {peak_running} plans ran at once"
    );
    eprintln!(
        "load: {N} real terraform init + {N} plan at once: inits {inited:.1}s, plans done after {secs:.1}s, up to {peak_running} running at once; init RSS {} KiB before, peak {} KiB; init CPU {} ms",
        before.rss_kib,
        after.peak_rss_kib,
        after.cpu_ms - before.cpu_ms
    );
    assert!(
        after.peak_rss_kib < 64 * 1024,
        "init peak RSS {} KiB",
        after.peak_rss_kib
    );
    init.stop_cleanly();
}

#[test]
fn signals_to_the_init_during_ten_thousand_orphan_exits_all_reach_the_controller_exactly_once() {
    if !root() {
        return;
    }
    let _g = heavy();
    const ORPHANS: usize = 10_000;
    const PER_SIGNAL: usize = 100;
    let tmp = TempDir::new("load-orphans");
    let burst = tmp.join("orphans.out");
    // The controller starts the burst in the background, then becomes the signal recorder (the
    // same pid: the init forwards to it). Forwarding to the controller alone keeps the real-time
    // signals (whose default action is to terminate) away from the burst's processes.
    let first = format!(
        "{} orphans {ORPHANS} --deadline-s 110 >{} 2>&1 &",
        sh_quote(&helper()),
        sh_quote(&burst)
    );
    let init = HelperInit::start(&tmp, load_setup(&[("TFINIT_FORWARD", "child")], &first));
    // Real-time signals queue (standard ones coalesce, so their count proves nothing): three
    // kinds, interleaved, a hundred of each, sent while the orphans fork and exit.
    let rtmin = libc::SIGRTMIN();
    let kinds = [rtmin + 1, rtmin + 2, rtmin + 3];
    let mut sent_during_burst = 0;
    for k in 0..PER_SIGNAL * kinds.len() {
        if read(&burst).is_empty() {
            sent_during_burst += 1;
        }
        init.signal(kinds[k % kinds.len()]);
        // Spread over the burst rather than all queued at once (pacing, not synchronisation).
        std::thread::sleep(Duration::from_micros(500));
    }
    assert!(
        sent_during_burst > 0,
        "the burst ended before the first signal: it proves nothing"
    );
    let count = |name: &str| {
        read(&init.signals_log)
            .lines()
            .filter(|l| *l == format!("main {name}"))
            .count()
    };
    wait_for(SOON, "every signal to reach the controller", || {
        (1..=3)
            .all(|k| count(&format!("SIGRTMIN+{k}")) >= PER_SIGNAL)
            .then_some(())
    });
    let report = wait_for(SOON, "the burst's report", || {
        let r = read(&burst);
        r.contains('\n').then_some(r)
    });
    assert!(
        report.contains(&format!("orphans={ORPHANS} forked={ORPHANS} adopted_by=1 ")),
        "{report}"
    );
    assert!(
        report.trim_end().ends_with("zombies=0"),
        "orphans were not all reaped: {report}"
    );
    // A last, higher signal: lower ones pending are delivered first, so once it is recorded the
    // counts are final; none may have arrived twice.
    init.signal(rtmin + 4);
    wait_for(SOON, "the last signal", || {
        (count("SIGRTMIN+4") == 1).then_some(())
    });
    for k in 1..=3 {
        assert_eq!(count(&format!("SIGRTMIN+{k}")), PER_SIGNAL, "SIGRTMIN+{k}");
    }
    let after = init.usage();
    eprintln!(
        "load: {} signals ({} sent while {ORPHANS} orphans were being forked and reaped) all arrived once; burst: {}; init CPU {} ms in all (the burst started with the init), peak RSS {} KiB",
        PER_SIGNAL * kinds.len(),
        sent_during_burst,
        report.trim(),
        after.cpu_ms,
        after.peak_rss_kib
    );
    init.stop_cleanly();
}
