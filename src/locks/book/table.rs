//! The table of records the recorder last scanned, and what it says of liveness: which records
//! are over, which directories need a recovery first, and what a recovery helper is told.

use std::path::Path;
use std::time::Instant;

use super::{Book, Event, Notice, RunRecord, RunTable, StoreState};
use crate::locks::liveness::{run_state, RunState, Seen, Token, Verdict};
use crate::locks::recorder::{Entry, Table, Work};

impl Book {
    /// The last table of records, and what is counted of it.
    pub(super) fn set_table(&mut self, table: Option<Table>) {
        self.needing_person = table
            .iter()
            .flat_map(|t| &t.records)
            .filter(|e| e.facts.needs_person_by.is_some())
            .count();
        self.table = table;
    }

    /// Takes in a scan: the records, and what it read of each incarnation's heartbeat.
    pub(super) fn take_table(&mut self, t: Table, ev: &mut Vec<Event>) {
        for b in &t.beats {
            let token = b.heartbeat.as_ref().map(Token::of);
            self.observer.saw(&b.owner.key(), token, b.started, b.done);
        }
        // A listing with no answer says nothing of the records: the last table that answered
        // stands, with the watches of its owners (replaced by an empty one, runs would skip a
        // recovery they need and meet terraform's "Error acquiring the state lock", and every
        // owner's watch would start over). It says that the listing failed.
        if let (Some(why), Some(last)) = (&t.unlisted, self.table.as_mut()) {
            last.unlisted = Some(why.clone());
            return;
        }
        // An incarnation whose read got no answer is still watched (its watch goes on at the
        // next read that answers); one no longer read at all has no records left.
        let keys: Vec<String> = t.beats.iter().map(|b| b.owner.key()).collect();
        self.observer
            .retain(|k| keys.iter().any(|x| x == k) || t.unread.iter().any(|x| x == k));
        // A record states its owner's TTL too: what it is judged by while its heartbeat is missing.
        for e in &t.records {
            self.observer.stated(&e.facts.owner.key(), e.facts.ttl);
        }
        if !self.shared_reported {
            let twin = t.beats.iter().find(|b| {
                b.owner.name == self.me.name
                    && !b.owner.same_incarnation(&self.me)
                    && self.observer.verdict(&b.owner.key(), t.scanned) == Verdict::Alive
            });
            if let Some(b) = twin {
                self.shared_reported = true;
                ev.push(Event::Log(Notice::SharedName {
                    owner: self.me.name.clone(),
                    other: b.owner.incarnation(),
                    me: self.me.incarnation(),
                }));
            }
        }
        self.gone.clone_from(&t.gone);
        self.held.clone_from(&t.held);
        self.set_table(Some(t));
    }

    /// Every record the loop knows of, at lookup time: the last table, corrected by our own
    /// end-markings and removals since it was scanned.
    fn entries(&self) -> impl Iterator<Item = &Entry> {
        let scanned = self.table.as_ref().map(|t| t.scanned);
        let newer = move |at: &Instant| scanned.is_none_or(|s| *at > s);
        let table = self
            .table
            .iter()
            .flat_map(|t| t.records.iter())
            .filter(move |e| !self.own.get(&e.path).is_some_and(|(at, _)| newer(at)));
        let own = self
            .own
            .values()
            .filter(move |(at, _)| newer(at))
            .filter_map(|(_, e)| e.as_ref());
        table.chain(own)
    }

    /// Whether `e`'s run is over, may run, or is being watched, as this observer sees it now.
    fn run_state(&self, e: &Entry, now: Instant) -> RunState {
        let key = e.facts.owner.key();
        let kernel = if self.gone.contains(&key) {
            Some(true)
        } else if self.held.contains(&key) {
            Some(false)
        } else {
            None
        };
        run_state(&self.me, &e.facts, kernel, self.observer.verdict(&key, now))
    }

    /// Not known to be alive (over, or being watched), and not already reported by this
    /// incarnation as needing a person: a recovery helper looks at it (and waits for a verdict).
    fn wants_recovery(&self, e: &Entry, now: Instant) -> bool {
        !matches!(self.run_state(e, now), RunState::Alive)
            && e.facts.needs_person_by.as_deref() != Some(self.me.incarnation().as_str())
    }

    pub(super) fn dead_records(&self, now: Instant) -> usize {
        self.entries()
            .filter(|e| matches!(self.run_state(e, now), RunState::Over(_)))
            .count()
    }

    /// What this incarnation has seen of other incarnations' heartbeats, for a recovery helper
    /// (`mono` turns an instant into CLOCK_MONOTONIC nanoseconds).
    pub fn observations(&self, mono: impl Fn(Instant) -> u64) -> Vec<Seen> {
        self.observer.export(mono)
    }

    /// The incarnations the kernel proved gone in the last scan.
    pub fn proven_gone(&self) -> &[String] {
        &self.gone
    }

    /// Whether a state-locking run in `workdir` must wait for a recovery first: a record there of
    /// a run seen dying, of an incarnation proven gone or watched dead, or of one not watched
    /// long enough to tell (the helper then watches), decided at `now` on our monotonic clock.
    pub fn needs_recovery<R>(
        &self,
        runs: &RunTable<R, RunRecord>,
        workdir: &Path,
        now: Instant,
    ) -> bool {
        if !self.auto_unlock
            || !matches!(
                self.state,
                StoreState::Open | StoreState::NotAnswering { .. }
            )
        {
            return false;
        }
        // A run of ours here ended in a way that may have left its lock, and its end-marking is
        // still on its way to the volume: a recovery is needed (it waits for that marking).
        if runs
            .closings()
            .any(|c| c.workdir == workdir && c.ended.is_some())
        {
            return true;
        }
        // The table before a recovery's rescan still shows what that recovery resolved.
        let scanned = self.table.as_ref().map(|t| t.scanned);
        if self
            .recovered
            .get(workdir)
            .is_some_and(|at| scanned.is_none_or(|s| s < *at))
        {
            return false;
        }
        self.entries()
            .any(|e| e.workdir == workdir && self.wants_recovery(e, now))
    }

    /// Whether what a recovery in `workdir` would look at is only records of owners not watched
    /// long enough to tell (none is known over): the helper then only watches, unless one dies.
    pub fn only_watching<R>(
        &self,
        runs: &RunTable<R, RunRecord>,
        workdir: &Path,
        now: Instant,
    ) -> bool {
        !runs
            .closings()
            .any(|c| c.workdir == workdir && c.ended.is_some())
            && !self.entries().any(|e| {
                e.workdir == workdir && matches!(self.run_state(e, now), RunState::Over(_))
            })
    }

    /// Whether a recovery in `workdir` may start now: no end-marking or removal of a record there
    /// is still queued or in flight (a recovery must read what our runs left as the truth).
    pub fn may_recover<R>(&self, runs: &RunTable<R, RunRecord>, workdir: &Path) -> bool {
        !runs.closings().any(|c| c.workdir == workdir)
    }

    /// A recovery in `workdir` finished: returns the rescan to send.
    pub fn recovery_done(&mut self, workdir: &Path, now: Instant) -> Work {
        self.recovered.insert(workdir.to_path_buf(), now);
        Work::Rescan
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixture::*;
    use super::super::*;
    use super::*;
    use crate::locks::record::Ended;

    #[test]
    fn the_view_counts_the_records_that_need_a_person_as_the_last_table_had_them() {
        let t = Instant::now();
        let mut b = book(t);
        assert_eq!(b.view(t).needing_person, 0);
        let mut waiting = entry("/state/records/1.json", "/tf/x", other("pod-b", T0), T0);
        waiting.facts.needs_person_by = Some("pod-c incarnation".into());
        let plain = entry("/state/records/2.json", "/tf/y", other("pod-b", T0), T0);
        b.on_completion(opened(t, table(t, vec![waiting, plain.clone()], vec![])), t);
        assert_eq!(b.view(t).needing_person, 1);
        // A person released it: the next scan no longer has it.
        b.on_completion(Completion::Table(table(t, vec![plain], vec![])), t);
        assert_eq!(b.view(t).needing_person, 0);
    }

    #[test]
    fn a_rescan_with_no_answer_keeps_the_last_table_and_its_watches() {
        let t = Instant::now();
        let mut b = book(t);
        let pod_b = other("pod-b", T0);
        let dead = entry("/state/records/1.json", "/tf/x", pod_b.clone(), T0);
        b.on_completion(
            opened(
                t,
                table(t, vec![dead.clone()], vec![beat(pod_b.clone(), 1, T0)]),
            ),
            t,
        );
        // Watched unchanged for a TTL: dead, its directory needs a recovery.
        let t1 = t + TTL;
        let answered = |at: Instant| {
            Completion::Table(table(
                at,
                vec![dead.clone()],
                vec![beat(pod_b.clone(), 1, T0)],
            ))
        };
        b.on_completion(answered(t1), t1);
        assert!(b.needs_recovery(Path::new("/tf/x"), t1));
        // The next listing gets no answer: nothing is known of the records, the last table stands.
        let t2 = t1 + TTL / 3;
        let mut unanswered = table(t2, vec![], vec![]);
        unanswered.unlisted = Some("connection refused".into());
        b.on_completion(Completion::Table(unanswered), t2);
        assert!(
            b.needs_recovery(Path::new("/tf/x"), t2),
            "a listing with no answer emptied the table"
        );
        assert_eq!(b.dead_records(t2), 1, "pod-b's watch went on");
        // An answered listing without the record replaces it.
        let t3 = t2 + TTL / 3;
        b.on_completion(Completion::Table(table(t3, vec![], vec![])), t3);
        assert!(!b.needs_recovery(Path::new("/tf/x"), t3));
    }

    #[test]
    fn owners_are_judged_by_what_this_observer_saw_change_on_its_own_clock() {
        let t = Instant::now();
        let mut b = book(t);
        let pod_b = other("pod-b", T0 - 100_000);
        let mine = entry("mine", "/tf/mine", me(), T0);
        let mut ended_mine = entry("ended", "/tf/ended", me(), T0);
        ended_mine.facts.ended = Some(Ended {
            ms: T0,
            how: "killed by SIGKILL".into(),
        });
        let records = vec![
            entry("b", "/tf/b", pod_b.clone(), T0 - 50_000),
            entry("c", "/tf/c", other("pod-c", T0 - 100_000), T0),
            mine,
            ended_mine,
        ];
        // pod-b's stamps are an hour old by any clock here: they are never compared with one.
        let stamp = T0 - 3_600_000;
        b.on_completion(
            opened(
                t,
                table(t, records.clone(), vec![beat(pod_b.clone(), 1, stamp)]),
            ),
            t,
        );
        // Not watched for a TTL yet: a recovery helper looks (and waits for a verdict).
        assert!(b.needs_recovery(Path::new("/tf/b"), t));
        assert!(b.needs_recovery(Path::new("/tf/c"), t));
        // pod-b's heartbeat changes: alive, its lock is never looked at.
        let t1 = t + TTL / 3;
        let scan = |at: Instant, seq: u64| {
            Completion::Table(table(
                at,
                records.clone(),
                vec![beat(pod_b.clone(), seq, stamp + seq)],
            ))
        };
        b.on_completion(scan(t1, 2), t1);
        assert!(!b.needs_recovery(Path::new("/tf/b"), t1));
        // Unchanged in a read just short of a TTL later: still alive.
        let t2 = t1 + TTL - Duration::from_millis(1);
        b.on_completion(scan(t2, 2), t2);
        assert!(!b.needs_recovery(Path::new("/tf/b"), t2 + TTL));
        // Unchanged in a read a full TTL after it was first seen: dead.
        let t3 = t1 + TTL;
        b.on_completion(scan(t3, 2), t3);
        assert!(b.needs_recovery(Path::new("/tf/b"), t3));
        // pod-c has no heartbeat at all: watched like any content, dead after a TTL of it.
        assert_eq!(
            b.dead_records(t3),
            2,
            "pod-b watched dead, our own ended run"
        );
        // Our own live record never; our own ended one always.
        assert!(!b.needs_recovery(Path::new("/tf/mine"), t3 + 100 * TTL));
        assert!(b.needs_recovery(Path::new("/tf/ended"), t));
        assert!(!b.needs_recovery(Path::new("/tf/elsewhere"), t3 + 100 * TTL));
        // TFINIT_FORCE_UNLOCK=off: never.
        b.auto_unlock = false;
        assert!(!b.needs_recovery(Path::new("/tf/ended"), t));
    }

    #[test]
    fn reads_with_no_answer_call_nobody_dead_and_keep_the_watch_going() {
        let t = Instant::now();
        let mut b = book(t);
        let pod_b = other("pod-b", T0 - 100_000);
        let records = vec![entry("b", "/tf/b", pod_b.clone(), T0)];
        let hb = beat(pod_b.clone(), 1, T0);
        b.on_completion(opened(t, table(t, records.clone(), vec![hb.clone()])), t);
        // Three TTLs of scans whose read of pod-b's heartbeat got no answer: not dead.
        let unread = |at: Instant| {
            let mut tb = table(at, records.clone(), vec![]);
            tb.unread = vec![pod_b.key()];
            Completion::Table(tb)
        };
        for k in 1..=9 {
            let at = t + TTL / 3 * k;
            b.on_completion(unread(at), at);
            assert_eq!(b.dead_records(at), 0, "{k} unanswered reads");
        }
        // The first read that answers, unchanged, three TTLs after the watch began: dead at
        // once, so the watch was kept through the unanswered reads.
        let t4 = t + TTL * 3 + Duration::from_millis(1);
        b.on_completion(
            Completion::Table(table(t4, records.clone(), vec![hb.clone()])),
            t4,
        );
        assert_eq!(b.dead_records(t4), 1);
        // An incarnation neither read nor unread (its records were gone for a moment) is
        // forgotten: read again three TTLs later, its watch starts over.
        let t5 = t4 + TTL;
        b.on_completion(Completion::Table(table(t5, vec![], vec![])), t5);
        let t6 = t5 + TTL * 3;
        b.on_completion(Completion::Table(table(t6, records, vec![hb])), t6);
        assert_eq!(b.dead_records(t6), 0, "watched from t6 on");
    }

    #[test]
    fn an_incarnation_the_kernel_proves_gone_is_over_at_once() {
        let t = Instant::now();
        let mut b = book(t);
        let earlier = other("pod-a", 0);
        let mut tab = table(
            t,
            vec![entry("a0", "/tf/a", earlier.clone(), T0)],
            vec![beat(earlier.clone(), 9, T0)],
        );
        tab.gone = vec![earlier.key()];
        b.on_completion(opened(t, tab), t);
        assert_eq!(b.dead_records(t), 1);
        assert_eq!(b.proven_gone(), [earlier.key()]);
    }

    #[test]
    fn an_incarnation_whose_lock_file_a_process_holds_is_alive_whatever_its_heartbeat_does() {
        // An init that died outside a PID namespace leaves its terraform behind, holding the
        // lock file: its heartbeat stops, but the kernel says a process of it lives.
        let t = Instant::now();
        let mut b = book(t);
        let orphaned = other("pod-o", 0);
        let recs = vec![entry("o1", "/tf/o", orphaned.clone(), T0)];
        let scan = |at: Instant| {
            let mut tab = table(at, recs.clone(), vec![beat(orphaned.clone(), 4, T0)]);
            tab.held = vec![orphaned.key()];
            tab
        };
        b.on_completion(opened(t, scan(t)), t);
        let later = t + TTL * 2;
        b.on_completion(Completion::Table(scan(later)), later);
        assert!(!b.needs_recovery(Path::new("/tf/o"), later));
        assert_eq!(b.dead_records(later), 0);
        // Negative case: the same watch without the kernel's word is dead.
        let mut b = book(t);
        let plain = |at: Instant| table(at, recs.clone(), vec![beat(orphaned.clone(), 4, T0)]);
        b.on_completion(opened(t, plain(t)), t);
        b.on_completion(Completion::Table(plain(later)), later);
        assert!(b.needs_recovery(Path::new("/tf/o"), later));
        assert_eq!(b.dead_records(later), 1);
    }

    #[test]
    fn another_live_incarnation_of_our_name_is_reported_once_and_its_records_stay_alive() {
        let t = Instant::now();
        let mut b = open_book(t);
        let twin = other("pod-a", 5);
        let recs = vec![entry("t1", "/tf/t", twin.clone(), T0)];
        let mut ev = Vec::new();
        for i in 0..6u64 {
            let at = t + TTL / 3 * (i as u32);
            ev.extend(b.on_completion(
                Completion::Table(table(at, recs.clone(), vec![beat(twin.clone(), i, T0)])),
                at,
            ));
            assert!(
                i == 0 || !b.needs_recovery(Path::new("/tf/t"), at),
                "the twin's beats change: alive"
            );
        }
        let said: Vec<String> = logs(&ev)
            .into_iter()
            .filter(|m| m.contains("another tfinit is using owner name pod-a"))
            .collect();
        assert_eq!(said.len(), 1, "{ev:?}");
    }

    #[test]
    fn a_recovery_waits_for_end_markings_and_its_rescan() {
        let t = Instant::now();
        let mut b = open_book(t);
        recorded(&mut b, RunId::from(1), "p1", t);
        let w = Path::new("/tf/x");
        assert!(b.may_recover(w));
        let end = Ended {
            ms: T0,
            how: "killed by SIGKILL".into(),
        };
        let req = b.exited(RunId::from(1), Some(end.clone()), vec!["a".into()]);
        assert_eq!(
            req,
            Some(Work::End {
                run: RunId::from(1),
                ended: end,
                in_progress: vec!["a".into()]
            })
        );
        assert!(!b.may_recover(w), "the end-marking is still queued");
        assert!(b.may_recover(Path::new("/tf/other")));
        assert!(
            b.needs_recovery(w, t),
            "an end-marking on its way makes the directory need a recovery, which waits for it"
        );
        let t1 = t + Duration::from_secs(1);
        b.on_completion(
            Completion::Ended {
                run: RunId::from(1),
                result: Ok(()),
            },
            t1,
        );
        assert!(b.may_recover(w));
        // The ended record counts before any rescan shows it.
        assert!(b.needs_recovery(w, t));
        let t2 = t1 + Duration::from_secs(1);
        assert_eq!(b.recovery_done(w, t2), Work::Rescan);
        assert!(
            !b.needs_recovery(w, t),
            "resolved until the rescan says otherwise"
        );
        // A table scanned before the recovery ended does not bring the record back...
        b.on_completion(Completion::Table(table(t1, vec![], vec![])), t2);
        assert!(!b.needs_recovery(w, t));
        // ...one scanned after it tells the truth: the record is still there (recovery failed).
        let mut left = entry("p1", "/tf/x", me(), T0);
        left.facts.ended = Some(Ended {
            ms: T0,
            how: "killed by SIGKILL".into(),
        });
        b.on_completion(
            Completion::Table(table(t2 + Duration::from_millis(1), vec![left], vec![])),
            t2,
        );
        assert!(b.needs_recovery(w, t));
    }

    #[test]
    fn an_end_marking_on_its_way_already_makes_its_directory_need_a_recovery() {
        let now = Instant::now();
        let mut b = open_book(now);
        let wd = Path::new("/tf/a");
        assert!(matches!(
            b.begin(&new_run(RunId::from(1), wd, "default", &[]), now, None),
            Start::Record { .. }
        ));
        b.on_completion(
            Completion::Created {
                run: RunId::from(1),
                result: Ok(RecordId::file("/s/records/r1.json")),
            },
            now,
        );
        assert!(
            !b.needs_recovery(wd, now),
            "a live run's record is not a dead one"
        );
        let ended = Ended {
            ms: 1,
            how: "killed by SIGKILL".into(),
        };
        assert!(matches!(
            b.exited(RunId::from(1), Some(ended), vec![]),
            Some(Work::End { .. })
        ));
        assert!(b.needs_recovery(wd, now), "the end-marking is queued");
        assert!(!b.may_recover(wd), "but the recovery waits for it");
        assert!(
            !b.needs_recovery(Path::new("/tf/b"), now),
            "other directories are not concerned"
        );
    }
}
