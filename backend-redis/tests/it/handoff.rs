//! Hand-off on one node: a release publishes a wake-up only when someone waits, and
//! the waiters of one client on one key are served first come, first served, one
//! retrying at a time.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_api::{LockKey, LockOptions, WaitPolicy};
use distlock_redis::RedisLock;
use tokio::time::Instant;

fn options() -> LockOptions {
    LockOptions::new(Duration::from_secs(30))
        .with_wait(WaitPolicy::Timeout(Duration::from_secs(20)))
}

/// `calls` of `command` in `INFO commandstats` (commands run by scripts included).
async fn calls(raw: &mut redis::aio::MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(raw)
        .await
        .unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

async fn until_in_line(lock: &RedisLock, key: &LockKey, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while lock.waiters_in_line(key) < count {
        assert!(Instant::now() < deadline, "{count} waiters never lined up");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Before: every release ran a `PUBLISH`, waited on or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_release_publishes_nothing() {
    let h = common::start(1).await;
    let mut raw = h.raw(0).await;
    let lock = RedisLock::connect(&h.url()).await.unwrap();
    let k = LockKey::new("handoff/alone").unwrap();
    for _ in 0..20 {
        lock.lock()
            .acquire(&k, &options())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    assert_eq!(calls(&mut raw, "publish").await, 0);
    // With a waiter, the release does publish, and the waiter is granted.
    let guard = lock.lock().acquire(&k, &options()).await.unwrap();
    let waiter = tokio::spawn({
        let (lock, k) = (lock.clone(), k.clone());
        async move { lock.lock().acquire(&k, &options()).await?.release().await }
    });
    until_in_line(&lock, &k, 1).await;
    // The waiter at the front marks the key before it listens; wait for its retry.
    let names = distlock_redis::KeyNames::for_key(&k);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let marked: bool = redis::cmd("EXISTS")
            .arg(names.waiting())
            .query_async(&mut raw)
            .await
            .unwrap();
        if marked {
            break;
        }
        assert!(Instant::now() < deadline, "the waiter never marked the key");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    guard.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was woken")
        .unwrap()
        .unwrap();
    // Only the release someone waited for published: it deleted the mark with the
    // lock, so the waiter's own release, which nobody waited for, did not.
    assert_eq!(calls(&mut raw, "publish").await, 1);
    let marked: bool = redis::cmd("EXISTS")
        .arg(names.waiting())
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(!marked, "the release left the mark behind");
}

/// Before: a release woke every waiter of the client on the key and they raced, so
/// grants went in any order (2.4× max/min grants per task on a hot key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_one_client_are_served_in_arrival_order() {
    let h = common::start(1).await;
    let lock = RedisLock::connect(&h.url()).await.unwrap();
    let k = LockKey::new("handoff/line").unwrap();
    let holder = lock.lock().acquire(&k, &options()).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waits = Vec::new();
    for i in 0..6 {
        waits.push(tokio::spawn({
            let (lock, k, order) = (lock.clone(), k.clone(), order.clone());
            async move {
                let guard = lock.lock().acquire(&k, &options()).await?;
                order.lock().unwrap().push(i);
                guard.release().await
            }
        }));
        until_in_line(&lock, &k, i + 1).await;
    }
    holder.release().await.unwrap();
    for wait in waits {
        tokio::time::timeout(Duration::from_secs(20), wait)
            .await
            .expect("a waiter hung")
            .unwrap()
            .unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(lock.tracked_waiter_lines(), 0, "the line is gone");
    assert_eq!(lock.tracked_wakeup_channels(), 0, "unsubscribed");
}

/// Only the front of the line retries: a release costs one retry, not one per waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_only_the_next_waiter_of_the_client() {
    let h = common::start(1).await;
    let mut raw = h.raw(0).await;
    let lock = RedisLock::connect(&h.url()).await.unwrap();
    let k = LockKey::new("handoff/one-retry").unwrap();
    let holder = lock.lock().acquire(&k, &options()).await.unwrap();
    let waiters = 8;
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut guards = Vec::new();
    for i in 0..waiters {
        guards.push(tokio::spawn({
            let (lock, k, done_tx) = (lock.clone(), k.clone(), done_tx.clone());
            async move {
                let guard = lock.lock().acquire(&k, &options()).await.unwrap();
                done_tx.send(i).unwrap();
                guard
            }
        }));
        until_in_line(&lock, &k, i + 1).await;
    }
    let before = calls(&mut raw, "evalsha").await;
    holder.release().await.unwrap();
    let granted = done_rx.recv().await;
    // The release, then the front's grant, then the next front's one attempt (which
    // finds the key held): not one retry per waiter.
    let deadline = Instant::now() + Duration::from_secs(5);
    while calls(&mut raw, "evalsha").await < before + 3 {
        assert!(Instant::now() < deadline, "the next waiter never tried");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let spent = calls(&mut raw, "evalsha").await - before;
    assert!(
        spent <= 4,
        "{spent} scripts for one hand-off to {waiters} waiters"
    );
    assert_eq!(granted, Some(0));
    for g in guards {
        g.abort();
    }
}

/// An enormous backoff cap must not make the waiter's mark an invalid expiry (the
/// server would refuse it and the acquire fail): the waiter is woken and granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enormous_backoff_cap_still_waits_and_is_woken() {
    let h = common::start(1).await;
    let lock = RedisLock::connect(&h.url()).await.unwrap();
    let k = LockKey::new("handoff/huge-backoff").unwrap();
    let holder = lock.lock().acquire(&k, &options()).await.unwrap();
    let patient = options().with_backoff(distlock_api::Backoff::new(
        Duration::from_millis(1),
        Duration::MAX,
    ));
    let waiter = tokio::spawn({
        let (lock, k) = (lock.clone(), k.clone());
        async move { lock.lock().acquire(&k, &patient).await?.release().await }
    });
    let names = distlock_redis::KeyNames::for_key(&k);
    let mut raw = h.raw(0).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let marked: bool = redis::cmd("EXISTS")
            .arg(names.waiting())
            .query_async(&mut raw)
            .await
            .unwrap();
        if marked || waiter.is_finished() {
            break;
        }
        assert!(Instant::now() < deadline, "the waiter never marked the key");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    holder.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was woken")
        .unwrap()
        .unwrap();
}
