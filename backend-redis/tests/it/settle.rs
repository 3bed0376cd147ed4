//! Clean-ups spawned by drops against a real redis-server: a program that awaits
//! `settle_cleanups` before shutting its runtime down leaves no lock behind, neither a
//! dropped guard's nor one granted to an acquire that was dropped while the grant's
//! answer was on its way (shutting a runtime down drops its unfinished tasks, and the
//! lock would stay held until its TTL).

use crate::common;

use std::time::Duration;

use distlock_api::{settle_cleanups, LockKey, LockOptions};
use distlock_redis::{KeyNames, RedisLock};
use tokio::runtime::Runtime;
use tokio::time::Instant;

const LONG_TTL: Duration = Duration::from_secs(60);

/// A runtime of the program under test, shut down at the end without waiting.
fn program_runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The owner token stored in `key`'s lock, if it is held.
async fn holder(raw: &mut redis::aio::MultiplexedConnection, key: &LockKey) -> Option<String> {
    redis::cmd("GET")
        .arg(KeyNames::for_key(key).lock)
        .query_async(raw)
        .await
        .unwrap()
}

#[test]
fn a_dropped_guard_is_released_before_a_settled_runtime_shuts_down() {
    let harness = program_runtime();
    let h = harness.block_on(common::start(1));
    let k = LockKey::new("settle/guard").unwrap();
    let program = program_runtime();
    program.block_on(async {
        let locks = RedisLock::connect(&h.url()).await.unwrap();
        let guard = locks
            .lock()
            .acquire(&k, &LockOptions::new(LONG_TTL))
            .await
            .unwrap();
        drop(guard);
        assert!(settle_cleanups(Duration::from_secs(10)).await);
    });
    program.shutdown_background();
    harness.block_on(async {
        let mut raw = h.raw(0).await;
        assert_eq!(
            holder(&mut raw, &k).await,
            None,
            "the lock outlived the program"
        );
    });
}

#[test]
fn a_grant_that_reaches_a_dropped_acquire_is_released_before_a_settled_runtime_shuts_down() {
    let harness = program_runtime();
    let h = harness.block_on(common::start(1));
    let k = LockKey::new("settle/late-grant").unwrap();
    let (lock, proxies) = harness.block_on(h.proxied_client());
    drop(lock);
    let url = format!("redis://127.0.0.1:{}", proxies[0].local_addr().port());
    let program = program_runtime();
    program.block_on(async {
        let locks = RedisLock::connect(&url).await.unwrap().lock();
        let mut raw = h.raw(0).await;
        // A slow link: the grant is applied 150 ms before its answer arrives.
        proxies[0].set_latency(Duration::from_millis(150));
        let applied = async {
            let deadline = Instant::now() + Duration::from_secs(20);
            while holder(&mut raw, &k).await.is_none() {
                assert!(
                    Instant::now() < deadline,
                    "the grant never reached the server"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        let options = LockOptions::new(LONG_TTL);
        tokio::select! {
            acquired = locks.acquire(&k, &options) => {
                panic!("the answer came before the server showed the grant: {acquired:?}")
            }
            () = applied => {}
        }
        // The acquire is dropped with the grant on its way back: undone in the background.
        assert!(settle_cleanups(Duration::from_secs(10)).await);
    });
    program.shutdown_background();
    harness.block_on(async {
        let mut raw = h.raw(0).await;
        assert_eq!(
            holder(&mut raw, &k).await,
            None,
            "the lock outlived the program"
        );
    });
}
