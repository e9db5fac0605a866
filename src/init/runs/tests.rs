//! The runs' decisions, without a process, a pipe or a socket: requests, the store's answers and
//! the loop's reports go in, actions come out.

use std::num::NonZeroUsize;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::unistd::Pid;

use super::super::action::{Action, Refusal};
use super::super::reaper::Exit;
use super::super::records::Records;
use super::super::shutdown::Phase;
use super::super::spawn::Started;
use super::super::token::ConnId;
use super::super::token::Stream;
use super::{CancelTarget, Force, Runs};
use crate::locks::book::Book;
use crate::locks::liveness::Facts;
use crate::locks::names::RunId;
use crate::locks::record::{Ended, Owner};
use crate::locks::recorder::{Completion, Entry, Request, Table};
use crate::protocol::{self, FileId, RunRequest};

const RECORD_TIMEOUT: Duration = Duration::from_secs(10);
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
const TTL: Duration = Duration::from_secs(30);

fn r(n: u64) -> RunId {
    RunId::from(n)
}

fn c(n: u64) -> ConnId {
    ConnId::from(n)
}

fn runs() -> Runs {
    Runs::new(RECORD_TIMEOUT, STOP_TIMEOUT, None)
}

/// Runs under TFINIT_MAX_RUNS=`max`.
fn capped(max: usize) -> Runs {
    Runs::new(RECORD_TIMEOUT, STOP_TIMEOUT, NonZeroUsize::new(max))
}

/// Records whose store is still opening (nothing is known about it yet).
fn opening(t: Instant) -> Records {
    let book = Book::new(
        Path::new("/state"),
        Owner::current("pod-a", None),
        crate::locks::liveness::Observer::new(TTL, crate::locks::liveness::LONGEST_TTL),
        RECORD_TIMEOUT,
        true,
        "pod-a".into(),
        t,
    );
    Records::for_tests(book)
}

fn table(t: Instant, records: Vec<Entry>) -> Table {
    Table {
        scanned: t,
        records,
        beats: vec![],
        gone: vec![],
        held: Vec::new(),
    }
}

fn opened(t: Instant, records: Vec<Entry>) -> Completion {
    Completion::Opened {
        result: Ok(()),
        table: Some(table(t, records)),
        passwd_user: None,
        beat: Some(t),
        lock: None,
    }
}

/// Records whose store opened at `t` with `records` on it.
fn open(t: Instant, records: Vec<Entry>) -> Records {
    let mut rec = opening(t);
    assert_eq!(rec.feed(opened(t, records), t), vec![]);
    rec
}

/// A record of another owner's run in `workdir` whose terraform was seen dying.
fn dead_record(workdir: &str) -> Entry {
    let owner = Owner {
        name: "pod-old".into(),
        boot_id: "b".into(),
        started_ms: 1,
        pid: 1,
        pod_uid: None,
        nonce: None,
    };
    Entry {
        path: PathBuf::from(format!("/state/records/{workdir}.json")).into(),
        workdir: PathBuf::from(workdir),
        who: "@pod-old".into(),
        facts: Facts {
            owner,
            updated_ms: 2,
            ended: Some(Ended {
                ms: 3,
                how: "killed by SIGKILL".into(),
            }),
            needs_person_by: None,
            ttl: Some(TTL),
        },
    }
}

fn request(args: &[&str], cwd: &str) -> RunRequest {
    RunRequest {
        program: "/usr/bin/terraform".into(),
        argv0: "terraform".into(),
        args: args.iter().map(|a| a.to_string()).collect(),
        cwd: cwd.into(),
        env: vec![],
        workspace: None,
        cwd_id: None,
        workdir_id: None,
    }
}

fn ask(
    runs: &mut Runs,
    conn: u64,
    args: &[&str],
    records: &mut Records,
    t: Instant,
) -> Vec<Action> {
    let req = request(args, "/tf/x");
    runs.request(c(conn), req, None, Phase::Running, records, t)
}

fn null() -> OwnedFd {
    std::fs::File::open("/dev/null").unwrap().into()
}

/// The loop started terraform of `run` as `pid`.
fn start(runs: &mut Runs, run: RunId, pid: i32, records: &mut Records) -> Vec<Action> {
    let (req, _stdin) = runs.launching(run).expect("launching");
    assert_eq!(req.program, "/usr/bin/terraform");
    let started = Started {
        pid: Pid::from_raw(pid),
        stdout: null(),
        stderr: null(),
    };
    runs.spawned(run, Ok(started), records, Instant::now())
}

/// Both pipes of `run` reached their end.
fn close_pipes(runs: &mut Runs, run: RunId, records: &mut Records) -> Vec<Action> {
    let mut acts = Vec::new();
    for s in Stream::BOTH {
        assert!(runs.take_pipe(run, s).is_some());
        acts.extend(runs.pipe_closed(run, records));
    }
    acts
}

fn state(runs: &Runs) -> Vec<(String, String)> {
    runs.statuses()
        .into_iter()
        .map(|s| (s.id, s.state))
        .collect()
}

/// A short name of each action, for comparing sequences.
fn names(acts: &[Action]) -> Vec<String> {
    acts.iter()
        .map(|a| match a {
            Action::Attach { conn, run } => format!("attach {} {run}", conn.number()),
            Action::Answer { conn, note } => format!(
                "answer {} {} {}",
                conn.number(),
                note.code,
                note.run_id.as_deref().unwrap_or("-")
            ),
            Action::Spawn(run) => format!("spawn {run}"),
            Action::Recover { run, args } => {
                format!("recover {run} {}", args.workdir.display())
            }
            Action::Adopt { pid, child } => format!("adopt {} {child:?}", pid.as_raw()),
            Action::Watch(run) => format!("watch {run}"),
            Action::Resume(run) => format!("resume {run}"),
            Action::Drain(run) => format!("drain {run}"),
            Action::Term { run, pid, .. } => format!("term {run} {}", pid.as_raw()),
            Action::KillGroup { run, pgid, .. } => format!("kill {run} {}", pgid.as_raw()),
            Action::KillLeftovers { run, pgid, .. } => {
                format!("kill leftovers {run} {}", pgid.as_raw())
            }
            Action::KillHelper(pid) => format!("kill helper {}", pid.as_raw()),
            Action::Record(req) => match req {
                Request::Create { run, .. } => format!("record create {run}"),
                Request::Progress { run, .. } => format!("record progress {run}"),
                Request::End { run, .. } => format!("record end {run}"),
                Request::Remove { run } => format!("record remove {run}"),
                Request::Heartbeat => "record heartbeat".into(),
                Request::Rescan => "record rescan".into(),
            },
            Action::Tally {
                subcommand,
                outcome,
                ..
            } => format!("tally {subcommand} {}", outcome.label()),
            Action::CountCancel(how) => format!("count cancel {}", how.label()),
        })
        .collect()
}

#[test]
fn a_run_that_takes_no_lock_starts_at_once_and_answers_its_shim_when_its_output_ends() {
    let t = Instant::now();
    let mut rec = opening(t);
    let mut runs = runs();
    let acts = ask(&mut runs, 7, &["version"], &mut rec, t);
    assert_eq!(names(&acts), ["attach 7 r1", "spawn r1"]);
    let acts = start(&mut runs, r(1), 100, &mut rec);
    assert_eq!(names(&acts), ["adopt 100 Terraform(RunId(1))", "watch r1"]);
    assert_eq!(state(&runs), [("r1".into(), "running".into())]);

    let acts = runs.terraform_exited(r(1), Exit::Code(0), false, &mut rec, t);
    assert!(acts.is_empty(), "its output is still being read: {acts:?}");
    assert_eq!(state(&runs), [("r1".into(), "exited".into())]);
    let acts = close_pipes(&mut runs, r(1), &mut rec);
    assert_eq!(names(&acts), ["answer 7 0 r1", "tally version succeeded"]);
    assert!(runs.is_empty());
}

#[test]
fn requests_are_refused_with_75_while_draining_and_no_run_exists() {
    let t = Instant::now();
    let mut rec = opening(t);
    let mut runs = runs();
    let req = request(&["apply"], "/tf/x");
    let acts = runs.request(c(3), req, None, Phase::Draining, &mut rec, t);
    assert_eq!(names(&acts), ["answer 3 75 -", "tally apply refused"]);
    let Action::Answer { note, .. } = &acts[0] else {
        unreachable!()
    };
    let msg = note.error.as_deref().unwrap_or_default();
    assert!(msg.contains("draining") && msg.contains("terraform was not started"));
    assert!(runs.is_empty());
}

#[test]
fn a_locking_run_waits_for_the_store_then_for_its_record_then_starts() {
    let t = Instant::now();
    let mut rec = opening(t);
    let mut runs = runs();
    let acts = ask(&mut runs, 1, &["apply"], &mut rec, t);
    assert_eq!(names(&acts), ["attach 1 r1"]);
    assert_eq!(state(&runs), [("r1".into(), "recovering".into())]);
    assert_eq!(runs.next_wakeup(), Some(t + RECORD_TIMEOUT));

    let events = rec.feed(opened(t, vec![]), t);
    let acts = runs.on_record_events(events, &mut rec, t);
    assert_eq!(names(&acts), ["record create r1"]);
    assert_eq!(state(&runs), [("r1".into(), "recording".into())]);

    let landed = Completion::Created {
        run: r(1),
        result: Ok("/state/records/r1.json".into()),
    };
    let events = rec.feed(landed, t);
    let acts = runs.on_record_events(events, &mut rec, t);
    assert_eq!(names(&acts), ["spawn r1"]);
}

#[test]
fn runs_waiting_for_the_store_are_refused_at_shutdown_and_their_records_removed() {
    let t = Instant::now();
    let mut rec = open(t, vec![]);
    let mut runs = runs();
    let acts = ask(&mut runs, 1, &["apply"], &mut rec, t);
    assert_eq!(names(&acts), ["attach 1 r1", "record create r1"]);
    let acts = runs.refuse_waiting(Refusal::ShuttingDown, &mut rec);
    assert_eq!(
        names(&acts),
        ["record remove r1", "answer 1 75 r1", "tally apply refused"]
    );
    assert!(runs.is_empty());
}

#[test]
fn a_shim_that_leaves_before_terraform_starts_leaves_nothing_to_start() {
    let t = Instant::now();
    let mut rec = open(t, vec![]);
    let mut runs = runs();
    ask(&mut runs, 1, &["apply"], &mut rec, t);
    let acts = runs.detach(r(1), t, false, &mut rec);
    assert_eq!(names(&acts), ["record remove r1"]);
    assert!(runs.is_empty());
}

#[test]
fn a_dead_runs_record_means_one_recovery_per_directory_first() {
    let t = Instant::now();
    let mut rec = open(t, vec![dead_record("/tf/x")]);
    let mut runs = runs();
    let acts = ask(&mut runs, 1, &["apply"], &mut rec, t);
    assert_eq!(names(&acts), ["attach 1 r1", "recover r1 /tf/x"]);
    let Some(Action::Recover { args, .. }) = acts.into_iter().nth(1) else {
        unreachable!()
    };
    let acts = ask(&mut runs, 2, &["apply"], &mut rec, t);
    assert_eq!(
        names(&acts),
        ["attach 2 r2"],
        "nothing launches in a directory while its recovery runs"
    );
    let acts = runs.recovery_started(r(1), &args, Ok(Pid::from_raw(50)), &mut rec, t);
    assert_eq!(names(&acts), ["adopt 50 Recovery(RunId(1))"]);
    assert_eq!(
        state(&runs),
        [
            ("r1".into(), "recovering".into()),
            ("r2".into(), "recovering".into())
        ]
    );

    let later = t + Duration::from_secs(1);
    let acts = runs.recovery_exited(r(1), Exit::Code(0), None, &mut rec, later);
    assert_eq!(
        names(&acts),
        ["record rescan", "record create r1", "record create r2"],
        "the run goes on to its record, and the one that waited checks again"
    );
}

#[test]
fn no_state_locking_run_starts_in_another_directory_while_a_recovery_runs() {
    // /tf/y may be a symbolic link to /tf/x, or name the same backend key: its lock would be one
    // the helper takes for the dead run's, and the helper decided with the runs it was given.
    let t = Instant::now();
    let mut rec = open(t, vec![dead_record("/tf/x")]);
    let mut runs = runs();
    let acts = ask(&mut runs, 1, &["apply"], &mut rec, t);
    let Some(Action::Recover { args, .. }) = acts.into_iter().nth(1) else {
        panic!("a recovery")
    };
    runs.recovery_started(r(1), &args, Ok(Pid::from_raw(50)), &mut rec, t);
    let req = request(&["apply"], "/tf/y");
    let acts = runs.request(c(2), req, None, Phase::Running, &mut rec, t);
    assert_eq!(names(&acts), ["attach 2 r2"], "it waits for the recovery");
    // Its wait's deadline passes: it still waits, and the loop is not woken for it.
    assert_eq!(runs.next_wakeup(), None);
    let late = t + Duration::from_secs(60);
    assert_eq!(
        names(&runs.tick(&mut rec, Path::new("/state"), late)),
        [] as [&str; 0]
    );
    let acts = runs.recovery_exited(r(1), Exit::Code(0), None, &mut rec, t);
    assert_eq!(
        names(&acts),
        ["record rescan", "record create r1", "record create r2"]
    );
}

#[test]
fn a_recovery_that_cannot_start_lets_terraform_start_without_it() {
    let t = Instant::now();
    let mut rec = open(t, vec![dead_record("/tf/x")]);
    let mut runs = runs();
    let acts = ask(&mut runs, 1, &["apply"], &mut rec, t);
    let Some(Action::Recover { args, .. }) = acts.into_iter().nth(1) else {
        panic!("a recovery");
    };
    let failed = Err(std::io::Error::other("no more processes"));
    let acts = runs.recovery_started(r(1), &args, failed, &mut rec, t);
    assert_eq!(names(&acts), ["record create r1"]);
}

#[test]
fn an_abandoned_run_gets_one_sigterm_then_its_group_a_sigkill_at_the_stop_timeout() {
    let t = Instant::now();
    let mut rec = opening(t);
    let mut runs = runs();
    ask(&mut runs, 1, &["version"], &mut rec, t);
    start(&mut runs, r(1), 100, &mut rec);
    let acts = runs.detach(r(1), t, false, &mut rec);
    assert_eq!(names(&acts), ["term r1 100"]);
    assert_eq!(runs.next_wakeup(), Some(t + STOP_TIMEOUT));
    let before = runs.tick(&mut rec, Path::new("/state"), t + STOP_TIMEOUT / 2);
    assert!(before.is_empty());
    let due = runs.tick(&mut rec, Path::new("/state"), t + STOP_TIMEOUT);
    assert_eq!(names(&due), ["kill r1 100"]);
    let again = runs.tick(&mut rec, Path::new("/state"), t + STOP_TIMEOUT * 2);
    assert!(again.is_empty(), "the SIGKILL is due once");
}

#[test]
fn a_shim_gone_during_shutdown_leaves_the_stop_to_the_timeline() {
    let t = Instant::now();
    let mut rec = opening(t);
    let mut runs = runs();
    ask(&mut runs, 1, &["version"], &mut rec, t);
    start(&mut runs, r(1), 100, &mut rec);
    assert!(runs.detach(r(1), t, true, &mut rec).is_empty());
    assert_eq!(runs.next_wakeup(), None);
    assert_eq!(
        names(&runs.stop_all(Force::Graceful, "deadline")),
        ["term r1 100"]
    );
    assert!(
        runs.stop_all(Force::Graceful, "deadline").is_empty(),
        "one SIGTERM, ever"
    );
    assert_eq!(
        names(&runs.stop_all(Force::Kill, "deadline")),
        ["kill r1 100"]
    );
    assert!(
        runs.stop_all(Force::Kill, "deadline").is_empty(),
        "one SIGKILL, ever"
    );
}

#[test]
fn a_second_stop_signal_from_the_shim_sends_nothing_more() {
    let t = Instant::now();
    let mut rec = opening(t);
    let mut runs = runs();
    ask(&mut runs, 1, &["version"], &mut rec, t);
    start(&mut runs, r(1), 100, &mut rec);
    assert_eq!(
        names(&runs.shim_signal(r(1), libc::SIGTERM, false)),
        ["term r1 100"]
    );
    assert!(runs.shim_signal(r(1), libc::SIGINT, false).is_empty());
    assert!(runs.statuses()[0].stop_requested);
}

#[test]
fn a_killed_locking_run_keeps_its_record_marked_ended_and_its_leftovers_go() {
    let t = Instant::now();
    let mut rec = open(t, vec![]);
    let mut runs = runs();
    ask(&mut runs, 1, &["apply"], &mut rec, t);
    let landed = Completion::Created {
        run: r(1),
        result: Ok("/state/records/r1.json".into()),
    };
    let events = rec.feed(landed, t);
    assert_eq!(
        names(&runs.on_record_events(events, &mut rec, t)),
        ["spawn r1"]
    );
    start(&mut runs, r(1), 100, &mut rec);
    let acts = runs.terraform_exited(r(1), Exit::Signal(9), false, &mut rec, t);
    assert_eq!(names(&acts), ["kill leftovers r1 100"]);
    let acts = close_pipes(&mut runs, r(1), &mut rec);
    assert_eq!(
        names(&acts),
        ["record end r1", "answer 1 137 r1", "tally apply signalled"]
    );
}

#[test]
fn pipes_held_open_after_terraform_exited_are_drained_when_the_linger_ends() {
    let t = Instant::now();
    let mut rec = opening(t);
    let mut runs = runs();
    ask(&mut runs, 1, &["version"], &mut rec, t);
    start(&mut runs, r(1), 100, &mut rec);
    runs.terraform_exited(r(1), Exit::Code(0), false, &mut rec, t);
    let linger = t + super::LINGER;
    assert_eq!(runs.next_wakeup(), Some(linger));
    assert_eq!(
        names(&runs.tick(&mut rec, Path::new("/state"), linger)),
        ["drain r1"]
    );
    for s in Stream::BOTH {
        assert!(runs.pipe(r(1), s).is_some(), "{s:?} still open");
    }
}

#[test]
fn the_fence_stops_recorded_runs_and_refuses_the_next_one_whose_record_lands() {
    let t = Instant::now();
    let mut rec = open(t, vec![]);
    let mut runs = runs();
    ask(&mut runs, 1, &["apply"], &mut rec, t);
    let landed = |n| Completion::Created {
        run: r(n),
        result: Ok(PathBuf::from(format!("/state/records/r{n}.json")).into()),
    };
    let events = rec.feed(landed(1), t);
    runs.on_record_events(events, &mut rec, t);
    start(&mut runs, r(1), 100, &mut rec);
    // Asked while the heartbeat is fresh enough for a record (TTL/2), and still waiting for it
    // (TFINIT_RECORD_TIMEOUT) when the fence comes.
    ask(
        &mut runs,
        2,
        &["apply"],
        &mut rec,
        t + Duration::from_secs(12),
    );

    // 2/3 of the TTL without a heartbeat landing: the recorded runs get their SIGTERM.
    let late = t + TTL * 2 / 3;
    let events = rec.tick(late);
    let acts = runs.on_record_events(events, &mut rec, late);
    assert_eq!(names(&acts), ["term r1 100"]);
    // r2's record lands now: it would be stopped at once, so it is refused.
    let events = rec.feed(landed(2), late);
    let acts = runs.on_record_events(events, &mut rec, late);
    assert_eq!(
        names(&acts),
        ["record remove r2", "answer 2 75 r2", "tally apply refused"]
    );
    let Action::Answer { note, .. } = &acts[1] else {
        unreachable!()
    };
    assert!(note
        .error
        .as_deref()
        .is_some_and(|e| e.contains("heartbeat")));
    assert_eq!(note.code, protocol::EXIT_REFUSED);
}

#[test]
fn terraform_that_cannot_be_started_answers_its_shim_with_the_shells_code() {
    let t = Instant::now();
    let mut rec = opening(t);
    let mut runs = runs();
    ask(&mut runs, 4, &["version"], &mut rec, t);
    let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
    let failed = Err(super::super::spawn::StartError::Spawn(missing));
    let acts = runs.spawned(r(1), failed, &mut rec, t);
    assert_eq!(names(&acts), ["answer 4 127 r1"]);
    assert!(runs.is_empty());
}

// ----- TFINIT_MAX_RUNS: the queue -----

/// An apply that takes no lock: it goes straight to its launch once it has a place.
const NO_LOCK: &[&str] = &["apply", "-lock=false"];

#[test]
fn runs_over_the_cap_wait_queued_and_start_in_arrival_order_as_terraform_is_reaped() {
    let t = Instant::now();
    let mut rec = opening(t);
    let mut runs = capped(2);
    assert_eq!(
        names(&ask(&mut runs, 1, NO_LOCK, &mut rec, t)),
        ["attach 1 r1", "spawn r1"]
    );
    assert_eq!(
        names(&ask(&mut runs, 2, NO_LOCK, &mut rec, t)),
        ["attach 2 r2", "spawn r2"]
    );
    assert_eq!(
        names(&ask(&mut runs, 3, NO_LOCK, &mut rec, t)),
        ["attach 3 r3"]
    );
    assert_eq!(
        names(&ask(&mut runs, 4, NO_LOCK, &mut rec, t)),
        ["attach 4 r4"]
    );
    start(&mut runs, r(1), 101, &mut rec);
    start(&mut runs, r(2), 102, &mut rec);
    assert_eq!(
        state(&runs).into_iter().map(|(_, s)| s).collect::<Vec<_>>(),
        ["running", "running", "queued", "queued"]
    );
    assert_eq!(
        runs.counts(),
        [0, 0, 2, 2, 0],
        "recovering, recording, queued, running, stopping"
    );
    assert_eq!(runs.next_wakeup(), None, "a queued run has no timer");

    // r2's terraform is reaped: its place goes to r3 (the oldest queued) at once, though its
    // output still drains; r4 waits on.
    let acts = runs.terraform_exited(r(2), Exit::Code(0), false, &mut rec, t);
    assert_eq!(names(&acts), ["spawn r3"]);
    start(&mut runs, r(3), 103, &mut rec);
    assert!(close_pipes(&mut runs, r(2), &mut rec)
        .iter()
        .all(|a| !matches!(a, Action::Spawn(_))));
    let acts = runs.terraform_exited(r(1), Exit::Code(1), false, &mut rec, t);
    assert_eq!(names(&acts), ["spawn r4"]);
}

#[test]
fn read_only_runs_are_never_queued_and_take_no_place() {
    let t = Instant::now();
    let mut rec = opening(t);
    let mut runs = capped(1);
    ask(&mut runs, 1, NO_LOCK, &mut rec, t);
    start(&mut runs, r(1), 101, &mut rec);
    for (conn, args) in [
        (2, &["version"][..]),
        (3, &["-version"]),
        (4, &["show", "-json"]),
        (5, &["output"]),
    ] {
        let acts = ask(&mut runs, conn, args, &mut rec, t);
        assert!(
            names(&acts).last().is_some_and(|a| a.starts_with("spawn")),
            "{args:?}: {acts:?}"
        );
    }
    assert_eq!(
        names(&ask(&mut runs, 6, NO_LOCK, &mut rec, t)),
        ["attach 6 r6"],
        "the cap holds"
    );
    start(&mut runs, r(2), 102, &mut rec);
    let acts = runs.terraform_exited(r(2), Exit::Code(0), false, &mut rec, t);
    assert!(
        !names(&acts).contains(&"spawn r6".to_string()),
        "a read-only run freed no place"
    );
}

#[test]
fn a_locking_run_holds_its_place_from_its_lock_check_and_gives_it_back_if_it_never_starts() {
    let t = Instant::now();
    let mut rec = open(t, vec![]);
    let mut runs = capped(1);
    assert_eq!(
        names(&ask(&mut runs, 1, &["apply"], &mut rec, t)),
        ["attach 1 r1", "record create r1"]
    );
    assert_eq!(
        names(&ask(&mut runs, 2, &["apply"], &mut rec, t)),
        ["attach 2 r2"]
    );
    assert_eq!(
        state(&runs)[1],
        ("r2".into(), "queued".into()),
        "no record for a queued run"
    );
    // r1's shim leaves while its record is written: r1 is over, r2 leaves the queue, and its
    // wait for the store starts now.
    let later = t + Duration::from_secs(3);
    let acts = runs.detach(r(1), later, false, &mut rec);
    assert_eq!(names(&acts), ["record remove r1", "record create r2"]);
    assert_eq!(state(&runs), [("r2".into(), "recording".into())]);
}

#[test]
fn queued_runs_are_refused_with_75_at_drain_and_a_shim_that_leaves_ends_its_run() {
    let t = Instant::now();
    let mut rec = opening(t);
    let mut runs = capped(1);
    ask(&mut runs, 1, NO_LOCK, &mut rec, t);
    start(&mut runs, r(1), 101, &mut rec);
    ask(&mut runs, 2, NO_LOCK, &mut rec, t);
    ask(&mut runs, 3, NO_LOCK, &mut rec, t);
    assert!(
        runs.detach(r(2), t, false, &mut rec).is_empty(),
        "nothing to remove or stop"
    );
    let acts = runs.refuse_waiting(Refusal::Draining, &mut rec);
    assert_eq!(names(&acts), ["answer 3 75 r3", "tally apply refused"]);
    assert_eq!(state(&runs), [("r1".into(), "running".into())]);
    let acts = runs.terraform_exited(r(1), Exit::Code(0), false, &mut rec, t);
    assert!(
        acts.iter().all(|a| !matches!(a, Action::Spawn(_))),
        "{acts:?}"
    );
}

// ----- tfinit cancel -----

#[test]
fn a_graceful_cancel_sends_the_one_sigterm_then_sigkill_after_the_stop_timeout() {
    let t = Instant::now();
    let mut rec = opening(t);
    let mut runs = runs();
    ask(&mut runs, 1, NO_LOCK, &mut rec, t);
    start(&mut runs, r(1), 100, &mut rec);
    let cancel = CancelTarget::Run(r(1));
    let (acts, done) = runs.cancel(&cancel, Force::Graceful, &mut rec, t).unwrap();
    assert_eq!(names(&acts), ["term r1 100", "count cancel graceful"]);
    assert!(
        done[0].starts_with("r1: SIGTERM sent to terraform"),
        "{done:?}"
    );
    assert_eq!(runs.next_wakeup(), Some(t + STOP_TIMEOUT));

    // Asked again: nothing more is sent, and the SIGKILL stays when it was due.
    let (acts, done) = runs
        .cancel(&cancel, Force::Graceful, &mut rec, t + STOP_TIMEOUT / 2)
        .unwrap();
    assert!(acts.is_empty(), "never a second SIGTERM: {acts:?}");
    assert!(done[0].contains("asked to stop already"), "{done:?}");
    assert_eq!(runs.next_wakeup(), Some(t + STOP_TIMEOUT));
    assert!(runs.shim_signal(r(1), libc::SIGTERM, false).is_empty());
    let due = runs.tick(&mut rec, Path::new("/state"), t + STOP_TIMEOUT);
    assert_eq!(names(&due), ["kill r1 100"]);

    // terraform ends by itself after the SIGTERM: its shim gets its code, counted as stopped.
    runs.terraform_exited(r(1), Exit::Code(1), false, &mut rec, t);
    let acts = close_pipes(&mut runs, r(1), &mut rec);
    assert_eq!(names(&acts), ["answer 1 1 r1", "tally apply killed"]);
}

#[test]
fn a_cancel_after_the_shims_own_stop_signal_sends_nothing_but_arms_the_sigkill() {
    let t = Instant::now();
    let mut rec = opening(t);
    let mut runs = runs();
    ask(&mut runs, 1, NO_LOCK, &mut rec, t);
    start(&mut runs, r(1), 100, &mut rec);
    assert_eq!(
        names(&runs.shim_signal(r(1), libc::SIGINT, false)),
        ["term r1 100"]
    );
    assert_eq!(runs.next_wakeup(), None);
    let (acts, _) = runs
        .cancel(&CancelTarget::Run(r(1)), Force::Graceful, &mut rec, t)
        .unwrap();
    assert!(acts.is_empty(), "{acts:?}");
    assert_eq!(runs.next_wakeup(), Some(t + STOP_TIMEOUT));
}

#[test]
fn a_forced_cancel_kills_the_group_at_once_and_the_killed_locking_run_keeps_its_record() {
    let t = Instant::now();
    let mut rec = open(t, vec![]);
    let mut runs = runs();
    ask(&mut runs, 1, &["apply"], &mut rec, t);
    let landed = Completion::Created {
        run: r(1),
        result: Ok("/state/records/r1.json".into()),
    };
    let events = rec.feed(landed, t);
    runs.on_record_events(events, &mut rec, t);
    start(&mut runs, r(1), 100, &mut rec);
    let (acts, done) = runs
        .cancel(&CancelTarget::Run(r(1)), Force::Kill, &mut rec, t)
        .unwrap();
    assert_eq!(names(&acts), ["kill r1 100", "count cancel force"]);
    assert!(done[0].contains("SIGKILL"), "{done:?}");
    let (acts, _) = runs
        .cancel(&CancelTarget::Run(r(1)), Force::Kill, &mut rec, t)
        .unwrap();
    assert!(acts.is_empty(), "one SIGKILL: {acts:?}");
    runs.terraform_exited(r(1), Exit::Signal(9), false, &mut rec, t);
    let acts = close_pipes(&mut runs, r(1), &mut rec);
    assert_eq!(
        names(&acts),
        ["record end r1", "answer 1 137 r1", "tally apply killed"]
    );
}

#[test]
fn a_cancelled_run_that_has_not_started_ends_with_75_and_gives_its_place_back() {
    let t = Instant::now();
    let mut rec = open(t, vec![]);
    let mut runs = capped(1);
    ask(&mut runs, 1, &["apply"], &mut rec, t);
    ask(&mut runs, 2, NO_LOCK, &mut rec, t);
    ask(&mut runs, 3, NO_LOCK, &mut rec, t);
    assert_eq!(state(&runs)[0], ("r1".into(), "recording".into()));
    // The queued one: ended, nothing else moves.
    let (acts, done) = runs
        .cancel(&CancelTarget::Run(r(2)), Force::Graceful, &mut rec, t)
        .unwrap();
    assert_eq!(
        names(&acts),
        [
            "answer 2 75 r2",
            "tally apply refused",
            "count cancel graceful"
        ]
    );
    assert!(done[0].contains("(it was queued)"), "{done:?}");
    let Action::Answer { note, .. } = &acts[0] else {
        unreachable!()
    };
    let msg = note.error.as_deref().unwrap_or_default();
    assert!(
        msg.contains("cancelled") && msg.contains("terraform was not started"),
        "{msg}"
    );
    // The recording one: its record is removed and r3 takes its place.
    let (acts, _) = runs
        .cancel(&CancelTarget::Run(r(1)), Force::Kill, &mut rec, t)
        .unwrap();
    assert_eq!(
        names(&acts),
        [
            "record remove r1",
            "answer 1 75 r1",
            "tally apply refused",
            "count cancel force",
            "spawn r3"
        ]
    );
}

#[test]
fn a_cancel_names_a_run_that_exists_or_a_directory_where_runs_work() {
    let t = Instant::now();
    let mut rec = opening(t);
    let mut runs = runs();
    let e = runs
        .cancel(&CancelTarget::Run(r(9)), Force::Graceful, &mut rec, t)
        .unwrap_err();
    assert!(
        e.contains("no run r9") && e.contains("tfinit status"),
        "{e}"
    );

    let mut req = request(&["-chdir=sub", "apply", "-lock=false"], "/tf/a");
    runs.request(c(1), req.clone(), None, Phase::Running, &mut rec, t);
    req.cwd = "/tf/b".into();
    req.args = vec!["apply".into(), "-lock=false".into()];
    runs.request(c(2), req, None, Phase::Running, &mut rec, t);
    start(&mut runs, r(1), 101, &mut rec);
    start(&mut runs, r(2), 102, &mut rec);
    let by_dir = |runs: &mut Runs, rec: &mut Records, dir: &str| {
        runs.cancel(
            &CancelTarget::Workdir {
                path: PathBuf::from(dir),
                id: None,
            },
            Force::Graceful,
            rec,
            t,
        )
        .map(|(acts, _)| names(&acts))
    };
    assert_eq!(
        by_dir(&mut runs, &mut rec, "/tf/a/sub").unwrap(),
        ["term r1 101", "count cancel graceful"]
    );
    assert_eq!(
        by_dir(&mut runs, &mut rec, "/tf/b").unwrap(),
        ["term r2 102", "count cancel graceful"]
    );
    let e = by_dir(&mut runs, &mut rec, "/tf/c").unwrap_err();
    assert!(
        e.contains("no run in /tf/c") && e.contains("tfinit status"),
        "{e}"
    );
}

/// `--workdir` names a directory by what it is: a run whose shim sent its directories' device
/// and inode is matched by those numbers (through a symbolic link either way), never by a text
/// that names another directory now; a run of an older shim, or a cancel whose client could not
/// stat the directory, by text as before.
#[test]
fn a_cancel_by_directory_compares_device_and_inode_where_both_sides_know_them() {
    let t = Instant::now();
    let mut rec = opening(t);
    let mut runs = runs();
    let id = |ino: u64| Some(FileId { dev: 7, ino });
    // r1: started with -chdir=link in /tf/a; the link leads to the directory of inode 20.
    let mut req = request(&["-chdir=link", "apply", "-lock=false"], "/tf/a");
    req.cwd_id = id(10);
    req.workdir_id = id(20);
    runs.request(c(1), req, None, Phase::Running, &mut rec, t);
    // r2: an older shim's, with no ids.
    let old = request(&["apply", "-lock=false"], "/tf/b");
    runs.request(c(2), old, None, Phase::Running, &mut rec, t);
    start(&mut runs, r(1), 101, &mut rec);
    start(&mut runs, r(2), 102, &mut rec);
    let matched = |runs: &Runs, path: &str, asked: Option<FileId>| {
        runs.named_by(&CancelTarget::Workdir {
            path: PathBuf::from(path),
            id: asked,
        })
    };
    // The real directory, whatever its text: r1 by terraform's directory.
    assert_eq!(matched(&runs, "/srv/real", id(20)), Ok(vec![r(1)]));
    // The shim's own directory by number too.
    assert_eq!(matched(&runs, "/elsewhere/a", id(10)), Ok(vec![r(1)]));
    // The run's text, but another directory now (the link moved): not r1.
    let e = matched(&runs, "/tf/a/link", id(99)).unwrap_err();
    assert!(e.contains("no run in /tf/a/link"), "{e}");
    // The client could not stat: text, as before.
    assert_eq!(matched(&runs, "/tf/a/link", None), Ok(vec![r(1)]));
    // The older shim's run by its text, even when the client sent a number.
    assert_eq!(matched(&runs, "/tf/b", id(30)), Ok(vec![r(2)]));
    assert!(matched(&runs, "/tf/c", id(30)).is_err());
}

#[test]
fn a_cancelled_run_whose_lock_recovery_runs_answers_75_at_once_and_ends_with_its_helper() {
    let t = Instant::now();
    let mut rec = open(t, vec![dead_record("/tf/x")]);
    let mut runs = capped(1);
    let acts = ask(&mut runs, 1, &["apply"], &mut rec, t);
    let Some(Action::Recover { args, .. }) = acts.into_iter().nth(1) else {
        panic!("a recovery");
    };
    runs.recovery_started(r(1), &args, Ok(Pid::from_raw(50)), &mut rec, t);
    assert_eq!(
        names(&ask(&mut runs, 2, NO_LOCK, &mut rec, t)),
        ["attach 2 r2"]
    );

    let (acts, done) = runs
        .cancel(&CancelTarget::Run(r(1)), Force::Graceful, &mut rec, t)
        .unwrap();
    assert_eq!(names(&acts), ["answer 1 75 r1", "count cancel graceful"]);
    assert!(done[0].contains("a lock recovery runs first"), "{done:?}");
    assert_eq!(
        runs.next_wakeup(),
        Some(t + STOP_TIMEOUT),
        "the helper is SIGKILLed if it has not finished by then"
    );
    // The helper finishes: the run ends without terraform, and its place goes to r2.
    let acts = runs.recovery_exited(r(1), Exit::Code(0), None, &mut rec, t);
    assert_eq!(names(&acts), ["record rescan", "spawn r2"]);
    assert_eq!(state(&runs), [("r2".into(), "running".into())]);
}
