//! A MODEL OF THE OLD CODE (commit 38bab66), kept only so that the simulation can show it fails:
//! a test that cannot fail proves nothing. Nothing here is used by tfinit.
//!
//! What is copied, as it was:
//! - the liveness rules of `src/locks/mod.rs` (`owner_dead_at`, `run_dead_at`,
//!   `wants_recovery_at`, `last_alive_ms_at`): a heartbeat's wall-clock stamp, written on the
//!   owner's node, compared with the observer's wall clock; one heartbeat file per owner NAME;
//!   an earlier incarnation of the observer's own name is dead at once;
//! - the parts of the old `Book` (`src/locks/book.rs`) behind issue 18's findings: the heartbeat
//!   counted as written when the store's opening finished (not when its write started);
//!   `begin` refusing a record under a stale heartbeat only while the owner already had records
//!   (`has_records()`), and queueing creates while the store was still opening; no fence.
//!
//! The old recorder (no fresh-heartbeat check before a create, heartbeats read by name) is
//! modelled in `legacy_recorder.rs`; the old recovery helper (no watching, no re-check before the
//! unlock, one listing, the live runs as they were when the helper started, no per-directory
//! serialisation in the init) where the simulation runs it: `helper.rs` and `init.rs`, under
//! `Rules::Legacy`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tfinit::locks::book::{Event, LiveRun, Start, StoreState};
use tfinit::locks::liveness::Facts;
use tfinit::locks::names::RunId;
use tfinit::locks::record::{Ended, Heartbeat, Owner};
use tfinit::locks::record_id::RecordId;
use tfinit::locks::recorder::{Entry, Work};

/// Old `owner_dead_at` (without its log line): why `rec`'s owner is dead at `now_ms` given the
/// heartbeat of its NAME, or None.
pub fn owner_dead_at(
    me: &Owner,
    rec: &Facts,
    hb: Option<&Heartbeat>,
    ttl: Duration,
    now_ms: u64,
) -> Option<String> {
    let age = |ms: u64| Duration::from_millis(now_ms.saturating_sub(ms));
    if rec.owner.same_incarnation(me) {
        return None;
    }
    if rec.owner.name == me.name {
        if let Some(hb) = hb {
            if !hb.owner.same_incarnation(me)
                && hb.updated_ms > me.started_ms
                && age(hb.updated_ms) <= ttl
            {
                return None;
            }
        }
        return Some(format!(
            "it is an earlier incarnation of this owner ({}), which restarted",
            me.name
        ));
    }
    match hb {
        Some(hb) if !hb.owner.same_incarnation(&rec.owner) => {
            if hb.owner.started_ms > rec.owner.started_ms {
                return Some(format!(
                    "owner {} restarted since (its heartbeat is from incarnation {})",
                    rec.owner.name,
                    hb.owner.incarnation()
                ));
            }
            let age = age(rec.updated_ms.max(hb.updated_ms));
            (age > ttl).then(|| {
                format!(
                    "it has no heartbeat of its own and nothing of it is newer than {}s",
                    age.as_secs()
                )
            })
        }
        Some(hb) => {
            let age = age(hb.updated_ms);
            (age > ttl).then(|| {
                format!(
                    "its heartbeat is {}ms old (TFINIT_OWNER_TTL is {}ms)",
                    age.as_millis(),
                    ttl.as_millis()
                )
            })
        }
        None => {
            let age = age(rec.updated_ms);
            (age > ttl).then(|| {
                format!(
                    "it has no heartbeat and the record is {}s old",
                    age.as_secs()
                )
            })
        }
    }
}

/// Old `run_dead_at`.
pub fn run_dead_at(
    me: &Owner,
    rec: &Facts,
    hb: Option<&Heartbeat>,
    ttl: Duration,
    now_ms: u64,
) -> Option<String> {
    if let Some(end) = &rec.ended {
        return Some(format!(
            "its terraform ended ({}) and may have left its lock",
            end.how
        ));
    }
    owner_dead_at(me, rec, hb, ttl, now_ms)
}

/// Old `last_alive_ms_at`.
pub fn last_alive_ms_at(me: &Owner, rec: &Facts, hb: Option<&Heartbeat>, ttl: Duration) -> u64 {
    if let Some(end) = &rec.ended {
        return end.ms;
    }
    let ttl_ms = ttl.as_millis() as u64;
    if rec.owner.name == me.name && !rec.owner.same_incarnation(me) {
        return me.started_ms.max(rec.updated_ms);
    }
    match hb {
        Some(hb) if hb.owner.same_incarnation(&rec.owner) => {
            hb.updated_ms.max(rec.updated_ms).saturating_add(ttl_ms)
        }
        Some(hb) if hb.owner.started_ms > rec.owner.started_ms => {
            hb.owner.started_ms.max(rec.updated_ms)
        }
        _ => rec.updated_ms.saturating_add(ttl_ms),
    }
}

/// Old `Table`: the records, and one heartbeat per owner NAME.
#[derive(Debug, Clone)]
pub struct Table {
    /// When the scan started.
    pub scanned: Instant,
    /// Every record.
    pub records: Vec<Entry>,
    /// The heartbeat file of each records' owner name.
    pub heartbeats: HashMap<String, Heartbeat>,
}

/// Old `Completion` (the parts the old book read).
#[derive(Debug)]
pub enum Completion {
    /// The store opened (or not); no time of the heartbeat's write: the book took `now`.
    Opened {
        /// Usable or why not.
        result: Result<(), String>,
        /// The records found.
        table: Option<Table>,
    },
    /// A heartbeat write finished.
    Heartbeat {
        /// On the volume or not.
        result: Result<(), String>,
        /// When its stamp was taken.
        stamped: Instant,
    },
    /// A create finished.
    Created {
        /// The run.
        run: RunId,
        /// The record's id, or why not.
        result: Result<RecordId, String>,
    },
    /// An end-marking finished.
    Ended {
        /// The run.
        run: RunId,
        /// Done or not.
        result: Result<(), String>,
    },
    /// A removal finished.
    Removed {
        /// The run.
        run: RunId,
        /// Done or not.
        result: Result<(), String>,
    },
    /// A rescan finished.
    Table(Table),
}

/// A run's record, as the old book tracked it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rec {
    Unrecorded,
    Pending(Instant),
    Abandoned,
    Written,
    Failed,
}

impl Rec {
    fn may_exist(self) -> bool {
        matches!(self, Rec::Pending(_) | Rec::Abandoned | Rec::Written)
    }
}

#[derive(Debug, Clone)]
struct Run {
    workdir: PathBuf,
    workspace: String,
    record: Rec,
    path: Option<RecordId>,
}

#[derive(Debug, Clone)]
struct Closing {
    workdir: PathBuf,
    path: Option<RecordId>,
    ended: Option<Ended>,
}

/// The old book, trimmed to what decides: store state, heartbeat age, runs and their records,
/// the table, our own end-markings and removals, recoveries done.
#[derive(Debug)]
pub struct Book {
    state: StoreState,
    me: Owner,
    ttl: Duration,
    record_timeout: Duration,
    host: String,
    table: Option<Table>,
    own: HashMap<RecordId, (Instant, Option<Entry>)>,
    recovered: HashMap<PathBuf, Instant>,
    heartbeat_ok: Option<Instant>,
    runs: HashMap<RunId, Run>,
    closing: HashMap<RunId, Closing>,
}

impl Book {
    /// A book whose store is being opened since `now`.
    pub fn new(
        me: Owner,
        ttl: Duration,
        record_timeout: Duration,
        host: String,
        now: Instant,
    ) -> Book {
        Book {
            state: StoreState::Opening { since: now },
            me,
            ttl,
            record_timeout,
            host,
            table: None,
            own: HashMap::new(),
            recovered: HashMap::new(),
            heartbeat_ok: None,
            runs: HashMap::new(),
            closing: HashMap::new(),
        }
    }

    /// Still opening.
    pub fn opening(&self) -> bool {
        matches!(self.state, StoreState::Opening { .. })
    }

    fn has_records(&self) -> bool {
        self.runs.values().any(|r| r.record.may_exist())
    }

    /// Old `heartbeat_stale`: only while records of ours may be on the volume.
    fn heartbeat_stale(&self, now: Instant) -> bool {
        matches!(
            self.state,
            StoreState::Open | StoreState::NotAnswering { .. }
        ) && self.has_records()
            && self
                .heartbeat_ok
                .is_some_and(|t| now.saturating_duration_since(t) > self.ttl / 2)
    }

    /// Old `begin`: a create is queued while the store is still opening, and refused under a
    /// stale heartbeat only when the owner already has records.
    pub fn begin(
        &mut self,
        run: RunId,
        workdir: &Path,
        workspace: &str,
        now: Instant,
        deadline: Option<Instant>,
    ) -> Start {
        let deadline = deadline.unwrap_or(now + self.record_timeout);
        let (start, record) = match self.state {
            StoreState::Failed | StoreState::NotAnswering { .. } => {
                (Start::Unrecorded(None), Rec::Unrecorded)
            }
            StoreState::Open if self.heartbeat_stale(now) => {
                (Start::Unrecorded(None), Rec::Unrecorded)
            }
            StoreState::Open | StoreState::Opening { .. } => {
                (Start::Record { deadline }, Rec::Pending(deadline))
            }
        };
        self.runs.insert(
            run,
            Run {
                workdir: workdir.to_path_buf(),
                workspace: workspace.to_string(),
                record,
                path: None,
            },
        );
        start
    }

    /// Old `exited`.
    pub fn exited(&mut self, run: RunId, ended: Option<Ended>) -> Option<Work> {
        let r = self.runs.remove(&run)?;
        if !r.record.may_exist() {
            return None;
        }
        self.closing.insert(
            run,
            Closing {
                workdir: r.workdir,
                path: r.path,
                ended: ended.clone(),
            },
        );
        Some(match ended {
            Some(ended) => Work::End {
                run,
                ended,
                in_progress: Vec::new(),
            },
            None => Work::Remove { run },
        })
    }

    /// Old `on_completion` (what decides; logs left out).
    pub fn on_completion(&mut self, c: Completion, now: Instant) -> Vec<Event> {
        let mut ev = Vec::new();
        match c {
            Completion::Opened {
                result: Ok(()),
                table,
            } => {
                self.table = table;
                // Finding 2: "heartbeat ok" when the opening finished, not when it was written.
                self.heartbeat_ok = Some(now);
                if self.opening() {
                    self.state = StoreState::Open;
                }
            }
            Completion::Opened { result: Err(_), .. } => {
                self.state = StoreState::Failed;
                for (id, r) in &mut self.runs {
                    if matches!(r.record, Rec::Pending(_)) {
                        ev.push(Event::Start {
                            run: *id,
                            recorded: false,
                        });
                    }
                    if r.record.may_exist() {
                        r.record = Rec::Unrecorded;
                    }
                }
            }
            Completion::Heartbeat { result, stamped } => {
                if result.is_ok() {
                    self.heartbeat_ok = Some(self.heartbeat_ok.map_or(stamped, |t| t.max(stamped)));
                    self.answered();
                }
            }
            Completion::Created { run, result } => {
                if result.is_ok() {
                    self.answered();
                }
                if let Some(r) = self.runs.get_mut(&run) {
                    let waiting = matches!(r.record, Rec::Pending(_));
                    match result {
                        Ok(path) => {
                            r.record = Rec::Written;
                            r.path = Some(path);
                            if waiting {
                                ev.push(Event::Start {
                                    run,
                                    recorded: true,
                                });
                            }
                        }
                        Err(_) => {
                            r.record = Rec::Failed;
                            if waiting {
                                ev.push(Event::Start {
                                    run,
                                    recorded: false,
                                });
                            }
                        }
                    }
                } else if let (Some(c), Ok(path)) = (self.closing.get_mut(&run), result) {
                    c.path = Some(path);
                }
            }
            Completion::Ended { run, result } => {
                let c = self.closing.remove(&run);
                if result.is_ok() {
                    self.answered();
                    if let Some(Closing {
                        workdir,
                        path: Some(path),
                        ended: Some(ended),
                    }) = c
                    {
                        let entry = Entry {
                            path: path.clone(),
                            workdir,
                            who: String::new(),
                            facts: Facts {
                                owner: self.me.clone(),
                                updated_ms: ended.ms,
                                ended: Some(ended),
                                needs_person_by: None,
                                ttl: None,
                            },
                        };
                        self.own.insert(path, (now, Some(entry)));
                    }
                }
            }
            Completion::Removed { run, result } => {
                let c = self.closing.remove(&run);
                if result.is_ok() {
                    self.answered();
                    if let Some(path) = c.and_then(|c| c.path) {
                        self.own.insert(path, (now, None));
                    }
                }
            }
            Completion::Table(t) => {
                self.own.retain(|_, (at, _)| *at > t.scanned);
                self.recovered.retain(|_, at| *at > t.scanned);
                self.table = Some(t);
            }
        }
        ev
    }

    fn answered(&mut self) {
        if let StoreState::NotAnswering { .. } = self.state {
            self.state = StoreState::Open;
        }
    }

    /// Old `tick`: records that did not land in time start without one (no fence existed).
    pub fn tick(&mut self, now: Instant) -> Vec<Event> {
        let mut expired: Vec<RunId> = self
            .runs
            .iter()
            .filter(|(_, r)| matches!(r.record, Rec::Pending(d) if d <= now))
            .map(|(id, _)| *id)
            .collect();
        expired.sort();
        let mut ev = Vec::new();
        for id in expired {
            if let Some(r) = self.runs.get_mut(&id) {
                r.record = Rec::Abandoned;
            }
            if !matches!(self.state, StoreState::NotAnswering { .. }) {
                self.state = StoreState::NotAnswering {
                    since: now,
                    last_warned: now,
                };
            }
            ev.push(Event::Start {
                run: id,
                recorded: false,
            });
        }
        ev
    }

    /// Old `next_wakeup` (record deadlines only: the stale report changed no decision).
    pub fn next_wakeup(&self) -> Option<Instant> {
        self.runs
            .values()
            .filter_map(|r| match r.record {
                Rec::Pending(d) => Some(d),
                _ => None,
            })
            .min()
    }

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

    /// Old `needs_recovery`, decided against the observer's wall clock `now_ms`.
    pub fn needs_recovery(&self, workdir: &Path, now_ms: u64) -> bool {
        if !matches!(
            self.state,
            StoreState::Open | StoreState::NotAnswering { .. }
        ) {
            return false;
        }
        if self
            .closing
            .values()
            .any(|c| c.workdir == workdir && c.ended.is_some())
        {
            return true;
        }
        let scanned = self.table.as_ref().map(|t| t.scanned);
        if self
            .recovered
            .get(workdir)
            .is_some_and(|at| scanned.is_none_or(|s| s < *at))
        {
            return false;
        }
        self.entries().any(|e| {
            let hb = self
                .table
                .as_ref()
                .and_then(|t| t.heartbeats.get(&e.facts.owner.name));
            e.workdir == workdir && run_dead_at(&self.me, &e.facts, hb, self.ttl, now_ms).is_some()
        })
    }

    /// Old `may_recover`.
    pub fn may_recover(&self, workdir: &Path) -> bool {
        !self.closing.values().any(|c| c.workdir == workdir)
    }

    /// Old `recovery_done`.
    pub fn recovery_done(&mut self, workdir: &Path, now: Instant) -> Work {
        self.recovered.insert(workdir.to_path_buf(), now);
        Work::Rescan
    }

    /// Old `live_runs` (no passwd entry: `@host`).
    pub fn live_runs(&self) -> Vec<LiveRun> {
        let mut out: Vec<LiveRun> = self
            .runs
            .values()
            .map(|r| LiveRun {
                workdir: r.workdir.clone(),
                workspace: r.workspace.clone(),
                who: format!("@{}", self.host),
                data_dir: None,
                started_ms: 0,
                unsure: None,
            })
            .collect();
        out.sort_by(|a, b| (&a.workdir, &a.workspace).cmp(&(&b.workdir, &b.workspace)));
        out
    }
}
