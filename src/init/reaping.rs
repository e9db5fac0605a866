//! Reaping: every exit is collected (reaper.rs calls waitpid) and handed to whom it concerns:
//! the controller, a terraform run, a recovery helper, or nobody (an adopted orphan).

use std::time::Instant;

use super::reaper;
use super::state::{Init, PidOwner};

impl Init {
    /// Reaps every child that exited and hands each exit on.
    pub(super) fn reap(&mut self) {
        let (exits, _) = reaper::reap_all();
        for (pid, exit) in exits {
            if pid == self.main.pid {
                self.main.exit = Some(exit);
                tracing::info!(pid = pid.as_raw(), %exit, "controller exited");
                match self.timeline.on_main_exit(Instant::now()) {
                    Some(t) => self.transition(t),
                    // Already stopping on a signal that may not have reached the group
                    // (TFINIT_FORWARD=child): its leftovers still get their SIGTERM now.
                    None => self.stop_leftovers(),
                }
                continue;
            }
            match self.pids.remove(&pid) {
                Some(PidOwner::Terraform(id)) => self.on_terraform_exit(id, exit),
                Some(PidOwner::Recovery(id)) => self.on_recovery_exit(id, exit),
                None => tracing::debug!(pid = pid.as_raw(), %exit, "reaped"),
            }
        }
    }
}
