//! Rate limits for repeated warnings. A client, or a syscall that keeps failing, can repeat the
//! same problem thousands of times a second; one line each would fill the container's log (and
//! the disk under it) and cost the loop its time in write(2) to stderr. Each kind of repeated
//! warning gets a [`Throttle`]: a few lines, then silence for the rest of its window, and the
//! next line that passes says how many were held back.

use std::time::{Duration, Instant};

/// One kind of repeated log line: at most `burst` lines per `window`.
#[derive(Debug, Clone)]
pub(crate) struct Throttle {
    /// Lines let through per window.
    burst: u32,
    /// The window's length.
    window: Duration,
    /// When the current window began (None: nothing logged yet).
    since: Option<Instant>,
    /// Lines let through in the current window.
    shown: u32,
    /// Lines held back since the last one let through.
    held: u64,
}

impl Throttle {
    /// At most `burst` lines per `window`.
    pub(crate) const fn new(burst: u32, window: Duration) -> Throttle {
        Throttle {
            burst,
            window,
            since: None,
            shown: 0,
            held: 0,
        }
    }

    /// The loop's warnings about clients: 5 lines a minute of each kind.
    pub(crate) const fn per_minute() -> Throttle {
        Throttle::new(5, Duration::from_secs(60))
    }

    /// Whether one more line may be logged at `now`: `Some(n)` when it may, `n` being how many
    /// like it were held back since the last one logged (say so in the line); None when it is
    /// held back (and counted).
    pub(crate) fn allow(&mut self, now: Instant) -> Option<u64> {
        let fresh = match self.since {
            None => true,
            Some(t) => now.saturating_duration_since(t) >= self.window,
        };
        if fresh {
            self.since = Some(now);
            self.shown = 0;
        }
        if self.shown >= self.burst {
            self.held += 1;
            return None;
        }
        self.shown += 1;
        Some(std::mem::take(&mut self.held))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_the_rest_of_the_window_is_counted_and_reported_once() {
        let mut t = Throttle::new(2, Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(t.allow(t0), Some(0));
        assert_eq!(t.allow(t0), Some(0));
        for i in 0..1000 {
            assert_eq!(t.allow(t0 + Duration::from_millis(i)), None);
        }
        let next = t0 + Duration::from_secs(10);
        assert_eq!(t.allow(next), Some(1000), "the held-back count, once");
        assert_eq!(t.allow(next), Some(0));
        assert_eq!(t.allow(next), None);
    }
}
