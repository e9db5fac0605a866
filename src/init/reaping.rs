//! Whose each child is. Every exit reaper.rs collects is handed to whom it concerns: the
//! controller, a terraform run, a recovery helper, or nobody (an adopted orphan). Pure: the loop
//! feeds it the reaped pids.

use std::collections::HashMap;

use nix::unistd::Pid;

use super::reaper::Exit;
use crate::locks::names::RunId;

/// A child of ours other than the controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Child {
    /// terraform of a run.
    Terraform(RunId),
    /// The lock-recovery helper of a run.
    Recovery(RunId),
}

/// The controller, where it is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Controller {
    /// It runs. `group_stopped`: its process group got a stop signal already (the init never
    /// sends it a second SIGTERM by itself).
    Running { group_stopped: bool },
    /// It exited.
    Exited(Exit),
}

/// What a reaped pid was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reaped {
    /// The controller exited. `stop_leftovers`: its process group got no stop signal while it
    /// ran, so what it left there gets its SIGTERM now.
    Controller {
        /// How it ended.
        exit: Exit,
        /// Whether its leftovers get a SIGTERM.
        stop_leftovers: bool,
    },
    /// terraform of a run.
    Terraform(RunId, Exit),
    /// A run's lock-recovery helper.
    Recovery(RunId, Exit),
    /// An adopted orphan.
    Orphan,
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

    /// `pid` was reaped with `exit`: whose it was.
    pub(super) fn reaped(&mut self, pid: Pid, exit: Exit) -> Reaped {
        if pid == self.main {
            let stop_leftovers = matches!(
                self.controller,
                Controller::Running {
                    group_stopped: false
                }
            );
            self.controller = Controller::Exited(exit);
            return Reaped::Controller {
                exit,
                stop_leftovers,
            };
        }
        match self.others.remove(&pid) {
            Some(Child::Terraform(run)) => Reaped::Terraform(run, exit),
            Some(Child::Recovery(run)) => Reaped::Recovery(run, exit),
            None => Reaped::Orphan,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reaped_pid_goes_to_whom_it_concerns_once() {
        let mut c = Children::new(Pid::from_raw(10));
        c.adopt(Pid::from_raw(20), Child::Terraform(RunId::from(1)));
        c.adopt(Pid::from_raw(21), Child::Recovery(RunId::from(2)));
        assert_eq!(
            c.reaped(Pid::from_raw(20), Exit::Code(0)),
            Reaped::Terraform(RunId::from(1), Exit::Code(0))
        );
        assert_eq!(
            c.reaped(Pid::from_raw(20), Exit::Code(0)),
            Reaped::Orphan,
            "a pid is whose it was until it is reaped, not after"
        );
        assert_eq!(
            c.reaped(Pid::from_raw(21), Exit::Signal(9)),
            Reaped::Recovery(RunId::from(2), Exit::Signal(9))
        );
        assert_eq!(c.reaped(Pid::from_raw(99), Exit::Code(1)), Reaped::Orphan);
        assert_eq!(c.main_exit(), None);
    }

    #[test]
    fn the_controllers_leftovers_get_a_sigterm_only_when_its_group_got_none() {
        let mut c = Children::new(Pid::from_raw(10));
        assert_eq!(
            c.reaped(Pid::from_raw(10), Exit::Code(3)),
            Reaped::Controller {
                exit: Exit::Code(3),
                stop_leftovers: true
            }
        );
        assert_eq!(c.main_exit(), Some(Exit::Code(3)));

        let mut c = Children::new(Pid::from_raw(10));
        c.group_stopped();
        assert_eq!(
            c.reaped(Pid::from_raw(10), Exit::Signal(15)),
            Reaped::Controller {
                exit: Exit::Signal(15),
                stop_leftovers: false
            }
        );
    }
}
