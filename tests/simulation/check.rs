//! The invariants, checked after every step: what a violation is and why it happened (`Cause`),
//! the progress obligations, the figures of a schedule, and the checks themselves (a live
//! holder keeps its lock, a dead verdict spares recorded live runs, progress is on time).

use tfinit::locks::names::RunId;
use tfinit::locks::record::Owner;

use super::terraform::LockKey;
use super::world::{workspace_name, BookSide, Ms, World};

/// Why a force-unlock of a live holder's lock happened, as far as the simulation can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cause {
    /// Issue 18 finding 1: a wall-clock age judged a live owner dead because of clock skew.
    Skew,
    /// Finding 2: the run's record landed under a heartbeat already older than the TTL.
    StaleRecord,
    /// Finding 3: two live inits share the owner name (one heartbeat file, or the same-name rule).
    SharedName,
    /// Finding 4: a helper's stale view of its own init's live runs and records.
    TwoHelpers,
    /// The owner's heartbeat stalled under a live run that nobody stopped (no fence).
    NoFence,
    /// A live run of another incarnation with the same Who (hostNetwork pods on one node, a
    /// StatefulSet pod and its replacement), that no record names.
    SameWho,
    /// A live run of the very incarnation whose old record was recovered, that no record names
    /// (it started without one, its heartbeat being stale).
    OwnUnrecorded,
    /// The owner was judged dead while alive: another live incarnation has the same key (name,
    /// boot, start millisecond, pid), so both write one heartbeat file.
    SharedKey,
    /// The run's record landed but its create reported an error: its owner's book counted the
    /// run as unrecorded and its fence never stopped it.
    LandedButFailed,
    /// Issue 23 finding 1: the owner was judged by an observer's TTL shorter than its own, by
    /// which it beats and fences.
    OwnersTtl,
    /// Finding 2: a live run with the same Who on the same state, in another directory (a
    /// symbolic link, or a backend naming the same key).
    SameState,
    /// Finding 3: a free flock on a file that replaced the owner's lock file at its path.
    ReplacedLockFile,
    /// terraform's force-unlock compared the dead run's lock id, then its unconditional delete
    /// removed a live run's lock taken meanwhile (two recoveries at once: `recover.lock`).
    UnlockRace,
    /// A live run of the helper's own init, started before the helper (so in the live runs the
    /// init handed it), with the record's Who, that no record names.
    InitsLiveRun,
    /// Anything else.
    Other,
}

/// What failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VKind {
    /// A lock whose holder was alive was force-unlocked.
    Safety(Cause),
    /// An observer called an incarnation dead while one of its recorded runs was alive.
    DeadVerdict,
    /// A dead run's lock was not released in time.
    Progress,
    /// The schedule never ends (an event storm).
    Runaway,
}

/// The longest a volume operation takes in the calm phase.
pub const CALM_OP_MAX: Ms = 300;

/// More steps than any schedule needs.
pub const STEP_LIMIT: u64 = 2_000_000;

/// An invariant that failed.
#[derive(Debug, Clone)]
pub struct Violation {
    /// When.
    pub at: Ms,
    /// Which.
    pub kind: VKind,
    /// The details.
    pub text: String,
    /// What tells this failure from others of its kind (for the exploration summary).
    pub sig: String,
}

/// A progress obligation: this lock (or, for a dead run's record whose lock is free, this
/// record) must be gone by `deadline`.
#[derive(Debug, Clone)]
pub struct Obligation {
    /// The lock; None: the record is owed.
    pub lock: Option<u64>,
    /// The record that names its run.
    pub record: u64,
    /// Its key.
    pub key: LockKey,
    /// Created at.
    pub since: Ms,
    /// Due.
    pub deadline: Ms,
    /// The request that created it.
    pub text: String,
}

/// What a schedule did, for the figures.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stats {
    /// Events processed (each followed by the invariant checks).
    pub steps: u64,
    /// Force-unlocks that released a dead holder's lock.
    pub unlocks: u64,
    /// Helpers started.
    pub helpers: u64,
    /// Progress obligations met.
    pub met: u64,
    /// Dead locks not owed (wall step beyond CLOCK_SKEW, or a live same-Who run there).
    pub excused: u64,
    /// Time the real loop would spin on a 1 ms epoll timeout (an expired wait blocked by a
    /// recovery), simulated ms.
    pub spin_ms: u64,
    /// Loop wake-ups for a book timer still due right after `tick` (should be 0).
    pub past_timers: u64,
}

impl World {
    /// Records the first violation.
    pub fn fail(&mut self, kind: VKind, text: String) {
        if self.violation.is_none() {
            let at = self.now;
            self.log(|| format!("VIOLATION {kind:?}: {text}"));
            let sig = match &kind {
                VKind::Progress => format!("Progress ({})", self.progress_why),
                VKind::DeadVerdict => format!("DeadVerdict{}", self.dead_why),
                k => format!("{k:?}"),
            };
            self.violation = Some(Violation {
                at,
                kind,
                text,
                sig,
            });
        }
    }

    /// terraform processes of incarnation `inc` alive at time `t` whose record had landed by
    /// then, not marked ended.
    pub fn recorded_live_procs(&self, inc: usize, t: Ms) -> Vec<usize> {
        self.procs
            .iter()
            .enumerate()
            .filter(|(_, p)| p.inc == inc && p.started <= t && p.died > t)
            .filter(|(_, p)| {
                self.store.records.values().any(|s| {
                    s.inc == inc
                        && s.rec.run_id == p.run.to_string()
                        && s.rec.ended.is_none()
                        && s.landed <= t
                })
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// An observer (`who` says which, `ttl` its own TTL) calls incarnation `owner` dead after a
    /// read that started at `read_start` showed its heartbeat unchanged: none of its runs whose record was on the
    /// volume then was alive then (the owner's fence stopped them before any observer may
    /// decide). The verdict says nothing of runs recorded later: the owner may come back, and
    /// the re-check before an unlock reads again.
    pub fn check_dead_verdict(&mut self, who: &str, ttl: Ms, owner: &Owner, read_start: Ms) {
        if !self.cfg.dead_verdicts {
            return;
        }
        let Some(inc) = self
            .incs
            .iter()
            .position(|i| i.owner.same_incarnation(owner))
        else {
            return;
        };
        let live = self.recorded_live_procs(inc, read_start);
        if let Some(&p) = live.first() {
            let pr = &self.procs[p];
            let key = &self.incs[inc].key;
            let shared = self
                .incs
                .iter()
                .enumerate()
                .any(|(j, i)| j != inc && i.alive && i.key == *key);
            let text = format!(
                "{who} calls {key} dead after a read that started at {read_start} ms, but its recorded run {} (process {p}, {:?}, started at {} ms) was alive then; its last heartbeat that landed was stamped at {:?} ms{}",
                pr.run,
                pr.state,
                pr.started,
                self.incs[inc].beat_landed,
                if shared {
                    "; another live incarnation has the same key (name, boot, start ms, pid) and writes the same heartbeat file"
                } else {
                    ""
                }
            );
            self.dead_why = if shared {
                " (two live incarnations share a key)"
            } else if self.incs[inc].ttl > ttl {
                " (judged by a TTL shorter than the owner's)"
            } else if self.create_failed(inc, pr.run) {
                " (a create that reported an error landed)"
            } else {
                ""
            };
            self.fail(VKind::DeadVerdict, text);
        }
    }

    /// Whether incarnation `inc`'s book counts run `run`'s record as failed (its create
    /// reported an error).
    pub fn create_failed(&self, inc: usize, run: RunId) -> bool {
        match &self.incs[inc].book {
            BookSide::New(b) => matches!(
                b.record(run),
                Some(tfinit::locks::book::RecordStatus::Failed)
            ),
            BookSide::Old(_) => false,
        }
    }

    /// The invariants after every step.
    pub fn check(&mut self) {
        // Safety, belt and braces (the unlock itself checks first): a live terraform holding a
        // lock still holds it.
        for &i in &self.holders {
            let p = &self.procs[i];
            if let Some(id) = p.lock {
                if self.locks.get(&p.key).map(|l| l.id) != Some(id) {
                    let text = format!("process {i} ({}) lost its lock {id}", p.run);
                    self.fail(VKind::Safety(Cause::Other), text);
                    return;
                }
            }
        }
        // Progress: every obligation due is met.
        let now = self.now;
        let (locks, records) = (&self.locks, &self.store.records);
        let mut met = 0;
        self.obligations.retain(|o| {
            let owed = match o.lock {
                Some(id) => locks.get(&o.key).is_some_and(|l| l.id == id),
                None => records.contains_key(&o.record),
            };
            if !owed {
                met += 1;
            }
            owed
        });
        self.stats.met += met;
        if let Some(o) = self.obligations.iter().find(|o| now > o.deadline).cloned() {
            let last = self
                .outcomes
                .get(&o.record)
                .copied()
                .unwrap_or("no helper looked at it");
            self.progress_why = last;
            let what = match o.lock {
                Some(id) => format!(
                    "lock {id} of state s{} {} still held",
                    o.key.0,
                    workspace_name(o.key.1)
                ),
                None => format!(
                    "record {} of a dead run whose lock (state s{} {}) was free still on the volume",
                    o.record,
                    o.key.0,
                    workspace_name(o.key.1)
                ),
            };
            let text = format!(
                "{what} at {now} ms (last helper outcome for its record {}: {last}); owed since {} ms, due {} ms: {}",
                o.record, o.since, o.deadline, o.text
            );
            self.fail(VKind::Progress, text);
        }
    }
}
