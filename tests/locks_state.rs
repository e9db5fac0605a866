//! Issue 23's regression tests, each a way a live run's lock was once released so that a second
//! apply ran on the same state, end to end with real terraform on the s3 backend (moto) and tfinit
//! as PID 1 of each pod (tests/common/s3_pods.rs):
//! 1. an observer judged another incarnation's heartbeat by its own, shorter TTL;
//! 2. this init's own live runs counted as live only by working-directory text (a symlinked
//!    `-chdir`, two directories whose backends name one state);
//! 3. the kernel's proof trusted whatever file was at the lock file's path.
//!
//! Each test has its negative case: once the holder is really gone, the same recovery releases
//! the lock. Each runs on terraform 1.0.3 (panicwrap: two processes) and on the modern terraform
//! (one process), where one is installed (`each_terraform!`). The rules are in docs/records.md ("Who is dead", "Which state a lock guards").

#[macro_use]
mod common;
#[path = "common/s3_pods.rs"]
mod s3_pods;

use common::pods::{self, heartbeat_file, Pod, PodSpec, STEP};
use common::terraform::{plugin_dir_arg, S3Lock, Terraform};
use common::{read, tfinit, wait_for};
use s3_pods::*;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `tfinit recover` by hand as if on another node: `boot_id` replaces the kernel's boot id in a
/// mount namespace of its own, so no kernel proof applies and it must watch heartbeats. Its own
/// TFINIT_OWNER_TTL is the world's (3 s). Returns its output and how long it took.
fn recover_on_other_node(w: &S3World, boot_id: &str) -> (String, Duration) {
    let file = w.tmp.join(&format!("boot_id-recover-{}", pods::now_ms()));
    fs::write(&file, format!("{boot_id}\n")).unwrap();
    let mut c = common::unshare();
    c.args(["--mount", "sh", "-c"])
        .arg(format!(
            "mount --bind {} /proc/sys/kernel/random/boot_id && exec \"$0\" recover",
            file.display()
        ))
        .arg(tfinit())
        .current_dir(&w.tmp.0)
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", w.tf.dir().display()))
        .env("HOME", "/root")
        .env("CHECKPOINT_DISABLE", "1")
        .env("TFINIT_STATE_DIR", &w.state)
        .env("TFINIT_OWNER", "debug-shell")
        .env("TFINIT_OWNER_TTL", format!("{}s", TTL.as_secs()));
    let started = Instant::now();
    let out = common::run_output(&mut c, STEP);
    (pods::text(&out), started.elapsed())
}

/// The heartbeat of `owner`'s single incarnation in `w`'s state dir, parsed.
fn heartbeat(w: &S3World, owner: &str) -> Value {
    let f = heartbeat_file(&w.state, owner).expect("a heartbeat file");
    serde_json::from_str(&read(&f)).unwrap()
}

/// Finding 1: pod-a beats every 4 s (TTL 12 s) and is healthy; `tfinit recover` from a debug
/// shell on another node, with the default-like TTL of 3 s, once watched it unchanged for 3 s
/// right after a beat and released its lock. Now it watches for pod-a's own TTL, sees the next
/// beat and leaves the lock alone. Negative case: once pod-a is gone, the same command releases
/// the lock, after watching for pod-a's 12 s (not its own 3 s).
fn an_owner_with_a_longer_ttl_is_judged_by_its_own_ttl(tf: &Terraform) {
    if !have_deps() {
        return;
    }
    let w = S3World::with("lock-ttl", tf, S3Lock::Table);
    let owner_ttl = Duration::from_secs(12);
    let a_out = w.tmp.join("pod-a.out");
    // pod-a's apply holds its lock until the test opens this gate.
    let gate = w.tmp.join("gate-a");
    let mut pod_a = Pod::start(
        &w,
        PodSpec {
            name: "pod-a",
            uid: None,
            script: pods::apply_once(&a_out, ""),
            env: vec![
                ("TF_VAR_sleep", "0".into()),
                ("TF_VAR_gate", gate.display().to_string()),
                ("TFINIT_OWNER_TTL", format!("{}s", owner_ttl.as_secs())),
            ],
        },
    );
    let lock = wait_for(STEP, "pod-a's lock", || w.moto.lock(STATE));
    wait_for(STEP, "pod-a's record", || w.records().first().cloned());
    let hb = heartbeat(&w, "pod-a");
    assert_eq!(hb["ttl_ms"], 12_000, "the heartbeat states its TTL: {hb}");
    // Right after a beat, as in the finding.
    let seq = hb["seq"].as_u64().unwrap();
    wait_for(STEP, "pod-a's next beat", || {
        (heartbeat(&w, "pod-a")["seq"].as_u64() > Some(seq)).then_some(())
    });
    let (out, _) = recover_on_other_node(&w, "0f0f0f0f-other-node");
    assert_eq!(w.moto.lock(STATE), Some(lock.clone()), "untouched: {out}");
    assert!(out.contains("owner alive): left alone"), "{out}");
    assert!(!out.contains("force-unlocked"), "{out}");
    fs::write(&gate, "").unwrap();
    assert!(pod_a.wait().success(), "{}", pod_a.log());
    let a = read(&a_out.with_extension("out.1"));
    assert!(a.contains("Apply complete!"), "{a}");
    assert!(!a.contains("Error releasing the state lock"), "{a}");

    // Negative case: pod-a dies holding a lock (planted: its apply ended cleanly above), and the
    // watch lasts pod-a's TTL.
    let w2 = S3World::with("lock-ttl-dead", tf, S3Lock::Table);
    let mut pod = Pod::start(
        &w2,
        PodSpec {
            name: "pod-a",
            uid: None,
            script: pods::apply_once(&w2.tmp.join("pod-a.out"), ""),
            env: vec![
                ("TF_VAR_sleep", "60".into()),
                ("TFINIT_OWNER_TTL", format!("{}s", owner_ttl.as_secs())),
            ],
        },
    );
    let lock = wait_for(STEP, "pod-a's lock", || w2.moto.lock(STATE));
    wait_for(STEP, "pod-a's record", || w2.records().first().cloned());
    pod.kill();
    let (out, took) = recover_on_other_node(&w2, "0f0f0f0f-other-node");
    assert!(
        took >= owner_ttl,
        "watched {took:?}, less than the owner's TTL {owner_ttl:?}: {out}"
    );
    assert_released(&w2, &out, &lock);
}

/// Where the runs of [`a_live_runs_lock_is_never_released_through_another_path_to_its_state`]
/// reach the state: the working directory through a symbolic link, or a second directory
/// initialised with the same backend key.
#[derive(Debug, Clone, Copy)]
enum OtherPath {
    Symlink,
    SameKey,
}

/// The other directory of `w` for `how`, ready to run in.
fn other_path(w: &S3World, how: OtherPath) -> PathBuf {
    match how {
        OtherPath::Symlink => {
            let link = w.tmp.join("link");
            std::os::unix::fs::symlink(&w.ws, &link).unwrap();
            link
        }
        OtherPath::SameKey => {
            let b = w.tmp.join("b");
            fs::create_dir_all(&b).unwrap();
            fs::copy(w.ws.join("main.tf"), b.join("main.tf")).unwrap();
            let mut c = w.tf.command();
            c.args(["init", "-input=false", "-no-color"])
                .arg(plugin_dir_arg())
                .args(w.tf.s3_backend_config(&w.moto.endpoint(), w.lock))
                .current_dir(&b)
                .env("HOME", "/root")
                .env("CHECKPOINT_DISABLE", "1");
            let out = common::run_output(&mut c, STEP);
            assert!(out.status.success(), "init in b: {}", pods::text(&out));
            b
        }
    }
}

/// Pids of `w`'s real terraform processes (not the shims: those are tfinit) whose command line
/// holds `arg`, working in `w`'s temp dir: other tests' terraform runs beside this one, and must
/// never be signalled.
fn real_terraform_with(w: &S3World, arg: &str) -> Vec<i32> {
    let real = fs::canonicalize(w.tf.path()).unwrap();
    let ours = fs::canonicalize(&w.tmp.0).unwrap();
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let exe = fs::read_link(e.path().join("exe")).ok();
        let cmdline = fs::read(e.path().join("cmdline")).unwrap_or_default();
        let has = cmdline.split(|b| *b == 0).any(|a| a == arg.as_bytes());
        let here = fs::read_link(e.path().join("cwd")).is_ok_and(|c| c.starts_with(&ours));
        if has && here && exe.as_deref() == Some(real.as_path()) {
            out.push(pid);
        }
    }
    out
}

/// The lines of the pod's progress file.
fn progress(file: &Path) -> String {
    fs::read_to_string(file).unwrap_or_default()
}

/// A pod script's steps: it waits for a file per step (`go`), its runs write their output to
/// `<dir>/<run>.out` and a line `<run> <exit code>` to `<dir>/done` (the progress file). Its
/// methods make the script's lines, so that each line of a test's script says what it is.
struct Steps {
    dir: PathBuf,
}

impl Steps {
    fn new(w: &S3World) -> Steps {
        let dir = w.tmp.join("steps");
        fs::create_dir_all(&dir).unwrap();
        Steps { dir }
    }

    /// The sh line that waits for `step`.
    fn wait(&self, step: &str) -> String {
        format!(
            "while [ ! -e {} ]; do sleep 0.1; done",
            self.dir.join(step).display()
        )
    }

    /// The sh line that starts `command` in the background as run `run`.
    fn start(&self, run: &str, command: &str) -> String {
        format!("{command} > {} 2>&1 &", self.out_file(run).display())
    }

    /// The sh line that runs `command` as run `run`, then writes `<run> <exit code>` to the
    /// progress file.
    fn run(&self, run: &str, command: &str) -> String {
        let done = self.say(&format!("{run} $?"));
        format!("{command} > {} 2>&1; {done}", self.out_file(run).display())
    }

    /// The sh line that writes `line` to the progress file.
    fn say(&self, line: &str) -> String {
        format!("echo \"{line}\" >> {}", self.dir.join("done").display())
    }

    /// The script of `lines`.
    fn script(lines: &[String]) -> String {
        lines.iter().map(|l| format!("{l}\n")).collect()
    }

    /// Lets the script past `step`.
    fn go(&self, step: &str) {
        fs::write(self.dir.join(step), "").unwrap();
    }

    /// Waits until the progress file has `line` (within `within`).
    fn until(&self, line: &str, within: Duration) {
        wait_for(within, &format!("`{line}` in the progress file"), || {
            progress(&self.dir.join("done"))
                .contains(line)
                .then_some(())
        });
    }

    /// What run `run` printed.
    fn out(&self, run: &str) -> String {
        read(&self.out_file(run))
    }

    /// Where run `run`'s output goes.
    fn out_file(&self, run: &str) -> PathBuf {
        self.dir.join(format!("{run}.out"))
    }
}

/// SIGKILL to each of `pids` (as the OOM killer would; one that is gone already is no matter).
fn kill_all(pids: Vec<i32>) {
    for p in pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Asserts `out` (a recovery's output or log) says it released `lock`, and the lock is gone.
fn assert_released(w: &S3World, out: &str, lock: &Value) {
    assert!(
        out.contains(&format!(
            "force-unlocked lock {}",
            lock["ID"].as_str().unwrap()
        )) || out.contains(&format!(
            "force-unlocked its state lock {}",
            lock["ID"].as_str().unwrap()
        )),
        "{out}"
    );
    assert_eq!(w.moto.lock(STATE), None, "{out}");
}

/// Finding 2: R2 applies in the working directory; R0 reaches the same state through another
/// path (`how`), waits for the lock, and its terraform is SIGKILLed (as the OOM killer would);
/// R3 through that path once recovered R0's record, found the lock held with this pod's Who and
/// force-unlocked R2's live lock, because the live run's directory text differed. Now the state
/// is what counts: R3's recovery leaves the lock alone (R3 fails on the held lock, as terraform
/// does), R2 finishes and releases its own lock. Negative case: once R2 is done, R4 through the
/// same path finds the lock free and R0's record is removed.
fn a_live_runs_lock_is_never_released_through_another_path_to_its_state(
    tf: &Terraform,
    how: OtherPath,
) {
    if !have_deps() {
        return;
    }
    let w = S3World::with(
        &format!("lock-path-{how:?}").to_lowercase(),
        tf,
        S3Lock::Table,
    );
    let other = other_path(&w, how);
    let chdir = format!("-chdir={}", other.display());
    let steps = Steps::new(&w);
    let done = steps.dir.join("done");
    // R2 holds its lock until the test opens this gate (after R3's recovery).
    let gate = steps.dir.join("r2-gate");
    let apply = "apply -auto-approve -input=false -no-color";
    // R0, R3 and R4 apply through the other path, without a sleep or a gate.
    let via_other = format!("TF_VAR_sleep=0 TF_VAR_gate= terraform {chdir} {apply}");
    let script = Steps::script(&[
        steps.start("r2", &format!("terraform {apply}")),
        steps.wait("go-r0"),
        steps.start("r0", &format!("{via_other} -lock-timeout=300s")),
        steps.wait("go-r3"),
        steps.run("r3", &format!("{via_other} -lock-timeout=0s")),
        "wait".into(),
        steps.say("r2 done"),
        steps.wait("go-r4"),
        steps.run("r4", &format!("{via_other} -lock-timeout=0s")),
    ]);
    let mut pod = Pod::start(
        &w,
        PodSpec {
            name: "pod-a",
            uid: None,
            script,
            env: vec![
                ("TF_VAR_sleep", "0".into()),
                ("TF_VAR_gate", gate.display().to_string()),
            ],
        },
    );
    let lock = wait_for(STEP, "R2's lock", || w.moto.lock(STATE));
    steps.go("go-r0");
    wait_for(STEP, "R0 waiting for the lock", || {
        let r0 = steps.out("r0");
        (w.records().len() == 2 && r0.contains("Acquiring state lock")).then_some(())
    });
    // SIGKILL of R0's terraform (both processes of 1.0.3's panicwrap shape).
    let pids = real_terraform_with(&w, &chdir);
    assert!(!pids.is_empty(), "R0's terraform processes");
    kill_all(pids);
    wait_for(STEP, "R0's record marked ended", || {
        w.records()
            .iter()
            .any(|(_, r)| !r["ended"].is_null())
            .then_some(())
    });
    steps.go("go-r3");
    steps.until("r3 ", Duration::from_secs(90));
    let r3 = steps.out("r3");
    assert!(r3.contains("Error acquiring the state lock"), "{r3}");
    assert_eq!(
        w.moto.lock(STATE).map(|l| l["ID"].clone()),
        Some(lock["ID"].clone()),
        "R2's lock untouched: {}",
        pod.log()
    );
    fs::write(&gate, "").unwrap();
    steps.until("r2 done", Duration::from_secs(90));
    let r2 = steps.out("r2");
    assert!(r2.contains("Apply complete!"), "{r2}");
    assert!(!r2.contains("Error releasing the state lock"), "{r2}");
    let log = pod.log();
    assert!(!log.contains("force-unlocked"), "{log}");
    // It names R2 (its record, or this init's live run) as the run that may hold the lock.
    assert!(
        log.lines()
            .any(|l| l.contains("may not be the dead run's")
                && l.contains(&w.ws.display().to_string())),
        "the recovery names the live run that may hold the lock: {log}"
    );
    // R2's record is removed by the recorder after R2 exits, beside the loop: the script's
    // "r2 done" can come first, so poll for it.
    wait_for(STEP, "R2's record removed, R0's kept", || {
        (w.records().len() == 1).then_some(())
    });
    assert!(
        w.records().iter().all(|(_, r)| !r["ended"].is_null()),
        "the record kept is R0's (ended): {log}"
    );

    // Negative case: R2 is done; R4 through the same path finds the lock free.
    steps.go("go-r4");
    steps.until("r4 ", Duration::from_secs(90));
    let r4 = steps.out("r4");
    assert!(progress(&done).contains("r4 0"), "{r4}\n{}", pod.log());
    // R0's record is removed by R4's recovery; R4's own, by the recorder after R4 exits (beside
    // the loop, so after the script's "r4 0" maybe): poll.
    wait_for(STEP, "R0's and R4's records removed", || {
        w.records().is_empty().then_some(())
    });
    assert!(
        pod.log()
            .lines()
            .any(|l| l.contains("the state lock is free; record removed")),
        "R0's record removed by R4's recovery: {}",
        pod.log()
    );
    assert!(pod.wait().success(), "{}", pod.log());
    w.assert_state_consistent();
}

fn a_live_runs_lock_is_never_released_through_a_symlinked_chdir(tf: &Terraform) {
    a_live_runs_lock_is_never_released_through_another_path_to_its_state(tf, OtherPath::Symlink);
}

fn a_live_runs_lock_is_never_released_through_a_second_directory_with_its_backend_key(
    tf: &Terraform,
) {
    a_live_runs_lock_is_never_released_through_another_path_to_its_state(tf, OtherPath::SameKey);
}

/// Finding 3: while pod-a applies, `owners/` is restored from a backup, so a new, free file sits
/// at its lock file's path; `tfinit recover` on the same node once took the free flock for the
/// kernel's proof that pod-a was gone and released its live lock. Now the proof holds only on the
/// file (device and inode) pod-a's heartbeat names: recover watches instead, sees pod-a beat and
/// leaves the lock alone. Negative case: pod-a killed, the same command watches its heartbeat
/// for a TTL and releases the lock.
fn a_lock_file_replaced_under_a_live_owner_proves_nothing(tf: &Terraform) {
    if !have_deps() {
        return;
    }
    let w = S3World::with("lock-inode", tf, S3Lock::Table);
    let mut pod_a = Pod::start(
        &w,
        PodSpec {
            name: "pod-a",
            uid: None,
            script: pods::apply_once(&w.tmp.join("pod-a.out"), ""),
            env: vec![("TF_VAR_sleep", "60".into())],
        },
    );
    let lock = wait_for(STEP, "pod-a's lock", || w.moto.lock(STATE));
    wait_for(STEP, "pod-a's record", || w.records().first().cloned());
    let hb = heartbeat(&w, "pod-a");
    assert_eq!(hb["holds_lock"], true, "{hb}");
    assert!(hb["lock_file"]["ino"].as_u64().is_some(), "{hb}");
    // The restore: a copy of the lock file renamed over it.
    let lock_file = heartbeat_file(&w.state, "pod-a")
        .unwrap()
        .with_extension("lock");
    let restored = w.state.join("owners/.restored");
    fs::copy(&lock_file, &restored).unwrap();
    fs::rename(&restored, &lock_file).unwrap();
    let out = pods::text(&pods::recover_by_hand(&w, &[], &[]));
    assert_eq!(w.moto.lock(STATE), Some(lock.clone()), "untouched: {out}");
    assert!(out.contains("owner alive): left alone"), "{out}");
    assert!(!out.contains("the kernel freed"), "{out}");

    // Negative case.
    pod_a.kill();
    let out = pods::text(&pods::recover_by_hand(&w, &[], &[]));
    assert_released(&w, &out, &lock);
}

/// What the rule of "Which state a lock guards" costs (docs/records.md): a live run of the same
/// `Who` whose state tfinit cannot tell (here an `init` that hangs on an unanswering endpoint, in
/// another directory) keeps a dead run's lock in place while it lives, if it started before the
/// lock was created or within CLOCK_SKEW after. R0 dies holding its lock; the init starts; R3's
/// recovery leaves the lock alone and R3 fails on it; once the init is gone, R4's recovery
/// releases it. Prints how long the lock waited and how soon after the init's end it went.
fn a_dead_runs_lock_waits_while_a_live_run_of_its_who_may_lock_its_state(tf: &Terraform) {
    if !have_deps() {
        return;
    }
    let w = S3World::with("lock-cost", tf, S3Lock::Table);
    // Connections wait in its backlog for good: the init hangs until it is killed.
    let blackhole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hole = format!("http://{}", blackhole.local_addr().unwrap());
    let c = w.tmp.join("c");
    fs::create_dir_all(&c).unwrap();
    fs::copy(w.ws.join("main.tf"), c.join("main.tf")).unwrap();
    let steps = Steps::new(&w);
    let done = steps.dir.join("done");
    let init_chdir = format!("-chdir={}", c.display());
    // Single quotes: 1.6+'s `endpoints={s3="..."}` holds double quotes.
    let init_config =
        w.tf.s3_backend_config(&hole, w.lock)
            .iter()
            .map(|a| format!("'{a}'"))
            .collect::<Vec<_>>()
            .join(" ");
    let plugins = plugin_dir_arg();
    let apply = "apply -auto-approve -input=false -no-color";
    let script = Steps::script(&[
        steps.start("r0", &format!("terraform {apply}")),
        steps.wait("go-init"),
        steps.start(
            "init",
            &format!("terraform {init_chdir} init -input=false -no-color {plugins} {init_config}"),
        ),
        steps.wait("go-r3"),
        steps.run(
            "r3",
            &format!("TF_VAR_sleep=0 terraform {apply} -lock-timeout=0s"),
        ),
        steps.wait("go-r4"),
        steps.run(
            "r4",
            &format!("TF_VAR_sleep=0 terraform {apply} -lock-timeout=0s"),
        ),
        "wait".into(),
    ]);
    let mut pod = Pod::start(
        &w,
        PodSpec {
            name: "pod-a",
            uid: None,
            script,
            env: vec![("TF_VAR_sleep", "60".into())],
        },
    );
    let lock = wait_for(STEP, "R0's lock", || w.moto.lock(STATE));
    // R0 dies holding it (SIGKILL of its terraform, as the OOM killer would).
    let ws_arg = "apply";
    let r0: Vec<i32> = real_terraform_with(&w, ws_arg);
    assert!(!r0.is_empty(), "R0's terraform");
    kill_all(r0);
    let killed = Instant::now();
    wait_for(STEP, "R0's record marked ended", || {
        w.records()
            .iter()
            .any(|(_, r)| !r["ended"].is_null())
            .then_some(())
    });
    steps.go("go-init");
    wait_for(STEP, "the init to hang on the backend", || {
        (!real_terraform_with(&w, &init_chdir).is_empty()
            && steps.out("init").contains("Initializing the backend"))
        .then_some(())
    });
    steps.go("go-r3");
    steps.until("r3 ", Duration::from_secs(90));
    let r3 = steps.out("r3");
    assert!(r3.contains("Error acquiring the state lock"), "{r3}");
    assert_eq!(
        w.moto.lock(STATE).map(|l| l["ID"].clone()),
        Some(lock["ID"].clone()),
        "{}",
        pod.log()
    );
    assert!(
        pod.log()
            .lines()
            .any(|l| l.contains("may not be the dead run's")
                && l.contains("an `init` may be changing the backend")
                || l.contains("may not be the dead run's") && l.contains(&c.display().to_string())),
        "the live init is named: {}",
        pod.log()
    );
    // The init ends (here: killed; its record is marked ended in its own directory).
    kill_all(real_terraform_with(&w, &init_chdir));
    let init_gone = Instant::now();
    wait_for(STEP, "the init's record marked ended", || {
        (w.records()
            .iter()
            .filter(|(_, r)| !r["ended"].is_null())
            .count()
            == 2)
            .then_some(())
    });
    steps.go("go-r4");
    steps.until("r4 ", Duration::from_secs(90));
    let released = Instant::now();
    assert!(
        progress(&done).contains("r4 0"),
        "{}\n{}",
        steps.out("r4"),
        pod.log()
    );
    assert!(
        pod.log().contains(&format!(
            "force-unlocked its state lock {}",
            lock["ID"].as_str().unwrap()
        )),
        "{}",
        pod.log()
    );
    println!(
        "cost: the dead run's lock waited {:.1}s after its terraform died, {:.1}s of it while the live init ran; released (R4 done) {:.1}s after the init ended",
        released.duration_since(killed).as_secs_f64(),
        init_gone.duration_since(killed).as_secs_f64(),
        released.duration_since(init_gone).as_secs_f64()
    );
    drop(blackhole);
    assert!(pod.wait().success(), "{}", pod.log());
}

each_terraform!(an_owner_with_a_longer_ttl_is_judged_by_its_own_ttl);
each_terraform!(a_live_runs_lock_is_never_released_through_a_symlinked_chdir);
each_terraform!(a_live_runs_lock_is_never_released_through_a_second_directory_with_its_backend_key);
each_terraform!(a_lock_file_replaced_under_a_live_owner_proves_nothing);
each_terraform!(a_dead_runs_lock_waits_while_a_live_run_of_its_who_may_lock_its_state);
