//! The init: set-up, the controller, and the event loop that supervises it and terraform runs.

pub mod event_loop;
pub mod reaper;
pub mod runs;
pub mod server;
pub mod setup;
pub mod shutdown;
pub mod spawn;

use std::ffi::OsString;

use crate::config::InitConfig;

/// Runs the init until the controller and every run are gone; returns the exit code.
/// `signals` is the signalfd opened first thing in main (before any thread).
pub fn run(cfg: InitConfig, command: Vec<OsString>, signals: nix::sys::signalfd::SignalFd) -> i32 {
    // Set-up: may fail with a clear message.
    let mode = setup::reaping_mode();
    tracing::debug!(?mode, pid = std::process::id(), "reaping mode");
    let listener = match setup::control_socket(&cfg.run_dir) {
        // Without PID 1 or a subreaper, terraform's orphans (a panicwrap worker) would escape us:
        // shims then run terraform directly, as without tfinit.
        Ok(_) if mode == setup::Mode::Neither => None,
        Ok(l) => Some(l),
        Err(e) => {
            tracing::warn!("{e}; terraform runs through the shim will run unprotected (the shim falls back to running terraform directly)");
            None
        }
    };
    let env = [("TFINIT_RUN_DIR", OsString::from(&cfg.run_dir))];
    let main_pid = match spawn::main_child(&command, &env) {
        Ok(pid) => pid,
        Err(e) => {
            tracing::error!("{e}");
            return e.exit_code();
        }
    };
    tracing::info!(pid = main_pid.as_raw(), command = ?command, "controller started");
    // After the controller's start: opening the state directory fsyncs a probe file and this
    // owner's record (milliseconds on a network volume), and nothing before the loop needs it.
    // Shims that connect meanwhile wait in the socket's backlog until the loop serves them.
    let locks = crate::locks::Locks::open(
        &cfg.state_dir,
        crate::locks::record::Owner::current(&cfg.owner, cfg.pod_uid.clone()),
        cfg.owner_ttl,
        cfg.force_unlock,
    );
    // The loop: never exits on a runtime error.
    match event_loop::Init::new(cfg, mode, signals, listener, locks, main_pid) {
        Ok(init) => init.run(),
        Err(e) => {
            // Without epoll we cannot supervise; keep reaping the plain way until the child exits.
            tracing::error!(error = %e, "cannot create the event loop; falling back to plain waiting");
            event_loop::wait_plain(main_pid)
        }
    }
}
