//! The init: set-up, the controller, and the event loop that supervises it and terraform runs.
//!
//! Where the code is: event_loop.rs waits and dispatches; supervisor.rs holds the concerns and
//! carries out the actions they return (action.rs), one at a time from a queue; beside it
//! supervisor/relay.rs (terraform's output), supervisor/control.rs (the clients' requests) and
//! supervisor/signalling.rs (the signals actions send). The concerns, each owning its state:
//! runs/ (terraform runs), conns.rs and session.rs (the control socket's clients, held to
//! bounds.rs), records.rs (lock-owner records: the only writer of the book), reports.rs (what
//! recovery helpers report), shutdown.rs (the timeline), reaping.rs (whose each child is). Around
//! them: setup.rs (before the loop), spawn.rs (starting processes), reaper.rs (waitpid),
//! forward.rs (where signals go), status.rs (the status document), token.rs (epoll tokens),
//! plain.rs (the fallback). handoff.rs carries out the actions between the runs and the records,
//! for the supervisor and for sim_seam.rs (tests only: the simulation drives the real runs and
//! records through it).

mod action;
mod bounds;
mod conns;
mod event_loop;
mod forward;
mod handoff;
mod plain;
mod reaper;
mod reaping;
mod records;
mod reports;
mod runs;
mod session;
mod setup;
pub(crate) mod shutdown;
#[cfg(feature = "mutation")]
#[doc(hidden)]
pub mod sim_seam;
mod spawn;
mod status;
mod supervisor;
mod token;

pub use bounds::memory_bound;
pub use setup::signals;

use std::ffi::OsString;

use crate::config::InitConfig;

/// Runs the init until the controller and every run are gone; returns the exit code.
/// `signals` is the signalfd opened first thing in main (before any thread).
pub fn run(cfg: InitConfig, command: Vec<OsString>, signals: nix::sys::signalfd::SignalFd) -> i32 {
    // Set-up: may fail with a clear message. Settings ignored rather than refused are said first.
    for w in &cfg.warnings {
        tracing::warn!("{w}");
    }
    setup::memory();
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
    // Lock-owner records: the recorder thread opens the state directory beside the loop (a
    // network volume may take seconds, or hang), so the loop runs at once; state-locking runs
    // wait in `recording` for the store, at most TFINIT_RECORD_TIMEOUT.
    let records = records::Records::start(&cfg);
    // Metrics: recorded by the loop into atomics, served by a thread of their own (never by the
    // loop, so a slow scraper costs it nothing).
    let metrics = setup::metrics(&cfg);
    // The loop: never exits on a runtime error.
    let (forward, rewrite) = (cfg.forward, cfg.rewrite.clone());
    match supervisor::Init::new(cfg, mode, signals, listener, records, main_pid, metrics) {
        Ok(init) => init.run(),
        Err(e) => {
            // Without epoll we cannot supervise runs; keep forwarding and reaping the plain way
            // until the child exits.
            tracing::error!(error = %e, "cannot create the event loop; falling back to plain waiting");
            plain::wait_plain(main_pid, forward, &rewrite)
        }
    }
}
