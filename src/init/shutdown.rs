//! The shutdown timeline: how the grace budget is spent. Pure logic, driven by the event loop.
//!
//! deadline = first stop request (or the controller's exit) + grace period.
//! - at once: the stop signal goes to the controller; new runs are refused.
//! - deadline - stop timeout: every run still going gets its one graceful SIGTERM.
//! - deadline - kill margin: SIGKILL to every run's group and everything left.
//!
//! A second stop signal jumps to the graceful step, a third to the kill step.

use std::time::{Duration, Instant, SystemTime};

use super::action::Refusal;

pub(crate) use crate::phase::Phase;

impl Phase {
    /// Why new runs are refused in this phase; None while they are accepted.
    pub(super) fn refusal(self) -> Option<Refusal> {
        match self {
            Phase::Running => None,
            Phase::Draining => Some(Refusal::Draining),
            Phase::Stopping => Some(Refusal::ShuttingDown),
        }
    }
}

/// The steps of the timeline once stopping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Step {
    /// Waiting for runs to finish on their own.
    Wait,
    /// Runs were asked to stop gracefully.
    Graceful,
    /// Everything left was SIGKILLed.
    Kill,
}

impl Step {
    /// The name in logs.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Step::Wait => "wait",
            Step::Graceful => "graceful",
            Step::Kill => "kill",
        }
    }
}

/// Why the timeline started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cause {
    /// A stop signal reached the init.
    Signal,
    /// The controller exited on its own.
    MainExited,
}

impl Cause {
    /// The name in logs.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Cause::Signal => "stop signal",
            Cause::MainExited => "controller exited",
        }
    }
}

/// What exists only once stopping: the deadline, the step reached, the stop signals counted.
#[derive(Debug, Clone, Copy)]
struct Stopping {
    /// first stop request (or the controller's exit) + the grace period.
    deadline: Instant,
    /// The same deadline on the wall clock, for `tfinit status`.
    wall: SystemTime,
    step: Step,
    /// Stop signals received since (none when the controller's exit began it).
    signals: u32,
}

/// Where the init is.
#[derive(Debug, Clone, Copy)]
enum State {
    Running,
    Draining,
    Stopping(Stopping),
}

/// The timeline state.
#[derive(Debug)]
pub(super) struct Timeline {
    grace: Duration,
    stop_timeout: Duration,
    kill_margin: Duration,
    state: State,
}

/// What the event loop must do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Transition {
    /// Stopping began.
    Began(Cause),
    /// Send every run its graceful SIGTERM.
    Graceful,
    /// SIGKILL everything left.
    Kill,
}

impl Timeline {
    /// A timeline for the given budget (validated by config: stop + margin < grace).
    pub(super) fn new(grace: Duration, stop_timeout: Duration, kill_margin: Duration) -> Self {
        Timeline {
            grace,
            stop_timeout,
            kill_margin,
            state: State::Running,
        }
    }

    /// The current phase.
    pub(super) fn phase(&self) -> Phase {
        match self.state {
            State::Running => Phase::Running,
            State::Draining => Phase::Draining,
            State::Stopping(_) => Phase::Stopping,
        }
    }

    /// Why new runs are refused now; None while they are accepted.
    pub(super) fn refusal(&self) -> Option<Refusal> {
        self.phase().refusal()
    }

    /// The deadline (and the same on the wall clock), once stopping.
    pub(super) fn deadline(&self) -> Option<(Instant, SystemTime)> {
        match self.state {
            State::Stopping(s) => Some((s.deadline, s.wall)),
            State::Running | State::Draining => None,
        }
    }

    /// Enters draining (from running). Returns whether the phase changed.
    pub(super) fn drain(&mut self) -> bool {
        let running = matches!(self.state, State::Running);
        if running {
            self.state = State::Draining;
        }
        running
    }

    /// Leaves draining. Returns whether the phase changed.
    pub(super) fn resume(&mut self) -> bool {
        let draining = matches!(self.state, State::Draining);
        if draining {
            self.state = State::Running;
        }
        draining
    }

    fn begin(&mut self, now: Instant, cause: Cause) -> Transition {
        self.state = State::Stopping(Stopping {
            deadline: now + self.grace,
            wall: SystemTime::now() + self.grace,
            step: Step::Wait,
            signals: u32::from(cause == Cause::Signal),
        });
        Transition::Began(cause)
    }

    /// A stop signal (SIGTERM/SIGINT) reached the init: the first begins the timeline, the second
    /// jumps to the graceful step, the third to the kill step. When the controller's exit began
    /// the timeline, the first signal only counts.
    pub(super) fn on_stop_signal(&mut self, now: Instant) -> Option<Transition> {
        let State::Stopping(s) = &mut self.state else {
            return Some(self.begin(now, Cause::Signal));
        };
        s.signals += 1;
        match s.signals {
            1 => None,
            2 => s.advance_to(Step::Graceful),
            _ => s.advance_to(Step::Kill),
        }
    }

    /// The controller exited: the timeline starts now unless it already runs.
    pub(super) fn on_main_exit(&mut self, now: Instant) -> Option<Transition> {
        (self.phase() != Phase::Stopping).then(|| self.begin(now, Cause::MainExited))
    }

    /// The step due at `now`, if its time has come (the kill step may skip the graceful one when
    /// both are due, but the graceful step is never skipped while its time is ahead of the kill).
    pub(super) fn due(&mut self, now: Instant) -> Option<Transition> {
        let (stop_timeout, kill_margin) = (self.stop_timeout, self.kill_margin);
        let State::Stopping(s) = &mut self.state else {
            return None;
        };
        if s.step < Step::Graceful && now >= s.deadline.checked_sub(stop_timeout)? {
            return s.advance_to(Step::Graceful);
        }
        if s.step < Step::Kill && now >= s.deadline.checked_sub(kill_margin)? {
            return s.advance_to(Step::Kill);
        }
        None
    }

    /// When `due` next has something to do.
    pub(super) fn next_wakeup(&self) -> Option<Instant> {
        let State::Stopping(s) = &self.state else {
            return None;
        };
        match s.step {
            Step::Wait => s.deadline.checked_sub(self.stop_timeout),
            Step::Graceful => s.deadline.checked_sub(self.kill_margin),
            Step::Kill => None,
        }
    }

    /// Seconds until the deadline (negative once past).
    pub(super) fn seconds_left(&self, now: Instant) -> Option<f64> {
        let (deadline, _) = self.deadline()?;
        Some(if deadline >= now {
            (deadline - now).as_secs_f64()
        } else {
            -(now - deadline).as_secs_f64()
        })
    }

    /// The phase and the seconds left to the deadline (once stopping), for logs.
    pub(super) fn when(&self, now: Instant) -> (&'static str, Option<f64>) {
        (self.phase().as_str(), self.seconds_left(now))
    }
}

impl Stopping {
    fn advance_to(&mut self, step: Step) -> Option<Transition> {
        if self.step >= step {
            return None;
        }
        self.step = step;
        Some(match step {
            Step::Graceful => Transition::Graceful,
            _ => Transition::Kill,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t() -> Timeline {
        Timeline::new(
            Duration::from_secs(30),
            Duration::from_secs(10),
            Duration::from_secs(2),
        )
    }

    #[test]
    fn steps_come_at_their_times() {
        let mut tl = t();
        let t0 = Instant::now();
        assert_eq!(
            tl.on_stop_signal(t0),
            Some(Transition::Began(Cause::Signal))
        );
        assert_eq!(tl.refusal(), Some(Refusal::ShuttingDown));
        assert_eq!(tl.due(t0 + Duration::from_secs(19)), None);
        assert_eq!(tl.next_wakeup(), Some(t0 + Duration::from_secs(20)));
        assert_eq!(
            tl.due(t0 + Duration::from_secs(20)),
            Some(Transition::Graceful)
        );
        assert_eq!(tl.due(t0 + Duration::from_secs(20)), None);
        assert_eq!(tl.due(t0 + Duration::from_secs(27)), None);
        assert_eq!(tl.due(t0 + Duration::from_secs(28)), Some(Transition::Kill));
        assert_eq!(tl.due(t0 + Duration::from_secs(29)), None);
        assert_eq!(tl.next_wakeup(), None);
    }

    #[test]
    fn second_and_third_signals_escalate_once_each() {
        let mut tl = t();
        let t0 = Instant::now();
        tl.on_stop_signal(t0);
        assert_eq!(tl.on_stop_signal(t0), Some(Transition::Graceful));
        assert_eq!(
            tl.due(t0 + Duration::from_secs(20)),
            None,
            "graceful never sent twice"
        );
        assert_eq!(tl.on_stop_signal(t0), Some(Transition::Kill));
        assert_eq!(tl.on_stop_signal(t0), None);
    }

    #[test]
    fn main_exit_starts_the_timeline_once() {
        let mut tl = t();
        let t0 = Instant::now();
        assert_eq!(
            tl.on_main_exit(t0),
            Some(Transition::Began(Cause::MainExited))
        );
        assert_eq!(tl.on_main_exit(t0), None);
        assert_eq!(
            tl.on_stop_signal(t0),
            None,
            "first signal after a crash does not escalate"
        );
        assert_eq!(tl.on_stop_signal(t0), Some(Transition::Graceful));
    }

    #[test]
    fn drain_and_resume() {
        let mut tl = t();
        assert!(tl.drain());
        assert_eq!(tl.refusal(), Some(Refusal::Draining));
        assert!(!tl.drain(), "draining once");
        assert!(tl.resume());
        assert_eq!(tl.refusal(), None);
        assert!(!tl.resume(), "nothing to resume while running");
        tl.on_stop_signal(Instant::now());
        assert!(!tl.resume(), "stopping cannot be resumed");
        assert_eq!(tl.phase(), Phase::Stopping);
        assert!(!tl.drain(), "stopping cannot be drained");
    }

    #[test]
    fn the_deadline_exists_only_once_stopping() {
        let mut tl = t();
        let t0 = Instant::now();
        assert_eq!(tl.deadline(), None);
        assert_eq!(tl.next_wakeup(), None);
        assert_eq!(tl.seconds_left(t0), None);
        tl.on_stop_signal(t0);
        assert_eq!(
            tl.deadline().map(|(d, _)| d),
            Some(t0 + Duration::from_secs(30))
        );
        assert_eq!(tl.seconds_left(t0 + Duration::from_secs(31)), Some(-1.0));
    }
}
