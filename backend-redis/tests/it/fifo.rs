//! FIFO mode (`?fifo=true` or `WaitOrder::Fifo`) against real redis-server processes:
//! arrival order across clients, a crashed waiter's entry expiring within its bound, a
//! giving-up waiter leaving at once (on a slow server too), a release waking only the
//! head (a live one, past an expired entry), no residue, and typed errors for bad
//! parameters.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_api::{LockError, LockKey, LockOptions, WaitOrder, WaitPolicy};
use distlock_redis::{KeyNames, RedisConfig, RedisLock};
use tokio::time::{timeout, Instant};

const LONG_TTL: Duration = Duration::from_secs(60);

fn key(name: &str) -> LockKey {
    LockKey::new(format!("fifo/{name}")).unwrap()
}

fn fifo_url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}?fifo=true")
}

/// A FIFO client whose queue entries live `entry_ttl` unless refreshed.
async fn fifo_client(url: &str, entry_ttl: Duration) -> RedisLock {
    let mut config = RedisConfig::default();
    config.fifo = true;
    config.fifo_entry_ttl = entry_ttl;
    RedisLock::connect_with(url, config).await.unwrap()
}

/// Polls `inspect` until the key's queue holds `count` live waiters.
async fn until_queued(observer: &RedisLock, key: &LockKey, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let waiters = observer.lock().inspect(key).await.unwrap().waiters;
        if waiters == Some(count) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the queue never held {count} waiters (last: {waiters:?})"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How many scripts the server has run.
async fn script_calls(raw: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(raw)
        .await
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| l.split("calls=").nth(1))
        .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
        .sum()
}

/// Polls until `subscribers` waiters listen for `key`'s releases and no script has run
/// for a poll interval (each waiter done with its retry after subscribing); returns how
/// many scripts the server has run.
async fn until_quiet(
    raw: &mut redis::aio::MultiplexedConnection,
    key: &LockKey,
    subscribers: usize,
) -> u64 {
    let channel = KeyNames::for_key(key).channel();
    let mut before = u64::MAX;
    let quiet_by = Instant::now() + Duration::from_secs(20);
    loop {
        let numsub: (String, usize) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query_async(raw)
            .await
            .unwrap();
        let calls = script_calls(raw).await;
        if numsub.1 == subscribers && calls == before {
            return calls;
        }
        assert!(Instant::now() < quiet_by, "the waiters never settled");
        before = calls;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_different_clients_are_granted_in_arrival_order() {
    let h = common::start(1).await;
    let port = h.ports[0];
    let k = key("order");
    let holder = RedisLock::connect(&fifo_url(port)).await.unwrap();
    let observer = RedisLock::connect(&h.url()).await.unwrap();
    let guard = holder
        .lock()
        .acquire(&k, &LockOptions::new(LONG_TTL))
        .await
        .unwrap();
    let granted = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..8 {
        // Half ask by URL, half by the lock option on a plain client.
        let (lock, options) = if i % 2 == 0 {
            (
                RedisLock::connect(&fifo_url(port)).await.unwrap(),
                LockOptions::new(LONG_TTL),
            )
        } else {
            (
                RedisLock::connect(&h.url()).await.unwrap(),
                LockOptions::new(LONG_TTL).with_order(WaitOrder::Fifo),
            )
        };
        let (waited_key, granted) = (k.clone(), granted.clone());
        waiters.push(tokio::spawn(async move {
            let guard = lock.lock().acquire(&waited_key, &options).await?;
            granted.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(10)).await;
            guard.release().await
        }));
        // Each is seen queued before the next one starts.
        until_queued(&observer, &k, i + 1).await;
    }
    guard.release().await.unwrap();
    for waiter in waiters {
        timeout(Duration::from_secs(30), waiter)
            .await
            .expect("a waiter hung")
            .unwrap()
            .unwrap();
    }
    assert_eq!(*granted.lock().unwrap(), (0..8).collect::<Vec<_>>());
}

/// A release wakes the head only while the key is marked waited on, and deletes the
/// mark: the grant that leaves others queued must mark it again, or the next release
/// would wake nobody and the lock would pass on only at the waiters' refresh (20 s
/// here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_release_of_a_queue_wakes_the_next_head() {
    let h = common::start(1).await;
    let k = key("chain");
    let entry_ttl = Duration::from_secs(60);
    let observer = RedisLock::connect(&h.url()).await.unwrap();
    let holder = fifo_client(&h.url(), entry_ttl).await;
    let guard = holder
        .lock()
        .acquire(&k, &LockOptions::new(LONG_TTL))
        .await
        .unwrap();
    let mut waiters = Vec::new();
    for i in 0..3 {
        // A client each, so they wait on the server, not in one client's line.
        let lock = fifo_client(&h.url(), entry_ttl).await;
        let waited_key = k.clone();
        waiters.push(tokio::spawn(async move {
            lock.lock()
                .acquire(&waited_key, &LockOptions::new(LONG_TTL))
                .await?
                .release()
                .await
        }));
        until_queued(&observer, &k, i + 1).await;
    }
    guard.release().await.unwrap();
    let bound = Instant::now() + Duration::from_secs(15);
    for waiter in waiters {
        timeout(bound.saturating_duration_since(Instant::now()), waiter)
            .await
            .expect("a queued waiter was not woken by the release before it")
            .unwrap()
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_does_not_overtake_queued_waiters() {
    let h = common::start(1).await;
    let url = fifo_url(h.ports[0]);
    let k = key("try");
    let (holder, waiter, other) = (
        RedisLock::connect(&url).await.unwrap(),
        RedisLock::connect(&url).await.unwrap(),
        RedisLock::connect(&url).await.unwrap(),
    );
    let guard = holder
        .lock()
        .acquire(&k, &LockOptions::new(LONG_TTL))
        .await
        .unwrap();
    let queued = tokio::spawn({
        let k = k.clone();
        async move { waiter.lock().acquire(&k, &LockOptions::new(LONG_TTL)).await }
    });
    until_queued(&other, &k, 1).await;
    // Between the release and the head's grant the key is free, yet nobody else gets it.
    guard.release().await.unwrap();
    let no_wait = LockOptions::new(LONG_TTL).with_wait(WaitPolicy::NoWait);
    for _ in 0..20 {
        if let Some(g) = other.lock().try_acquire(&k, &no_wait).await.unwrap() {
            panic!("a try overtook the queue: token {:?}", g.fencing_token());
        }
    }
    let granted = timeout(Duration::from_secs(10), queued)
        .await
        .expect("the head hung")
        .unwrap()
        .unwrap();
    granted.release().await.unwrap();
    assert!(other
        .lock()
        .try_acquire(&k, &no_wait)
        .await
        .unwrap()
        .is_some());
}

/// A waiter whose process dies (its connections cut) keeps its place only until its
/// entry's deadline: the waiter behind it is granted within the entry TTL (plus slack)
/// of the crash, and the queue is empty afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_waiter_leaves_the_queue_within_the_entry_ttl() {
    let h = common::start(1).await;
    let entry_ttl = Duration::from_millis(900);
    let k = key("crashed-waiter");
    let holder = fifo_client(&h.url(), entry_ttl).await;
    let observer = RedisLock::connect(&h.url()).await.unwrap();
    let guard = holder
        .lock()
        .acquire(&k, &LockOptions::new(LONG_TTL))
        .await
        .unwrap();
    // The doomed waiter goes through a proxy we can cut.
    let (doomed, proxies) = {
        let (lock, proxies) = h.proxied_client().await;
        drop(lock);
        let port = proxies[0].local_addr().port();
        (
            fifo_client(&format!("redis://127.0.0.1:{port}"), entry_ttl).await,
            proxies,
        )
    };
    let doomed_wait = tokio::spawn({
        let k = k.clone();
        async move { doomed.lock().acquire(&k, &LockOptions::new(LONG_TTL)).await }
    });
    until_queued(&observer, &k, 1).await;
    let next = fifo_client(&h.url(), entry_ttl).await;
    let next_wait = tokio::spawn({
        let k = k.clone();
        async move {
            let guard = next.lock().acquire(&k, &LockOptions::new(LONG_TTL)).await?;
            Ok::<_, LockError>((Instant::now(), guard))
        }
    });
    until_queued(&observer, &k, 2).await;
    for proxy in &proxies {
        proxy.cut();
    }
    let crashed_at = Instant::now();
    guard.release().await.unwrap();
    let (granted_at, granted) = timeout(Duration::from_secs(20), next_wait)
        .await
        .expect("the waiter behind a dead one hung")
        .unwrap()
        .unwrap();
    let took = granted_at.duration_since(crashed_at);
    assert!(
        took <= entry_ttl + Duration::from_secs(1),
        "granted {took:?} after the crash; the bound is the entry TTL {entry_ttl:?} + slack"
    );
    assert_eq!(observer.lock().inspect(&k).await.unwrap().waiters, Some(0));
    granted.release().await.unwrap();
    doomed_wait.abort();
}

/// A waiter that times out, and one whose acquire future is dropped, leave the queue at
/// once; the waiter behind them is then the head and is woken by the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_leaves_the_queue_at_once() {
    let h = common::start(1).await;
    let url = fifo_url(h.ports[0]);
    let k = key("gives-up");
    let observer = RedisLock::connect(&h.url()).await.unwrap();
    let holder = RedisLock::connect(&url).await.unwrap();
    let guard = holder
        .lock()
        .acquire(&k, &LockOptions::new(LONG_TTL))
        .await
        .unwrap();
    let impatient = RedisLock::connect(&url).await.unwrap();
    let impatient_wait = tokio::spawn({
        let k = k.clone();
        async move {
            let options = LockOptions::new(LONG_TTL)
                .with_wait(WaitPolicy::Timeout(Duration::from_millis(800)));
            impatient.lock().acquire(&k, &options).await
        }
    });
    until_queued(&observer, &k, 1).await;
    let dropped = RedisLock::connect(&url).await.unwrap();
    let dropped_wait = tokio::spawn({
        let k = k.clone();
        async move {
            dropped
                .lock()
                .acquire(&k, &LockOptions::new(LONG_TTL))
                .await
        }
    });
    until_queued(&observer, &k, 2).await;
    let patient = RedisLock::connect(&url).await.unwrap();
    let patient_wait = tokio::spawn({
        let k = k.clone();
        async move {
            let guard = patient
                .lock()
                .acquire(&k, &LockOptions::new(LONG_TTL))
                .await?;
            Ok::<_, LockError>((Instant::now(), guard))
        }
    });
    until_queued(&observer, &k, 3).await;
    let timed_out = impatient_wait.await.unwrap();
    assert!(
        matches!(timed_out, Err(LockError::Timeout { .. })),
        "{timed_out:?}"
    );
    // Gone by the time the call returned, not later: a process exiting right after
    // its timeout (exec does) leaves nothing behind.
    assert_eq!(observer.lock().inspect(&k).await.unwrap().waiters, Some(2));
    dropped_wait.abort();
    // Both entries go well before the default 3 s entry TTL could expire them.
    let left_by = Instant::now() + Duration::from_millis(1500);
    until_queued(&observer, &k, 1).await;
    assert!(
        Instant::now() < left_by,
        "the entries were not removed at once"
    );
    let released_at = Instant::now();
    guard.release().await.unwrap();
    let (granted_at, granted) = timeout(Duration::from_secs(10), patient_wait)
        .await
        .expect("the patient waiter hung")
        .unwrap()
        .unwrap();
    let took = granted_at.duration_since(released_at);
    assert!(took < Duration::from_millis(500), "hand-off took {took:?}");
    granted.release().await.unwrap();
}

/// A waiter whose wait runs out while the server is slow (every round trip longer than
/// the grace an attempt in flight gets past the deadline) returns at its deadline plus
/// the grace, as every wait does, and has left the queue within a request timeout
/// after: the removal runs on in the background (a `settle_cleanups` waits for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_on_a_slow_server_leaves_the_queue_promptly() {
    let h = common::start(1).await;
    let k = key("slow-timeout");
    let observer = RedisLock::connect(&h.url()).await.unwrap();
    let guard = observer
        .lock()
        .acquire(&k, &LockOptions::new(LONG_TTL))
        .await
        .unwrap();
    let (lock, proxies) = h.proxied_client().await;
    drop(lock);
    let port = proxies[0].local_addr().port();
    let slow = fifo_client(&format!("redis://127.0.0.1:{port}"), Duration::from_secs(3)).await;
    let briefly =
        LockOptions::new(LONG_TTL).with_wait(WaitPolicy::Timeout(Duration::from_millis(50)));
    // The server learns the queue's scripts now (`NOSCRIPT` and a load would add calls).
    let primed = slow.lock().acquire(&k, &briefly).await;
    assert!(
        matches!(primed, Err(LockError::Timeout { .. })),
        "{primed:?}"
    );
    // A 240 ms round trip: the server answers, late.
    proxies[0].set_latency(Duration::from_millis(120));
    let wait = Duration::from_millis(600);
    let started = Instant::now();
    let outcome = slow
        .lock()
        .acquire(
            &k,
            &LockOptions::new(LONG_TTL).with_wait(WaitPolicy::Timeout(wait)),
        )
        .await;
    let took = started.elapsed();
    assert!(
        matches!(outcome, Err(LockError::Timeout { .. })),
        "{outcome:?}"
    );
    // The wait and the grace, with room for a loaded machine.
    assert!(
        took < wait + Duration::from_secs(1),
        "the call took {took:?}"
    );
    // The removal in flight at the cut: one round trip, bounded by the request timeout.
    let left_by = Instant::now() + Duration::from_secs(3);
    while observer.lock().inspect(&k).await.unwrap().waiters != Some(0) {
        assert!(
            Instant::now() < left_by,
            "the entry outlived the request timeout"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    guard.release().await.unwrap();
}

/// A release drops expired queue entries before it names the head to wake: a waiter
/// that died at the head of the queue (its entry expired, and no script has run since)
/// does not take the wake-up meant for the live waiter behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_live_waiter_behind_an_expired_head() {
    let h = common::start(1).await;
    let mut raw = h.raw(0).await;
    // Entries refreshed every 10 s: the waiter naps that long unless woken.
    let entry_ttl = Duration::from_secs(30);
    let k = key("expired-head");
    let names = KeyNames::for_key(&k);
    let observer = RedisLock::connect(&h.url()).await.unwrap();
    let holder = fifo_client(&h.url(), entry_ttl).await;
    let guard = holder
        .lock()
        .acquire(&k, &LockOptions::new(LONG_TTL))
        .await
        .unwrap();
    let waiter = fifo_client(&h.url(), entry_ttl).await;
    let wait = tokio::spawn({
        let k = k.clone();
        async move {
            let guard = waiter
                .lock()
                .acquire(&k, &LockOptions::new(LONG_TTL))
                .await?;
            Ok::<_, LockError>((Instant::now(), guard))
        }
    });
    until_queued(&observer, &k, 1).await;
    until_quiet(&mut raw, &k, 1).await;
    // A dead waiter ahead of it: arrived first (score 0), expired long ago (1 ms after
    // the epoch).
    let () = redis::pipe()
        .cmd("ZADD")
        .arg(names.queue())
        .arg(0)
        .arg("dead")
        .ignore()
        .cmd("ZADD")
        .arg(names.queue_deadlines())
        .arg(1)
        .arg("dead")
        .ignore()
        .query_async(&mut raw)
        .await
        .unwrap();
    let released_at = Instant::now();
    guard.release().await.unwrap();
    let (granted_at, granted) = timeout(Duration::from_secs(30), wait)
        .await
        .expect("the waiter hung")
        .unwrap()
        .unwrap();
    let took = granted_at.duration_since(released_at);
    assert!(
        took < Duration::from_secs(2),
        "hand-off took {took:?}: the release woke the expired head"
    );
    granted.release().await.unwrap();
}

/// A release wakes only the head: with 8 waiters queued on 8 clients, the release and
/// the head's grant are the only scripts run; the others do not retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_only_the_head() {
    let h = common::start(1).await;
    let mut raw = h.raw(0).await;
    // Entries refreshed every 10 s: no refresh falls in the measured window.
    let entry_ttl = Duration::from_secs(30);
    let k = key("head-only");
    let observer = RedisLock::connect(&h.url()).await.unwrap();
    let holder = fifo_client(&h.url(), entry_ttl).await;
    // The server learns the release script now (`NOSCRIPT` and a load would add calls).
    let other = holder
        .lock()
        .acquire(&key("other"), &LockOptions::new(LONG_TTL))
        .await
        .unwrap();
    other.release().await.unwrap();
    let guard = holder
        .lock()
        .acquire(&k, &LockOptions::new(LONG_TTL))
        .await
        .unwrap();
    let mut waiters = Vec::new();
    for i in 0..8 {
        let lock = fifo_client(&h.url(), entry_ttl).await;
        let waited_key = k.clone();
        waiters.push(tokio::spawn(async move {
            lock.lock()
                .acquire(&waited_key, &LockOptions::new(LONG_TTL))
                .await
        }));
        until_queued(&observer, &k, i + 1).await;
    }
    // Quiet first: every waiter subscribed and done with its retry after subscribing.
    let before = until_quiet(&mut raw, &k, 8).await;
    guard.release().await.unwrap();
    let mut waiters = waiters.into_iter();
    let head = waiters.next().unwrap();
    let head_guard = timeout(Duration::from_secs(10), head)
        .await
        .expect("the head hung")
        .unwrap()
        .unwrap();
    // Room for a herd to show up, had the release woken everyone.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = script_calls(&mut raw).await;
    // A herd would add one call per waiter.
    let calls = after - before;
    assert!(
        calls <= 2,
        "{calls} script calls for the release and the head's grant: waiters beyond the head were woken"
    );
    drop(head_guard);
    for waiter in waiters {
        waiter.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_locks_leave_no_residue() {
    let h = common::start(1).await;
    let entry_ttl = Duration::from_millis(600);
    let mut raw = h.raw(0).await;
    // Short leases: the fencing record outlives a grant by its TTL plus a margin.
    let ttl = Duration::from_secs(3);
    let keys: Vec<LockKey> = (0..3).map(|i| key(&format!("residue/{i}"))).collect();
    let observer = RedisLock::connect(&h.url()).await.unwrap();
    for k in &keys {
        let holder = fifo_client(&h.url(), entry_ttl).await;
        let guard = holder
            .lock()
            .acquire(k, &LockOptions::new(ttl))
            .await
            .unwrap();
        let mut waits = Vec::new();
        for i in 0..3 {
            let lock = fifo_client(&h.url(), entry_ttl).await;
            let waited_key = k.clone();
            waits.push(tokio::spawn(async move {
                let guard = lock
                    .lock()
                    .acquire(&waited_key, &LockOptions::new(ttl))
                    .await?;
                guard.release().await
            }));
            until_queued(&observer, k, i + 1).await;
        }
        // A waiter that dies in the queue: its entry must expire by itself.
        let (doomed, proxies) = {
            let (lock, proxies) = h.proxied_client().await;
            drop(lock);
            let port = proxies[0].local_addr().port();
            (
                fifo_client(&format!("redis://127.0.0.1:{port}"), entry_ttl).await,
                proxies,
            )
        };
        let doomed_wait = tokio::spawn({
            let k = k.clone();
            async move { doomed.lock().acquire(&k, &LockOptions::new(ttl)).await }
        });
        until_queued(&observer, k, 4).await;
        proxies.iter().for_each(|p| p.cut());
        guard.release().await.unwrap();
        for wait in waits {
            timeout(Duration::from_secs(20), wait)
                .await
                .expect("a waiter hung")
                .unwrap()
                .unwrap();
        }
        doomed_wait.abort();
    }
    common::until_nothing_left(&mut raw, ttl).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_fifo_parameters_are_typed_errors() {
    let h = common::start(3).await;
    let port = h.ports[0];
    for value in ["maybe", "", "1", "TRUE"] {
        let url = format!("redis://127.0.0.1:{port}?fifo={value}");
        let err = RedisLock::connect(&url).await.unwrap_err();
        assert!(matches!(err, LockError::Config { .. }), "{url}: {err:?}");
        assert!(err.to_string().contains("fifo"), "{err}");
    }
    let twice = format!("redis://127.0.0.1:{port}?fifo=true&fifo=false");
    assert!(matches!(
        RedisLock::connect(&twice).await,
        Err(LockError::Config { .. })
    ));
    let mut config = RedisConfig::default();
    config.fifo_entry_ttl = Duration::from_millis(10);
    assert!(matches!(
        RedisLock::connect_with(&h.url(), config).await,
        Err(LockError::Config { .. })
    ));
    // Redlock cannot be FIFO: by URL at connect, by option at acquire.
    let redlock_fifo = format!("{}?fifo=true", h.url());
    let err = RedisLock::connect(&redlock_fifo).await.unwrap_err();
    assert!(matches!(err, LockError::Unsupported { .. }), "{err:?}");
    let redlock = RedisLock::connect(&h.url()).await.unwrap();
    assert!(!redlock.lock().info().capabilities.mutex.fifo.is_supported());
    let fifo = LockOptions::new(LONG_TTL).with_order(WaitOrder::Fifo);
    let k = key("redlock");
    let err = redlock.lock().acquire(&k, &fifo).await.unwrap_err();
    assert!(matches!(err, LockError::Unsupported { .. }), "{err:?}");
    let err = redlock.lock().try_acquire(&k, &fifo).await.unwrap_err();
    assert!(matches!(err, LockError::Unsupported { .. }), "{err:?}");
    // Nothing was taken.
    assert!(!redlock.lock().inspect(&k).await.unwrap().held);
    // `fifo=false` is accepted and leaves the client unordered; the capability holds
    // for every single-node client (FIFO on request).
    let plain = RedisLock::connect(&format!("redis://127.0.0.1:{port}?fifo=false"))
        .await
        .unwrap();
    assert!(plain.lock().info().capabilities.mutex.fifo.is_supported());
}

/// The lock key keeps its plain layout in FIFO mode: a foreign `SET NX PX` holder
/// excludes FIFO clients and a FIFO holder excludes it; a foreign `SET NX` on a free
/// key jumps the queue (documented), and the queue's head is served after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_set_nx_excludes_both_ways_and_may_jump_the_queue() {
    let h = common::start(1).await;
    let mut raw = h.raw(0).await;
    let k = key("foreign");
    let lock_name = format!("{{{}}}", k.as_str());
    let fifo = RedisLock::connect(&fifo_url(h.ports[0])).await.unwrap();
    let no_wait = LockOptions::new(LONG_TTL).with_wait(WaitPolicy::NoWait);
    let set_nx = |value: &'static str| {
        redis::cmd("SET")
            .arg(&lock_name)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .clone()
    };
    // A FIFO holder excludes a foreign SET NX.
    let guard = fifo.lock().acquire(&k, &no_wait).await.unwrap();
    let theirs: Option<String> = set_nx("theirs").query_async(&mut raw).await.unwrap();
    assert_eq!(theirs, None);
    // With a FIFO waiter queued, a foreign SET NX on the freed key takes it first.
    let waiter = RedisLock::connect(&fifo_url(h.ports[0])).await.unwrap();
    let queued = tokio::spawn({
        let k = k.clone();
        async move { waiter.lock().acquire(&k, &LockOptions::new(LONG_TTL)).await }
    });
    until_queued(&fifo, &k, 1).await;
    // Freed without a wake-up (a raw DEL, as a foreign release would), then taken. One
    // MULTI, so the queued waiter's own periodic retry cannot take the key in between.
    let (_, theirs): (i64, Option<String>) = redis::pipe()
        .atomic()
        .cmd("DEL")
        .arg(&lock_name)
        .add_command(set_nx("theirs"))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(theirs.as_deref(), Some("OK"));
    drop(guard);
    // The foreign holder excludes FIFO clients, queued or not.
    assert!(matches!(
        fifo.lock().acquire(&k, &no_wait).await,
        Err(LockError::Timeout { .. })
    ));
    assert!(!queued.is_finished());
    // Its release (a plain DEL, no publish) is found by the head's poll.
    let _: i64 = redis::cmd("DEL")
        .arg(&lock_name)
        .query_async(&mut raw)
        .await
        .unwrap();
    let granted = timeout(Duration::from_secs(10), queued)
        .await
        .expect("the head was not served after the foreign holder")
        .unwrap()
        .unwrap();
    granted.release().await.unwrap();
}
