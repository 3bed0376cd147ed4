//! Fencing tokens on real servers: a single node hands out its one counter
//! (`distlock-fence:v3`, see `KeyNames::fence`); Redlock, which cannot promise
//! ordered tokens, hands out none and keeps no counter.

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
        let counter: Option<String> = h.raw(node).await.get(names.fence()).await.unwrap();
        assert_eq!(counter, None, "node {node} keeps a fencing counter");
    }
}

/// The single node fences: tokens rise with every grant (the server's one counter,
/// which never expires and holds the last token handed out), also across keys and for
/// a fresh key every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_node_tokens_rise_and_the_record_expires() {
    let h = common::start(1).await;
    let lock = RedisLock::connect(&h.url()).await.unwrap();
    assert!(lock.lock().info().capabilities.mutex.fencing.is_supported());
    let k = key("single");
    let names = KeyNames::for_key(&k);
    let mut last = 0;
    for round in 0..5 {
        // The first attempt of an acquire (a pipeline) and a waiter's (a script) both
        // take the next token.
        let guard = if round % 2 == 0 {
            lock.lock().acquire(&k, &options()).await.unwrap()
        } else {
            lock.lock()
                .try_acquire(&k, &options())
                .await
                .unwrap()
                .expect("free")
        };
        let token = guard.fencing_token().expect("a single node fences").get();
        assert!(token > last, "token {token} after {last}");
        last = token;
        let mut raw = h.raw(0).await;
        let recorded: u64 = raw.get(names.fence()).await.unwrap();
        assert_eq!(recorded, token);
        let keep: i64 = raw.pttl(names.fence()).await.unwrap();
        assert_eq!(keep, -1, "the counter never expires");
        guard.release().await.unwrap();
    }
    // A fresh key each time: still rising, whatever the slot.
    for n in 0..20 {
        let guard = lock
            .lock()
            .acquire(&key(&format!("fresh/{n}")), &options())
            .await
            .unwrap();
        let token = guard.fencing_token().unwrap().get();
        guard.release().await.unwrap();
        let again = lock
            .lock()
            .acquire(&key(&format!("fresh/{n}")), &options())
            .await
            .unwrap();
        assert!(again.fencing_token().unwrap().get() > token);
        again.release().await.unwrap();
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
    let _: () = raw.del(names.fence()).await.unwrap();
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
    let _: () = raw.set(names.fence(), ahead).await.unwrap();
    let fourth = lock.lock().acquire(&k, &options()).await.unwrap();
    assert_eq!(token(&fourth), ahead + 1);
    fourth.release().await.unwrap();
    // A counter of a small value (as one `INCR` makes it) is seeded from the clock.
    let _: () = raw.set(names.fence(), 7).await.unwrap();
    let fifth = lock.lock().acquire(&k, &options()).await.unwrap();
    assert!(token(&fifth) > t3);
    fifth.release().await.unwrap();
    // Seeds are the clock's µs, not a multiple of it (so that tokens fit a double).
    let clock = micros_now();
    assert!(
        t3 <= clock && t3 > clock - 600_000_000,
        "{t3} is not the µs clock {clock}"
    );
}

/// The server's clock (this machine's: the test server is local) in µs since 1970.
fn micros_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros()
        .try_into()
        .unwrap()
}

/// The largest integer a double (a JSON number read by JavaScript, say) holds exactly.
const MAX_SAFE: u64 = (1 << 53) - 1;

/// Before: a slot counter was seeded with ten times the clock's µs (about 1.8 × 10^16),
/// above 2^53, so a consumer reading tokens as doubles (JSON in JavaScript) rounded
/// them, and a fenced store there could take a stale write for a fresh one. Now every
/// way to a token stays at or below 2^53 − 1: the first attempt's pipeline, a waiter's
/// script and the FIFO script after a FLUSHALL re-seeds the slot counter, and the
/// semaphore's, read-write lock's and election's per-key counters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_token_fits_a_double_after_a_reseed() {
    use distlock_api::{Candidate, RwMode, WaitOrder};
    let h = common::start(1).await;
    let lock = RedisLock::connect(&h.url()).await.unwrap();
    let mut raw = h.raw(0).await;
    let k = key("doubles");
    let fits = |what: &str, token: u64| {
        assert!(token <= MAX_SAFE, "{what}: token {token} is above 2^53 - 1");
    };
    for round in 0..3 {
        let _: () = redis::cmd("FLUSHALL").query_async(&mut raw).await.unwrap();
        // The first attempt's pipeline seeds the counter.
        let first = lock.lock().acquire(&k, &options()).await.unwrap();
        fits("pipeline", first.fencing_token().unwrap().get());
        // A waiter's script, finding the counter gone (as a flush leaves it), seeds it.
        let waiter = {
            let (lock, k) = (lock.clone(), k.clone());
            tokio::spawn(async move { lock.lock().acquire(&k, &options()).await })
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while lock.waiters_in_line(&k) == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the waiter never waited"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let _: () = raw.del(KeyNames::for_key(&k).fence()).await.unwrap();
        first.release().await.unwrap();
        let granted = waiter.await.unwrap().unwrap();
        fits("waiter's script", granted.fencing_token().unwrap().get());
        granted.release().await.unwrap();
        // The FIFO script seeds it too.
        let _: () = redis::cmd("FLUSHALL").query_async(&mut raw).await.unwrap();
        let fifo = lock
            .lock()
            .acquire(&k, &options().with_order(WaitOrder::Fifo))
            .await
            .unwrap();
        fits("FIFO script", fifo.fencing_token().unwrap().get());
        fifo.release().await.unwrap();
        // The other primitives' per-key counters.
        let permit = lock.semaphore().acquire(&k, 2, &options()).await.unwrap();
        fits("semaphore", permit.fencing_token().unwrap().get());
        permit.release().await.unwrap();
        let writer = lock
            .rw_lock()
            .acquire(&k, RwMode::Write, &options())
            .await
            .unwrap();
        fits("writer", writer.fencing_token().unwrap().get());
        writer.release().await.unwrap();
        let leader = lock
            .election()
            .campaign(
                &k,
                &Candidate::new(format!("c{round}")).unwrap(),
                &options(),
            )
            .await
            .unwrap();
        fits("election", leader.term().get());
        leader.resign().await.unwrap();
    }
}

/// A waiter's attempt (the acquire script, not the first attempt's pipeline) seeds a
/// counter that is gone, too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_granted_after_the_counter_was_lost_gets_a_higher_token() {
    let h = common::start(1).await;
    let lock = RedisLock::connect(&h.url()).await.unwrap();
    let k = key("waiter-seeds");
    let names = KeyNames::for_key(&k);
    let holder = lock.lock().acquire(&k, &options()).await.unwrap();
    let first = holder.fencing_token().unwrap().get();
    let waiter = {
        let (lock, k) = (lock.clone(), k.clone());
        tokio::spawn(async move { lock.lock().acquire(&k, &options()).await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while lock.waiters_in_line(&k) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the waiter never waited"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _: () = h.raw(0).await.del(names.fence()).await.unwrap();
    holder.release().await.unwrap();
    let granted = waiter.await.unwrap().unwrap();
    assert!(granted.fencing_token().unwrap().get() > first);
    granted.release().await.unwrap();
}

/// Before: each hash slot had its own counter, so on a new (or restarted) server the
/// first grant in each of the 16384 slots paid a second round trip to seed it, and a
/// fresh key per cycle met new slots for tens of thousands of cycles. Now a single
/// server keeps one counter: the keys of many slots, fresh every time, and every way
/// to a grant (the first attempt's pipeline, a waiter's script, the FIFO script) count
/// on it, and the tokens of all of them rise together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_server_keeps_one_counter_for_every_key() {
    use distlock_api::WaitOrder;
    let h = common::start(1).await;
    let lock = RedisLock::connect(&h.url()).await.unwrap();
    let mut raw = h.raw(0).await;
    let mut last = 0;
    for n in 0..200 {
        let k = key(&format!("one-counter/{n}"));
        let options = if n % 3 == 0 {
            options().with_order(WaitOrder::Fifo)
        } else {
            options()
        };
        let guard = lock.lock().acquire(&k, &options).await.unwrap();
        let token = guard.fencing_token().unwrap().get();
        assert!(token > last, "key {n}: token {token} after {last}");
        last = token;
        guard.release().await.unwrap();
    }
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(keys, vec![distlock_redis::SERVER_FENCE.to_owned()]);
    let recorded: u64 = raw.get(distlock_redis::SERVER_FENCE).await.unwrap();
    assert_eq!(recorded, last);
    // The counter is no lock's name: every lock name starts with its hash tag.
    assert!(!KeyNames::for_key(&key("x"))
        .lock
        .starts_with(distlock_redis::SERVER_FENCE));
    assert!(!distlock_redis::SERVER_FENCE.starts_with('{'));
}
