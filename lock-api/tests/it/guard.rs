//! Guard behaviour that the conformance kit cannot see from outside: the watchdog's
//! life cycle, `Drop` without a runtime, and `with_lock`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_api::backend::prelude::*;
use distlock_api::{
    async_trait, with_lock, AutoRenew, BackendInfo, DistributedLock, ExtendOutcome, Lease,
    LockError, LockGuard, LockKey, LockOptions, MemoryLock, NotHeldReason, ReleaseOutcome,
    WaitPolicy,
};

fn key(name: &str) -> LockKey {
    LockKey::new(name).unwrap()
}

/// Counts the extends that reach the wrapped backend.
#[derive(Debug)]
struct CountingExtends {
    inner: Arc<dyn DistributedLock>,
    extends: AtomicUsize,
}

#[async_trait]
impl DistributedLock for CountingExtends {
    fn info(&self) -> BackendInfo {
        self.inner.info()
    }
    async fn try_acquire(
        &self,
        k: &LockKey,
        o: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        self.inner.try_acquire(k, o).await
    }
    async fn acquire(&self, k: &LockKey, o: &LockOptions) -> Result<LockGuard, LockError> {
        self.inner.acquire(k, o).await
    }
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.inner.release(lease).await
    }
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        self.extends.fetch_add(1, Ordering::SeqCst);
        self.inner.extend(lease, ttl).await
    }
}

#[tokio::test]
async fn watchdog_renews_then_stops_at_once_on_release() {
    let counting = Arc::new(CountingExtends {
        inner: MemoryLock::new().lock(),
        extends: AtomicUsize::new(0),
    });
    let ttl = Duration::from_millis(150);
    // The guard's release goes through the backend handle the backend gave it, so
    // renew through the counting wrapper by building the guard around it.
    let raw = counting
        .inner
        .acquire(&key("w"), &LockOptions::new(ttl))
        .await
        .unwrap();
    let lease = raw.lease().clone();
    std::mem::forget(raw);
    let guard = LockGuard::new(
        lease.clone(),
        distlock_api::LeaseMonitor::new(lease.acquired_at() + ttl),
        counting.clone(),
        Some(AutoRenew::new()),
    );
    tokio::time::sleep(ttl * 2).await;
    let renewed = counting.extends.load(Ordering::SeqCst);
    assert!(renewed >= 3, "only {renewed} renewals in two TTLs");
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    let at_release = counting.extends.load(Ordering::SeqCst);
    tokio::time::sleep(ttl * 2).await;
    assert_eq!(
        counting.extends.load(Ordering::SeqCst),
        at_release,
        "the watchdog outlived release"
    );
}

#[test]
fn drop_after_the_runtime_is_gone_does_not_panic() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let memory = MemoryLock::new();
    let locks = memory.lock();
    let guard = runtime
        .block_on(locks.acquire(
            &key("d"),
            &LockOptions::new(Duration::from_secs(5)).with_auto_renew(AutoRenew::new()),
        ))
        .unwrap();
    drop(runtime);
    drop(guard);
    // The release could not run: the lease stays until its TTL, as documented.
    assert!(memory.store().get(&key("d")).is_some());
}

#[tokio::test]
async fn extend_after_expiry_marks_the_guard_lost() {
    let locks = MemoryLock::new().lock();
    let guard = locks
        .acquire(&key("e"), &LockOptions::new(Duration::from_millis(20)))
        .await
        .unwrap();
    guard.lost().await;
    match guard.extend(Duration::from_secs(1)).await {
        Ok(ExtendOutcome::Lost) => {}
        other => panic!("extend after expiry gave {other:?}"),
    }
    assert_eq!(guard.state(), distlock_api::LeaseState::Lost);
}

#[tokio::test]
async fn with_lock_renews_for_long_work_and_releases() {
    let locks = MemoryLock::new().lock();
    let k = key("work");
    // Work of four TTLs; the TTL leaves a renewal (every third of it) room for a
    // scheduler stall on a loaded machine (90 ms lost the lease at load 14).
    let options = LockOptions::new(Duration::from_millis(750));
    let token = with_lock(&*locks, &k, &options, |token| async move {
        tokio::time::sleep(Duration::from_secs(3)).await;
        token
    })
    .await
    .unwrap();
    assert!(
        token.is_some_and(|t| t.get() > 0),
        "memory grants carry a token"
    );
    let free = locks
        .try_acquire(&k, &options.with_wait(WaitPolicy::NoWait))
        .await
        .unwrap();
    assert!(free.is_some(), "with_lock did not release");
}

#[tokio::test]
async fn with_lock_stops_the_work_when_the_lock_is_lost() {
    let memory = MemoryLock::new();
    let locks = memory.lock();
    let k = key("lost-work");
    let finished = Arc::new(AtomicUsize::new(0));
    let crash = memory.clone();
    let done = finished.clone();
    let result = with_lock(
        &*locks,
        &k,
        &LockOptions::new(Duration::from_millis(90)),
        |_| async move {
            // The process loses its connection: renewals fail from now on.
            crash.simulate_crash();
            tokio::time::sleep(Duration::from_secs(5)).await;
            done.fetch_add(1, Ordering::SeqCst);
        },
    )
    .await;
    assert!(
        matches!(
            result,
            Err(LockError::NotHeld {
                reason: NotHeldReason::Lost,
                ..
            })
        ),
        "{result:?}"
    );
    assert_eq!(
        finished.load(Ordering::SeqCst),
        0,
        "the work ran on after the loss"
    );
}

/// Every extend fails with the error `fail` makes.
#[derive(Debug)]
struct FailingExtends {
    inner: Arc<dyn DistributedLock>,
    fail: fn() -> LockError,
}

#[async_trait]
impl DistributedLock for FailingExtends {
    fn info(&self) -> BackendInfo {
        self.inner.info()
    }
    async fn try_acquire(
        &self,
        k: &LockKey,
        o: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        self.inner.try_acquire(k, o).await
    }
    async fn acquire(&self, k: &LockKey, o: &LockOptions) -> Result<LockGuard, LockError> {
        self.inner.acquire(k, o).await
    }
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.inner.release(lease).await
    }
    async fn extend(&self, _: &Lease, _: Duration) -> Result<ExtendOutcome, LockError> {
        Err((self.fail)())
    }
}

/// A guard renewed through `fail`ing extends, with a TTL of `ttl`.
async fn guard_failing_with(fail: fn() -> LockError, ttl: Duration) -> LockGuard {
    let failing = Arc::new(FailingExtends {
        inner: MemoryLock::new().lock(),
        fail,
    });
    let raw = failing
        .inner
        .acquire(&key("failing"), &LockOptions::new(ttl))
        .await
        .unwrap();
    let lease = raw.lease().clone();
    std::mem::forget(raw);
    LockGuard::new(
        lease.clone(),
        distlock_api::LeaseMonitor::new(lease.acquired_at() + ttl),
        failing,
        Some(AutoRenew::new()),
    )
}

#[tokio::test]
async fn watchdog_gives_up_at_once_on_an_error_retrying_cannot_fix() {
    let ttl = Duration::from_secs(3);
    // Refused for good: lost at the first renewal (TTL/3), long before the deadline.
    let refused = guard_failing_with(
        || LockError::backend_error("failing", "WRONGTYPE the key holds something else"),
        ttl,
    )
    .await;
    tokio::time::timeout(ttl * 2 / 3, refused.lost())
        .await
        .expect("a permanent renewal error did not mark the lease lost before its deadline");
    assert!(tokio::time::Instant::now() < refused.valid_until());
    assert_eq!(refused.state(), distlock_api::LeaseState::Lost);
    // Refused for now: suspect and retrying, still not lost before the deadline.
    let busy = guard_failing_with(|| LockError::transient("failing", "BUSY try again"), ttl).await;
    let deadline = busy.valid_until();
    let poll_until = tokio::time::Instant::now() + ttl * 2 / 3;
    while busy.state() != distlock_api::LeaseState::Suspect {
        assert!(
            tokio::time::Instant::now() < poll_until,
            "a transient renewal error did not make the lease suspect"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(tokio::time::Instant::now() < deadline);
    assert_eq!(busy.state(), distlock_api::LeaseState::Suspect);
}
