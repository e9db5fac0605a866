//! The log lines of a recovery: one per record decided, at warn with the record's every field
//! (info when nothing was at stake), and an error when only a person can release the lock.

use super::{Recovery, RecoveryOutcome};
use crate::locks::lockinfo::LockInfo;
use crate::locks::record::Record;
use crate::locks::record_id::RecordId;

/// Logs at warn what a recovery did with the record of [`Report`] `$r`, with the record's every
/// field, then (after `lock`) the lock's fields, then the outcome's own fields and message.
macro_rules! warn_record {
    ($r:expr, lock $i:expr, $($field:tt)*) => {
        warn_record!(
            $r, lock_id = %$i.id, lock_path = %$i.path, operation = %$i.operation, who = %$i.who,
            version = %$i.version, created = %$i.created, $($field)*
        )
    };
    ($r:expr, $($field:tt)*) => {
        tracing::warn!(
            record = %$r.path, run = %$r.rec.run_id, owner = %$r.rec.owner.name,
            incarnation = %$r.rec.owner.incarnation(), pod_uid = ?$r.rec.owner.pod_uid,
            expected_who = %$r.rec.who, workdir = %$r.rec.workdir, workspace = %$r.rec.workspace,
            subcommand = %$r.rec.subcommand, argv = ?$r.rec.argv, started_ms = $r.rec.started_ms,
            ended = ?$r.rec.ended, orphan_candidates = ?$r.rec.in_progress, dry_run = $r.dry_run,
            $($field)*
        )
    };
}

/// The sentence naming the resources a dead run may have left outside the state, if any.
fn orphan_hint(orphans: &[String]) -> String {
    if orphans.is_empty() {
        return String::new();
    }
    format!(
        ". Resources that may exist outside the state (their create, update or destroy started and never completed): check them and import or delete: {}",
        orphans.join(", ")
    )
}

/// One record's outcome, to log: which run is over and why (`base`), and the orphan candidates
/// it may have left (`hint`).
struct Report<'a> {
    base: String,
    hint: String,
    path: &'a RecordId,
    rec: &'a Record,
    dry_run: bool,
}

impl Report<'_> {
    /// The lock was probed: the dead run's (unlocked), someone else's, or either.
    fn lock(&self, i: &LockInfo, outcome: &RecoveryOutcome) {
        let (base, hint) = (&self.base, &self.hint);
        match outcome {
            RecoveryOutcome::Unlocked(_) => warn_record!(
                self, lock i, info = %i.info,
                "{base}: {} its state lock {} (Who {}, Created {}){hint}",
                if self.dry_run { "would force-unlock" } else { "force-unlocked" },
                i.id, i.who, i.created
            ),
            RecoveryOutcome::HeldByOther(_, why) => warn_record!(
                self, lock i,
                "{base}: the state lock is not the dead run's ({why}): left alone{hint}"
            ),
            RecoveryOutcome::Ambiguous(_, why) => warn_record!(
                self, lock i,
                "{base}: the state lock may not be the dead run's ({why}): left alone, record kept{hint}"
            ),
            _ => {}
        }
    }

    /// Nothing was at stake (no orphan candidates): the lock is free, or ends with its process
    /// (`backend`).
    fn released(&self, backend: Option<&str>) {
        let (base, path) = (&self.base, self.path);
        match backend {
            None => {
                tracing::info!(record = %path, "{base}: the state lock is free; record removed")
            }
            Some(b) => tracing::info!(
                record = %path, backend = %b,
                "{base}: the {b} backend's lock ends with its process; record removed"
            ),
        }
    }

    /// Records removed with orphan candidates, set aside for a person, or left as they were.
    fn untouched(&self, outcome: &RecoveryOutcome) {
        let (base, hint) = (&self.base, &self.hint);
        match outcome {
            RecoveryOutcome::Free => {
                warn_record!(self, "{base}: the state lock is free; record removed{hint}")
            }
            RecoveryOutcome::NothingToRelease(b) => warn_record!(
                self, backend = %b,
                "{base}: the {b} backend's lock ends with its process; record removed{hint}"
            ),
            RecoveryOutcome::Unsupported(b) => warn_record!(
                self, backend = %b,
                "{base}: automatic recovery is not supported for the {b} backend (its force-unlock deletes any lock, whoever holds it); if terraform reports the lock held by {}, release it by hand with `terraform force-unlock`; record renamed to *.manual{hint}",
                self.rec.who
            ),
            RecoveryOutcome::Unknown(msg) => warn_record!(
                self, probe = %msg,
                "{base}: could not read the state lock; nothing touched, will try again before the next run"
            ),
            RecoveryOutcome::UnknownWording(msg) => warn_record!(
                self, probe = %msg,
                "{base}: terraform answered the lock probe in a wording this tfinit does not know, so it cannot tell whether the lock is free; nothing touched, record kept. Upgrade tfinit, or report the wording with your terraform version"
            ),
            RecoveryOutcome::UnlockFailed(msg) => warn_record!(
                self, error = %msg,
                "{base}: force-unlock failed; record kept, will try again before the next run"
            ),
            _ => {}
        }
    }

    /// The dead run holds the lock, and only a person can release it.
    fn needs_person(&self, i: &LockInfo, command: &str) {
        let (base, hint, rec) = (&self.base, &self.hint, self.rec);
        tracing::error!(
            record = %self.path, run = %rec.run_id, owner = %rec.owner.name,
            incarnation = %rec.owner.incarnation(), expected_who = %rec.who,
            workdir = %rec.workdir, workspace = %rec.workspace, subcommand = %rec.subcommand,
            lock_id = %i.id, lock_path = %i.path, operation = %i.operation, who = %i.who,
            created = %i.created, command = %command, dry_run = self.dry_run,
            "{base}: the dead run holds the state lock {} (Who {}, Operation {}, Created {}) but terraform cannot load workspace {}'s state, which does not exist (the run died between taking the lock and writing the first state, or the state was deleted), so no force-unlock can release it: a person must. Release it with: {command} ; then run `tfinit recover`. Workspace {} has no state: if the run created resources, restore the state or import them before the next apply creates them again. Record kept (needs_person){hint}",
            i.id, i.who, i.operation, i.created, rec.workspace, rec.workspace
        )
    }
}

impl Recovery {
    /// Logs one outcome at warn (info when nothing was at stake), with the record's every field.
    pub(super) fn report(
        &self,
        path: &RecordId,
        rec: &Record,
        why_dead: &str,
        outcome: &RecoveryOutcome,
    ) {
        let r = Report {
            base: format!(
                "run {} of {} ({}) `terraform {}` in {} (workspace {}) started at {} ms is over: {why_dead}",
                rec.run_id,
                rec.owner.name,
                rec.owner.incarnation(),
                rec.argv.join(" "),
                rec.workdir,
                rec.workspace,
                rec.started_ms,
            ),
            hint: orphan_hint(&rec.in_progress),
            path,
            rec,
            dry_run: self.dry_run,
        };
        let quiet = rec.in_progress.is_empty();
        match outcome {
            RecoveryOutcome::Unlocked(i)
            | RecoveryOutcome::HeldByOther(i, _)
            | RecoveryOutcome::Ambiguous(i, _) => r.lock(i, outcome),
            RecoveryOutcome::Free if quiet => r.released(None),
            RecoveryOutcome::NothingToRelease(b) if quiet => r.released(Some(b)),
            RecoveryOutcome::NeedsPerson(i, command) => r.needs_person(i, command),
            RecoveryOutcome::OwnerAlive | RecoveryOutcome::WaitingForPerson => {}
            // The init says it, once per record (its helper runs before every run here).
            RecoveryOutcome::UnknownWording(_) if self.automatic => {}
            _ => r.untouched(outcome),
        }
    }
}
