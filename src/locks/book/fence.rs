//! This owner's heartbeat and the fence: how old the last heartbeat that landed is, and the
//! stopping, then killing, of its state-locking runs before any observer may call it dead.

use std::time::{Duration, Instant};

use super::{Book, Event, Notice, RunRecord, RunTable, StoreState};
use crate::locks::labels::StoreFault;
use crate::locks::liveness::Fence;
use crate::locks::names::RunId;
use crate::locks::recorder::WriteError;
use crate::mutation::{self, Guard};

/// How far this owner has gone in stopping its recorded runs for want of a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceStage {
    /// The heartbeat is on time.
    Clear,
    /// Recorded runs got their graceful SIGTERM; new ones are refused.
    Stopping,
    /// Recorded runs were SIGKILLed; new ones are refused.
    Killing,
}

impl Book {
    /// A heartbeat stamped at `stamped` landed: the fence clears while it is young enough, and a
    /// stale heartbeat that is fresh again is said once.
    pub(super) fn beat_landed(&mut self, stamped: Instant, now: Instant, ev: &mut Vec<Event>) {
        self.heartbeat_ok = Some(self.heartbeat_ok.map_or(stamped, |t| t.max(stamped)));
        if now < Fence::after(stamped, self.ttl).stop_at {
            self.fence = FenceStage::Clear;
        }
        // A write that hung lands with an old stamp (other pods read that time in the file):
        // still stale, and said once; the next, fresh one ends it.
        let fresh = now.saturating_duration_since(stamped) <= self.ttl / 2;
        if fresh && std::mem::take(&mut self.stale_reported) {
            ev.push(Event::Log(Notice::HeartbeatAgain {
                dir: self.dir.clone(),
            }));
        }
        self.heartbeat_fault = None;
        self.answered(ev);
    }

    /// A heartbeat write failed: counted by kind, and said once per kind until one lands (the
    /// store's own error says what to do: a 403's names the Role rule). Nothing else changes:
    /// the heartbeat's age still counts from the last one that landed, and the fence acts on it.
    pub(super) fn beat_failed(&mut self, error: WriteError, ev: &mut Vec<Event>) {
        let WriteError::Volume(fault, error) = error else {
            // Not opened: the opening's own warning said so.
            return;
        };
        if let Some(i) = StoreFault::ALL.iter().position(|f| *f == fault) {
            self.heartbeat_failures[i] += 1;
        }
        if self.heartbeat_fault != Some(fault) {
            self.heartbeat_fault = Some(fault);
            ev.push(Event::Log(Notice::HeartbeatFailed {
                dir: self.dir.clone(),
                fault,
                error,
                ttl: self.ttl,
            }));
        }
    }

    /// The fence's next step at `now`, if one is due: recorded runs are stopped before any
    /// observer may call this owner dead (see [`Fence`]).
    pub(super) fn fence_due<R>(
        &mut self,
        runs: &RunTable<R, RunRecord>,
        now: Instant,
    ) -> Option<Event> {
        if !mutation::on(Guard::Fence) {
            return None;
        }
        let f = Fence::after(self.heartbeat_ok?, self.ttl);
        let kill = match self.fence {
            FenceStage::Clear if now >= f.kill_at => true,
            FenceStage::Clear if now >= f.stop_at => false,
            FenceStage::Stopping if now >= f.kill_at => true,
            _ => return None,
        };
        self.fence = if kill {
            FenceStage::Killing
        } else {
            FenceStage::Stopping
        };
        // Every state-locking run of this incarnation, recorded or not: its lock carries this
        // owner's Who, which another pod may release once it takes this owner for dead (the
        // simulation found an unrecorded run's lock released so, seed 1094).
        let runs: Vec<RunId> = runs.open_records().map(|(id, _)| id).collect();
        if runs.is_empty() {
            return None;
        }
        Some(Event::Fence { runs, kill })
    }

    /// How far the fence has gone: a state-locking run may start only while it is `Clear`.
    pub fn fence_stage(&self) -> FenceStage {
        self.fence
    }

    /// The log line for a fence event.
    pub fn fence_notice(&self, runs: &[RunId], kill: bool, now: Instant) -> Notice {
        Notice::Fenced {
            runs: runs.to_vec(),
            kill,
            age: self.heartbeat_age(now).unwrap_or_default(),
            ttl: self.ttl,
        }
    }

    /// Age of the last successful heartbeat write.
    pub fn heartbeat_age(&self, now: Instant) -> Option<Duration> {
        self.heartbeat_ok.map(|t| now.saturating_duration_since(t))
    }

    /// Whether the last successful heartbeat is older than TTL/2: other pods may soon take this
    /// owner for dead, so no record should be written under it (whether or not records of ours
    /// are on the volume now).
    pub fn heartbeat_stale(&self, now: Instant) -> bool {
        matches!(
            self.state,
            StoreState::Open | StoreState::NotAnswering { .. }
        ) && self.heartbeat_age(now).is_some_and(|a| a > self.ttl / 2)
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixture::*;
    use super::super::*;
    use super::*;

    #[test]
    fn a_stale_heartbeat_is_one_error_and_new_runs_go_without_records() {
        let t = Instant::now();
        let mut b = open_book(t);
        let hb_due = t + TTL / 3;
        assert_eq!(
            b.tick(hb_due),
            [],
            "the recorder keeps the heartbeat's clock"
        );
        // Stale whether or not records of ours are on the volume: the next record must not land
        // under it.
        assert!(b.heartbeat_stale(t + TTL));
        recorded(&mut b, RunId::from(1), "p1", t);
        let late = t + TTL / 2 + Duration::from_millis(2);
        assert!(b.next_wakeup().is_some_and(|w| w <= late));
        let ev = b.tick(late);
        assert_eq!(logs(&ev).len(), 1, "{ev:?}");
        assert!(logs(&ev)[0].contains("heartbeat has not been written for"));
        assert!(
            b.tick(late + Duration::from_secs(1))
                .iter()
                .all(|e| !matches!(e, Event::Log(_))),
            "reported once"
        );
        assert_eq!(b.view(late).state, StoreStatus::HeartbeatStale);
        assert_eq!(b.view(late).heartbeat_age, Some(late - t));
        match begin(&mut b, RunId::from(2), late) {
            Start::Unrecorded(Some(n)) => assert!(n.message().contains("heartbeat is stale")),
            other => panic!("{other:?}"),
        }
        let ev = b.on_completion(
            Completion::Heartbeat {
                result: Ok(()),
                stamped: late,
                wall_ms: T0,
            },
            late,
        );
        assert!(logs(&ev)[0].contains("heartbeat written again"));
        assert_eq!(b.view(late).state, StoreStatus::Open);
        assert!(matches!(
            begin(&mut b, RunId::from(3), late),
            Start::Record { .. }
        ));
        // A failed heartbeat changes nothing by itself but its one line.
        let ev = b.on_completion(
            Completion::Heartbeat {
                result: Err(WriteError::Volume(StoreFault::Other, "EIO".into())),
                stamped: late,
                wall_ms: T0,
            },
            late,
        );
        assert_eq!(logs(&ev).len(), 1, "{ev:?}");
        assert_eq!(b.view(late).state, StoreStatus::Open);
        assert!(matches!(
            begin(&mut b, RunId::from(4), late),
            Start::Record { .. }
        ));
    }

    #[test]
    fn failed_heartbeats_are_counted_by_kind_and_each_kind_said_once_until_one_lands() {
        let t = Instant::now();
        let mut b = open_book(t);
        let failed = |fault, text: &str| Completion::Heartbeat {
            result: Err(WriteError::Volume(fault, text.into())),
            stamped: t,
            wall_ms: T0,
        };
        let rule = "apiGroups: coordination.k8s.io, resources: leases";
        let forbidden =
            format!("403 Forbidden: the service account may not update Leases ({rule})");
        let ev = b.on_completion(failed(StoreFault::Denied, &forbidden), t);
        let said = logs(&ev);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].contains(rule) && said[0].contains("denied"),
            "{said:?}"
        );
        assert!(said[0].contains("20s after the last heartbeat"), "{said:?}");
        assert!(matches!(&ev[0], Event::Log(n) if n.level() == tracing::Level::ERROR));
        // The next ones of the same kind: counted, not said.
        for _ in 0..3 {
            let ev = b.on_completion(failed(StoreFault::Denied, &forbidden), t);
            assert!(logs(&ev).is_empty());
        }
        // Another kind is news.
        let ev = b.on_completion(failed(StoreFault::Unanswered, "timed out"), t);
        assert_eq!(logs(&ev).len(), 1);
        assert_eq!(b.view(t).heartbeat_failures, [4, 0, 1, 0]);
        // Not open: the opening said it; nothing counted.
        b.on_completion(
            Completion::Heartbeat {
                result: Err(WriteError::NotOpen),
                stamped: t,
                wall_ms: T0,
            },
            t,
        );
        assert_eq!(b.view(t).heartbeat_failures, [4, 0, 1, 0]);
        // One lands: the same kind later is said again.
        b.on_completion(
            Completion::Heartbeat {
                result: Ok(()),
                stamped: t,
                wall_ms: T0,
            },
            t,
        );
        let ev = b.on_completion(failed(StoreFault::Unanswered, "timed out"), t);
        assert_eq!(logs(&ev).len(), 1);
        assert_eq!(b.view(t).heartbeat_failures, [4, 0, 2, 0]);
    }

    #[test]
    fn locking_runs_are_stopped_then_killed_before_any_observer_may_call_us_dead() {
        let t = Instant::now();
        let mut b = open_book(t);
        recorded(&mut b, RunId::from(1), "p1", t);
        // An unrecorded run is nobody's concern.
        b.on_completion(
            Completion::Created {
                run: RunId::from(2),
                result: Err(WriteError::Volume(StoreFault::Other, "x".into())),
            },
            t,
        );
        let stop_at = t + TTL * 2 / 3;
        let kill_at = t + TTL - TTL / 10;
        assert_eq!(b.next_wakeup().map(|w| w <= stop_at), Some(true));
        assert!(!b
            .tick(stop_at - Duration::from_millis(1))
            .iter()
            .any(|e| matches!(e, Event::Fence { .. })));
        let ev = b.tick(stop_at);
        assert!(
            ev.contains(&Event::Fence {
                runs: vec![RunId::from(1)],
                kill: false
            }),
            "{ev:?}"
        );
        assert!(
            !b.tick(stop_at)
                .iter()
                .any(|e| matches!(e, Event::Fence { .. })),
            "once"
        );
        assert_eq!(b.fence_stage(), FenceStage::Stopping);
        // No new record while the fence is up, and no state-locking run may start at all: its
        // lock would carry this owner's Who (the simulation's seed 1094 found an unrecorded
        // run's lock released by a pod that took this owner for dead).
        assert!(matches!(
            begin(&mut b, RunId::from(3), stop_at),
            Start::Unrecorded(Some(_))
        ));
        assert_eq!(b.may_launch(RunId::from(3)), Launch::Fenced);
        assert_eq!(
            b.may_launch(RunId::from(9)),
            Launch::Yes,
            "a run that takes no lock may"
        );
        assert_eq!(b.next_wakeup().map(|w| w <= kill_at), Some(true));
        let ev = b.tick(kill_at);
        assert!(
            ev.contains(&Event::Fence {
                runs: vec![RunId::from(1), RunId::from(3)],
                kill: true
            }),
            "every state-locking run, recorded or not: {ev:?}"
        );
        assert!(b
            .fence_notice(&[RunId::from(1)], true, kill_at)
            .message()
            .contains("SIGKILLed"));
        // A heartbeat lands: clear again, records resume.
        b.on_completion(
            Completion::Heartbeat {
                result: Ok(()),
                stamped: kill_at,
                wall_ms: T0,
            },
            kill_at,
        );
        assert_eq!(b.fence_stage(), FenceStage::Clear);
        assert!(matches!(
            begin(&mut b, RunId::from(4), kill_at),
            Start::Record { .. }
        ));
    }

    #[test]
    fn the_heartbeats_age_counts_from_its_write_not_from_the_open_that_reported_it() {
        // The open wrote the heartbeat at t, then swept and scanned for a TTL/2 on a slow
        // volume: the heartbeat is already half a TTL old when the loop hears of it.
        let t = Instant::now();
        let mut b = book(t);
        let reported = t + TTL / 2 + Duration::from_millis(1);
        b.on_completion(opened(t, table(t, vec![], vec![])), reported);
        assert_eq!(b.heartbeat_age(reported), Some(reported - t));
        assert!(b.heartbeat_stale(reported), "no record lands under it");
        assert!(matches!(
            begin(&mut b, RunId::from(1), reported),
            Start::Unrecorded(Some(_))
        ));
    }
}
