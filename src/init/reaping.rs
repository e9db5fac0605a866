//! Whose each child is. Every exit reaper.rs collects is answered with the actions of whom it
//! concerns: the controller (the shutdown, and a SIGTERM to what it left in its group), a
//! terraform run, a recovery helper, or nobody (an adopted orphan). Pure: the loop feeds it the
//! reaped pids.

use std::collections::HashMap;

use nix::unistd::Pid;

use super::action::{Action, Child};
use super::reaper::Exit;
use crate::sys::Target;

/// The controller, where it is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Controller {
    /// It runs. `group_stopped`: its process group got a stop signal already (the init never
    /// sends it a second SIGTERM by itself).
    Running { group_stopped: bool },
    /// It exited.
    Exited(Exit),
}

/// The controller and the init's other children.
#[derive(Debug)]
pub(super) struct Children {
    /// The controller's pid, also its process group's id.
    main: Pid,
    controller: Controller,
    others: HashMap<Pid, Child>,
}

impl Children {
    /// The children of an init whose controller is `main`.
    pub(super) fn new(main: Pid) -> Children {
        Children {
            main,
            controller: Controller::Running {
                group_stopped: false,
            },
            others: HashMap::new(),
        }
    }

    /// The controller's pid, also its process group's id.
    pub(super) fn main(&self) -> Pid {
        self.main
    }

    /// How the controller ended, once reaped.
    pub(super) fn main_exit(&self) -> Option<Exit> {
        match self.controller {
            Controller::Exited(exit) => Some(exit),
            Controller::Running { .. } => None,
        }
    }

    /// A stop signal went to the controller's whole process group.
    pub(super) fn group_stopped(&mut self) {
        if let Controller::Running { group_stopped } = &mut self.controller {
            *group_stopped = true;
        }
    }

    /// `pid` is `child`'s, from now on.
    pub(super) fn adopt(&mut self, pid: Pid, child: Child) {
        self.others.insert(pid, child);
    }

    /// `pid` was reaped with `exit`: what follows for whom it was. The controller's exit begins
    /// the shutdown (unless it runs), and what the controller left in its group gets one SIGTERM
    /// unless the group got a stop signal while it ran (also when the shutdown was already
    /// running on a signal that may not have reached the group: TFINIT_FORWARD=child).
    pub(super) fn reaped(&mut self, pid: Pid, exit: Exit) -> Vec<Action> {
        if pid == self.main {
            let stop_leftovers = matches!(
                self.controller,
                Controller::Running {
                    group_stopped: false
                }
            );
            self.controller = Controller::Exited(exit);
            let mut acts = vec![Action::ControllerExited { pid, exit }];
            if stop_leftovers {
                acts.push(Action::Signal {
                    target: Target::Group(pid),
                    signo: libc::SIGTERM,
                    what: "controller's leftover processes",
                });
            }
            return acts;
        }
        match self.others.remove(&pid) {
            Some(Child::Terraform(run)) => vec![Action::TerraformExited(run, exit)],
            // The latest table first: the run's lock check may come next.
            Some(Child::Recovery(run)) => vec![Action::TakeNews, Action::RecoveryExited(run, exit)],
            None => {
                tracing::debug!(pid = pid.as_raw(), %exit, "reaped");
                Vec::new()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::locks::names::RunId;

    /// A short name of each action.
    fn names(acts: &[Action]) -> Vec<String> {
        acts.iter()
            .map(|a| match a {
                Action::Signal { target, signo, .. } => {
                    format!("{} to {target}", crate::signals::name(*signo))
                }
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn each_reaped_pid_goes_to_whom_it_concerns_once() {
        let mut c = Children::new(Pid::from_raw(10));
        c.adopt(Pid::from_raw(20), Child::Terraform(RunId::from(1)));
        c.adopt(Pid::from_raw(21), Child::Recovery(RunId::from(2)));
        assert_eq!(
            names(&c.reaped(Pid::from_raw(20), Exit::Code(0))),
            ["TerraformExited(RunId(1), Code(0))"]
        );
        assert!(
            c.reaped(Pid::from_raw(20), Exit::Code(0)).is_empty(),
            "a pid is whose it was until it is reaped, not after"
        );
        assert_eq!(
            names(&c.reaped(Pid::from_raw(21), Exit::Signal(9))),
            ["TakeNews", "RecoveryExited(RunId(2), Signal(9))"]
        );
        assert!(c.reaped(Pid::from_raw(99), Exit::Code(1)).is_empty());
        assert_eq!(c.main_exit(), None);
    }

    #[test]
    fn the_controllers_leftovers_get_a_sigterm_only_when_its_group_got_none() {
        let mut c = Children::new(Pid::from_raw(10));
        assert_eq!(
            names(&c.reaped(Pid::from_raw(10), Exit::Code(3))),
            [
                "ControllerExited { pid: Pid(10), exit: Code(3) }",
                "SIGTERM to process group 10"
            ]
        );
        assert_eq!(c.main_exit(), Some(Exit::Code(3)));

        let mut c = Children::new(Pid::from_raw(10));
        c.group_stopped();
        assert_eq!(
            names(&c.reaped(Pid::from_raw(10), Exit::Signal(15))),
            ["ControllerExited { pid: Pid(10), exit: Signal(15) }"]
        );
    }
}
