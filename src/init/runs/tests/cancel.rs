//! `tfinit cancel`.

use super::*;

#[test]
fn a_graceful_cancel_sends_the_one_sigterm_then_sigkill_after_the_stop_timeout() {
    let t = Instant::now();
    let mut w = World::new(runs(), opening(t));
    w.ask(1, NO_LOCK, t);
    w.start(r(1), 100);
    let cancel = CancelTarget::Run(r(1));
    let (acts, done) = w.cancel(&cancel, Force::Graceful, t).unwrap();
    assert_eq!(names(&acts), ["term r1 100", "count cancel graceful"]);
    assert!(
        done[0].starts_with("r1: SIGTERM sent to terraform"),
        "{done:?}"
    );
    assert_eq!(w.runs.next_wakeup(), Some(t + STOP_TIMEOUT));

    // Asked again: nothing more is sent, and the SIGKILL stays when it was due.
    let (acts, done) = w
        .cancel(&cancel, Force::Graceful, t + STOP_TIMEOUT / 2)
        .unwrap();
    assert!(acts.is_empty(), "never a second SIGTERM: {acts:?}");
    assert!(done[0].contains("asked to stop already"), "{done:?}");
    assert_eq!(w.runs.next_wakeup(), Some(t + STOP_TIMEOUT));
    assert!(w.shim_signal(r(1), libc::SIGTERM, false).is_empty());
    let due = w.tick(t + STOP_TIMEOUT);
    assert_eq!(names(&due), ["kill r1 100"]);

    // terraform ends by itself after the SIGTERM: its shim gets its code, counted as stopped.
    w.terraform_exited(r(1), Exit::Code(1), false, t);
    let acts = w.close_pipes(r(1));
    assert_eq!(names(&acts), ["answer 1 1 r1", "tally apply killed"]);
}

#[test]
fn a_cancel_after_the_shims_own_stop_signal_sends_nothing_but_arms_the_sigkill() {
    let t = Instant::now();
    let mut w = World::new(runs(), opening(t));
    w.ask(1, NO_LOCK, t);
    w.start(r(1), 100);
    assert_eq!(
        names(&w.shim_signal(r(1), libc::SIGINT, false)),
        ["term r1 100"]
    );
    assert_eq!(w.runs.next_wakeup(), None);
    let (acts, _) = w
        .cancel(&CancelTarget::Run(r(1)), Force::Graceful, t)
        .unwrap();
    assert!(acts.is_empty(), "{acts:?}");
    assert_eq!(w.runs.next_wakeup(), Some(t + STOP_TIMEOUT));
}

#[test]
fn a_forced_cancel_kills_the_group_at_once_and_the_killed_locking_run_keeps_its_record() {
    let t = Instant::now();
    let mut w = World::new(runs(), open(t, vec![]));
    w.ask(1, &["apply"], t);
    let landed = Completion::Created {
        run: r(1),
        result: Ok("/state/records/r1.json".into()),
    };
    w.feed(landed, t);
    w.start(r(1), 100);
    let (acts, done) = w.cancel(&CancelTarget::Run(r(1)), Force::Kill, t).unwrap();
    assert_eq!(names(&acts), ["kill r1 100", "count cancel force"]);
    assert!(done[0].contains("SIGKILL"), "{done:?}");
    let (acts, _) = w.cancel(&CancelTarget::Run(r(1)), Force::Kill, t).unwrap();
    assert!(acts.is_empty(), "one SIGKILL: {acts:?}");
    w.terraform_exited(r(1), Exit::Signal(9), false, t);
    let acts = w.close_pipes(r(1));
    assert_eq!(
        names(&acts),
        ["record end r1", "answer 1 137 r1", "tally apply killed"]
    );
}

#[test]
fn a_cancelled_run_that_has_not_started_ends_with_75_and_gives_its_place_back() {
    let t = Instant::now();
    let mut w = World::new(capped(1), open(t, vec![]));
    w.ask(1, &["apply"], t);
    w.ask(2, NO_LOCK, t);
    w.ask(3, NO_LOCK, t);
    assert_eq!(state(&w.runs)[0], ("r1".into(), "recording".into()));
    // The queued one: ended, nothing else moves.
    let (acts, done) = w
        .cancel(&CancelTarget::Run(r(2)), Force::Graceful, t)
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
    let Done::Act(Action::Answer { note, .. }) = &acts[0] else {
        unreachable!()
    };
    let msg = note.error.as_deref().unwrap_or_default();
    assert!(
        msg.contains("cancelled") && msg.contains("terraform was not started"),
        "{msg}"
    );
    // The recording one: its record is removed and r3 takes its place.
    let (acts, _) = w.cancel(&CancelTarget::Run(r(1)), Force::Kill, t).unwrap();
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
    let mut w = World::new(runs(), opening(t));
    let e = w
        .cancel(&CancelTarget::Run(r(9)), Force::Graceful, t)
        .unwrap_err();
    assert!(
        e.contains("no run r9") && e.contains("tfinit status"),
        "{e}"
    );

    let mut req = request(&["-chdir=sub", "apply", "-lock=false"], "/tf/a");
    w.request(c(1), req.clone(), Phase::Running, t);
    req.cwd = "/tf/b".into();
    req.args = vec!["apply".into(), "-lock=false".into()];
    w.request(c(2), req, Phase::Running, t);
    w.start(r(1), 101);
    w.start(r(2), 102);
    let by_dir = |w: &mut World, dir: &str| {
        w.cancel(
            &CancelTarget::Workdir {
                path: PathBuf::from(dir),
                id: None,
            },
            Force::Graceful,
            t,
        )
        .map(|(acts, _)| names(&acts))
    };
    assert_eq!(
        by_dir(&mut w, "/tf/a/sub").unwrap(),
        ["term r1 101", "count cancel graceful"]
    );
    assert_eq!(
        by_dir(&mut w, "/tf/b").unwrap(),
        ["term r2 102", "count cancel graceful"]
    );
    let e = by_dir(&mut w, "/tf/c").unwrap_err();
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
    let mut w = World::new(runs(), opening(t));
    let id = |ino: u64| Some(FileId { dev: 7, ino });
    // r1: started with -chdir=link in /tf/a; the link leads to the directory of inode 20.
    let mut req = request(&["-chdir=link", "apply", "-lock=false"], "/tf/a");
    req.cwd_id = id(10);
    req.workdir_id = id(20);
    w.request(c(1), req, Phase::Running, t);
    // r2: an older shim's, with no ids.
    let old = request(&["apply", "-lock=false"], "/tf/b");
    w.request(c(2), old, Phase::Running, t);
    w.start(r(1), 101);
    w.start(r(2), 102);
    let matched = |runs: &Runs, path: &str, asked: Option<FileId>| {
        runs.named_by(&CancelTarget::Workdir {
            path: PathBuf::from(path),
            id: asked,
        })
    };
    // The real directory, whatever its text: r1 by terraform's directory.
    assert_eq!(matched(&w.runs, "/srv/real", id(20)), Ok(vec![r(1)]));
    // The shim's own directory by number too.
    assert_eq!(matched(&w.runs, "/elsewhere/a", id(10)), Ok(vec![r(1)]));
    // The run's text, but another directory now (the link moved): not r1.
    let e = matched(&w.runs, "/tf/a/link", id(99)).unwrap_err();
    assert!(e.contains("no run in /tf/a/link"), "{e}");
    // The client could not stat: text, as before.
    assert_eq!(matched(&w.runs, "/tf/a/link", None), Ok(vec![r(1)]));
    // The older shim's run by its text, even when the client sent a number.
    assert_eq!(matched(&w.runs, "/tf/b", id(30)), Ok(vec![r(2)]));
    assert!(matched(&w.runs, "/tf/c", id(30)).is_err());
}

#[test]
fn a_cancelled_run_whose_lock_recovery_runs_answers_75_at_once_and_ends_with_its_helper() {
    let t = Instant::now();
    let mut w = World::new(capped(1), open(t, vec![dead_record("/tf/x")]));
    let acts = w.ask(1, &["apply"], t);
    assert_eq!(names(&acts)[1], "recover r1");
    w.recovery_started(r(1), Ok(Pid::from_raw(50)), t);
    assert_eq!(names(&w.ask(2, NO_LOCK, t)), ["attach 2 r2"]);

    let (acts, done) = w
        .cancel(&CancelTarget::Run(r(1)), Force::Graceful, t)
        .unwrap();
    assert_eq!(names(&acts), ["answer 1 75 r1", "count cancel graceful"]);
    assert!(done[0].contains("a lock recovery runs first"), "{done:?}");
    assert_eq!(
        w.runs.next_wakeup(),
        Some(t + STOP_TIMEOUT),
        "the helper is SIGKILLed if it has not finished by then"
    );
    // The helper finishes: the run ends without terraform, and its place goes to r2.
    let acts = w.recovery_exited(r(1), Exit::Code(0), None, t);
    assert_eq!(names(&acts), ["record rescan", "spawn r2"]);
    assert_eq!(state(&w.runs), [("r2".into(), "running".into())]);
}
