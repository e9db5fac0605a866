//! Turns one safety guard off at a time, for the simulation's mutation check (tests/simulation.rs;
//! house habit 14: a check that decides safety is tested by breaking it, and a guard whose removal
//! nothing notices is not tested). Each guard's check asks [`on`] where it decides.
//!
//! Only the cargo feature `mutation` can turn a guard off, and only the tests enable it (the crate
//! is its own dev-dependency with that feature, so `cargo build --release` never has it): without
//! it [`on`] is the constant `true` and `disable` does not exist. With it, the switch is
//! per thread, so tests running side by side in one process do not see each other's.
//!
//! The same feature lets the simulation set the wall clock that the records' `now_ms`
//! (locks/record.rs) reads in its thread ([`at_wall_ms`]): the init's code it drives stamps records with the
//! simulated node's clock (skewed, stepping), as the real code stamps them with the host's.

/// A safety guard of the liveness and recovery rules (docs/reliability.md, "Mutation check").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Guard {
    /// An unchanged heartbeat is dead only after a full TTL of watching (liveness `verdict_of`,
    /// rule 3 of docs/records.md "Who is dead"); off: unchanged at the first read is dead.
    Watch,
    /// An owner whose heartbeat does not land stops, then kills, its state-locking runs
    /// (book `fence_due`).
    Fence,
    /// A record is written only under a heartbeat younger than TTL/3 (liveness `fresh_enough`).
    FreshHeartbeat,
    /// No state-locking run before a heartbeat of this incarnation landed (`Launch::Unseen`).
    Unseen,
    /// No state-locking run where a record with this pod's Who is while the store cannot be
    /// written (`Launch::Shadowed`).
    Shadowed,
    /// One recovery at a time per state directory (`recover.lock`, recover/mod.rs `run`).
    RecoverLock,
    /// A live tfinit on the host a lock's Who names makes the lock ambiguous
    /// (recover/evidence.rs `live_on_host`).
    LiveOnHost,
    /// A free flock proves an incarnation gone only on the very file it locked, by device and
    /// inode (store `same_lock_file`, `kernel_proof_with`); off: whatever file is at the path.
    LockFileInode,
    /// A lock belongs to the state it guards (state `read`); off: the working directory's text
    /// names it, as before issue 23.
    StateIdentity,
    /// An owner is judged by its own TTL when it is longer than the observer's (liveness
    /// `judging_ttl`); off: by the observer's own, as before issue 23.
    OwnersTtl,
    /// This init's live runs count as possible holders of a lock with their Who
    /// (recover/evidence.rs `window`).
    LiveRuns,
    /// terraform's wording of a free lock in every supported version (lockinfo); off: 1.0.3's
    /// alone, as before issue 23.
    Wordings,
    /// A heartbeat read the store gave no answer to is no observation (recorder machine `scan`,
    /// recover/ `read_beat`) and makes a recovery's evidence incomplete (recover/evidence.rs
    /// `window`); off: it counts as "no heartbeat", as before issue 24.
    UnansweredRead,
    /// A recovery whose right must be renewed (the Kubernetes store's recovery Lease) releases
    /// nothing once the right may have lapsed (`RecoveryLock::held`, recover/mod.rs).
    RecoveryHeld,
}

#[cfg(feature = "mutation")]
thread_local! {
    static OFF: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

#[cfg(feature = "mutation")]
fn bit(guard: Guard) -> u32 {
    1 << guard as u32
}

/// Whether `guard` is on: always, unless this thread turned it off (`disable`, tests only).
#[inline(always)]
pub fn on(guard: Guard) -> bool {
    #[cfg(feature = "mutation")]
    {
        OFF.with(|off| off.get() & bit(guard) == 0)
    }
    #[cfg(not(feature = "mutation"))]
    {
        let _ = guard;
        true
    }
}

/// Turns `guard` off in this thread until the returned value is dropped.
#[cfg(feature = "mutation")]
pub fn disable(guard: Guard) -> Disabled {
    OFF.with(|off| off.set(off.get() | bit(guard)));
    Disabled(guard)
}

/// A guard turned off in this thread; on again when dropped.
#[cfg(feature = "mutation")]
#[derive(Debug)]
pub struct Disabled(Guard);

#[cfg(feature = "mutation")]
impl Drop for Disabled {
    fn drop(&mut self) {
        OFF.with(|off| off.set(off.get() & !bit(self.0)));
    }
}

#[cfg(feature = "mutation")]
thread_local! {
    static WALL_MS: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// The wall clock this thread was given ([`at_wall_ms`]), ms since the epoch; None (the host's
/// clock) unless a test set one.
#[inline(always)]
pub fn wall_ms() -> Option<u64> {
    #[cfg(feature = "mutation")]
    {
        WALL_MS.with(std::cell::Cell::get)
    }
    #[cfg(not(feature = "mutation"))]
    {
        None
    }
}

/// Makes the wall clock read `ms` in this thread until the returned value is dropped.
#[cfg(feature = "mutation")]
pub fn at_wall_ms(ms: u64) -> WallClock {
    WallClock(WALL_MS.with(|w| w.replace(Some(ms))))
}

/// A wall clock set in this thread; the one before it is back when dropped.
#[cfg(feature = "mutation")]
#[derive(Debug)]
pub struct WallClock(Option<u64>);

#[cfg(feature = "mutation")]
impl Drop for WallClock {
    fn drop(&mut self) {
        WALL_MS.with(|w| w.set(self.0));
    }
}

#[cfg(all(test, feature = "mutation"))]
mod tests {
    use super::*;

    #[test]
    fn a_guard_is_off_only_in_its_thread_and_until_dropped() {
        assert!(on(Guard::Fence));
        let off = disable(Guard::Fence);
        assert!(!on(Guard::Fence) && on(Guard::Watch));
        std::thread::spawn(|| assert!(on(Guard::Fence)))
            .join()
            .unwrap();
        drop(off);
        assert!(on(Guard::Fence));
    }

    #[test]
    fn a_wall_clock_is_set_only_in_its_thread_and_until_dropped() {
        assert_eq!(wall_ms(), None);
        let set = at_wall_ms(7);
        assert_eq!(wall_ms(), Some(7));
        std::thread::spawn(|| assert_eq!(wall_ms(), None))
            .join()
            .unwrap();
        drop(set);
        assert_eq!(wall_ms(), None);
    }
}
