//! How an answer of the runs or the records reaches the other: the actions that pass between
//! the two concerns (a record asked for, the recorder's news, a place that may be free, runs that
//! look at the store again, terraform or a recovery helper reaped, the timers), carried out here
//! for the supervisor (supervisor.rs `apply_one`) and for the simulation's seam (sim_seam.rs),
//! in the one order of the queue ([`run_queue`]): the simulation drives this very code.

use std::collections::VecDeque;
use std::path::Path;
use std::time::Instant;

use super::action::Action;
use super::records::Records;
use super::runs::Runs;
use super::shutdown::Phase;

/// Carries out the actions `actions` in order with `one`: what comes of an action (the `more` it
/// pushes) is carried out before the actions asked after it: a queue, never a call of itself.
pub(super) fn run_queue(actions: Vec<Action>, mut one: impl FnMut(Action, &mut Vec<Action>)) {
    // Most wake-ups (every forwarded signal) have nothing to apply.
    if actions.is_empty() {
        return;
    }
    let mut queue = VecDeque::from(actions);
    let mut more = Vec::new();
    while let Some(action) = queue.pop_front() {
        one(action, &mut more);
        for a in more.drain(..).rev() {
            queue.push_front(a);
        }
    }
}

/// Carries out `action` at `now` (in `phase`) when it passes between the runs and the records,
/// what comes of it going to `more`; any other action is given back, for the loop.
pub(super) fn carry(
    runs: &mut Runs,
    records: &mut Records,
    state_dir: &Path,
    (now, phase): (Instant, Phase),
    action: Action,
    more: &mut Vec<Action>,
) -> Option<Action> {
    let stopping = phase == Phase::Stopping;
    match action {
        // What it means for the runs (a run that goes without a record, a recorder found gone).
        Action::Record(r) => {
            let events = records.apply(runs.records_mut(), r, now);
            if !events.is_empty() {
                more.extend(runs.on_record_events(events, records.book()));
            }
        }
        Action::TakeNews => {
            let news = records.take_news(runs.records_mut(), now);
            more.extend(runs.on_record_events(news, records.book()));
        }
        Action::RecordTimers => {
            // The recorder's quiet news first (heartbeats that went well): a stale heartbeat is
            // judged on the latest.
            let mut events = records.take_news(runs.records_mut(), now);
            events.extend(records.record_timers(runs.records_mut(), now));
            more.extend(runs.on_record_events(events, records.book()));
        }
        Action::RunTimers => more.extend(runs.run_timers(state_dir, now)),
        Action::Admit => more.extend(runs.admit(records.book(), now)),
        Action::Recheck => more.extend(runs.recheck(records.book(), now)),
        Action::RefuseWaiting(why) => more.extend(runs.refuse_waiting(why)),
        Action::Detach(run) => more.extend(runs.detach(run, now, stopping)),
        Action::TerraformExited(run, exit) => {
            more.extend(runs.terraform_exited(run, exit, stopping, records.book(), now))
        }
        // The run goes on, or is refused while the init refuses runs.
        Action::RecoveryExited(run, exit) => {
            more.extend(runs.recovery_exited(run, exit, phase.refusal()))
        }
        other => return Some(other),
    }
    None
}
