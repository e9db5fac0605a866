//! Lock-owner records, as the loop sees them: the book (what the loop knows about the store, in
//! memory), each state-locking run's record part in the run's entry of the one table of runs
//! ([`RunTable`], which the runs hold), and the handle on the recorder thread (which does every
//! storage call beside the loop). This concern is the only writer of the book and of the record
//! parts: the runs read them through [`Records::book`] and their table (read-only) and ask for
//! changes with [`Record`] actions, which the loop hands to [`Records::apply`] with the table.
//! Generic over the run part (`R`), nothing here can read or build a run's part. It takes the recorder's completions and its timers,
//! and tells the runs which of them may start and which the fence stops ([`RecordEvent`]).

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::spawn::RecoveryArgs;
use crate::config::InitConfig;
use crate::locks::book::{Book, Event, Left, NewRun, RunRecord, RunTable, Start};
use crate::locks::liveness::{monotonic_ns, Observer};
use crate::locks::names::RunId;
use crate::locks::record::{self, Ended, Owner};
use crate::locks::recorder::{Completion, Recorder, Work};
use crate::locks::store;

/// The longest the init's exit waits for queued and in-flight record writes. The least
/// TFINIT_KILL_MARGIN ([`crate::config::MIN_KILL_MARGIN`]) leaves room for it.
const EXIT_WAIT: Duration = Duration::from_secs(1);
const _: () = assert!(EXIT_WAIT.as_nanos() <= crate::config::MIN_KILL_MARGIN.as_nanos());

/// What the runs ask of the records: each changes the book, and most send storage work.
#[derive(Debug)]
pub(super) enum Record {
    /// A state-locking run is registered and its record's create sent; or, when the store cannot
    /// take one now, the answer is [`RecordEvent::Unrecorded`] (after the notice, if any). It
    /// waits until `deadline`, or TFINIT_RECORD_TIMEOUT from now.
    Begin {
        /// The run, as its record shows it.
        subject: Box<Subject>,
        /// The end of the run's first wait for the store, when it had one.
        deadline: Option<Instant>,
    },
    /// A run's resources in progress changed: its record is updated, when it has one.
    Progress {
        /// The run.
        run: RunId,
        /// What is in progress now.
        in_progress: Vec<String>,
    },
    /// A run is over: its record, when it has one, is marked ended (`ended`: it may have left
    /// its lock) or removed.
    Close {
        /// The run, as it left the table (what closing its record takes).
        left: Left,
        /// How it ended, when that may have left its lock.
        ended: Option<Ended>,
        /// The operations it left unfinished.
        in_progress: Vec<String>,
    },
    /// A lock recovery in `workdir` finished: the recorder rescans (the table counts there again
    /// once scanned after it).
    RecoveryDone {
        /// Where it ran.
        workdir: PathBuf,
    },
}

/// What the records mean for the runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum RecordEvent {
    /// The run waiting in `recording` may start (its record landed, failed, or timed out).
    Settled(RunId),
    /// The answer to the run's own [`Record::Begin`]: no record is written for it (the store
    /// failed, does not answer, or the heartbeat is stale), so it goes on at once. No news of the
    /// store: runs that wait for it have nothing new to look at.
    Unrecorded(RunId),
    /// This owner's heartbeat has not landed for long: its state-locking runs get their graceful
    /// SIGTERM, or (`kill`) SIGKILL.
    Fence {
        /// The runs.
        runs: Vec<RunId>,
        /// SIGKILL (else the graceful SIGTERM).
        kill: bool,
    },
}

impl RecordEvent {
    /// Whether this is news of the store (what may let runs that wait for it go on).
    pub(super) fn is_news(&self) -> bool {
        !matches!(self, RecordEvent::Unrecorded(_))
    }
}

/// A state-locking run, as its record shows it.
#[derive(Debug, Clone)]
pub(super) struct Subject {
    /// The run.
    pub(super) run: RunId,
    /// The shim's working directory.
    pub(super) cwd: PathBuf,
    /// Where terraform works.
    pub(super) workdir: PathBuf,
    /// The workspace whose state it locks.
    pub(super) workspace: String,
    /// The terraform subcommand.
    pub(super) subcommand: String,
    /// argv, redacted.
    pub(super) argv: Vec<String>,
    /// Its environment ($USER and $HOME make the lock's Who without a passwd entry).
    pub(super) env: Vec<String>,
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
    /// TFINIT_STORE, for the recovery helper.
    store_setting: crate::config::StoreSetting,
    ttl: Duration,
    /// TFINIT_OLDER_OWNER_TTL.
    older_ttl: Duration,
    /// Without a recorder thread (the unit tests, the simulation's seam): the work sent and the
    /// completions fed, by hand.
    #[cfg(any(test, feature = "mutation"))]
    by_hand: Option<ByHand>,
}

/// The recorder's channel, by hand: what the caller takes and feeds in its place.
#[cfg(any(test, feature = "mutation"))]
#[derive(Debug, Default)]
struct ByHand {
    /// The work sent, for the caller to take.
    sent: Vec<Work>,
    /// Completions fed by the caller, taken in with the news.
    done: Vec<Completion>,
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
            store_setting: cfg.store,
            ttl: cfg.owner_ttl,
            older_ttl: cfg.older_owner_ttl,
            #[cfg(any(test, feature = "mutation"))]
            by_hand: None,
        };
        match started {
            Ok(r) => records.recorder = Some(r),
            Err(e) => {
                let failed =
                    Completion::not_usable(format!("cannot start the recorder thread: {e}"));
                // No run exists yet: only the warning comes of it.
                let mut none = RunTable::<(), RunRecord>::new();
                records.complete(&mut none, failed, now);
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
    pub(super) fn take_news<R>(
        &mut self,
        runs: &mut RunTable<R, RunRecord>,
        now: Instant,
    ) -> Vec<RecordEvent> {
        let done = match &self.recorder {
            Some(r) => r.take_completions(),
            None => self.fed(),
        };
        let mut out = Vec::new();
        for c in done {
            out.extend(self.complete(runs, c, now));
        }
        out
    }

    /// When [`Records::record_timers`] is next due: the book's timers, and the recorder's
    /// heartbeat while its thread is not running.
    pub(super) fn next_wakeup<R>(&self, runs: &RunTable<R, RunRecord>) -> Option<Instant> {
        let recorder = self.recorder.as_ref().and_then(Recorder::wake_at);
        [self.book.next_wakeup(runs), recorder]
            .into_iter()
            .flatten()
            .min()
    }

    /// The book's timers (due at [`Records::next_wakeup`]): records that did not land in
    /// time, the fence, a stale heartbeat; and the recorder's thread started again for its
    /// heartbeat.
    pub(super) fn record_timers<R>(
        &mut self,
        runs: &mut RunTable<R, RunRecord>,
        now: Instant,
    ) -> Vec<RecordEvent> {
        if let Some(recorder) = &self.recorder {
            recorder.tick(now);
        }
        let events = self.book.tick(runs, now);
        self.handle(events, now)
    }

    /// What the loop and the runs may read of the records: the book, read-only.
    pub(super) fn book(&self) -> &Book {
        &self.book
    }

    /// Carries out what a run asked of the records at `now`; what it means for the runs comes
    /// back (a run that goes without a record, or news of a recorder found gone).
    pub(super) fn apply<R>(
        &mut self,
        runs: &mut RunTable<R, RunRecord>,
        r: Record,
        now: Instant,
    ) -> Vec<RecordEvent> {
        let request = match r {
            Record::Begin { subject, deadline } => {
                let run = subject.run;
                match self.create(runs, *subject, now, deadline) {
                    Some(create) => create,
                    None => return vec![RecordEvent::Unrecorded(run)],
                }
            }
            Record::Progress { run, in_progress } => {
                match self.book.progress(runs, run, in_progress) {
                    Some(update) => update,
                    None => return Vec::new(),
                }
            }
            Record::Close {
                left,
                ended,
                in_progress,
            } => match self.book.exited(runs, left, ended, in_progress) {
                Some(close) => close,
                None => return Vec::new(),
            },
            Record::RecoveryDone { workdir } => self.book.recovery_done(&workdir, now),
        };
        self.send(runs, request)
    }

    /// Queues storage work; never blocks. A recorder that is gone (its thread died) makes the
    /// store unusable: runs go on without records.
    fn send<R>(&mut self, runs: &mut RunTable<R, RunRecord>, request: Work) -> Vec<RecordEvent> {
        #[cfg(any(test, feature = "mutation"))]
        if let Some(hand) = &mut self.by_hand {
            hand.sent.push(request);
            return Vec::new();
        }
        let Some(recorder) = &self.recorder else {
            return Vec::new();
        };
        if recorder.send(request).is_ok() {
            return Vec::new();
        }
        tracing::error!("the lock-owner recorder thread is gone: tfinit goes on without lock-owner records (state-locking runs start without one); restart the pod to get them back");
        self.recorder = None;
        let gone = Completion::not_usable("the recorder thread is gone".into());
        self.complete(runs, gone, Instant::now())
    }

    /// At exit: waits at most min(1 s, the time left to `deadline`) for queued and in-flight
    /// record writes, so a finished run's record does not stay behind.
    pub(super) fn settle<R>(
        &mut self,
        runs: &mut RunTable<R, RunRecord>,
        deadline: Option<Instant>,
    ) {
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
            for e in self.book.on_completion(runs, c, now) {
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

    /// What a recovery helper for `workdir` is given, and whether it would only watch owners
    /// this pod has not watched for a TTL yet (none known dead).
    pub(super) fn recovery_args<R>(
        &self,
        runs: &RunTable<R, RunRecord>,
        workdir: &Path,
        now: Instant,
    ) -> (RecoveryArgs, bool) {
        let args = RecoveryArgs {
            state_dir: self.state_dir.clone(),
            store: self.store_setting,
            workdir: workdir.to_path_buf(),
            owner: self.book.owner().clone(),
            ttl: self.ttl,
            older_ttl: self.older_ttl,
            live: self.book.live_runs(runs),
            seen: self.book.observations(monotonic_ns),
        };
        (args, self.book.only_watching(runs, workdir, now))
    }

    /// Registers a state-locking run and decides whether it waits for its record (until
    /// `deadline`, or TFINIT_RECORD_TIMEOUT from `now`): the create to send, or None when
    /// terraform starts at once without a record (after the notice, when there is one).
    fn create<R>(
        &mut self,
        runs: &mut RunTable<R, RunRecord>,
        s: Subject,
        now: Instant,
        deadline: Option<Instant>,
    ) -> Option<Work> {
        let now_ms = record::now_ms();
        let new = NewRun {
            run: s.run,
            workdir: &s.workdir,
            workspace: &s.workspace,
            subcommand: &s.subcommand,
            argv: &s.argv,
            env: &s.env,
            started_ms: now_ms,
        };
        let start = self.book.begin(runs, &new, now, deadline);
        if let Start::Unrecorded(notice) = start {
            if let Some(n) = notice {
                n.log();
            }
            return None;
        }
        let data_dir = crate::protocol::env_value(&s.env, "TF_DATA_DIR")
            .map(|d| s.workdir.join(d).to_string_lossy().into_owned());
        let rec = record::Record {
            v: record::FORMAT,
            owner: self.book.owner().clone(),
            // The recorder computes it (it needs the passwd entry).
            who: String::new(),
            run_id: s.run.to_string(),
            cwd: s.cwd.to_string_lossy().into_owned(),
            workdir: s.workdir.to_string_lossy().into_owned(),
            workspace: s.workspace,
            subcommand: s.subcommand,
            argv: s.argv,
            started_ms: now_ms,
            in_progress: Vec::new(),
            updated_ms: now_ms,
            ended: None,
            needs_person: None,
            ttl_ms: Some(self.ttl.as_millis() as u64),
            data_dir,
        };
        Some(Work::Create {
            run: s.run,
            record: Box::new(rec),
            env: s.env,
        })
    }

    fn complete<R>(
        &mut self,
        runs: &mut RunTable<R, RunRecord>,
        c: Completion,
        now: Instant,
    ) -> Vec<RecordEvent> {
        if let Completion::Opened { lock: Some(l), .. } = &c {
            self.incarnation_lock = Some(Arc::clone(l));
        }
        let events = self.book.on_completion(runs, c, now);
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

#[cfg(any(test, feature = "mutation"))]
impl Records {
    /// Records without a recorder thread (the runs' tests, the simulation's seam): the work sent
    /// is taken with [`Self::take_sent`], completions are fed with [`Self::deliver`].
    pub(super) fn by_hand(book: Book, state_dir: PathBuf, ttl: Duration) -> Records {
        Records {
            book,
            recorder: None,
            incarnation_lock: None,
            state_dir,
            store_setting: crate::config::StoreSetting::File,
            ttl,
            older_ttl: crate::locks::liveness::LONGEST_TTL,
            by_hand: Some(ByHand::default()),
        }
    }

    /// Puts `c` in the channel, as if the recorder had done it: taken in with the next news.
    pub(super) fn deliver(&mut self, c: Completion) {
        if let Some(hand) = &mut self.by_hand {
            hand.done.push(c);
        }
    }

    /// What was sent to the recorder since the last call.
    pub(super) fn take_sent(&mut self) -> Vec<Work> {
        self.by_hand
            .as_mut()
            .map(|h| std::mem::take(&mut h.sent))
            .unwrap_or_default()
    }
}

impl Records {
    /// The completions fed by hand (none with a recorder thread, or without the test seam).
    fn fed(&mut self) -> Vec<Completion> {
        #[cfg(any(test, feature = "mutation"))]
        if let Some(hand) = &mut self.by_hand {
            return std::mem::take(&mut hand.done);
        }
        Vec::new()
    }
}

#[cfg(test)]
impl Records {
    /// Records without a recorder thread, for the runs' tests: completions are fed by hand.
    pub(super) fn for_tests(book: Book) -> Records {
        Records::by_hand(book, PathBuf::from("/state"), Duration::from_secs(30))
    }

    /// Feeds `c` as if the recorder had done it.
    pub(super) fn feed<R>(
        &mut self,
        runs: &mut RunTable<R, RunRecord>,
        c: Completion,
        now: Instant,
    ) -> Vec<RecordEvent> {
        self.complete(runs, c, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::locks::book::{Launch, RecordStatus};
    use crate::locks::recorder::{Table, WriteError};

    /// The one table of runs, with no run part (what the runs would hold).
    type Table0 = RunTable<(), RunRecord>;

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
            unlisted: None,
            unread: Vec::new(),
        };
        let opened = Completion::Opened {
            result: Ok(()),
            table: Some(table),
            passwd_user: None,
            location: None,
            beat: Some(now),
            lock: None,
        };
        assert_eq!(r.feed(&mut Table0::new(), opened, now), vec![]);
        r
    }

    fn subject(run: RunId) -> Box<Subject> {
        Box::new(Subject {
            run,
            cwd: PathBuf::from("/tf/x"),
            workdir: PathBuf::from("/tf/x"),
            workspace: "default".into(),
            subcommand: "apply".into(),
            argv: vec![],
            env: vec![],
        })
    }

    /// Run `run` enters the table (the runs' part) and asks for its record.
    fn begin(r: &mut Records, runs: &mut Table0, run: RunId, t: Instant) -> Vec<RecordEvent> {
        runs.insert(run, ());
        let subject = subject(run);
        r.apply(
            runs,
            Record::Begin {
                subject,
                deadline: None,
            },
            t,
        )
    }

    /// Run `run` leaves the table (the runs' part) and its record closes.
    fn close(r: &mut Records, runs: &mut Table0, run: RunId, t: Instant) -> Vec<RecordEvent> {
        let (_, left) = runs.remove(&run).expect("in the table");
        let close = Record::Close {
            left,
            ended: None,
            in_progress: vec![],
        };
        r.apply(runs, close, t)
    }

    #[test]
    fn an_open_store_asks_for_a_record_and_its_landing_lets_the_run_start() {
        let t0 = Instant::now();
        let mut r = opened_book(t0);
        let mut runs = Table0::new();
        let r1 = RunId::from(1);
        assert_eq!(begin(&mut r, &mut runs, r1, t0), vec![]);
        let [Work::Create { run, record, .. }] = &r.take_sent()[..] else {
            panic!("a create");
        };
        assert_eq!((*run, record.run_id.as_str()), (r1, "r1"));
        assert_eq!(r.book().may_launch(&runs, r1), Launch::Yes);
        let landed = Completion::Created {
            run: r1,
            result: Ok("/state/records/x.json".into()),
        };
        assert_eq!(
            r.feed(&mut runs, landed, t0),
            vec![RecordEvent::Settled(r1)]
        );
        assert!(r
            .book()
            .record(&runs, r1)
            .is_some_and(RecordStatus::may_exist));
        assert_eq!(close(&mut r, &mut runs, r1, t0), vec![]);
        assert_eq!(r.take_sent(), vec![Work::Remove { run: r1 }]);
    }

    #[test]
    fn a_store_that_cannot_be_used_starts_runs_without_records() {
        let t0 = Instant::now();
        let mut r = opened_book(t0);
        let mut runs = Table0::new();
        let r1 = RunId::from(1);
        assert_eq!(begin(&mut r, &mut runs, r1, t0), vec![]);
        let gone = Completion::not_usable("the recorder thread is gone".into());
        assert_eq!(r.feed(&mut runs, gone, t0), vec![RecordEvent::Settled(r1)]);
        let r2 = RunId::from(2);
        assert_eq!(
            begin(&mut r, &mut runs, r2, t0),
            vec![RecordEvent::Unrecorded(r2)],
            "no record any more"
        );
        assert!(!r
            .book()
            .record(&runs, r2)
            .is_some_and(RecordStatus::may_exist));
        let failed = Completion::Created {
            run: r1,
            result: Err(WriteError::NotOpen),
        };
        assert_eq!(
            r.feed(&mut runs, failed, t0),
            vec![],
            "a late answer starts nothing twice"
        );
    }

    #[test]
    fn a_heartbeat_that_does_not_land_fences_the_recorded_runs() {
        let t0 = Instant::now();
        let mut r = opened_book(t0);
        let mut runs = Table0::new();
        let r1 = RunId::from(1);
        begin(&mut r, &mut runs, r1, t0);
        r.feed(
            &mut runs,
            Completion::Created {
                run: r1,
                result: Ok("x".into()),
            },
            t0,
        );
        // 2/3 of the TTL (30 s) without a heartbeat landing.
        let stop = r.record_timers(&mut runs, t0 + Duration::from_secs(21));
        assert_eq!(
            stop,
            vec![RecordEvent::Fence {
                runs: vec![r1],
                kill: false
            }]
        );
        assert_eq!(r.book().may_launch(&runs, r1), Launch::Fenced);
        let kill = r.record_timers(&mut runs, t0 + Duration::from_secs(28));
        assert_eq!(
            kill,
            vec![RecordEvent::Fence {
                runs: vec![r1],
                kill: true
            }]
        );
    }
}
