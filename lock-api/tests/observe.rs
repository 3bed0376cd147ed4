//! The metrics of `observe`, read back through a real `metrics` recorder, on the memory
//! backend: acquire, contention, wait, renewals, renewal failures, hold time and loss.
//!
//! One test per binary: the recorder is process-global.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use distlock_api::observe::{self, BACKEND_LABEL};
use distlock_api::{
    AutoRenew, DistributedLock, LeaseState, LockError, LockKey, LockOptions, MemoryLock, WaitPolicy,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;

/// Running totals: a snapshot drains counters and histograms, so each read adds the
/// new counts and samples to what earlier reads saw.
struct Totals {
    snapshotter: Snapshotter,
    values: HashMap<String, u64>,
}

impl Totals {
    fn read(&mut self) -> HashMap<String, u64> {
        for (name, n) in drain(&self.snapshotter) {
            *self.values.entry(name).or_default() += n;
        }
        self.values.clone()
    }
}

/// Counter increments and histogram samples by metric name since the last snapshot,
/// checking every metric carries exactly the `backend="memory"` label.
fn drain(snapshotter: &Snapshotter) -> HashMap<String, u64> {
    let mut values = HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let (kind, key) = key.into_parts();
        let labels: Vec<_> = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        assert_eq!(
            labels,
            vec![(BACKEND_LABEL.to_owned(), "memory".to_owned())],
            "{}",
            key.name()
        );
        let n = match (kind, value) {
            (MetricKind::Counter, DebugValue::Counter(n)) => n,
            (MetricKind::Histogram, DebugValue::Histogram(samples)) => samples.len() as u64,
            other => panic!("unexpected metric {other:?}"),
        };
        values.insert(key.name().to_owned(), n);
    }
    values
}

fn get(values: &HashMap<String, u64>, name: &str) -> u64 {
    values.get(name).copied().unwrap_or(0)
}

#[tokio::test]
async fn acquire_contention_renewal_and_loss_are_counted() {
    let recorder = DebuggingRecorder::new();
    let mut totals = Totals {
        snapshotter: recorder.snapshotter(),
        values: HashMap::new(),
    };
    recorder
        .install()
        .expect("the only recorder of this binary");

    let memory = MemoryLock::new();
    let locks: Arc<dyn DistributedLock> = memory.lock();
    let key = LockKey::new("observe/one").unwrap();
    let ttl = Duration::from_secs(5);

    // Uncontended acquire.
    let held = locks
        .acquire(&key, &LockOptions::new(ttl))
        .await
        .expect("free key");
    let v = totals.read();
    assert_eq!(get(&v, observe::ACQUIRE_SECONDS), 1);
    assert_eq!(get(&v, observe::CONTENTION_TOTAL), 0);
    // Inspect reaches the backend.
    assert!(locks.inspect(&key).await.expect("memory inspects").held);

    // Contention: a failed try, and a bounded wait that times out.
    assert!(locks
        .try_acquire(&key, &LockOptions::new(ttl))
        .await
        .unwrap()
        .is_none());
    let waiting = LockOptions::new(ttl).with_wait(WaitPolicy::Timeout(Duration::from_millis(50)));
    match locks.acquire(&key, &waiting).await {
        Err(LockError::Timeout { waited, .. }) => assert!(waited >= Duration::from_millis(50)),
        other => panic!("expected a timeout, got {other:?}"),
    }
    let v = totals.read();
    assert_eq!(get(&v, observe::CONTENTION_TOTAL), 2);
    assert_eq!(get(&v, observe::WAIT_SECONDS), 1);
    assert_eq!(get(&v, observe::ACQUIRE_SECONDS), 1);

    // A waiter granted after the release records a wait and an acquire.
    let waiter = {
        let locks = locks.clone();
        let key = key.clone();
        tokio::spawn(async move { locks.acquire(&key, &LockOptions::new(ttl)).await })
    };
    // This test's runtime has one thread: yielding runs the spawned waiter up to its
    // wait on the held key (the memory backend's attempt does not await).
    for _ in 0..3 {
        tokio::task::yield_now().await;
    }
    assert!(!waiter.is_finished(), "the waiter did not wait");
    held.release().await.expect("release");
    let second = waiter.await.unwrap().expect("granted after release");
    assert!(second.contended(), "the backend did not report the wait");
    let v = totals.read();
    assert_eq!(get(&v, observe::CONTENTION_TOTAL), 3);
    assert_eq!(get(&v, observe::WAIT_SECONDS), 2);
    assert_eq!(get(&v, observe::ACQUIRE_SECONDS), 2);
    assert_eq!(get(&v, observe::HOLD_SECONDS), 1);
    assert_eq!(get(&v, observe::LOST_TOTAL), 0);
    drop(second);

    // Renewals by the watchdog.
    let renewing = LockOptions::new(Duration::from_millis(150)).with_auto_renew(AutoRenew::new());
    let key2 = LockKey::new("observe/two").unwrap();
    let guard = locks.acquire(&key2, &renewing).await.expect("free key");
    let monitor = guard.monitor();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while monitor.renewals() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "no renewals");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let v = totals.read();
    assert!(get(&v, observe::RENEWALS_TOTAL) >= 2, "{v:?}");
    assert_eq!(get(&v, observe::RENEWAL_FAILURES_TOTAL), 0);

    // Loss: the client crashes, renewals fail until the lease runs out.
    memory.simulate_crash();
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the lease is lost within its ttl");
    assert_eq!(guard.state(), LeaseState::Lost);
    drop(guard);
    let v = totals.read();
    assert!(get(&v, observe::RENEWAL_FAILURES_TOTAL) >= 1, "{v:?}");
    assert_eq!(get(&v, observe::LOST_TOTAL), 1);
    assert_eq!(get(&v, observe::HOLD_SECONDS), 3);
}
