//! From a shim's request to terraform's start: refusals, the lock check and its recovery, the
//! record, and terraform that cannot be started.

use super::*;

#[test]
fn requests_are_refused_with_75_while_draining_and_no_run_exists() {
    let t = Instant::now();
    let mut w = World::new(runs(), opening(t));
    let req = request(&["apply"], "/tf/x");
    let acts = w.request(c(3), req, Phase::Draining, t);
    assert_eq!(names(&acts), ["answer 3 75 -", "tally apply refused"]);
    let Done::Act(Action::Answer { note, .. }) = &acts[0] else {
        unreachable!()
    };
    let msg = note.error.as_deref().unwrap_or_default();
    assert!(msg.contains("draining") && msg.contains("terraform was not started"));
    assert!(w.runs.is_empty());
}

#[test]
fn a_locking_run_waits_for_the_store_then_for_its_record_then_starts() {
    let t = Instant::now();
    let mut w = World::new(runs(), opening(t));
    let acts = w.ask(1, &["apply"], t);
    assert_eq!(names(&acts), ["attach 1 r1"]);
    assert_eq!(state(&w.runs), [("r1".into(), "recovering".into())]);
    assert_eq!(w.runs.next_wakeup(), Some(t + RECORD_TIMEOUT));

    let acts = w.feed(opened(t, vec![]), t);
    assert_eq!(names(&acts), ["record create r1"]);
    assert_eq!(state(&w.runs), [("r1".into(), "recording".into())]);

    let landed = Completion::Created {
        run: r(1),
        result: Ok("/state/records/r1.json".into()),
    };
    let acts = w.feed(landed, t);
    assert_eq!(names(&acts), ["spawn r1"]);
}

#[test]
fn runs_waiting_for_the_store_are_refused_at_shutdown_and_their_records_removed() {
    let t = Instant::now();
    let mut w = World::new(runs(), open(t, vec![]));
    let acts = w.ask(1, &["apply"], t);
    assert_eq!(names(&acts), ["attach 1 r1", "record create r1"]);
    let acts = w.refuse_waiting(Refusal::ShuttingDown, t);
    assert_eq!(
        names(&acts),
        ["record remove r1", "answer 1 75 r1", "tally apply refused"]
    );
    assert!(w.runs.is_empty());
}

#[test]
fn a_shim_that_leaves_before_terraform_starts_leaves_nothing_to_start() {
    let t = Instant::now();
    let mut w = World::new(runs(), open(t, vec![]));
    w.ask(1, &["apply"], t);
    let acts = w.detach(r(1), t, false);
    assert_eq!(names(&acts), ["record remove r1"]);
    assert!(w.runs.is_empty());
}

#[test]
fn a_dead_runs_record_means_one_recovery_per_directory_first() {
    let t = Instant::now();
    let mut w = World::new(runs(), open(t, vec![dead_record("/tf/x")]));
    let acts = w.ask(1, &["apply"], t);
    assert_eq!(names(&acts), ["attach 1 r1", "recover r1"]);
    assert_eq!(names(&acts)[1], "recover r1");
    let acts = w.ask(2, &["apply"], t);
    assert_eq!(
        names(&acts),
        ["attach 2 r2"],
        "nothing launches in a directory while its recovery runs"
    );
    let acts = w.recovery_started(r(1), Ok(Pid::from_raw(50)), t);
    assert_eq!(names(&acts), ["adopt 50 Recovery(RunId(1))"]);
    assert_eq!(
        state(&w.runs),
        [
            ("r1".into(), "recovering".into()),
            ("r2".into(), "recovering".into())
        ]
    );

    let later = t + Duration::from_secs(1);
    let acts = w.recovery_exited(r(1), Exit::Code(0), None, later);
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
    let mut w = World::new(runs(), open(t, vec![dead_record("/tf/x")]));
    let acts = w.ask(1, &["apply"], t);
    assert_eq!(names(&acts)[1], "recover r1");
    w.recovery_started(r(1), Ok(Pid::from_raw(50)), t);
    let req = request(&["apply"], "/tf/y");
    let acts = w.request(c(2), req, Phase::Running, t);
    assert_eq!(names(&acts), ["attach 2 r2"], "it waits for the recovery");
    // Its wait's deadline passes: it still waits, and the loop is not woken for it.
    assert_eq!(w.runs.next_wakeup(), None);
    let late = t + Duration::from_secs(60);
    assert_eq!(names(&w.tick(late)), [] as [&str; 0]);
    let acts = w.recovery_exited(r(1), Exit::Code(0), None, t);
    assert_eq!(
        names(&acts),
        ["record rescan", "record create r1", "record create r2"]
    );
}

#[test]
fn a_recovery_that_cannot_start_lets_terraform_start_without_it() {
    let t = Instant::now();
    let mut w = World::new(runs(), open(t, vec![dead_record("/tf/x")]));
    let acts = w.ask(1, &["apply"], t);
    assert_eq!(names(&acts)[1], "recover r1");
    let failed = Err(std::io::Error::other("no more processes"));
    let acts = w.recovery_started(r(1), failed, t);
    assert_eq!(names(&acts), ["record create r1"]);
}

#[test]
fn terraform_that_cannot_be_started_answers_its_shim_with_the_shells_code() {
    let t = Instant::now();
    let mut w = World::new(runs(), opening(t));
    w.ask(4, &["version"], t);
    let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
    let failed = Err(StartError::Spawn(missing));
    let acts = w.spawned(r(1), failed, t);
    assert_eq!(names(&acts), ["answer 4 127 r1"]);
    assert!(w.runs.is_empty());
}

/// A recovery helper must know every live run of this init that may hold a lock (it decides with
/// them): a run whose record was asked for in the same step, before the recovery, is one.
#[test]
fn a_recovery_is_given_the_runs_whose_record_was_asked_for_before_it() {
    let t = Instant::now();
    let mut w = World::new(runs(), opening(t));
    w.request(c(1), request(&["apply"], "/tf/x"), Phase::Running, t);
    w.request(c(2), request(&["apply"], "/tf/y"), Phase::Running, t);
    // The store opens with a dead run's record in /tf/y: both runs check their lock again, r1
    // goes on to its record, r2 to a recovery.
    let acts = w.feed(opened(t, vec![dead_record("/tf/y")]), t);
    assert_eq!(names(&acts), ["record create r1", "recover r2"]);
    let (args, _) = w.recovery_args(r(2), t);
    let live: Vec<_> = args.live.iter().map(|l| l.workdir.clone()).collect();
    assert_eq!(live, [PathBuf::from("/tf/x")]);
}
