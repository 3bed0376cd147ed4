//! Fencing tokens on real servers: a single node hands out its `{K}:fence` counter;
//! Redlock, which cannot promise ordered tokens, hands out none and keeps no counter.

mod common;

use std::sync::Arc;
use std::time::Duration;

use distlock_api::{with_lock, DistributedLock, LockKey, LockOptions, WaitPolicy};
use distlock_redis::{KeyNames, RedisLock};
use redis::AsyncCommands;

fn key(name: &str) -> LockKey {
    LockKey::new(format!("fencing/{name}")).unwrap()
}

fn options() -> LockOptions {
    LockOptions::new(Duration::from_secs(10)).with_wait(WaitPolicy::Timeout(Duration::from_secs(5)))
}

/// Before: Redlock's guards carried the max over the majority's counters, which went
/// …408, 409, 259, 427… with no faults at all, and a fenced ledger refused legitimate
/// writes. Now every way to a grant carries no token, and no node keeps a counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_grants_carry_no_fencing_token_and_leave_no_counter() {
    let h = common::start(3).await;
    let lock = Arc::new(RedisLock::connect(&h.url()).await.unwrap());
    assert!(!lock.info().capabilities.fencing.is_supported());
    let k = key("redlock");
    for round in 0..5 {
        let guard = lock.acquire(&k, &options()).await.unwrap();
        assert_eq!(guard.fencing_token(), None, "round {round}: acquire");
        assert_eq!(guard.lease().fencing_token(), None);
        guard.release().await.unwrap();
        let tried = lock
            .try_acquire(&k, &options())
            .await
            .unwrap()
            .expect("the key was released");
        assert_eq!(tried.fencing_token(), None, "round {round}: try-acquire");
        tried.release().await.unwrap();
    }
    let token = with_lock(&*lock, &k, &options(), |token| async move { token })
        .await
        .unwrap();
    assert_eq!(token, None, "with_lock passed a token");
    assert_eq!(lock.inspect(&k).await.unwrap().fencing_token, None);
    let names = KeyNames::for_key(&k);
    for node in 0..3 {
        let counter: Option<String> = h.raw(node).await.get(&names.fence).await.unwrap();
        assert_eq!(counter, None, "node {node} keeps a fencing counter");
    }
}

/// The single node still fences: each grant's token is the counter, one above the last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_node_grants_carry_the_counter() {
    let h = common::start(1).await;
    let lock = RedisLock::connect(&h.url()).await.unwrap();
    assert!(lock.info().capabilities.fencing.is_supported());
    let k = key("single");
    let names = KeyNames::for_key(&k);
    for expected in 1..=3 {
        let guard = lock.acquire(&k, &options()).await.unwrap();
        let token = guard.fencing_token().expect("a single node fences");
        assert_eq!(token.get(), expected);
        let counter: u64 = h.raw(0).await.get(&names.fence).await.unwrap();
        assert_eq!(counter, expected);
        guard.release().await.unwrap();
    }
}
