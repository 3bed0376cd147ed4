//! The Docker provider (feature `testcontainers`): a Redis, a PostgreSQL and a
//! ZooKeeper container each serve, survive kill + restart on the same host port, and
//! report pause as unsupported. They run where a Docker engine answers; where none
//! does, each test checks that the provider refuses with a typed error naming the
//! missing engine, and prints that the live part was skipped and why.
#![cfg(feature = "testcontainers")]

use std::time::Duration;

use distlock_test_servers::{
    docker_engine, PostgresServerOptions, Provider, ServerControl, ServerError,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Starts a server through the Docker provider, or, without an engine, checks the
/// refusal and returns `None`.
async fn start_or_skip(
    test: &str,
    start: impl std::future::Future<Output = Result<Box<dyn ServerControl>, ServerError>>,
) -> Option<Box<dyn ServerControl>> {
    match docker_engine() {
        Ok(()) => Some(start.await.unwrap_or_else(|e| panic!("{test}: {e}"))),
        Err(why) => {
            let refused = start.await.err().unwrap_or_else(|| {
                panic!("{test}: no Docker engine ({why}), yet a container started")
            });
            assert!(
                matches!(&refused, ServerError::NotInstalled { what, .. } if what.contains("Docker")),
                "{test}: expected NotInstalled naming Docker, got {refused}"
            );
            eprintln!("SKIPPED: {test}: containers not started: {why}");
            None
        }
    }
}

/// True when something accepts a TCP connection on the port and answers `probe`
/// with a reply starting `expect`.
async fn answers(port: u16, probe: &[u8], expect: &[u8]) -> bool {
    let exchange = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        stream.write_all(probe).await.ok()?;
        let mut reply = vec![0; expect.len()];
        stream.read_exact(&mut reply).await.ok()?;
        Some(reply == expect)
    };
    tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

async fn kill_restart_and_refuse_pause(
    mut server: Box<dyn ServerControl>,
    probe: &[u8],
    expect: &[u8],
) {
    let port = server.port();
    assert!(
        server.url().contains(&format!("127.0.0.1:{port}")),
        "{}",
        server.url()
    );
    assert!(answers(port, probe, expect).await, "{}", server.logs());
    server.kill();
    assert!(
        !answers(port, probe, expect).await,
        "still answers after kill"
    );
    server
        .restart()
        .await
        .unwrap_or_else(|e| panic!("restart: {e}"));
    assert_eq!(server.port(), port, "restart keeps the host port");
    assert!(answers(port, probe, expect).await, "{}", server.logs());
    assert!(server.pause_unsupported().is_some());
    assert!(matches!(
        server.pause(),
        Err(ServerError::Unsupported { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_container_serves_restarts_and_reports_no_pause() {
    let test = "redis_container_serves_restarts_and_reports_no_pause";
    if let Some(server) = start_or_skip(test, Provider::Docker.redis()).await {
        kill_restart_and_refuse_pause(server, b"PING\r\n", b"+PONG").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_container_serves_restarts_and_reports_no_pause() {
    let test = "postgres_container_serves_restarts_and_reports_no_pause";
    let start = Provider::Docker.postgres(PostgresServerOptions::default());
    if let Some(server) = start_or_skip(test, start).await {
        // An SSLRequest: a PostgreSQL server answers with one byte, `N` (no TLS here).
        kill_restart_and_refuse_pause(server, &[0, 0, 0, 8, 4, 210, 22, 47], b"N").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_container_serves_restarts_and_reports_no_pause() {
    let test = "zookeeper_container_serves_restarts_and_reports_no_pause";
    if let Some(server) = start_or_skip(test, Provider::Docker.zookeeper()).await {
        kill_restart_and_refuse_pause(server, b"ruok", b"imok").await;
    }
}
