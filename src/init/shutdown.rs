//! The shutdown timeline: how the grace budget is spent. Pure logic, driven by the event loop.
//!
//! deadline = first stop request (or the controller's exit) + grace period.
//! - at once: the stop signal goes to the controller; new runs are refused.
//! - deadline - stop timeout: every run still going gets its one graceful SIGTERM.
//! - deadline - kill margin: SIGKILL to every run's group and everything left.
//!
//! A second stop signal jumps to the graceful step, a third to the kill step.

use std::time::{Duration, Instant, SystemTime};

/// The init's phase, as `tfinit status` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Normal operation.
    Running,
    /// New runs are refused (`tfinit drain`); the controller keeps running.
    Draining,
    /// The container is stopping: the timeline runs.
    Stopping,
}

impl Phase {
    /// The name shown in status and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Running => "running",
            Phase::Draining => "draining",
            Phase::Stopping => "stopping",
        }
    }
}

/// The steps of the timeline once stopping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    /// Waiting for runs to finish on their own.
    Wait,
    /// Runs were asked to stop gracefully.
    Graceful,
    /// Everything left was SIGKILLed.
    Kill,
}

/// Why the timeline started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// A stop signal reached the init.
    Signal,
    /// The controller exited on its own.
    MainExited,
}

/// The timeline state.
#[derive(Debug)]
pub struct Timeline {
    grace: Duration,
    stop_timeout: Duration,
    kill_margin: Duration,
    phase: Phase,
    step: Step,
    deadline: Option<(Instant, SystemTime)>,
    stop_requests: u32,
}

/// What the event loop must do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Stopping began.
    Began(Cause),
    /// Send every run its graceful SIGTERM.
    Graceful,
    /// SIGKILL everything left.
    Kill,
}

impl Timeline {
    /// A timeline for the given budget (validated by config: stop + margin < grace).
    pub fn new(grace: Duration, stop_timeout: Duration, kill_margin: Duration) -> Self {
        Timeline {
            grace,
            stop_timeout,
            kill_margin,
            phase: Phase::Running,
            step: Step::Wait,
            deadline: None,
            stop_requests: 0,
        }
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The step reached while stopping.
    pub fn step(&self) -> Step {
        self.step
    }

    /// Whether new runs may start.
    pub fn accepts_runs(&self) -> bool {
        self.phase == Phase::Running
    }

    /// The deadline, once stopping.
    pub fn deadline(&self) -> Option<(Instant, SystemTime)> {
        self.deadline
    }

    /// Enters draining (from running). Returns whether the phase changed.
    pub fn drain(&mut self) -> bool {
        if self.phase == Phase::Running {
            self.phase = Phase::Draining;
            return true;
        }
        false
    }

    /// Leaves draining. Returns whether the phase changed.
    pub fn resume(&mut self) -> bool {
        if self.phase == Phase::Draining {
            self.phase = Phase::Running;
            return true;
        }
        false
    }

    fn begin(&mut self, now: Instant, cause: Cause) -> Transition {
        self.phase = Phase::Stopping;
        self.deadline = Some((now + self.grace, SystemTime::now() + self.grace));
        Transition::Began(cause)
    }

    /// A stop signal (SIGTERM/SIGINT) reached the init: the first begins the timeline, the second
    /// jumps to the graceful step, the third to the kill step.
    pub fn on_stop_signal(&mut self, now: Instant) -> Option<Transition> {
        self.stop_requests += 1;
        match self.stop_requests {
            1 if self.phase != Phase::Stopping => Some(self.begin(now, Cause::Signal)),
            // The controller exited first and the timeline runs: this signal counts as the first.
            1 => None,
            2 => self.advance_to(Step::Graceful),
            _ => self.advance_to(Step::Kill),
        }
    }

    /// The controller exited: the timeline starts now unless it already runs.
    pub fn on_main_exit(&mut self, now: Instant) -> Option<Transition> {
        (self.phase != Phase::Stopping).then(|| self.begin(now, Cause::MainExited))
    }

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

    /// The step due at `now`, if its time has come (the kill step may skip the graceful one when
    /// both are due, but the graceful step is never skipped while its time is ahead of the kill).
    pub fn due(&mut self, now: Instant) -> Option<Transition> {
        let (deadline, _) = self.deadline?;
        if self.step < Step::Graceful && now >= deadline.checked_sub(self.stop_timeout)? {
            return self.advance_to(Step::Graceful);
        }
        if self.step < Step::Kill && now >= deadline.checked_sub(self.kill_margin)? {
            return self.advance_to(Step::Kill);
        }
        None
    }

    /// When `due` next has something to do.
    pub fn next_wakeup(&self) -> Option<Instant> {
        let (deadline, _) = self.deadline?;
        match self.step {
            Step::Wait => deadline.checked_sub(self.stop_timeout),
            Step::Graceful => deadline.checked_sub(self.kill_margin),
            Step::Kill => None,
        }
    }

    /// Seconds until the deadline (negative once past).
    pub fn seconds_left(&self, now: Instant) -> Option<f64> {
        let (deadline, _) = self.deadline?;
        Some(if deadline >= now {
            (deadline - now).as_secs_f64()
        } else {
            -(now - deadline).as_secs_f64()
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
        assert!(!tl.accepts_runs());
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
        assert!(!tl.accepts_runs());
        assert!(tl.resume());
        assert!(tl.accepts_runs());
        tl.on_stop_signal(Instant::now());
        assert!(!tl.resume(), "stopping cannot be resumed");
        assert_eq!(tl.phase(), Phase::Stopping);
    }
}
