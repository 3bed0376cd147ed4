//! `distlock conformance` and `distlock status` on Redis behind Sentinel and on a
//! Redis Cluster.
#![cfg(feature = "conformance")]

use std::process::{Command, Output};
use std::time::Duration;

use distlock::{LockKey, LockOptions};
use distlock_test_servers::{RedisCluster, RedisSentinelGroup};

fn distlock(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_distlock"))
        .args(args)
        .env_remove("DISTLOCK_BACKEND")
        .output()
        .expect("the distlock binary runs")
}

/// The conformance table passes, and `status` shows a key held by this process, then free.
async fn conformance_and_status_work(url: &str) {
    let run = distlock(&["conformance", "--backend", url]);
    let table = String::from_utf8_lossy(&run.stdout);
    assert_eq!(
        run.status.code(),
        Some(0),
        "{table}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        table
            .lines()
            .last()
            .unwrap_or_default()
            .contains(" passed, 0 failed"),
        "{table}"
    );

    let locks = distlock::connect(url).await.expect("connects").lock();
    let key = LockKey::new("}topology/status").expect("valid key");
    let guard = locks
        .acquire(&key, &LockOptions::new(Duration::from_secs(60)))
        .await
        .expect("acquires");
    assert!(guard.fencing_token().is_some(), "fenced");
    let held = distlock(&["status", "--backend", url, "}topology/status", "--json"]);
    assert!(
        held.status.success(),
        "{}",
        String::from_utf8_lossy(&held.stderr)
    );
    let held: serde_json::Value = serde_json::from_slice(&held.stdout).expect("JSON");
    assert_eq!(held["held"], true, "{held}");
    // The token comes from the key's slot counter, which other keys move too: status
    // cannot tell a key's own token on Redis, and says none rather than a wrong one.
    assert!(held["fencing_token"].is_null(), "{held}");
    guard.release().await.expect("releases");
    let free = distlock(&["status", "--backend", url, "}topology/status", "--json"]);
    let free: serde_json::Value = serde_json::from_slice(&free.stdout).expect("JSON");
    assert_eq!(free["held"], false, "{free}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_and_status_work_through_sentinel() {
    let group = RedisSentinelGroup::start()
        .await
        .unwrap_or_else(|e| panic!("could not start a Sentinel group (run scripts/test.sh): {e}"));
    conformance_and_status_work(&group.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_and_status_work_on_a_cluster() {
    let cluster = RedisCluster::start()
        .await
        .unwrap_or_else(|e| panic!("could not start a Redis Cluster (run scripts/test.sh): {e}"));
    conformance_and_status_work(&cluster.url()).await;
}
