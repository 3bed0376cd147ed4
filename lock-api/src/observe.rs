//! Metrics and tracing for every backend.
//!
//! Metrics go through the [`metrics`] facade and tracing through [`tracing`]: both are
//! no-ops until the application installs a recorder or subscriber, so a library user
//! pays nothing for them. Every metric carries one label, [`BACKEND_LABEL`] (`memory`,
//! `redis`, …), and never the key, so cardinality stays at one series per backend.
//!
//! Where each is recorded:
//! - [`Observed`] (which `distlock::connect` wraps around every backend) records
//!   [`ACQUIRE_SECONDS`], [`WAIT_SECONDS`] and [`CONTENTION_TOTAL`], in the `acquire`
//!   and `wait` spans;
//! - [`crate::LockGuard`] records [`HOLD_SECONDS`] and [`LOST_TOTAL`] when it ends
//!   (released or dropped), in the `release` and `lost` spans, and
//!   [`RENEWALS_TOTAL`] / [`RENEWAL_FAILURES_TOTAL`] for explicit extends, in the
//!   `extend` span;
//! - the auto-renew watchdog records [`RENEWALS_TOTAL`] / [`RENEWAL_FAILURES_TOTAL`]
//!   in the `renew` span.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use tracing::Instrument as _;

use crate::{
    BackendInfo, DistributedLock, ExtendOutcome, KeyStatus, Lease, LockError, LockGuard, LockKey,
    LockOptions, ReleaseOutcome, WaitPolicy,
};

use crate::metrics::{acquired, contended};
pub use crate::metrics::{
    ACQUIRE_SECONDS, BACKEND_LABEL, CONTENTION_TOTAL, HOLD_SECONDS, LOST_TOTAL, RENEWALS_TOTAL,
    RENEWAL_FAILURES_TOTAL, WAIT_SECONDS,
};

/// Wraps `inner` so its acquires are measured and traced. `distlock::connect` does this
/// for every backend it returns.
pub fn observed(inner: Arc<dyn DistributedLock>) -> Arc<dyn DistributedLock> {
    Arc::new(Observed { inner })
}

/// A backend whose `acquire` and `try_acquire` record metrics and spans.
///
/// An `acquire` that may wait first tries once without waiting, so that contention and
/// wait time are measured the same way on every backend; a contended acquire thus costs
/// one extra round trip, an uncontended one none. A `WaitPolicy::Timeout` bounds that first try
/// too: if it is unanswered when the wait runs out, the call fails with
/// [`LockError::Connection`]. Release, extend and inspect go
/// straight to the inner backend (the guard records release and extend).
#[derive(Debug)]
pub struct Observed {
    inner: Arc<dyn DistributedLock>,
}

#[async_trait]
impl DistributedLock for Observed {
    fn info(&self) -> BackendInfo {
        self.inner.info()
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        let backend = self.inner.info().name;
        let span = tracing::debug_span!("acquire", backend, key = %key, wait = "no");
        async {
            let start = Instant::now();
            let granted = self.inner.try_acquire(key, options).await?;
            match &granted {
                Some(_) => acquired(backend, start.elapsed()),
                None => contended(backend),
            }
            Ok(granted)
        }
        .instrument(span)
        .await
    }

    async fn acquire(&self, key: &LockKey, options: &LockOptions) -> Result<LockGuard, LockError> {
        let backend = self.inner.info().name;
        let span = tracing::debug_span!("acquire", backend, key = %key, wait = ?options.wait());
        async {
            let start = Instant::now();
            if options.wait() == WaitPolicy::NoWait {
                return match self.inner.acquire(key, options).await {
                    Ok(guard) => {
                        acquired(backend, start.elapsed());
                        Ok(guard)
                    }
                    Err(e @ LockError::Timeout { .. }) => {
                        contended(backend);
                        Err(e)
                    }
                    Err(e) => Err(e),
                };
            }
            // The wait bounds the whole call, this first try included: a server that
            // does not answer must not hold the caller past it (backends' attempts are
            // cancel-safe, so dropping this one undoes any late grant).
            let first = self.inner.try_acquire(key, options);
            let first = match options.wait() {
                // A zero wait is one try, bounded by the backend as `NoWait` is.
                WaitPolicy::Timeout(limit) if !limit.is_zero() => {
                    match tokio::time::timeout(limit, first).await {
                        Ok(tried) => tried,
                        Err(_) => {
                            return Err(LockError::connection(
                                backend,
                                format!("no answer within the wait of {limit:?}; whether the lock is held is unknown"),
                            ))
                        }
                    }
                }
                _ => first.await,
            };
            let transient = match first {
                Ok(Some(guard)) => {
                    acquired(backend, start.elapsed());
                    return Ok(guard);
                }
                Ok(None) => {
                    contended(backend);
                    None
                }
                // Transient (a server restarting, a slow node): the backend's own wait
                // retries those, so go on waiting rather than fail fast.
                Err(error) if error.is_retryable() => {
                    tracing::debug!(%error, "first try failed; waiting");
                    Some(error)
                }
                Err(error) => return Err(error),
            };
            let remaining = match options.wait() {
                WaitPolicy::Timeout(limit) => match limit.checked_sub(start.elapsed()) {
                    Some(left) if !left.is_zero() => WaitPolicy::Timeout(left),
                    // The wait is used up: another try could outlast it.
                    _ => {
                        return Err(transient.unwrap_or_else(|| LockError::Timeout {
                            backend,
                            key: key.clone(),
                            waited: start.elapsed(),
                        }))
                    }
                },
                other => other,
            };
            let waiting = options.clone().with_wait(remaining);
            let waited = self
                .inner
                .acquire(key, &waiting)
                .instrument(tracing::debug_span!("wait", backend, key = %key))
                .await;
            let elapsed = start.elapsed();
            match waited {
                Ok(guard) => {
                    metrics::histogram!(WAIT_SECONDS, BACKEND_LABEL => backend).record(elapsed);
                    acquired(backend, elapsed);
                    Ok(guard)
                }
                Err(LockError::Timeout {
                    backend: b, key, ..
                }) => {
                    metrics::histogram!(WAIT_SECONDS, BACKEND_LABEL => backend).record(elapsed);
                    Err(LockError::Timeout {
                        backend: b,
                        key,
                        waited: elapsed,
                    })
                }
                Err(e) => Err(e),
            }
        }
        .instrument(span)
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.inner.release(lease).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        self.inner.extend(lease, ttl).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<KeyStatus, LockError> {
        self.inner.inspect(key).await
    }
}
