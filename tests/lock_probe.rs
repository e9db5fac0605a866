//! The lock probe against real terraform, on each version (tests/common/terraform.rs: 1.0.3 of
//! the test dependencies and the modern terraform where one is present), with the s3 backend on
//! moto: what `terraform force-unlock -force <id that cannot match>` says of a lock that is free,
//! held and unreadable is read as such, for each lock the version has (a DynamoDB table; on 1.10
//! and later also use_lockfile's lock object, and both).
//!
//! Issue 23, finding 4: with terraform 1.11 a freed s3 lock read as "cannot tell", so its record
//! was never removed and `tfinit recover` exited 1. Here a dead run's record whose lock a person
//! released is removed by the next run's recovery, and `tfinit recover` exits 0, on both
//! versions. And an answer in a wording tfinit does not know keeps the record: the init says so
//! once per record and counts each probe.
//!
//! The wordings themselves, and which were measured or read from source:
//! src/locks/lockinfo/wordings.rs, docs/notes/terraform-facts.md section 12.

#[macro_use]
mod common;
#[path = "common/s3_pods.rs"]
mod s3_pods;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::Stdio;

use common::pods::{self, apply_once, text, Pod, PodSpec, STEP};
use common::{deps, wait_for};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use s3_pods::*;
use serde_json::Value;
use tfinit::locks::lockinfo::{parse_probe, probe_id, Probe};

/// The locks `tf` can take on s3: the DynamoDB table, and with 1.10 or later the lock object
/// and both.
fn locks_of(tf: &Terraform) -> Vec<S3Lock> {
    if tf.s3_lock_object() {
        vec![S3Lock::Table, S3Lock::Object, S3Lock::Both]
    } else {
        vec![S3Lock::Table]
    }
}

/// The probe as the recovery helper runs it (src/locks/recover/mod.rs `probe_and_decide`: no
/// -no-color), read.
fn probe(w: &S3World) -> Probe {
    let out = w.terraform(&["force-unlock", "-force", probe_id("s3")]);
    parse_probe("s3", out.status.success(), &text(&out))
}

/// Leaves the state's lock stuck as a killed pod would: an apply SIGKILLed (its whole process
/// group) once it holds every lock of `lock`. Returns the lock as the backend stores it.
fn stick(w: &S3World, lock: S3Lock) -> Value {
    let mut c = w.terraform_command(&["apply", "-auto-approve", "-input=false", "-no-color"]);
    c.env("TF_VAR_sleep", "60")
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut apply = c.spawn().expect("start the apply");
    let held = wait_for(STEP, "the apply to hold the lock", || {
        let table = w.moto.lock(STATE);
        let object = w.moto.lock_object(KEY);
        match lock {
            S3Lock::Table => table,
            S3Lock::Object => object,
            S3Lock::Both => object.and(table),
        }
    });
    killpg(Pid::from_raw(apply.id() as i32), Signal::SIGKILL).expect("SIGKILL the apply");
    let _ = apply.wait();
    held
}

each_terraform!(the_probe_reads_a_free_a_held_and_an_unreadable_s3_lock_as_such);

fn the_probe_reads_a_free_a_held_and_an_unreadable_s3_lock_as_such(tf: &Terraform) {
    if !common::require(
        deps().join("venv/bin/moto_server").is_file(),
        ".test-deps/venv/bin/moto_server",
    ) {
        return;
    }
    for lock in locks_of(tf) {
        let mut w = S3World::with(&format!("probe-{lock:?}"), tf, lock);
        let what = format!("terraform {} with {lock:?}", tf.version());
        assert_eq!(probe(&w), Probe::Free, "{what}: nothing holds the lock yet");

        let held = stick(&w, lock);
        let Probe::Held(info) = probe(&w) else {
            panic!("{what}: the lock of a killed apply is not read as held")
        };
        assert_eq!(info.id, held["ID"].as_str().unwrap(), "{what}");
        assert_eq!(info.who, held["Who"].as_str().unwrap(), "{what}");
        assert_eq!(info.version, tf.version(), "{what}");
        assert_eq!(
            info.created_ms,
            Some(pods::parse_rfc3339_ms(held["Created"].as_str().unwrap())),
            "{what}"
        );
        assert_eq!(
            w.held().as_ref(),
            Some(&held),
            "{what}: the probe changed nothing"
        );

        let unlock = w.terraform(&["force-unlock", "-force", &info.id]);
        assert!(unlock.status.success(), "{what}: {}", text(&unlock));
        assert_eq!(w.held(), None, "{what}");
        assert_eq!(probe(&w), Probe::Free, "{what}: released");

        // Unreadable: the backend stops answering. Once per version, with one attempt per
        // request (1.11.4's default of 5 takes about 9 s).
        if lock == S3Lock::Table {
            let mut args = vec![
                "init".to_string(),
                "-reconfigure".into(),
                "-input=false".into(),
                "-no-color".into(),
                common::terraform::plugin_dir_arg(),
                "-backend-config=max_retries=1".into(),
            ];
            args.extend(tf.s3_backend_config(&w.moto.endpoint(), lock));
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let init = w.terraform(&args);
            assert!(init.status.success(), "{what}: {}", text(&init));
            w.moto.stop();
            let p = probe(&w);
            assert!(
                matches!(p, Probe::Unreadable(_)),
                "{what}, moto stopped: {p:?}"
            );
        }
    }
}

each_terraform!(
    a_freed_locks_record_is_removed_by_the_next_runs_recovery_and_tfinit_recover_exits_0
);

/// Finding 4: a pod dies mid-apply, a person releases its lock by hand; the lock is free, its
/// record is not. The probe reads the lock free on every version and lock kind: the next run in
/// the directory removes the record, and `tfinit recover` exits 0. Before the release, the same
/// probe reads the lock as the dead run's (a dry run would release exactly that lock).
fn a_freed_locks_record_is_removed_by_the_next_runs_recovery_and_tfinit_recover_exits_0(
    tf: &Terraform,
) {
    if !have_deps() {
        return;
    }
    let kinds = if tf.s3_lock_object() {
        vec![S3Lock::Table, S3Lock::Object]
    } else {
        vec![S3Lock::Table]
    };
    for lock in kinds {
        let w = S3World::with(&format!("freed-{lock:?}"), tf, lock);
        let what = format!("terraform {} with {lock:?}", tf.version());
        let (mut pod_a, _) = pod_a_mid_apply(&w, "pod-a", Some(NOBODY_UID), false);
        pod_a.kill();
        let held = w.held().expect("the killed pod's lock is stuck");
        let id = held["ID"].as_str().unwrap();

        let o = pods::recover_by_hand(&w, &["--dry-run"], &[]);
        assert_eq!(o.status.code(), Some(0), "{what}: {}", text(&o));
        assert!(
            text(&o).contains(&format!("would force-unlock lock {id}")),
            "{what}: the held lock is read as the dead run's: {}",
            text(&o)
        );

        // A person releases it.
        let unlock = w.terraform(&["force-unlock", "-force", id]);
        assert!(unlock.status.success(), "{what}: {}", text(&unlock));
        assert_eq!(w.held(), None, "{what}");
        assert_eq!(w.records().len(), 1, "{what}: the record outlives the lock");
        let o = pods::recover_by_hand(&w, &["--dry-run"], &[]);
        assert_eq!(o.status.code(), Some(0), "{what}: {}", text(&o));
        assert!(
            text(&o).contains("lock free; record would be removed"),
            "{what}: {}",
            text(&o)
        );

        // The next run in the directory: its recovery reads the lock free and removes the record.
        let out = w.tmp.join("pod-b.out");
        let mut pod_b = Pod::start(
            &w,
            PodSpec {
                name: "pod-b",
                uid: Some(NOBODY_UID),
                script: apply_once(&out, ""),
                env: vec![("TF_VAR_sleep", "0".into())],
            },
        );
        pod_b.wait();
        let log = pod_b.log();
        assert!(
            common::read(&out).starts_with("done 0 "),
            "{what}: {}\n{log}",
            common::read(&out)
        );
        assert!(
            log.contains("the state lock is free; record removed"),
            "{what}: {log}"
        );
        assert!(w.records().is_empty(), "{what}: {:?}", w.records());

        let o = pods::recover_by_hand(&w, &[], &[]);
        assert_eq!(o.status.code(), Some(0), "{what}: {}", text(&o));
        assert!(
            text(&o).contains("no lock-owner records"),
            "{what}: {}",
            text(&o)
        );
        w.assert_state_consistent();
    }
}

/// A terraform whose probe answers in words no release prints: the record is kept (never read as
/// free), the lock untouched, the init says it once for the record although two runs probed, and
/// the metric counts both probes; `tfinit recover` exits 1 and says why. The same record with
/// the real terraform is recovered (the odd answer was the only reason).
#[test]
fn an_answer_in_a_wording_tfinit_does_not_know_keeps_the_record_is_said_once_and_counted() {
    if !have_deps() {
        return;
    }
    let Some(tf) = Terraform::legacy() else {
        return;
    };
    let mut w = S3World::new("odd-wording");
    let (mut pod_a, _) = pod_a_mid_apply(&w, "pod-a", Some(NOBODY_UID), false);
    pod_a.kill();
    let held = w.held().expect("the killed pod's lock is stuck");

    let odd = w.tmp.join("odd");
    std::fs::create_dir_all(&odd).unwrap();
    let said = "Failed to unlock state: the lock service says maybe";
    std::fs::write(
        odd.join("terraform"),
        format!(
            "#!/bin/sh\nif [ \"$1\" = force-unlock ]; then echo '{said}' >&2; exit 1; fi\nexec {} \"$@\"\n",
            tf.path().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        odd.join("terraform"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    w.give_to_pods();
    w.place.terraform_dir = odd;

    let out = w.tmp.join("pod-b");
    let metrics = w.tmp.join("pod-b.metrics");
    let apply = |n: u32| {
        format!(
            "terraform apply -auto-approve -input=false -no-color -lock-timeout=0s > {}.{n} 2>&1",
            out.display()
        )
    };
    let mut pod_b = Pod::start(
        &w,
        PodSpec {
            name: "pod-b",
            uid: Some(NOBODY_UID),
            script: format!(
                "{}; {}; \"$TFINIT_TEST_BIN\" metrics > {} 2>&1",
                apply(1),
                apply(2),
                metrics.display()
            ),
            env: vec![
                ("TF_VAR_sleep", "0".into()),
                ("TFINIT_TEST_BIN", common::tfinit().display().to_string()),
            ],
        },
    );
    pod_b.wait();
    let log = pod_b.log();
    assert_eq!(
        log.matches("lock recovery finished").count(),
        2,
        "both runs probed first: {log}"
    );
    for n in [1, 2] {
        let run = common::read(&w.tmp.join(&format!("pod-b.{n}")));
        assert!(
            run.contains("Error acquiring the state lock"),
            "run {n} met the lock: {run}"
        );
    }
    assert_eq!(
        log.matches("answered the lock probe for the record")
            .count(),
        1,
        "said once for the record: {log}"
    );
    let line = log
        .lines()
        .find(|l| l.contains("answered the lock probe for the record"))
        .unwrap();
    assert!(line.contains(said), "{line}");
    let scraped = common::read(&metrics);
    let value = |series: &str| -> Option<f64> {
        scraped
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    };
    assert_eq!(
        value("tfinit_lock_probe_unknown_wording_total{backend=\"s3\"}"),
        Some(2.0),
        "{scraped}"
    );
    assert_eq!(
        value("tfinit_force_unlocks_total{backend=\"s3\",outcome=\"unknown\"}"),
        Some(2.0),
        "{scraped}"
    );
    assert_eq!(w.records().len(), 1, "the record is kept");
    assert_eq!(w.held(), Some(held.clone()), "the lock is untouched");

    let o = pods::recover_by_hand(&w, &[], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("in a wording this tfinit does not know ({said})")),
        "{}",
        text(&o)
    );
    assert_eq!(w.records().len(), 1);

    // The same record with the real terraform: the dead run's lock, released.
    w.place.terraform_dir = tf.dir();
    let o = pods::recover_by_hand(&w, &[], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains(&format!(
            "force-unlocked lock {}",
            held["ID"].as_str().unwrap()
        )),
        "{}",
        text(&o)
    );
    assert!(w.records().is_empty());
    assert_eq!(w.held(), None);
}
