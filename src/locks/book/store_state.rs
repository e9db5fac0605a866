//! The store's state machine (opening, open, failed, not answering): what an open, a failed open
//! and a write that answers do to it, and the directories a store that cannot be written shadows.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::{Book, Event, Notice, RecordStatus, RunRecord, RunTable};
use crate::locks::recorder::Table;
use crate::locks::who::who_host;

/// How often "state volume is not answering" is repeated while it lasts.
pub const NOT_ANSWERING_EVERY: Duration = Duration::from_secs(60);

/// The store's state, as the loop knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreState {
    /// The recorder is opening it (probe, sweep, first heartbeat).
    Opening {
        /// Since when.
        since: Instant,
    },
    /// Usable.
    Open,
    /// Not usable (missing, read-only, not a directory): runs start without records.
    Failed,
    /// A run's record did not land within TFINIT_RECORD_TIMEOUT: runs start at once without
    /// records until a write succeeds again.
    NotAnswering {
        /// Since when.
        since: Instant,
        /// When the last "not answering" warning was given.
        last_warned: Instant,
    },
}

impl Book {
    /// Whether the recorder is still opening the store (what is on it is not known yet).
    pub fn opening(&self) -> bool {
        matches!(self.state, StoreState::Opening { .. })
    }

    /// The store's state.
    pub fn state(&self) -> StoreState {
        self.state
    }

    /// The store opened: its records, our passwd user, and when its first heartbeat was stamped.
    pub(super) fn opened(
        &mut self,
        table: Option<Table>,
        passwd_user: Option<String>,
        beat: Option<Instant>,
        now: Instant,
        ev: &mut Vec<Event>,
    ) {
        self.passwd_user = passwd_user;
        if let Some(t) = table {
            self.take_table(t, ev);
        }
        self.heartbeat_ok = beat;
        ev.push(Event::Log(Notice::Enabled {
            dir: self.dir.clone(),
            owner: self.me.name.clone(),
            incarnation: self.me.incarnation(),
        }));
        let dead = self.dead_records(now);
        if dead > 0 {
            ev.push(Event::Log(Notice::DeadRecords {
                count: dead,
                auto: self.auto_unlock,
            }));
        }
        self.answered(ev);
        // A store that failed at start opens when the recorder's retry succeeds.
        if matches!(self.state, StoreState::Opening { .. } | StoreState::Failed) {
            self.state = StoreState::Open;
            self.shadowed.clear();
        }
    }

    /// The store cannot be used: said once, and every run waiting for its record starts without,
    /// but in a directory the records it could still read shadow (see [`Book::may_launch`]). The
    /// recorder tries again every TTL/3: a later failure only brings the records it read.
    pub(super) fn open_failed<R>(
        &mut self,
        runs: &mut RunTable<R, RunRecord>,
        error: String,
        passwd_user: Option<String>,
        table: Option<Table>,
        ev: &mut Vec<Event>,
    ) {
        self.passwd_user = passwd_user;
        let was_unlisted = self.unlisted().is_some();
        self.set_table(table);
        if let Some(why) = self.unlisted().filter(|_| !was_unlisted) {
            ev.push(Event::Log(Notice::Unlisted {
                dir: self.dir.clone(),
                error: why.to_string(),
            }));
        }
        let shadowed = self.shadowed_dirs();
        if shadowed != self.shadowed {
            if !shadowed.is_empty() {
                ev.push(Event::Log(Notice::Shadowed {
                    dir: self.dir.clone(),
                    workdirs: shadowed.clone(),
                }));
            }
            self.shadowed = shadowed;
        }
        if self.state == StoreState::Failed {
            return;
        }
        self.state = StoreState::Failed;
        ev.push(Event::Log(Notice::NotUsable {
            dir: self.dir.clone(),
            error,
        }));
        // Runs start at once, without a warning each: the one above says it all.
        for (id, r) in runs.records_mut() {
            let Some(r) = r.open_mut() else { continue };
            if matches!(r.record, RecordStatus::Pending { .. }) {
                ev.push(Event::Start {
                    run: id,
                    recorded: false,
                });
            }
            if r.record.may_exist() {
                r.record = RecordStatus::Unrecorded;
            }
        }
    }

    /// The working directories where a record of another incarnation has a `Who` of this
    /// pod's host: while this incarnation cannot write to the volume, it is invisible to other
    /// pods, and one recovering such a record (a dead earlier container's, a run whose removal
    /// failed) could release a lock of this incarnation's that carries the same `Who`. So its
    /// state-locking runs wait (refused with 75), in every directory (any may lock the state of
    /// one of these), until the volume opens or the records are gone. Found by the simulation
    /// (docs/reliability.md).
    fn shadowed_dirs(&self) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        let Some(t) = &self.table else {
            return dirs;
        };
        for e in &t.records {
            if who_host(&e.who) == self.host
                && !e.facts.owner.same_incarnation(&self.me)
                && !dirs.contains(&e.workdir)
            {
                dirs.push(e.workdir.clone());
            }
        }
        dirs.sort();
        dirs
    }

    /// Why the last table's listing got no answer: while the store also cannot be written, a
    /// record with this pod's `Who` may be on it unseen, so state-locking runs are refused as in
    /// a shadowed directory, in every directory ([`Book::may_launch`]). Found by the
    /// simulation with the Lease store (an API that did not answer at start listed nothing).
    pub(super) fn unlisted(&self) -> Option<&str> {
        self.table.as_ref().and_then(|t| t.unlisted.as_deref())
    }

    /// A write succeeded: the volume answers.
    pub(super) fn answered(&mut self, ev: &mut Vec<Event>) {
        if let StoreState::NotAnswering { .. } = self.state {
            self.state = StoreState::Open;
            ev.push(Event::Log(Notice::AnswersAgain {
                dir: self.dir.clone(),
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixture::*;
    use super::super::*;
    use super::*;

    #[test]
    fn a_store_that_fails_at_open_refuses_runs_while_a_record_has_this_pods_who() {
        let t = Instant::now();
        let mut b = book(t);
        let earlier = other("pod-a", T0 - 60_000);
        let records = vec![
            entry("/state/records/1.json", "/tf/x", earlier, T0),
            entry("/state/records/2.json", "/tf/y", other("pod-b", T0), T0),
        ];
        let ev = b.on_completion(failed_open(t, records.clone()), t);
        let said = logs(&ev);
        assert!(
            said.iter()
                .any(|l| l.starts_with("the lock-owner record store is not usable")),
            "{said:?}"
        );
        assert!(
            said.iter().any(
                |l| l.contains("cannot be written but holds lock-owner records")
                    && l.contains("/tf/x")
                    && !l.contains("/tf/y")
            ),
            "{said:?}"
        );
        let (x, y) = (RunId::from(1), RunId::from(2));
        begin(&mut b, x, t);
        b.begin(&new_run(y, Path::new("/tf/y"), "default", &[]), t, None);
        assert_eq!(
            b.may_launch(x),
            Launch::Shadowed,
            "an earlier container's record in /tf/x"
        );
        assert_eq!(
            b.may_launch(y),
            Launch::Shadowed,
            "/tf/y may lock /tf/x's state (a symbolic link, the same backend key)"
        );
        // The retry fails again with the same records: nothing new is said.
        let ev = b.on_completion(failed_open(t, records), t);
        assert_eq!(logs(&ev), Vec::<String>::new());
        assert_eq!(b.may_launch(x), Launch::Shadowed);
        // Another pod recovered the record, the volume still failing: another pod's record (its
        // Who is not this pod's) refuses nothing.
        let others = vec![entry(
            "/state/records/2.json",
            "/tf/y",
            other("pod-b", T0),
            T0,
        )];
        let ev = b.on_completion(failed_open(t, others), t);
        assert_eq!(logs(&ev), Vec::<String>::new());
        assert_eq!(b.may_launch(x), Launch::Yes);
        assert_eq!(b.may_launch(y), Launch::Yes);
        // The volume is back: the store opens on a retry.
        let earlier = other("pod-a", T0 - 60_000);
        let rec = entry("/state/records/1.json", "/tf/x", earlier, T0);
        b.on_completion(failed_open(t, vec![rec.clone()]), t);
        assert_eq!(b.may_launch(x), Launch::Shadowed);
        b.on_completion(opened(t, table(t, vec![rec], vec![])), t);
        assert_eq!(b.state(), StoreState::Open);
        assert_eq!(
            b.may_launch(x),
            Launch::Yes,
            "an open store records and fences"
        );
    }

    #[test]
    fn a_store_that_can_neither_be_written_nor_listed_refuses_locking_runs_until_it_lists() {
        let t = Instant::now();
        let mut b = book(t);
        let unlisted = |why: Option<&str>| {
            let mut tb = table(t, vec![], vec![]);
            tb.unlisted = why.map(str::to_string);
            Completion::Opened {
                result: Err("the Kubernetes API has not answered yet".into()),
                table: Some(tb),
                passwd_user: None,
                location: Some("no store yet (the Kubernetes API has not answered yet)".into()),
                beat: None,
                lock: None,
            }
        };
        let ev = b.on_completion(unlisted(Some("connection refused")), t);
        let said = logs(&ev);
        assert!(
            said.iter()
                .any(|l| l.contains("can neither be written nor listed")
                    && l.contains("connection refused")),
            "{said:?}"
        );
        // The messages name the store as its opening said it, not TFINIT_STATE_DIR.
        assert!(
            said.iter().all(|l| !l.contains("/state")
                && l.contains("no store yet (the Kubernetes API has not answered yet)")),
            "{said:?}"
        );
        let x = RunId::from(1);
        begin(&mut b, x, t);
        assert_eq!(
            b.may_launch(x),
            Launch::Shadowed,
            "what the store holds is unknown"
        );
        // The retry fails the same way: said once.
        assert_eq!(
            logs(&b.on_completion(unlisted(Some("connection refused")), t)),
            Vec::<String>::new()
        );
        assert_eq!(b.may_launch(x), Launch::Shadowed);
        // It lists (nothing), still not writable: no record with this pod's Who, runs start.
        b.on_completion(unlisted(None), t);
        assert_eq!(b.may_launch(x), Launch::Yes);
        // With the guard off, the old rule: an unlisted store shadows nothing.
        b.on_completion(unlisted(Some("connection refused")), t);
        let _off = crate::mutation::disable(crate::mutation::Guard::Shadowed);
        assert_eq!(b.may_launch(x), Launch::Yes);
    }

    #[test]
    fn a_run_whose_wait_ends_before_any_heartbeat_landed_is_refused_not_started_unrecorded() {
        let t = Instant::now();
        let mut b = book(t);
        let r1 = RunId::from(1);
        // The init asks once the run's wait for the store (TFINIT_RECORD_TIMEOUT) is over.
        assert_eq!(b.state(), StoreState::Opening { since: t });
        let start = begin(&mut b, r1, t + TIMEOUT);
        assert!(
            matches!(start, Start::Unrecorded(None)),
            "no \"terraform starts without a record\": {start:?}"
        );
        assert_eq!(b.may_launch(r1), Launch::Unseen);
        // The next run asks while the volume still has not answered: refused at once, too.
        let r2 = RunId::from(2);
        begin(&mut b, r2, t + TIMEOUT);
        assert_eq!(b.may_launch(r2), Launch::Unseen);
        // Its first heartbeat lands (the open finishes): runs may start.
        b.on_completion(opened(t + TIMEOUT, table(t, vec![], vec![])), t + TIMEOUT);
        assert_eq!(b.may_launch(r2), Launch::Yes);
    }

    #[test]
    fn a_record_that_does_not_land_in_time_makes_the_store_not_answering() {
        let t = Instant::now();
        let mut b = open_book(t);
        begin(&mut b, RunId::from(1), t);
        assert_eq!(b.next_wakeup(), Some(t + TIMEOUT));
        assert!(b.tick(t + TIMEOUT - Duration::from_millis(1)).is_empty());
        let ev = b.tick(t + TIMEOUT);
        assert!(
            logs(&ev)[0].contains("the state volume did not answer within TFINIT_RECORD_TIMEOUT")
        );
        assert!(ev.contains(&Event::Start {
            run: RunId::from(1),
            recorded: false
        }));
        assert_eq!(b.record(RunId::from(1)), Some(&RecordStatus::Abandoned));
        assert_eq!(b.view(t + TIMEOUT).state, StoreStatus::NotAnswering);
        // The next locking runs start at once, warned once a minute.
        let t1 = t + TIMEOUT + Duration::from_secs(1);
        assert_eq!(begin(&mut b, RunId::from(2), t1), Start::Unrecorded(None));
        let t2 = t + TIMEOUT + NOT_ANSWERING_EVERY;
        match begin(&mut b, RunId::from(3), t2) {
            Start::Unrecorded(Some(n)) => {
                assert!(n.message().contains("state volume is not answering"))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            begin(&mut b, RunId::from(4), t2 + Duration::from_secs(59)),
            Start::Unrecorded(None)
        );
        // The late create lands: the volume answers again, and the live run's record counts.
        let ev = b.on_completion(
            Completion::Created {
                run: RunId::from(1),
                result: Ok("p1".into()),
            },
            t2,
        );
        assert!(logs(&ev)[0].contains("state volume answers again"));
        assert!(
            !ev.iter().any(|e| matches!(e, Event::Start { .. })),
            "r1 already started"
        );
        assert_eq!(b.state(), StoreState::Open);
        // The heartbeat is old by now (r1's record is on the volume): stale until written.
        assert!(matches!(
            begin(&mut b, RunId::from(5), t2),
            Start::Unrecorded(Some(_))
        ));
        b.on_completion(
            Completion::Heartbeat {
                result: Ok(()),
                stamped: t2,
                wall_ms: T0,
            },
            t2,
        );
        assert!(matches!(
            begin(&mut b, RunId::from(6), t2),
            Start::Record { .. }
        ));
    }

    #[test]
    fn a_store_that_fails_to_open_warns_once_and_runs_start_without_records() {
        let t = Instant::now();
        let mut b = book(t);
        assert!(matches!(
            begin(&mut b, RunId::from(1), t),
            Start::Unrecorded(None)
        ));
        let ev = b.on_completion(Completion::not_usable("read-only file system".into()), t);
        assert_eq!(
            b.may_launch(RunId::from(1)),
            Launch::Yes,
            "no record to shadow it"
        );
        assert_eq!(logs(&ev).len(), 1);
        assert!(logs(&ev)[0].contains("the lock-owner record store is not usable"));
        assert!(
            !ev.iter().any(|e| matches!(e, Event::Start { .. })),
            "r1 never waited: no create goes out before the store opens"
        );
        assert_eq!(begin(&mut b, RunId::from(2), t), Start::Unrecorded(None));
        assert_eq!(b.view(t).state, StoreStatus::Failed);
        assert!(
            b.tick(t + TTL).is_empty(),
            "no heartbeat for a failed store"
        );
        assert_eq!(
            b.exited(RunId::from(2), None, vec![]),
            None,
            "nothing to remove"
        );
    }
}
