//! The recorder thread on a storage test double: the order of work, coalescing, the fresh-heartbeat
//! rule and the retries, through the loop's handle.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::*;
use crate::locks::record::{FileId, Found};
use crate::locks::record_id::RecordId;
use crate::locks::store::{Aside, RecoveryLock, Store};

/// What the test store holds and did.
#[derive(Default)]
pub(crate) struct Inner {
    pub records: BTreeMap<RecordId, Record>,
    pub heartbeats: HashMap<String, Heartbeat>,
    /// Every storage call, in order: `create r1`, `progress r1 [a]`, `end r1`, `remove r1`,
    /// `heartbeat`, `list`.
    pub log: Vec<String>,
    /// While set, every write blocks (as on a hung volume) once it is logged.
    pub hold: bool,
    /// Writes blocked by `hold` right now.
    pub in_flight: usize,
    /// Opening fails.
    pub fail_open: bool,
    /// Record writes fail.
    pub fail_writes: bool,
    /// Heartbeat writes fail.
    pub fail_heartbeats: bool,
    /// Incarnations (keys) whose lock file is free: the kernel proves them gone.
    pub gone: Vec<String>,
    /// Some: `lock_recovery` gives a right renewed until this instant (the Lease store's);
    /// None: it fails (the recorder never asks for one).
    pub recovery_fence: Option<Arc<Mutex<Instant>>>,
}

/// A storage test double: records in memory, every call logged, writes can be held or
/// failed. The recorder's logic runs unchanged on it.
#[derive(Clone, Default)]
pub(crate) struct TestStore(pub Arc<(Mutex<Inner>, Condvar)>);

impl TestStore {
    pub fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        let mut g = self.0 .0.lock().unwrap();
        let out = f(&mut g);
        self.0 .1.notify_all();
        out
    }

    /// Waits (against a deadline) until `f` holds.
    pub fn wait_for(&self, what: &str, f: impl Fn(&Inner) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut g = self.0 .0.lock().unwrap();
        while !f(&g) {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "timed out waiting for {what}; log {:?}",
                g.log
            );
            g = self.0 .1.wait_timeout(g, left).unwrap().0;
        }
    }

    fn logged_write(&self, entry: String) -> io::Result<()> {
        let mut g = self.0 .0.lock().unwrap();
        g.log.push(entry);
        g.in_flight += 1;
        self.0 .1.notify_all();
        while g.hold {
            g = self.0 .1.wait(g).unwrap();
        }
        g.in_flight -= 1;
        self.0 .1.notify_all();
        if g.fail_writes {
            return Err(io::Error::other("injected write failure"));
        }
        Ok(())
    }
}

impl Store for TestStore {
    fn location(&self) -> String {
        "test-store".into()
    }
    fn open(&self, _stale_temp: Duration) -> io::Result<()> {
        if self.with(|i| i.fail_open) {
            return Err(io::Error::other("injected open failure"));
        }
        Ok(())
    }
    fn list(&self) -> Vec<Found> {
        self.with(|i| {
            i.log.push("list".into());
            i.records
                .iter()
                .map(|(p, r)| Found::Record(p.clone(), Box::new(r.clone())))
                .collect()
        })
    }
    fn read(&self, id: &RecordId) -> io::Result<Record> {
        self.with(|i| i.records.get(id).cloned())
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }
    fn write(&self, record: &Record) -> io::Result<RecordId> {
        let what = match (
            &record.ended,
            self.with(|i| {
                i.records
                    .keys()
                    .any(|p| p.as_file().is_some_and(|p| p.ends_with(&record.run_id)))
            }),
        ) {
            (Some(_), _) => format!("end {}", record.run_id),
            (None, true) => format!("progress {} {:?}", record.run_id, record.in_progress),
            (None, false) => format!("create {}", record.run_id),
        };
        self.logged_write(what)?;
        let path = RecordId::file(&record.run_id);
        self.with(|i| i.records.insert(path.clone(), record.clone()));
        Ok(path)
    }
    fn remove(&self, id: &RecordId) -> io::Result<()> {
        self.logged_write(format!("remove {id}"))?;
        self.with(|i| i.records.remove(id));
        Ok(())
    }
    fn set_aside(&self, id: &RecordId, _why: &Aside) -> io::Result<RecordId> {
        self.with(|i| i.records.remove(id));
        Ok(RecordId::file(format!("{id}.aside")))
    }
    fn read_heartbeat(&self, owner: &Owner) -> io::Result<Option<Heartbeat>> {
        Ok(self.with(|i| i.heartbeats.get(&owner.key()).cloned()))
    }
    fn heartbeats(&self) -> io::Result<Vec<Heartbeat>> {
        Ok(self.with(|i| i.heartbeats.values().cloned().collect()))
    }
    fn heartbeats_named(&self, name: &str) -> io::Result<Vec<Heartbeat>> {
        Ok(self.with(|i| {
            i.heartbeats
                .values()
                .filter(|h| h.owner.name == name)
                .cloned()
                .collect()
        }))
    }
    fn write_heartbeat(&self, hb: &Heartbeat) -> io::Result<()> {
        let mut g = self.0 .0.lock().unwrap();
        g.log.push("heartbeat".into());
        if g.fail_heartbeats {
            return Err(io::Error::other("injected heartbeat failure"));
        }
        g.heartbeats.insert(hb.owner.key(), hb.clone());
        self.0 .1.notify_all();
        Ok(())
    }
    fn hold_incarnation_lock(
        &self,
        _me: &Owner,
    ) -> io::Result<Option<(std::os::fd::OwnedFd, FileId)>> {
        let f = std::fs::File::open("/dev/null")?;
        let id = FileId::of(&f)?;
        Ok(Some((f.into(), id)))
    }
    fn incarnation_gone(&self, owner: &Owner, _file: FileId) -> Option<bool> {
        self.with(|i| i.gone.contains(&owner.key()).then_some(true))
    }
    fn prune_heartbeats(&self, _: &[Record], _: &Owner, _: Duration, _: bool) {}
    fn lock_recovery(&self, _wait: Duration) -> io::Result<RecoveryLock> {
        match self.with(|i| i.recovery_fence.clone()) {
            Some(fence) => Ok(RecoveryLock::new(Box::new(()), Some(fence))),
            None => Err(io::Error::other("not used by the recorder")),
        }
    }
}

pub(crate) fn me() -> Owner {
    Owner {
        name: "pod-a".into(),
        boot_id: "b".into(),
        started_ms: 1,
        pid: 1,
        pod_uid: None,
        nonce: None,
    }
}

pub(crate) fn record(run: &str) -> Box<Record> {
    Box::new(Record {
        who: String::new(),
        run_id: run.into(),
        // Fixed times: the tests compare records made at different moments.
        started_ms: 0,
        updated_ms: 0,
        ..crate::locks::record::sample(&me())
    })
}

/// The id `r7` stands for.
pub(crate) fn id(run: &str) -> RunId {
    RunId::from(run[1..].parse::<u64>().expect("a run id like r7"))
}

pub(crate) fn create(run: &str) -> Work {
    Work::Create {
        run: id(run),
        record: record(run),
        env: vec!["USER=bob".into(), "HOME=/home/bob".into()],
    }
}

pub(crate) fn progress(run: &str, items: &[&str]) -> Work {
    Work::Progress {
        run: id(run),
        in_progress: items.iter().map(|s| s.to_string()).collect(),
    }
}

pub(crate) fn ended() -> Ended {
    Ended {
        ms: 5,
        how: "killed by SIGKILL".into(),
    }
}

/// Takes completions until `f` has seen what it wants (against a deadline).
fn collect_until(
    r: &Recorder,
    what: &str,
    mut f: impl FnMut(&Completion) -> bool,
) -> Vec<Completion> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    loop {
        // The loop's part: the thread, ended while idle, starts again for its heartbeat.
        r.tick(Instant::now());
        for c in r.take_completions() {
            let done = f(&c);
            seen.push(c);
            if done {
                return seen;
            }
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; got {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn started(store: &TestStore) -> Recorder {
    let r = Recorder::start(Box::new(store.clone()), me(), Duration::from_secs(30)).unwrap();
    collect_until(&r, "Opened", |c| matches!(c, Completion::Opened { .. }));
    r
}

fn writes(store: &TestStore) -> Vec<String> {
    store.with(|i| {
        i.log
            .iter()
            .filter(|l| *l != "list" && *l != "heartbeat")
            .cloned()
            .collect()
    })
}

#[test]
fn progress_sent_during_a_slow_write_is_coalesced_and_the_last_wins() {
    let store = TestStore::default();
    let r = started(&store);
    r.send(create("r1")).unwrap();
    collect_until(&r, "Created", |c| matches!(c, Completion::Created { .. }));
    store.with(|i| i.hold = true);
    r.send(progress("r1", &["p0"])).unwrap();
    store.wait_for("the first progress write in flight", |i| i.in_flight == 1);
    for n in 1..=20 {
        r.send(progress("r1", &[&format!("p{n}")])).unwrap();
    }
    // The recorder is stuck in the held write, so all 20 are queued behind it.
    assert_eq!(r.writes_pending(), 21);
    store.with(|i| i.hold = false);
    let (_, idle) = r.wait_idle(Instant::now() + Duration::from_secs(10));
    assert!(idle, "writes still pending: {}", r.writes_pending());
    let w = writes(&store);
    let progress_writes: Vec<_> = w.iter().filter(|l| l.starts_with("progress")).collect();
    assert!(progress_writes.len() <= 2, "{w:?}");
    assert_eq!(
        progress_writes.last().map(|s| s.as_str()),
        Some("progress r1 [\"p20\"]")
    );
    assert_eq!(
        store.with(|i| i.records[&RecordId::file("r1")].in_progress.clone()),
        vec!["p20"]
    );
    // The record's Who was computed by the recorder (passwd entry, or $USER with $HOME).
    let who = store.with(|i| i.records[&RecordId::file("r1")].who.clone());
    assert!(
        who.ends_with(&format!("@{}", crate::sys::hostname())),
        "{who}"
    );
}

#[test]
fn the_heartbeat_overtakes_queued_record_writes() {
    let store = TestStore::default();
    let r = started(&store);
    store.with(|i| i.hold = true);
    r.send(create("r1")).unwrap();
    store.wait_for("r1's create in flight", |i| i.in_flight == 1);
    r.send(create("r2")).unwrap();
    r.send(create("r3")).unwrap();
    r.send(Work::Heartbeat).unwrap();
    store.with(|i| i.hold = false);
    collect_until(&r, "the heartbeat", |c| {
        matches!(c, Completion::Heartbeat { result: Ok(()), .. })
    });
    assert!(r.wait_idle(Instant::now() + Duration::from_secs(10)).1);
    let log: Vec<String> = store.with(|i| i.log.clone());
    let after_open: Vec<&str> = log
        .iter()
        .skip_while(|l| !l.starts_with("create r1"))
        .filter(|l| *l != "list")
        .map(|s| s.as_str())
        .collect();
    assert_eq!(
        after_open,
        ["create r1", "heartbeat", "create r2", "create r3"]
    );
}

#[test]
fn a_remove_drops_queued_progress_and_removes_a_late_create() {
    let store = TestStore::default();
    let r = started(&store);
    store.with(|i| i.hold = true);
    r.send(create("r1")).unwrap();
    store.wait_for("r1's create in flight", |i| i.in_flight == 1);
    r.send(progress("r1", &["a"])).unwrap();
    r.send(progress("r1", &["a", "b"])).unwrap();
    // The run is over before its record landed.
    r.send(Work::Remove {
        run: RunId::from(1),
    })
    .unwrap();
    store.with(|i| i.hold = false);
    let seen = collect_until(&r, "Removed", |c| matches!(c, Completion::Removed { .. }));
    assert!(seen
        .iter()
        .any(|c| matches!(c, Completion::Created { result: Ok(_), .. })));
    assert_eq!(writes(&store), ["create r1", "remove r1"]);
    assert!(
        store.with(|i| i.records.is_empty()),
        "the late record stays behind"
    );
    assert_eq!(r.writes_pending(), 0);
}

#[test]
fn a_late_create_of_a_run_that_ended_is_marked_ended() {
    let store = TestStore::default();
    let r = started(&store);
    store.with(|i| i.hold = true);
    r.send(create("r1")).unwrap();
    store.wait_for("r1's create in flight", |i| i.in_flight == 1);
    r.send(progress("r1", &["a"])).unwrap();
    r.send(Work::End {
        run: RunId::from(1),
        ended: ended(),
        in_progress: vec!["a".into(), "b".into()],
    })
    .unwrap();
    store.with(|i| i.hold = false);
    collect_until(&r, "Ended", |c| {
        matches!(c, Completion::Ended { result: Ok(()), .. })
    });
    assert_eq!(writes(&store), ["create r1", "end r1"]);
    let rec = store.with(|i| i.records[&RecordId::file("r1")].clone());
    assert_eq!(rec.ended, Some(ended()));
    assert_eq!(rec.in_progress, ["a", "b"]);
}

#[test]
fn a_store_that_does_not_open_answers_every_write_with_an_error() {
    let store = TestStore::default();
    store.with(|i| i.fail_open = true);
    let r = Recorder::start(Box::new(store.clone()), me(), Duration::from_secs(30)).unwrap();
    let seen = collect_until(&r, "Opened", |c| matches!(c, Completion::Opened { .. }));
    // The records it can still list come along (none here).
    assert!(matches!(
        seen.last(),
        Some(Completion::Opened {
            result: Err(_),
            table: Some(Table { records, .. }),
            ..
        }) if records.is_empty()
    ));
    r.send(create("r1")).unwrap();
    let seen = collect_until(&r, "Created", |c| matches!(c, Completion::Created { .. }));
    assert!(
        matches!(seen.last(), Some(Completion::Created { result: Err(e), .. }) if *e == WriteError::NotOpen)
    );
    assert!(
        writes(&store).is_empty(),
        "nothing is written to a store that did not open"
    );
}

#[test]
fn a_failed_create_leaves_nothing_to_rewrite() {
    let store = TestStore::default();
    let r = started(&store);
    store.with(|i| i.fail_writes = true);
    r.send(create("r1")).unwrap();
    r.send(progress("r1", &["a"])).unwrap();
    let seen = collect_until(&r, "Written", |c| matches!(c, Completion::Written { .. }));
    assert!(seen
        .iter()
        .any(|c| matches!(c, Completion::Created { result: Err(_), .. })));
    assert!(
        matches!(seen.last(), Some(Completion::Written { result: Err(e), .. }) if *e == WriteError::NoRecord)
    );
    assert_eq!(writes(&store), ["create r1"]);
}

#[test]
fn a_closing_that_failed_is_tried_again_after_a_heartbeat_lands() {
    let store = TestStore::default();
    let r = started(&store);
    r.send(create("r1")).unwrap();
    r.send(create("r2")).unwrap();
    collect_until(
        &r,
        "r2 created",
        |c| matches!(c, Completion::Created { run, result: Ok(_) } if *run == id("r2")),
    );
    store.with(|i| i.fail_writes = true);
    r.send(Work::Remove { run: id("r1") }).unwrap();
    r.send(Work::End {
        run: id("r2"),
        ended: ended(),
        in_progress: vec![],
    })
    .unwrap();
    collect_until(&r, "the failed end-marking", |c| {
        matches!(c, Completion::Ended { result: Err(_), .. })
    });
    // A heartbeat while the volume still fails writes: nothing is closed, nothing reported.
    store.with(|i| i.fail_heartbeats = true);
    r.send(Work::Heartbeat).unwrap();
    let seen = collect_until(&r, "the failed heartbeat", |c| {
        matches!(c, Completion::Heartbeat { result: Err(_), .. })
    });
    assert!(!seen.iter().any(|c| matches!(c, Completion::Removed { .. })));
    assert_eq!(
        store.with(|i| i.records.len()),
        2,
        "both records are still there"
    );
    // The volume is back: the next heartbeat that lands closes both.
    store.with(|i| {
        i.fail_writes = false;
        i.fail_heartbeats = false;
    });
    r.send(Work::Heartbeat).unwrap();
    // Tried in the order they failed: the removal, then the end-marking.
    let seen = collect_until(
        &r,
        "the late end-marking",
        |c| matches!(c, Completion::Ended { run, result: Ok(()) } if *run == id("r2")),
    );
    assert!(
        seen.iter()
            .any(|c| matches!(c, Completion::Removed { run, result: Ok(()) } if *run == id("r1"))),
        "{seen:?}"
    );
    let left = store.with(|i| i.records.clone());
    assert_eq!(left.keys().collect::<Vec<_>>(), [&RecordId::file("r2")]);
    assert!(
        left[&RecordId::file("r2")].ended.is_some(),
        "r2 is marked ended"
    );
    // Closed once: a later heartbeat writes nothing more.
    let before = writes(&store).len();
    r.send(Work::Heartbeat).unwrap();
    collect_until(&r, "a heartbeat", |c| {
        matches!(c, Completion::Heartbeat { result: Ok(()), .. })
    });
    assert_eq!(writes(&store).len(), before, "{:?}", writes(&store));
}

#[test]
fn exit_waits_for_writes_only_until_its_deadline() {
    let store = TestStore::default();
    let r = started(&store);
    store.with(|i| i.hold = true);
    r.send(create("r1")).unwrap();
    store.wait_for("r1's create in flight", |i| i.in_flight == 1);
    let t = Instant::now();
    let (_, idle) = r.wait_idle(t + Duration::from_millis(200));
    assert!(!idle, "a held write cannot be finished");
    // Documented bound only: it returns at its deadline, not when the write ends.
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "waited {:?}",
        t.elapsed()
    );
    store.with(|i| i.hold = false);
    assert!(r.wait_idle(Instant::now() + Duration::from_secs(10)).1);
}

#[test]
fn heartbeats_and_open_report_a_table_of_records() {
    let store = TestStore::default();
    let mut old = *record("old");
    old.owner.name = "pod-b".into();
    old.workdir = "/tf/y".into();
    store.with(|i| i.records.insert(RecordId::file("old"), old.clone()));
    let r = Recorder::start(Box::new(store.clone()), me(), Duration::from_secs(30)).unwrap();
    let seen = collect_until(&r, "Opened", |c| matches!(c, Completion::Opened { .. }));
    let Some(Completion::Opened {
        result: Ok(()),
        table: Some(t),
        ..
    }) = seen.last()
    else {
        panic!("{seen:?}");
    };
    assert_eq!(t.records.len(), 1);
    assert_eq!(t.records[0].workdir, Path::new("/tf/y"));
    assert_eq!(t.beats.len(), 1, "pod-b's heartbeat was read");
    assert_eq!(t.beats[0].heartbeat, None, "pod-b has no heartbeat");
    r.send(Work::Heartbeat).unwrap();
    let seen = collect_until(&r, "a table", |c| matches!(c, Completion::Table(_)));
    assert!(seen
        .iter()
        .any(|c| matches!(c, Completion::Heartbeat { result: Ok(()), .. })));
    r.send(Work::Rescan).unwrap();
    collect_until(&r, "a rescan's table", |c| {
        matches!(c, Completion::Table(_))
    });
}

#[test]
fn a_record_lands_only_under_a_heartbeat_younger_than_a_third_of_the_ttl() {
    let store = TestStore::default();
    let ttl = Duration::from_millis(600);
    let r = Recorder::start(Box::new(store.clone()), me(), ttl).unwrap();
    collect_until(&r, "Opened", |c| matches!(c, Completion::Opened { .. }));
    // The heartbeat stops landing (a full disk); once it is older than TTL/3, a create is
    // not written: the heartbeat it must follow is tried first, and fails.
    store.with(|i| i.fail_heartbeats = true);
    std::thread::sleep(ttl / 3 + Duration::from_millis(50));
    r.send(Work::Create {
        run: RunId::from(1),
        record: record("r1"),
        env: vec![],
    })
    .unwrap();
    let seen = collect_until(
        &r,
        "r1's create",
        |c| matches!(c, Completion::Created { run, .. } if *run == RunId::from(1)),
    );
    let Some(Completion::Created { result: Err(e), .. }) = seen.last() else {
        panic!("{seen:?}");
    };
    assert_eq!(*e, WriteError::NoHeartbeat);
    assert!(store.with(|i| !i.log.iter().any(|l| l == "create r1")));
    // It lands again: the next create follows a heartbeat written for it, or one the
    // recorder's own clock wrote less than TTL/3 before.
    store.with(|i| i.fail_heartbeats = false);
    r.send(Work::Create {
        run: RunId::from(2),
        record: record("r2"),
        env: vec![],
    })
    .unwrap();
    let seen = collect_until(
        &r,
        "r2's create",
        |c| matches!(c, Completion::Created { run, .. } if *run == RunId::from(2)),
    );
    assert!(matches!(
        seen.last(),
        Some(Completion::Created { result: Ok(_), .. })
    ));
    let log = store.with(|i| i.log.clone());
    let at = log.iter().position(|l| l == "create r2").unwrap();
    assert_eq!(log[at - 1], "heartbeat", "{log:?}");
}

/// Polls `f` every 2 ms until it holds, playing the loop's part (the timer that starts the
/// thread again); fails after 10 s naming `what`.
fn poll_until(r: &Recorder, what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        r.tick(Instant::now());
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn the_thread_ends_when_idle_and_a_request_starts_it_again() {
    let store = TestStore::default();
    let r = started(&store);
    poll_until(&r, "the idle thread to end", || r.is_idle());
    // The heartbeat is the next timed work: the loop is told when to start the thread for it.
    let until = r.wake_at().expect("a time to start the thread again");
    assert!(
        until <= Instant::now() + Duration::from_secs(10),
        "TTL/3 at most: {until:?}"
    );
    r.send(create("r1")).unwrap();
    assert!(!r.is_idle(), "the request started a thread");
    let seen = collect_until(&r, "r1's create", |c| {
        matches!(c, Completion::Created { .. })
    });
    assert!(
        matches!(seen.last(), Some(Completion::Created { result: Ok(_), .. })),
        "{seen:?}"
    );
    assert!(writes(&store).contains(&"create r1".to_string()));
    poll_until(&r, "the thread to end again", || r.is_idle());
}

#[test]
fn an_idle_recorder_beats_only_when_the_loop_starts_it_on_its_timer() {
    let store = TestStore::default();
    let ttl = Duration::from_millis(300);
    let r = Recorder::start(Box::new(store.clone()), me(), ttl).unwrap();
    collect_until(&r, "Opened", |c| matches!(c, Completion::Opened { .. }));
    let beats = || store.with(|i| i.log.iter().filter(|l| *l == "heartbeat").count());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !r.is_idle() {
        assert!(Instant::now() < deadline, "the thread never ended");
        std::thread::sleep(Duration::from_millis(2));
    }
    // Without the loop's timer nothing beats: no thread runs.
    let before = beats();
    std::thread::sleep(ttl);
    assert_eq!(beats(), before, "a heartbeat with no thread running");
    assert!(r.wake_at().is_some_and(|t| t <= Instant::now()), "overdue");
    // With it, the heartbeat keeps its pace of TTL/3.
    let start = Instant::now();
    poll_until(&r, "five more heartbeats", || beats() >= before + 5);
    assert!(
        start.elapsed() < ttl * 5,
        "five beats at TTL/3 took {:?}",
        start.elapsed()
    );
}
