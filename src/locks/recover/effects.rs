//! What the recovery procedure does besides the store, behind one seam: the clock, the waits,
//! what the file system says of a working directory (its resolved path, its data directory, the
//! state its backend names) and the terraform runs. [`System`] is the real thing; the
//! deterministic simulation (tests/simulation) drives
//! [`Recovery::run_with`](super::Recovery::run_with) through its own, in simulated time, so the
//! procedure it checks is this one.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::backend::{read_data_dir, DataDir};
use super::invoke::run_terraform;
use crate::locks::liveness;
use crate::locks::record::{self, Record};
use crate::locks::state::{self, StateOf};

/// Every effect of a recovery other than its [`Store`](crate::locks::store::Store) calls.
pub trait Effects {
    /// This process's monotonic clock.
    fn now(&self) -> Instant;
    /// Waits `d` (the watch's step).
    fn sleep(&self, d: Duration);
    /// The instant of a CLOCK_MONOTONIC reading in nanoseconds (the init's watches, handed
    /// over to the helper process); None when it is not representable.
    fn instant_of(&self, ns: u64) -> Option<Instant>;
    /// The wall clock, ms since the epoch (stamps written into a record, never compared).
    fn now_ms(&self) -> u64;
    /// `path` with symbolic links resolved; None when it cannot be resolved.
    fn canonical(&self, path: &Path) -> Option<PathBuf>;
    /// What data directory `data_dir` holds.
    fn data_dir(&self, data_dir: &Path) -> DataDir;
    /// The state a run in `workdir` (data directory `data_dir`, workspace `workspace`) locks, as
    /// far as its working directory tells now (`state::read`).
    fn state(&self, workdir: &Path, data_dir: Option<&Path>, workspace: &str) -> StateOf;
    /// Runs terraform with `args` in the working directory and workspace of `rec`'s run, with
    /// data directory `data_dir`: whether it succeeded, and its combined output.
    fn terraform(
        &self,
        rec: &Record,
        data_dir: &Path,
        args: &[&str],
    ) -> Result<(bool, String), String>;
}

/// The real effects: this process's clocks, `std::thread::sleep`, the file system, and the
/// terraform binary `terraform`.
pub struct System<'a> {
    /// The real terraform.
    pub terraform: &'a Path,
}

impl Effects for System<'_> {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep(&self, d: Duration) {
        std::thread::sleep(d);
    }

    fn instant_of(&self, ns: u64) -> Option<Instant> {
        liveness::instant_of(ns)
    }

    fn now_ms(&self) -> u64 {
        record::now_ms()
    }

    fn canonical(&self, path: &Path) -> Option<PathBuf> {
        fs::canonicalize(path).ok()
    }

    fn data_dir(&self, data_dir: &Path) -> DataDir {
        read_data_dir(data_dir)
    }

    fn state(&self, workdir: &Path, data_dir: Option<&Path>, workspace: &str) -> StateOf {
        state::read(workdir, data_dir, workspace)
    }

    fn terraform(
        &self,
        rec: &Record,
        data_dir: &Path,
        args: &[&str],
    ) -> Result<(bool, String), String> {
        run_terraform(
            self.terraform,
            Path::new(&rec.workdir),
            data_dir,
            &rec.workspace,
            args,
        )
    }
}
