//! One terraform run: what it is ([`Job`], fixed when the shim asked) and where it is in its life
//! ([`Life`]), each state holding exactly what exists in it.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::{Instant, SystemTime};

use nix::unistd::Pid;

use super::super::reaper::Exit;
use super::super::token::{ConnId, Stream};
use crate::locks::follower::Follower;
use crate::locks::names::RunId;
use crate::locks::workspace::workspace_of;
use crate::protocol::{FileId, RunRequest, RunStatus};
use crate::terraform::{self, Invocation};

/// The read ends of terraform's output pipes (non-blocking, close-on-exec).
#[derive(Debug, Default)]
pub(super) struct Pipes {
    /// terraform's stdout, while open.
    pub(super) stdout: Option<OwnedFd>,
    /// terraform's stderr, while open.
    pub(super) stderr: Option<OwnedFd>,
    /// Whether they are out of the epoll set because the shim reads slower than terraform writes.
    pub(super) paused: bool,
}

impl Pipes {
    /// The read end of terraform's stdout or stderr pipe, while it is open.
    pub(super) fn get(&self, stream: Stream) -> Option<&OwnedFd> {
        match stream {
            Stream::Stdout => self.stdout.as_ref(),
            Stream::Stderr => self.stderr.as_ref(),
        }
    }

    /// Takes the read end of a pipe out (to close it).
    pub(super) fn take(&mut self, stream: Stream) -> Option<OwnedFd> {
        match stream {
            Stream::Stdout => self.stdout.take(),
            Stream::Stderr => self.stderr.take(),
        }
    }

    /// Whether either pipe is still open.
    pub(super) fn is_open(&self) -> bool {
        self.stdout.is_some() || self.stderr.is_some()
    }
}

/// How far stopping a started terraform has gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stop {
    /// Nothing was sent.
    None,
    /// Its one graceful SIGTERM was sent. `kill_at`: the group of an abandoned or cancelled run
    /// is SIGKILLed then, if still there (only while terraform runs).
    Graceful {
        /// When the group of an abandoned or cancelled run is SIGKILLed.
        kill_at: Option<Instant>,
    },
    /// Its group was SIGKILLed, after its graceful SIGTERM or not.
    Killed {
        /// Whether the graceful SIGTERM was sent.
        graceful: bool,
    },
}

impl Stop {
    /// The same once terraform exited: an abandoned or cancelled run's SIGKILL timer is moot.
    pub(super) fn without_timer(self) -> Stop {
        match self {
            Stop::Graceful { .. } => Stop::Graceful { kill_at: None },
            other => other,
        }
    }

    /// Whether the graceful SIGTERM was sent.
    pub(super) fn graceful(self) -> bool {
        matches!(
            self,
            Stop::Graceful { .. } | Stop::Killed { graceful: true }
        )
    }
}

/// What a run holds until terraform starts: the shim's request and stdin.
#[derive(Debug, Default)]
pub(super) struct Pending {
    /// The request.
    pub(super) request: Box<RunRequest>,
    /// The shim's stdin (None: /dev/null).
    pub(super) stdin: Option<OwnedFd>,
}

/// A run's lock-recovery helper.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Helper {
    /// Being started. `deadline`: the run's wait for the store, kept for when it cannot start.
    Starting {
        /// The end of the run's TFINIT_RECORD_TIMEOUT.
        deadline: Instant,
    },
    /// Runs (its own process group).
    Running {
        /// Its pid.
        pid: Pid,
        /// When the helper of an abandoned or cancelled run is SIGKILLed if still there.
        kill_at: Option<Instant>,
    },
}

/// Where a run is in its life, with what exists in that state.
#[derive(Debug)]
pub(super) enum Life {
    /// Waits for a place under TFINIT_MAX_RUNS: the runs that hold one are at the cap. Queued runs
    /// leave the queue in arrival order (their ids) as places free up; nothing is done for one
    /// before (no lock check, no record), and none is queued while the init refuses runs.
    Queued {
        /// Its request.
        pending: Pending,
    },
    /// Waits for the store to tell whether its lock needs a recovery: the store is opening, a
    /// recovery of this init runs, or this init's own end-marking of a run there is not on
    /// the volume yet (a recovery must read records that tell the truth). At most until
    /// `deadline`, then it goes on without the check.
    AwaitingRecords {
        /// Its request.
        pending: Pending,
        /// When the check is skipped.
        deadline: Instant,
    },
    /// A lock recovery for its working directory runs first; terraform waits.
    Recovering {
        /// Its request.
        pending: Pending,
        /// The helper.
        helper: Helper,
    },
    /// Its lock-owner record is asked for and being written; terraform starts when it lands, or
    /// without it at TFINIT_RECORD_TIMEOUT (the records keep that deadline), or at once when the
    /// records answer that none can be written now.
    Recording {
        /// Its request.
        pending: Pending,
    },
    /// terraform is being started from its request.
    Launching {
        /// Its request.
        pending: Pending,
    },
    /// terraform runs.
    Running {
        /// terraform's pid, also its process group id.
        pid: Pid,
        /// Its output pipes.
        pipes: Pipes,
        /// How far stopping it has gone.
        stop: Stop,
    },
    /// terraform was reaped; its output is still being drained.
    Exited {
        /// Its process group (leftovers may still be in it).
        pgid: Pid,
        /// How terraform ended.
        exit: Exit,
        /// The pipes still open (a leftover grandchild may hold them).
        pipes: Pipes,
        /// When pipes still open are drained and closed anyway.
        linger_until: Instant,
        /// How far stopping it had gone.
        stop: Stop,
    },
}

impl Life {
    /// The name in `tfinit status` (`RunStatus.state`) and logs.
    pub(super) fn as_str(&self) -> &'static str {
        match self {
            Life::Queued { .. } => "queued",
            Life::AwaitingRecords { .. } | Life::Recovering { .. } => "recovering",
            Life::Recording { .. } => "recording",
            Life::Launching { .. } | Life::Running { .. } => "running",
            Life::Exited { .. } => "exited",
        }
    }

    /// Its request, while terraform has not started.
    pub(super) fn pending(&self) -> Option<&Pending> {
        match self {
            Life::Queued { pending }
            | Life::AwaitingRecords { pending, .. }
            | Life::Recovering { pending, .. }
            | Life::Recording { pending }
            | Life::Launching { pending } => Some(pending),
            Life::Running { .. } | Life::Exited { .. } => None,
        }
    }

    /// See [`Self::pending`] (to move it to the next state).
    pub(super) fn pending_mut(&mut self) -> Option<&mut Pending> {
        match self {
            Life::Queued { pending }
            | Life::AwaitingRecords { pending, .. }
            | Life::Recovering { pending, .. }
            | Life::Recording { pending }
            | Life::Launching { pending } => Some(pending),
            Life::Running { .. } | Life::Exited { .. } => None,
        }
    }
}

/// What a run is, whatever its state: set when the shim asked.
#[derive(Debug)]
pub(super) struct Job {
    /// Its id.
    pub(super) id: RunId,
    /// The shim's working directory.
    pub(super) cwd: PathBuf,
    /// Where terraform works (cwd + -chdir): the key for lock-owner records.
    pub(super) workdir: PathBuf,
    /// What `cwd` is, as its shim found it (device and inode), for `tfinit cancel --workdir`.
    pub(super) cwd_id: Option<FileId>,
    /// What `workdir` is, likewise.
    pub(super) workdir_id: Option<FileId>,
    /// Parsed command line.
    pub(super) invocation: Invocation,
    /// argv without secrets, for logs, status and records.
    pub(super) argv: Vec<String>,
    /// When the shim asked.
    pub(super) started: SystemTime,
    /// The connection of the shim, while attached.
    pub(super) conn: Option<ConnId>,
    /// Partial lines of output while detached (logged line by line).
    partial: [Vec<u8>; 2],
    /// The terraform workspace whose state it locks (for records and recovery).
    pub(super) workspace: String,
    /// Tracks resources in progress from the output, for the record (state-locking runs only).
    pub(super) follower: Option<Follower>,
}

impl Job {
    /// Run `id` for the shim of `conn` asking `req`, at `started`.
    pub(super) fn new(id: RunId, conn: ConnId, req: &RunRequest, started: SystemTime) -> Job {
        let invocation = Invocation::parse(&req.args, &req.env);
        let cwd = PathBuf::from(&req.cwd);
        let workdir = invocation.workdir(&cwd);
        let locking = invocation.takes_lock();
        let workspace = workspace_of(&invocation, &req.env, req.workspace.as_deref());
        Job {
            id,
            cwd,
            workdir,
            cwd_id: req.cwd_id,
            workdir_id: req.workdir_id,
            workspace,
            argv: terraform::redact(&req.args),
            invocation,
            started,
            conn: Some(conn),
            partial: [Vec::new(), Vec::new()],
            follower: locking.then(Follower::default),
        }
    }

    /// Whether it takes terraform's state lock (then it has a record, and a lock check first).
    pub(super) fn locking(&self) -> bool {
        self.follower.is_some()
    }

    /// Logs complete lines of output at debug while no shim is attached (the run was abandoned):
    /// operators still see what it did.
    pub(super) fn log_detached(&mut self, stream: Stream, bytes: &[u8]) {
        let buf = &mut self.partial[stream as usize];
        buf.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(nl) = buf[start..].iter().position(|&b| b == b'\n') {
            let line = String::from_utf8_lossy(&buf[start..start + nl]);
            tracing::debug!(run = %self.id, stream = stream.as_str(), "{}", line.trim_end_matches('\r'));
            start += nl + 1;
        }
        buf.drain(..start);
        if buf.len() > 64 << 10 {
            let line = String::from_utf8_lossy(buf);
            tracing::debug!(run = %self.id, stream = stream.as_str(), "{line}");
            buf.clear();
        }
    }

    /// Logs a last partial line when the stream ends.
    pub(super) fn flush_detached(&mut self, stream: Stream) {
        let buf = std::mem::take(&mut self.partial[stream as usize]);
        if !buf.is_empty() {
            tracing::debug!(run = %self.id, stream = stream.as_str(), "{}", String::from_utf8_lossy(&buf));
        }
    }
}

/// One terraform run: what it is, and where it is in its life.
#[derive(Debug)]
pub(in crate::init) struct Run {
    /// What it is.
    pub(super) job: Job,
    /// Where it is in its life.
    pub(super) life: Life,
}

impl Run {
    /// terraform's pid (and process group), once started.
    pub(super) fn pid(&self) -> Option<Pid> {
        match self.life {
            Life::Running { pid, .. } => Some(pid),
            Life::Exited { pgid, .. } => Some(pgid),
            _ => None,
        }
    }

    /// Whether terraform has not started yet and the run waits for a place under
    /// TFINIT_MAX_RUNS or for the store (its record, or what a recovery needs), not for a process:
    /// it can end at once, and nothing is left to stop.
    pub(super) fn waiting(&self) -> bool {
        matches!(
            self.life,
            Life::Queued { .. } | Life::AwaitingRecords { .. } | Life::Recording { .. }
        )
    }

    /// Whether it holds one of the TFINIT_MAX_RUNS places: from leaving the queue (its lock check,
    /// recovery and record, then terraform) until terraform is reaped. Read-only runs never do.
    pub(super) fn holds_place(&self) -> bool {
        !self.job.invocation.read_only()
            && !matches!(self.life, Life::Queued { .. } | Life::Exited { .. })
    }

    /// Whether it waits in the queue.
    pub(super) fn queued(&self) -> bool {
        matches!(self.life, Life::Queued { .. })
    }

    /// Whether a recovery runs (or is being started) for it.
    pub(super) fn recovering(&self) -> bool {
        matches!(self.life, Life::Recovering { .. })
    }

    /// Its output pipes, once terraform started.
    pub(super) fn pipes(&self) -> Option<&Pipes> {
        match &self.life {
            Life::Running { pipes, .. } | Life::Exited { pipes, .. } => Some(pipes),
            _ => None,
        }
    }

    /// See [`Self::pipes`].
    pub(super) fn pipes_mut(&mut self) -> Option<&mut Pipes> {
        match &mut self.life {
            Life::Running { pipes, .. } | Life::Exited { pipes, .. } => Some(pipes),
            _ => None,
        }
    }

    /// Whether terraform was sent its one graceful SIGTERM.
    pub(super) fn stop_requested(&self) -> bool {
        match self.life {
            Life::Running { stop, .. } | Life::Exited { stop, .. } => stop.graceful(),
            _ => false,
        }
    }

    /// When an abandoned run is due to be SIGKILLed (terraform's group, or its recovery
    /// helper's).
    pub(super) fn kill_due(&self) -> Option<Instant> {
        match self.life {
            Life::Recovering {
                helper: Helper::Running { kill_at, .. },
                ..
            } => kill_at,
            Life::Running {
                stop: Stop::Graceful { kill_at },
                ..
            } => kill_at,
            _ => None,
        }
    }

    /// terraform was reaped: Running becomes Exited, its pipes drained until `linger_until`.
    /// Returns its process group and how far stopping it had gone; None when it was not running.
    pub(super) fn reaped(&mut self, exit: Exit, linger_until: Instant) -> Option<(Pid, Stop)> {
        let Life::Running { pid, pipes, stop } = &mut self.life else {
            return None;
        };
        let (pgid, stop) = (*pid, *stop);
        self.life = Life::Exited {
            pgid,
            exit,
            pipes: std::mem::take(pipes),
            linger_until,
            stop: stop.without_timer(),
        };
        Some((pgid, stop))
    }

    /// Its shim left, or it was cancelled: terraform's group (or the recovery helper's) is
    /// SIGKILLed at `kill_at` if still there (an earlier SIGKILL already due stays). Only a
    /// terraform asked to stop, or a running helper, has such a timer.
    pub(super) fn arm_kill(&mut self, kill_at: Instant) {
        match &mut self.life {
            Life::Recovering {
                helper: Helper::Running { kill_at: at, .. },
                ..
            }
            | Life::Running {
                stop: Stop::Graceful { kill_at: at },
                ..
            } => *at = Some(at.map_or(kill_at, |due| due.min(kill_at))),
            _ => {}
        }
    }

    /// The `tfinit status` entry.
    pub(super) fn status(&self) -> RunStatus {
        let pid = self.pid().map_or(0, |p| p.as_raw());
        let job = &self.job;
        RunStatus {
            id: job.id.to_string(),
            pid,
            pgid: pid,
            cwd: job.cwd.to_string_lossy().into_owned(),
            subcommand: job.invocation.subcommand.clone(),
            argv: job.argv.clone(),
            started_unix: job
                .started
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            attached: job.conn.is_some(),
            stop_requested: self.stop_requested(),
            state: self.life.as_str().to_string(),
        }
    }
}
