//! Lock-owner records, as the loop sees them: the book (what the loop knows about the store and
//! each state-locking run's record, in memory) and the handle on the recorder thread (which does
//! every storage call beside the loop). Runs ask it what to do before terraform starts (is the
//! store open, does the directory need a recovery, is there a record to write); it takes the
//! recorder's completions and its timers, and tells the runs which of them may start and which the
//! fence stops ([`RecordEvent`]).

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::action::Refusal;
use super::spawn::RecoveryArgs;
use crate::config::InitConfig;
use crate::locks::book::{Book, Event, Launch, NewRun, RecordStatus, Start, View};
use crate::locks::liveness::{monotonic_ns, Observer};
use crate::locks::names::RunId;
use crate::locks::record::{self, Ended, Owner, Record};
use crate::locks::recorder::{Completion, Recorder, Request};
use crate::locks::store;

/// The longest the init's exit waits for queued and in-flight record writes. The least
/// TFINIT_KILL_MARGIN ([`crate::config::MIN_KILL_MARGIN`]) leaves room for it.
const EXIT_WAIT: Duration = Duration::from_secs(1);
const _: () = assert!(EXIT_WAIT.as_nanos() <= crate::config::MIN_KILL_MARGIN.as_nanos());

/// What the records mean for the runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum RecordEvent {
    /// The run waiting in `recording` may start (its record landed, failed, or timed out).
    Settled(RunId),
    /// This owner's heartbeat has not landed for long: its state-locking runs get their graceful
    /// SIGTERM, or (`kill`) SIGKILL.
    Fence {
        /// The runs.
        runs: Vec<RunId>,
        /// SIGKILL (else the graceful SIGTERM).
        kill: bool,
    },
}

/// A state-locking run, as its record shows it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Subject<'a> {
    /// The run.
    pub(super) run: RunId,
    /// The shim's working directory.
    pub(super) cwd: &'a Path,
    /// Where terraform works.
    pub(super) workdir: &'a Path,
    /// The workspace whose state it locks.
    pub(super) workspace: &'a str,
    /// The terraform subcommand.
    pub(super) subcommand: &'a str,
    /// argv, redacted.
    pub(super) argv: &'a [String],
    /// Its environment ($USER and $HOME make the lock's Who without a passwd entry).
    pub(super) env: &'a [String],
}

/// The book, and the recorder that writes what it asks for.
#[derive(Debug)]
pub(super) struct Records {
    book: Book,
    /// The recorder thread (all storage work), while it runs.
    recorder: Option<Recorder>,
    /// This incarnation's lock file, flocked, which every terraform run inherits (the kernel
    /// frees it once the init and every run are gone: the proof a container restart uses).
    incarnation_lock: Option<Arc<OwnedFd>>,
    state_dir: PathBuf,
    ttl: Duration,
    /// TFINIT_OLDER_OWNER_TTL.
    older_ttl: Duration,
}

impl Records {
    /// Starts the recorder on TFINIT_STATE_DIR and the book that mirrors it. Set-up, before the
    /// loop; touches no storage itself (the thread opens the store). Without a recorder (no thread
    /// could be started) the store counts as unusable, with the usual warning.
    pub(super) fn start(cfg: &InitConfig) -> Records {
        let me = Owner::current(&cfg.owner, cfg.pod_uid.clone());
        let now = Instant::now();
        let book = Book::new(
            &cfg.state_dir,
            me.clone(),
            Observer::new(cfg.owner_ttl, cfg.older_owner_ttl),
            cfg.record_timeout,
            cfg.force_unlock,
            crate::sys::hostname(),
            now,
        );
        let store = store::chosen(cfg.store, &cfg.state_dir, &me, cfg.owner_ttl);
        let started = Recorder::start(store, me, cfg.owner_ttl);
        let mut records = Records {
            book,
            recorder: None,
            incarnation_lock: None,
            state_dir: cfg.state_dir.clone(),
            ttl: cfg.owner_ttl,
            older_ttl: cfg.older_owner_ttl,
        };
        match started {
            Ok(r) => records.recorder = Some(r),
            Err(e) => {
                let failed =
                    Completion::not_usable(format!("cannot start the recorder thread: {e}"));
                // No run exists yet: only the warning comes of it.
                records.complete(failed, now);
            }
        }
        records
    }

    /// The recorder's eventfd, to watch (readable when completions are waiting).
    pub(super) fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.recorder.as_ref().map(Recorder::fd)
    }

    /// This incarnation's lock file, for terraform to inherit, once the store holds it.
    pub(super) fn incarnation_lock(&self) -> Option<&OwnedFd> {
        self.incarnation_lock.as_deref()
    }

    /// Takes in what the recorder did (never blocks): before anything is decided on records, so
    /// decisions use the latest table (the recorder rescans quietly after each heartbeat).
    pub(super) fn take_news(&mut self, now: Instant) -> Vec<RecordEvent> {
        let done = self
            .recorder
            .as_ref()
            .map(Recorder::take_completions)
            .unwrap_or_default();
        let mut out = Vec::new();
        for c in done {
            out.extend(self.complete(c, now));
        }
        out
    }

    /// The book's timers: records that did not land in time, the fence, a stale heartbeat.
    pub(super) fn tick(&mut self, now: Instant) -> Vec<RecordEvent> {
        let events = self.book.tick(now);
        self.handle(events, now)
    }

    /// When [`Self::tick`] has work next.
    pub(super) fn next_wakeup(&self) -> Option<Instant> {
        self.book.next_wakeup()
    }

    /// Queues storage work; never blocks. A recorder that is gone (its thread died) makes the
    /// store unusable: runs go on without records.
    pub(super) fn send(&mut self, request: Request) -> Vec<RecordEvent> {
        let Some(recorder) = &self.recorder else {
            return Vec::new();
        };
        if recorder.send(request).is_ok() {
            return Vec::new();
        }
        tracing::error!("the lock-owner recorder thread is gone: tfinit goes on without lock-owner records (state-locking runs start without one); restart the pod to get them back");
        self.recorder = None;
        let gone = Completion::not_usable("the recorder thread is gone".into());
        self.complete(gone, Instant::now())
    }

    /// At exit: waits at most min(1 s, the time left to `deadline`) for queued and in-flight
    /// record writes, so a finished run's record does not stay behind.
    pub(super) fn settle(&mut self, deadline: Option<Instant>) {
        let Some(recorder) = &self.recorder else {
            return;
        };
        let pending = recorder.writes_pending();
        if pending == 0 {
            return;
        }
        let now = Instant::now();
        let left = deadline.map_or(EXIT_WAIT, |d| d.saturating_duration_since(now));
        let wait = left.min(EXIT_WAIT);
        let (done, all) = recorder.wait_idle(now + wait);
        let now = Instant::now();
        for c in done {
            for e in self.book.on_completion(c, now) {
                if let Event::Log(notice) = e {
                    notice.log();
                }
            }
        }
        if !all {
            tracing::warn!(
                writes = pending, waited_ms = wait.as_millis() as u64, state_dir = %self.state_dir.display(),
                "exiting with lock-owner record writes unfinished: the state volume did not answer in time; records of runs that ended may stay behind until the next pod's recovery reads them"
            );
        }
    }

    /// The records part of `tfinit status`.
    pub(super) fn view(&self, now: Instant) -> View {
        self.book.view(now)
    }

    /// Whether the recorder is still opening the store (whether a dead run's record is in a
    /// directory is not known yet).
    pub(super) fn opening(&self) -> bool {
        self.book.opening()
    }

    /// Whether a state-locking run in `workdir` must wait for a lock recovery first (answered
    /// from memory, the recorder's last scan: no storage call).
    pub(super) fn needs_recovery(&self, workdir: &Path, now: Instant) -> bool {
        self.book.needs_recovery(workdir, now)
    }

    /// Whether a recovery in `workdir` may start now: this init's own end-markings there are on
    /// the volume.
    pub(super) fn may_recover(&self, workdir: &Path) -> bool {
        self.book.may_recover(workdir)
    }

    /// What a recovery helper for `workdir` is given, and whether it would only watch owners
    /// this pod has not watched for a TTL yet (none known dead).
    pub(super) fn recovery(&self, workdir: &Path, now: Instant) -> (RecoveryArgs, bool) {
        let args = RecoveryArgs {
            state_dir: self.state_dir.clone(),
            workdir: workdir.to_path_buf(),
            owner: self.book.owner().clone(),
            ttl: self.ttl,
            older_ttl: self.older_ttl,
            live: self.book.live_runs(),
            seen: self.book.observations(monotonic_ns),
        };
        (args, self.book.only_watching(workdir, now))
    }

    /// A lock recovery in `workdir` finished: the rescan to send (the table counts there again
    /// once scanned after it).
    pub(super) fn recovery_done(&mut self, workdir: &Path, now: Instant) -> Request {
        self.book.recovery_done(workdir, now)
    }

    /// Registers a state-locking run and decides whether it waits for its record (until
    /// `deadline`, or TFINIT_RECORD_TIMEOUT from `now`): the create to send, or None when
    /// terraform starts at once without a record (after the notice, when there is one).
    pub(super) fn begin(
        &mut self,
        s: Subject<'_>,
        now: Instant,
        deadline: Option<Instant>,
    ) -> Option<Request> {
        let now_ms = record::now_ms();
        let new = NewRun {
            run: s.run,
            workdir: s.workdir,
            workspace: s.workspace,
            subcommand: s.subcommand,
            argv: s.argv,
            env: s.env,
            started_ms: now_ms,
        };
        let start = self.book.begin(&new, now, deadline);
        if let Start::Unrecorded(notice) = start {
            if let Some(n) = notice {
                n.log();
            }
            return None;
        }
        let rec = Record {
            v: record::FORMAT,
            owner: self.book.owner().clone(),
            // The recorder computes it (it needs the passwd entry).
            who: String::new(),
            run_id: s.run.to_string(),
            cwd: s.cwd.to_string_lossy().into_owned(),
            workdir: s.workdir.to_string_lossy().into_owned(),
            workspace: s.workspace.to_string(),
            subcommand: s.subcommand.to_string(),
            argv: s.argv.to_vec(),
            started_ms: now_ms,
            in_progress: Vec::new(),
            updated_ms: now_ms,
            ended: None,
            needs_person: None,
            ttl_ms: Some(self.ttl.as_millis() as u64),
            data_dir: crate::protocol::env_value(s.env, "TF_DATA_DIR")
                .map(|d| s.workdir.join(d).to_string_lossy().into_owned()),
        };
        Some(Request::Create {
            run: s.run,
            record: Box::new(rec),
            env: s.env.to_vec(),
        })
    }

    /// Why state-locking `run` must not start now, if it must not: this owner's heartbeat does
    /// not land (the fence would stop it at once: its lock would carry the Who of an owner other
    /// pods may soon take for dead), recorded or not; or the volume cannot be written and holds
    /// a record with this pod's Who in its directory (another pod's recovery of it could release
    /// this run's lock).
    pub(super) fn refusal(&self, run: RunId) -> Option<Refusal> {
        match self.book.may_launch(run) {
            Launch::Yes => None,
            Launch::Fenced => Some(Refusal::Fenced),
            Launch::Shadowed => Some(Refusal::Shadowed),
            Launch::Unseen => Some(Refusal::Unseen),
        }
    }

    /// Whether `run`'s record is one to keep when terraform may have left its lock: it was, or
    /// may yet be, written.
    pub(super) fn keeps(&self, run: RunId) -> bool {
        self.book
            .record(run)
            .is_some_and(|r| !matches!(r, RecordStatus::Unrecorded | RecordStatus::Failed))
    }

    /// The update of `run`'s record for its new set of resources in progress, when it has one.
    pub(super) fn progress(&self, run: RunId, in_progress: Vec<String>) -> Option<Request> {
        self.book.progress(run, in_progress)
    }

    /// `run` is over (`ended`: in a way that may have left its lock): the end-marking or the
    /// removal of its record, when there is one.
    pub(super) fn exited(
        &mut self,
        run: RunId,
        ended: Option<Ended>,
        in_progress: Vec<String>,
    ) -> Option<Request> {
        self.book.exited(run, ended, in_progress)
    }

    fn complete(&mut self, c: Completion, now: Instant) -> Vec<RecordEvent> {
        if let Completion::Opened { lock: Some(l), .. } = &c {
            self.incarnation_lock = Some(Arc::clone(l));
        }
        let events = self.book.on_completion(c, now);
        self.handle(events, now)
    }

    /// Logs what the book says, and passes on what concerns the runs.
    fn handle(&mut self, events: Vec<Event>, now: Instant) -> Vec<RecordEvent> {
        let mut out = Vec::new();
        for e in events {
            match e {
                Event::Log(notice) => notice.log(),
                Event::Start { run, .. } => out.push(RecordEvent::Settled(run)),
                Event::Fence { runs, kill } => {
                    self.book.fence_notice(&runs, kill, now).log();
                    out.push(RecordEvent::Fence { runs, kill });
                }
            }
        }
        out
    }
}

#[cfg(test)]
impl Records {
    /// Records without a recorder thread, for the runs' tests: completions are fed by hand.
    pub(super) fn for_tests(book: Book) -> Records {
        Records {
            book,
            recorder: None,
            incarnation_lock: None,
            state_dir: PathBuf::from("/state"),
            ttl: Duration::from_secs(30),
            older_ttl: crate::locks::liveness::LONGEST_TTL,
        }
    }

    /// Feeds `c` as if the recorder had done it.
    pub(super) fn feed(&mut self, c: Completion, now: Instant) -> Vec<RecordEvent> {
        self.complete(c, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::locks::recorder::{Table, WriteError};

    fn opened_book(now: Instant) -> Records {
        let me = Owner::current("pod-a", None);
        let book = Book::new(
            Path::new("/state"),
            me,
            Observer::new(Duration::from_secs(30), crate::locks::liveness::LONGEST_TTL),
            Duration::from_secs(10),
            true,
            "pod-a".into(),
            now,
        );
        let mut r = Records::for_tests(book);
        let table = Table {
            scanned: now,
            records: vec![],
            beats: vec![],
            gone: vec![],
            held: Vec::new(),
        };
        let opened = Completion::Opened {
            result: Ok(()),
            table: Some(table),
            passwd_user: None,
            beat: Some(now),
            lock: None,
        };
        assert_eq!(r.feed(opened, now), vec![]);
        r
    }

    fn subject(run: RunId) -> Subject<'static> {
        Subject {
            run,
            cwd: Path::new("/tf/x"),
            workdir: Path::new("/tf/x"),
            workspace: "default",
            subcommand: "apply",
            argv: &[],
            env: &[],
        }
    }

    #[test]
    fn an_open_store_asks_for_a_record_and_its_landing_lets_the_run_start() {
        let t0 = Instant::now();
        let mut r = opened_book(t0);
        let r1 = RunId::from(1);
        let Some(Request::Create { run, record, .. }) = r.begin(subject(r1), t0, None) else {
            panic!("a create");
        };
        assert_eq!((run, record.run_id.as_str()), (r1, "r1"));
        assert_eq!(r.refusal(r1), None);
        let landed = Completion::Created {
            run: r1,
            result: Ok("/state/records/x.json".into()),
        };
        assert_eq!(r.feed(landed, t0), vec![RecordEvent::Settled(r1)]);
        assert!(r.keeps(r1));
        assert!(matches!(r.exited(r1, None, vec![]), Some(Request::Remove { run }) if run == r1));
    }

    #[test]
    fn a_store_that_cannot_be_used_starts_runs_without_records() {
        let t0 = Instant::now();
        let mut r = opened_book(t0);
        let r1 = RunId::from(1);
        assert!(r.begin(subject(r1), t0, None).is_some());
        let gone = Completion::not_usable("the recorder thread is gone".into());
        assert_eq!(r.feed(gone, t0), vec![RecordEvent::Settled(r1)]);
        let r2 = RunId::from(2);
        assert!(
            r.begin(subject(r2), t0, None).is_none(),
            "no record any more"
        );
        assert!(!r.keeps(r2));
        let failed = Completion::Created {
            run: r1,
            result: Err(WriteError::NotOpen),
        };
        assert_eq!(
            r.feed(failed, t0),
            vec![],
            "a late answer starts nothing twice"
        );
    }

    #[test]
    fn a_heartbeat_that_does_not_land_fences_the_recorded_runs() {
        let t0 = Instant::now();
        let mut r = opened_book(t0);
        let r1 = RunId::from(1);
        r.begin(subject(r1), t0, None);
        r.feed(
            Completion::Created {
                run: r1,
                result: Ok("x".into()),
            },
            t0,
        );
        // 2/3 of the TTL (30 s) without a heartbeat landing.
        let stop = r.tick(t0 + Duration::from_secs(21));
        assert_eq!(
            stop,
            vec![RecordEvent::Fence {
                runs: vec![r1],
                kill: false
            }]
        );
        assert_eq!(r.refusal(r1), Some(Refusal::Fenced));
        let kill = r.tick(t0 + Duration::from_secs(28));
        assert_eq!(
            kill,
            vec![RecordEvent::Fence {
                runs: vec![r1],
                kill: true
            }]
        );
    }
}
