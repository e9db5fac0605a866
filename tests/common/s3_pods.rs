//! The s3 lock tests' harness (tests/locks_*.rs, tests/lock_probe.rs): a world of one moto, one
//! terraform working directory initialised by one terraform ([`Terraform`]: 1.0.3 by default, or
//! the modern one) with one kind of lock ([`S3Lock`]), and a shared state dir, where
//! [`common::pods::Pod`]s run.
#![allow(dead_code)]

use crate::common;
use crate::common::moto::Moto;
use crate::common::pods::{self, apply_once, text, Place, Pod, PodSpec, STEP};
pub use crate::common::terraform::{S3Lock, Terraform};
use crate::common::{deps, wait_for};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// TFINIT_OWNER_TTL of the pods (short, so a dead owner is seen dead quickly).
pub const TTL: Duration = Duration::from_secs(3);

pub use crate::common::pods::NOBODY_UID;

/// The state key every test uses (each test has its own moto server).
pub const KEY: &str = "tfinit/terraform.tfstate";

/// The state's lock item in the DynamoDB table (`<bucket>/<key>`).
pub const STATE: &str = "tfstate/tfinit/terraform.tfstate";

/// Whether everything these tests need is here (root, terraform, the null provider, moto).
pub fn have_deps() -> bool {
    common::pods::have_pod_deps("the pods run as uid 4321 (setpriv) on a volume chowned to it")
        && common::require(
            deps().join("venv/bin/moto_server").is_file(),
            ".test-deps/venv/bin/moto_server",
        )
        && common::require(
            Path::new("/usr/bin/setpriv").exists() || Path::new("/bin/setpriv").exists(),
            "setpriv (util-linux)",
        )
}

/// A test's world: one moto, one terraform working directory (initialised), a shared state dir.
pub struct S3World {
    pub place: Place,
    pub moto: Moto,
    /// The terraform that initialised the directory, and that its pods run.
    pub tf: Terraform,
    /// How the state is locked.
    pub lock: S3Lock,
}

impl S3World {
    /// A world of terraform 1.0.3 with the DynamoDB lock table (check [`have_deps`] first).
    pub fn new(name: &str) -> S3World {
        let tf = Terraform::legacy().expect("terraform 1.0.3 of the test dependencies");
        S3World::with(name, &tf, S3Lock::Table)
    }

    /// A world of `tf` whose state is locked by `lock`.
    pub fn with(name: &str, tf: &Terraform, lock: S3Lock) -> S3World {
        let mut place = Place::new(name, Some("s3"), TTL);
        place.terraform_dir = tf.dir();
        if tf.at_least(1, 6) {
            modern_backend_block(&place.ws.join("main.tf"));
        }
        let moto = Moto::start();
        let w = S3World {
            place,
            moto,
            tf: tf.clone(),
            lock,
        };
        let mut args = vec![
            "init".to_string(),
            "-input=false".into(),
            "-no-color".into(),
            format!("-plugin-dir={}", deps().join("plugins").display()),
        ];
        args.extend(tf.s3_backend_config(&w.moto.endpoint(), lock));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = w.terraform(&args);
        assert!(
            out.status.success(),
            "terraform {} init: {}",
            tf.version(),
            text(&out)
        );
        // Pods may run as a uid without a passwd entry.
        w.give_to_pods();
        w
    }

    /// Runs the real terraform directly (not through tfinit) in the working directory, as root.
    pub fn terraform(&self, args: &[&str]) -> std::process::Output {
        let mut c = self.terraform_command(args);
        common::run_output(&mut c, STEP)
    }

    /// The lock held on the state, as the backend stores it (the table's item or the lock
    /// object, whichever this world's lock has; the table's first when both).
    pub fn held(&self) -> Option<Value> {
        let table = || self.moto.lock(STATE);
        let object = || self.moto.lock_object(KEY);
        match self.lock {
            S3Lock::Table => table(),
            S3Lock::Object => object(),
            S3Lock::Both => table().or_else(object),
        }
    }

    /// Asserts the state is whole: no lock, nothing left to do, every resource in it.
    pub fn assert_state_consistent(&self) {
        assert_eq!(self.moto.lock(STATE), None, "the lock must be free");
        assert_eq!(
            self.moto.lock_object(KEY),
            None,
            "the lock object must be gone"
        );
        let locks: Vec<_> = self
            .moto
            .items()
            .into_iter()
            .filter(|i| !i["LockID"]["S"].as_str().unwrap_or("").ends_with("-md5"))
            .collect();
        assert!(locks.is_empty(), "lock table: {locks:?}");
        let plan = self.terraform(&[
            "plan",
            "-detailed-exitcode",
            "-input=false",
            "-no-color",
            "-lock-timeout=0s",
        ]);
        assert_eq!(
            plan.status.code(),
            Some(0),
            "plan must find nothing to do: {}",
            text(&plan)
        );
        let list = self.terraform(&["state", "list"]);
        let names = String::from_utf8_lossy(&list.stdout).to_string();
        for r in ["null_resource.a", "null_resource.b", "null_resource.c"] {
            assert!(names.lines().any(|l| l == r), "{r} in state: {names}");
        }
    }

    /// Writes a record file by hand (the format of docs/records.md).
    pub fn plant_record(&self, file: &str, rec: &Value) -> PathBuf {
        pods::plant_record(&self.state, NOBODY_UID, file, rec)
    }

    /// Writes an owner's heartbeat by hand.
    pub fn plant_heartbeat(&self, owner: &str, hb: &Value) {
        pods::plant_heartbeat(&self.state, NOBODY_UID, owner, hb)
    }
}

/// Takes out of the fixture's backend block (written for 1.0.3, as tests/locks_*.rs and other
/// directories initialised like it use it) what 1.6 and later name or choose otherwise:
/// `force_path_style` (deprecated, and refused beside `use_path_style`) and `dynamodb_table`
/// (the world's lock decides). [`Terraform::s3_backend_config`] passes them in their new form.
fn modern_backend_block(main_tf: &Path) {
    let text = std::fs::read_to_string(main_tf).expect("read the fixture's main.tf");
    let drop = ["dynamodb_table", "force_path_style"];
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| !drop.iter().any(|d| l.trim_start().starts_with(d)))
        .collect();
    assert_eq!(
        text.lines().count() - kept.len(),
        drop.len(),
        "tests/fixtures/s3/main.tf sets {drop:?} once each"
    );
    std::fs::write(main_tf, kept.join("\n") + "\n").expect("write main.tf");
}

impl std::ops::Deref for S3World {
    type Target = Place;
    fn deref(&self) -> &Place {
        &self.place
    }
}

/// Starts pod-a's apply and waits until it holds the lock with null_resource.a creating (b done,
/// c not started) and its record says so.
pub fn pod_a_mid_apply(
    w: &S3World,
    name: &str,
    uid: Option<u32>,
    json_output: bool,
) -> (Pod, Value) {
    let mut flags = String::from("-var=token=hunter2");
    if json_output {
        flags.push_str(" -json");
    }
    let pod = Pod::start(
        w,
        PodSpec {
            name,
            uid,
            script: apply_once(&w.tmp.join("pod-a.out"), &flags),
            env: vec![
                ("TF_VAR_sleep", "30".into()),
                ("TF_VAR_undeclared_secret", "envsecret42".into()),
                ("AWS_SECRET_ACCESS_KEY", "envsecret43".into()),
            ],
        },
    );
    let rec = w.wait_in_progress("pod-a", &["null_resource.a"]);
    wait_for(STEP, "pod-a's lock in the backend", || w.held());
    (pod, rec)
}

/// `tfinit recover ARGS` by hand, its output.
pub fn recover_by_hand(w: &S3World, args: &[&str]) -> String {
    text(&pods::recover_by_hand(w, args, &[]))
}
