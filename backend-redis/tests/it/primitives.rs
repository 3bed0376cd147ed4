//! The semaphore and the read-write lock on a real single redis-server: the kit's
//! scenarios for both (every client behind its own fault proxy, so the crash scenarios
//! run), nothing left behind, bad input, and Redlock's refusal. Sentinel and Cluster
//! run the same scenarios through `common::kit_passes`.

use crate::common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{LockError, LockKey, LockOptions, RwMode, WaitPolicy};
use distlock_conformance::{Client, Harness};
use distlock_conformance_faults::NetFaults;
use distlock_redis::RedisLock;
use distlock_test_servers::{FaultProxy, RedisServer};

/// One throwaway server; every client connects through its own proxy, which its
/// crash hook cuts. The harness keeps the proxies alive: scenarios drop a `Client`
/// once they took its handles out.
struct ProxiedNode {
    server: RedisServer,
    proxies: Mutex<Vec<FaultProxy>>,
}

#[async_trait]
impl Harness for ProxiedNode {
    fn name(&self) -> String {
        format!("redis://127.0.0.1:{}", self.server.port())
    }

    async fn client(&self) -> Result<Client, LockError> {
        let upstream = SocketAddr::from(([127, 0, 0, 1], self.server.port()));
        let proxy = FaultProxy::start(upstream)
            .await
            .map_err(|e| LockError::connection("redis", e.to_string()))?;
        self.proxies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(proxy.clone());
        let url = format!("redis://127.0.0.1:{}", proxy.local_addr().port());
        let lock = RedisLock::connect(&url).await?;
        Ok(Client::new(lock.client()).with_faults(Arc::new(NetFaults::new(vec![proxy]))))
    }
}

async fn server() -> RedisServer {
    RedisServer::start().await.unwrap_or_else(|e| {
        panic!("could not start redis-server (run scripts/test.sh, which installs it): {e}")
    })
}

macro_rules! kit_scenarios {
    ($($name:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let harness: Arc<dyn Harness> = Arc::new(ProxiedNode {
                    server: server().await,
                    proxies: Mutex::default(),
                });
                distlock_conformance::run_scenario_test(stringify!($name), harness).await;
            }
        )+
    };
}

kit_scenarios!(
    semaphore_grants_exactly_max,
    semaphore_never_admits_more_than_max,
    semaphore_dropped_permit_is_freed,
    semaphore_crashed_holder_is_freed,
    semaphore_cancelled_acquire_leaks_nothing,
    semaphore_bad_counts_are_typed_errors,
    rw_readers_overlap,
    rw_reader_and_writer_never_overlap,
    rw_waiting_writer_is_not_starved,
    rw_cancelled_acquire_leaks_nothing,
    rw_bad_options_are_typed_errors,
);

fn key(name: &str) -> LockKey {
    LockKey::new(name).expect("valid key")
}

fn no_wait(ttl: Duration) -> LockOptions {
    LockOptions::new(ttl).with_wait(WaitPolicy::NoWait)
}

async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{}", server.port()))
        .expect("valid URL")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

/// Every key of both primitives expires: released holders, a waiter that gave up
/// (its waiting marker and writer intent), holders whose lease ran out unrenewed, and
/// the fencing counters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_left_behind() {
    let server = server().await;
    let lock = RedisLock::connect(&server.url()).await.expect("connects");
    let (semaphore, rw) = (lock.semaphore(), lock.rw_lock());
    let ttl = Duration::from_millis(600);
    let jobs = key("jobs");
    let held = semaphore
        .try_acquire(&jobs, 2, &no_wait(ttl))
        .await
        .unwrap();
    let held = held.expect("a free semaphore grants");
    let other = semaphore
        .try_acquire(&jobs, 2, &no_wait(ttl))
        .await
        .unwrap();
    // Ends by expiring, without a release.
    std::mem::forget(other.expect("the second permit"));
    // A waiter that gives up marks the key waited on.
    let waited = LockOptions::new(ttl).with_wait(WaitPolicy::Timeout(Duration::from_millis(200)));
    let _ = semaphore.acquire(&jobs, 2, &waited).await;
    held.release().await.unwrap();

    let prices = key("prices");
    let reader = rw
        .try_acquire(&prices, RwMode::Read, &no_wait(ttl))
        .await
        .unwrap();
    let reader = reader.expect("a free key grants a reader");
    // A writer gives up behind the reader (its intent withdrawn, its marker left).
    let gave_up = rw.acquire(&prices, RwMode::Write, &waited).await;
    assert!(
        matches!(gave_up, Err(LockError::Timeout { .. })),
        "{gave_up:?}"
    );
    let expiring = rw
        .try_acquire(&prices, RwMode::Read, &no_wait(ttl))
        .await
        .unwrap()
        .expect("readers share once the writer gave up");
    std::mem::forget(expiring);
    reader.release().await.unwrap();
    let writer = rw
        .acquire(&key("w"), RwMode::Write, &no_wait(ttl))
        .await
        .unwrap();
    writer.release().await.unwrap();

    let mut raw = raw(&server).await;
    common::until_nothing_left(&mut raw, ttl).await;
}

/// Zero permits, permits above the bound and a mismatched count are typed errors
/// that take nothing; a key of another type is a backend error naming it, for both
/// primitives, and leaves the key as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_typed_error() {
    let server = server().await;
    let lock = RedisLock::connect(&server.url()).await.expect("connects");
    let (semaphore, rw) = (lock.semaphore(), lock.rw_lock());
    let options = no_wait(Duration::from_secs(5));
    let jobs = key("jobs");
    for bad in [0, distlock_api::MAX_PERMITS + 1] {
        let refused = semaphore.try_acquire(&jobs, bad, &options).await;
        assert!(
            matches!(refused, Err(LockError::InvalidOptions { .. })),
            "{bad}: {refused:?}"
        );
    }
    let held = semaphore.try_acquire(&jobs, 3, &options).await.unwrap();
    let held = held.expect("granted");
    for acquire in [
        semaphore.try_acquire(&jobs, 4, &options).await,
        semaphore
            .acquire(&jobs, 2, &options.clone().with_wait(WaitPolicy::Forever))
            .await
            .map(Some),
    ] {
        match acquire {
            Err(LockError::PermitMismatch { source, .. }) => {
                assert_eq!(source.in_use, 3);
            }
            other => panic!("a mismatched count was not refused: {other:?}"),
        }
    }
    held.release().await.unwrap();
    // Nobody holds a permit: a new count is the key's now.
    let again = semaphore.try_acquire(&jobs, 4, &options).await.unwrap();
    again
        .expect("the last holder took the old count along")
        .release()
        .await
        .unwrap();

    let mut raw = raw(&server).await;
    for (name, taken) in [("{odd}:semaphore", "sem"), ("{odd}:rw", "rw")] {
        let _: () = redis::cmd("SET")
            .arg(name)
            .arg("x")
            .query_async(&mut raw)
            .await
            .unwrap();
        let refused = match taken {
            "sem" => semaphore.try_acquire(&key("odd"), 1, &options).await,
            _ => rw.try_acquire(&key("odd"), RwMode::Read, &options).await,
        };
        match refused {
            Err(error @ LockError::Backend { .. }) => {
                let text = format!("{error} {:?}", std::error::Error::source(&error));
                assert!(text.contains(name), "{text}");
            }
            other => panic!("a key of another type was not refused: {other:?}"),
        }
        let kept: String = redis::cmd("GET")
            .arg(name)
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(kept, "x");
    }
}

/// Redlock offers neither primitive, and says why, in its capabilities and when
/// asked for one (at acquire).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_refuses_both_with_its_reason() {
    let harness = common::start(3).await;
    let lock = RedisLock::connect(&harness.url()).await.expect("connects");
    let capabilities = lock.lock().info().capabilities;
    for capability in [capabilities.semaphore.offered, capabilities.rw_lock.offered] {
        match capability {
            distlock_api::Capability::Unsupported(reason) => {
                assert!(reason.contains("majorit"), "{reason}")
            }
            distlock_api::Capability::Supported => panic!("Redlock claims a primitive"),
        }
    }
    let options = no_wait(Duration::from_secs(5));
    let jobs = key("jobs");
    assert!(matches!(
        lock.semaphore().try_acquire(&jobs, 2, &options).await,
        Err(LockError::Unsupported { .. })
    ));
    assert!(matches!(
        lock.rw_lock()
            .try_acquire(&jobs, RwMode::Read, &options)
            .await,
        Err(LockError::Unsupported { .. })
    ));
    let single = RedisLock::connect(&common::url_for(&harness.ports[..1]))
        .await
        .expect("connects");
    let capabilities = single.lock().info().capabilities;
    assert!(
        capabilities.semaphore.offered.is_supported()
            && capabilities.rw_lock.offered.is_supported()
    );
    let semaphore = single.semaphore();
    assert!(semaphore
        .info()
        .capabilities
        .semaphore
        .offered
        .is_supported());
    let rw = single.rw_lock();
    assert!(rw.info().capabilities.rw_lock.offered.is_supported());
}

/// On a Cluster, every script of both primitives names keys of one slot, keys whose
/// hash tag would be empty included (else the Cluster refuses them with CROSSSLOT),
/// and a waiter is woken across the Cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_keys_whose_tag_would_be_empty_work() {
    let cluster = distlock_test_servers::RedisCluster::start()
        .await
        .unwrap_or_else(|e| panic!("could not start a Redis Cluster (run scripts/test.sh): {e}"));
    let lock = RedisLock::connect(&cluster.url()).await.expect("connects");
    let (semaphore, rw) = (lock.semaphore(), lock.rw_lock());
    let options = no_wait(Duration::from_secs(5));
    let waiting = LockOptions::new(Duration::from_secs(5))
        .with_wait(WaitPolicy::Timeout(Duration::from_secs(10)));
    for name in ["}", "}x", "}}y{}", "a}b"] {
        let k = key(name);
        let permit = semaphore.try_acquire(&k, 1, &options).await.unwrap();
        let permit = permit.unwrap_or_else(|| panic!("{name:?}: a free semaphore grants"));
        assert!(permit.extend(Duration::from_secs(5)).await.is_ok());
        let waiter = {
            let (semaphore, k, waiting) = (semaphore.clone(), k.clone(), waiting.clone());
            tokio::spawn(async move { semaphore.acquire(&k, 1, &waiting).await })
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while lock.tracked_wakeup_channels() == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name:?}: nobody waited"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        permit.release().await.unwrap();
        waiter.await.unwrap().unwrap().release().await.unwrap();
        let reader = rw.try_acquire(&k, RwMode::Read, &options).await.unwrap();
        let reader = reader.unwrap_or_else(|| panic!("{name:?}: a free key grants a reader"));
        let writer = {
            let (rw, k, waiting) = (rw.clone(), k.clone(), waiting.clone());
            tokio::spawn(async move { rw.acquire(&k, RwMode::Write, &waiting).await })
        };
        while lock.tracked_wakeup_channels() == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name:?}: no writer waited"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        reader.release().await.unwrap();
        writer.await.unwrap().unwrap().release().await.unwrap();
    }
}

/// Extending a permit or a write grant keeps it past its first TTL (others stay
/// refused), and every grant's fencing token is above the one before it on the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_keeps_grants_and_tokens_rise() {
    let server = server().await;
    let lock = RedisLock::connect(&server.url()).await.expect("connects");
    let (semaphore, rw) = (lock.semaphore(), lock.rw_lock());
    let ttl = Duration::from_millis(400);
    let (jobs, prices) = (key("jobs"), key("prices"));
    let permit = semaphore
        .try_acquire(&jobs, 1, &no_wait(ttl))
        .await
        .unwrap();
    let permit = permit.expect("granted");
    let writer = rw
        .try_acquire(&prices, RwMode::Write, &no_wait(ttl))
        .await
        .unwrap();
    let writer = writer.expect("granted");
    // Past three TTLs, extended every half TTL.
    for _ in 0..6 {
        tokio::time::sleep(ttl / 2).await;
        for extended in [permit.extend(ttl).await, writer.extend(ttl).await] {
            assert!(
                matches!(extended, Ok(distlock_api::ExtendOutcome::Extended { .. })),
                "{extended:?}"
            );
        }
    }
    assert!(semaphore
        .try_acquire(&jobs, 1, &no_wait(ttl))
        .await
        .unwrap()
        .is_none());
    assert!(rw
        .try_acquire(&prices, RwMode::Read, &no_wait(ttl))
        .await
        .unwrap()
        .is_none());

    let mut last = permit.fencing_token().expect("permits carry tokens");
    permit.release().await.unwrap();
    for _ in 0..3 {
        let next = semaphore
            .try_acquire(&jobs, 2, &no_wait(ttl))
            .await
            .unwrap();
        let next = next.expect("granted");
        let token = next.fencing_token().expect("permits carry tokens");
        assert!(token > last, "{token:?} after {last:?}");
        last = token;
        next.release().await.unwrap();
    }
    let mut last = writer.fencing_token().expect("grants carry tokens");
    writer.release().await.unwrap();
    for mode in [RwMode::Read, RwMode::Read, RwMode::Write] {
        let next = rw.try_acquire(&prices, mode, &no_wait(ttl)).await.unwrap();
        let next = next.expect("granted");
        let token = next.fencing_token().expect("grants carry tokens");
        assert!(token > last, "{mode:?}: {token:?} after {last:?}");
        last = token;
        next.release().await.unwrap();
    }
}

/// A waiting writer whose process dies (its connection cut, no withdrawal) holds new
/// readers back only until its intent lapses: twice the backoff cap plus a second
/// after its last retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_writers_intent_lapses() {
    let server = server().await;
    let lock = RedisLock::connect(&server.url()).await.expect("connects");
    let rw = lock.rw_lock();
    let upstream = SocketAddr::from(([127, 0, 0, 1], server.port()));
    let proxy = FaultProxy::start(upstream).await.expect("proxy starts");
    let doomed = RedisLock::connect(&format!("redis://127.0.0.1:{}", proxy.local_addr().port()))
        .await
        .expect("connects through the proxy")
        .rw_lock();
    let ttl = Duration::from_secs(30);
    let prices = key("prices");
    let reader = rw
        .try_acquire(&prices, RwMode::Read, &no_wait(ttl))
        .await
        .unwrap();
    let reader = reader.expect("a free key grants a reader");
    let writer = tokio::spawn({
        let prices = prices.clone();
        async move {
            let forever = LockOptions::new(ttl).with_wait(WaitPolicy::Forever);
            doomed.acquire(&prices, RwMode::Write, &forever).await
        }
    });
    // The writer's intent holds readers back.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while rw
        .try_acquire(&prices, RwMode::Read, &no_wait(ttl))
        .await
        .unwrap()
        .is_some()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the writer never held readers back"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    proxy.cut();
    let cut = tokio::time::Instant::now();
    // Default backoff cap 500 ms: the intent lapses within 2 s of the last retry.
    let bound = Duration::from_secs(2) + Duration::from_secs(3);
    let second = loop {
        if let Some(second) = rw
            .try_acquire(&prices, RwMode::Read, &no_wait(ttl))
            .await
            .unwrap()
        {
            break second;
        }
        assert!(
            cut.elapsed() < bound,
            "the crashed writer's intent did not lapse within {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        cut.elapsed() >= Duration::from_millis(500),
        "the intent lapsed before its time"
    );
    second.release().await.unwrap();
    reader.release().await.unwrap();
    writer.abort();
}
