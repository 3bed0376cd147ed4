//! `observe::Observed` keeps the backend's waiting semantics: a transient failure of its
//! first, non-waiting try does not end an acquire that may wait.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_api::{
    async_trait, observe, BackendInfo, DistributedLock, ExtendOutcome, Lease, LockError, LockGuard,
    LockKey, LockOptions, MemoryLock, ReleaseOutcome, WaitPolicy,
};

/// The memory backend, except that its first `try_acquire` fails as a dropped
/// connection would.
#[derive(Debug)]
struct FlakyFirstTry {
    inner: MemoryLock,
    tries: AtomicUsize,
}

#[async_trait]
impl DistributedLock for FlakyFirstTry {
    fn info(&self) -> BackendInfo {
        self.inner.info()
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        if self.tries.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(LockError::connection("memory", "connection reset"));
        }
        self.inner.try_acquire(key, options).await
    }

    async fn acquire(&self, key: &LockKey, options: &LockOptions) -> Result<LockGuard, LockError> {
        self.inner.acquire(key, options).await
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.inner.release(lease).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        self.inner.extend(lease, ttl).await
    }
}

fn flaky() -> Arc<dyn DistributedLock> {
    observe::observed(Arc::new(FlakyFirstTry {
        inner: MemoryLock::new(),
        tries: AtomicUsize::new(0),
    }))
}

#[tokio::test]
async fn a_waiting_acquire_survives_a_transient_first_try() {
    let key = LockKey::new("observe/flaky").expect("valid key");
    let waiting = LockOptions::new(Duration::from_secs(5))
        .with_wait(WaitPolicy::Timeout(Duration::from_secs(5)));
    let guard = flaky().acquire(&key, &waiting).await.expect("waits on");
    guard.release().await.expect("releases");
}

#[tokio::test]
async fn a_try_acquire_still_reports_the_failure() {
    let key = LockKey::new("observe/flaky-try").expect("valid key");
    let err = flaky()
        .try_acquire(&key, &LockOptions::new(Duration::from_secs(5)))
        .await
        .expect_err("no wait, no retry");
    assert!(matches!(err, LockError::Connection { .. }), "{err}");
}
