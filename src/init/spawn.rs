//! Starting processes: the controller (the main child) and terraform runs.
//!
//! Both start in a process group of their own, with an empty signal mask and default dispositions
//! (the init reset every disposition at start-up; `sys::child_defaults` empties the mask).

use std::ffi::OsString;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use nix::unistd::Pid;

use crate::protocol::RunRequest;
use crate::sys;

/// Why COMMAND could not be started; maps to the shell's exit codes.
#[derive(Debug, thiserror::Error)]
#[error("cannot run {command:?}: {source}{hint}")]
pub struct SpawnError {
    /// The program.
    pub command: String,
    /// The OS error.
    pub source: io::Error,
    /// What to do.
    pub hint: &'static str,
}

impl SpawnError {
    /// 127 when the program does not exist, 126 when it exists but cannot be executed.
    pub fn exit_code(&self) -> i32 {
        match self.source.kind() {
            io::ErrorKind::NotFound => 127,
            _ => 126,
        }
    }
}

/// Starts the controller in its own process group, with stdio inherited and the terminal's
/// foreground when stdin is one. `env` adds variables its children (the shim) need.
pub fn main_child(argv: &[OsString], env: &[(&str, OsString)]) -> Result<Pid, SpawnError> {
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
pub struct Started {
    /// terraform's pid (also its process group id).
    pub pid: Pid,
    /// Read end of its stdout.
    pub stdout: OwnedFd,
    /// Read end of its stderr.
    pub stderr: OwnedFd,
}

/// Starts the real terraform for a shim's request, in its own process group, with the shim's
/// argv[0], arguments, working directory and environment. `stdin` is the shim's stdin, passed
/// over the socket; None means /dev/null.
pub fn terraform(req: &RunRequest, stdin: Option<OwnedFd>) -> io::Result<Started> {
    let mut cmd = Command::new(&req.program);
    cmd.arg0(&req.argv0)
        .args(&req.args)
        .current_dir(&req.cwd)
        .env_clear()
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    set_env(&mut cmd, &req.env);
    sys::child_defaults(&mut cmd);
    match stdin {
        Some(fd) => cmd.stdin(Stdio::from(fd)),
        None => cmd.stdin(Stdio::null()),
    };
    let mut child = cmd.spawn()?;
    let (Some(out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(io::Error::other("stdout/stderr pipes missing after spawn"));
    };
    Ok(Started {
        pid: Pid::from_raw(child.id() as i32),
        stdout: out.into(),
        stderr: err.into(),
    })
}

/// Gives `cmd` the shim's environment (`KEY=VALUE` strings; an entry without a key is skipped).
pub fn set_env(cmd: &mut Command, env: &[String]) {
    for kv in env {
        if let Some((k, v)) = kv.split_once('=') {
            if !k.is_empty() {
                cmd.env(k, v);
            }
        }
    }
}
