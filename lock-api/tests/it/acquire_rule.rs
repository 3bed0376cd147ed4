//! The one acquire rule every backend gets from `Client`: checks before the engine is
//! reached, retries of retryable errors under the error patience, no retry for a try,
//! and a wait cut at its deadline plus the grace whatever the engine does.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_api::backend::{Engine, Grant, Request};
use distlock_api::{
    async_trait, BackendInfo, Capability, Client, ExtendOutcome, Lease, LockError, LockKey,
    LockOptions, MemoryLock, Primitive, ReleaseOutcome, WaitOrder, WaitPolicy,
};
use tokio::time::Instant;

/// How an engine call misbehaves.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// The first call fails as a dropped connection would.
    FirstFails,
    /// Every call fails as a dropped connection would.
    AlwaysFails,
    /// Every call hangs, as on a paused server.
    Hangs,
}

/// The memory engine behind a fault, counting the acquire calls that reach it.
#[derive(Debug)]
struct Flaky {
    inner: MemoryLock,
    calls: AtomicUsize,
    fault: Fault,
}

#[async_trait]
impl Engine for Flaky {
    fn info(&self) -> BackendInfo {
        let mut info = Engine::info(&self.inner);
        info.capabilities.semaphore.offered = Capability::Unsupported("not in this test");
        info
    }

    async fn acquire(&self, request: &Request<'_>) -> Result<Option<Grant>, LockError> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        match (self.fault, call) {
            (Fault::Hangs, _) => std::future::pending().await,
            (Fault::AlwaysFails, _) | (Fault::FirstFails, 0) => {
                Err(LockError::connection("memory", "connection reset"))
            }
            _ => self.inner.acquire(request).await,
        }
    }

    async fn release(
        &self,
        primitive: Primitive,
        lease: &Lease,
    ) -> Result<ReleaseOutcome, LockError> {
        self.inner.release(primitive, lease).await
    }

    async fn extend(
        &self,
        primitive: Primitive,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        self.inner.extend(primitive, lease, ttl).await
    }
}

fn flaky(fault: Fault) -> (Client, Arc<Flaky>) {
    let engine = Arc::new(Flaky {
        inner: MemoryLock::new(),
        calls: AtomicUsize::new(0),
        fault,
    });
    (Client::from_engine(engine.clone()), engine)
}

fn key() -> LockKey {
    LockKey::new("rule").expect("valid key")
}

fn waiting(wait: WaitPolicy) -> LockOptions {
    LockOptions::new(Duration::from_secs(5)).with_wait(wait)
}

#[tokio::test]
async fn a_waiting_acquire_retries_a_transient_first_failure() {
    let (client, engine) = flaky(Fault::FirstFails);
    let options = waiting(WaitPolicy::Timeout(Duration::from_secs(5)));
    let guard = client
        .lock()
        .acquire(&key(), &options)
        .await
        .expect("retried");
    assert_eq!(engine.calls.load(Ordering::SeqCst), 2);
    guard.release().await.expect("releases");
}

#[tokio::test]
async fn a_try_reports_the_failure_without_retrying() {
    let (client, engine) = flaky(Fault::FirstFails);
    let err = client
        .lock()
        .try_acquire(&key(), &waiting(WaitPolicy::Forever))
        .await
        .expect_err("no wait, no retry");
    assert!(matches!(err, LockError::Connection { .. }), "{err}");
    assert_eq!(engine.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_forever_wait_gives_up_after_the_error_patience() {
    let (client, engine) = flaky(Fault::AlwaysFails);
    let patience = Duration::from_secs(3);
    let options = waiting(WaitPolicy::Forever).with_error_patience(patience);
    let start = Instant::now();
    let err = client
        .lock()
        .acquire(&key(), &options)
        .await
        .expect_err("the engine never answers well");
    assert!(matches!(err, LockError::Connection { .. }), "{err}");
    let took = start.elapsed();
    assert!(
        took >= patience && took < patience + Duration::from_secs(1),
        "gave up after {took:?}, patience {patience:?}"
    );
    assert!(engine.calls.load(Ordering::SeqCst) > 2, "it did not retry");
}

#[tokio::test(start_paused = true)]
async fn a_deadline_ends_the_retries_before_the_patience() {
    let (client, _) = flaky(Fault::AlwaysFails);
    let options = waiting(WaitPolicy::Timeout(Duration::from_secs(1)));
    let start = Instant::now();
    let err = client
        .lock()
        .acquire(&key(), &options)
        .await
        .expect_err("fails");
    assert!(matches!(err, LockError::Connection { .. }), "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}

/// An engine that never answers is cut at the deadline plus the grace, with its
/// "no answer" error, since nothing said the key was held.
#[tokio::test(start_paused = true)]
async fn a_silent_engine_is_cut_at_the_deadline() {
    let (client, _) = flaky(Fault::Hangs);
    let wait = Duration::from_millis(200);
    let start = Instant::now();
    let err = client
        .lock()
        .acquire(&key(), &waiting(WaitPolicy::Timeout(wait)))
        .await
        .expect_err("cut");
    assert!(matches!(err, LockError::Connection { .. }), "{err}");
    assert!(err.to_string().contains("did not answer"), "{err}");
    assert!(start.elapsed() < wait + Duration::from_millis(100));
}

/// Capabilities decide refusals before anything reaches the engine: FIFO where the
/// primitive has none, and a primitive the backend does not offer.
#[tokio::test]
async fn unsupported_claims_are_refused_before_the_engine() {
    let (client, engine) = flaky(Fault::Hangs);
    let fifo = waiting(WaitPolicy::Forever).with_order(WaitOrder::Fifo);
    let err = client
        .lock()
        .acquire(&key(), &fifo)
        .await
        .expect_err("no FIFO");
    assert!(matches!(err, LockError::Unsupported { .. }), "{err}");
    let plain = waiting(WaitPolicy::Forever);
    let err = client
        .semaphore()
        .acquire(&key(), 2, &plain)
        .await
        .expect_err("no semaphore");
    assert!(
        matches!(
            err,
            LockError::Unsupported {
                reason: "not in this test",
                ..
            }
        ),
        "{err}"
    );
    let err = client
        .semaphore()
        .try_acquire(&key(), 0, &plain)
        .await
        .expect_err("refused");
    assert!(matches!(err, LockError::Unsupported { .. }), "{err}");
    assert_eq!(engine.calls.load(Ordering::SeqCst), 0);
}
