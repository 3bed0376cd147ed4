//! Session timeouts the client cannot work with are configuration errors, the same on
//! every run, and connection errors name the servers they concern; against real
//! servers.

use crate::common;

use std::time::Duration;

use distlock_api::{LockError, LockKey, LockOptions, WaitPolicy};
use distlock_test_servers::ServerControl;
use distlock_test_servers::{ZooKeeperServer, ZooKeeperServerOptions};
use distlock_zookeeper::{ZooKeeperLock, MIN_SESSION_TIMEOUT};

use common::{shared_port, start_server, url_for};

/// Far too short (`session_timeout_ms=1` used to fail as "unreachable" in most runs and
/// connect in the others), just short, and zero: refused before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_timeout_below_the_minimum_is_a_config_error_on_every_run() {
    let url = url_for(shared_port());
    let below = MIN_SESSION_TIMEOUT.as_millis() - 1;
    for ms in ["1".to_owned(), below.to_string(), "0".to_owned()] {
        for run in 0..5 {
            let result = ZooKeeperLock::connect(&format!("{url}?session_timeout_ms={ms}")).await;
            match result {
                Err(LockError::Config { message, .. }) => {
                    assert!(message.contains("500"), "{message}")
                }
                other => panic!("session_timeout_ms={ms}, run {run}: {other:?}"),
            }
        }
    }
    let at_minimum = format!(
        "{url}?session_timeout_ms={}",
        MIN_SESSION_TIMEOUT.as_millis()
    );
    let lock = ZooKeeperLock::connect(&at_minimum)
        .await
        .expect("the minimum is accepted");
    assert_eq!(lock.session_timeout(), Some(MIN_SESSION_TIMEOUT));
}

/// A server whose `maxSessionTimeout` is below the client's minimum grants a timeout
/// the client cannot work with: a configuration error naming the granted timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_negotiated_session_timeout_below_the_minimum_is_a_config_error() {
    let mut config = ZooKeeperServerOptions::default();
    config.tick_time_ms = 100;
    config.min_session_timeout_ms = 200;
    config.max_session_timeout_ms = 300;
    let server = ZooKeeperServer::start_with(config)
        .await
        .unwrap_or_else(|e| panic!("could not start ZooKeeper: {e}"));
    for _ in 0..3 {
        match ZooKeeperLock::connect(&server.url()).await {
            Err(LockError::Config { message, .. }) => {
                assert!(message.contains("300 ms"), "{message}");
                assert!(message.contains(&server.connect_string()), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
}

/// Connecting to a port nobody listens on, and acquiring after the server went away:
/// both connection errors name the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_errors_name_the_servers() {
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let nobody = format!("127.0.0.1:{}", free.port());
    match ZooKeeperLock::connect(&format!("zk://{nobody}?session_timeout_ms=2000")).await {
        Err(e @ LockError::Connection { .. }) => {
            assert!(e.to_string().contains(&nobody), "{e}")
        }
        other => panic!("{other:?}"),
    }

    let mut server = start_server().await;
    let lock = ZooKeeperLock::connect(&format!("{}?session_timeout_ms=2000", server.url()))
        .await
        .expect("connects");
    server.kill();
    let key = LockKey::new("session-config/after-kill").unwrap();
    let options = LockOptions::new(Duration::from_secs(10)).with_wait(WaitPolicy::NoWait);
    match lock.lock().try_acquire(&key, &options).await {
        Err(e @ LockError::Connection { .. }) => {
            assert!(e.to_string().contains(&server.connect_string()), "{e}")
        }
        other => panic!("{other:?}"),
    }
}
