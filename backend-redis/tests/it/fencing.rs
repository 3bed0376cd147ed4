//! Fencing tokens on real servers: a single node hands out its `{K}:fence` counter;
//! Redlock, which cannot promise ordered tokens, hands out none and keeps no counter.

use crate::common;

use std::time::Duration;

use distlock_api::{with_lock, LockKey, LockOptions, WaitPolicy};
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
    let lock = RedisLock::connect(&h.url()).await.unwrap().lock();
    assert!(!lock.info().capabilities.mutex.fencing.is_supported());
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

/// The single node fences: tokens rise with every grant (the counter `{K}:fence`), and
/// the counter lives for the TTL plus the margin after it was seeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_node_tokens_rise_and_the_record_expires() {
    let h = common::start(1).await;
    let lock = RedisLock::connect(&h.url()).await.unwrap();
    assert!(lock.lock().info().capabilities.mutex.fencing.is_supported());
    let k = key("single");
    let names = KeyNames::for_key(&k);
    let mut last = 0;
    for _ in 0..5 {
        let guard = lock.lock().acquire(&k, &options()).await.unwrap();
        let token = guard.fencing_token().expect("a single node fences").get();
        assert!(token > last, "token {token} after {last}");
        last = token;
        let mut raw = h.raw(0).await;
        let recorded: u64 = raw.get(&names.fence).await.unwrap();
        assert_eq!(recorded, token);
        let keep: i64 = raw.pttl(&names.fence).await.unwrap();
        // TTL 10 s plus the 10 s margin.
        assert!(
            keep > 10_000 && keep <= 20_000,
            "the record lives {keep} ms"
        );
        guard.release().await.unwrap();
    }
}

/// Before: the counter restarted from 1 once `{K}:fence` was gone (a restart without
/// persistence, or a deleted counter), so a fenced store refused every new holder.
/// Now the server's clock carries the order when the record is gone, and the record
/// carries it when the clock is behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_rising_when_the_record_is_gone_or_the_clock_is_behind() {
    let h = common::start(1).await;
    let lock = RedisLock::connect(&h.url()).await.unwrap();
    let k = key("restart");
    let names = KeyNames::for_key(&k);
    let mut raw = h.raw(0).await;
    let token = |guard: &distlock_api::LockGuard| guard.fencing_token().unwrap().get();

    let first = lock.lock().acquire(&k, &options()).await.unwrap();
    let t1 = token(&first);
    first.release().await.unwrap();
    // The record expired (or the fencing key was deleted).
    let _: () = raw.del(&names.fence).await.unwrap();
    let second = lock.lock().acquire(&k, &options()).await.unwrap();
    let t2 = token(&second);
    assert!(t2 > t1, "after the record expired: {t2} after {t1}");
    second.release().await.unwrap();
    // A restart without persistence forgets every key.
    let _: () = redis::cmd("FLUSHALL").query_async(&mut raw).await.unwrap();
    let third = lock.lock().acquire(&k, &options()).await.unwrap();
    let t3 = token(&third);
    assert!(
        t3 > t2,
        "after the server forgot everything: {t3} after {t2}"
    );
    third.release().await.unwrap();
    // A record ahead of the server's clock (the clock stepped back while the record
    // lived): the next token is one above it.
    let ahead = t3 + 3_600_000_000;
    let _: () = raw.set(&names.fence, ahead).await.unwrap();
    let fourth = lock.lock().acquire(&k, &options()).await.unwrap();
    assert_eq!(token(&fourth), ahead + 1);
    fourth.release().await.unwrap();
    // A counter of the older `INCR` layout is simply overtaken.
    let _: () = raw.set(&names.fence, 7).await.unwrap();
    let fifth = lock.lock().acquire(&k, &options()).await.unwrap();
    assert!(token(&fifth) > t3);
    fifth.release().await.unwrap();
    let keep: i64 = raw.pttl(&names.fence).await.unwrap();
    assert!(keep > 0, "the older counter was given an expiry: {keep}");
}
