//! Starting processes: the controller (the main child) and terraform runs.
//!
//! Both start in a process group of their own, with an empty signal mask and default dispositions
//! (the init reset every disposition at start-up; `sys::child_defaults` empties the mask).

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use nix::unistd::Pid;

use crate::locks::book::LiveRun;
use crate::locks::handoff::{self, RecoverArgs};
use crate::locks::liveness::Seen;
use crate::locks::record::Owner;
use crate::protocol::RunRequest;
use crate::sys;

/// Why COMMAND could not be started; maps to the shell's exit codes.
#[derive(Debug, thiserror::Error)]
#[error("cannot run {command:?}: {source}{hint}")]
pub(super) struct SpawnError {
    /// The program.
    command: String,
    /// The OS error.
    source: io::Error,
    /// What to do.
    hint: &'static str,
}

impl SpawnError {
    /// 127 when the program does not exist, 126 when it exists but cannot be executed.
    pub(super) fn exit_code(&self) -> i32 {
        match self.source.kind() {
            io::ErrorKind::NotFound => 127,
            _ => 126,
        }
    }
}

/// Starts the controller in its own process group, with stdio inherited and the terminal's
/// foreground when stdin is one. `env` adds variables its children (the shim) need.
pub(super) fn main_child(argv: &[OsString], env: &[(&str, OsString)]) -> Result<Pid, SpawnError> {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).process_group(0);
    for (k, v) in env {
        cmd.env(k, v);
    }
    sys::child_defaults(&mut cmd);
    sys::take_terminal_foreground_in_child(&mut cmd);
    match cmd.spawn() {
        Ok(child) => Ok(Pid::from_raw(child.id() as i32)),
        Err(source) => {
            let hint = match source.kind() {
                io::ErrorKind::NotFound => {
                    " (not found: check the path, or that it is on PATH inside the image)"
                }
                io::ErrorKind::PermissionDenied => {
                    " (permission denied: is it executable? chmod +x)"
                }
                _ => "",
            };
            Err(SpawnError {
                command: argv[0].to_string_lossy().into_owned(),
                source,
                hint,
            })
        }
    }
}

/// A terraform process just started.
#[derive(Debug)]
pub(super) struct Started {
    /// terraform's pid (also its process group id).
    pub(super) pid: Pid,
    /// Read end of its stdout.
    pub(super) stdout: OwnedFd,
    /// Read end of its stderr.
    pub(super) stderr: OwnedFd,
}

/// Why terraform was not started.
#[derive(Debug, thiserror::Error)]
pub(super) enum StartError {
    /// Our read end of an output pipe could not be made non-blocking (a blocking pipe would hang
    /// the loop), so terraform was not started.
    #[error(
        "cannot make the read end of terraform's output pipe non-blocking (fcntl O_NONBLOCK): {0}"
    )]
    NonBlocking(io::Error),
    /// Creating a pipe or starting the process failed.
    #[error("{0}")]
    Spawn(io::Error),
}

/// One output pipe: our read end (close-on-exec, non-blocking, made so before terraform exists)
/// and terraform's write end (blocking, as any program expects its stdout to be).
fn output_pipe() -> Result<(OwnedFd, OwnedFd), StartError> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let (read, write) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| StartError::Spawn(e.into()))?;
    let flags = fcntl(&read, FcntlArg::F_GETFL).map_err(|e| StartError::NonBlocking(e.into()))?;
    fcntl(
        &read,
        FcntlArg::F_SETFL(OFlag::from_bits_retain(flags) | OFlag::O_NONBLOCK),
    )
    .map_err(|e| StartError::NonBlocking(e.into()))?;
    // A bigger pipe means fewer wake-ups for large outputs (plan -json, show -json); the default
    // size works too, so a refusal (the per-user pipe limit) is ignored.
    let _ = fcntl(&read, FcntlArg::F_SETPIPE_SZ(1 << 20));
    Ok((read, write))
}

/// Starts the real terraform for a shim's request, in its own process group, with the shim's
/// `argv[0]`, arguments, working directory and environment. `stdin` is the shim's stdin, passed
/// over the socket; None means /dev/null. `lock` is the incarnation's lock file: terraform (and
/// every process it starts) inherits it, so the kernel frees its flock only when they are all gone.
pub(super) fn terraform(
    req: &RunRequest,
    stdin: Option<OwnedFd>,
    lock: Option<&OwnedFd>,
) -> Result<Started, StartError> {
    // A duplicate without close-on-exec, only for this spawn (only this thread forks: the
    // recorder thread never does), closed again below.
    let inherited = match lock {
        Some(fd) => Some(nix::unistd::dup(fd).map_err(|e| StartError::Spawn(e.into()))?),
        None => None,
    };
    let (out_read, out_write) = output_pipe()?;
    let (err_read, err_write) = output_pipe()?;
    let mut cmd = Command::new(&req.program);
    cmd.arg0(&req.argv0)
        .args(&req.args)
        .current_dir(&req.cwd)
        .env_clear()
        .process_group(0)
        .stdout(Stdio::from(out_write))
        .stderr(Stdio::from(err_write));
    set_env(&mut cmd, &req.env);
    sys::child_defaults(&mut cmd);
    match stdin {
        Some(fd) => cmd.stdin(Stdio::from(fd)),
        None => cmd.stdin(Stdio::null()),
    };
    let child = cmd.spawn().map_err(StartError::Spawn)?;
    // Our copies of the write ends close with `cmd` here: terraform (and what it passes them
    // to) then holds the only ones, so end of file means they are all gone.
    drop(cmd);
    drop(inherited);
    Ok(Started {
        pid: Pid::from_raw(child.id() as i32),
        stdout: out_read,
        stderr: err_read,
    })
}

/// What the recovery helper needs from the init besides the run's request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RecoveryArgs {
    /// TFINIT_STATE_DIR.
    pub(super) state_dir: PathBuf,
    /// TFINIT_STORE (or `--store`).
    pub(super) store: crate::config::StoreSetting,
    /// The working directory whose records it recovers.
    pub(super) workdir: PathBuf,
    /// This incarnation (its live records are never recovered).
    pub(super) owner: Owner,
    /// TFINIT_OWNER_TTL.
    pub(super) ttl: std::time::Duration,
    /// TFINIT_OLDER_OWNER_TTL.
    pub(super) older_ttl: std::time::Duration,
    /// The init's live state-locking runs, recorded or not: a lock with one's Who is left alone.
    pub(super) live: Vec<LiveRun>,
    /// What the init has seen of other incarnations' heartbeats (CLOCK_MONOTONIC times).
    pub(super) seen: Vec<Seen>,
}

/// Starts the lock-recovery helper (this binary, hidden subcommand) with the run's environment
/// (backend credentials) and working directory, in its own process group. `report_to`: the write
/// end of the pipe its outcomes go back on (reports.rs); it inherits a duplicate, named by
/// `TFINIT_REPORT_FD`.
pub(super) fn recovery(
    req: &RunRequest,
    args: &RecoveryArgs,
    report_to: Option<&OwnedFd>,
) -> io::Result<Pid> {
    // As for terraform's lock file: a duplicate without close-on-exec for this spawn only.
    let inherited = report_to.map(nix::unistd::dup).transpose()?;
    let handoff = RecoverArgs {
        v: handoff::VERSION,
        workdir: args.workdir.clone(),
        terraform: req.program.clone().into(),
        state_dir: args.state_dir.clone(),
        store: args.store,
        owner: args.owner.clone(),
        ttl_ms: args.ttl.as_millis() as u64,
        older_ttl_ms: args.older_ttl.as_millis() as u64,
        live: args.live.clone(),
        seen: args.seen.clone(),
    };
    let argv = handoff.to_argv().map_err(io::Error::other)?;
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg0("tfinit");
    cmd.arg(crate::locks::recover::HIDDEN_SUBCOMMAND)
        .args(argv)
        .current_dir(&req.cwd)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit());
    cmd.process_group(0);
    sys::child_defaults(&mut cmd);
    set_env(&mut cmd, &req.env);
    // Its logs go to the container log in the init's format; it reaches the init's stores.
    for k in [
        "TFINIT_LOG",
        "TFINIT_LOG_FORMAT",
        "TFINIT_SERVICE_ACCOUNT_DIR",
        "KUBERNETES_SERVICE_HOST",
        "KUBERNETES_SERVICE_PORT",
    ] {
        if let Some(v) = std::env::var_os(k) {
            cmd.env(k, v);
        }
    }
    if let Some(fd) = &inherited {
        cmd.env(
            crate::locks::recover::REPORT_FD_VAR,
            fd.as_raw_fd().to_string(),
        );
    }
    let child = cmd.spawn()?;
    drop(inherited);
    Ok(Pid::from_raw(child.id() as i32))
}

/// Gives `cmd` the shim's environment (`KEY=VALUE` strings; an entry without a key is skipped).
pub(super) fn set_env(cmd: &mut Command, env: &[String]) {
    for kv in env {
        if let Some((k, v)) = kv.split_once('=') {
            if !k.is_empty() {
                cmd.env(k, v);
            }
        }
    }
}
