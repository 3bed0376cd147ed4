//! [`LockOptions`]: TTL, wait policy, retry backoff and auto-renewal.

use std::time::Duration;

use tokio::time::Instant;

use crate::{Backoff, LockError, OptionsError};

/// The shortest TTL accepted. Shorter leases would expire in flight.
pub const MIN_TTL: Duration = Duration::from_nanos(MIN_TTL_NANOS);

/// The longest TTL accepted. Hold a lock longer with [`AutoRenew`], so that a crashed
/// holder frees it within one TTL.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// The shortest renewal period [`AutoRenew`] accepts: anything shorter is a tight loop.
/// A third of [`MIN_TTL`] (3.333333 ms), so that the default period (TTL/3) is accepted for every TTL
/// that is.
pub const MIN_RENEW_INTERVAL: Duration = Duration::from_nanos(MIN_TTL_NANOS / 3);

/// [`MIN_TTL`] in nanoseconds: 10 ms. A number, because `Duration` division is not `const`.
const MIN_TTL_NANOS: u64 = 10_000_000;

/// How long `acquire` waits for a held lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitPolicy {
    /// Try once; fail with [`crate::LockError::Timeout`] if the lock is held.
    NoWait,
    /// Wait up to this long. `Timeout(Duration::ZERO)` behaves like [`WaitPolicy::NoWait`];
    /// a timeout too large to represent as a deadline behaves like [`WaitPolicy::Forever`].
    Timeout(Duration),
    /// Wait until the lock is granted (or the acquire future is dropped).
    Forever,
}

impl WaitPolicy {
    /// The instant waiting started at `start` must give up, or `None` to wait forever.
    pub fn deadline_from(self, start: Instant) -> Option<Instant> {
        match self {
            WaitPolicy::NoWait => Some(start),
            WaitPolicy::Timeout(limit) => start.checked_add(limit),
            WaitPolicy::Forever => None,
        }
    }
}

/// In which order waiters of one key are granted it.
///
/// A FIFO wait is granted in the order the waiters started waiting, across clients and
/// processes: a waiter that keeps losing races behind newer ones cannot happen. It
/// costs throughput on a hot key, since each release must go to one particular waiter
/// (see the backend's docs for the figures and for how a dead waiter leaves the queue).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum WaitOrder {
    /// No order promised beyond the backend's own: waiters may race on each release.
    /// Backends whose waiting is FIFO anyway (Postgres, ZooKeeper), and Redis clients
    /// connected with `?fifo=true`, still grant in arrival order.
    #[default]
    Any,
    /// Strict arrival order. A backend that cannot honour it (its
    /// [`crate::Guarantees::fifo`] is unsupported) refuses the acquire with
    /// [`crate::LockError::Unsupported`] rather than ignore the request.
    Fifo,
}

/// Renews a held lease in the background (a watchdog).
///
/// The watchdog extends the lease every `interval` (default: TTL/3; at least
/// [`MIN_RENEW_INTERVAL`] and at most TTL/2, so a renewal has time to land) by the lock's TTL,
/// stops as soon as the guard is released or dropped, and stops renewing once
/// `max_hold` has passed since the grant, letting the lease run out. If a renewal is
/// refused, fails with an error that is not [retryable](crate::LockError::is_retryable),
/// or the validity deadline passes while renewals fail, the lease is marked lost and
/// [`crate::LockGuard::lost`] fires; while retryable renewal errors last it is suspect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct AutoRenew {
    /// Time between renewals; `None` means TTL/3.
    pub interval: Option<Duration>,
    /// Stop renewing after this long since the grant; `None` renews until release.
    pub max_hold: Option<Duration>,
}

impl AutoRenew {
    /// Renews every TTL/3 until release, with no cap.
    pub fn new() -> Self {
        AutoRenew::default()
    }

    /// Renews every `interval` instead of TTL/3 (checked by [`LockOptions::validate`]:
    /// at least [`MIN_RENEW_INTERVAL`] and at most TTL/2).
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = Some(interval);
        self
    }

    /// Caps the total hold time at `max_hold`.
    pub fn with_max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// The renewal period for a lease of `ttl`.
    pub fn interval_for(&self, ttl: Duration) -> Duration {
        self.interval.unwrap_or(ttl / 3)
    }
}

/// How to take a lock: lease TTL, wait policy, retry backoff and auto-renewal.
///
/// Built with [`LockOptions::new`] and the `with_*` methods; checked by
/// [`LockOptions::validate`], which every backend calls before touching the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockOptions {
    ttl: Duration,
    wait: WaitPolicy,
    backoff: Backoff,
    auto_renew: Option<AutoRenew>,
    order: WaitOrder,
    error_patience: Duration,
}

/// How long a waiting acquire retries retryable errors (a server down or restarting)
/// by default: see [`LockOptions::with_error_patience`].
pub const DEFAULT_ERROR_PATIENCE: Duration = Duration::from_secs(30);

impl LockOptions {
    /// A lease of `ttl`, waiting forever, with the default backoff, no auto-renew and
    /// no waiting order asked for ([`WaitOrder::Any`]).
    pub fn new(ttl: Duration) -> Self {
        LockOptions {
            ttl,
            wait: WaitPolicy::Forever,
            backoff: Backoff::default(),
            auto_renew: None,
            order: WaitOrder::Any,
            error_patience: DEFAULT_ERROR_PATIENCE,
        }
    }

    /// Sets how long a waiting acquire keeps retrying while every attempt fails with a
    /// [retryable](crate::LockError::is_retryable) error (the server down, restarting
    /// or asking to retry): from the first failure of a run of failures, it retries with
    /// the options' backoff until this much has passed or the wait's deadline comes,
    /// whichever is first, then returns the last error. An attempt that reaches the
    /// server ends the run. The same on every backend; the default is
    /// [`DEFAULT_ERROR_PATIENCE`] (30 s). `Duration::ZERO` fails at the first error.
    /// A `try_acquire` (and [`WaitPolicy::NoWait`]) makes one attempt and never retries.
    pub fn with_error_patience(mut self, patience: Duration) -> Self {
        self.error_patience = patience;
        self
    }

    /// How long a waiting acquire retries retryable errors; see
    /// [`LockOptions::with_error_patience`].
    pub fn error_patience(&self) -> Duration {
        self.error_patience
    }

    /// Sets the order waiters are granted in; see [`WaitOrder`].
    pub fn with_order(mut self, order: WaitOrder) -> Self {
        self.order = order;
        self
    }

    /// The waiting order asked for.
    pub fn order(&self) -> WaitOrder {
        self.order
    }

    /// Sets the lease TTL.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets how long `acquire` waits.
    pub fn with_wait(mut self, wait: WaitPolicy) -> Self {
        self.wait = wait;
        self
    }

    /// Sets the backoff used by fallback polls and retries after transient errors.
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Turns on the renewal watchdog.
    pub fn with_auto_renew(mut self, auto_renew: AutoRenew) -> Self {
        self.auto_renew = Some(auto_renew);
        self
    }

    /// The lease TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The wait policy.
    pub fn wait(&self) -> WaitPolicy {
        self.wait
    }

    /// The retry backoff.
    pub fn backoff(&self) -> Backoff {
        self.backoff
    }

    /// The renewal watchdog's settings, if on.
    pub fn auto_renew(&self) -> Option<AutoRenew> {
        self.auto_renew
    }

    /// Checks every bound documented on this module's items.
    ///
    /// # Errors
    /// [`OptionsError`] naming the first bound broken.
    pub fn validate(&self) -> Result<(), OptionsError> {
        check_ttl(self.ttl)?;
        self.backoff.check().map_err(OptionsError::Backoff)?;
        if let Some(renew) = self.auto_renew {
            let interval = renew.interval_for(self.ttl);
            let max = self.ttl / 2;
            if interval < MIN_RENEW_INTERVAL || interval > max {
                return Err(OptionsError::RenewInterval {
                    interval,
                    min: MIN_RENEW_INTERVAL,
                    max,
                });
            }
            if renew.max_hold.is_some_and(|m| m.is_zero()) {
                return Err(OptionsError::AutoRenew(
                    "auto-renew max_hold must be above zero",
                ));
            }
        }
        Ok(())
    }
}

impl LockOptions {
    /// [`LockOptions::validate`], for a backend to call first thing: a refusal becomes
    /// [`crate::LockError::InvalidOptions`] naming `backend`.
    ///
    /// # Errors
    /// [`crate::LockError::InvalidOptions`] naming the first bound broken.
    pub fn validate_for(&self, backend: &'static str) -> Result<(), LockError> {
        self.validate()
            .map_err(|e| LockError::invalid_options(backend, e))
    }
}

impl LockOptions {
    /// Refuses [`WaitOrder::Fifo`] on a backend whose `fifo` capability is
    /// unsupported, so an explicit request for FIFO is never silently ignored.
    /// The generic primitives call it with the primitive's [`crate::Guarantees::fifo`].
    ///
    /// # Errors
    /// [`crate::LockError::Unsupported`] naming `backend` and its reason.
    pub fn check_order(
        &self,
        backend: &'static str,
        fifo: crate::Capability,
    ) -> Result<(), crate::LockError> {
        match (self.order, fifo) {
            (WaitOrder::Fifo, crate::Capability::Unsupported(reason)) => {
                Err(crate::LockError::Unsupported {
                    backend,
                    operation: FIFO_OPERATION,
                    reason,
                })
            }
            _ => Ok(()),
        }
    }
}

/// The operation named by the [`crate::LockError::Unsupported`] a backend without FIFO
/// waiting returns for [`WaitOrder::Fifo`].
pub const FIFO_OPERATION: &str = "FIFO waiting (WaitOrder::Fifo)";

impl Default for LockOptions {
    /// A 30 s lease, waiting forever.
    fn default() -> Self {
        LockOptions::new(Duration::from_secs(30))
    }
}

/// Checks a TTL against [`MIN_TTL`] and [`MAX_TTL`].
///
/// # Errors
/// [`OptionsError::TtlTooShort`] or [`OptionsError::TtlTooLong`].
pub fn check_ttl(ttl: Duration) -> Result<(), OptionsError> {
    if ttl < MIN_TTL {
        return Err(OptionsError::TtlTooShort { ttl, min: MIN_TTL });
    }
    if ttl > MAX_TTL {
        return Err(OptionsError::TtlTooLong { ttl, max: MAX_TTL });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_bounds() {
        assert!(LockOptions::new(Duration::ZERO).validate().is_err());
        assert!(LockOptions::new(Duration::from_micros(500))
            .validate()
            .is_err());
        assert!(LockOptions::new(Duration::from_secs(u64::MAX))
            .validate()
            .is_err());
        assert!(LockOptions::new(MIN_TTL).validate().is_ok());
        assert!(LockOptions::new(MAX_TTL).validate().is_ok());
    }

    #[test]
    fn enormous_wait_is_forever_not_a_panic() {
        let now = Instant::now();
        assert_eq!(WaitPolicy::Timeout(Duration::MAX).deadline_from(now), None);
        assert_eq!(WaitPolicy::NoWait.deadline_from(now), Some(now));
    }

    #[test]
    fn fifo_on_a_backend_without_it_is_refused_not_ignored() {
        let unsupported = crate::Capability::Unsupported("no queue");
        let fifo = LockOptions::default().with_order(WaitOrder::Fifo);
        assert!(matches!(
            fifo.check_order("test", unsupported),
            Err(crate::LockError::Unsupported {
                operation: FIFO_OPERATION,
                reason: "no queue",
                ..
            })
        ));
        assert!(fifo
            .check_order("test", crate::Capability::Supported)
            .is_ok());
        assert_eq!(LockOptions::default().order(), WaitOrder::Any);
        assert!(LockOptions::default()
            .check_order("test", unsupported)
            .is_ok());
    }

    #[tokio::test]
    async fn memory_refuses_fifo() {
        use crate::{LockKey, MemoryLock};
        let memory = MemoryLock::new();
        let lock = memory.lock();
        let key = LockKey::new("k").unwrap();
        let fifo = LockOptions::default().with_order(WaitOrder::Fifo);
        assert!(!lock.info().capabilities.mutex.fifo.is_supported());
        assert!(matches!(
            lock.acquire(&key, &fifo).await,
            Err(crate::LockError::Unsupported { .. })
        ));
        assert!(matches!(
            lock.try_acquire(&key, &fifo).await,
            Err(crate::LockError::Unsupported { .. })
        ));
        assert!(memory.store().get(&key).is_none());
    }

    #[test]
    fn auto_renew_must_fit_in_ttl() {
        let o = LockOptions::new(Duration::from_secs(1));
        assert!(o
            .clone()
            .with_auto_renew(AutoRenew::new())
            .validate()
            .is_ok());
        let bad = AutoRenew {
            interval: Some(Duration::from_secs(2)),
            max_hold: None,
        };
        assert!(o.with_auto_renew(bad).validate().is_err());
    }

    /// Issue 18, item 5: the shortest TTL accepted is accepted with the default
    /// auto-renew too, and a shorter one is refused naming the real minimum.
    #[test]
    fn the_minimum_ttl_is_accepted_with_default_auto_renew() {
        let renewed = |ttl| LockOptions::new(ttl).with_auto_renew(AutoRenew::new());
        assert_eq!(renewed(MIN_TTL).validate(), Ok(()));
        let below = MIN_TTL - Duration::from_millis(1);
        let refused = renewed(below).validate().expect_err("below the minimum");
        assert_eq!(
            refused,
            OptionsError::TtlTooShort {
                ttl: below,
                min: MIN_TTL
            }
        );
        assert!(refused.to_string().contains("10ms"), "{refused}");
        let too_fast = AutoRenew {
            interval: Some(MIN_RENEW_INTERVAL - Duration::from_nanos(1)),
            max_hold: None,
        };
        let refused = LockOptions::new(Duration::from_secs(1))
            .with_auto_renew(too_fast)
            .validate()
            .expect_err("below the minimum period");
        assert!(refused.to_string().contains("3.333333ms"), "{refused}");
    }
}
