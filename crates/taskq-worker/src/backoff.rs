//! Capped exponential backoff with full jitter.

use std::time::Duration;

/// Waits that double from `base` up to `cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first wait.
    pub base: Duration,
    /// The longest wait.
    pub cap: Duration,
}

impl Backoff {
    /// The ceiling for the `n`-th consecutive failure (0-based): `min(cap, base * 2^n)`.
    pub fn ceiling(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// Full jitter: a uniform wait between zero and the ceiling, so that many
    /// workers cut off together do not come back together.
    pub fn jittered(&self, n: u32) -> Duration {
        let ceil = self.ceiling(n).as_millis() as u64;
        Duration::from_millis(fastrand::u64(0..=ceil))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_then_caps() {
        let b = Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(2),
        };
        let got: Vec<u64> = (0..7).map(|n| b.ceiling(n).as_millis() as u64).collect();
        assert_eq!(got, [100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(b.ceiling(1000), Duration::from_secs(2));
        for n in 0..40 {
            assert!(b.jittered(n) <= b.ceiling(n));
        }
    }
}
