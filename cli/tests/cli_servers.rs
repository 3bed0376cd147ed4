//! The CLI against real servers: the demo and an all-pass conformance table.

use std::process::Command;

use distlock_conformance::servers::{PostgresServer, RedisServer, ZooKeeperServer};

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
