//! tfinit never waits on its state volume (issue 13): TFINIT_STATE_DIR on a FUSE passthrough
//! (tests/common/fuse.rs) that is slow, hung, holding a request or failing one directory, while
//! tfinit runs as PID 1 of a PID namespace with a controller stand-in that records the signals it
//! gets (`tfinit-test-helper signals`) and a stand-in terraform (an sh script) started through the
//! shim. Every bound is the configuration's own: a signal reaches the controller within
//! [`FORWARD`], `status` answers within [`STATUS`], the init is gone within TFINIT's exit wait
//! (1 s) of the last process. What is on disk is read in the backing directory, never through
//! the mount, so a hung mount cannot hang the test.

mod common;
#[path = "common/fuse_pod.rs"]
mod fuse_pod;
#[path = "fixtures/slow/mod.rs"]
mod slow;

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use common::fuse::{DelayFs, Rules};
use common::wait_for;
use fuse_pod::*;
use slow::{now_unix, Budget};

// ----- 1 s per operation -----

/// At 1 s per operation (a record write takes 4 s): while a state-locking run is being recorded,
/// SIGUSR1 and SIGTERM reach the controller within 0.5 s, `status` answers within 1 s and shows
/// the run `recording`, the record is on disk before terraform starts, and a run still
/// `recording` at shutdown is refused with 75 and never started.
#[test]
fn at_1s_per_operation_signals_and_status_stay_prompt_while_a_record_is_written() {
    let Some(fs) = volume("slow-record") else {
        return;
    };
    fs.set(&Rules::delay(Duration::from_secs(1)));
    let pod = FusePod::start("slow-record", fs, Setup::default());
    pod.records_enabled();
    let t0 = now_unix();
    let _first = pod.run("first", &["apply", "-auto-approve"], "sleep 60");
    pod.wait_op("create", "/records/", t0, Duration::from_secs(10));
    pod.signal_reaches_controller(Signal::SIGUSR1, "a record is being written");
    let status = pod.status("a record is being written");
    let runs = status["runs"].as_array().cloned().unwrap_or_default();
    assert_eq!(runs.len(), 1, "{status}");
    assert_eq!(runs[0]["state"], "recording", "{status}");
    pod.wait_started("first", SLOW_STEP);
    assert!(
        pod.had_record("first"),
        "the record of a locking run is on disk before terraform starts; on disk then: {:?}",
        pod.records_at_start("first")
    );

    let t1 = now_unix();
    let second = pod.run("second", &["plan"], "exit 0");
    pod.wait_op("create", "/records/", t1, Duration::from_secs(10));
    pod.signal_reaches_controller(Signal::SIGTERM, "a record is being written");
    assert_eq!(
        shim_code(second, Duration::from_secs(10), "the recording run's shim"),
        75,
        "a run still recording at shutdown is refused with 75; log:\n{}",
        pod.init.log_tail()
    );
    assert!(
        pod.started("second").is_none(),
        "a run refused at shutdown never starts terraform"
    );
}

/// At 1 s per operation, while the heartbeat is being written: SIGUSR1 and SIGTERM reach the
/// controller within 0.5 s and `status` answers within 1 s.
#[test]
fn at_1s_per_operation_signals_and_status_stay_prompt_while_the_heartbeat_is_written() {
    let Some(fs) = volume("slow-heartbeat") else {
        return;
    };
    fs.set(&Rules::delay(Duration::from_secs(1)));
    // TTL 15 s: a heartbeat every 5 s.
    let pod = FusePod::start(
        "slow-heartbeat",
        fs,
        Setup {
            ttl: "15s",
            ..Setup::default()
        },
    );
    pod.records_enabled();
    let t0 = now_unix();
    pod.wait_op("create", "/owners/", t0, Duration::from_secs(30));
    pod.signal_reaches_controller(Signal::SIGUSR1, "the heartbeat is being written");
    pod.status("the heartbeat is being written");
    pod.signal_reaches_controller(Signal::SIGTERM, "the heartbeat is being written");
}

/// At 1 s per operation, with the record's progress being rewritten all the time (a resource
/// starts every 0.3 s): the one graceful SIGTERM to terraform comes at grace - stop timeout after
/// the stop signal, ± 1 s.
#[test]
fn at_1s_per_operation_the_graceful_sigterm_comes_on_time() {
    let Some(fs) = volume("slow-timeline") else {
        return;
    };
    fs.set(&Rules::delay(Duration::from_secs(1)));
    let budget = Budget {
        grace: 12.0,
        stop: 6.0,
        margin: 1.0,
    };
    let pod = FusePod::start(
        "slow-timeline",
        fs,
        Setup {
            budget,
            ..Setup::default()
        },
    );
    pod.records_enabled();
    let _run = pod.run(
        "busy",
        &["apply", "-auto-approve"],
        r#"i=0; while :; do echo "null_resource.r$i: Creating..."; i=$((i+1)); sleep 0.3; done"#,
    );
    let started = pod.wait_started("busy", SLOW_STEP);
    pod.wait_op("create", "/records/", started, Duration::from_secs(10));
    let sent = now_unix();
    pod.init.signal(Signal::SIGTERM);
    let due = sent + budget.grace - budget.stop;
    let term = pod
        .init
        .wait_event(Duration::from_secs(30), "SIGTERM to terraform");
    assert!(
        (term.ts - due).abs() <= 1.0,
        "the graceful SIGTERM came {:+.2}s from its time (stop signal + grace - stop timeout); log:\n{}",
        term.ts - due,
        pod.init.log_tail()
    );
}

// ----- hung volume -----

/// The volume hangs from before the init starts (the daemon reads nothing): the controller starts
/// and gets its signals, `terraform version` runs at once, 200 orphans are reaped; a state-locking
/// run is refused (75) after TFINIT_RECORD_TIMEOUT, and the next one at once, since no heartbeat
/// of this pod is on the volume (another pod could take its lock for a dead earlier run's, with
/// the same Who); once the volume answers, a locking run starts with its record; after SIGTERM the
/// init is gone within 1 s of the last process.
#[test]
fn hung_from_the_start_nothing_waits_and_a_locking_run_is_refused_until_the_volume_answers() {
    let Some(fs) = volume("hung-start") else {
        return;
    };
    fs.hang();
    let mut pod = FusePod::start(
        "hung-start",
        fs,
        Setup {
            record_timeout: "2s",
            controller: r#""$HELPER" orphans 200 --deadline-s 10 > "$FAKE_DIR/orphans"; echo "exit $?" >> "$FAKE_DIR/orphans"; exec "$HELPER" signals "$SIGNALS" --exit-on TERM"#,
            ..Setup::default()
        },
    );
    let orphans = common::read(&pod.tmp.join("orphans"));
    assert!(
        orphans.contains("zombies=0") && orphans.contains("exit 0"),
        "200 orphans reaped: {orphans}"
    );
    pod.signal_reaches_controller(Signal::SIGUSR1, "the state volume hangs");

    let sent = Instant::now();
    let version = pod.run("version", &["version"], "exit 0");
    assert_eq!(
        shim_code(version, Duration::from_secs(10), "terraform version"),
        0
    );
    // Anything that waited for the hung volume would wait the whole TFINIT_RECORD_TIMEOUT (2 s):
    // that is the bound, not a guess at how fast a loaded machine starts a process.
    assert!(
        sent.elapsed() < Duration::from_secs(2),
        "`terraform version` takes no lock and runs at once, not after the record timeout: {:?}",
        sent.elapsed()
    );

    let sent = Instant::now();
    let first = pod.run("first", &["apply", "-auto-approve"], "exit 0");
    assert_eq!(
        shim_code(first, Duration::from_secs(10), "the first apply"),
        75,
        "refused: the init is not on the volume yet"
    );
    let waited = sent.elapsed();
    assert!(
        waited >= Duration::from_secs(2),
        "a locking run waits TFINIT_RECORD_TIMEOUT (2s) for the volume first: {waited:?}"
    );
    assert_eq!(pod.started("first"), None, "terraform never started");
    assert!(
        !pod.logged(UNSEEN).is_empty(),
        "{UNSEEN:?} logged:\n{}",
        pod.init.log_tail()
    );
    assert!(
        pod.logged(TIMED_OUT).is_empty(),
        "no \"starts without a record\": nothing starts:\n{}",
        pod.init.log_tail()
    );
    let sent = Instant::now();
    let next = pod.run("next", &["apply", "-auto-approve"], "exit 0");
    assert_eq!(
        shim_code(next, Duration::from_secs(10), "the next apply"),
        75
    );
    assert!(
        sent.elapsed() < Duration::from_secs(2),
        "once the volume did not answer, the next locking run is refused at once, not after {:?}",
        sent.elapsed()
    );

    // The volume answers: the store opens, and a locking run starts with its record.
    pod.fs.resume();
    pod.records_enabled();
    let last = pod.run("last", &["apply", "-auto-approve"], "exit 0");
    pod.wait_started("last", Duration::from_secs(20));
    assert_eq!(
        shim_code(
            last,
            Duration::from_secs(10),
            "the apply after the volume answered"
        ),
        0
    );
    assert!(pod.had_record("last"), "its record was written first");

    pod.signal_reaches_controller(Signal::SIGTERM, "the state volume answers");
    let exited = pod
        .init
        .wait_event(Duration::from_secs(10), "controller exited");
    pod.gone_within_a_second_of(exited.ts, "the controller exited");
}

/// The volume hangs mid-apply, after the run's record was written: SIGTERM still reaches the
/// controller, the apply finishes, and the init is gone within 1 s of it although the record's
/// removal cannot be written.
#[test]
fn hung_mid_apply_the_init_exits_within_a_second_of_the_last_process() {
    let Some(fs) = volume("hung-mid") else {
        return;
    };
    let mut pod = FusePod::start("hung-mid", fs, Setup::default());
    pod.records_enabled();
    let run = pod.run("apply", &["apply", "-auto-approve"], "sleep 3");
    pod.wait_started("apply", Duration::from_secs(20));
    assert!(pod.had_record("apply"), "the record was written first");
    pod.fs.hang();
    pod.signal_reaches_controller(Signal::SIGTERM, "the state volume hangs");
    let exited = pod
        .init
        .wait_event(Duration::from_secs(20), "terraform exited");
    assert_eq!(
        exited.str("exit"),
        Some("exit code 0"),
        "the apply finished"
    );
    pod.gone_within_a_second_of(exited.ts, "terraform exited");
    drop(run);
}

/// A request the daemon has read and keeps (the record's removal) cannot be interrupted by
/// anything, not even SIGKILL (fs/fuse/dev.c waits it out), so the process cannot end while it
/// is held. What tfinit controls is that it gives up on it: "tfinit exiting" is logged within 1 s
/// of the last process. That alone is asserted; the init ends once the request is answered.
#[test]
fn a_held_request_does_not_keep_the_init_from_exiting() {
    let Some(fs) = volume("held") else {
        return;
    };
    let mut pod = FusePod::start("held", fs, Setup::default());
    pod.records_enabled();
    let _run = pod.run("apply", &["apply", "-auto-approve"], "sleep 2");
    pod.wait_started("apply", Duration::from_secs(20));
    assert!(pod.had_record("apply"), "the record was written first");
    pod.fs.set(&Rules {
        hold: vec!["/records/"],
        ..Rules::default()
    });
    pod.init.signal(Signal::SIGTERM);
    let exited = pod
        .init
        .wait_event(Duration::from_secs(20), "terraform exited");
    let exiting = wait_for(Duration::from_secs(5), "\"tfinit exiting\"", || {
        pod.init.events().first("tfinit exiting").cloned()
    });
    assert!(
        exiting.ts - exited.ts <= GONE,
        "\"tfinit exiting\" came {:.2}s after terraform's exit; it must come within 1 s",
        exiting.ts - exited.ts
    );
    pod.fs.set(&Rules::default());
    pod.init.wait(Duration::from_secs(20));
}

// ----- the heartbeat failing -----

/// `owners/` fails or hangs while a record is on the volume: one error, `status` shows the
/// heartbeat's age, the next locking run starts without a record (with a warning), and records
/// resume once the heartbeat is written again.
fn heartbeat_failing(name: &str, broken: Rules) {
    let Some(fs) = volume(name) else {
        return;
    };
    // TTL 3 s: a heartbeat every second, stale after 1.5 s.
    let pod = FusePod::start(
        name,
        fs,
        Setup {
            ttl: "3s",
            ..Setup::default()
        },
    );
    pod.records_enabled();
    let _long = pod.run("long", &["apply", "-auto-approve"], "sleep 60");
    pod.wait_started("long", Duration::from_secs(20));
    assert!(pod.had_record("long"), "a record is on the volume");
    pod.fs.set(&broken);
    pod.wait_logged(
        "heartbeat has not been written for",
        Duration::from_secs(10),
    );
    let status = pod.status("the heartbeat fails");
    assert_eq!(status["records"]["state"], "heartbeat_stale", "{status}");
    let age = status["records"]["heartbeat_age_seconds"].as_f64();
    assert!(
        age.is_some_and(|a| a >= 1.5),
        "status shows the heartbeat's age (>= TTL/2): {status}"
    );
    let stale = pod.run("stale", &["apply", "-auto-approve"], "exit 0");
    assert_eq!(
        shim_code(stale, Duration::from_secs(10), "a run while stale"),
        0
    );
    assert!(
        !pod.had_record("stale"),
        "a run while the heartbeat is stale gets no record"
    );
    assert!(
        !pod.logged("heartbeat is stale").is_empty(),
        "the unrecorded run is warned about; log:\n{}",
        pod.init.log_tail()
    );

    pod.fs.set(&Rules::default());
    pod.wait_logged("heartbeat written again", Duration::from_secs(10));
    let again = pod.run("again", &["apply", "-auto-approve"], "exit 0");
    assert_eq!(
        shim_code(again, Duration::from_secs(10), "a run after recovery"),
        0
    );
    assert!(pod.had_record("again"), "records resume with the heartbeat");
    let errors = pod.logged("heartbeat has not been written for").len();
    assert_eq!(errors, 1, "one error per failure, not one per heartbeat");
}

#[test]
fn a_failing_heartbeat_is_one_error_and_new_runs_go_unrecorded_until_it_is_written_again() {
    heartbeat_failing(
        "hb-fail",
        Rules {
            fail: vec!["/owners/"],
            ..Rules::default()
        },
    );
}

#[test]
fn a_hung_heartbeat_is_one_error_and_new_runs_go_unrecorded_until_it_is_written_again() {
    heartbeat_failing(
        "hb-hang",
        Rules {
            hold: vec!["/owners/"],
            ..Rules::default()
        },
    );
}

/// The fence (issue 18): a pod whose heartbeat does not land stops its runs with records before
/// any other pod may call it dead: the graceful SIGTERM at 2/3 of the TTL after its last good
/// heartbeat, one error naming the runs. With TTL 3 s the last good beat started at most 1 s (plus
/// a write) before the volume broke, so the SIGTERM comes 1 to 2 s after that; other pods need a
/// full TTL of watching. Meanwhile no state-locking run starts (75); one that takes no lock does.
#[test]
fn a_heartbeat_that_does_not_land_stops_the_recorded_runs_before_another_pod_may_call_this_one_dead(
) {
    let Some(fs) = volume("fence") else {
        return;
    };
    let pod = FusePod::start(
        "fence",
        fs,
        Setup {
            ttl: "3s",
            ..Setup::default()
        },
    );
    pod.records_enabled();
    let recorded = pod.run(
        "recorded",
        &["apply", "-auto-approve"],
        r#"trap 'date +%s.%N > "$FAKE_DIR/termed"; exit 0' TERM; while :; do sleep 0.05; done"#,
    );
    pod.wait_started("recorded", Duration::from_secs(20));
    assert!(pod.had_record("recorded"), "a record is on the volume");
    let broken = now_unix();
    pod.fs.set(&Rules {
        fail: vec!["/owners/"],
        ..Rules::default()
    });
    let termed: f64 = wait_for(
        Duration::from_secs(10),
        "the fence's graceful SIGTERM",
        || common::read(&pod.tmp.join("termed")).trim().parse().ok(),
    );
    let after = termed - broken;
    assert!(
        (0.5..2.6).contains(&after),
        "the graceful SIGTERM came {after:.2}s after the heartbeat stopped landing (2/3 of the 3s TTL after the last good one)"
    );
    assert_eq!(
        shim_code(recorded, Duration::from_secs(10), "the fenced run"),
        0,
        "the shim's caller sees terraform's own exit code"
    );
    let fenced = pod.logged("the heartbeat has not landed in the lock-owner record store");
    assert!(!fenced.is_empty(), "{}", pod.init.log_tail());
    // No state-locking run starts while the fence is up, recorded or not: its lock would carry
    // this owner's Who, which other pods may soon release. A run that takes no lock does.
    let refused = pod.run("refused", &["apply", "-auto-approve"], "exit 0");
    assert_eq!(
        shim_code(
            refused,
            Duration::from_secs(10),
            "a locking run while fenced"
        ),
        75
    );
    assert!(pod.started("refused").is_none(), "terraform never started");
    let version = pod.run("version", &["version"], "exit 0");
    assert_eq!(
        shim_code(version, Duration::from_secs(10), "a run that takes no lock"),
        0
    );
    pod.fs.set(&Rules::default());
}

// ----- progress and ordering -----

/// The whole pod is killed 100 ms after terraform printed `X: Creating...`: the record on disk
/// names X.
#[test]
fn a_pod_killed_100ms_after_creating_leaves_a_record_that_names_the_resource() {
    let Some(fs) = volume("pod-killed") else {
        return;
    };
    let mut pod = FusePod::start("pod-killed", fs, Setup::default());
    pod.records_enabled();
    let _run = pod.run(
        "apply",
        &["apply", "-auto-approve"],
        r#"echo "null_resource.x: Creating..."; date +%s.%N > "$FAKE_DIR/printed"; sleep 60"#,
    );
    let printed: f64 = wait_for(Duration::from_secs(20), "the Creating line", || {
        common::read(&pod.tmp.join("printed")).trim().parse().ok()
    });
    let wait = printed + 0.1 - now_unix();
    if wait > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(wait));
    }
    pod.init.signal(Signal::SIGKILL);
    pod.init.wait(Duration::from_secs(20));
    let records = pod.fs.records();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(
        records[0].1["in_progress"],
        serde_json::json!(["null_resource.x"]),
        "the record names the resource being created 100 ms before the pod died"
    );
}

/// A record write that lands after its run ended (the run gave up waiting after
/// TFINIT_RECORD_TIMEOUT and finished) leaves no record behind.
#[test]
fn a_record_that_lands_after_its_run_ended_is_removed() {
    let Some(fs) = volume("late-record") else {
        return;
    };
    let pod = FusePod::start(
        "late-record",
        fs,
        Setup {
            record_timeout: "1s",
            ..Setup::default()
        },
    );
    pod.records_enabled();
    // A record write is now 4 operations of 1 s each: it lands 3 s after the run gave up.
    pod.fs.set(&Rules::delay(Duration::from_secs(1)));
    let t0 = now_unix();
    let run = pod.run("late", &["apply", "-auto-approve"], "exit 0");
    assert_eq!(shim_code(run, Duration::from_secs(20), "the run"), 0);
    assert!(
        !pod.had_record("late"),
        "the run did not wait for its record"
    );
    assert!(
        !pod.logged(TIMED_OUT).is_empty(),
        "{TIMED_OUT:?} logged:\n{}",
        pod.init.log_tail()
    );
    // The scenario really happened: the record landed after the run had ended...
    wait_for(Duration::from_secs(20), "the late record to land", || {
        record_renames(&pod.fs).into_iter().find(|ts| *ts >= t0)
    });
    // ...and it does not stay.
    wait_for(
        Duration::from_secs(20),
        "no record left of the finished run",
        || pod.fs.records().is_empty().then_some(()),
    );
}

/// When the daemon read each rename of a temporary file onto a record (`/records/*.json`).
fn record_renames(fs: &DelayFs) -> Vec<f64> {
    fs.ops()
        .into_iter()
        .filter(|(_, op, paths)| {
            op == "rename"
                && paths
                    .split_once(' ')
                    .is_some_and(|(_, to)| to.starts_with("/records/") && to.ends_with(".json"))
        })
        .map(|(ts, _, _)| ts)
        .collect()
}

/// A run killed in a directory gets its record marked ended; a locking run started right after
/// in the same directory needs a recovery, which starts only once that end-marking is durable
/// (the directory's fsync after its rename returned), and so finds the record ended.
#[test]
fn a_recovery_starts_only_after_the_end_marking_in_its_directory_is_durable() {
    let Some(fs) = volume("recover-order") else {
        return;
    };
    let pod = FusePod::start("recover-order", fs, Setup::default());
    pod.records_enabled();
    let delay = 1.0;
    pod.fs.set(&Rules::delay(Duration::from_secs_f64(delay)));
    let killed = pod.run("dir", &["apply", "-auto-approve"], "kill -9 $$");
    assert_eq!(shim_code(killed, SLOW_STEP, "the killed run"), 128 + 9);
    let next = pod.run("dir", &["apply", "-auto-approve"], "exit 0");
    assert_eq!(shim_code(next, SLOW_STEP, "the next run"), 0);
    let recovery = pod
        .logged("a dead owner's lock-owner record is here")
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("a recovery ran; log:\n{}", pod.init.log_tail()));
    let ops = pod.fs.ops();
    // The killed run's record: created, then marked ended.
    let renamed = *record_renames(&pod.fs)
        .get(1)
        .unwrap_or_else(|| panic!("the end-marking was written: {ops:?}"));
    let durable = ops
        .iter()
        .find(|(ts, op, p)| *ts >= renamed && op == "fsyncdir" && p == "/records")
        .map(|(ts, _, _)| ts + delay)
        .unwrap_or_else(|| panic!("the end-marking's directory fsync: {ops:?}"));
    assert!(
        recovery.ts >= durable,
        "the recovery started {:.2}s before the end-marking was durable",
        durable - recovery.ts
    );
    assert!(
        pod.init
            .all_output()
            .contains("its terraform ended (killed by SIGKILL)"),
        "the recovery found the record ended; log:\n{}",
        pod.init.log_tail()
    );
}
