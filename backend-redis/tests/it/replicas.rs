//! Replica acknowledgement (`min_replicas=N`, `replica_timeout=`) against real
//! replicas: a master with one replica, Sentinel and Cluster. With enough replicas
//! every grant, extend and renewal counts and is on the replica when it returns; with
//! too few (more asked for than there are, or the replica paused) every grant fails
//! with a typed error and leaves nothing held, and a lease whose renewals fail turns
//! suspect, then lost.

use crate::common;

use std::time::Duration;

use distlock_api::{
    AutoRenew, Candidate, LeaseState, LockError, LockKey, LockOptions, RwMode, WaitOrder,
    WaitPolicy,
};
use distlock_redis::{KeyNames, RedisLock, TooFewReplicas};
use distlock_test_servers::{RedisCluster, RedisSentinelGroup, RedisServer, ServerControl};
use redis::AsyncCommands;

fn key(name: &str) -> LockKey {
    LockKey::new(format!("replicas/{name}")).unwrap()
}

fn no_wait() -> LockOptions {
    LockOptions::new(Duration::from_secs(10)).with_wait(WaitPolicy::NoWait)
}

fn waiting(wait: Duration) -> LockOptions {
    LockOptions::new(Duration::from_secs(10)).with_wait(WaitPolicy::Timeout(wait))
}

/// A master and its replica, linked and in sync.
async fn pair() -> (RedisServer, RedisServer) {
    let start = "could not start redis-server (run scripts/test.sh)";
    let master = RedisServer::start()
        .await
        .unwrap_or_else(|e| panic!("{start}: {e}"));
    let replica = RedisServer::start_replica_of(master.port())
        .await
        .unwrap_or_else(|e| panic!("{start}: {e}"));
    (master, replica)
}

async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// The [`TooFewReplicas`] a failed call carries, or a panic naming what came instead.
fn too_few<T: std::fmt::Debug>(what: &str, result: Result<T, LockError>) -> TooFewReplicas {
    match result {
        Err(LockError::Transient { source, .. }) => match source.downcast_ref::<TooFewReplicas>() {
            Some(short) => short.clone(),
            None => panic!("{what}: a transient error of another cause: {source}"),
        },
        other => panic!("{what}: expected too few replicas, got {other:?}"),
    }
}

/// Every primitive granted (and extended) on `client`, then released; `name` keys.
async fn every_primitive_is_granted(client: &RedisLock, name: &str) {
    let (k, fifo) = (key(name), key(&format!("{name}-fifo")));
    let guard = client.lock().acquire(&k, &no_wait()).await.unwrap();
    assert!(matches!(
        guard.extend(Duration::from_secs(10)).await.unwrap(),
        distlock_api::ExtendOutcome::Extended { .. }
    ));
    let queued = client
        .lock()
        .acquire(&fifo, &no_wait().with_order(WaitOrder::Fifo))
        .await
        .unwrap();
    let permit = client.semaphore().acquire(&k, 2, &no_wait()).await.unwrap();
    permit.extend(Duration::from_secs(10)).await.unwrap();
    let writer = client
        .rw_lock()
        .acquire(&fifo, RwMode::Write, &no_wait())
        .await
        .unwrap();
    let leader = client
        .election()
        .campaign(&k, &Candidate::new("a").unwrap(), &no_wait())
        .await
        .unwrap();
    leader.extend(Duration::from_secs(10)).await.unwrap();
    guard.release().await.unwrap();
    queued.release().await.unwrap();
    permit.release().await.unwrap();
    writer.release().await.unwrap();
    leader.resign().await.unwrap();
}

/// Every primitive refused on `client` with [`TooFewReplicas`] (`required` asked for),
/// and nothing held afterwards: `plain`, a client without the requirement, takes
/// every key at once.
async fn every_grant_is_refused(client: &RedisLock, plain: &RedisLock, name: &str, required: u32) {
    let (k, fifo) = (key(name), key(&format!("{name}-fifo")));
    let checks = [
        too_few("mutex", client.lock().try_acquire(&k, &no_wait()).await),
        too_few(
            "FIFO",
            client
                .lock()
                .acquire(&fifo, &no_wait().with_order(WaitOrder::Fifo))
                .await,
        ),
        too_few(
            "semaphore",
            client.semaphore().acquire(&k, 2, &no_wait()).await,
        ),
        too_few(
            "writer",
            client
                .rw_lock()
                .acquire(&k, RwMode::Write, &no_wait())
                .await,
        ),
        too_few(
            "election",
            client
                .election()
                .campaign(&k, &Candidate::new("a").unwrap(), &no_wait())
                .await,
        ),
    ];
    for short in checks {
        assert_eq!(short.required, required);
        assert!(short.acknowledged < u64::from(required), "{short:?}");
        assert!(short.to_string().contains("min_replicas"), "{short}");
    }
    // Nothing is held: every grant was released before the error returned.
    let guard = plain.lock().try_acquire(&fifo, &no_wait()).await.unwrap();
    guard
        .expect("the mutex was left free")
        .release()
        .await
        .unwrap();
    let permits = plain
        .semaphore()
        .try_acquire(&k, 1, &no_wait())
        .await
        .unwrap();
    permits
        .expect("the semaphore was left free (the count goes with its holders)")
        .release()
        .await
        .unwrap();
    let writer = plain
        .rw_lock()
        .try_acquire(&k, RwMode::Write, &no_wait())
        .await
        .unwrap();
    writer
        .expect("the rw lock was left free")
        .release()
        .await
        .unwrap();
    let leader = plain
        .election()
        .try_campaign(&k, &Candidate::new("b").unwrap(), &no_wait())
        .await
        .unwrap();
    leader.expect("nobody leads").resign().await.unwrap();
    let guard = plain.lock().try_acquire(&k, &no_wait()).await.unwrap();
    guard
        .expect("the mutex was left free")
        .release()
        .await
        .unwrap();
    // A waiting acquire retries the refusal under its error patience; cut at its
    // deadline while a retry's WAIT still waits, it says the server did not answer,
    // and releases that attempt's grant in the background.
    match client
        .lock()
        .acquire(&k, &waiting(Duration::from_millis(300)))
        .await
    {
        Err(LockError::Connection { .. }) => {}
        other => {
            too_few("mutex, waiting", other);
        }
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(guard) = plain.lock().try_acquire(&k, &no_wait()).await.unwrap() {
            guard.release().await.unwrap();
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cut attempt's grant was never released"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// With its one replica up, `min_replicas=1` grants, extends and renews every
/// primitive, and each grant is on the replica by the time the call returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_and_extends_count_once_the_replica_acknowledges() {
    let (master, replica) = pair().await;
    let client = RedisLock::connect(&format!(
        "{}?min_replicas=1&replica_timeout=1000",
        master.url()
    ))
    .await
    .unwrap();
    let mut on_replica = raw(&replica.url()).await;
    let k = key("on-replica");
    let guard = client.lock().acquire(&k, &no_wait()).await.unwrap();
    // WAIT returned only once the replica had the grant (and its token's counter).
    let held: Option<String> = on_replica.get(KeyNames::for_key(&k).lock).await.unwrap();
    assert!(held.is_some(), "the grant is not on the replica");
    let counter: Option<u64> = on_replica.get(KeyNames::for_key(&k).fence()).await.unwrap();
    assert_eq!(counter, guard.fencing_token().map(|t| t.get()));
    guard.release().await.unwrap();
    // A waiter's grant (the acquire script) too.
    let holder = client.lock().acquire(&k, &no_wait()).await.unwrap();
    let waiter = {
        let (client, k) = (client.clone(), k.clone());
        tokio::spawn(async move {
            client
                .lock()
                .acquire(&k, &waiting(Duration::from_secs(10)))
                .await
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while client.waiters_in_line(&k) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the waiter never waited"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    holder.release().await.unwrap();
    let granted = waiter.await.unwrap().unwrap();
    assert!(granted.contended());
    granted.release().await.unwrap();
    every_primitive_is_granted(&client, "single").await;
}

/// More replicas asked for than there are: every grant is refused with
/// [`TooFewReplicas`] and released, on every primitive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_replicas_than_there_are_refuse_every_grant_and_hold_nothing() {
    let (master, _replica) = pair().await;
    let client = RedisLock::connect(&format!(
        "{}?min_replicas=2&replica_timeout=100",
        master.url()
    ))
    .await
    .unwrap();
    let plain = RedisLock::connect(&master.url()).await.unwrap();
    every_grant_is_refused(&client, &plain, "two", 2).await;
    // Without any replica at all, `min_replicas=1` refuses alike.
    let alone = RedisServer::start().await.unwrap();
    let client = RedisLock::connect(&format!(
        "{}?min_replicas=1&replica_timeout=100",
        alone.url()
    ))
    .await
    .unwrap();
    let plain = RedisLock::connect(&alone.url()).await.unwrap();
    every_grant_is_refused(&client, &plain, "alone", 1).await;
    let mut raw = raw(&alone.url()).await;
    common::until_nothing_left(&mut raw, Duration::from_secs(10)).await;
}

/// The replica stops answering (SIGSTOP): a held lease's renewals are not counted, so
/// it turns suspect, then lost at its deadline; new grants are refused and released.
/// Once the replica answers again, grants count again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_replica_makes_renewals_fail_and_grants_refused_until_it_answers() {
    let (master, mut replica) = pair().await;
    let client = RedisLock::connect(&format!(
        "{}?min_replicas=1&replica_timeout=200",
        master.url()
    ))
    .await
    .unwrap();
    let plain = RedisLock::connect(&master.url()).await.unwrap();
    let ttl = Duration::from_secs(2);
    let renewed = LockOptions::new(ttl)
        .with_wait(WaitPolicy::NoWait)
        .with_auto_renew(AutoRenew::new().with_interval(Duration::from_millis(300)));
    let k = key("paused");
    let guard = client.lock().acquire(&k, &renewed).await.unwrap();
    replica.pause().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while guard.state() == LeaseState::Held {
        assert!(
            tokio::time::Instant::now() < deadline,
            "renewals kept counting without the replica"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(guard.state(), LeaseState::Suspect);
    too_few("a manual extend", guard.extend(ttl).await);
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the lease was never lost");
    assert!(tokio::time::Instant::now() >= guard.valid_until());
    drop(guard);
    every_grant_is_refused(&client, &plain, "paused-refused", 1).await;
    replica.resume().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let again = loop {
        match client.lock().try_acquire(&key("resumed"), &no_wait()).await {
            Ok(guard) => break guard.expect("a fresh key is free"),
            Err(error) => {
                too_few("before the replica caught up", Err::<(), _>(error));
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "grants never counted again"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    again.release().await.unwrap();
}

/// `min_replicas` is refused where it means nothing (Redlock), and a replica timeout
/// the request timeout would cut is a configuration error, before any connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_options_are_checked_at_connect() {
    let redlock = "redis+redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?min_replicas=1";
    assert!(matches!(
        RedisLock::connect(redlock).await,
        Err(LockError::Unsupported {
            operation: "min_replicas",
            ..
        })
    ));
    for url in [
        "redis://127.0.0.1:1?min_replicas=1&replica_timeout=2s",
        "redis://127.0.0.1:1?replica_timeout=0",
        "redis://127.0.0.1:1?min_replicas=x",
        "redis+cluster://127.0.0.1:1?min_replicas=1&min_replicas=1",
    ] {
        match RedisLock::connect(url).await {
            Err(LockError::Config { message, .. }) => {
                assert!(!message.contains("redis://"), "{message}")
            }
            other => panic!("{url}: {other:?}"),
        }
    }
}

/// Sentinel (a master and one replica): acknowledged grants with `min_replicas=1`,
/// typed refusals holding nothing with `min_replicas=2`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_grants_wait_for_the_replica() {
    let group = RedisSentinelGroup::start()
        .await
        .unwrap_or_else(|e| panic!("could not start a Sentinel group (run scripts/test.sh): {e}"));
    let url = group.url();
    let client = RedisLock::connect(&format!("{url}?min_replicas=1"))
        .await
        .unwrap();
    every_primitive_is_granted(&client, "sentinel").await;
    let client = RedisLock::connect(&format!("{url}?min_replicas=2&replica_timeout=100"))
        .await
        .unwrap();
    let plain = RedisLock::connect(&url).await.unwrap();
    every_grant_is_refused(&client, &plain, "sentinel-two", 2).await;
}

/// Cluster (three masters, one replica each): the `WAIT` goes to the lock's master
/// with its write; acknowledged with `min_replicas=1`, refused with 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_grants_wait_for_the_slots_replica() {
    let cluster = RedisCluster::start()
        .await
        .unwrap_or_else(|e| panic!("could not start a Redis Cluster (run scripts/test.sh): {e}"));
    let url = cluster.url();
    let client = RedisLock::connect(&format!("{url}?min_replicas=1"))
        .await
        .unwrap();
    // Keys on every master.
    for n in 0..6 {
        every_primitive_is_granted(&client, &format!("cluster-{n}")).await;
    }
    let client = RedisLock::connect(&format!("{url}?min_replicas=2&replica_timeout=100"))
        .await
        .unwrap();
    let plain = RedisLock::connect(&url).await.unwrap();
    for n in 0..3 {
        every_grant_is_refused(&client, &plain, &format!("cluster-two-{n}"), 2).await;
    }
}
