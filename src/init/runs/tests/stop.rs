//! Stopping and ending runs: the one graceful SIGTERM, the SIGKILL at the stop timeout, the
//! fence, terraform reaped, its output drained, its record closed.

use super::*;

#[test]
fn a_run_that_takes_no_lock_starts_at_once_and_answers_its_shim_when_its_output_ends() {
    let t = Instant::now();
    let mut w = World::new(runs(), opening(t));
    let acts = w.ask(7, &["version"], t);
    assert_eq!(names(&acts), ["attach 7 r1", "spawn r1"]);
    let acts = w.start(r(1), 100);
    assert_eq!(names(&acts), ["adopt 100 Terraform(RunId(1))", "watch r1"]);
    assert_eq!(state(&w.runs), [("r1".into(), "running".into())]);

    let acts = w.terraform_exited(r(1), Exit::Code(0), false, t);
    assert!(acts.is_empty(), "its output is still being read: {acts:?}");
    assert_eq!(state(&w.runs), [("r1".into(), "exited".into())]);
    let acts = w.close_pipes(r(1));
    assert_eq!(names(&acts), ["answer 7 0 r1", "tally version succeeded"]);
    assert!(w.runs.is_empty());
}

#[test]
fn an_abandoned_run_gets_one_sigterm_then_its_group_a_sigkill_at_the_stop_timeout() {
    let t = Instant::now();
    let mut w = World::new(runs(), opening(t));
    w.ask(1, &["version"], t);
    w.start(r(1), 100);
    let acts = w.detach(r(1), t, false);
    assert_eq!(names(&acts), ["term r1 100"]);
    assert_eq!(w.runs.next_wakeup(), Some(t + STOP_TIMEOUT));
    let before = w.tick(t + STOP_TIMEOUT / 2);
    assert!(before.is_empty());
    let due = w.tick(t + STOP_TIMEOUT);
    assert_eq!(names(&due), ["kill r1 100"]);
    let again = w.tick(t + STOP_TIMEOUT * 2);
    assert!(again.is_empty(), "the SIGKILL is due once");
}

#[test]
fn a_shim_gone_during_shutdown_leaves_the_stop_to_the_timeline() {
    let t = Instant::now();
    let mut w = World::new(runs(), opening(t));
    w.ask(1, &["version"], t);
    w.start(r(1), 100);
    assert!(w.detach(r(1), t, true).is_empty());
    assert_eq!(w.runs.next_wakeup(), None);
    assert_eq!(
        names(&w.stop_all(Force::Graceful, "deadline")),
        ["term r1 100"]
    );
    assert!(
        w.stop_all(Force::Graceful, "deadline").is_empty(),
        "one SIGTERM, ever"
    );
    assert_eq!(names(&w.stop_all(Force::Kill, "deadline")), ["kill r1 100"]);
    assert!(
        w.stop_all(Force::Kill, "deadline").is_empty(),
        "one SIGKILL, ever"
    );
}

#[test]
fn a_second_stop_signal_from_the_shim_sends_nothing_more() {
    let t = Instant::now();
    let mut w = World::new(runs(), opening(t));
    w.ask(1, &["version"], t);
    w.start(r(1), 100);
    assert_eq!(
        names(&w.shim_signal(r(1), libc::SIGTERM, false)),
        ["term r1 100"]
    );
    assert!(w.shim_signal(r(1), libc::SIGINT, false).is_empty());
    assert!(w.runs.statuses()[0].stop_requested);
}

#[test]
fn a_killed_locking_run_keeps_its_record_marked_ended_and_its_leftovers_go() {
    let t = Instant::now();
    let mut w = World::new(runs(), open(t, vec![]));
    w.ask(1, &["apply"], t);
    let landed = Completion::Created {
        run: r(1),
        result: Ok("/state/records/r1.json".into()),
    };
    assert_eq!(names(&w.feed(landed, t)), ["spawn r1"]);
    w.start(r(1), 100);
    let acts = w.terraform_exited(r(1), Exit::Signal(9), false, t);
    assert_eq!(names(&acts), ["kill leftovers r1 100"]);
    let acts = w.close_pipes(r(1));
    assert_eq!(
        names(&acts),
        ["record end r1", "answer 1 137 r1", "tally apply signalled"]
    );
}

#[test]
fn pipes_held_open_after_terraform_exited_are_drained_when_the_linger_ends() {
    let t = Instant::now();
    let mut w = World::new(runs(), opening(t));
    w.ask(1, &["version"], t);
    w.start(r(1), 100);
    w.terraform_exited(r(1), Exit::Code(0), false, t);
    let linger = t + super::super::LINGER;
    assert_eq!(w.runs.next_wakeup(), Some(linger));
    assert_eq!(names(&w.tick(linger)), ["drain r1"]);
    for s in Stream::BOTH {
        assert!(w.runs.pipe(r(1), s).is_some(), "{s:?} still open");
    }
}

#[test]
fn the_fence_stops_recorded_runs_and_refuses_the_next_one_whose_record_lands() {
    let t = Instant::now();
    let mut w = World::new(runs(), open(t, vec![]));
    w.ask(1, &["apply"], t);
    let landed = |n| Completion::Created {
        run: r(n),
        result: Ok(PathBuf::from(format!("/state/records/r{n}.json")).into()),
    };
    w.feed(landed(1), t);
    w.start(r(1), 100);
    // Asked while the heartbeat is fresh enough for a record (TTL/2), and still waiting for it
    // (TFINIT_RECORD_TIMEOUT) when the fence comes.
    w.ask(2, &["apply"], t + Duration::from_secs(12));

    // 2/3 of the TTL without a heartbeat landing: the recorded runs get their SIGTERM.
    let late = t + TTL * 2 / 3;
    let acts = w.record_timers(late);
    assert_eq!(names(&acts), ["term r1 100"]);
    // r2's record lands now: it would be stopped at once, so it is refused.
    let acts = w.feed(landed(2), late);
    assert_eq!(
        names(&acts),
        ["record remove r2", "answer 2 75 r2", "tally apply refused"]
    );
    let Done::Act(Action::Answer { note, .. }) = &acts[1] else {
        unreachable!()
    };
    assert!(note
        .error
        .as_deref()
        .is_some_and(|e| e.contains("heartbeat")));
    assert_eq!(note.code, protocol::EXIT_REFUSED);
}
