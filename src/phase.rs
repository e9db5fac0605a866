//! The init's phase (running, draining, stopping): a type of its own, outside the init, so that
//! what reads it (the metrics) does not depend on the shutdown timeline that drives it.

/// The init's phase, as `tfinit status` and the logs name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Phase {
    /// Normal operation.
    Running,
    /// New runs are refused (`tfinit drain`); the controller keeps running.
    Draining,
    /// The container is stopping: the timeline runs.
    Stopping,
}

impl Phase {
    /// Every phase, in the order the metrics create them.
    pub(crate) const ALL: [Phase; 3] = [Phase::Running, Phase::Draining, Phase::Stopping];

    /// The name shown in status, logs and `tfinit_shutdown_phase{phase}`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Phase::Running => "running",
            Phase::Draining => "draining",
            Phase::Stopping => "stopping",
        }
    }
}
