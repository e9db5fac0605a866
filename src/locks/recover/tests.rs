//! The recovery's unit tests: the decision's rules, the release command, and when an owner was
//! last known alive.

use super::*;
use crate::locks::liveness::last_alive_ms;
use crate::locks::lockinfo::LockInfo;
use crate::locks::record::{Ended, FORMAT};
use std::time::Instant;

const T0: u64 = 1_800_000_000_000;

fn rec() -> Record {
    Record {
        v: FORMAT,
        owner: Owner {
            name: "pod-a".into(),
            boot_id: "b".into(),
            started_ms: T0 - 60_000,
            pid: 1,
            pod_uid: None,
            nonce: None,
        },
        who: "@pod-a".into(),
        run_id: "r1".into(),
        cwd: "/tf/x".into(),
        workdir: "/tf/x".into(),
        workspace: "default".into(),
        subcommand: "apply".into(),
        argv: vec!["apply".into()],
        started_ms: T0,
        in_progress: vec![],
        updated_ms: T0,
        ended: None,
        needs_person: None,
        ttl_ms: Some(30_000),
        data_dir: None,
    }
}

fn lock(who: &str, created_ms: Option<u64>) -> LockInfo {
    LockInfo {
        id: "e7f9146b-c044-abab-c58c-2e409467401c".into(),
        who: who.into(),
        created_ms,
        ..Default::default()
    }
}

fn window() -> Window {
    Window {
        not_before_ms: T0 - CLOCK_SKEW.as_millis() as u64,
        not_after_ms: T0 + 30_000 + CLOCK_SKEW.as_millis() as u64,
        live_same_who: None,
        unread: None,
    }
}

#[test]
fn the_dead_runs_own_lock_is_unlocked() {
    assert_eq!(
        decide(&rec(), &lock("@pod-a", Some(T0 + 800)), &window()),
        Decision::Unlock
    );
    // Clock skew: a little before the start still counts.
    assert_eq!(
        decide(&rec(), &lock("@pod-a", Some(T0 - 59_000)), &window()),
        Decision::Unlock
    );
}

#[test]
fn another_who_is_never_unlocked() {
    for who in [
        "root@laptop",
        "@pod-b",
        "root@pod-a",
        "@pod-a ",
        "@POD-A",
        "",
    ] {
        assert!(
            matches!(
                decide(&rec(), &lock(who, Some(T0 + 1)), &window()),
                Decision::NotOurs(_)
            ),
            "{who:?}"
        );
    }
}

#[test]
fn a_lock_created_outside_the_runs_life_is_not_its() {
    assert!(matches!(
        decide(&rec(), &lock("@pod-a", Some(T0 - 61_000)), &window()),
        Decision::NotOurs(_)
    ));
    let late = window().not_after_ms + 1;
    assert!(matches!(
        decide(&rec(), &lock("@pod-a", Some(late)), &window()),
        Decision::NotOurs(_)
    ));
}

#[test]
fn an_unreadable_created_or_odd_id_or_live_twin_leaves_the_lock() {
    assert!(matches!(
        decide(&rec(), &lock("@pod-a", None), &window()),
        Decision::Ambiguous(_)
    ));
    let mut odd = lock("@pod-a", Some(T0 + 1));
    odd.id = "-lock=false".into();
    assert!(matches!(
        decide(&rec(), &odd, &window()),
        Decision::Ambiguous(_)
    ));
    let w = Window {
        live_same_who: Some("r3 of pod-a".into()),
        ..window()
    };
    assert!(matches!(
        decide(&rec(), &lock("@pod-a", Some(T0 + 1)), &w),
        Decision::Ambiguous(_)
    ));
}

#[test]
fn evidence_the_store_did_not_answer_for_decides_nothing() {
    let w = Window {
        unread: Some("the heartbeat of owner pod-a could not be read (503)".into()),
        ..window()
    };
    // Within the window: the dead run's lock on full evidence, ambiguous on partial.
    assert_eq!(
        decide(&rec(), &lock("@pod-a", Some(T0 + 800)), &window()),
        Decision::Unlock
    );
    assert!(matches!(
        decide(&rec(), &lock("@pod-a", Some(T0 + 800)), &w),
        Decision::Ambiguous(m) if m.contains("503")
    ));
    // After the owner's last sign of life as far as was read: not ours on full evidence, but
    // the heartbeat that was not read may move that sign later, so the record is kept.
    let late = lock("@pod-a", Some(window().not_after_ms + 1));
    assert!(matches!(
        decide(&rec(), &late, &window()),
        Decision::NotOurs(_)
    ));
    assert!(matches!(decide(&rec(), &late, &w), Decision::Ambiguous(_)));
    // What needs no read stays decided: another Who, a lock older than the run.
    assert!(matches!(
        decide(&rec(), &lock("@pod-b", Some(T0 + 800)), &w),
        Decision::NotOurs(_)
    ));
    assert!(matches!(
        decide(&rec(), &lock("@pod-a", Some(w.not_before_ms - 1)), &w),
        Decision::NotOurs(_)
    ));
}

#[test]
fn the_release_command_names_the_backends_own_lock() {
    let info = LockInfo {
        id: "11111111-2222-3333-4444-555555555555".into(),
        path: "tfstate/env:/feature/it's/terraform.tfstate".into(),
        ..Default::default()
    };
    let kube = serde_json::json!({"namespace": "crossplane-system", "secret_suffix": "providerconfig-default"});
    assert_eq!(
        release_command("kubernetes", &kube, "feature", &info),
        r#"kubectl -n crossplane-system patch lease lock-tfstate-feature-providerconfig-default --type=merge -p '{"metadata":{"annotations":{"app.terraform.io/lock-info":null}},"spec":{"holderIdentity":null}}'"#
    );
    let s3 = serde_json::json!({"dynamodb_table": "tflock", "dynamodb_endpoint": null});
    assert_eq!(
        release_command("s3", &s3, "feature", &info),
        r#"aws dynamodb delete-item --table-name tflock --key '{"LockID":{"S":"tfstate/env:/feature/it'\''s/terraform.tfstate"}}' --condition-expression 'contains(Info, :id)' --expression-attribute-values '{":id":{"S":"11111111-2222-3333-4444-555555555555"}}'"#
    );
}

#[test]
fn last_alive_comes_from_the_owners_own_stamps_or_its_end() {
    let ttl = Duration::from_secs(30);
    let t0 = T0 - 600_000;
    let mut r = rec();
    r.started_ms = t0;
    r.updated_ms = t0;
    let facts = Facts::of(&r);
    // No heartbeat: only the record's last write, plus one TTL.
    assert_eq!(last_alive_ms(&facts, None, ttl), t0 + 30_000);
    // Its own heartbeat: the last beat plus one TTL.
    let hb = record::Heartbeat {
        v: record::HEARTBEAT_FORMAT,
        owner: r.owner.clone(),
        seq: 4,
        updated_ms: t0 + 20_000,
        holds_lock: true,
        host: String::new(),
        ttl_ms: Some(30_000),
        lock_file: None,
    };
    assert_eq!(last_alive_ms(&facts, Some(&hb), ttl), t0 + 50_000);
    // Another incarnation's heartbeat says nothing about this one.
    let other = record::Heartbeat {
        owner: Owner {
            started_ms: t0 + 5_000,
            ..r.owner.clone()
        },
        ..hb.clone()
    };
    assert_eq!(last_alive_ms(&facts, Some(&other), ttl), t0 + 30_000);
    // Seen dying: exactly then.
    let mut ended = r.clone();
    ended.ended = Some(Ended {
        ms: t0 + 900,
        how: "killed by SIGKILL".into(),
    });
    assert_eq!(last_alive_ms(&Facts::of(&ended), Some(&hb), ttl), t0 + 900);
}

/// The recovery's effects for a unit test: a clock that each terraform run moves on by
/// `terraform_takes`, a data directory of the s3 backend, and a terraform whose probe answers
/// `probe` (every run is logged).
struct FakeEffects {
    now: std::cell::Cell<Instant>,
    terraform_takes: Duration,
    probe: &'static str,
    runs: std::cell::RefCell<Vec<String>>,
}

impl Effects for FakeEffects {
    fn now(&self) -> Instant {
        self.now.get()
    }
    fn sleep(&self, d: Duration) {
        self.now.set(self.now.get() + d);
    }
    fn instant_of(&self, _ns: u64) -> Option<Instant> {
        None
    }
    fn now_ms(&self) -> u64 {
        T0
    }
    fn canonical(&self, path: &Path) -> Option<PathBuf> {
        Some(path.to_path_buf())
    }
    fn data_dir(&self, _data_dir: &Path) -> backend::DataDir {
        backend::DataDir {
            exists: true,
            backend: Some("s3".into()),
            config: Some(serde_json::json!({"bucket": "b", "key": "k"})),
        }
    }
    fn state(
        &self,
        _workdir: &Path,
        _data_dir: Option<&Path>,
        _workspace: &str,
    ) -> crate::locks::state::StateOf {
        crate::locks::state::StateOf::Unsure("a unit test".into())
    }
    fn terraform(
        &self,
        _rec: &Record,
        _data_dir: &Path,
        args: &[&str],
    ) -> Result<(bool, String), String> {
        self.runs.borrow_mut().push(args.join(" "));
        self.now.set(self.now.get() + self.terraform_takes);
        if args.contains(&lockinfo::probe_id("s3")) {
            Ok((false, self.probe.to_string()))
        } else {
            Ok((
                true,
                "Terraform state has been successfully unlocked!".into(),
            ))
        }
    }
}

/// A dead run's record whose lock the probe finds held by it (terraform 1.0.3's s3 output:
/// Who `root@vm`, created 2026-11-21T23:56:11.330Z), a recovery whose right to recover (the
/// Lease store's recovery Lease) is renewed until 1 s after it starts, and a probe that takes
/// `probe_takes`: what the recovery decided, and the terraform runs it made.
fn recover_under_a_lapsing_right(probe_takes: Duration) -> (RecoveryOutcome, Vec<String>) {
    let created = 1_795_305_371_330;
    let mut dead = rec();
    dead.who = "root@vm".into();
    dead.started_ms = created - 1_000;
    dead.owner.started_ms = created - 60_000;
    dead.ended = Some(Ended {
        ms: created + 5_000,
        how: "killed by SIGKILL".into(),
    });
    let start = Instant::now();
    let store = crate::locks::recorder::tests::TestStore::default();
    store.with(|i| {
        i.records.insert(RecordId::file("r1"), dead.clone());
        i.recovery_fence = Some(std::sync::Arc::new(std::sync::Mutex::new(
            start + Duration::from_secs(1),
        )));
    });
    let mut me = dead.owner.clone();
    me.name = "pod-b".into();
    let recovery = Recovery {
        store: Box::new(store),
        me,
        ttl: Duration::from_secs(30),
        older_ttl: Duration::from_secs(30),
        terraform: PathBuf::from("/nonexistent/terraform"),
        dry_run: false,
        live: Vec::new(),
        automatic: false,
        seen: Vec::new(),
    };
    let fx = FakeEffects {
        now: std::cell::Cell::new(start),
        terraform_takes: probe_takes,
        probe: include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/terraform/lock/probe-held.stderr"
        )),
        runs: std::cell::RefCell::new(Vec::new()),
    };
    let mut out = recovery.run_with(&fx, None).expect("the recovery runs");
    assert_eq!(out.len(), 1, "one record decided: {out:?}");
    let (_, _, outcome) = out.remove(0);
    let runs = fx.runs.into_inner();
    (outcome, runs)
}

#[test]
fn nothing_is_released_once_the_right_to_recover_may_have_lapsed() {
    // A quick probe: the right is still held at the release, the dead run's lock is released.
    let (outcome, runs) = recover_under_a_lapsing_right(Duration::from_millis(100));
    assert!(
        matches!(outcome, RecoveryOutcome::Unlocked(_)),
        "{outcome:?}"
    );
    assert_eq!(runs.len(), 2, "the probe, then the force-unlock: {runs:?}");
    // A probe slower than the right's renewal margin (renewals failing meanwhile): another pod
    // may hold the right by now, so nothing is released and the next recovery decides again.
    let (outcome, runs) = recover_under_a_lapsing_right(Duration::from_secs(2));
    assert!(
        matches!(&outcome, RecoveryOutcome::Unknown(why) if why.contains("not renewed in time")),
        "{outcome:?}"
    );
    assert_eq!(runs.len(), 1, "only the probe ran: {runs:?}");
}

/// The mutation check for `Guard::RecoveryHeld` (the simulation no longer reaches this race
/// since it drives the real launch: docs/reliability.md): turned off, the lapsed right
/// releases the lock.
#[test]
fn mutant_recovery_held_releases_under_a_lapsed_right() {
    let _off = crate::mutation::disable(crate::mutation::Guard::RecoveryHeld);
    let (outcome, runs) = recover_under_a_lapsing_right(Duration::from_secs(2));
    assert!(
        matches!(outcome, RecoveryOutcome::Unlocked(_)),
        "{outcome:?}"
    );
    assert_eq!(runs.len(), 2, "{runs:?}");
}
