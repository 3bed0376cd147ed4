//! `observe::Observed` keeps the backend's waiting semantics: it adds no call of its own,
//! so a failing or silent `try_acquire` does not change a wrapped `acquire`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_api::{
    async_trait, observe, BackendInfo, DistributedLock, ExtendOutcome, Lease, LockError, LockGuard,
    LockKey, LockOptions, MemoryLock, ReleaseOutcome, WaitPolicy,
};

/// The memory backend, except that its first `try_acquire` fails as a dropped
/// connection would, or never answers, as a paused server would.
#[derive(Debug)]
struct FlakyFirstTry {
    inner: MemoryLock,
    tries: AtomicUsize,
    /// The first try never answers, instead of failing.
    hang: bool,
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
        match self.tries.fetch_add(1, Ordering::SeqCst) {
            0 if self.hang => std::future::pending::<()>().await,
            0 => return Err(LockError::connection("memory", "connection reset")),
            _ => {}
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
    flaky_with(false)
}

fn flaky_with(hang: bool) -> Arc<dyn DistributedLock> {
    observe::observed(Arc::new(FlakyFirstTry {
        inner: MemoryLock::new(),
        tries: AtomicUsize::new(0),
        hang,
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

/// The wrapper measures only: an acquire reaches the backend once, as an acquire, so a
/// wrapped backend waits (and fails) exactly as the bare one does. Here the backend's
/// `try_acquire` would never answer; the wrapper must not call it.
#[tokio::test]
async fn an_acquire_reaches_the_backend_only_as_its_acquire() {
    let key = LockKey::new("observe/hang").expect("valid key");
    let backend = Arc::new(FlakyFirstTry {
        inner: MemoryLock::new(),
        tries: AtomicUsize::new(0),
        hang: true,
    });
    let wrapped = observe::observed(backend.clone());
    let options = LockOptions::new(Duration::from_secs(5))
        .with_wait(WaitPolicy::Timeout(Duration::from_millis(200)));
    let guard = tokio::time::timeout(Duration::from_secs(5), wrapped.acquire(&key, &options))
        .await
        .expect("the wrapped acquire hung")
        .expect("a free key is granted");
    assert!(!guard.contended());
    assert_eq!(
        backend.tries.load(Ordering::SeqCst),
        0,
        "the wrapper tried first"
    );
    guard.release().await.expect("releases");
}
