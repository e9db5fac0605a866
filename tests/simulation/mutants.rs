//! The mutation check (the house habit 14): each safety guard of today's rules turned off alone
//! (`tfinit::mutation`), the simulation must find a violation of the kind that guard is for.

use super::*;

/// The mutation check (the house habit 14): each safety guard of today's rules turned off alone
/// (`tfinit::mutation`), the simulation must find a violation of the kind that guard is for
/// within the stated number of schedules, each search favouring the guard's trouble
/// (docs/reliability.md, "Mutation check", has the table). `kind` is the violation's signature
/// (`Violation::sig`).
macro_rules! mutant {
    ($name:ident, $guard:expr, $focus:expr, $budget:expr, $($kind:literal)|+) => {
        #[test]
        fn $name() {
            let kinds = [$($kind),+];
            find_without($guard, $focus, $budget, &format!("{:?} off: {kinds:?}", $guard), TODAY, |v| {
                kinds.contains(&v.sig.as_str())
            });
        }
    };
}

// Not in the list: `fresh_enough` (Guard::FreshHeartbeat). Turned off alone, the simulation
// finds nothing (300,000 schedules of 10 TTLs, scripts/simulate.sh with OFF=fresh-heartbeat): it
// is covered by the fence, which stops every state-locking run by 9/10 TTL after the start of the
// last heartbeat write that landed, whatever the age of the beat its record landed under, and by
// `Book::begin`, which asks for no record under a beat older than TTL/2. A record written under
// an older beat only starts a run the fence stops soon after (docs/reliability.md).
mutant!(mutant_watch, Guard::Watch, Focus::None, 200, "DeadVerdict");
mutant!(
    mutant_fence,
    Guard::Fence,
    Focus::StaleRecord,
    2_000,
    "DeadVerdict"
);
mutant!(
    mutant_unseen,
    Guard::Unseen,
    Focus::Invisible,
    2_000,
    "Safety(SameWho)"
);
mutant!(
    mutant_shadowed,
    Guard::Shadowed,
    Focus::Invisible,
    1_000,
    "Safety(SameWho)"
);
// Its own focus since 2026-12-06: 13 schedules in 20,000 of Crowd have its violation (a budget
// of 3,000 missed it 1 time in 7; first seed 1,127 there), 45 of Race.
mutant!(
    mutant_recover_lock,
    Guard::RecoverLock,
    Focus::Race,
    3_000,
    "Safety(UnlockRace)"
);
// Its own focus since 2026-12-06 too: 17 schedules in 20,000 of Crowd have its violation,
// 122 of OwnLock.
mutant!(
    mutant_live_on_host,
    Guard::LiveOnHost,
    Focus::OwnLock,
    3_000,
    "Safety(SameWho)" | "Safety(OwnUnrecorded)" | "Safety(SameState)"
);
mutant!(
    mutant_lock_file_inode,
    Guard::LockFileInode,
    Focus::Restore,
    1_000,
    "Safety(ReplacedLockFile)"
);
mutant!(
    mutant_state_identity,
    Guard::StateIdentity,
    Focus::Aliases,
    2_000,
    "Safety(SameState)"
);
mutant!(
    mutant_owners_ttl,
    Guard::OwnersTtl,
    Focus::OwnersTtl,
    1_000,
    "DeadVerdict (judged by a TTL shorter than the owner's)" | "Safety(OwnersTtl)"
);
// Its own focus since 2026-12-06: under Crowd its first seed was 155, but one API read less in
// the recovery (an optimisation that changes no decision) moved it to 4,092, past the budget:
// 12 schedules in 20,000 of Crowd have its violation, 101 of OwnLock.
mutant!(
    mutant_live_runs,
    Guard::LiveRuns,
    Focus::OwnLock,
    3_000,
    "Safety(InitsLiveRun)" | "Safety(SameState)"
);
// Not in the list: the recovery Lease's fence (`Guard::RecoveryHeld`). Since the simulation drives
// the init's real runs and records and the real recovery procedure (issue 25), `lease-crowd` finds
// nothing with it off in seeds 0..20,000 of 10 TTLs (it found seed 15,840 of the models before):
// the race needs a holder that loses its Lease between its probe and its force-unlock of a dead
// lock, a taker that judges the same lock dead rather than Ambiguous, and the two force-unlocks
// interleaved with a new terraform taking the lock (docs/reliability.md). Its mutation check is
// `recover::tests::mutant_recovery_held_releases_under_a_lapsed_right`, on the same real
// procedure with the clock and the probe's duration set (a probe slower than the renewal margin).
mutant!(
    mutant_wordings,
    Guard::Wordings,
    Focus::Wording,
    1_000,
    "Progress (probe could not tell)"
);
