//! Each state-locking run's record, from its create to its end-marking or removal: a run begins
//! (waiting for its record, or not), its create lands or fails, it exits and its record closes.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::run_table::{Left, RunTable};
use super::{Book, Event, FenceStage, Notice, Start, StoreState, NOT_ANSWERING_EVERY};
use crate::locks::liveness::Facts;
use crate::locks::names::RunId;
use crate::locks::record::Ended;
use crate::locks::record_id::RecordId;
use crate::locks::recorder::{Entry, Work, WriteError};
use crate::locks::who::who_for;

/// A state-locking run's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordStatus {
    /// None will be written (the store failed, does not answer, or its heartbeat is stale).
    Unrecorded,
    /// Its create is queued or in flight, and the run waits in `recording` until `deadline`.
    Pending {
        /// When the run stops waiting.
        deadline: Instant,
    },
    /// Its create is queued or in flight, and the run no longer waits for it: still tracked, so
    /// a late landing is marked ended or removed with its run.
    Abandoned,
    /// On the volume.
    Written {
        /// Its id in the store.
        path: RecordId,
    },
    /// Its create failed.
    Failed,
}

impl RecordStatus {
    /// Whether a record of this run is, or may soon be, on the volume.
    pub fn may_exist(&self) -> bool {
        matches!(
            self,
            RecordStatus::Pending { .. } | RecordStatus::Abandoned | RecordStatus::Written { .. }
        )
    }
}

/// A live state-locking run, as the recovery helper counts it: a possible holder of any lock
/// with its `Who` on a state it may lock (locks::state), created after it started.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LiveRun {
    /// Where terraform works (the text it was started with: the helper resolves it).
    pub workdir: PathBuf,
    /// Its workspace.
    pub workspace: String,
    /// The `Who` its lock carries.
    pub who: String,
    /// Its TF_DATA_DIR, absolute, when it set one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// When it started, ms since the epoch by this node's clock (the clock its lock's Created
    /// is stamped by).
    pub started_ms: u64,
    /// Why the state it locks cannot be read from its data directory, when it cannot
    /// ([`crate::locks::state::unsure_reason`]): it may then hold the lock of any state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unsure: Option<String>,
}

/// A new state-locking run, as the book registers it.
#[derive(Debug, Clone, Copy)]
pub struct NewRun<'a> {
    /// The run.
    pub run: RunId,
    /// Where terraform works (cwd + -chdir, as text).
    pub workdir: &'a Path,
    /// The workspace whose state it locks.
    pub workspace: &'a str,
    /// The terraform subcommand.
    pub subcommand: &'a str,
    /// argv, redacted.
    pub argv: &'a [String],
    /// Its environment: $USER and $HOME make the lock's Who without a passwd entry; TF_DATA_DIR
    /// and TF_CLI_ARGS say where its backend settings are.
    pub env: &'a [String],
    /// When it starts, ms since the epoch (this node's wall clock).
    pub started_ms: u64,
}

/// A state-locking run's record, as the book keeps it in the run's entry of the one table of runs
/// ([`RunTable`]): only the book reads or writes what is inside.
#[derive(Debug, Clone)]
pub struct RunRecord(pub(super) RecordLife);

/// Where a run's record is in its life.
#[derive(Debug, Clone)]
pub(super) enum RecordLife {
    /// Its run is live (or has just left the table, its close on its way as the next action).
    Open(RecordedRun),
    /// Its run is over: the end-marking or removal is queued or in flight.
    Closing(Closing),
}

/// The record of a live state-locking run.
#[derive(Debug, Clone)]
pub(super) struct RecordedRun {
    pub(super) workdir: PathBuf,
    pub(super) workspace: String,
    /// $USER and $HOME from its environment (they make the Who when passwd has no entry).
    pub(super) user_env: Vec<String>,
    pub(super) record: RecordStatus,
    /// [`LiveRun::data_dir`].
    pub(super) data_dir: Option<PathBuf>,
    /// [`LiveRun::started_ms`].
    pub(super) started_ms: u64,
    /// [`LiveRun::unsure`].
    pub(super) unsure: Option<String>,
}

/// An end-marking or removal queued or in flight.
#[derive(Debug, Clone)]
pub(super) struct Closing {
    pub(super) workdir: PathBuf,
    /// The `Who` of its run's lock.
    pub(super) who: String,
    /// The record's id, when its create had landed.
    pub(super) path: Option<RecordId>,
    /// How the run ended (an end-marking), or None (a removal).
    pub(super) ended: Option<Ended>,
}

impl RunRecord {
    /// The record of a live run, when it is one.
    pub(super) fn open(&self) -> Option<&RecordedRun> {
        match &self.0 {
            RecordLife::Open(r) => Some(r),
            RecordLife::Closing(_) => None,
        }
    }

    /// See [`Self::open`].
    pub(super) fn open_mut(&mut self) -> Option<&mut RecordedRun> {
        match &mut self.0 {
            RecordLife::Open(r) => Some(r),
            RecordLife::Closing(_) => None,
        }
    }

    /// The end-marking or removal on its way, when it is one.
    pub(super) fn closing(&self) -> Option<&Closing> {
        match &self.0 {
            RecordLife::Closing(c) => Some(c),
            RecordLife::Open(_) => None,
        }
    }
}

impl<R> RunTable<R, RunRecord> {
    /// Run `id`'s record status (read-only, for anyone); None for a run without a record (not
    /// state-locking, not begun yet) or whose run is over.
    pub fn record_status(&self, id: RunId) -> Option<&RecordStatus> {
        Some(&self.record(&id)?.open()?.record)
    }

    /// The records of live runs, oldest first.
    pub(super) fn open_records(&self) -> impl Iterator<Item = (RunId, &RecordedRun)> {
        self.records().filter_map(|(id, r)| Some((id, r.open()?)))
    }

    /// The end-markings and removals on their way, oldest first.
    pub(super) fn closings(&self) -> impl Iterator<Item = &Closing> {
        self.records().filter_map(|(_, r)| r.closing())
    }
}

impl Book {
    /// A run's record status; None for a run the book does not know (not state-locking, or over).
    pub fn record<'a, R>(
        &self,
        runs: &'a RunTable<R, RunRecord>,
        run: RunId,
    ) -> Option<&'a RecordStatus> {
        runs.record_status(run)
    }

    /// Registers a new state-locking run and decides whether it waits for a record: until
    /// `deadline` at the latest, or TFINIT_RECORD_TIMEOUT from `now` when None. A run that has
    /// waited for the store already (for its directory's end-markings, or for the store to open)
    /// passes the deadline of its first wait, so one TFINIT_RECORD_TIMEOUT bounds the whole wait.
    /// The record goes in the run's entry of `runs`; a run that is not there (over) gets none.
    pub fn begin<R>(
        &mut self,
        runs: &mut RunTable<R, RunRecord>,
        new: &NewRun<'_>,
        now: Instant,
        deadline: Option<Instant>,
    ) -> Start {
        let run = new.run;
        if !runs.contains_key(&run) {
            return Start::Unrecorded(None);
        }
        let deadline = deadline.unwrap_or(now + self.record_timeout);
        let user_env = new
            .env
            .iter()
            .filter(|kv| kv.starts_with("USER=") || kv.starts_with("HOME="))
            .cloned()
            .collect();
        let (start, record) = match self.state {
            StoreState::Failed => (Start::Unrecorded(None), RecordStatus::Unrecorded),
            StoreState::NotAnswering { since, last_warned } => {
                let warn = self.heartbeat_ok.is_some()
                    && now.saturating_duration_since(last_warned) >= NOT_ANSWERING_EVERY;
                let notice = warn.then(|| {
                    self.state = StoreState::NotAnswering {
                        since,
                        last_warned: now,
                    };
                    Notice::NotAnswering {
                        run,
                        dir: self.dir.clone(),
                        since: now.saturating_duration_since(since),
                    }
                });
                (Start::Unrecorded(notice), RecordStatus::Unrecorded)
            }
            StoreState::Open if self.heartbeat_stale(now) || self.fence != FenceStage::Clear => (
                Start::Unrecorded(Some(Notice::HeartbeatStaleRun { run })),
                RecordStatus::Unrecorded,
            ),
            StoreState::Open => (
                Start::Record { deadline },
                RecordStatus::Pending { deadline },
            ),
            // Its run waited TFINIT_RECORD_TIMEOUT for the store to open and gave up: no create
            // is sent before the store is open, so that every run with a record is started after
            // the loop holds the incarnation's lock file (and inherits it). Until a write
            // succeeds, the store does not answer.
            // No heartbeat of this incarnation landed yet, so the run is refused when it asks to
            // launch (Launch::Unseen), which says why.
            StoreState::Opening { .. } => {
                self.state = StoreState::NotAnswering {
                    since: now,
                    last_warned: now,
                };
                (Start::Unrecorded(None), RecordStatus::Unrecorded)
            }
        };
        let data_dir = crate::protocol::env_value(new.env, "TF_DATA_DIR")
            .filter(|d| !d.is_empty())
            .map(|d| new.workdir.join(d));
        let recorded = RecordedRun {
            workdir: new.workdir.to_path_buf(),
            workspace: new.workspace.to_string(),
            user_env,
            record,
            data_dir,
            started_ms: new.started_ms,
            unsure: crate::locks::state::unsure_reason(new.subcommand, new.argv, new.env),
        };
        runs.put_record(run, RunRecord(RecordLife::Open(recorded)));
        start
    }

    /// The request for a run's new set of resources in progress, when its record is (or may be)
    /// on the volume.
    pub fn progress<R>(
        &self,
        runs: &RunTable<R, RunRecord>,
        run: RunId,
        in_progress: Vec<String>,
    ) -> Option<Work> {
        runs.record_status(run)?
            .may_exist()
            .then_some(Work::Progress { run, in_progress })
    }

    /// The run `left` the table (exited, or refused while `recording`): its record is no longer
    /// live, and this returns the end-marking (`ended` given: it may have left its lock) or the
    /// removal of its record, when one is or may be on the volume; the record part stays in the
    /// run's entry until that is done. A recovery in its directory waits for that request.
    pub fn exited<R>(
        &mut self,
        runs: &mut RunTable<R, RunRecord>,
        left: Left,
        ended: Option<Ended>,
        in_progress: Vec<String>,
    ) -> Option<Work> {
        let run = left.run();
        let r = match runs.record(&run).and_then(RunRecord::open) {
            Some(r) if r.record.may_exist() => r,
            // No record is or will be on the volume (or none was begun): the entry goes.
            _ => {
                runs.take_record(left);
                return None;
            }
        };
        let closing = Closing {
            who: who_for(self.passwd_user.as_deref(), &self.host, &r.user_env),
            workdir: r.workdir.clone(),
            path: match &r.record {
                RecordStatus::Written { path } => Some(path.clone()),
                _ => None,
            },
            ended: ended.clone(),
        };
        if let Some(part) = runs.record_mut(&run) {
            part.0 = RecordLife::Closing(closing);
        }
        Some(match ended {
            Some(ended) => Work::End {
                run,
                ended,
                in_progress,
            },
            None => Work::Remove { run },
        })
    }

    /// A run's create finished: the run waiting for it starts (with its record, or without and a
    /// warning); a late landing of a run that is over counts for its end-marking or removal.
    pub(super) fn created<R>(
        &mut self,
        runs: &mut RunTable<R, RunRecord>,
        run: RunId,
        result: Result<RecordId, WriteError>,
        ev: &mut Vec<Event>,
    ) {
        if result.is_ok() {
            self.answered(ev);
        }
        let Some(part) = runs.record_mut(&run) else {
            return;
        };
        let r = match &mut part.0 {
            RecordLife::Open(r) => r,
            RecordLife::Closing(c) => {
                if let Ok(path) = result {
                    // Landed after its run was over: the end-marking or removal queued behind it
                    // applies to it.
                    c.path = Some(path);
                }
                return;
            }
        };
        let waiting = matches!(r.record, RecordStatus::Pending { .. });
        match result {
            Ok(path) => {
                // A late landing of a live run's record is as good as an early one.
                r.record = RecordStatus::Written { path };
                if waiting {
                    ev.push(Event::Start {
                        run,
                        recorded: true,
                    });
                }
            }
            Err(error) => {
                r.record = RecordStatus::Failed;
                if waiting {
                    ev.push(Event::Log(Notice::CreateFailed {
                        run,
                        dir: self.dir.clone(),
                        error,
                    }));
                    ev.push(Event::Start {
                        run,
                        recorded: false,
                    });
                }
            }
        }
    }

    /// A run's end-marking or removal finished: the record part leaves the run's entry (and the
    /// entry the table); until a scan made after it arrives, its record counts as this (ended
    /// record, or none). A failure is said with `failed`'s notice.
    pub(super) fn closed<R>(
        &mut self,
        runs: &mut RunTable<R, RunRecord>,
        run: RunId,
        result: Result<(), WriteError>,
        failed: fn(RunId, WriteError) -> Notice,
        now: Instant,
        ev: &mut Vec<Event>,
    ) {
        let closing = match runs.record(&run).map(|r| &r.0) {
            Some(RecordLife::Closing(_)) => match runs.drop_record(&run) {
                Some(RunRecord(RecordLife::Closing(c))) => Some(c),
                _ => None,
            },
            _ => None,
        };
        match result {
            Ok(()) => self.answered(ev),
            // An end-marking of a run whose create failed: said when it failed.
            Err(WriteError::NoRecord) => return,
            Err(error) => return ev.push(Event::Log(failed(run, error))),
        }
        let Some(Closing {
            workdir,
            who,
            path: Some(path),
            ended,
        }) = closing
        else {
            return;
        };
        let entry = ended.map(|ended| Entry {
            path: path.clone(),
            workdir,
            who,
            facts: Facts {
                owner: self.me.clone(),
                updated_ms: ended.ms,
                ended: Some(ended),
                needs_person_by: None,
                ttl: Some(self.ttl),
            },
        });
        self.own.insert(path, (now, entry));
    }

    /// Whether this incarnation has (or may soon have) a record of a live run on the volume.
    pub(super) fn has_records<R>(&self, runs: &RunTable<R, RunRecord>) -> bool {
        runs.open_records().any(|(_, r)| r.record.may_exist())
    }

    /// The live state-locking runs, recorded or not, for the recovery helper.
    pub fn live_runs<R>(&self, runs: &RunTable<R, RunRecord>) -> Vec<LiveRun> {
        let mut out: Vec<LiveRun> = runs
            .open_records()
            .map(|(_, r)| LiveRun {
                workdir: r.workdir.clone(),
                workspace: r.workspace.clone(),
                who: who_for(self.passwd_user.as_deref(), &self.host, &r.user_env),
                data_dir: r.data_dir.clone(),
                started_ms: r.started_ms,
                unsure: r.unsure.clone(),
            })
            .collect();
        out.sort_by(|a, b| (&a.workdir, &a.workspace).cmp(&(&b.workdir, &b.workspace)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixture::*;
    use super::super::*;
    use super::*;

    #[test]
    fn a_run_waits_for_its_record_and_starts_when_it_lands() {
        let t = Instant::now();
        let mut b = book(t);
        assert_eq!(b.view(t).state, StoreStatus::Opening);
        // No create goes out before the store is open (and the loop holds the incarnation's
        // lock file for the run to inherit): a run that gave up waiting gets none, and may not
        // launch before this incarnation's first heartbeat landed.
        assert!(matches!(
            begin(&mut b, RunId::from(0), t),
            Start::Unrecorded(None)
        ));
        assert_eq!(b.may_launch(RunId::from(0)), Launch::Unseen);
        let ev = b.on_completion(opened(t, table(t, vec![], vec![])), t);
        assert!(
            logs(&ev)[0].contains("lock-owner records enabled"),
            "{ev:?}"
        );
        assert_eq!(b.state(), StoreState::Open);
        assert_eq!(
            begin(&mut b, RunId::from(1), t),
            Start::Record {
                deadline: t + TIMEOUT
            }
        );
        assert!(b.tick(t + Duration::from_secs(1)).is_empty(), "not due yet");
        let ev = b.on_completion(
            Completion::Created {
                run: RunId::from(1),
                result: Ok("p1".into()),
            },
            t,
        );
        assert_eq!(
            ev,
            [Event::Start {
                run: RunId::from(1),
                recorded: true
            }]
        );
        assert_eq!(
            b.record(RunId::from(1)),
            Some(&RecordStatus::Written { path: "p1".into() })
        );
        assert!(b.progress(RunId::from(1), vec!["a".into()]).is_some());
        // Runs the book does not know (not state-locking) never write progress.
        assert!(b.progress(RunId::from(99), vec!["a".into()]).is_none());
    }

    #[test]
    fn a_failed_create_starts_the_run_with_todays_warning() {
        let t = Instant::now();
        let mut b = open_book(t);
        begin(&mut b, RunId::from(1), t);
        let ev = b.on_completion(
            Completion::Created {
                run: RunId::from(1),
                result: Err(WriteError::Volume(
                    StoreFault::Other,
                    "no space left".into(),
                )),
            },
            t,
        );
        assert!(logs(&ev)[0].contains("cannot write the lock-owner record"));
        assert!(ev.contains(&Event::Start {
            run: RunId::from(1),
            recorded: false
        }));
        assert_eq!(b.exited(RunId::from(1), None, vec![]), None);
    }

    #[test]
    fn a_refused_recording_run_removes_its_late_record_and_a_removal_hides_it() {
        let t = Instant::now();
        let mut b = open_book(t);
        begin(&mut b, RunId::from(1), t);
        // Shutdown refuses the run while its create is in flight.
        assert_eq!(
            b.exited(RunId::from(1), None, vec![]),
            Some(Work::Remove {
                run: RunId::from(1)
            })
        );
        assert_eq!(b.record(RunId::from(1)), None);
        assert!(b.live_runs().is_empty());
        // The create lands late: nothing starts; the removal queued behind it is tracked.
        let ev = b.on_completion(
            Completion::Created {
                run: RunId::from(1),
                result: Ok("p1".into()),
            },
            t,
        );
        assert!(ev.is_empty(), "{ev:?}");
        assert!(!b.may_recover(Path::new("/tf/x")));
        let t1 = t + Duration::from_secs(1);
        b.on_completion(
            Completion::Removed {
                run: RunId::from(1),
                result: Ok(()),
            },
            t1,
        );
        assert!(b.may_recover(Path::new("/tf/x")));
        // A table scanned before the removal still lists it: the removal wins.
        let mut stale = entry("p1", "/tf/x", me(), T0);
        stale.facts.ended = Some(Ended {
            ms: T0,
            how: "x".into(),
        });
        b.on_completion(Completion::Table(table(t, vec![stale], vec![])), t1);
        assert!(!b.needs_recovery(Path::new("/tf/x"), t));
    }

    #[test]
    fn live_runs_carry_the_who_terraform_will_write() {
        let t = Instant::now();
        let mut b = book(t);
        let env = vec![
            "USER=bob".to_string(),
            "HOME=/home/bob".to_string(),
            "X=1".to_string(),
        ];
        b.begin(
            &new_run(RunId::from(1), Path::new("/tf/x"), "staging", &env),
            t,
            None,
        );
        b.begin(
            &new_run(RunId::from(2), Path::new("/tf/y"), "default", &[]),
            t,
            None,
        );
        let who: Vec<String> = b.live_runs().into_iter().map(|r| r.who).collect();
        assert_eq!(who, ["bob@pod-a", "@pod-a"]);
        b.on_completion(
            Completion::Opened {
                result: Ok(()),
                table: Some(table(t, vec![], vec![])),
                passwd_user: Some("app".into()),
                location: None,
                beat: Some(t),
                lock: None,
            },
            t,
        );
        let runs = b.live_runs();
        assert_eq!(runs[0].who, "app@pod-a");
        assert_eq!(runs[0].workspace, "staging");
        assert_eq!(runs[1].workdir, Path::new("/tf/y"));
    }

    #[test]
    fn a_run_that_ends_while_its_create_is_in_flight_keeps_one_entry_until_its_removal_lands() {
        let t = Instant::now();
        let mut b = open_book(t);
        begin(&mut b, RunId::from(1), t);
        // The run leaves the table (the runs' part) while its create is in flight: its record is
        // no longer live, its removal waits behind the create, all in the run's one entry.
        let (_, left) = b.runs.remove(&RunId::from(1)).expect("in the table");
        let work = b.book.exited(&mut b.runs, left, None, vec![]);
        assert_eq!(
            work,
            Some(Work::Remove {
                run: RunId::from(1)
            })
        );
        assert!(b.runs.is_empty(), "no run is left for the runs concern");
        assert_eq!(b.record(RunId::from(1)), None, "not live");
        assert!(b.live_runs().is_empty());
        assert_eq!(b.may_launch(RunId::from(1)), Launch::Yes);
        assert!(
            !b.may_recover(Path::new("/tf/x")),
            "its removal is on its way"
        );
        // A record begun for a run that left is refused: no record part without its run.
        assert_eq!(
            begin(&mut b, RunId::from(2), t),
            Start::Record {
                deadline: t + TIMEOUT
            }
        );
        let (_, left2) = b.runs.remove(&RunId::from(2)).expect("in the table");
        let gone = new_run(RunId::from(2), Path::new("/tf/y"), "default", &[]);
        assert_eq!(
            b.book.begin(&mut b.runs, &gone, t, None),
            Start::Unrecorded(None)
        );
        assert!(b.book.exited(&mut b.runs, left2, None, vec![]).is_some());
        // The create lands after the run left: it starts nothing, and counts for the removal.
        let landed = Completion::Created {
            run: RunId::from(1),
            result: Ok("p1".into()),
        };
        assert!(b.on_completion(landed, t).is_empty());
        assert_eq!(b.runs.closings().count(), 2);
        let removed = Completion::Removed {
            run: RunId::from(1),
            result: Ok(()),
        };
        b.on_completion(removed, t);
        assert_eq!(
            b.runs.closings().count(),
            1,
            "the entry went with its record part"
        );
        assert!(
            !b.may_recover(Path::new("/tf/x")),
            "run 2's removal is still on its way"
        );
        let removed = Completion::Removed {
            run: RunId::from(2),
            result: Ok(()),
        };
        b.on_completion(removed, t);
        assert_eq!(b.runs.records().count(), 0, "no entry is left");
        assert!(b.may_recover(Path::new("/tf/x")));
    }
}
