//! Redis under faults, beyond the kit's fault scenarios (`fault_conformance.rs`):
//! killed connections, Redlock's orphan keys looked up on every node, partial grants
//! undone, interop with plain `SET NX PX` holders.

use crate::common;

use distlock_test_servers::ServerControl;
use std::time::Duration;

use distlock_api::{AutoRenew, LeaseState, LockError, LockKey, LockOptions, WaitPolicy};
use distlock_redis::{KeyNames, RedisLock};
use redis::AsyncCommands;
use tokio::time::{timeout, Instant};

fn key(name: &str) -> LockKey {
    LockKey::new(format!("faults/{name}")).unwrap()
}

fn waiting(ttl: Duration, wait: Duration) -> LockOptions {
    LockOptions::new(ttl).with_wait(WaitPolicy::Timeout(wait))
}

/// The server-side id of every client connection except the asking one.
async fn other_client_ids(raw: &mut redis::aio::MultiplexedConnection) -> Vec<i64> {
    let me: i64 = redis::cmd("CLIENT")
        .arg("ID")
        .query_async(raw)
        .await
        .unwrap();
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(raw)
        .await
        .unwrap();
    list.lines()
        .filter_map(|line| line.split_whitespace().find_map(|f| f.strip_prefix("id=")))
        .filter_map(|id| id.parse().ok())
        .filter(|id| *id != me)
        .collect()
}

/// `CLIENT KILL`s every connection but the asking one.
async fn kill_other_clients(raw: &mut redis::aio::MultiplexedConnection) {
    for id in other_client_ids(raw).await {
        let _: redis::Value = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("ID")
            .arg(id)
            .query_async(raw)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connection_that_cannot_come_back_frees_the_lock_and_fires_lost() {
    let h = common::start(1).await;
    let (holder, proxies) = h.proxied_client().await;
    let ttl = Duration::from_millis(600);
    let k = key("client-kill");
    let guard = holder
        .lock()
        .acquire(&k, &LockOptions::new(ttl).with_auto_renew(AutoRenew::new()))
        .await
        .unwrap();
    // The holder's host goes away: its connection is killed server-side and it cannot reconnect.
    proxies[0].refuse_new(true);
    kill_other_clients(&mut h.raw(0).await).await;
    let killed_at = Instant::now();
    timeout(ttl + Duration::from_secs(2), guard.lost())
        .await
        .expect("lost() fires once renewal fails");
    assert_eq!(guard.state(), LeaseState::Lost);
    let other = RedisLock::connect(&h.url()).await.unwrap();
    let taken = other
        .lock()
        .acquire(&k, &waiting(ttl, ttl + Duration::from_secs(2)))
        .await
        .expect("the lock frees within the TTL");
    assert!(killed_at.elapsed() <= ttl + Duration::from_secs(2));
    taken.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connection_of_a_live_client_reconnects_and_keeps_renewing() {
    let h = common::start(1).await;
    let holder = RedisLock::connect(&h.url()).await.unwrap();
    let ttl = Duration::from_millis(600);
    let k = key("client-kill-reconnect");
    let guard = holder
        .lock()
        .acquire(&k, &LockOptions::new(ttl).with_auto_renew(AutoRenew::new()))
        .await
        .unwrap();
    kill_other_clients(&mut h.raw(0).await).await;
    // Several TTLs later the watchdog, reconnected, still holds the lock.
    tokio::time::sleep(ttl * 3).await;
    assert_eq!(
        guard.state(),
        LeaseState::Held,
        "the lease did not recover after a reconnect"
    );
    let other = RedisLock::connect(&h.url()).await.unwrap();
    assert!(other
        .lock()
        .try_acquire(&k, &LockOptions::new(ttl))
        .await
        .unwrap()
        .is_none());
    assert_eq!(
        guard.release().await.unwrap(),
        distlock_api::ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_with_two_of_three_nodes_down_fails_fast_and_leaves_no_key() {
    let h = common::start(3).await;
    let lock = RedisLock::connect(&h.url()).await.unwrap();
    {
        let mut servers = h.servers.lock().await;
        servers[1].kill();
        servers[2].kill();
    }
    let k = key("redlock-majority");
    let started = Instant::now();
    let result = lock
        .lock()
        .acquire(
            &k,
            // Failing fast is the caller's choice: retries stop at the error patience.
            &waiting(Duration::from_secs(5), Duration::from_secs(30))
                .with_error_patience(Duration::from_secs(2)),
        )
        .await;
    let took = started.elapsed();
    match result {
        Err(LockError::Connection { source, .. }) => {
            assert!(
                source.to_string().contains("majority"),
                "unclear error: {source}"
            )
        }
        other => panic!("expected a connection error, got {other:?}"),
    }
    assert!(took < Duration::from_secs(10), "took {took:?}: not fast");
    {
        let mut servers = h.servers.lock().await;
        servers[1].restart().await.unwrap();
        servers[2].restart().await.unwrap();
    }
    let names = KeyNames::for_key(&k);
    for node in 0..3 {
        let exists: bool = h.raw(node).await.exists(&names.lock).await.unwrap();
        assert!(
            !exists,
            "node {node} kept the lock key after a failed acquire"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_partial_acquisition_is_released() {
    let h = common::start(3).await;
    let k = key("redlock-partial");
    let names = KeyNames::for_key(&k);
    // A foreign owner holds the key on two of three nodes.
    for node in [1, 2] {
        let set: Option<String> = redis::cmd("SET")
            .arg(&names.lock)
            .arg("foreign")
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut h.raw(node).await)
            .await
            .unwrap();
        assert_eq!(set.as_deref(), Some("OK"));
    }
    let lock = RedisLock::connect(&h.url()).await.unwrap();
    assert!(lock
        .lock()
        .try_acquire(&k, &LockOptions::new(Duration::from_secs(5)))
        .await
        .unwrap()
        .is_none());
    let ours: bool = h.raw(0).await.exists(&names.lock).await.unwrap();
    assert!(!ours, "the win on node 0 was not released");
    for node in [1, 2] {
        let theirs: Option<String> = h.raw(node).await.get(&names.lock).await.unwrap();
        assert_eq!(
            theirs.as_deref(),
            Some("foreign"),
            "node {node}: the foreign lock was touched"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interop_with_plain_set_nx_px_holders() {
    let h = common::start(1).await;
    let k = key("interop");
    let names = KeyNames::for_key(&k);
    let mut raw = h.raw(0).await;
    // A foreign client (redis-py's Lock, redsync, rslock) takes the key: ours is excluded.
    let set: Option<String> = redis::cmd("SET")
        .arg(&names.lock)
        .arg("py-token")
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(set.as_deref(), Some("OK"));
    let lock = RedisLock::connect(&h.url()).await.unwrap();
    assert!(lock
        .lock()
        .try_acquire(&k, &LockOptions::new(Duration::from_secs(5)))
        .await
        .unwrap()
        .is_none());
    // The foreign holder releases by compare-and-delete, without publishing: our waiter
    // still gets the key, by its safety-net retry.
    let waiter = {
        let (lock, k) = (lock.clone(), k.clone());
        tokio::spawn(async move {
            lock.lock()
                .acquire(
                    &k,
                    &waiting(Duration::from_secs(5), Duration::from_secs(10)),
                )
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let deleted: i64 = redis::Script::new("if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0")
        .key(&names.lock).arg("py-token").invoke_async(&mut raw).await.unwrap();
    assert_eq!(deleted, 1);
    let guard = waiter
        .await
        .unwrap()
        .expect("our waiter gets the key after the foreign release");
    // Ours excludes theirs, and the stored value is our owner token.
    let theirs: Option<String> = redis::cmd("SET")
        .arg(&names.lock)
        .arg("py-token")
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(theirs, None, "a foreign SET NX took a key we hold");
    let stored: String = raw.get(&names.lock).await.unwrap();
    assert_eq!(stored, guard.lease().owner().to_string());
    let pttl: i64 = raw.pttl(&names.lock).await.unwrap();
    assert!(
        pttl > 0 && pttl <= 5_000,
        "PX expiry expected, got PTTL {pttl}"
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_waiters_share_one_connection_and_unsubscribe_when_done() {
    let h = common::start(1).await;
    let lock = RedisLock::connect(&h.url()).await.unwrap();
    let holder = RedisLock::connect(&h.url()).await.unwrap();
    let mut raw = h.raw(0).await;
    let connections_before = other_client_ids(&mut raw).await.len();
    let keys: Vec<LockKey> = (0..10).map(|i| key(&format!("many-waiters/{i}"))).collect();
    let mut held = Vec::new();
    for k in &keys {
        held.push(
            holder
                .lock()
                .acquire(k, &LockOptions::new(Duration::from_secs(30)))
                .await
                .unwrap(),
        );
    }
    // 200 waiters, 20 per key, all on one client.
    let mut waiters = Vec::new();
    for i in 0..200 {
        let (lock, k) = (lock.clone(), keys[i % keys.len()].clone());
        waiters.push(tokio::spawn(async move {
            let guard = lock
                .lock()
                .acquire(
                    &k,
                    &waiting(Duration::from_secs(30), Duration::from_secs(30)),
                )
                .await?;
            guard.release().await
        }));
    }
    // One subscription per key, not per waiter, all on the client's one connection.
    timeout(Duration::from_secs(10), async {
        loop {
            let channels: Vec<String> = redis::cmd("PUBSUB")
                .arg("CHANNELS")
                .query_async(&mut raw)
                .await
                .unwrap();
            if channels.len() == keys.len() {
                break;
            }
            assert!(channels.len() < keys.len(), "{channels:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("waiters subscribe");
    assert_eq!(lock.tracked_wakeup_channels(), keys.len());
    assert_eq!(
        other_client_ids(&mut raw).await.len(),
        connections_before,
        "waiting opened connections"
    );
    for guard in held {
        guard.release().await.unwrap();
    }
    for waiter in waiters {
        timeout(Duration::from_secs(30), waiter)
            .await
            .expect("a waiter hung")
            .unwrap()
            .unwrap();
    }
    // The last waiter of each key unsubscribes.
    timeout(Duration::from_secs(10), async {
        loop {
            let channels: Vec<String> = redis::cmd("PUBSUB")
                .arg("CHANNELS")
                .query_async(&mut raw)
                .await
                .unwrap();
            if channels.is_empty() && lock.tracked_wakeup_channels() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("subscriptions are dropped when nobody waits");
}

/// Pauses every server, then acquires with a 1 s wait: the call returns on time with a
/// connection error (no answer, so the lock's state is unknown). After resuming, the
/// grant the servers apply late is released by the dropped attempt's compensation: the
/// key frees long before its TTL, and (on a single node) the next grant's token shows the
/// late one happened. Through the client's mutex handle, as `distlock::connect` returns
/// it.
async fn paused_servers_bound_acquire_by_its_wait(nodes: usize) {
    let h = common::start(nodes).await;
    let lock = RedisLock::connect(&h.url()).await.unwrap().lock();
    let k = key(&format!("paused-{nodes}"));
    // Long, so a key freed within the second acquire's wait was released, not expired.
    let ttl = Duration::from_secs(30);
    let wait = Duration::from_secs(1);
    // One grant first loads the scripts, so the paused attempt sends the grant itself
    // rather than a script lookup.
    let warm = lock.try_acquire(&k, &LockOptions::new(ttl)).await.unwrap();
    let warm = warm.expect("free at first");
    let first_token = warm.fencing_token().map(|t| t.get());
    warm.release().await.unwrap();
    for server in h.servers.lock().await.iter_mut() {
        server.pause().expect("pauses");
    }
    let started = Instant::now();
    let result = lock.acquire(&k, &waiting(ttl, wait)).await;
    let took = started.elapsed();
    for server in h.servers.lock().await.iter_mut() {
        server.resume().expect("resumes");
    }
    assert!(
        matches!(result, Err(LockError::Connection { .. })),
        "expected a connection error, got {result:?}"
    );
    assert!(
        took < wait + Duration::from_secs(1),
        "acquire took {took:?}, past its wait of {wait:?}"
    );
    // On a single node the late grant shows in the fencing record: a token above the
    // first grant's.
    let late_token = match first_token {
        Some(first) => {
            let fence = distlock_redis::KeyNames::for_key(&k).fence().to_owned();
            let mut raw = h.raw(0).await;
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let recorded: Option<u64> = raw.get(&fence).await.unwrap();
                if let Some(late) = recorded.filter(|late| *late > first) {
                    break Some(late);
                }
                assert!(
                    Instant::now() < deadline,
                    "the paused attempt was never applied"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        None => None,
    };
    let other = RedisLock::connect(&h.url()).await.unwrap();
    let guard = other
        .lock()
        .acquire(&k, &waiting(ttl, Duration::from_secs(5)))
        .await
        .expect("the late grant is released once the servers resume");
    let token = guard.fencing_token().map(|t| t.get());
    if let (Some(late), Some(token)) = (late_token, token) {
        assert!(
            token > late,
            "the paused attempt's grant was applied late ({late}), then released: {token}"
        );
    } else if nodes == 1 {
        panic!("a single node hands out tokens: {first_token:?}, {token:?}");
    } else {
        // Redlock keeps no counter: only the single-node runs can show the late grant.
        assert_eq!(token, None, "Redlock hands out no fencing token");
    }
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_server_bounds_acquire_by_its_wait() {
    paused_servers_bound_acquire_by_its_wait(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_redlock_nodes_bound_acquire_by_its_wait() {
    paused_servers_bound_acquire_by_its_wait(3).await;
}

/// A zero wait through a client's mutex handle is one try, as `NoWait` is: granted on a
/// free key, `Timeout` on a held one (not cut short by the wait's bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observed_zero_wait_is_one_try() {
    let h = common::start(1).await;
    let lock = RedisLock::connect(&h.url()).await.unwrap().lock();
    let k = key("observed-zero-wait");
    let zero = waiting(Duration::from_secs(5), Duration::ZERO);
    let guard = lock
        .acquire(&k, &zero)
        .await
        .expect("a free key is granted with a zero wait");
    let second = lock.acquire(&k, &zero).await;
    assert!(
        matches!(second, Err(LockError::Timeout { .. })),
        "expected Timeout on a held key, got {second:?}"
    );
    guard.release().await.unwrap();
}
