//! Set-up before the event loop: the zone where failing with a clear message is allowed.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::unistd::{getpid, getuid};

use crate::config::{socket_path, InitConfig};
use crate::signals;
use crate::sys;

/// How orphans come to us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// We are PID 1 of a PID namespace: every orphan is ours, kill(-1) reaches everyone else.
    Pid1,
    /// We are a child subreaper: orphans of our descendants come to us.
    Subreaper,
    /// Neither: orphans escape us (they go to the real init); zombies may pile up.
    Neither,
}

/// Reset dispositions, block every signal we read, and open the signalfd. Must run first in main,
/// before any thread exists: a signalfd only sees signals blocked in every thread.
pub fn signals() -> io::Result<SignalFd> {
    sys::reset_signal_dispositions();
    sys::raise_nofile();
    let mask = signals::init_mask();
    sys::block_signals(&mask)?;
    SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .map_err(io::Error::from)
}

/// Large buffers (a client's request, a shim's queued output) go back to the kernel when freed:
/// the init's memory after a burst of clients returns to its idle size rather than staying at
/// the peak (bounds.rs bounds the peak).
pub fn memory() {
    if !sys::return_large_buffers(LARGE_BUFFER) {
        tracing::debug!("mallopt(M_MMAP_THRESHOLD) refused; freed large buffers may stay resident");
    }
}

/// The size from which a buffer is a mapping of its own (glibc's default before it adjusts it).
const LARGE_BUFFER: usize = 128 << 10;

/// Makes sure orphans come to us: as PID 1 they do; otherwise register as child subreaper.
pub fn reaping_mode() -> Mode {
    if getpid().as_raw() == 1 {
        return Mode::Pid1;
    }
    match nix::sys::prctl::set_child_subreaper(true) {
        Ok(()) => Mode::Subreaper,
        Err(e) => {
            tracing::warn!(
                error = %e,
                "tfinit is not PID 1 and could not register as child subreaper: orphaned processes \
                 will not be reaped by tfinit and zombies can pile up. Fix: make tfinit the \
                 container's entrypoint (ENTRYPOINT [\"/usr/local/bin/tfinit\", \"--\"]), or run it \
                 on Linux >= 3.4 where PR_SET_CHILD_SUBREAPER exists"
            );
            Mode::Neither
        }
    }
}

/// Why the control socket could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("cannot set up the control socket in TFINIT_RUN_DIR={dir:?}: {problem}")]
pub struct SocketError {
    /// The directory.
    dir: PathBuf,
    /// What went wrong and what to do.
    problem: String,
}

/// Creates the run directory (0700, ours) and binds the control socket (0600), non-blocking.
/// A stale socket from a previous init is replaced; anything else in its place is an error.
pub fn control_socket(run_dir: &Path) -> Result<UnixListener, SocketError> {
    let err = |problem: String| SocketError {
        dir: run_dir.to_path_buf(),
        problem,
    };
    match fs::symlink_metadata(run_dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(run_dir)
                .map_err(|e| err(format!("mkdir failed: {e}; point TFINIT_RUN_DIR at a writable directory (an emptyDir)")))?;
        }
        Err(e) => return Err(err(format!("stat failed: {e}"))),
        Ok(m) if !m.is_dir() => return Err(err("exists and is not a directory: remove it or choose another TFINIT_RUN_DIR".into())),
        Ok(m) if m.uid() != getuid().as_raw() => {
            return Err(err(format!(
                "is owned by uid {} but tfinit runs as uid {}: another user could intercept terraform runs; choose a directory of your own",
                m.uid(),
                getuid()
            )))
        }
        Ok(m) if m.mode() & 0o077 != 0 => {
            fs::set_permissions(run_dir, fs::Permissions::from_mode(0o700))
                .map_err(|e| err(format!("chmod 0700 failed: {e}")))?;
        }
        Ok(_) => {}
    }
    let path = socket_path(run_dir);
    match fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_socket_like() => {
            fs::remove_file(&path).map_err(|e| err(format!("removing the stale socket {path:?} failed: {e}")))?;
        }
        Ok(_) => {
            return Err(err(format!(
                "{path:?} exists and is not a socket: remove it (tfinit never deletes files it did not create)"
            )))
        }
        Err(_) => {}
    }
    let listener =
        UnixListener::bind(&path).map_err(|e| err(format!("bind {path:?} failed: {e}")))?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600))
        .map_err(|e| err(format!("chmod 0600 {path:?} failed: {e}")))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| err(format!("O_NONBLOCK failed: {e}")))?;
    Ok(listener)
}

trait SocketLike {
    fn is_socket_like(&self) -> bool;
}

impl SocketLike for fs::FileType {
    fn is_socket_like(&self) -> bool {
        use std::os::unix::fs::FileTypeExt;
        self.is_socket()
    }
}

/// The init's metrics, and their HTTP server on TFINIT_METRICS_ADDR when one is set. An address
/// that cannot be bound (in use, not this host's) is one warning: the init runs without the
/// server (`tfinit metrics` still answers).
pub(super) fn metrics(cfg: &InitConfig) -> std::sync::Arc<crate::metrics::Metrics> {
    let metrics = std::sync::Arc::new(crate::metrics::Metrics::new(env!("CARGO_PKG_VERSION")));
    if let Some(addr) = cfg.metrics_addr {
        match crate::metrics_server::start(addr, std::sync::Arc::clone(&metrics)) {
            Ok(bound) => {
                tracing::info!(address = %bound, "metrics served at http://{bound}/metrics")
            }
            Err(e) => tracing::warn!(
                address = %addr, error = %e,
                "TFINIT_METRICS_ADDR={addr} cannot be served ({e}): tfinit runs without the metrics server (`tfinit metrics` still prints them); choose a free port, or unset TFINIT_METRICS_ADDR"
            ),
        }
    }
    metrics
}
