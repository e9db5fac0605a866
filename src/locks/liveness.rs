//! Whether another incarnation is alive, decided on the observer's own monotonic clock.
//!
//! An incarnation proves it is alive by rewriting its heartbeat file with a new sequence number
//! every TTL/3. An observer never compares the wall-clock stamp in that file with its own clock
//! (two nodes' clocks are not comparable, and either may step): it remembers, on its own
//! monotonic clock, when it first saw the heartbeat's current content, and calls the incarnation
//! dead only when a read that started a full TTL after that still shows the same content. This is
//! client-go leader election's rule (it keeps `observedTime` and never reads the holder's
//! `renewTime` against its own clock).
//!
//! The TTL is the owner's, as its heartbeat (or, when that is missing, its record) states it, or
//! the observer's own when that is longer: the owner's fence counts by its own TTL, so an observer
//! with a shorter one would call a healthy owner dead between two of its beats (client-go judges
//! a Lease by the `leaseDurationSeconds` its holder wrote, kubernetes PR #114872). An owner that
//! states none (a tfinit before record format 4) is judged by [`Observer::older`]: the longest TTL
//! tfinit accepts unless a person says less (`TFINIT_OLDER_OWNER_TTL`).
//!
//! What makes the rule safe is the owner's side of the bargain ([`Fence`]): an owner whose last
//! heartbeat write that succeeded started at `w` has stopped every run with a record before
//! `w + TTL - TTL/10` unless a newer beat landed, and it writes a record only while its last beat
//! is younger than TTL/3. A read that starts at `since + TTL` and shows the beat first seen at
//! `since >= w` therefore comes after every such run is gone. The one thing it assumes is that
//! monotonic clocks tick at the same rate within a tenth of the TTL and that no process is frozen
//! for longer than that tenth (docs/records.md, "What the liveness rule assumes").
//!
//! Pure: no I/O and no clock of its own. The loop's book feeds it the recorder's scans; the
//! recovery helper starts from the loop's observations and keeps watching with reads of its own.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::record::{Ended, Heartbeat, Owner, Record};
use crate::mutation::{self, Guard};

/// What an observer compares between two reads of one incarnation's heartbeat: its sequence
/// number and its stamp (a heartbeat of the first format has no sequence number, so its stamp is
/// what changes). Missing (no heartbeat file) is a value of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Token {
    /// The heartbeat's sequence number (0 in the first format).
    pub seq: u64,
    /// Its wall-clock stamp, compared only for equality.
    pub updated_ms: u64,
    /// The owner's TTL it states, ms (None before record format 4). Constant for an
    /// incarnation, so it never makes a change by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
}

impl Token {
    /// What observers compare of `hb`.
    pub fn of(hb: &Heartbeat) -> Token {
        Token {
            seq: hb.seq,
            updated_ms: hb.updated_ms,
            ttl_ms: hb.ttl_ms.filter(|ms| *ms > 0),
        }
    }
}

/// What one observer has seen of one incarnation's heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Watch {
    /// The content last read (None: no heartbeat file).
    token: Option<Token>,
    /// When a read first showed that content (its end: the latest the content could be new).
    since: Instant,
    /// When the latest read showing it started.
    last_read: Instant,
    /// Whether this observer saw the content change (the incarnation was alive at `since`).
    changed: bool,
}

/// What an observer can say of an incarnation now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Its heartbeat changed under this observer's eyes within the last TTL.
    Alive,
    /// Not decided yet: watched for less than a TTL, no change seen.
    Watching {
        /// How much longer a read must wait to decide, counted from the latest read.
        left: Duration,
    },
    /// A read that started a full TTL after its content was first seen showed it unchanged.
    Dead {
        /// For how long the content was watched unchanged.
        watched: Duration,
    },
}

/// An incarnation's key: `name/incarnation` (see [`super::record::Owner::key`]).
pub type Key = String;

/// One observer's watches, by incarnation.
#[derive(Debug, Clone)]
pub struct Observer {
    ttl: Duration,
    older: Duration,
    watches: HashMap<Key, Watch>,
    /// The longest TTL each incarnation was seen to state (heartbeat or record).
    stated: HashMap<Key, Duration>,
}

/// The longest TTL tfinit accepts (TFINIT_OWNER_TTL): what an owner that states no TTL of its own
/// (a tfinit before record format 4) is judged by unless a person says less.
pub const LONGEST_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// One watch, as the loop hands it to a recovery helper (a process on the same kernel, so the
/// monotonic clock is the same one: `since_ns` is CLOCK_MONOTONIC).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seen {
    /// The incarnation.
    pub key: Key,
    /// The content last read.
    pub token: Option<Token>,
    /// When it was first seen, CLOCK_MONOTONIC nanoseconds.
    pub since_ns: u64,
    /// When the latest read showing it started, CLOCK_MONOTONIC nanoseconds.
    pub last_read_ns: u64,
    /// Whether the content was seen to change.
    pub changed: bool,
    /// The longest TTL the incarnation was seen to state, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stated_ttl_ms: Option<u64>,
}

impl Observer {
    /// An observer whose own TTL is `ttl` (TFINIT_OWNER_TTL): it judges an owner by the longer
    /// of that and the owner's own, and an owner that states none by the longer of `ttl` and
    /// `older` (TFINIT_OLDER_OWNER_TTL, [`LONGEST_TTL`] by default).
    pub fn new(ttl: Duration, older: Duration) -> Observer {
        Observer {
            ttl,
            older,
            watches: HashMap::new(),
            stated: HashMap::new(),
        }
    }

    /// TFINIT_OWNER_TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// What an owner that states no TTL is judged by (at least this observer's own TTL).
    pub fn older(&self) -> Duration {
        self.older.max(self.ttl)
    }

    /// `key` stated `ttl` as its owner's TTL (its record does; its heartbeat's tokens do by
    /// themselves): the longest stated counts.
    pub fn stated(&mut self, key: &str, ttl: Option<Duration>) {
        if let Some(ttl) = ttl.filter(|t| !t.is_zero()) {
            let e = self.stated.entry(key.to_string()).or_insert(ttl);
            *e = (*e).max(ttl);
        }
    }

    /// Whether `key`'s owner stated its TTL (else it is judged by [`Observer::older`]).
    pub fn knows_ttl(&self, key: &str) -> bool {
        self.stated.contains_key(key)
    }

    /// The TTL `key` is judged by: the longer of this observer's own and the owner's stated one,
    /// or [`Observer::older`] when it stated none.
    pub fn judging_ttl(&self, key: &str) -> Duration {
        if !mutation::on(Guard::OwnersTtl) {
            return self.ttl;
        }
        self.stated
            .get(key)
            .map_or(self.older(), |stated| (*stated).max(self.ttl))
    }

    /// A read of `key`'s heartbeat that started at `started` and returned `token` at `done`.
    /// Reads may be fed out of order (a slow read finishing after a faster later one): a read
    /// older than the latest one is ignored.
    pub fn saw(&mut self, key: &str, token: Option<Token>, started: Instant, done: Instant) {
        self.stated(key, token.and_then(|t| t.ttl_ms).map(Duration::from_millis));
        match self.watches.get_mut(key) {
            None => {
                self.watches.insert(
                    key.to_string(),
                    Watch {
                        token,
                        since: done,
                        last_read: started,
                        changed: false,
                    },
                );
            }
            Some(w) if started < w.last_read => {}
            Some(w) if w.token == token => w.last_read = started,
            Some(w) => {
                *w = Watch {
                    token,
                    since: done,
                    last_read: started,
                    changed: true,
                }
            }
        }
    }

    /// What this observer can say of `key` at `now`.
    pub fn verdict(&self, key: &str, now: Instant) -> Verdict {
        let ttl = self.judging_ttl(key);
        match self.watches.get(key) {
            None => Verdict::Watching { left: ttl },
            Some(w) => verdict_of(w, ttl, now),
        }
    }

    /// The content last read of `key`, if it was read.
    pub fn token(&self, key: &str) -> Option<Option<Token>> {
        self.watches.get(key).map(|w| w.token)
    }

    /// Forgets incarnations not in `keep` (their records are gone).
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.watches.retain(|k, _| keep(k));
        self.stated.retain(|k, _| keep(k));
    }

    /// Every watch, for a recovery helper; `mono` turns an instant into CLOCK_MONOTONIC ns.
    pub fn export(&self, mono: impl Fn(Instant) -> u64) -> Vec<Seen> {
        let mut out: Vec<Seen> = self
            .watches
            .iter()
            .map(|(k, w)| Seen {
                key: k.clone(),
                token: w.token,
                since_ns: mono(w.since),
                last_read_ns: mono(w.last_read),
                changed: w.changed,
                stated_ttl_ms: self.stated.get(k).map(|t| t.as_millis() as u64),
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }

    /// An observer that continues the watches in `seen`; `instant` turns CLOCK_MONOTONIC ns into
    /// an instant of this process (a watch it cannot turn is dropped: it starts again).
    pub fn import(
        ttl: Duration,
        older: Duration,
        seen: &[Seen],
        instant: impl Fn(u64) -> Option<Instant>,
    ) -> Observer {
        let mut stated = HashMap::new();
        for s in seen {
            if let Some(ms) = s.stated_ttl_ms.filter(|ms| *ms > 0) {
                stated.insert(s.key.clone(), Duration::from_millis(ms));
            }
        }
        let watches = seen
            .iter()
            .filter_map(|s| {
                let watch = Watch {
                    token: s.token,
                    since: instant(s.since_ns)?,
                    last_read: instant(s.last_read_ns)?,
                    changed: s.changed,
                };
                Some((s.key.clone(), watch))
            })
            .collect();
        Observer {
            ttl,
            older,
            watches,
            stated,
        }
    }
}

fn verdict_of(w: &Watch, ttl: Duration, now: Instant) -> Verdict {
    let watched = w.last_read.saturating_duration_since(w.since);
    if watched >= ttl {
        return Verdict::Dead { watched };
    }
    if w.changed {
        return Verdict::Alive;
    }
    if !mutation::on(Guard::Watch) {
        return Verdict::Dead { watched };
    }
    Verdict::Watching {
        left: (w.since + ttl).saturating_duration_since(now),
    }
}

/// `at` as CLOCK_MONOTONIC nanoseconds (std's `Instant` is that clock, but opaque), to hand a
/// watch to another process on the same kernel.
pub fn monotonic_ns(at: Instant) -> u64 {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
    });
    let now_i = Instant::now();
    match now_i.checked_duration_since(at) {
        Some(ago) => now.saturating_sub(ago.as_nanos() as u64),
        None => now.saturating_add(at.duration_since(now_i).as_nanos() as u64),
    }
}

/// The instant of CLOCK_MONOTONIC nanoseconds `ns` (see [`monotonic_ns`]); None when this
/// process cannot represent it.
pub fn instant_of(ns: u64) -> Option<Instant> {
    let now = monotonic_ns(Instant::now());
    let now_i = Instant::now();
    if ns <= now {
        now_i.checked_sub(Duration::from_nanos(now - ns))
    } else {
        now_i.checked_add(Duration::from_nanos(ns - now))
    }
}

/// The owner's side: when its state-locking runs must be stopped because its heartbeat has not
/// landed, counted from the start of its last heartbeat write that succeeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    /// Runs with records get their one graceful SIGTERM (two beats missed).
    pub stop_at: Instant,
    /// What is left of them is SIGKILLed: one tenth of the TTL before any observer may call this
    /// owner dead.
    pub kill_at: Instant,
}

impl Fence {
    /// The fence for a last good heartbeat write that started at `beat`.
    pub fn after(beat: Instant, ttl: Duration) -> Fence {
        Fence {
            stop_at: beat + ttl * 2 / 3,
            kill_at: beat + ttl - ttl / 10,
        }
    }
}

/// Whether a record may be written now: the last heartbeat write that succeeded started less than
/// TTL/3 ago (so every observer has at least two thirds of a TTL of watching ahead before it may
/// call this owner dead, and the fence stops the run before then if no beat lands). Otherwise the
/// recorder writes a heartbeat first.
pub fn fresh_enough(last_beat: Option<Instant>, now: Instant, ttl: Duration) -> bool {
    !mutation::on(Guard::FreshHeartbeat)
        || last_beat.is_some_and(|b| now.saturating_duration_since(b) < ttl / 3)
}

/// What the liveness rules read of a record: its owner, its last write and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// Who ran it.
    pub owner: Owner,
    /// Its last write, ms since the epoch.
    pub updated_ms: u64,
    /// Set when the init saw terraform die.
    pub ended: Option<Ended>,
    /// The incarnation that reported the record as needing a person, if one did.
    pub needs_person_by: Option<String>,
    /// The owner's TTL the record states (None before record format 4).
    pub ttl: Option<Duration>,
}

impl Facts {
    /// The facts of `rec`.
    pub fn of(rec: &Record) -> Facts {
        Facts {
            owner: rec.owner.clone(),
            updated_ms: rec.updated_ms,
            ended: rec.ended.clone(),
            needs_person_by: rec.needs_person.as_ref().map(|n| n.reported_by.clone()),
            ttl: rec.owner_ttl(),
        }
    }
}

/// Whether a record's run may still hold its lock, as far as one observer can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunState {
    /// Over: the text says what proves it. Its lock may be probed and released.
    Over(String),
    /// It may be running: its lock is never touched.
    Alive,
    /// Not known yet: its owner's heartbeat has been watched for less than a TTL.
    Watching {
        /// How much longer the watch needs.
        left: Duration,
    },
}

/// Whether the run of a record with `rec` is over, for observer `me`, given what the kernel says
/// of its incarnation's lock file (`kernel`, see [`super::store::Store::incarnation_gone`]:
/// Some(true) every process of it is gone, Some(false) one still holds it, None nothing known)
/// and what `me` has seen of its heartbeat (`verdict`). The only proofs of an end are: the init
/// saw its terraform die (`ended`), the kernel freed the lock every process of its incarnation
/// held, or a read a full TTL after its heartbeat was first seen shows it unchanged (and the
/// kernel does not say a process of it lives). No wall-clock stamp is compared with any clock.
pub fn run_state(me: &Owner, rec: &Facts, kernel: Option<bool>, verdict: Verdict) -> RunState {
    if let Some(end) = &rec.ended {
        return RunState::Over(format!(
            "its terraform ended ({}) and may have left its lock",
            end.how
        ));
    }
    if rec.owner.same_incarnation(me) {
        return RunState::Alive;
    }
    if kernel == Some(false) {
        // A process of that incarnation holds its lock file: whatever its heartbeat does (an
        // init that died outside a PID namespace leaves its runs behind), it is alive.
        return RunState::Alive;
    }
    if kernel == Some(true) {
        return RunState::Over(format!(
            "every process of incarnation {} is gone (the kernel freed the lock file they all held)",
            rec.owner.incarnation()
        ));
    }
    match verdict {
        Verdict::Dead { watched } => RunState::Over(format!(
            "its owner's heartbeat did not change in {}s of watching",
            watched.as_secs()
        )),
        Verdict::Alive => RunState::Alive,
        Verdict::Watching { left } => RunState::Watching { left },
    }
}

/// The latest moment a dead run could have taken a lock, ms since the epoch on its owner's own
/// clock: a lock created later than this (plus clock skew) is not that run's. From the owner's
/// own stamps only (the lock's Created is stamped by the same node): when the init saw terraform
/// die, else the owner's last heartbeat or the record's last write, plus one TTL (it may have
/// lived that long unseen: `ttl` is the one the owner is judged by, [`Observer::judging_ttl`]).
/// `hb` is that incarnation's heartbeat.
pub fn last_alive_ms(rec: &Facts, hb: Option<&Heartbeat>, ttl: Duration) -> u64 {
    if let Some(end) = &rec.ended {
        return end.ms;
    }
    let own_beat = hb
        .filter(|hb| hb.owner.same_incarnation(&rec.owner))
        .map_or(0, |hb| hb.updated_ms);
    own_beat
        .max(rec.updated_ms)
        .saturating_add(ttl.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(30);

    fn tok(seq: u64) -> Option<Token> {
        Some(Token {
            seq,
            updated_ms: 1_000 * seq,
            ttl_ms: Some(TTL.as_millis() as u64),
        })
    }

    #[test]
    fn an_unchanged_heartbeat_is_dead_only_after_a_read_a_full_ttl_later() {
        let t = Instant::now();
        let mut o = Observer::new(TTL, LONGEST_TTL);
        o.saw("a/1", tok(7), t, t);
        assert_eq!(o.verdict("a/1", t), Verdict::Watching { left: TTL });
        // A read at TTL - 1 ms is not enough, however late `now` is: only reads count.
        o.saw("a/1", tok(7), t + TTL - Duration::from_millis(1), t + TTL);
        assert!(matches!(
            o.verdict("a/1", t + 10 * TTL),
            Verdict::Watching { .. }
        ));
        o.saw("a/1", tok(7), t + TTL, t + TTL);
        assert_eq!(o.verdict("a/1", t + TTL), Verdict::Dead { watched: TTL });
    }

    #[test]
    fn a_change_makes_it_alive_and_restarts_the_watch() {
        let t = Instant::now();
        let mut o = Observer::new(TTL, LONGEST_TTL);
        o.saw("a/1", tok(1), t, t);
        o.saw("a/1", tok(2), t + TTL / 3, t + TTL / 3);
        assert_eq!(o.verdict("a/1", t + TTL / 3), Verdict::Alive);
        // Still the same beat a TTL after it was first seen: dead.
        o.saw("a/1", tok(2), t + TTL / 3 + TTL, t + TTL / 3 + TTL);
        assert!(matches!(
            o.verdict("a/1", t + 2 * TTL),
            Verdict::Dead { .. }
        ));
    }

    #[test]
    fn a_heartbeat_stamp_from_a_clock_far_behind_does_not_matter() {
        // The owner's clock is 31 s behind: its stamps look old, but they change.
        let t = Instant::now();
        let mut o = Observer::new(TTL, LONGEST_TTL);
        for i in 0..10u64 {
            let token = Some(Token {
                seq: i,
                updated_ms: 1_000_000 - 31_000 + i * 10_000,
                ttl_ms: Some(30_000),
            });
            let at = t + Duration::from_secs(10 * i);
            o.saw("b/1", token, at, at);
        }
        assert_eq!(
            o.verdict("b/1", t + Duration::from_secs(95)),
            Verdict::Alive
        );
    }

    #[test]
    fn a_read_that_started_before_a_later_one_is_ignored() {
        let t = Instant::now();
        let mut o = Observer::new(TTL, LONGEST_TTL);
        o.saw("a/1", tok(1), t, t);
        o.saw("a/1", tok(2), t + TTL, t + TTL);
        // A slow read that started at t + 1 s and saw the old beat finishes now.
        o.saw("a/1", tok(1), t + Duration::from_secs(1), t + TTL * 2);
        assert_eq!(o.verdict("a/1", t + TTL), Verdict::Alive);
    }

    #[test]
    fn a_missing_heartbeat_is_watched_like_any_content() {
        let t = Instant::now();
        let mut o = Observer::new(TTL, LONGEST_TTL);
        // Its record states the TTL (a missing heartbeat states none).
        o.stated("a/1", Some(TTL));
        o.saw("a/1", None, t, t);
        assert!(matches!(o.verdict("a/1", t), Verdict::Watching { .. }));
        o.saw("a/1", None, t + TTL, t + TTL);
        assert!(matches!(o.verdict("a/1", t + TTL), Verdict::Dead { .. }));
        // It appears: alive.
        o.saw("a/1", tok(1), t + TTL * 2, t + TTL * 2);
        assert_eq!(o.verdict("a/1", t + TTL * 2), Verdict::Alive);
    }

    #[test]
    fn watches_travel_to_a_helper_on_the_monotonic_clock() {
        let t = Instant::now();
        let mut o = Observer::new(TTL, LONGEST_TTL);
        o.saw("a/1", tok(1), t, t + Duration::from_millis(5));
        let ns = |i: Instant| i.duration_since(t).as_nanos() as u64 + 1_000;
        let seen = o.export(ns);
        let back = Observer::import(TTL, LONGEST_TTL, &seen, |n| {
            Some(t + Duration::from_nanos(n - 1_000))
        });
        assert_eq!(back.token("a/1"), Some(tok(1)));
        let mut back = back;
        back.saw(
            "a/1",
            tok(1),
            t + TTL + Duration::from_millis(5),
            t + TTL * 2,
        );
        assert!(matches!(
            back.verdict("a/1", t + TTL * 2),
            Verdict::Dead { .. }
        ));
    }

    #[test]
    fn the_fence_stops_and_kills_before_any_observer_may_decide() {
        let t = Instant::now();
        let f = Fence::after(t, TTL);
        assert_eq!(f.stop_at, t + Duration::from_secs(20));
        assert_eq!(f.kill_at, t + Duration::from_secs(27));
        assert!(fresh_enough(Some(t), t + Duration::from_secs(9), TTL));
        assert!(!fresh_enough(Some(t), t + Duration::from_secs(10), TTL));
        assert!(!fresh_enough(None, t, TTL));
    }

    fn stating(seq: u64, ttl: Duration) -> Option<Token> {
        Some(Token {
            seq,
            updated_ms: 1_000 * seq,
            ttl_ms: Some(ttl.as_millis() as u64),
        })
    }

    #[test]
    fn an_owner_with_a_longer_ttl_is_watched_for_its_own() {
        // The owner beats every 40 s (TTL 120 s); this observer's own TTL is 30 s.
        let owner_ttl = Duration::from_secs(120);
        let t = Instant::now();
        let mut o = Observer::new(TTL, LONGEST_TTL);
        o.saw("a/1", stating(1, owner_ttl), t, t);
        o.saw("a/1", stating(1, owner_ttl), t + TTL, t + TTL);
        assert!(
            matches!(o.verdict("a/1", t + TTL), Verdict::Watching { left } if left == owner_ttl - TTL),
            "{:?}",
            o.verdict("a/1", t + TTL)
        );
        // Its next beat lands at 40 s: alive, although 30 s passed unchanged.
        o.saw(
            "a/1",
            stating(2, owner_ttl),
            t + Duration::from_secs(40),
            t + Duration::from_secs(40),
        );
        assert_eq!(
            o.verdict("a/1", t + Duration::from_secs(40)),
            Verdict::Alive
        );
        o.saw(
            "a/1",
            stating(2, owner_ttl),
            t + Duration::from_secs(160),
            t + Duration::from_secs(160),
        );
        assert_eq!(
            o.verdict("a/1", t + Duration::from_secs(160)),
            Verdict::Dead { watched: owner_ttl }
        );
    }

    #[test]
    fn an_owner_with_a_shorter_ttl_is_watched_for_the_observers() {
        let t = Instant::now();
        let mut o = Observer::new(TTL, LONGEST_TTL);
        let short = Duration::from_secs(3);
        o.saw("a/1", stating(1, short), t, t);
        o.saw("a/1", stating(1, short), t + short, t + short);
        assert!(matches!(
            o.verdict("a/1", t + short),
            Verdict::Watching { .. }
        ));
        assert_eq!(o.judging_ttl("a/1"), TTL);
    }

    #[test]
    fn an_owner_that_states_no_ttl_is_judged_by_the_older_setting() {
        let t = Instant::now();
        let legacy = Some(Token {
            seq: 1,
            updated_ms: 1_000,
            ttl_ms: None,
        });
        // Default: the longest TTL tfinit accepts, so an hour unchanged proves nothing.
        let mut o = Observer::new(TTL, LONGEST_TTL);
        o.saw("a/1", legacy, t, t);
        let hour = Duration::from_secs(3600);
        o.saw("a/1", legacy, t + hour, t + hour);
        assert!(!o.knows_ttl("a/1"));
        assert!(matches!(
            o.verdict("a/1", t + hour),
            Verdict::Watching { .. }
        ));
        // A person stated that older pods ran with at most 60 s.
        let mut o = Observer::new(TTL, Duration::from_secs(60));
        o.saw("a/1", legacy, t, t);
        o.saw("a/1", legacy, t + TTL, t + TTL);
        assert!(matches!(
            o.verdict("a/1", t + TTL),
            Verdict::Watching { .. }
        ));
        o.saw(
            "a/1",
            legacy,
            t + Duration::from_secs(60),
            t + Duration::from_secs(60),
        );
        assert!(matches!(
            o.verdict("a/1", t + Duration::from_secs(60)),
            Verdict::Dead { .. }
        ));
        // Never less than the observer's own TTL.
        assert_eq!(Observer::new(TTL, Duration::from_secs(1)).older(), TTL);
    }

    #[test]
    fn a_stated_ttl_travels_to_a_helper() {
        let t = Instant::now();
        let mut o = Observer::new(TTL, LONGEST_TTL);
        o.stated("a/1", Some(Duration::from_secs(90)));
        o.saw("a/1", None, t, t);
        let seen = o.export(|i| i.duration_since(t).as_nanos() as u64 + 1);
        let back = Observer::import(TTL, LONGEST_TTL, &seen, |n| {
            Some(t + Duration::from_nanos(n - 1))
        });
        assert_eq!(back.judging_ttl("a/1"), Duration::from_secs(90));
    }
}
