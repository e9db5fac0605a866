//! `tfinit cancel`: an operator stops one run (`r7`) or every run in a directory, without
//! restarting the pod. Nothing here is new: a started terraform is stopped exactly as at shutdown
//! (its one graceful SIGTERM, to its own pid, never a second; or with `--force` SIGKILL to its
//! group), a graceful cancel arms the same SIGKILL TFINIT_STOP_TIMEOUT later that an abandoned run
//! gets, and a run that has not started is ended through the one refusal path (its shim exits
//! 75). Its record and any lock then go the way of any stopped run: terraform that exits by itself
//! releases its lock and its record is removed; a killed one leaves its record for recovery.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::super::action::{Action, Force, Refusal};
use super::life::{Job, Life, Stop};
use super::Runs;
use crate::locks::names::RunId;
use crate::metrics::Cancel;
use crate::protocol::FileId;
use crate::terraform::normal_dir;

/// Which runs a cancel names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::init) enum CancelTarget {
    /// One run, by its id.
    Run(RunId),
    /// Every run whose shim's working directory, or terraform's (cwd + -chdir), is this
    /// directory: by what it is (`id`, stat'ed by the client) where the run's shim sent what its
    /// directories are, else by `path`'s text (absolute, lexically normal).
    Workdir {
        /// The directory as the client named it.
        path: PathBuf,
        /// What it is, when the client could stat it.
        id: Option<FileId>,
    },
}

impl Runs {
    /// Cancels the runs `target` names, gracefully or by force: the actions, and what was done
    /// to each, one line per run in run order (`r7: SIGTERM sent...`), for the client to print;
    /// an error (naming the run or the directory, and what to do) when none matches.
    /// The caller refuses cancels while stopping: the timeline stops every run itself then.
    pub(in crate::init) fn cancel(
        &mut self,
        target: &CancelTarget,
        force: Force,
        now: Instant,
    ) -> Result<(Vec<Action>, Vec<String>), String> {
        let ids = self.named_by(target)?;
        let mut acts = Vec::new();
        let mut done = Vec::new();
        for id in ids {
            let line = self.cancel_one(id, force, now, &mut acts);
            tracing::info!(run = %id, force = force == Force::Kill, "tfinit cancel: {line}");
            done.push(format!("{id}: {line}"));
        }
        // A run ended before terraform started gave its place back.
        acts.push(Action::Admit);
        Ok((acts, done))
    }

    /// The runs `target` names, oldest first; an error when there are none.
    pub(super) fn named_by(&self, target: &CancelTarget) -> Result<Vec<RunId>, String> {
        match target {
            CancelTarget::Run(id) if self.table.contains_key(id) => Ok(vec![*id]),
            CancelTarget::Run(id) => Err(format!(
                "no run {id} in this init (it ended, or never existed): `tfinit status` lists the runs in flight and their ids"
            )),
            CancelTarget::Workdir { path, id } => {
                let ids: Vec<RunId> = self
                    .table
                    .values()
                    .filter(|r| works_in(&r.job, path, *id))
                    .map(|r| r.job.id)
                    .collect();
                if ids.is_empty() {
                    return Err(no_run_in(path));
                }
                Ok(ids)
            }
        }
    }

    /// Cancels run `id`; what was done, for the client.
    fn cancel_one(
        &mut self,
        id: RunId,
        force: Force,
        now: Instant,
        acts: &mut Vec<Action>,
    ) -> String {
        let how = match force {
            Force::Graceful => Cancel::Graceful,
            Force::Kill => Cancel::Force,
        };
        let Some(run) = self.table.get(&id) else {
            return "already over".into();
        };
        let state = run.life.as_str();
        let found = match &run.life {
            Life::Queued { .. }
            | Life::AwaitingRecords { .. }
            | Life::Recording { .. }
            | Life::Launching { .. } => Found::NotStarted,
            Life::Recovering { .. } => Found::Recovering,
            Life::Running { stop, .. } => Found::Running(*stop),
            Life::Exited { .. } => Found::Exited,
        };
        match (found, force) {
            (Found::NotStarted, _) => {
                self.refuse(id, Refusal::Cancelled, acts);
                acts.push(Action::CountCancel(how));
                format!("ended before terraform started (it was {state}); its shim exits 75")
            }
            (Found::Recovering, _) => {
                // Its lock recovery helper may be releasing a dead owner's lock: it is left to
                // finish (SIGKILLed after TFINIT_STOP_TIMEOUT, or now with --force), and the run
                // ends with it, terraform never started (as when its shim leaves).
                if let Some(conn) = self.table.get_mut(&id).and_then(|r| r.job.conn.take()) {
                    acts.push(Refusal::Cancelled.answer(conn, Some(id)));
                }
                self.arm_kill(id, now);
                if force == Force::Kill {
                    self.stop(id, Force::Kill, "tfinit cancel --force", acts);
                }
                acts.push(Action::CountCancel(how));
                "ended before terraform started (a lock recovery runs first: the run ends with it); its shim exits 75".into()
            }
            (Found::Running(Stop::Killed { .. }), _) => {
                "its process group was SIGKILLed already: nothing more to send".into()
            }
            (Found::Running(Stop::Graceful { .. }), Force::Graceful) => {
                // Never a second SIGTERM: terraform takes it as "exit now", losing state.
                self.arm_kill(id, now);
                "terraform was asked to stop already (its one SIGTERM): nothing more is sent; its process group is SIGKILLed if still there TFINIT_STOP_TIMEOUT after the cancel".into()
            }
            (Found::Running(_), Force::Graceful) => {
                self.stop(id, Force::Graceful, "tfinit cancel", acts);
                self.arm_kill(id, now);
                acts.push(Action::CountCancel(how));
                "SIGTERM sent to terraform (a graceful stop: it finishes the operations in flight, saves its state, releases its lock); its process group is SIGKILLed if still there after TFINIT_STOP_TIMEOUT".into()
            }
            (Found::Running(_), Force::Kill) => {
                self.stop(id, Force::Kill, "tfinit cancel --force", acts);
                acts.push(Action::CountCancel(how));
                "SIGKILL sent to terraform's process group (its lock-owner record is kept for recovery)".into()
            }
            (Found::Exited, _) => {
                "terraform exited already (its output is being drained): nothing sent".into()
            }
        }
    }

    /// Run `id`'s process group is SIGKILLed TFINIT_STOP_TIMEOUT after `now` if still there.
    fn arm_kill(&mut self, id: RunId, now: Instant) {
        let at = now + self.stop_timeout;
        if let Some(run) = self.table.get_mut(&id) {
            run.arm_kill(at);
        }
    }
}

/// Where a cancelled run was.
#[derive(Debug, Clone, Copy)]
enum Found {
    /// Queued, waiting for its lock check or record, or being launched.
    NotStarted,
    /// Its lock recovery runs first.
    Recovering,
    /// terraform runs, stopped this far.
    Running(Stop),
    /// terraform was reaped; its output drains.
    Exited,
}

/// Whether `job` works in the directory named `path` that is `id`: its shim's directory or
/// terraform's, each compared by what it is (device and inode) when both the run's shim and the
/// client found that, else by text (a shim or client older than the ids, a stat that failed).
/// The numbers were found in the client processes: the loop never stats a working directory.
fn works_in(job: &Job, path: &Path, id: Option<FileId>) -> bool {
    [(&job.cwd, job.cwd_id), (&job.workdir, job.workdir_id)]
        .into_iter()
        .any(|(text, known)| match (known, id) {
            (Some(run), Some(asked)) => run == asked,
            _ => normal_dir(text) == path,
        })
}

/// The error for a cancel of a directory where no run works.
fn no_run_in(dir: &Path) -> String {
    format!(
        "no run in {}: `tfinit status` lists the runs in flight and their working directories (cwd)",
        dir.display()
    )
}
