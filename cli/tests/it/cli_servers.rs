//! The CLI against real servers: the demo and an all-pass conformance table.
#![cfg(feature = "conformance")]

use std::process::Command;

use distlock_test_servers::{PostgresServer, RedisServer, ZooKeeperServer, ZooKeeperTlsServer};

async fn server() -> RedisServer {
    RedisServer::start()
        .await
        .unwrap_or_else(|e| panic!("could not start redis-server (run scripts/test.sh): {e}"))
}

/// Runs the demo and the conformance table against `url`, asserting both pass; the
/// demo's fencing act runs when `fencing_act` is true and says it is skipped otherwise.
fn demo_and_conformance_pass(url: &str, fencing_act: bool) {
    let demo = Command::new(env!("CARGO_BIN_EXE_distlock"))
        .args(["demo", "--backend", url])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&demo.stdout);
    assert_eq!(
        demo.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&demo.stderr)
    );
    assert!(stdout.contains("700") && stdout.contains("500"), "{stdout}");
    let expected = if fencing_act {
        "stale write rejected"
    } else {
        "fencing act skipped"
    };
    assert!(stdout.contains(expected), "{stdout}");

    let run = Command::new(env!("CARGO_BIN_EXE_distlock"))
        .args(["conformance", "--backend", url])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&run.stdout);
    assert_eq!(
        run.status.code(),
        Some(0),
        "{table}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let last = table.lines().last().unwrap_or_default();
    assert!(last.contains(" passed, 0 failed"), "{table}");
    assert!(!table.contains("FAIL "), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_and_conformance_pass_on_redis() {
    let server = server().await;
    demo_and_conformance_pass(&server.url(), true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_and_conformance_pass_on_postgres() {
    let server = PostgresServer::start()
        .await
        .unwrap_or_else(|e| panic!("could not start PostgreSQL (run scripts/test.sh): {e}"));
    demo_and_conformance_pass(&server.url(), true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_and_conformance_pass_on_zookeeper() {
    let server = ZooKeeperServer::start()
        .await
        .unwrap_or_else(|e| panic!("could not start ZooKeeper (run scripts/test.sh): {e}"));
    // A session-bound lease has no TTL expiry for the fencing act to use.
    demo_and_conformance_pass(&server.url(), false);
}

/// `distlock status --json` on `url` while this process holds `key` through it.
async fn status_sees_the_holder(url: &str) {
    let locks = distlock::connect(url).await.unwrap().lock();
    let key = distlock::LockKey::new("status/secure").unwrap();
    let options = distlock::LockOptions::new(std::time::Duration::from_secs(30));
    let guard = locks.acquire(&key, &options).await.unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_distlock"))
        .args(["status", "--backend", url, "status/secure", "--json"])
        .env_remove("DISTLOCK_BACKEND")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["held"], true, "{status}");
    assert_eq!(
        status["fencing_token"],
        guard.fencing_token().unwrap().get(),
        "{status}"
    );
    guard.release().await.unwrap();
}

/// `zookeeper+tls://` with a client certificate, and digest credentials over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_conformance_and_status_pass_on_zookeeper_tls() {
    let server = ZooKeeperTlsServer::start(true).await.unwrap_or_else(|e| {
        panic!("could not start ZooKeeper with TLS (run scripts/test.sh): {e}")
    });
    demo_and_conformance_pass(&server.url(), false);
    status_sees_the_holder(&server.url()).await;
    demo_and_conformance_pass(&server.url_with_credentials("app:secret"), false);
    status_sees_the_holder(&server.url_with_credentials("app:secret")).await;
}

/// Digest credentials (creator-only ACLs); `status` also works without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_conformance_and_status_pass_on_zookeeper_with_credentials() {
    let server = ZooKeeperServer::start()
        .await
        .unwrap_or_else(|e| panic!("could not start ZooKeeper (run scripts/test.sh): {e}"));
    let url = format!("zookeeper://app:secret@{}/acl", server.connect_string());
    demo_and_conformance_pass(&url, false);
    status_sees_the_holder(&url).await;
}

/// A wrong ZooKeeper password on a lock held with the right one: exit code 2
/// (a configuration error) with one line on stderr, at once, and the command never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_zookeeper_password_is_a_one_line_configuration_error() {
    let server = ZooKeeperServer::start()
        .await
        .unwrap_or_else(|e| panic!("could not start ZooKeeper (run scripts/test.sh): {e}"));
    let url = |password: &str| format!("zookeeper://app:{password}@{}", server.connect_string());
    let owner = distlock::connect(&url("right")).await.unwrap().lock();
    let key = distlock::LockKey::new("guarded").unwrap();
    let guard = owner
        .acquire(
            &key,
            &distlock::LockOptions::new(std::time::Duration::from_secs(30)),
        )
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_distlock"))
        .args([
            "exec",
            "--backend",
            &url("wrong"),
            "--wait",
            "20s",
            "guarded",
            "--",
            "echo",
            "ran",
        ])
        .env_remove("DISTLOCK_BACKEND")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("NoAuth") && !stderr.contains("wrong@"),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ran"));
    assert!(
        started.elapsed() < std::time::Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    guard.release().await.unwrap();
}

#[tokio::test]
async fn unreachable_redis_is_a_one_line_connection_error() {
    // Nothing listens on a port we just freed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = Command::new(env!("CARGO_BIN_EXE_distlock"))
        .args(["demo", "--backend", &format!("redis://127.0.0.1:{port}")])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("error: ") && !stderr.contains("panicked"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_report_on_redis_as_table_and_html_and_on_memory_as_json() {
    let server = server().await;
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("faults.html");
    let run = Command::new(env!("CARGO_BIN_EXE_distlock"))
        .args([
            "conformance",
            "--faults",
            "--backend",
            &server.url(),
            "--html",
        ])
        .arg(&page)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&run.stdout);
    assert_eq!(
        run.status.code(),
        Some(0),
        "{table}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    // Network faults run through proxies; server faults need --spawn.
    for row in [
        "PASS   partitioned_holder_is_fenced_off",
        "PASS   lost_reply_after_applied_acquire",
        "PASS   contention_under_random_faults",
        "SKIP   server_restart_while_held_and_waited",
    ] {
        assert!(table.contains(row), "no {row:?} in\n{table}");
    }
    assert!(
        table.contains("server not controlled by the harness"),
        "{table}"
    );
    assert!(
        table
            .lines()
            .last()
            .unwrap_or_default()
            .contains("0 failed"),
        "{table}"
    );
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.starts_with("<!DOCTYPE html>") && html.contains("<svg"),
        "{html}"
    );
    assert!(html.contains("contention_under_random_faults") && !html.contains("<script"));

    let run = Command::new(env!("CARGO_BIN_EXE_distlock"))
        .args([
            "conformance",
            "--faults",
            "--json",
            "--backend",
            "memory://faults-json",
        ])
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(0));
    let json: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(json["backend"], "memory");
    let results = json["results"].as_array().unwrap();
    let pause = results
        .iter()
        .find(|r| r["name"] == "paused_holder_wakes_to_a_refused_write")
        .unwrap();
    assert_eq!(pause["verdict"]["status"], "pass", "{pause}");
    assert_eq!(pause["violations"], 0);
    assert!(pause["operations"].as_u64().unwrap() > 0);
    assert_eq!(pause["claim"]["claim"], "safe");
}
