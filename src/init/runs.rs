//! terraform runs the init started for shims: their state and what their output becomes.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use nix::unistd::Pid;

use super::reaper::Exit;
use crate::locks::follower::Follower;
use crate::protocol::{RunRequest, RunStatus};
use crate::terraform::Invocation;

/// Which output stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// terraform's stdout.
    Stdout,
    /// terraform's stderr.
    Stderr,
}

impl Stream {
    /// Name for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// How long pipes held open by a leftover grandchild are drained after terraform exits.
pub const LINGER: Duration = Duration::from_secs(2);

/// The read ends of terraform's output pipes (non-blocking, close-on-exec).
#[derive(Debug, Default)]
pub struct Pipes {
    /// terraform's stdout, while open.
    pub stdout: Option<OwnedFd>,
    /// terraform's stderr, while open.
    pub stderr: Option<OwnedFd>,
    /// Whether they are out of the epoll set because the shim reads slower than terraform writes.
    pub paused: bool,
}

impl Pipes {
    /// The read end of terraform's stdout or stderr pipe, while it is open.
    pub fn get(&self, stream: Stream) -> Option<&OwnedFd> {
        match stream {
            Stream::Stdout => self.stdout.as_ref(),
            Stream::Stderr => self.stderr.as_ref(),
        }
    }

    /// Takes the read end of a pipe out (to close it).
    pub fn take(&mut self, stream: Stream) -> Option<OwnedFd> {
        match stream {
            Stream::Stdout => self.stdout.take(),
            Stream::Stderr => self.stderr.take(),
        }
    }

    /// Whether either pipe is still open.
    pub fn is_open(&self) -> bool {
        self.stdout.is_some() || self.stderr.is_some()
    }
}

/// How far stopping a started terraform has gone.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stop {
    /// Whether its one graceful SIGTERM was sent.
    pub graceful: bool,
    /// When an abandoned run's group is SIGKILLed if still there (only while it runs).
    pub kill_at: Option<Instant>,
    /// Whether its group was SIGKILLed.
    pub killed: bool,
}

/// Where a run is in its life, with what exists in that state.
#[derive(Debug)]
pub enum Life {
    /// A dead run's record is in its directory, but this init's own end-marking of a run there is
    /// not on the volume yet: the recovery waits for it (a recovery must read records that tell
    /// the truth), at most until `deadline`.
    AwaitingRecords {
        /// The request, kept until terraform starts.
        request: Box<RunRequest>,
        /// The shim's stdin, kept until terraform starts.
        stdin: Option<OwnedFd>,
        /// When the recovery is skipped and the run goes on without it.
        deadline: Instant,
    },
    /// A lock recovery for its working directory runs first; terraform waits.
    Recovering {
        /// The recovery helper (its own process group).
        helper: Pid,
        /// The request, kept until terraform starts.
        request: Box<RunRequest>,
        /// The shim's stdin, kept until terraform starts.
        stdin: Option<OwnedFd>,
        /// When the helper of an abandoned run is SIGKILLed if still there.
        kill_at: Option<Instant>,
    },
    /// Its lock-owner record is being written (the recorder's create is in flight); terraform
    /// starts when it lands, or without it at TFINIT_RECORD_TIMEOUT (the book keeps that deadline).
    Recording {
        /// The request, kept until terraform starts.
        request: Box<RunRequest>,
        /// The shim's stdin, kept until terraform starts.
        stdin: Option<OwnedFd>,
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
    /// The name in `tfinit status` (`RunStatus.state`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Life::AwaitingRecords { .. } | Life::Recovering { .. } => "recovering",
            Life::Recording { .. } => "recording",
            Life::Running { .. } => "running",
            Life::Exited { .. } => "exited",
        }
    }
}

/// What a run is, whatever its state: set when the shim asked.
#[derive(Debug)]
pub struct Job {
    /// Run id (`r7`), in logs, status and records.
    pub id: String,
    /// The shim's working directory.
    pub cwd: PathBuf,
    /// Where terraform works (cwd + -chdir): the key for lock-owner records.
    pub workdir: PathBuf,
    /// Parsed command line.
    pub invocation: Invocation,
    /// argv without secrets, for logs, status and records.
    pub argv: Vec<String>,
    /// When the shim asked.
    pub started: SystemTime,
    /// The connection of the shim, while attached.
    pub conn: Option<u64>,
    /// Partial lines of output while detached (logged line by line).
    pub partial: [Vec<u8>; 2],
    /// The terraform workspace whose state it locks (for records and recovery).
    pub workspace: String,
    /// Tracks resources in progress from the output, for the record.
    pub follower: Option<Follower>,
}

/// One terraform run: what it is, and where it is in its life.
#[derive(Debug)]
pub struct Run {
    /// What it is.
    pub job: Job,
    /// Where it is in its life.
    pub life: Life,
}

impl Run {
    /// terraform's pid (and process group), once started.
    pub fn pid(&self) -> Option<Pid> {
        match self.life {
            Life::Running { pid, .. } => Some(pid),
            Life::Exited { pgid, .. } => Some(pgid),
            Life::AwaitingRecords { .. } | Life::Recording { .. } | Life::Recovering { .. } => None,
        }
    }

    /// Whether terraform has not started yet and waits for the store (its record, or the
    /// end-markings a recovery needs), not for a process.
    pub fn waits_for_store(&self) -> bool {
        matches!(
            self.life,
            Life::AwaitingRecords { .. } | Life::Recording { .. }
        )
    }

    /// Whether terraform (or its recovery helper) still runs.
    pub fn alive(&self) -> bool {
        !matches!(self.life, Life::Exited { .. })
    }

    /// Its output pipes, once terraform started.
    pub fn pipes(&self) -> Option<&Pipes> {
        match &self.life {
            Life::Running { pipes, .. } | Life::Exited { pipes, .. } => Some(pipes),
            Life::AwaitingRecords { .. } | Life::Recording { .. } | Life::Recovering { .. } => None,
        }
    }

    /// See [`Self::pipes`].
    pub fn pipes_mut(&mut self) -> Option<&mut Pipes> {
        match &mut self.life {
            Life::Running { pipes, .. } | Life::Exited { pipes, .. } => Some(pipes),
            Life::AwaitingRecords { .. } | Life::Recording { .. } | Life::Recovering { .. } => None,
        }
    }

    /// The read end of terraform's stdout or stderr pipe, while it is open.
    pub fn pipe(&self, stream: Stream) -> Option<&OwnedFd> {
        self.pipes().and_then(|p| p.get(stream))
    }

    /// Whether its pipes are paused (out of the epoll set).
    pub fn paused(&self) -> bool {
        self.pipes().is_some_and(|p| p.paused)
    }

    /// Whether terraform was sent its one graceful SIGTERM.
    pub fn stop_requested(&self) -> bool {
        match &self.life {
            Life::Running { stop, .. } | Life::Exited { stop, .. } => stop.graceful,
            Life::AwaitingRecords { .. } | Life::Recording { .. } | Life::Recovering { .. } => {
                false
            }
        }
    }

    /// Sets when an abandoned run is SIGKILLed if still there (terraform's group, or the
    /// recovery helper's); nothing once terraform exited.
    pub fn set_kill_at(&mut self, at: Instant) {
        match &mut self.life {
            Life::Recovering { kill_at, .. } => *kill_at = Some(at),
            Life::Running { stop, .. } => stop.kill_at = Some(at),
            Life::AwaitingRecords { .. } | Life::Recording { .. } | Life::Exited { .. } => {}
        }
    }

    /// When an abandoned run is due to be SIGKILLed (not yet done).
    pub fn kill_due(&self) -> Option<Instant> {
        match &self.life {
            Life::Recovering { kill_at, .. } => *kill_at,
            Life::Running { stop, .. } => stop.kill_at.filter(|_| !stop.killed),
            Life::AwaitingRecords { .. } | Life::Recording { .. } | Life::Exited { .. } => None,
        }
    }

    /// terraform was reaped: Running becomes Exited, its pipes drained until `linger_until`.
    pub fn exited(&mut self, exit: Exit, linger_until: Instant) {
        if let Life::Running { pid, pipes, stop } = &mut self.life {
            self.life = Life::Exited {
                pgid: *pid,
                exit,
                pipes: std::mem::take(pipes),
                linger_until,
                stop: *stop,
            };
        }
    }

    /// The `tfinit status` entry.
    pub fn status(&self) -> RunStatus {
        let pid = self.pid().map_or(0, |p| p.as_raw());
        let job = &self.job;
        RunStatus {
            id: job.id.clone(),
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

impl Job {
    /// Logs complete lines of output at debug while no shim is attached (the run was abandoned):
    /// operators still see what it did.
    pub fn log_detached(&mut self, stream: Stream, bytes: &[u8]) {
        let idx = stream as usize;
        let buf = &mut self.partial[idx];
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
    pub fn flush_detached(&mut self, stream: Stream) {
        let buf = std::mem::take(&mut self.partial[stream as usize]);
        if !buf.is_empty() {
            tracing::debug!(run = %self.id, stream = stream.as_str(), "{}", String::from_utf8_lossy(&buf));
        }
    }
}
