//! terraform runs the init started for shims: their state and what their output becomes.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::{Instant, SystemTime};

use nix::unistd::Pid;

use super::reaper::Exit;
use crate::locks::follower::Follower;
use crate::locks::record::RecordHandle;
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

/// Where a run is in its life.
#[derive(Debug)]
pub enum RunState {
    /// A lock recovery for its working directory runs first (the helper's pid); terraform waits.
    Recovering {
        /// The recovery helper.
        helper: Pid,
        /// The request, kept until terraform starts.
        request: Box<RunRequest>,
        /// The shim's stdin, kept until terraform starts.
        stdin: Option<OwnedFd>,
    },
    /// terraform runs (or has exited and its output is still being drained).
    Started {
        /// terraform's pid and process group.
        pid: Pid,
    },
}

/// One terraform run.
#[derive(Debug)]
pub struct Run {
    /// Run id (`r7`), in logs, status and records.
    pub id: String,
    /// Where it is in its life.
    pub state: RunState,
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
    /// Output pipes still open.
    pub stdout: Option<OwnedFd>,
    /// See `stdout`.
    pub stderr: Option<OwnedFd>,
    /// Whether the pipes are out of the epoll set because the shim reads slower than terraform writes.
    pub paused: bool,
    /// How terraform ended, once reaped.
    pub exit: Option<Exit>,
    /// When it was reaped: pipes held open by a leftover grandchild are closed a little later.
    pub exited_at: Option<Instant>,
    /// Whether its one graceful SIGTERM was sent.
    pub stop_requested: bool,
    /// When an abandoned run's group is SIGKILLed if still there.
    pub kill_at: Option<Instant>,
    /// Whether its group was SIGKILLed.
    pub killed: bool,
    /// Partial lines of output while detached (logged line by line).
    pub partial: [Vec<u8>; 2],
    /// The lock-owner record, for state-locking runs with a usable state directory.
    pub record: Option<RecordHandle>,
    /// Tracks resources in progress from the output, for the record.
    pub follower: Option<Follower>,
}

impl Run {
    /// terraform's pid, once started.
    pub fn pid(&self) -> Option<Pid> {
        match self.state {
            RunState::Started { pid } => Some(pid),
            RunState::Recovering { .. } => None,
        }
    }

    /// Whether terraform (or its recovery helper) still runs.
    pub fn alive(&self) -> bool {
        self.exit.is_none()
    }

    /// The read end of terraform's stdout or stderr pipe, while it is open.
    pub fn pipe(&self, stream: Stream) -> Option<&OwnedFd> {
        match stream {
            Stream::Stdout => self.stdout.as_ref(),
            Stream::Stderr => self.stderr.as_ref(),
        }
    }

    /// Takes the read end of a pipe out of the run (to close it).
    pub fn take_pipe(&mut self, stream: Stream) -> Option<OwnedFd> {
        match stream {
            Stream::Stdout => self.stdout.take(),
            Stream::Stderr => self.stderr.take(),
        }
    }

    /// The `tfinit status` entry.
    pub fn status(&self) -> RunStatus {
        let pid = self.pid().map_or(0, |p| p.as_raw());
        RunStatus {
            id: self.id.clone(),
            pid,
            pgid: pid,
            cwd: self.cwd.to_string_lossy().into_owned(),
            subcommand: self.invocation.subcommand.clone(),
            argv: self.argv.clone(),
            started_unix: self
                .started
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
            attached: self.conn.is_some(),
            stop_requested: self.stop_requested,
        }
    }

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
