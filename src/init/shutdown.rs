//! The shutdown timeline: how the grace budget is spent. Pure logic, driven by the event loop:
//! each input (a stop signal, the controller's exit, the time) is answered with the [`Action`]s
//! of the step it reaches, which the loop carries out.
//!
//! deadline = first stop request (or the controller's exit) + grace period.
//! - at once: the stop signal goes to the controller (the loop forwards it before asking here);
//!   runs that wait to start are refused, and so are new ones.
//! - deadline - stop timeout: every run still going gets its one graceful SIGTERM.
//! - deadline - kill margin: SIGKILL to every run's group (or helper), to the controller's group
//!   while it has members, and, as PID 1, to every process left in the container.
//!
//! A second stop signal jumps to the graceful step, a third to the kill step.

use std::time::{Duration, Instant, SystemTime};

use nix::unistd::Pid;

use super::action::{Action, Force, Refusal};
use crate::sys::Target;

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
    /// The step that stops runs with `force`.
    pub(super) fn of(force: Force) -> Step {
        match force {
            Force::Graceful => Step::Graceful,
            Force::Kill => Step::Kill,
        }
    }

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
enum Cause {
    /// A stop signal reached the init.
    Signal,
    /// The controller exited on its own.
    MainExited,
}

impl Cause {
    /// The name in logs.
    fn as_str(self) -> &'static str {
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
    /// The controller's process group, SIGKILLed at the kill step.
    main: Pid,
    /// Whether the kill step also SIGKILLs every process left (as PID 1: the container's).
    everyone: bool,
    state: State,
}

/// A step the timeline reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transition {
    /// Stopping began.
    Began(Cause),
    /// Send every run its graceful SIGTERM.
    Graceful,
    /// SIGKILL everything left.
    Kill,
}

impl Timeline {
    /// A timeline for the given budget (validated by config: stop + margin < grace), for the
    /// controller `main`; `everyone`: the kill step ends with every process left (PID 1).
    pub(super) fn new(
        (grace, stop_timeout, kill_margin): (Duration, Duration, Duration),
        main: Pid,
        everyone: bool,
    ) -> Self {
        Timeline {
            grace,
            stop_timeout,
            kill_margin,
            main,
            everyone,
            state: State::Running,
        }
    }

    /// A stop signal (SIGTERM/SIGINT) reached the init (it was forwarded already): the first
    /// begins the shutdown, the second jumps to the graceful step, the third to the kill step.
    /// When the controller's exit began the shutdown, the first signal only counts.
    pub(super) fn on_stop_signal(&mut self, now: Instant) -> Vec<Action> {
        let t = self.stop_signal(now);
        self.actions(t)
    }

    /// The controller exited: the shutdown begins now unless it runs already.
    pub(super) fn on_main_exit(&mut self, now: Instant) -> Vec<Action> {
        let t = self.main_exit(now);
        self.actions(t)
    }

    /// The steps due at `now` (the kill step may skip the graceful one when both are due, but the
    /// graceful step is never skipped while its time is ahead of the kill).
    pub(super) fn due(&mut self, now: Instant) -> Vec<Action> {
        let mut acts = Vec::new();
        while let Some(t) = self.step_due(now) {
            acts.extend(self.actions(Some(t)));
        }
        acts
    }

    /// The shutdown policy: what each step does.
    fn actions(&self, t: Option<Transition>) -> Vec<Action> {
        match t {
            None => Vec::new(),
            Some(Transition::Began(cause)) => vec![
                Action::RefuseWaiting(Refusal::ShuttingDown),
                Action::ShutdownBegan {
                    cause: cause.as_str(),
                    quiet_when_done: cause == Cause::MainExited,
                },
            ],
            Some(Transition::Graceful) => vec![Action::StopRuns(Force::Graceful)],
            Some(Transition::Kill) => {
                let mut acts = vec![
                    Action::StopRuns(Force::Kill),
                    Action::Signal {
                        target: Target::Group(self.main),
                        signo: libc::SIGKILL,
                        what: "controller's process group",
                    },
                ];
                if self.everyone {
                    acts.push(Action::Signal {
                        target: Target::Everyone,
                        signo: libc::SIGKILL,
                        what: "every process left in the container",
                    });
                }
                acts
            }
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

    fn start_stopping(&mut self, now: Instant, cause: Cause) -> Transition {
        self.state = State::Stopping(Stopping {
            deadline: now + self.grace,
            wall: SystemTime::now() + self.grace,
            step: Step::Wait,
            signals: u32::from(cause == Cause::Signal),
        });
        Transition::Began(cause)
    }

    /// See [`Self::on_stop_signal`].
    fn stop_signal(&mut self, now: Instant) -> Option<Transition> {
        let State::Stopping(s) = &mut self.state else {
            return Some(self.start_stopping(now, Cause::Signal));
        };
        s.signals += 1;
        match s.signals {
            1 => None,
            2 => s.advance_to(Step::Graceful),
            _ => s.advance_to(Step::Kill),
        }
    }

    /// See [`Self::on_main_exit`].
    fn main_exit(&mut self, now: Instant) -> Option<Transition> {
        (self.phase() != Phase::Stopping).then(|| self.start_stopping(now, Cause::MainExited))
    }

    /// The step due at `now`, if its time has come.
    fn step_due(&mut self, now: Instant) -> Option<Transition> {
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

    const MAIN: i32 = 10;

    fn budget() -> (Duration, Duration, Duration) {
        (
            Duration::from_secs(30),
            Duration::from_secs(10),
            Duration::from_secs(2),
        )
    }

    fn t() -> Timeline {
        Timeline::new(budget(), Pid::from_raw(MAIN), true)
    }

    #[test]
    fn steps_come_at_their_times() {
        let mut tl = t();
        let t0 = Instant::now();
        assert_eq!(tl.stop_signal(t0), Some(Transition::Began(Cause::Signal)));
        assert_eq!(tl.refusal(), Some(Refusal::ShuttingDown));
        assert_eq!(tl.step_due(t0 + Duration::from_secs(19)), None);
        assert_eq!(tl.next_wakeup(), Some(t0 + Duration::from_secs(20)));
        assert_eq!(
            tl.step_due(t0 + Duration::from_secs(20)),
            Some(Transition::Graceful)
        );
        assert_eq!(tl.step_due(t0 + Duration::from_secs(20)), None);
        assert_eq!(tl.step_due(t0 + Duration::from_secs(27)), None);
        assert_eq!(
            tl.step_due(t0 + Duration::from_secs(28)),
            Some(Transition::Kill)
        );
        assert_eq!(tl.step_due(t0 + Duration::from_secs(29)), None);
        assert_eq!(tl.next_wakeup(), None);
    }

    #[test]
    fn second_and_third_signals_escalate_once_each() {
        let mut tl = t();
        let t0 = Instant::now();
        tl.stop_signal(t0);
        assert_eq!(tl.stop_signal(t0), Some(Transition::Graceful));
        assert_eq!(
            tl.step_due(t0 + Duration::from_secs(20)),
            None,
            "graceful never sent twice"
        );
        assert_eq!(tl.stop_signal(t0), Some(Transition::Kill));
        assert_eq!(tl.stop_signal(t0), None);
    }

    #[test]
    fn main_exit_starts_the_timeline_once() {
        let mut tl = t();
        let t0 = Instant::now();
        assert_eq!(tl.main_exit(t0), Some(Transition::Began(Cause::MainExited)));
        assert_eq!(tl.main_exit(t0), None);
        assert_eq!(
            tl.stop_signal(t0),
            None,
            "first signal after a crash does not escalate"
        );
        assert_eq!(tl.stop_signal(t0), Some(Transition::Graceful));
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
        tl.stop_signal(Instant::now());
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
        tl.stop_signal(t0);
        assert_eq!(
            tl.deadline().map(|(d, _)| d),
            Some(t0 + Duration::from_secs(30))
        );
        assert_eq!(tl.seconds_left(t0 + Duration::from_secs(31)), Some(-1.0));
    }

    /// A short name of each action, for comparing sequences.
    fn names(acts: &[Action]) -> Vec<String> {
        acts.iter()
            .map(|a| match a {
                Action::RefuseWaiting(why) => format!("refuse waiting runs: {why:?}"),
                Action::ShutdownBegan { cause, .. } => format!("log: shutdown began ({cause})"),
                Action::StopRuns(Force::Graceful) => "SIGTERM to every run".into(),
                Action::StopRuns(Force::Kill) => "SIGKILL to every run".into(),
                Action::Signal { target, signo, .. } => {
                    format!("{} to {target}", crate::signals::name(*signo))
                }
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn the_policy_refuses_waiting_runs_then_sigterms_every_run_then_sigkills_everything_left() {
        let mut tl = t();
        let t0 = Instant::now();
        assert_eq!(
            names(&tl.on_stop_signal(t0)),
            [
                "refuse waiting runs: ShuttingDown",
                "log: shutdown began (stop signal)"
            ]
        );
        assert!(tl.due(t0 + Duration::from_secs(19)).is_empty());
        assert_eq!(
            names(&tl.due(t0 + Duration::from_secs(20))),
            ["SIGTERM to every run"]
        );
        assert!(tl.due(t0 + Duration::from_secs(27)).is_empty());
        assert_eq!(
            names(&tl.due(t0 + Duration::from_secs(28))),
            [
                "SIGKILL to every run",
                "SIGKILL to process group 10",
                "SIGKILL to every process"
            ]
        );
        assert!(tl.due(t0 + Duration::from_secs(60)).is_empty(), "once");
    }

    #[test]
    fn a_late_wake_up_takes_both_steps_in_order() {
        let mut tl = t();
        let t0 = Instant::now();
        tl.on_stop_signal(t0);
        assert_eq!(
            names(&tl.due(t0 + Duration::from_secs(29))),
            [
                "SIGTERM to every run",
                "SIGKILL to every run",
                "SIGKILL to process group 10",
                "SIGKILL to every process"
            ],
            "the graceful step is never skipped"
        );
    }

    #[test]
    fn without_pid_1_the_kill_step_leaves_other_processes_alone() {
        let mut tl = Timeline::new(budget(), Pid::from_raw(MAIN), false);
        let t0 = Instant::now();
        tl.on_main_exit(t0);
        assert_eq!(
            names(&tl.due(t0 + Duration::from_secs(28))),
            [
                "SIGTERM to every run",
                "SIGKILL to every run",
                "SIGKILL to process group 10"
            ]
        );
    }

    #[test]
    fn stop_signals_escalate_the_policy_one_step_each() {
        let mut tl = t();
        let t0 = Instant::now();
        assert_eq!(
            names(&tl.on_main_exit(t0)),
            [
                "refuse waiting runs: ShuttingDown",
                "log: shutdown began (controller exited)"
            ]
        );
        assert!(
            tl.on_stop_signal(t0).is_empty(),
            "the first one only counts"
        );
        assert_eq!(names(&tl.on_stop_signal(t0)), ["SIGTERM to every run"]);
        assert_eq!(names(&tl.on_stop_signal(t0)).len(), 3, "the kill step");
        assert!(tl.on_stop_signal(t0).is_empty());
        assert!(tl.on_main_exit(t0).is_empty());
    }
}
