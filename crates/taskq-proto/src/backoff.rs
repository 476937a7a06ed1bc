//! Capped exponential backoff, and the reconnect rule built on it. No clock
//! is read and no random number drawn here: the caller passes the time and a
//! random `u64` (the producer and the worker draw it from `fastrand`), so the
//! rule is tested deterministically.

use std::time::{Duration, Instant};

/// How a wait is spread below its ceiling, so that many clients cut off
/// together do not come back together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Jitter {
    /// Exactly the ceiling (release delays, where the number means something).
    None,
    /// Uniform in `[0, ceiling]`.
    Full,
    /// Uniform in `[ceiling / 2, ceiling]`: spread out, yet never much shorter.
    Upper,
}

/// Waits that double from `initial` up to `max`, spread by `jitter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Backoff {
    /// The wait before the first retry (`n = 0`).
    pub initial: Duration,
    /// The longest wait.
    pub max: Duration,
    /// How each wait is spread below its ceiling.
    pub jitter: Jitter,
}

impl Backoff {
    /// The policy for reconnects, [`defaults::RECONNECT_BACKOFF`](crate::defaults::RECONNECT_BACKOFF):
    /// 50 ms doubling to 2 s, upper-half jitter.
    pub const RECONNECT: Backoff = crate::defaults::RECONNECT_BACKOFF;

    /// The ceiling of the wait before retry `n` (0-based): `min(max, initial * 2^n)`.
    pub fn ceiling(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.min(31)).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// The wait before retry `n`, spread by the jitter with `random`, a
    /// uniformly drawn `u64`.
    pub fn wait(&self, n: u32, random: u64) -> Duration {
        let ceil = self.ceiling(n);
        let floor = match self.jitter {
            Jitter::None => return ceil,
            Jitter::Full => Duration::ZERO,
            Jitter::Upper => ceil / 2,
        };
        let span = (ceil - floor).as_nanos();
        // A span of at most `max` fits in u64 nanoseconds for any sane policy;
        // a larger one is clamped, which only narrows the spread.
        let span = u64::try_from(span).unwrap_or(u64::MAX);
        let off = if span == u64::MAX {
            random
        } else {
            random % (span + 1)
        };
        floor + Duration::from_nanos(off)
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::RECONNECT
    }
}

/// The reconnect rule of one connection to one server.
///
/// The first reconnect after a healthy spell (a connection on which replies
/// came, or the first connection ever) is immediate; after that, while no
/// reply comes, each failed connect and each connection that breaks before
/// any reply waits out the backoff, growing with each failure in a row. So a
/// server that restarts costs one immediate reconnect, and one that accepts
/// and cuts every connection is retried with backoff, never in a tight loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reconnect {
    failures: u32,
    retry_at: Option<Instant>,
    progress: bool,
}

impl Reconnect {
    /// No failure yet: the first connect may go at once.
    pub const fn new() -> Reconnect {
        Reconnect {
            failures: 0,
            retry_at: None,
            progress: false,
        }
    }

    /// A connection was opened (and set up); it has made no progress yet.
    pub fn opened(&mut self) {
        self.progress = false;
        self.retry_at = None;
    }

    /// A reply came on the current connection: the failures in a row are over.
    #[inline]
    pub fn progress(&mut self) {
        if !self.progress || self.failures != 0 {
            self.progress = true;
            self.failures = 0;
        }
    }

    /// A connect attempt failed at `now`: the next waits out the backoff.
    pub fn connect_failed(&mut self, policy: &Backoff, now: Instant, random: u64) {
        let wait = policy.wait(self.failures, random);
        self.failures = self.failures.saturating_add(1);
        self.retry_at = Some(now + wait);
        self.progress = false;
    }

    /// The current connection broke at `now`: replaced at once after a
    /// healthy spell (it made progress, or nothing failed before it), else
    /// after the backoff.
    pub fn broke(&mut self, policy: &Backoff, now: Instant, random: u64) {
        if self.progress {
            self.failures = 0;
        }
        self.progress = false;
        if self.failures == 0 {
            // One immediate reconnect; the next break without progress backs off.
            self.failures = 1;
            self.retry_at = None;
        } else {
            self.connect_failed(policy, now, random);
        }
    }

    /// What is left of the wait before the next connect may go, if anything.
    pub fn wait_left(&self, now: Instant) -> Option<Duration> {
        self.retry_at
            .and_then(|t| t.checked_duration_since(now))
            .filter(|d| !d.is_zero())
    }

    /// True once a reply came on the current connection.
    #[inline]
    pub fn made_progress(&self) -> bool {
        self.progress
    }

    /// When the next connect may go (`None`: now).
    pub fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }

    /// Failures in a row (failed connects, and connections that broke before any reply).
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn ceilings_double_then_cap() {
        let b = Backoff {
            initial: 10 * MS,
            max: 100 * MS,
            jitter: Jitter::None,
        };
        let got: Vec<u128> = (0..6).map(|n| b.ceiling(n).as_millis()).collect();
        assert_eq!(got, [10, 20, 40, 80, 100, 100]);
        assert_eq!(b.ceiling(u32::MAX), 100 * MS);
        assert_eq!(b.wait(2, u64::MAX), 40 * MS);
    }

    #[test]
    fn jitter_spreads_within_its_range_and_reaches_both_ends() {
        for (jitter, floor) in [(Jitter::Full, Duration::ZERO), (Jitter::Upper, 20 * MS)] {
            let b = Backoff {
                initial: 40 * MS,
                max: MS * 1000,
                jitter,
            };
            assert_eq!(b.wait(0, 0), floor);
            let span = (40 * MS - floor).as_nanos() as u64;
            assert_eq!(b.wait(0, span), 40 * MS);
            for r in [1, 7, span / 3, u64::MAX] {
                let w = b.wait(0, r);
                assert!(w >= floor && w <= 40 * MS, "{jitter:?} {r}: {w:?}");
            }
        }
    }

    #[test]
    fn progress_makes_the_next_reconnect_immediate_and_failures_back_off() {
        let b = Backoff {
            initial: 100 * MS,
            max: MS * 1000,
            jitter: Jitter::None,
        };
        let t0 = Instant::now();
        let mut r = Reconnect::new();
        assert_eq!(r.wait_left(t0), None);
        // The first connection broke before any reply: at once, the one free try.
        r.opened();
        r.broke(&b, t0, 0);
        assert_eq!((r.wait_left(t0), r.failures()), (None, 1));
        // Connected, a reply came, then it broke: at once again.
        r.opened();
        r.progress();
        r.broke(&b, t0, 0);
        assert_eq!((r.wait_left(t0), r.failures()), (None, 1));
        // Broke again before any reply: back off, doubling.
        r.opened();
        r.broke(&b, t0, 0);
        assert_eq!(r.wait_left(t0), Some(200 * MS));
        r.connect_failed(&b, t0, 0);
        assert_eq!(r.wait_left(t0), Some(400 * MS));
        assert_eq!(r.failures(), 3);
        assert_eq!(r.wait_left(t0 + 500 * MS), None);
        // A server that cuts every connection: never two immediate tries in a row.
        let mut cut = Reconnect::new();
        let immediate = (0..10)
            .filter(|_| {
                cut.opened();
                cut.broke(&b, t0, 0);
                cut.wait_left(t0).is_none()
            })
            .count();
        assert_eq!(immediate, 1);
        // A reply ends the run of failures.
        r.opened();
        r.progress();
        assert_eq!(r.failures(), 0);
    }
}
