//! A lock that is not provably a dead owner's is never unlocked: another host's, a live pod's,
//! or any with force-unlock off (and a dry run changes nothing).
//!
//! Stuck state locks and their safe release, end to end against a real remote backend: terraform
//! 1.0.3 with the s3 backend on moto (S3 + a DynamoDB lock table, one server per test, stopped
//! when the test ends, also on failure). Pods are PID namespaces with their own hostname and a
//! shared TFINIT_STATE_DIR; "the pod dies" is SIGKILL of its PID 1, so everything in it dies at
//! once, as on a node loss. Controllers are small sh loops that retry `terraform apply` like a
//! provider's reconcile loop.
//!
//! Facts these tests rely on are in docs/notes/terraform-facts.md; the rules in docs/records.md.

mod common;
#[path = "common/s3_pods.rs"]
mod s3_pods;

use common::pods::{
    self, apply_once, apply_until_success, attempts, heartbeat_ms, now_ms, parse_rfc3339_ms, Pod,
    PodSpec, RETRY, STEP,
};
use common::{deps, wait_for};
use s3_pods::*;
use serde_json::json;
use std::fs;
use std::process::Stdio;

/// terraform applying (for `sleep` seconds) in `w`'s workspace as root on host `host`, in a PID
/// namespace of its own but without tfinit: its lock's Who is `root@<host>`.
fn apply_outside_tfinit(w: &S3World, host: &str, sleep: u32) -> Pod {
    let mut c = common::unshare();
    c.args(["--pid", "--fork", "--mount-proc", "--kill-child", "--uts"])
        .args([
            "sh",
            "-c",
            &format!("hostname {host} && exec \"$0\" \"$@\""),
        ])
        .arg(deps().join("bin/terraform"))
        .args(["apply", "-auto-approve", "-input=false", "-no-color"])
        .current_dir(&w.ws)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", "/root")
        .env("CHECKPOINT_DISABLE", "1")
        .env("TF_VAR_sleep", sleep.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    Pod {
        child: c.spawn().unwrap(),
        log: w.tmp.join(&format!("{host}.log")),
    }
}

#[test]
fn a_lock_held_by_another_host_is_never_unlocked_whatever_records_exist() {
    if !have_deps() {
        return;
    }
    let w = S3World::new("lock-laptop");
    // Somebody's laptop (not a pod) runs the apply and dies holding the lock.
    let mut laptop = apply_outside_tfinit(&w, "laptop", 30);
    let lock = wait_for(STEP, "the laptop's lock", || w.moto.lock(STATE));
    assert_eq!(lock["Who"], "root@laptop");
    laptop.kill();
    let created = parse_rfc3339_ms(lock["Created"].as_str().unwrap());

    // Records of dead pods in this directory: pod-a's (another Who), and an old pod that happened
    // to be called "laptop" too but died minutes before this lock was taken.
    let dead = |name: &str, who: &str, started: u64| {
        json!({
            "v": 4, "ttl_ms": TTL.as_millis() as u64,
            "owner": {"name": name, "boot_id": "0", "started_ms": started - 1000, "pid": 1},
            "who": who, "run_id": "r1", "cwd": w.ws, "workdir": w.ws, "workspace": "default",
            "subcommand": "apply", "argv": ["apply", "-auto-approve"],
            "started_ms": started, "in_progress": ["null_resource.a"], "updated_ms": started,
        })
    };
    let other_who = w.plant_record(
        "pod-a.0-1-1.r1.json",
        &dead("pod-a", "@pod-a", now_ms() - 60_000),
    );
    let old = created - 600_000;
    let old_pod = w.plant_record("laptop.0-1-1.r1.json", &dead("laptop", "root@laptop", old));
    w.plant_heartbeat(
        "laptop",
        &json!({"v": 1, "owner": {"name": "laptop", "boot_id": "0", "started_ms": old - 1000, "pid": 1}, "updated_ms": old + 60_000}),
    );

    let out = w.tmp.join("pod-b.out");
    let mut pod_b = Pod::start(
        &w,
        PodSpec {
            name: "pod-b",
            uid: Some(NOBODY_UID),
            script: apply_until_success(&out, 5),
            env: vec![("TF_VAR_sleep", "0".into())],
        },
    );
    let st = pod_b.wait();
    let log = pod_b.log();
    assert!(
        !st.success(),
        "pod-b must fail while the laptop holds the lock: {log}"
    );
    let tries = attempts(&out);
    assert_eq!(tries.len(), 5);
    assert!(tries.last().unwrap().end - tries[0].start > (TTL + RETRY).as_millis() as u64);
    for t in &tries {
        let o = common::read(&out.with_extension(format!("out.{}", t.n)));
        assert!(o.contains("Error acquiring the state lock"), "{o}");
        assert!(o.contains("Who:       root@laptop"), "{o}");
    }
    assert_eq!(
        w.moto.lock(STATE),
        Some(lock.clone()),
        "the laptop's lock is untouched"
    );
    assert!(!log.contains("force-unlocked"), "{log}");
    assert!(
        log.contains("its Who \"root@laptop\" is not the dead run's \"@pod-a\""),
        "{log}"
    );
    assert!(
        log.contains("after the dead run's owner was last known alive"),
        "{log}"
    );
    assert!(
        !other_who.exists() && !old_pod.exists(),
        "records of runs that hold no lock are removed"
    );

    // By hand, too: nothing is released.
    w.plant_record(
        "pod-a.0-1-1.r2.json",
        &dead("pod-a", "@pod-a", now_ms() - 60_000),
    );
    let out = recover_by_hand(&w, &[]);
    assert_eq!(
        w.moto.lock(STATE),
        Some(lock),
        "`tfinit recover` leaves it too"
    );
    assert!(
        out.contains("held by root@laptop is not the dead run's"),
        "{out}"
    );
}

#[test]
fn a_pod_starting_during_a_live_pods_apply_never_unlocks_it_and_succeeds_after() {
    if !have_deps() {
        return;
    }
    let w = S3World::new("lock-rolling");
    // pod-a's apply lasts two TTLs: only its heartbeat tells pod-b that it is alive.
    let a_out = w.tmp.join("pod-a.out");
    let mut pod_a = Pod::start(
        &w,
        PodSpec {
            name: "pod-a",
            uid: None,
            script: apply_once(&a_out, ""),
            env: vec![("TF_VAR_sleep", (2 * TTL.as_secs()).to_string())],
        },
    );
    let lock = wait_for(STEP, "pod-a's lock", || w.moto.lock(STATE));
    assert_eq!(lock["Who"], "root@pod-a");
    let b_out = w.tmp.join("pod-b.out");
    let mut pod_b = Pod::start(
        &w,
        PodSpec {
            name: "pod-b",
            uid: None,
            script: apply_until_success(&b_out, 30),
            env: vec![("TF_VAR_sleep", "0".into())],
        },
    );
    assert!(pod_a.wait().success(), "{}", pod_a.log());
    let a_done: Vec<u64> = common::read(&a_out)
        .lines()
        .filter_map(|l| l.strip_prefix("done 0 ").map(|t| t.trim().parse().unwrap()))
        .collect();
    assert_eq!(
        a_done.len(),
        1,
        "pod-a's apply succeeded: {}",
        common::read(&a_out)
    );
    assert!(common::read(&a_out.with_extension("out.1")).contains("Apply complete!"));
    assert!(pod_b.wait().success(), "{}", pod_b.log());

    let tries = attempts(&b_out);
    let failed: Vec<_> = tries.iter().filter(|t| !t.ok).collect();
    assert!(
        !failed.is_empty(),
        "pod-b overlapped pod-a's apply: {tries:?}"
    );
    // Each failure is terraform's own lock error; while pod-a held the lock it names its ID (an
    // attempt that raced pod-a's release may find no Lock Info left to print).
    let outputs: Vec<String> = failed
        .iter()
        .map(|t| common::read(&b_out.with_extension(format!("out.{}", t.n))))
        .collect();
    for o in &outputs {
        assert!(o.contains("Error acquiring the state lock"), "{o}");
    }
    assert!(
        outputs
            .iter()
            .any(|o| o.contains(lock["ID"].as_str().unwrap())),
        "{outputs:?}"
    );
    // Nothing of pod-b's succeeded while pod-a's apply ran, and pod-a released its own lock.
    for t in &tries {
        if t.end < a_done[0] {
            assert!(
                !t.ok,
                "attempt {} succeeded during pod-a's apply: {tries:?}",
                t.n
            );
        }
    }
    assert!(tries.last().unwrap().ok);
    assert!(
        !common::read(&a_out.with_extension("out.1")).contains("Error releasing the state lock")
    );
    let log = pod_b.log();
    assert!(!log.contains("force-unlock"), "{log}");
    assert!(
        !log.contains("checking the state lock"),
        "pod-a's record was never taken for dead: {log}"
    );
    assert!(w.records().is_empty());
    w.assert_state_consistent();
}

/// Issue 18, finding 1: liveness once compared another node's wall-clock stamp with ours, so a
/// live pod whose clock was behind by more than the TTL looked dead, and `tfinit recover` released
/// its lock. Now only a change of its heartbeat, watched on our own clock, counts: pod-b (its
/// clock 31 s behind, ten TTLs) beats, so its lock is left alone. Negative case: once pod-b is
/// gone and its heartbeat stops changing, the same command releases the lock after a TTL.
#[test]
fn a_live_owner_whose_clock_is_far_behind_is_never_taken_for_dead() {
    if !have_deps() {
        return;
    }
    let w = S3World::new("lock-skew");
    // pod-b's terraform holds the lock (its Who: root@pod-b), alive for the whole test.
    let mut holder = apply_outside_tfinit(&w, "pod-b", 120);
    let lock = wait_for(STEP, "pod-b's lock", || w.moto.lock(STATE));
    assert_eq!(lock["Who"], "root@pod-b");
    // Its record and heartbeat, stamped by a clock 31 s behind ours.
    const SKEW: u64 = 31_000;
    let owner =
        json!({"name": "pod-b", "boot_id": "0", "started_ms": now_ms() - SKEW - 5_000, "pid": 1});
    w.plant_record(
        "pod-b.0-1-1.r1.json",
        &json!({
            "v": 4, "ttl_ms": TTL.as_millis() as u64, "owner": owner, "who": "root@pod-b", "run_id": "r1", "cwd": w.ws,
            "workdir": w.ws, "workspace": "default", "subcommand": "apply",
            "argv": ["apply", "-auto-approve"], "started_ms": now_ms() - SKEW - 2_000,
            "in_progress": [], "updated_ms": now_ms() - SKEW - 2_000,
        }),
    );
    let beating = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let beats = {
        let beating = beating.clone();
        let dir = w.state.join("owners");
        fs::create_dir_all(&dir).unwrap();
        pods::chown(&w.state, NOBODY_UID);
        std::thread::spawn(move || {
            while beating.load(std::sync::atomic::Ordering::SeqCst) {
                let hb = json!({"v": 1, "owner": owner, "updated_ms": now_ms() - SKEW});
                let tmp = dir.join(".pod-b.json.tmp.test");
                fs::write(&tmp, hb.to_string()).unwrap();
                fs::rename(&tmp, dir.join("pod-b.json")).unwrap();
                std::thread::sleep(TTL / 3);
            }
        })
    };
    let out = recover_by_hand(&w, &[]);
    assert_eq!(w.moto.lock(STATE), Some(lock.clone()), "untouched: {out}");
    assert!(out.contains("owner alive): left alone"), "{out}");
    assert!(!out.contains("force-unlocked"), "{out}");

    // Negative case: pod-b dies, its heartbeat stops; watched unchanged for a TTL, it is dead.
    beating.store(false, std::sync::atomic::Ordering::SeqCst);
    beats.join().unwrap();
    holder.kill();
    let out = recover_by_hand(&w, &[]);
    assert!(
        out.contains(&format!(
            "force-unlocked lock {}",
            lock["ID"].as_str().unwrap()
        )),
        "{out}"
    );
    assert_eq!(w.moto.lock(STATE), None, "{out}");
}

/// Issue 18, finding 3: two live inits with one owner name (a hostNetwork pod, a fixed
/// TFINIT_OWNER) once shared one heartbeat file, and each took the other's live run for an earlier
/// incarnation of itself. Now each incarnation has its own heartbeat: the second, on another node
/// (so it must watch), sees the first's beats change, says so once, and never unlocks its lock.
#[test]
fn two_live_inits_with_one_owner_name_never_unlock_each_others_locks() {
    if !have_deps() {
        return;
    }
    let w = S3World::new("lock-twins");
    let a_out = w.tmp.join("twin-1.out");
    let mut first = Pod::start(
        &w,
        PodSpec {
            name: "pod-a",
            uid: None,
            script: apply_once(&a_out, ""),
            env: vec![("TF_VAR_sleep", (2 * TTL.as_secs()).to_string())],
        },
    );
    let lock = wait_for(STEP, "the first twin's lock", || w.moto.lock(STATE));
    assert_eq!(lock["Who"], "root@pod-a");
    let b_out = w.tmp.join("twin-2.out");
    let mut second = Pod::start_on_other_node(
        &w,
        PodSpec {
            name: "pod-a",
            uid: None,
            script: apply_until_success(&b_out, 30),
            env: vec![("TF_VAR_sleep", "0".into())],
        },
        "00000000-0000-4000-8000-0000000000a2",
    );
    assert!(first.wait().success(), "{}", first.log());
    assert!(
        common::read(&a_out.with_extension("out.1")).contains("Apply complete!"),
        "the first twin's apply was never cut short: {}",
        common::read(&a_out.with_extension("out.1"))
    );
    assert!(second.wait().success(), "{}", second.log());
    let log = second.log();
    assert!(!log.contains("force-unlocked"), "{log}");
    assert!(
        log.contains("another tfinit is using owner name pod-a"),
        "the second twin saw the first's beats change and said so: {log}"
    );
    assert_eq!(
        log.matches("another tfinit is using owner name").count(),
        1,
        "once: {log}"
    );
    assert!(
        first
            .log()
            .contains("another tfinit is using owner name pod-a"),
        "{}",
        first.log()
    );
    assert!(w.records().is_empty());
    w.assert_state_consistent();
}

#[test]
fn force_unlock_off_never_unlocks_and_recover_dry_run_changes_nothing() {
    if !have_deps() {
        return;
    }
    let w = S3World::new("lock-off");
    let (mut pod_a, _) = pod_a_mid_apply(&w, "pod-a", None, false);
    pod_a.kill();
    let lock = w.moto.lock(STATE).expect("stuck");
    assert_eq!(lock["Who"], "root@pod-a");
    let (rec_path, _) = w.records().pop().unwrap();
    let rec_bytes = fs::read(&rec_path).unwrap();

    let out = w.tmp.join("pod-b.out");
    let mut pod_b = Pod::start(
        &w,
        PodSpec {
            name: "pod-b",
            uid: None,
            script: apply_until_success(&out, 5),
            env: vec![
                ("TF_VAR_sleep", "0".into()),
                ("TFINIT_FORCE_UNLOCK", "off".into()),
            ],
        },
    );
    assert!(!pod_b.wait().success());
    let tries = attempts(&out);
    assert!(tries.last().unwrap().start > heartbeat_ms(&w.state, "pod-a") + TTL.as_millis() as u64);
    assert_eq!(w.moto.lock(STATE), Some(lock.clone()));
    assert_eq!(fs::read(&rec_path).unwrap(), rec_bytes, "record untouched");
    assert!(!pod_b.log().contains("force-unlock"), "{}", pod_b.log());

    let dry = recover_by_hand(&w, &["--dry-run"]);
    assert!(
        dry.contains(&format!(
            "would force-unlock lock {}",
            lock["ID"].as_str().unwrap()
        )),
        "{dry}"
    );
    assert!(dry.contains("orphan candidates: null_resource.a"), "{dry}");
    assert_eq!(
        w.moto.lock(STATE),
        Some(lock.clone()),
        "dry run leaves the lock"
    );
    assert_eq!(
        fs::read(&rec_path).unwrap(),
        rec_bytes,
        "dry run leaves the record"
    );
    assert!(
        !w.state.join("recover.lock").exists(),
        "a dry run writes nothing, not even the recovery lock"
    );

    let real = recover_by_hand(&w, &[]);
    assert!(
        real.contains(&format!(
            "force-unlocked lock {}",
            lock["ID"].as_str().unwrap()
        )),
        "{real}"
    );
    assert_eq!(w.moto.lock(STATE), None);
    assert!(!rec_path.exists());
}
