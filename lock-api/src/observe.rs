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
//!   span;
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
    LockOptions, ReleaseOutcome,
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
/// It measures only: every call goes to the inner backend once, unchanged, so a wrapped
/// backend behaves exactly as the bare one. Contention is what the backend reports: a
/// grant after the key was found held ([`LockGuard::contended`]) or a
/// [`LockError::Timeout`]. Release, extend and inspect go straight to the inner backend
/// (the guard records release and extend).
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
            let may_wait = options.wait().deadline_from(start) != Some(start);
            let result = self.inner.acquire(key, options).await;
            let elapsed = start.elapsed();
            // Contention as the backend saw it: a grant after meeting the key held, or
            // a wait that ran out.
            let met_held = match &result {
                Ok(guard) => guard.contended(),
                Err(error) => matches!(error, LockError::Timeout { .. }),
            };
            if met_held {
                contended(backend);
                if may_wait {
                    metrics::histogram!(WAIT_SECONDS, BACKEND_LABEL => backend).record(elapsed);
                }
            }
            if result.is_ok() {
                acquired(backend, elapsed);
            }
            result
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
