//! The harness of tests/storage.rs: tfinit as PID 1 with its TFINIT_STATE_DIR on a FUSE
//! passthrough (tests/common/fuse.rs), a controller stand-in that records its signals and a
//! stand-in terraform started through the shim.
#![allow(dead_code)]

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::common::fuse::DelayFs;
use crate::common::{self, wait_for, TempDir};
use crate::slow::{self, now_unix, Budget, Shape, SlowInit, Spec};

/// How late a signal to the init may reach the controller.
pub const FORWARD: Duration = Duration::from_millis(500);
/// How long `tfinit status` may take to answer.
pub const STATUS: Duration = Duration::from_secs(1);
/// The most the init may take to exit after the last process: its wait for queued writes
/// (at most 1 s), plus 1 s for its teardown and for this test to see it gone on a loaded
/// machine (a CI-like run at load average 9 saw 1.31 s: "tfinit exiting" at 1.012 s). An init
/// that waited for the hung volume would take 20 s and more: the bound still tells them apart.
pub const GONE: f64 = 2.0;
/// Bound for steps that take seconds on a slow volume (opening it at 1 s per operation).
pub const SLOW_STEP: Duration = Duration::from_secs(90);
/// The message of a run whose record did not land in time.
pub const TIMED_OUT: &str = "the state volume did not answer within TFINIT_RECORD_TIMEOUT";
/// The refusal of a locking run before any heartbeat of the init landed.
pub const UNSEEN: &str = "which has not answered since the init started";

/// The stand-in terraform. Notes its start (`$FAKE_DIR/$FAKE_NAME.started`, Unix time), copies
/// the records on disk (the backing directory) into `$FAKE_DIR/$FAKE_NAME.records/`, then runs
/// the sh snippet `$FAKE_DO`.
pub const FAKE: &str = r#"#!/bin/sh
mkdir -p "$FAKE_DIR/$FAKE_NAME.records"
cp "$BACKING"/records/*.json "$FAKE_DIR/$FAKE_NAME.records/" 2>/dev/null
date +%s.%N > "$FAKE_DIR/$FAKE_NAME.started"
eval "$FAKE_DO"
"#;

/// One test's world: the FUSE state volume, the init, the stand-in terraform, the controller's
/// signal log.
pub struct FusePod {
    pub init: SlowInit,
    pub fs: DelayFs,
    pub tmp: TempDir,
    pub signals: PathBuf,
}

/// What a test changes in the init's set-up.
pub struct Setup {
    pub ttl: &'static str,
    pub record_timeout: &'static str,
    pub budget: Budget,
    /// The controller as an sh script (it sees $HELPER, $SIGNALS, $FAKE_DIR); it must end in
    /// `exec "$HELPER" signals "$SIGNALS" --exit-on TERM`.
    pub controller: &'static str,
}

pub const SIGNALS_ONLY: &str = r#"exec "$HELPER" signals "$SIGNALS" --exit-on TERM"#;

impl Default for Setup {
    fn default() -> Setup {
        Setup {
            ttl: "60s",
            record_timeout: "30s",
            budget: Budget {
                grace: 20.0,
                stop: 5.0,
                margin: 1.0,
            },
            controller: SIGNALS_ONLY,
        }
    }
}

impl FusePod {
    /// Starts the init with its state directory on `fs`; waits until the controller is ready.
    pub fn start(name: &str, fs: DelayFs, setup: Setup) -> FusePod {
        let tmp = TempDir::new(name);
        let fake = tmp.join("fake");
        std::fs::create_dir_all(&fake).unwrap();
        std::fs::write(fake.join("terraform"), FAKE).unwrap();
        std::fs::set_permissions(
            fake.join("terraform"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        let signals = tmp.join("signals");
        let main: Vec<OsString> = ["sh", "-c", setup.controller]
            .iter()
            .map(OsString::from)
            .collect();
        let s = |p: &Path| p.display().to_string();
        let init = SlowInit::start(
            &tmp,
            Spec {
                cwd: &tmp.0,
                terraform_dir: fake,
                shape: Shape::SingleProcess,
                budget: setup.budget,
                env: vec![
                    ("TFINIT_STATE_DIR", s(&fs.mount)),
                    ("TFINIT_OWNER_TTL", setup.ttl.into()),
                    ("TFINIT_RECORD_TIMEOUT", setup.record_timeout.into()),
                    ("HELPER", s(&common::helper())),
                    ("SIGNALS", s(&signals)),
                    ("FAKE_DIR", s(&tmp.0)),
                ],
                main,
            },
        );
        let pod = FusePod {
            init,
            fs,
            tmp,
            signals,
        };
        wait_for(
            Duration::from_secs(20),
            "the controller to be ready",
            || {
                common::read(&pod.signals)
                    .contains("ready main")
                    .then_some(())
            },
        );
        pod
    }

    /// Waits until the init has opened its records (the issue's runs start after that).
    pub fn records_enabled(&self) {
        self.wait_logged("lock-owner records enabled", SLOW_STEP);
    }

    /// Starts `terraform ARGS` through the shim in a fresh working directory `dir` (named after
    /// the run): the stand-in runs `then` (sh).
    pub fn run(&self, name: &str, args: &[&str], then: &str) -> Shim {
        let dir = self.tmp.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let mut c = self.init.shim_command(&dir, &args);
        c.env("FAKE_DIR", &self.tmp.0)
            .env("FAKE_NAME", name)
            .env("FAKE_DO", then)
            .env("BACKING", &self.fs.backing)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        Shim(c.spawn().expect("start the shim"))
    }

    /// When the stand-in of run `name` started (Unix seconds), once it has.
    pub fn started(&self, name: &str) -> Option<f64> {
        common::read(&self.tmp.join(&format!("{name}.started")))
            .trim()
            .parse()
            .ok()
    }

    /// Waits at most `within` for the stand-in of run `name` to start; its start time.
    pub fn wait_started(&self, name: &str, within: Duration) -> f64 {
        wait_for(within, &format!("terraform of run {name} to start"), || {
            self.started(name)
        })
    }

    /// The records that were on disk when run `name`'s terraform started.
    pub fn records_at_start(&self, name: &str) -> Vec<Value> {
        std::fs::read_dir(self.tmp.join(&format!("{name}.records")))
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok())
                    .flat_map(common::pods::records_in)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether run `name` (in its own directory) had a record on disk before terraform started.
    pub fn had_record(&self, name: &str) -> bool {
        let dir = self.tmp.join(name);
        self.records_at_start(name)
            .iter()
            .any(|r| r["workdir"].as_str() == dir.to_str())
    }

    /// How many times the controller got `sig`.
    pub fn got(&self, sig: &str) -> usize {
        let line = format!("main {sig}");
        common::read(&self.signals)
            .lines()
            .filter(|l| *l == line)
            .count()
    }

    /// Sends `sig` to the init and asserts the controller gets it within [`FORWARD`].
    pub fn signal_reaches_controller(&self, sig: Signal, while_: &str) {
        let before = self.got(sig.as_str());
        self.init.signal(sig);
        wait_for(
            FORWARD,
            &format!("{sig} to the init to reach the controller while {while_}"),
            || (self.got(sig.as_str()) > before).then_some(()),
        );
    }

    /// `tfinit status`, asserting it answers within [`STATUS`].
    pub fn status(&self, while_: &str) -> Value {
        let mut c = self.init.client_command(&["status"]);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let child = c.spawn().expect("start tfinit status");
        let start = Instant::now();
        let out = common::wait_output(child, STATUS * 20);
        assert!(
            start.elapsed() <= STATUS,
            "`tfinit status` took {:?} while {while_}; it must answer within {STATUS:?}",
            start.elapsed()
        );
        serde_json::from_slice(&out.stdout).expect("tfinit status prints JSON")
    }

    /// The init's events whose message contains `needle` (new messages are matched by a
    /// substring, as the design fixes them).
    pub fn logged(&self, needle: &str) -> Vec<slow::Event> {
        self.init
            .events()
            .0
            .into_iter()
            .filter(|e| !e.has("stream") && e.message().contains(needle))
            .collect()
    }

    /// Waits at most `within` for an event whose message contains `needle`.
    pub fn wait_logged(&self, needle: &str, within: Duration) -> slow::Event {
        wait_for(within, &format!("the init to log {needle:?}"), || {
            self.logged(needle).into_iter().next()
        })
    }

    /// Waits until the FUSE daemon has read an `op` request on a path starting with `prefix`
    /// (and not a write test) since `since` (Unix seconds); the request's time.
    pub fn wait_op(&self, op: &str, prefix: &str, since: f64, within: Duration) -> f64 {
        wait_for(
            within,
            &format!("a {op} under {prefix} on the volume"),
            || {
                self.fs
                    .ops()
                    .into_iter()
                    .find(|(ts, o, p)| {
                        *ts >= since
                            && o == op
                            && p.starts_with(prefix)
                            && !p.contains("write-test")
                    })
                    .map(|(ts, _, _)| ts)
            },
        )
    }

    /// Asserts the init is gone within [`GONE`] of `last` (Unix seconds: the last process's end).
    pub fn gone_within_a_second_of(&mut self, last: f64, what: &str) {
        while !self.init.exited() {
            assert!(
                now_unix() < last + GONE,
                "the init still runs {:.2}s after {what}; it must be gone within its 1 s wait for writes (and {GONE} s in all). Log:\n{}",
                now_unix() - last,
                self.init.log_tail()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A shim started by [`FusePod::run`]; killed and reaped when dropped.
pub struct Shim(pub Child);

impl Drop for Shim {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Mounts the passthrough, or None (the test skips with one line).
pub fn volume(name: &str) -> Option<DelayFs> {
    if !slow::have_root() {
        return None;
    }
    DelayFs::mount(name)
}

/// Waits for a shim with a deadline; its exit code.
pub fn shim_code(mut shim: Shim, within: Duration, what: &str) -> i32 {
    common::wait_child(&mut shim.0, within, what)
        .code()
        .unwrap_or(-1)
}
