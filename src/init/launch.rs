//! Starting a run: refusing it while draining or stopping, the lock recovery that may come
//! first, the lock-owner record, and terraform itself.

use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::{Instant, SystemTime};

use super::reaper::Exit;
use super::runs::{Job, Life, Pipes, Run, Stop};
use super::shutdown::Phase;
use super::spawn::{self, StartError};
use super::state::{Init, PidOwner};
use crate::locks::book::{FenceStage, Start};
use crate::locks::follower::Follower;
use crate::locks::record::{self, Record};
use crate::locks::recorder::Request;
use crate::protocol::{self, ExitNote, RunRequest};
use crate::terraform::{self, Invocation};

/// The exit code of a run refused because the init could not set up terraform's output safely
/// (not a shell code: 126/127 mean the program itself could not run).
const EXIT_SETUP_FAILED: i32 = 125;

impl Init {
    /// Starts a run for a shim's request (or refuses it), answering on connection `conn`.
    pub(super) fn start_run(&mut self, conn: u64, req: RunRequest, stdin: Option<OwnedFd>) {
        if let Some(why) = self.refusal() {
            tracing::info!(phase = self.timeline.phase().as_str(), args = ?terraform::redact(&req.args), cwd = %req.cwd, "terraform run refused");
            self.reply_refused(conn, None, why);
            return;
        }
        let id = self.next_run;
        self.next_run += 1;
        let invocation = Invocation::parse(&req.args, &req.env);
        let cwd = PathBuf::from(&req.cwd);
        let workdir = invocation.workdir(&cwd);
        let locking = invocation.takes_lock();
        let workspace = crate::locks::workspace_of(&invocation, &req.env, req.workspace.as_deref());
        let job = Job {
            id: format!("r{id}"),
            cwd,
            workdir,
            workspace,
            argv: terraform::redact(&req.args),
            invocation,
            started: SystemTime::now(),
            conn: Some(conn),
            partial: [Vec::new(), Vec::new()],
            follower: locking.then(Follower::default),
        };
        if let Some(c) = self.conns.get_mut(&conn) {
            c.run = Some(id);
        }
        if locking {
            self.check_lock(id, job, req, stdin, None);
        } else {
            self.launch(id, job, req, stdin);
        }
    }

    /// A state-locking run's first step: when a dead run's record is in its directory, a lock
    /// recovery runs first (once the store is open and this init's own end-markings there are on
    /// the volume). `deadline` bounds the run's whole wait for the store (TFINIT_RECORD_TIMEOUT
    /// from its first wait).
    pub(super) fn check_lock(
        &mut self,
        id: u64,
        job: Job,
        req: RunRequest,
        stdin: Option<OwnedFd>,
        deadline: Option<Instant>,
    ) {
        let deadline = deadline.unwrap_or_else(|| Instant::now() + self.cfg.record_timeout);
        // The latest table (the recorder rescans quietly after each heartbeat).
        self.on_recorder();
        if self.book.opening() {
            // Whether a dead run's record is here is known once the recorder has read the store.
            return self.await_records(id, job, req, stdin, deadline);
        }
        if self.recovering_in(&job.workdir) {
            // One recovery at a time per directory, and nothing launches there while it runs:
            // it decided with the live runs it was given. This run checks again after it.
            tracing::info!(run = %job.id, workdir = %job.workdir.display(), "a lock recovery runs in this directory: this run waits for it");
            return self.await_records(id, job, req, stdin, deadline);
        }
        // The book answers from memory (the recorder's last scan): no storage call here.
        if !self.book.needs_recovery(&job.workdir, Instant::now()) {
            return self.record_step(id, job, req, stdin, Some(deadline));
        }
        if !self.book.may_recover(&job.workdir) {
            tracing::info!(run = %job.id, workdir = %job.workdir.display(), "a dead run's lock-owner record is here: its lock is checked once this init's own end-markings in this directory are on the state volume");
            return self.await_records(id, job, req, stdin, deadline);
        }
        let recovery = spawn::RecoveryArgs {
            state_dir: &self.cfg.state_dir,
            owner: self.book.owner(),
            ttl: self.cfg.owner_ttl,
            live: self.book.live_runs(),
            seen: self.book.observations(crate::locks::liveness::monotonic_ns),
        };
        match spawn::recovery(&req, &recovery, &job.workdir) {
            Ok(helper) => {
                if self.book.only_watching(&job.workdir, Instant::now()) {
                    tracing::info!(run = %job.id, workdir = %job.workdir.display(), helper = helper.as_raw(), "a lock-owner record of an owner this pod has not watched for TFINIT_OWNER_TTL yet is here: its heartbeat is watched before terraform starts (alive at its next beat, dead after a TTL of none)");
                } else {
                    tracing::info!(run = %job.id, workdir = %job.workdir.display(), helper = helper.as_raw(), "a dead owner's lock-owner record is here: checking the state lock before terraform starts");
                }
                self.pids.insert(helper, PidOwner::Recovery(id));
                let life = Life::Recovering {
                    helper,
                    request: Box::new(req),
                    stdin,
                    kill_at: None,
                };
                self.runs.insert(id, Run { job, life });
            }
            Err(e) => {
                tracing::warn!(run = %job.id, error = %e, "cannot start the lock recovery; terraform starts without it");
                self.record_step(id, job, req, stdin, Some(deadline));
            }
        }
    }

    /// Parks a state-locking run until the store can tell whether its lock needs checking.
    fn await_records(
        &mut self,
        id: u64,
        job: Job,
        req: RunRequest,
        stdin: Option<OwnedFd>,
        deadline: Instant,
    ) {
        let life = Life::AwaitingRecords {
            request: Box::new(req),
            stdin,
            deadline,
        };
        self.runs.insert(id, Run { job, life });
    }

    /// Takes a parked run out of the table (None when run `id` is not parked).
    pub(super) fn take_awaiting(
        &mut self,
        id: u64,
    ) -> Option<(Job, RunRequest, Option<OwnedFd>, Instant)> {
        if !matches!(self.runs.get(&id)?.life, Life::AwaitingRecords { .. }) {
            return None;
        }
        match self.runs.remove(&id)? {
            Run {
                job,
                life:
                    Life::AwaitingRecords {
                        request,
                        stdin,
                        deadline,
                    },
            } => Some((job, *request, stdin, deadline)),
            _ => None,
        }
    }

    /// A state-locking run's second step: its lock-owner record, on the volume before terraform
    /// exists (so a kill right after the start leaves it). The run waits in `recording` while
    /// the recorder writes it, at most TFINIT_RECORD_TIMEOUT; the book says when not to wait.
    pub(super) fn record_step(
        &mut self,
        id: u64,
        job: Job,
        req: RunRequest,
        stdin: Option<OwnedFd>,
        deadline: Option<Instant>,
    ) {
        let start = self.book.begin(
            &job.id,
            &job.workdir,
            &job.workspace,
            &req.env,
            Instant::now(),
            deadline,
        );
        match start {
            Start::Unrecorded(notice) => {
                if let Some(n) = notice {
                    n.log();
                }
                self.launch(id, job, req, stdin);
            }
            Start::Record { .. } => {
                let now = record::now_ms();
                let rec = Record {
                    v: record::FORMAT,
                    owner: self.book.owner().clone(),
                    // The recorder computes it (it needs the passwd entry).
                    who: String::new(),
                    run_id: job.id.clone(),
                    cwd: job.cwd.to_string_lossy().into_owned(),
                    workdir: job.workdir.to_string_lossy().into_owned(),
                    workspace: job.workspace.clone(),
                    subcommand: job.invocation.subcommand.clone(),
                    argv: job.argv.clone(),
                    started_ms: now,
                    in_progress: Vec::new(),
                    updated_ms: now,
                    ended: None,
                    needs_person: None,
                };
                let create = Request::Create {
                    run: job.id.clone(),
                    record: Box::new(rec),
                    env: req.env.clone(),
                };
                let life = Life::Recording {
                    request: Box::new(req),
                    stdin,
                };
                // In the table first: a recorder found gone while sending starts it at once.
                self.runs.insert(id, Run { job, life });
                self.send_to_recorder(create);
            }
        }
    }

    /// The book says a run waiting in `recording` may start (its record landed, failed, or
    /// timed out).
    pub(super) fn record_settled(&mut self, id: u64) {
        if !self
            .runs
            .get(&id)
            .is_some_and(|r| matches!(r.life, Life::Recording { .. }))
        {
            return;
        }
        let Some(Run { job, life }) = self.runs.remove(&id) else {
            return;
        };
        if let Life::Recording { request, stdin } = life {
            self.launch(id, job, *request, stdin);
        }
    }

    /// Why new runs are refused now, as the refusal says it; None while runs are accepted.
    pub(super) fn refusal(&self) -> Option<&'static str> {
        if self.timeline.accepts_runs() {
            return None;
        }
        Some(if self.timeline.phase() == Phase::Draining {
            "draining (tfinit drain; `tfinit resume` accepts runs again)"
        } else {
            "shutting down (the container is stopping)"
        })
    }

    /// Answers `conn` that its run was refused (exit code 75, "try again later") because the
    /// init is `why`.
    fn reply_refused(&mut self, conn: u64, run_id: Option<String>, why: &str) {
        let msg = format!(
            "tfinit: the init is {why}: terraform was not started; the controller should retry later (exit code {})",
            protocol::EXIT_REFUSED
        );
        self.reply_exit(
            conn,
            ExitNote {
                code: protocol::EXIT_REFUSED,
                error: Some(msg),
                run_id,
                ..Default::default()
            },
        );
    }

    /// Refuses every run that has not started because it waits for the store, once the init
    /// stopped accepting runs (shutdown, drain): it is answered 75 and never started; its record,
    /// if it lands later, is removed.
    pub(super) fn refuse_waiting(&mut self) {
        let Some(why) = self.refusal() else {
            return;
        };
        let ids: Vec<u64> = self
            .runs
            .iter()
            .filter(|(_, r)| r.waits_for_store())
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            let Some(run) = self.runs.remove(&id) else {
                continue;
            };
            tracing::info!(run = %run.job.id, state = run.life.as_str(), reason = why, "terraform run refused before it started");
            self.forget_record(&run.job.id);
            if let Some(c) = run.job.conn {
                self.reply_refused(c, Some(run.job.id), why);
            }
        }
    }

    /// A run that never started is over: its record (landed or still in flight) is removed.
    pub(super) fn forget_record(&mut self, run: &str) {
        if let Some(r) = self.book.exited(run, None, Vec::new()) {
            self.send_to_recorder(r);
        }
    }

    /// Starts terraform for a run (after any recovery): the run then exists as Running, or is
    /// answered with why it could not start.
    fn launch(&mut self, id: u64, job: Job, req: RunRequest, stdin: Option<OwnedFd>) {
        let recorded = self.book.record(&job.id).is_some_and(|r| r.may_exist());
        if recorded && self.book.fence_stage() != FenceStage::Clear {
            // Its record is on the volume but the heartbeat is not: it would be stopped at once.
            let why = "unable to keep this owner's heartbeat on the state volume (its runs with records are being stopped)";
            tracing::warn!(run = %job.id, "terraform run refused before it started: {why}");
            self.forget_record(&job.id);
            if let Some(c) = job.conn {
                self.reply_refused(c, Some(job.id), why);
            }
            return;
        }
        match spawn::terraform(&req, stdin, self.incarnation_lock.as_deref()) {
            Ok(started) => {
                tracing::info!(
                    run = %job.id, pid = started.pid.as_raw(), cwd = %job.cwd.display(), subcommand = %job.invocation.subcommand,
                    argv = ?job.argv, "terraform started"
                );
                let life = Life::Running {
                    pid: started.pid,
                    pipes: Pipes {
                        stdout: Some(started.stdout),
                        stderr: Some(started.stderr),
                        paused: false,
                    },
                    stop: Stop::default(),
                };
                self.runs.insert(id, Run { job, life });
                self.pids.insert(started.pid, PidOwner::Terraform(id));
                self.watch_pipes(id);
            }
            Err(e) => {
                let (code, hint) = match &e {
                    StartError::NonBlocking(_) => (
                        EXIT_SETUP_FAILED,
                        " (terraform was not started, so nothing ran; retry, and report it if it repeats)",
                    ),
                    // Out of descriptors or processes is passing: "try again later" (75), like a
                    // refusal, so the controller retries instead of reporting a broken binary.
                    StartError::Spawn(e) => match e.raw_os_error() {
                        Some(libc::EMFILE | libc::ENFILE | libc::EAGAIN | libc::ENOMEM) => (
                            protocol::EXIT_REFUSED,
                            " (out of resources: try again later; raise the container's open-files or process limits if it repeats)",
                        ),
                        _ if e.kind() == io::ErrorKind::NotFound => (127, ""),
                        _ => (126, ""),
                    },
                };
                let msg = format!(
                    "tfinit: cannot start {:?} in {:?}: {e}{hint}",
                    req.program, req.cwd
                );
                tracing::warn!(run = %job.id, "{msg}");
                self.forget_record(&job.id);
                if let Some(c) = job.conn {
                    self.reply_exit(
                        c,
                        ExitNote {
                            code,
                            error: Some(msg),
                            run_id: Some(job.id),
                            ..Default::default()
                        },
                    );
                }
            }
        }
    }

    /// A run's lock recovery ended: the recorder rescans (the table counts in that directory
    /// again once scanned after it), and the run goes on to its record, unless its shim is gone
    /// or the init stopped accepting runs meanwhile.
    pub(super) fn on_recovery_exit(&mut self, id: u64, exit: Exit) {
        let Some(run) = self.runs.get(&id) else {
            return;
        };
        if !matches!(run.life, Life::Recovering { .. }) {
            return;
        }
        tracing::info!(run = %run.job.id, %exit, "lock recovery finished");
        let Some(Run { job, life }) = self.runs.remove(&id) else {
            return;
        };
        let Life::Recovering { request, stdin, .. } = life else {
            return;
        };
        let rescan = self.book.recovery_done(&job.workdir, Instant::now());
        self.send_to_recorder(rescan);
        self.go_on_after_recovery(id, job, *request, stdin);
        // Runs in this directory that waited for the recovery check again now.
        self.resume_awaiting();
    }

    /// The run whose recovery ended goes on to its record, unless its shim is gone or the init
    /// stopped accepting runs meanwhile (then it is refused like a new run).
    fn go_on_after_recovery(
        &mut self,
        id: u64,
        job: Job,
        request: RunRequest,
        stdin: Option<OwnedFd>,
    ) {
        let Some(conn) = job.conn else {
            // The shim gave up while the lock was checked: nobody waits for this run, and
            // starting it now would only leave a run to stop.
            tracing::info!(run = %job.id, "the shim is gone; terraform is not started");
            return;
        };
        // Stopping (the kill step may have ended the helper) or draining. An abandoned run's
        // helper killed on its timer has no shim, so it ended above.
        if let Some(why) = self.refusal() {
            tracing::info!(run = %job.id, reason = why, "terraform run refused before it started");
            self.reply_refused(conn, Some(job.id), why);
            return;
        }
        self.record_step(id, job, request, stdin, None);
    }
}
