//! The clients of backends that still implement the public primitive traits
//! themselves, bundled as a [`Client`] over their one connection.
//!
//! Transitional: a backend leaves this file when it implements
//! [`distlock_api::backend::Engine`], and the file goes with the last one.

use std::sync::Arc;
use std::time::Duration;

use distlock_api::observe::{BACKEND_LABEL, CONTENTION_TOTAL, WAIT_SECONDS};
use distlock_api::{
    async_trait, BackendInfo, Client, DistributedLock, ExtendOutcome, KeyStatus, Lease, LockError,
    LockGuard, LockKey, LockOptions, ReleaseOutcome,
};
use tokio::time::Instant;
use tracing::Instrument as _;

/// A client of `lock`'s connection with its other primitives. `lock` is measured as
/// the generic primitives measure theirs; the others, as before, are not.
pub(crate) fn client<L, S, R, E>(
    lock: L,
    semaphore: Option<S>,
    rw_lock: Option<R>,
    election: Option<E>,
) -> Client
where
    L: DistributedLock + 'static,
    S: distlock_api::DistributedSemaphore + 'static,
    R: distlock_api::DistributedRwLock + 'static,
    E: distlock_api::LeaderElection + 'static,
{
    Client::from_parts(
        Arc::new(Observed {
            inner: Arc::new(lock),
        }),
        semaphore.map(|s| Arc::new(s) as _),
        rw_lock.map(|r| Arc::new(r) as _),
        election.map(|e| Arc::new(e) as _),
    )
}

/// A mutex whose `acquire` and `try_acquire` record metrics and spans; every call goes
/// to the inner backend once, unchanged.
#[derive(Debug)]
struct Observed {
    inner: Arc<dyn DistributedLock>,
}

fn acquired(backend: &'static str, took: Duration) {
    metrics::histogram!(distlock_api::observe::ACQUIRE_SECONDS, BACKEND_LABEL => backend)
        .record(took);
}

fn contended(backend: &'static str) {
    metrics::counter!(CONTENTION_TOTAL, BACKEND_LABEL => backend).increment(1);
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
