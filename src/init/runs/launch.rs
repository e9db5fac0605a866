//! From a shim's request to terraform's start, in one direction:
//!
//! 1. [`Runs::request`]: refused while draining or stopping; otherwise a run exists, tied to its
//!    connection. Under TFINIT_MAX_RUNS it waits `Queued` while the runs that hold a place are at
//!    the cap (or others wait already); [`Runs::admit`] lets the oldest go on as places free up.
//!    Read-only runs never wait and take no place. A run that takes no state lock goes straight
//!    to 4.
//! 2. [`Runs::check_lock`]: a dead run's record in its directory means a lock recovery first
//!    (once the store is open and this init's own end-markings there are on the volume); the run
//!    waits in `AwaitingRecords` or `Recovering`.
//! 3. [`Runs::record_step`]: its lock-owner record is written before terraform exists; the run
//!    waits in `Recording` until the records say it may start ([`Runs::settled`]).
//! 4. [`Runs::launch`]: `Launching`, and [`Action::Spawn`]; the loop starts terraform and hands
//!    the outcome to [`Runs::spawned`], which makes the run `Running`.
//!
//! Every wait for the store is bounded by one TFINIT_RECORD_TIMEOUT from the run's first wait.
//! The records are read from the book (`&Book`), never written: step 3 asks for the record with
//! `Record::Begin`, and the records' answer comes back through [`Runs::on_record_events`].

use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use nix::unistd::Pid;

use super::super::action::{Action, Child, Refusal};
use super::super::reaper::Exit;
use super::super::records::{Record, Subject};
use super::super::shutdown::Phase;
use super::super::spawn::{RecoveryArgs, StartError, Started};
use super::super::token::ConnId;
use super::life::{Helper, Job, Life, Pending, Pipes, Run, Stop};
use super::Runs;
use crate::locks::book::Book;
use crate::locks::names::RunId;
use crate::metrics::RunOutcome;
use crate::protocol::{self, ExitNote, RunRequest};
use crate::terraform;

/// The exit code of a run refused because the init could not set up terraform's output safely
/// (not a shell code: 126/127 mean the program itself could not run).
const EXIT_SETUP_FAILED: i32 = 125;

impl Runs {
    /// A shim on `conn` asks for a run: it is refused while draining or stopping (`phase`), or
    /// it starts on its way to terraform.
    pub(in crate::init) fn request(
        &mut self,
        conn: ConnId,
        request: RunRequest,
        stdin: Option<OwnedFd>,
        phase: Phase,
        book: &Book,
        now: Instant,
    ) -> Vec<Action> {
        if let Some(why) = phase.refusal() {
            tracing::info!(phase = phase.as_str(), args = ?terraform::redact(&request.args), cwd = %request.cwd, "terraform run refused");
            let subcommand = terraform::Invocation::parse(&request.args, &request.env).subcommand;
            return vec![
                why.answer(conn, None),
                Action::Tally {
                    subcommand,
                    outcome: RunOutcome::Refused,
                    took: Duration::ZERO,
                },
            ];
        }
        let id = self.next_id();
        let job = Job::new(id, conn, &request, SystemTime::now());
        let queue = !job.invocation.read_only() && self.must_queue();
        let pending = Pending {
            request: Box::new(request),
            stdin,
        };
        let mut acts = vec![Action::Attach { conn, run: id }];
        if queue {
            let position = self.queued() + 1;
            let max = self.max_runs.map_or(0, |m| m.get());
            tracing::info!(
                run = %id, max_runs = max, in_flight = self.in_flight(), position, cwd = %job.cwd.display(),
                subcommand = %job.invocation.subcommand,
                "terraform run queued: TFINIT_MAX_RUNS={max} runs are in flight; it is number {position} in the queue and starts when one ends"
            );
        }
        let life = Life::Queued { pending };
        self.table.insert(id, Run { job, life });
        if queue {
            // Admitted in arrival order as places free up (normally none is free here).
            acts.extend(self.admit(book, now));
        } else {
            self.set_off(id, book, now, &mut acts);
        }
        acts
    }

    /// Takes the oldest queued run out of the queue, when a place under TFINIT_MAX_RUNS is free,
    /// and asks to be called again ([`Action::Admit`]) once what that asks of the records is done:
    /// the next run's lock check reads the book as that left it. Asked for wherever a place may
    /// have been given back: terraform reaped, a run that held one ended before terraform started.
    pub(in crate::init) fn admit(&mut self, book: &Book, now: Instant) -> Vec<Action> {
        let mut acts = Vec::new();
        if let Some(id) = self.next_admitted() {
            tracing::debug!(run = %id, "a place under TFINIT_MAX_RUNS is free: the run leaves the queue");
            self.set_off(id, book, now, &mut acts);
            acts.push(Action::Admit);
        }
        acts
    }

    /// A run starts on its way to terraform (it holds a place from here): a state-locking run
    /// checks its lock first (its wait for the store bounded by TFINIT_RECORD_TIMEOUT from now),
    /// another one is launched.
    fn set_off(&mut self, id: RunId, book: &Book, now: Instant, acts: &mut Vec<Action>) {
        let Some(run) = self.table.get(&id) else {
            return;
        };
        if run.job.locking() {
            // It waits for the store until its lock check says otherwise.
            let deadline = now + self.record_timeout;
            self.move_to(id, |pending| Life::AwaitingRecords { pending, deadline });
            self.check_lock(id, deadline, book, now, acts);
        } else {
            self.move_to(id, |pending| Life::Launching { pending });
            self.launch(id, book, acts);
        }
    }

    /// A state-locking run's first step: when a dead run's record is in its directory, a lock
    /// recovery runs first (once the store is open and this init's own end-markings there are on
    /// the volume). `deadline` bounds the run's whole wait for the store (TFINIT_RECORD_TIMEOUT
    /// from its first wait).
    fn check_lock(
        &mut self,
        id: RunId,
        deadline: Instant,
        book: &Book,
        now: Instant,
        acts: &mut Vec<Action>,
    ) {
        let Some(workdir) = self.table.get(&id).map(|r| r.job.workdir.clone()) else {
            return;
        };
        let wait = |pending| Life::AwaitingRecords { pending, deadline };
        if book.opening() {
            // Whether a dead run's record is here is known once the recorder has read the store.
            return self.move_to(id, wait);
        }
        if self.recovering() {
            // One recovery at a time, and no state-locking run starts while it runs, in any
            // directory (another may lock the same state): it decided with the live runs it was
            // given. This run checks again after it.
            tracing::info!(run = %id, workdir = %workdir.display(), "a lock recovery runs: this run waits for it");
            return self.move_to(id, wait);
        }
        // The book answers from memory (the recorder's last scan): no storage call here.
        if !book.needs_recovery(&self.table, &workdir, now) {
            return self.record_step(id, Some(deadline), acts);
        }
        if !book.may_recover(&self.table, &workdir) {
            tracing::info!(run = %id, workdir = %workdir.display(), "a dead run's lock-owner record is here: its lock is checked once this init's own end-markings in this directory are on the state volume");
            return self.move_to(id, wait);
        }
        let helper = Helper::Starting { deadline };
        self.move_to(id, |pending| Life::Recovering { pending, helper });
        acts.push(Action::Recover(id));
    }

    /// `id`'s request, for the loop to start its recovery helper with.
    pub(in crate::init) fn request_of(&self, id: RunId) -> Option<&RunRequest> {
        Some(&self.table.get(&id)?.life.pending()?.request)
    }

    /// The loop tried to start `id`'s recovery helper (with `args`; `watching`: it only watches
    /// owners this pod has not watched for a TTL yet, for the log): it runs, or terraform starts
    /// without it.
    pub(in crate::init) fn recovery_started(
        &mut self,
        id: RunId,
        args: &RecoveryArgs,
        watching: bool,
        started: io::Result<Pid>,
    ) -> Vec<Action> {
        let mut acts = Vec::new();
        let Some(Run {
            life: Life::Recovering { helper, .. },
            ..
        }) = self.table.get_mut(&id)
        else {
            return acts;
        };
        let Helper::Starting { deadline } = *helper else {
            return acts;
        };
        match started {
            Ok(pid) => {
                if watching {
                    tracing::info!(run = %id, workdir = %args.workdir.display(), helper = pid.as_raw(), "a lock-owner record of an owner this pod has not watched for TFINIT_OWNER_TTL yet is here: its heartbeat is watched before terraform starts (alive at its next beat, dead after a TTL of none)");
                } else {
                    tracing::info!(run = %id, workdir = %args.workdir.display(), helper = pid.as_raw(), "a dead owner's lock-owner record is here: checking the state lock before terraform starts");
                }
                *helper = Helper::Running { pid, kill_at: None };
                acts.push(Action::Adopt {
                    pid,
                    child: Child::Recovery(id),
                });
            }
            Err(e) => {
                tracing::warn!(run = %id, error = %e, "cannot start the lock recovery; terraform starts without it");
                self.record_step(id, Some(deadline), &mut acts);
            }
        }
        acts
    }

    /// A state-locking run's second step: its lock-owner record, on the volume before terraform
    /// exists (so a kill right after the start leaves it). The run waits in `recording` while
    /// the recorder writes it, at most TFINIT_RECORD_TIMEOUT; the records say when not to wait:
    /// at once ([`RecordEvent::Unrecorded`](super::super::records::RecordEvent)) when no record
    /// can be written now.
    fn record_step(&mut self, id: RunId, deadline: Option<Instant>, acts: &mut Vec<Action>) {
        let Some(Run { job, life }) = self.table.get(&id) else {
            return;
        };
        let Some(pending) = life.pending() else {
            return;
        };
        let subject = Box::new(Subject {
            run: id,
            cwd: job.cwd.clone(),
            workdir: job.workdir.clone(),
            workspace: job.workspace.clone(),
            subcommand: job.invocation.subcommand.clone(),
            argv: job.argv.clone(),
            env: pending.request.env.clone(),
        });
        self.move_to(id, |pending| Life::Recording { pending });
        acts.push(Action::Record(Record::Begin { subject, deadline }));
    }

    /// The records say a run waiting in `recording` may start (its record landed, failed, or
    /// timed out, or none is written).
    pub(super) fn settled(&mut self, id: RunId, book: &Book, acts: &mut Vec<Action>) {
        if self
            .table
            .get(&id)
            .is_some_and(|r| matches!(r.life, Life::Recording { .. }))
        {
            self.launch(id, book, acts);
        }
    }

    /// The last step: terraform is started (by the loop), unless the fence refuses the run.
    fn launch(&mut self, id: RunId, book: &Book, acts: &mut Vec<Action>) {
        if let Some(why) = Refusal::of_launch(book.may_launch(&self.table, id)) {
            return self.refuse(id, why, acts);
        }
        self.move_to(id, |pending| Life::Launching { pending });
        acts.push(Action::Spawn(id));
    }

    /// `id`'s request, for the loop to start terraform with (its stdin is taken along).
    pub(in crate::init) fn launching(
        &mut self,
        id: RunId,
    ) -> Option<(&RunRequest, Option<OwnedFd>)> {
        match &mut self.table.get_mut(&id)?.life {
            Life::Launching { pending } => Some((&pending.request, pending.stdin.take())),
            _ => None,
        }
    }

    /// The loop tried to start terraform for `id` at `now`: it runs, or its shim is told why not
    /// (and its place goes to the next queued run).
    pub(in crate::init) fn spawned(
        &mut self,
        id: RunId,
        started: Result<Started, StartError>,
    ) -> Vec<Action> {
        let Some(run) = self.table.get_mut(&id) else {
            return Vec::new();
        };
        if !matches!(run.life, Life::Launching { .. }) {
            return Vec::new();
        }
        let started = match started {
            Ok(s) => s,
            Err(e) => {
                let mut acts = self.not_started(id, &e);
                acts.push(Action::Admit);
                return acts;
            }
        };
        let job = &run.job;
        tracing::info!(
            run = %id, pid = started.pid.as_raw(), cwd = %job.cwd.display(), subcommand = %job.invocation.subcommand,
            argv = ?job.argv, "terraform started"
        );
        run.life = Life::Running {
            pid: started.pid,
            pipes: Pipes {
                stdout: Some(started.stdout),
                stderr: Some(started.stderr),
                paused: false,
            },
            stop: Stop::None,
        };
        vec![
            Action::Adopt {
                pid: started.pid,
                child: Child::Terraform(id),
            },
            Action::Watch(id),
        ]
    }

    /// terraform could not be started for `id` (`e`): the run is over, and its shim gets the
    /// shell's code (127 not found, 126 not executable) or 75 when resources ran out.
    fn not_started(&mut self, id: RunId, e: &StartError) -> Vec<Action> {
        let Some(req) = self.request_of(id) else {
            return Vec::new();
        };
        let (code, hint) = start_failure(e);
        let msg = format!(
            "tfinit: cannot start {:?} in {:?}: {e}{hint}",
            req.program, req.cwd
        );
        tracing::warn!(run = %id, "{msg}");
        let mut acts = Vec::new();
        let Some(run) = self.take(id, None, Vec::new(), &mut acts) else {
            return acts;
        };
        if let Some(conn) = run.job.conn {
            let note = ExitNote {
                code,
                error: Some(msg),
                run_id: Some(id.to_string()),
                ..Default::default()
            };
            acts.push(Action::Answer { conn, note });
        }
        acts
    }

    /// The one way a run that has not started is refused: it is over (its record, landed or in
    /// flight, is removed) and its shim, if still there, is told why (exit code 75). Its place,
    /// if it held one, is given back by the caller ([`Action::Admit`]).
    pub(super) fn refuse(&mut self, id: RunId, why: Refusal, acts: &mut Vec<Action>) {
        let Some(run) = self.take(id, None, Vec::new(), acts) else {
            return;
        };
        match why {
            Refusal::Fenced | Refusal::Shadowed | Refusal::Unseen => {
                tracing::warn!(run = %id, "terraform run refused before it started: {}", why.as_str())
            }
            Refusal::Draining | Refusal::ShuttingDown | Refusal::Cancelled => {
                tracing::info!(run = %id, state = run.life.as_str(), reason = why.as_str(), "terraform run refused before it started")
            }
        }
        if let Some(conn) = run.job.conn {
            acts.push(why.answer(conn, Some(id)));
        }
        acts.push(Action::Tally {
            subcommand: run.job.invocation.subcommand.clone(),
            outcome: RunOutcome::Refused,
            took: Duration::ZERO,
        });
    }

    /// The init stopped accepting runs (shutdown, drain): every run that has not started because
    /// it waits in the queue or for the store is refused; its record, if it lands later, is
    /// removed. No run is queued afterwards (none is admitted: the queue is empty).
    pub(in crate::init) fn refuse_waiting(&mut self, why: Refusal) -> Vec<Action> {
        let waiting: Vec<RunId> = self
            .table
            .iter()
            .filter(|(_, r)| r.waiting())
            .map(|(id, _)| *id)
            .collect();
        let mut acts = Vec::new();
        for id in waiting {
            self.refuse(id, why, &mut acts);
        }
        acts
    }

    /// A run's lock recovery ended: the recorder rescans (the table counts in that directory
    /// again once scanned after it), and the run goes on to its record, unless its shim is gone
    /// or the init stopped accepting runs meanwhile (then it is refused like a new run). Runs
    /// that waited for this recovery check their lock again, once the book has all that.
    pub(in crate::init) fn recovery_exited(
        &mut self,
        id: RunId,
        exit: Exit,
        refusal: Option<Refusal>,
    ) -> Vec<Action> {
        let mut acts = Vec::new();
        let Some(run) = self.table.get(&id).filter(|r| r.recovering()) else {
            return acts;
        };
        tracing::info!(run = %id, %exit, "lock recovery finished");
        let conn = run.job.conn;
        let workdir = run.job.workdir.clone();
        acts.push(Action::Record(Record::RecoveryDone { workdir }));
        if conn.is_none() {
            // The shim gave up while the lock was checked: nobody waits for this run, and
            // starting it now would only leave a run to stop.
            tracing::info!(run = %id, "the shim is gone; terraform is not started");
            self.take(id, None, Vec::new(), &mut acts);
        } else if let Some(why) = refusal {
            // Stopping (the kill step may have ended the helper) or draining. An abandoned run's
            // helper killed on its timer has no shim, so it ended above.
            self.refuse(id, why, &mut acts);
        } else {
            self.record_step(id, None, &mut acts);
        }
        acts.push(Action::Recheck);
        acts
    }

    /// Runs that waited for this init's end-markings in their directory, for a recovery there,
    /// or for the store to open check their lock again, now that the records changed; then a
    /// place may be free ([`Self::admit`]). Each check reads only what the ones before it left
    /// unchanged (their record's begin; a recovery's arguments are read when it starts).
    pub(in crate::init) fn recheck(&mut self, book: &Book, now: Instant) -> Vec<Action> {
        let mut acts = Vec::new();
        self.resume_awaiting(book, now, &mut acts);
        acts.extend(self.admit(book, now));
        acts
    }

    /// See [`Self::recheck`].
    fn resume_awaiting(&mut self, book: &Book, now: Instant, acts: &mut Vec<Action>) {
        if book.opening() {
            return;
        }
        let ready: Vec<(RunId, Instant)> = self
            .table
            .iter()
            .filter_map(|(id, r)| match r.life {
                Life::AwaitingRecords { deadline, .. }
                    if book.may_recover(&self.table, &r.job.workdir) && !self.recovering() =>
                {
                    Some((*id, deadline))
                }
                _ => None,
            })
            .collect();
        for (id, deadline) in ready {
            // An earlier one may have started a recovery: checked again.
            self.check_lock(id, deadline, book, now, acts);
        }
    }

    /// Runs that waited too long for this init's own end-markings (or for the store to open) go
    /// on without a lock check; never while a recovery runs (it may be about to release a lock
    /// of their state, and it decided with the runs it was given).
    pub(super) fn expire_waiting(
        &mut self,
        state_dir: &Path,
        now: Instant,
        acts: &mut Vec<Action>,
    ) {
        let expired: Vec<(RunId, Instant)> = self
            .table
            .iter()
            .filter_map(|(id, r)| match r.life {
                Life::AwaitingRecords { deadline, .. } if deadline <= now && !self.recovering() => {
                    Some((*id, deadline))
                }
                _ => None,
            })
            .collect();
        for (id, deadline) in expired {
            if let Some(run) = self.table.get(&id) {
                tracing::warn!(
                    run = %id, workdir = %run.job.workdir.display(), state_dir = %state_dir.display(),
                    "the lock check is skipped: within TFINIT_RECORD_TIMEOUT the state volume did not open, or did not take this init's own end-marking of a run in this directory (a recovery must read records that tell the truth); terraform starts, and the next state-locking run here checks the lock"
                );
            }
            self.record_step(id, Some(deadline), acts);
        }
    }

    /// Moves a run that has not started terraform to the state `next` makes of its request.
    fn move_to(&mut self, id: RunId, next: impl FnOnce(Pending) -> Life) {
        let Some(run) = self.table.get_mut(&id) else {
            return;
        };
        // terraform runs or ran: there is no request to move.
        let Some(pending) = run.life.pending_mut() else {
            return;
        };
        // The old state is replaced at once: the empty request left in it is never seen.
        let pending = std::mem::take(pending);
        run.life = next(pending);
    }
}

/// The exit code for a terraform that could not be started, and a hint for the message.
fn start_failure(e: &StartError) -> (i32, &'static str) {
    match e {
        StartError::NonBlocking(_) => (
            EXIT_SETUP_FAILED,
            " (terraform was not started, so nothing ran; retry, and report it if it repeats)",
        ),
        // Out of descriptors or processes is passing: "try again later" (75), like a refusal,
        // so the controller retries instead of reporting a broken binary.
        StartError::Spawn(e) => match e.raw_os_error() {
            Some(libc::EMFILE | libc::ENFILE | libc::EAGAIN | libc::ENOMEM) => (
                protocol::EXIT_REFUSED,
                " (out of resources: try again later; raise the container's open-files or process limits if it repeats)",
            ),
            _ if e.kind() == io::ErrorKind::NotFound => (127, ""),
            _ => (126, ""),
        },
    }
}
