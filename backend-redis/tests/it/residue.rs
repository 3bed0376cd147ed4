//! What locks leave on the server once they ended: nothing, after their TTL and the
//! fencing record's margin. Keys stay O(locks held + keys waited on).

use crate::common;

use std::time::Duration;

use distlock_api::{Candidate, FencingToken, LockKey, LockOptions, RwMode, WaitPolicy};
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

/// Before: every key a semaphore, read-write lock or election ever used left its own
/// `{K}:<kind>:fence` counter behind for the TTL plus 10 s, so a service taking a fresh
/// key per job kept one counter per job of the last half-minute. Now their grants take
/// the mutex's one counter: once released, nothing of theirs is left, and every grant's
/// token is above the one before, whatever its primitive and key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_permits_reads_writes_and_terms_leave_only_the_server_counter() {
    let h = common::start(1).await;
    let client = RedisLock::connect(&h.url()).await.unwrap();
    let (semaphore, rw, election) = (client.semaphore(), client.rw_lock(), client.election());
    let options = LockOptions::new(Duration::from_secs(30)).with_wait(WaitPolicy::NoWait);
    let candidate = Candidate::new("residue").unwrap();
    let mut last = 0;
    let mut rising = |token: Option<FencingToken>| {
        let token = token.expect("a single node fences").get();
        assert!(token > last, "token {token} after {last}");
        last = token;
    };
    for i in 0..20 {
        let key = |kind: &str| LockKey::new(format!("residue/{kind}/{i}")).unwrap();
        let permit = semaphore.acquire(&key("sem"), 2, &options).await.unwrap();
        rising(permit.fencing_token());
        permit.release().await.unwrap();
        for mode in [RwMode::Read, RwMode::Write] {
            let guard = rw.acquire(&key("rw"), mode, &options).await.unwrap();
            rising(guard.fencing_token());
            guard.release().await.unwrap();
        }
        let leader = election
            .try_campaign(&key("election"), &candidate, &options)
            .await
            .unwrap()
            .expect("a free election is won");
        rising(Some(leader.term()));
        leader.resign().await.unwrap();
    }
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut h.raw(0).await)
        .await
        .unwrap();
    assert_eq!(keys, [distlock_redis::SERVER_FENCE]);
}
