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
// First seed 1,127 since the simulation drives the real recovery procedure and the init's real
// runs and records (696 with both modelled, 2,303 with the real procedure alone).
mutant!(
    mutant_recover_lock,
    Guard::RecoverLock,
    Focus::Crowd,
    3_000,
    "Safety(UnlockRace)"
);
mutant!(
    mutant_live_on_host,
    Guard::LiveOnHost,
    Focus::Crowd,
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
mutant!(
    mutant_live_runs,
    Guard::LiveRuns,
    Focus::Crowd,
    3_000,
    "Safety(InitsLiveRun)" | "Safety(SameState)"
);
// The recovery Lease's fence: since group commit (fewer, batched requests per node) `lease-crowd`
// found it in 1 of 16,000 schedules of 10 TTLs (seed 15,840), none in 40,000 of 4 TTLs: searching
// from seed 0 would take minutes of CI, so the search covers the window that held the first seed.
// Since the simulation drives the init's real runs and records and the real recovery procedure
// (issue 25) it finds nothing in seeds 0..20,000 (12,000 + 8,000 schedules explored on the merge):
// this test fails, loudly, until the focus is retuned. Why it is so rare (docs/reliability.md):
// a holder must lose its Lease between its probe and its force-unlock of a dead lock, the taker
// must judge the same lock dead (not Ambiguous: the dead run's pod often runs on in the one
// directory, with the same Who), and the two force-unlocks must interleave with a new terraform
// taking the lock; `recover-lock` (no exclusion at all) is already 1 in 1,127 on `crowd`.
#[test]
fn mutant_recovery_held() {
    let o = Opts {
        max_ttls: 10,
        ..TODAY
    };
    find_without_in(
        Guard::RecoveryHeld,
        Focus::LeaseCrowd,
        15_000..16_000,
        "RecoveryHeld off: [\"Safety(UnlockRace)\"]",
        o,
        |v| v.sig == "Safety(UnlockRace)",
    );
}
mutant!(
    mutant_wordings,
    Guard::Wordings,
    Focus::Wording,
    1_000,
    "Progress (probe could not tell)"
);
