//! The status document (`tfinit status`, and the reply to `drain` and `resume`): the init's
//! phase and deadline, the controller, the lock-owner records' store, and every run.

use std::time::{Instant, SystemTime};

use super::reaping::Children;
use super::runs::Runs;
use super::shutdown::Timeline;
use crate::locks::book::View;
use crate::protocol::{self, Deadline, RecordsStatus, Status};

/// The status document at `now`.
pub(super) fn document(
    timeline: &Timeline,
    children: &Children,
    records: &View,
    runs: &Runs,
    now: Instant,
) -> Status {
    Status {
        v: protocol::VERSION,
        pid: std::process::id() as i32,
        phase: timeline.phase().as_str().to_string(),
        deadline: deadline(timeline, now),
        main_pid: children
            .main_exit()
            .is_none()
            .then_some(children.main().as_raw()),
        records: Some(RecordsStatus {
            state: records.state.label().to_string(),
            heartbeat_age_seconds: records.heartbeat_age.map(|d| d.as_secs_f64()),
        }),
        runs: runs.statuses(),
    }
}

/// The deadline and the seconds left to it, once stopping.
fn deadline(timeline: &Timeline, now: Instant) -> Option<Deadline> {
    let (_, wall) = timeline.deadline()?;
    Some(Deadline {
        deadline_unix: wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .ok()?
            .as_secs_f64(),
        seconds_left: timeline.seconds_left(now)?,
    })
}
