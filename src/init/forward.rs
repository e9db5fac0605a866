//! Where signals to the init are forwarded: to the controller, or to its whole process group
//! (`TFINIT_FORWARD`). Pure; the loop sends them (supervisor.rs, the hot path) and so does the
//! fallback without a loop (plain.rs).

use nix::unistd::Pid;

use crate::config::ForwardTo;
use crate::sys::Target;

/// Where a forwarded signal goes: the controller itself while it runs (`TFINIT_FORWARD=child`;
/// nobody once it exited), or its whole process group (`group`).
pub(super) fn forward_target(forward: ForwardTo, main: Pid, main_exited: bool) -> Option<Target> {
    match (forward, main_exited) {
        (ForwardTo::Child, false) => Some(Target::Pid(main)),
        (ForwardTo::Child, true) => None,
        (ForwardTo::Group, _) => Some(Target::Group(main)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_go_to_the_controller_or_its_group_and_nowhere_once_the_child_is_gone() {
        let main = Pid::from_raw(42);
        assert_eq!(
            forward_target(ForwardTo::Child, main, false),
            Some(Target::Pid(main))
        );
        assert_eq!(forward_target(ForwardTo::Child, main, true), None);
        assert_eq!(
            forward_target(ForwardTo::Group, main, false),
            Some(Target::Group(main))
        );
        // The group may outlive the controller: its leftovers still get signals.
        assert_eq!(
            forward_target(ForwardTo::Group, main, true),
            Some(Target::Group(main))
        );
    }
}
