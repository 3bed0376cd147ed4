//! Bounded exponential backoff with jitter, for any retry loop.

use std::time::Duration;

/// Exponential backoff with "equal jitter": the n-th delay is drawn uniformly from
/// `[d/2, d]` where `d = min(max, initial * 2^n)`.
///
/// The delay never drops below `initial / 2`, so a retry loop built on it is never a
/// tight loop, and never exceeds `max`, so a waiter notices a free lock within `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
}

/// The smallest `initial` delay [`Backoff`] accepts.
pub const MIN_BACKOFF: Duration = Duration::from_millis(1);

impl Backoff {
    /// A backoff starting at `initial` and capped at `max`.
    ///
    /// Validated when a lock operation uses it ([`crate::LockOptions::validate`]):
    /// `initial` must be at least [`MIN_BACKOFF`] and `max` at least `initial`.
    pub const fn new(initial: Duration, max: Duration) -> Self {
        Backoff { initial, max }
    }

    /// The first delay's upper bound.
    pub fn initial(&self) -> Duration {
        self.initial
    }

    /// The cap on every delay.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// Checks the bounds described on [`Backoff::new`].
    pub(crate) fn check(&self) -> Result<(), &'static str> {
        if self.initial < MIN_BACKOFF {
            return Err("backoff initial delay must be at least 1ms");
        }
        if self.max < self.initial {
            return Err("backoff max delay must be at least its initial delay");
        }
        Ok(())
    }

    /// A fresh sequence of delays.
    pub fn delays(&self) -> BackoffDelays {
        BackoffDelays {
            backoff: *self,
            attempt: 0,
        }
    }
}

impl Default for Backoff {
    /// 10 ms doubling up to 500 ms.
    fn default() -> Self {
        Backoff::new(Duration::from_millis(10), Duration::from_millis(500))
    }
}

/// An endless sequence of jittered delays from a [`Backoff`].
#[derive(Debug, Clone)]
pub struct BackoffDelays {
    backoff: Backoff,
    attempt: u32,
}

impl BackoffDelays {
    /// The next delay to sleep before retrying.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self
            .backoff
            .initial
            .checked_mul(1u32 << self.attempt.min(20))
            .map_or(self.backoff.max, |d| d.min(self.backoff.max));
        self.attempt = self.attempt.saturating_add(1);
        let half = ceiling / 2;
        half + half.mul_f64(rand::random::<f64>())
    }
}

impl Iterator for BackoffDelays {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        Some(self.next_delay())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_with_jitter_and_stays_bounded() {
        let b = Backoff::new(Duration::from_millis(4), Duration::from_millis(100));
        let delays: Vec<_> = b.delays().take(30).collect();
        for (n, d) in delays.iter().enumerate() {
            let ceiling = Duration::from_millis(4 * (1u64 << n.min(20))).min(b.max());
            assert!(*d >= ceiling / 2 && *d <= ceiling, "delay {n} = {d:?}");
        }
        assert!(delays[29] >= Duration::from_millis(50));
    }

    #[test]
    fn rejects_tight_loops() {
        assert!(Backoff::new(Duration::ZERO, Duration::from_secs(1))
            .check()
            .is_err());
        assert!(Backoff::new(Duration::from_secs(2), Duration::from_secs(1))
            .check()
            .is_err());
        assert!(Backoff::default().check().is_ok());
    }
}
