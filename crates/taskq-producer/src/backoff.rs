//! Capped exponential backoff with jitter between failed connects.

use std::time::{Duration, Instant};

/// How long to wait between reconnect attempts: `initial`, doubling per failure
/// up to `max`, each wait drawn at random from its upper half so that many
/// producers that lost the same server do not come back in lockstep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Wait after the first failure.
    pub initial: Duration,
    /// Longest wait.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_secs(2),
        }
    }
}

impl Backoff {
    /// The wait after `failures` consecutive failures (1 or more), before jitter.
    pub fn ceiling(&self, failures: u32) -> Duration {
        let shift = failures.saturating_sub(1).min(30);
        self.initial
            .checked_mul(1u32 << shift)
            .unwrap_or(self.max)
            .min(self.max)
    }

    /// The wait after `failures` consecutive failures, jittered into `[ceiling/2, ceiling]`.
    pub fn wait(&self, failures: u32) -> Duration {
        let ceil = self.ceiling(failures);
        let half = ceil / 2;
        let span = (ceil - half).as_nanos() as u64;
        half + Duration::from_nanos(if span == 0 {
            0
        } else {
            fastrand::u64(0..=span)
        })
    }
}

/// The reconnect state of one server.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Retry {
    pub(crate) failures: u32,
    pub(crate) next_attempt: Option<Instant>,
}

impl Retry {
    pub(crate) const fn new() -> Retry {
        Retry {
            failures: 0,
            next_attempt: None,
        }
    }

    pub(crate) fn failed(&mut self, policy: &Backoff, now: Instant) {
        self.failures = self.failures.saturating_add(1);
        self.next_attempt = Some(now + policy.wait(self.failures));
    }

    #[inline]
    pub(crate) fn succeeded(&mut self) {
        if self.failures != 0 {
            *self = Retry::new();
        }
    }

    /// A connection that had been working broke: the first reconnect after
    /// a healthy spell is immediate; repeated breaks back off.
    pub(crate) fn broke(&mut self, policy: &Backoff, now: Instant) {
        if self.failures == 0 {
            self.failures = 1;
        } else {
            self.failed(policy, now);
        }
    }

    /// What is left of the wait, if any.
    pub(crate) fn remaining(&self, now: Instant) -> Option<Duration> {
        self.next_attempt
            .and_then(|t| t.checked_duration_since(now))
            .filter(|d| !d.is_zero())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_then_caps_and_jitters_within_upper_half() {
        let b = Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(100),
        };
        let ceilings: Vec<u64> = (1..=6).map(|f| b.ceiling(f).as_millis() as u64).collect();
        assert_eq!(ceilings, [10, 20, 40, 80, 100, 100]);
        assert_eq!(b.ceiling(u32::MAX), Duration::from_millis(100));
        for f in 1..40 {
            let w = b.wait(f);
            assert!(w <= b.ceiling(f) && w >= b.ceiling(f) / 2, "{f}: {w:?}");
        }
    }
}
