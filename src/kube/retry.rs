//! When to send a failed request again, for a caller that wants to: exponential backoff with
//! jitter (so that pods that failed together do not come back together), never sooner than the
//! server's `Retry-After`, for the failures that a repeat can cure:
//!
//! | error | retried | wait |
//! |---|---|---|
//! | TooManyRequests (429) | yes | the backoff, at least `Retry-After` |
//! | ServerError (5xx) | yes | the backoff, at least `Retry-After` if sent |
//! | Connect (nothing was sent) | yes | the backoff |
//! | Timeout, AnswerLost of a get or list | yes | the backoff |
//! | Timeout, AnswerLost of a write | no: it may have been applied; the caller reads the Lease again and decides |
//! | anything else (401, 403, 404, 409, ...) | no: a repeat gets the same answer |
//!
//! [`RetryPolicy::delay`] is the decision, a pure function; [`RetryPolicy::run`] applies it
//! with sleeps, and ends at the caller's deadline: no loop here can outlast its caller's budget.

use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, Instant};

use super::error::Error;

/// How many times, and how long apart, a request is sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The wait after the first failure (before jitter).
    pub first: Duration,
    /// The longest wait of the backoff (before jitter; `Retry-After` may ask for longer).
    pub max: Duration,
    /// The most attempts in all, the first included.
    pub attempts: u32,
}

impl Default for RetryPolicy {
    /// 200 ms, doubling up to 5 s, 6 attempts: about 10 s of backoff in all, the scale of
    /// client-go's own retries of 429 and 5xx.
    fn default() -> RetryPolicy {
        RetryPolicy {
            first: Duration::from_millis(200),
            max: Duration::from_secs(5),
            attempts: 6,
        }
    }
}

impl RetryPolicy {
    /// The wait before the next attempt after the `failures`-th failed one (1 for the first)
    /// ended in `err`, with `jitter` in [0, 1) (see [`jitter`]); None when `err` is not worth a
    /// repeat or the attempts are spent. The wait is the backoff `first * 2^(failures-1)`, capped
    /// at `max`, plus up to half of it by jitter, and never less than the server's
    /// `Retry-After`.
    pub fn delay(&self, failures: u32, err: &Error, jitter: f64) -> Option<Duration> {
        if failures == 0 || failures >= self.attempts {
            return None;
        }
        let at_least = match err {
            Error::TooManyRequests { retry_after, .. } | Error::ServerError { retry_after, .. } => {
                retry_after.unwrap_or_default()
            }
            Error::Connect { .. } => Duration::ZERO,
            Error::Timeout { op, .. } | Error::AnswerLost { op, .. } if op.verb.is_read() => {
                Duration::ZERO
            }
            _ => return None,
        };
        let doubling = 2_u32.saturating_pow(failures - 1);
        let backoff = self.first.saturating_mul(doubling).min(self.max);
        let jitter = if jitter.is_finite() {
            jitter.clamp(0.0, 1.0)
        } else {
            0.0
        };
        Some((backoff + backoff.mul_f64(jitter / 2.0)).max(at_least))
    }

    /// Calls `attempt` until it succeeds, fails with an error [`RetryPolicy::delay`] does not
    /// retry, the attempts are spent, or the next wait would end after `deadline`; sleeps in
    /// between. The last error otherwise. (An attempt started before `deadline` may end after
    /// it, by at most the client's request deadline.)
    pub fn run<T>(
        &self,
        deadline: Instant,
        mut attempt: impl FnMut() -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut failures = 0;
        loop {
            let err = match attempt() {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            failures += 1;
            let Some(wait) = self.delay(failures, &err, jitter()) else {
                return Err(err);
            };
            if Instant::now() + wait >= deadline {
                return Err(err);
            }
            tracing::debug!(wait_ms = wait.as_millis() as u64, "{err}: retrying");
            std::thread::sleep(wait);
        }
    }
}

/// A number in [0, 1) that differs between calls and processes (std's randomly keyed hasher:
/// good enough to spread retries, and no random-number crate for it).
pub fn jitter() -> f64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    (h.finish() >> 11) as f64 / (1_u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::error::{Op, Verb};

    fn op(verb: Verb) -> Op {
        Op {
            verb,
            namespace: "ns".into(),
            name: Some("a".into()),
        }
    }

    fn throttled(retry_after: Option<u64>) -> Error {
        Error::TooManyRequests {
            retry_after: retry_after.map(Duration::from_secs),
            op: op(Verb::Update),
            status: Box::default(),
        }
    }

    fn policy() -> RetryPolicy {
        RetryPolicy {
            first: Duration::from_millis(100),
            max: Duration::from_secs(1),
            attempts: 5,
        }
    }

    #[test]
    fn the_backoff_doubles_up_to_its_cap_and_jitter_adds_at_most_half() {
        let p = policy();
        let e = throttled(None);
        let ms = |failures, j| p.delay(failures, &e, j).unwrap().as_millis();
        assert_eq!(ms(1, 0.0), 100);
        assert_eq!(ms(2, 0.0), 200);
        assert_eq!(ms(3, 0.0), 400);
        assert_eq!(ms(4, 0.0), 800);
        assert_eq!(ms(1, 0.5), 125);
        assert_eq!(ms(1, 0.999_999), 149);
        // Out-of-range jitter cannot stretch or shrink the wait beyond its bounds.
        assert_eq!(ms(1, 7.0), 150);
        assert_eq!(ms(1, f64::NAN), 100);
        let capped = RetryPolicy { attempts: 100, ..p };
        assert_eq!(capped.delay(40, &e, 0.0), Some(Duration::from_secs(1)));
    }

    #[test]
    fn retry_after_is_a_floor() {
        let p = policy();
        assert_eq!(
            p.delay(1, &throttled(Some(2)), 0.9),
            Some(Duration::from_secs(2))
        );
        let server = Error::ServerError {
            code: 503,
            retry_after: Some(Duration::from_secs(3)),
            op: op(Verb::Get),
            status: Box::default(),
        };
        assert_eq!(p.delay(1, &server, 0.0), Some(Duration::from_secs(3)));
    }

    #[test]
    fn the_attempts_end() {
        let p = policy();
        assert!(p.delay(4, &throttled(None), 0.0).is_some());
        assert_eq!(p.delay(5, &throttled(None), 0.0), None);
        assert_eq!(p.delay(0, &throttled(None), 0.0), None);
    }

    #[test]
    fn only_what_a_repeat_can_cure_is_retried() {
        let p = policy();
        let connect = Error::Connect {
            server: "https://x:443".into(),
            detail: "refused".into(),
            op: op(Verb::Create),
        };
        assert!(p.delay(1, &connect, 0.0).is_some());
        let lost = |verb| Error::AnswerLost {
            detail: "eof".into(),
            op: op(verb),
        };
        assert!(p.delay(1, &lost(Verb::Get), 0.0).is_some());
        assert!(p.delay(1, &lost(Verb::List), 0.0).is_some());
        assert_eq!(p.delay(1, &lost(Verb::Update), 0.0), None);
        let timeout = |verb| Error::Timeout {
            after: Duration::from_secs(1),
            phase: "global".into(),
            op: op(verb),
        };
        assert!(p.delay(1, &timeout(Verb::Get), 0.0).is_some());
        assert_eq!(p.delay(1, &timeout(Verb::Create), 0.0), None);
        for e in [
            Error::Conflict {
                op: op(Verb::Update),
                status: Box::default(),
            },
            Error::Forbidden {
                op: op(Verb::Get),
                status: Box::default(),
            },
            Error::NotFound {
                op: op(Verb::Get),
                status: Box::default(),
            },
        ] {
            assert_eq!(p.delay(1, &e, 0.0), None, "{e}");
        }
    }

    #[test]
    fn run_stops_at_the_deadline_without_sleeping_past_it() {
        let p = RetryPolicy {
            first: Duration::from_secs(10),
            max: Duration::from_secs(10),
            attempts: 5,
        };
        let start = Instant::now();
        let mut calls = 0;
        let r: Result<(), Error> = p.run(start + Duration::from_secs(1), || {
            calls += 1;
            Err(throttled(None))
        });
        assert!(matches!(r, Err(Error::TooManyRequests { .. })));
        assert_eq!(calls, 1);
        assert!(start.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn run_retries_until_success() {
        let p = RetryPolicy {
            first: Duration::from_millis(1),
            max: Duration::from_millis(2),
            attempts: 5,
        };
        let mut calls = 0;
        let r = p.run(Instant::now() + Duration::from_secs(5), || {
            calls += 1;
            if calls < 3 {
                Err(throttled(None))
            } else {
                Ok(calls)
            }
        });
        assert_eq!(r.unwrap(), 3);
    }

    #[test]
    fn jitter_is_in_range_and_varies() {
        let draws: Vec<f64> = (0..64).map(|_| jitter()).collect();
        assert!(draws.iter().all(|j| (0.0..1.0).contains(j)));
        assert!(draws.windows(2).any(|w| w[0] != w[1]));
    }
}
