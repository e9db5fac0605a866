//! TFINIT_MAX_RUNS: the queue.

use super::*;

#[test]
fn runs_over_the_cap_wait_queued_and_start_in_arrival_order_as_terraform_is_reaped() {
    let t = Instant::now();
    let mut w = World::new(capped(2), opening(t));
    assert_eq!(names(&w.ask(1, NO_LOCK, t)), ["attach 1 r1", "spawn r1"]);
    assert_eq!(names(&w.ask(2, NO_LOCK, t)), ["attach 2 r2", "spawn r2"]);
    assert_eq!(names(&w.ask(3, NO_LOCK, t)), ["attach 3 r3"]);
    assert_eq!(names(&w.ask(4, NO_LOCK, t)), ["attach 4 r4"]);
    w.start(r(1), 101);
    w.start(r(2), 102);
    assert_eq!(
        state(&w.runs)
            .into_iter()
            .map(|(_, s)| s)
            .collect::<Vec<_>>(),
        ["running", "running", "queued", "queued"]
    );
    assert_eq!(
        w.runs.counts(),
        [0, 0, 2, 2, 0],
        "recovering, recording, queued, running, stopping"
    );
    assert_eq!(w.runs.next_wakeup(), None, "a queued run has no timer");

    // r2's terraform is reaped: its place goes to r3 (the oldest queued) at once, though its
    // output still drains; r4 waits on.
    let acts = w.terraform_exited(r(2), Exit::Code(0), false, t);
    assert_eq!(names(&acts), ["spawn r3"]);
    w.start(r(3), 103);
    assert!(w
        .close_pipes(r(2))
        .iter()
        .all(|a| !matches!(a, Done::Act(Action::Spawn(_)))));
    let acts = w.terraform_exited(r(1), Exit::Code(1), false, t);
    assert_eq!(names(&acts), ["spawn r4"]);
}

#[test]
fn read_only_runs_are_never_queued_and_take_no_place() {
    let t = Instant::now();
    let mut w = World::new(capped(1), opening(t));
    w.ask(1, NO_LOCK, t);
    w.start(r(1), 101);
    for (conn, args) in [
        (2, &["version"][..]),
        (3, &["-version"]),
        (4, &["show", "-json"]),
        (5, &["output"]),
    ] {
        let acts = w.ask(conn, args, t);
        assert!(
            names(&acts).last().is_some_and(|a| a.starts_with("spawn")),
            "{args:?}: {acts:?}"
        );
    }
    assert_eq!(
        names(&w.ask(6, NO_LOCK, t)),
        ["attach 6 r6"],
        "the cap holds"
    );
    w.start(r(2), 102);
    let acts = w.terraform_exited(r(2), Exit::Code(0), false, t);
    assert!(
        !names(&acts).contains(&"spawn r6".to_string()),
        "a read-only run freed no place"
    );
}

#[test]
fn a_locking_run_holds_its_place_from_its_lock_check_and_gives_it_back_if_it_never_starts() {
    let t = Instant::now();
    let mut w = World::new(capped(1), open(t, vec![]));
    assert_eq!(
        names(&w.ask(1, &["apply"], t)),
        ["attach 1 r1", "record create r1"]
    );
    assert_eq!(names(&w.ask(2, &["apply"], t)), ["attach 2 r2"]);
    assert_eq!(
        state(&w.runs)[1],
        ("r2".into(), "queued".into()),
        "no record for a queued run"
    );
    // r1's shim leaves while its record is written: r1 is over, r2 leaves the queue, and its
    // wait for the store starts now.
    let later = t + Duration::from_secs(3);
    let acts = w.detach(r(1), later, false);
    assert_eq!(names(&acts), ["record remove r1", "record create r2"]);
    assert_eq!(state(&w.runs), [("r2".into(), "recording".into())]);
}

#[test]
fn queued_runs_are_refused_with_75_at_drain_and_a_shim_that_leaves_ends_its_run() {
    let t = Instant::now();
    let mut w = World::new(capped(1), opening(t));
    w.ask(1, NO_LOCK, t);
    w.start(r(1), 101);
    w.ask(2, NO_LOCK, t);
    w.ask(3, NO_LOCK, t);
    assert!(
        w.detach(r(2), t, false).is_empty(),
        "nothing to remove or stop"
    );
    let acts = w.refuse_waiting(Refusal::Draining, t);
    assert_eq!(names(&acts), ["answer 3 75 r3", "tally apply refused"]);
    assert_eq!(state(&w.runs), [("r1".into(), "running".into())]);
    let acts = w.terraform_exited(r(1), Exit::Code(0), false, t);
    assert!(
        acts.iter()
            .all(|a| !matches!(a, Done::Act(Action::Spawn(_)))),
        "{acts:?}"
    );
}
