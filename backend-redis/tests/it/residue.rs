//! What locks leave on the server once they ended: nothing, after their TTL and the
//! fencing record's margin. Keys stay O(locks held + keys waited on).

use crate::common;

use std::time::Duration;

use distlock_api::{LockKey, LockOptions, WaitPolicy};
use distlock_redis::RedisLock;

/// Before: every key ever locked on a single node left `{K}:fence` behind for ever, so
/// a service locking per entity grew Redis without bound.
async fn ended_locks_leave_nothing(nodes: usize) {
    let h = common::start(nodes).await;
    let client = RedisLock::connect(&h.url()).await.unwrap();
    let lock = client.lock();
    let ttl = Duration::from_secs(2);
    let options = LockOptions::new(ttl).with_wait(WaitPolicy::Timeout(Duration::from_secs(20)));
    // Many distinct keys, locked and released.
    for i in 0..300 {
        let k = LockKey::new(format!("residue/{i}")).unwrap();
        let guard = lock.acquire(&k, &options).await.unwrap();
        guard.release().await.unwrap();
    }
    // A waited-on key, handed over: marks it as waited on.
    let hot = LockKey::new("residue/hot").unwrap();
    let holder = lock.acquire(&hot, &options).await.unwrap();
    let waiter = tokio::spawn({
        let (lock, hot, options) = (lock.clone(), hot.clone(), options.clone());
        async move { lock.acquire(&hot, &options).await?.release().await }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while client.waiters_in_line(&hot) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the waiter never waited"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    holder.release().await.unwrap();
    waiter.await.unwrap().unwrap();
    // A lock that ends by expiring, without a release.
    let expiring = lock
        .acquire(&LockKey::new("residue/expiring").unwrap(), &options)
        .await
        .unwrap();
    std::mem::forget(expiring);
    for node in 0..nodes {
        common::until_nothing_left(&mut h.raw(node).await, ttl).await;
    }
    assert_eq!(client.tracked_waiter_lines(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_node_locks_that_ended_leave_nothing_behind() {
    ended_locks_leave_nothing(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_locks_that_ended_leave_nothing_behind() {
    ended_locks_leave_nothing(3).await;
}
