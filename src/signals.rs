//! Signal names, the forwarding policy and rewrites: raw numbers become decisions here.
//!
//! The init blocks every signal it may receive and reads them from one signalfd. What arrives is
//! classified once, in [`classify`]: the rest of the code deals in [`Incoming`], never in numbers.

use nix::sys::signal::{SigSet, Signal};

use crate::sys::{self, SigNo};

/// Signals the kernel raises because of a fault in the process itself. They are never blocked
/// (blocking them makes the kernel kill us anyway) and never forwarded: they say the init is broken.
pub const SYNCHRONOUS: [Signal; 7] = [
    Signal::SIGSEGV,
    Signal::SIGBUS,
    Signal::SIGFPE,
    Signal::SIGILL,
    Signal::SIGTRAP,
    Signal::SIGSYS,
    Signal::SIGABRT,
];

/// Signals the kernel sends to the init because of the init's own I/O: a write to a closed pipe
/// (SIGPIPE) or terminal access from a background group (SIGTTIN, SIGTTOU). Not forwarded.
pub const SELF_INFLICTED: [Signal; 3] = [Signal::SIGPIPE, Signal::SIGTTIN, Signal::SIGTTOU];

/// What a signal received by the init means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Incoming {
    /// A child changed state: reap.
    Child,
    /// A request to stop the container (SIGTERM, SIGINT): forward it, and start the shutdown.
    Shutdown(SigNo),
    /// Any other catchable signal: forward it as it is (after rewrite).
    Forward(SigNo),
    /// Raised by our own I/O (see [`SELF_INFLICTED`]): nothing to do.
    Ignore(SigNo),
}

/// The mask the init blocks and reads through its signalfd: everything but the synchronous ones.
pub fn init_mask() -> SigSet {
    let mut set = SigSet::all();
    for s in SYNCHRONOUS {
        set.remove(s);
    }
    set
}

/// Turns a raw signal number read from the signalfd into what the init does with it.
pub fn classify(signo: SigNo) -> Incoming {
    match Signal::try_from(signo) {
        Ok(Signal::SIGCHLD) => Incoming::Child,
        Ok(Signal::SIGTERM | Signal::SIGINT) => Incoming::Shutdown(signo),
        Ok(s) if SELF_INFLICTED.contains(&s) => Incoming::Ignore(signo),
        _ => Incoming::Forward(signo),
    }
}

/// A signal's conventional name (`SIGTERM`, `SIGRTMIN+3`), for logs and messages.
pub fn name(signo: SigNo) -> String {
    if let Ok(s) = Signal::try_from(signo) {
        return s.as_str().to_string();
    }
    let (min, max) = (sys::sigrtmin(), sys::sigrtmax());
    if signo >= min && signo <= max {
        if signo == min {
            return "SIGRTMIN".into();
        }
        return format!("SIGRTMIN+{}", signo - min);
    }
    format!("signal {signo}")
}

/// Parses `TERM`, `SIGTERM`, `term`, `15`, `RTMIN+2` into a signal number.
pub fn parse(text: &str) -> Option<SigNo> {
    let t = text.trim();
    if let Ok(n) = t.parse::<i32>() {
        return (1..=sys::sigrtmax()).contains(&n).then_some(n);
    }
    let upper = t.to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    if let Some(rest) = bare.strip_prefix("RTMIN") {
        let off = if rest.is_empty() {
            0
        } else {
            rest.strip_prefix('+')?.parse::<i32>().ok()?
        };
        let n = sys::sigrtmin() + off;
        return (n <= sys::sigrtmax()).then_some(n);
    }
    if let Some(rest) = bare.strip_prefix("RTMAX") {
        let off = if rest.is_empty() {
            0
        } else {
            rest.strip_prefix('-')?.parse::<i32>().ok()?
        };
        let n = sys::sigrtmax() - off;
        return (n >= sys::sigrtmin()).then_some(n);
    }
    format!("SIG{bare}")
        .parse::<Signal>()
        .ok()
        .map(|s| s as i32)
}

/// Signal rewrites applied before forwarding (`TFINIT_REWRITE=TERM:INT,USR1:HUP`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rewrites(Vec<(SigNo, SigNo)>);

impl Rewrites {
    /// Builds a rewrite table from (from, to) pairs.
    pub fn new(pairs: Vec<(SigNo, SigNo)>) -> Self {
        Rewrites(pairs)
    }

    /// The signal to send in place of `signo`.
    pub fn apply(&self, signo: SigNo) -> SigNo {
        self.0
            .iter()
            .find(|(from, _)| *from == signo)
            .map(|(_, to)| *to)
            .unwrap_or(signo)
    }

    /// Whether no rewrite is configured.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Whether the init receives `signo` (through its signalfd) and forwards it: what a rewrite may
/// start from. Not SIGKILL/SIGSTOP (never caught), the synchronous ones (never blocked), SIGCHLD
/// (reaped), the self-inflicted ones (dropped), nor glibc's reserved 32 and 33 (never blocked).
pub fn received_and_forwarded(signo: SigNo) -> bool {
    let caught = match Signal::try_from(signo) {
        Ok(s) => s != Signal::SIGKILL && s != Signal::SIGSTOP && !SYNCHRONOUS.contains(&s),
        Err(_) => signo >= sys::sigrtmin() && signo <= sys::sigrtmax(),
    };
    caught
        && matches!(
            classify(signo),
            Incoming::Forward(_) | Incoming::Shutdown(_)
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_numbers_and_realtime() {
        assert_eq!(parse("TERM"), Some(libc::SIGTERM));
        assert_eq!(parse("sigint"), Some(libc::SIGINT));
        assert_eq!(parse("9"), Some(libc::SIGKILL));
        assert_eq!(parse("RTMIN+1"), Some(sys::sigrtmin() + 1));
        assert_eq!(parse("SIGRTMAX"), Some(sys::sigrtmax()));
        assert_eq!(parse("NOPE"), None);
        assert_eq!(parse("0"), None);
        assert_eq!(parse("65"), None);
        assert_eq!(parse("RTMIN+99"), None);
    }

    #[test]
    fn names_round_trip() {
        for n in 1..=sys::sigrtmax() {
            if n == 32 || n == 33 {
                continue; // reserved by glibc, not nameable
            }
            assert_eq!(parse(&name(n)), Some(n), "signal {n} named {}", name(n));
        }
    }

    #[test]
    fn classification() {
        assert_eq!(classify(libc::SIGCHLD), Incoming::Child);
        assert_eq!(classify(libc::SIGTERM), Incoming::Shutdown(libc::SIGTERM));
        assert_eq!(classify(libc::SIGHUP), Incoming::Forward(libc::SIGHUP));
        assert_eq!(classify(libc::SIGPIPE), Incoming::Ignore(libc::SIGPIPE));
        assert_eq!(
            classify(sys::sigrtmin()),
            Incoming::Forward(sys::sigrtmin())
        );
    }

    #[test]
    fn rewrite_applies_first_match_only() {
        let r = Rewrites::new(vec![(libc::SIGTERM, libc::SIGINT)]);
        assert_eq!(r.apply(libc::SIGTERM), libc::SIGINT);
        assert_eq!(r.apply(libc::SIGINT), libc::SIGINT);
    }

    #[test]
    fn only_signals_the_init_forwards_can_be_rewritten() {
        for s in [
            libc::SIGTERM,
            libc::SIGINT,
            libc::SIGHUP,
            libc::SIGUSR1,
            sys::sigrtmin(),
        ] {
            assert!(received_and_forwarded(s), "{}", name(s));
        }
        for s in [
            libc::SIGKILL,
            libc::SIGSTOP,
            libc::SIGCHLD,
            libc::SIGPIPE,
            libc::SIGTTIN,
            libc::SIGSEGV,
            libc::SIGABRT,
            32,
        ] {
            assert!(!received_and_forwarded(s), "{}", name(s));
        }
    }

    #[test]
    fn synchronous_signals_are_not_blocked() {
        let m = init_mask();
        assert!(!m.contains(Signal::SIGSEGV));
        assert!(m.contains(Signal::SIGTERM));
        assert!(m.contains(Signal::SIGCHLD));
    }
}
