//! Connecting: every failure names the `host:port` that was tried, and never the
//! password of the URL.

use crate::common;

use std::time::Duration;

use distlock_api::{LockError, LockKey, LockOptions};
use distlock_postgres::{PostgresLock, PostgresXactLock};
use distlock_test_servers::PostgresServer;
use distlock_test_servers::ServerControl;

const SECRET: &str = "pg-secret-5512";

/// A loopback port with nothing listening: a server's, after the server is gone.
async fn closed_port() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().port()
}

/// Both client kinds' errors for `url`, which must not connect.
async fn refusals(url: &str) -> Vec<LockError> {
    let session = PostgresLock::connect_with(url, common::test_config()).await;
    let xact = PostgresXactLock::connect(url).await;
    let Err(session) = session else {
        panic!("the session client connected to {url}");
    };
    let Err(xact) = xact else {
        panic!("the transaction client connected to {url}");
    };
    vec![session, xact]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_listening_names_the_address() {
    let port = closed_port().await;
    let address = format!("127.0.0.1:{port}");
    for error in refusals(&format!("postgres://app:{SECRET}@{address}/app")).await {
        let message = error.to_string();
        assert!(matches!(error, LockError::Connection { .. }), "{error:?}");
        assert!(message.contains(&address), "no address in: {message}");
        assert!(!message.contains(SECRET), "password leaked: {message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_database_names_the_address() {
    let server = PostgresServer::start()
        .await
        .unwrap_or_else(|e| panic!("could not start postgres (run scripts/test.sh): {e}"));
    let address = format!("127.0.0.1:{}", server.port());
    let url = format!("postgres://postgres:{SECRET}@{address}/no_such_database");
    for error in refusals(&url).await {
        let message = error.to_string();
        assert!(matches!(error, LockError::Config { .. }), "{error:?}");
        assert!(message.contains(&address), "no address in: {message}");
        assert!(message.contains("does not exist"), "{message}");
        assert!(!message.contains(SECRET), "password leaked: {message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_gone_after_connect_is_named() {
    let mut server = PostgresServer::start()
        .await
        .unwrap_or_else(|e| panic!("could not start postgres (run scripts/test.sh): {e}"));
    let address = format!("127.0.0.1:{}", server.port());
    let lock = PostgresLock::connect_with(&server.url(), common::test_config())
        .await
        .expect("connects")
        .lock();
    let key = LockKey::new("connect/gone").unwrap();
    let options = LockOptions::new(Duration::from_secs(10));
    lock.try_acquire(&key, &options)
        .await
        .unwrap()
        .expect("free")
        .release()
        .await
        .unwrap();
    server.kill();
    for round in 0..3 {
        let error = lock
            .try_acquire(&key, &options)
            .await
            .expect_err("the server is gone");
        let message = error.to_string();
        assert!(matches!(error, LockError::Connection { .. }), "{error:?}");
        assert!(
            message.contains(&address),
            "round {round}: no address in: {message}"
        );
    }
}

/// The guard says whether its acquire met the key held: what `distlock::connect`'s
/// metrics wrapper counts as contention, without a round trip of its own. A waiter
/// queued in the server (seen in `pg_locks`) is contended; a free key is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_granted_after_a_wait_reports_contention() {
    let h = common::start().await;
    let mut raw = h.raw().await;
    let (a, b) = (h.client().await.lock(), h.client().await.lock());
    let key = LockKey::new("connect/contended").unwrap();
    let hash = distlock_postgres::advisory_key(&key);
    let options = LockOptions::new(Duration::from_secs(30))
        .with_wait(distlock_api::WaitPolicy::Timeout(Duration::from_secs(30)));
    let holder = a.acquire(&key, &options).await.unwrap();
    assert!(!holder.contended(), "a free key was reported contended");
    let waiter = tokio::spawn(async move { b.acquire(&key, &options).await });
    common::wait_for_entries(
        &mut raw,
        hash,
        Duration::from_secs(20),
        "the waiter queued behind the holder",
        |entries| entries.iter().any(|(_, granted)| !granted),
    )
    .await;
    holder.release().await.unwrap();
    let granted = waiter.await.unwrap().expect("granted after the release");
    assert!(
        granted.contended(),
        "a grant after a wait was not reported contended"
    );
    granted.release().await.unwrap();
}
