//! Bad input and misconfiguration: each a typed error within the request timeout, with
//! nothing left held.

use crate::common;

use std::time::Duration;

use distlock_api::LockError;
use distlock_mysql::{MySqlConfig, MySqlLock, CREATE_TABLES};
use tokio::time::Instant;

/// Connects to `url` with the test settings; the error, and how long it took.
async fn refused(url: &str) -> (LockError, Duration) {
    let started = Instant::now();
    match MySqlLock::connect_with(url, common::test_config()).await {
        Ok(_) => panic!("connected to {url}"),
        Err(e) => (e, started.elapsed()),
    }
}

/// The request timeout plus slack for a loaded machine.
fn within() -> Duration {
    common::test_config().request_timeout + Duration::from_secs(3)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_a_connection_error_in_time() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (error, took) = refused(&format!("mysql://u:secret@127.0.0.1:{port}/db")).await;
    assert!(matches!(error, LockError::Connection { .. }), "{error:?}");
    let text = error.to_string();
    assert!(
        text.contains(&format!("127.0.0.1:{port}")) && !text.contains("secret"),
        "{text}"
    );
    assert!(took <= within(), "took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_and_unknown_database_are_config_errors() {
    let port = common::shared_port();
    let (error, took) = refused(&format!(
        "mysql://distlock:wrong-secret@127.0.0.1:{port}/distlock"
    ))
    .await;
    assert!(matches!(error, LockError::Config { .. }), "{error:?}");
    let text = error.to_string();
    assert!(
        text.contains("credentials") && !text.contains("wrong-secret"),
        "{text}"
    );
    assert!(took <= within(), "took {took:?}");
    let url = format!("mysql://distlock:distlock-test@127.0.0.1:{port}/no_such_db");
    let (error, took) = refused(&url).await;
    assert!(matches!(error, LockError::Config { .. }), "{error:?}");
    assert!(
        error.to_string().contains("database does not exist"),
        "{error}"
    );
    assert!(!error.to_string().contains("distlock-test"), "{error}");
    assert!(took <= within(), "took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_create_rights_is_told_what_to_grant_then_works_once_created() {
    let port = common::shared_port();
    common::admin(
        port,
        "CREATE DATABASE IF NOT EXISTS restricted; \
         CREATE USER IF NOT EXISTS 'norights'@'%' IDENTIFIED BY 'pw'; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON restricted.* TO 'norights'@'%';",
    )
    .await;
    let url = format!("mysql://norights:pw@127.0.0.1:{port}/restricted");
    let (error, took) = refused(&url).await;
    assert!(took <= within(), "took {took:?}");
    let text = match &error {
        LockError::Config { message, .. } => message.clone(),
        other => panic!("expected a config error, got {other:?}"),
    };
    assert!(
        text.contains("CREATE") && text.contains("CREATE_TABLES"),
        "{text}"
    );
    // An administrator creates the tables ahead, as the guide says: then it works.
    common::admin(port, &format!("USE restricted; {CREATE_TABLES}")).await;
    let lock = MySqlLock::connect_with(&url, common::test_config())
        .await
        .expect("connects once the tables exist");
    let key = distlock_api::LockKey::new("restricted/works").unwrap();
    let guard = lock
        .lock()
        .acquire(
            &key,
            &distlock_api::LockOptions::new(Duration::from_secs(30)),
        )
        .await
        .unwrap();
    assert!(guard.fencing_token().is_some());
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_against_a_plaintext_server_is_a_config_error() {
    let port = common::shared_port();
    let url = format!("{}?ssl-mode=required", common::url_for(port));
    let (error, took) = refused(&url).await;
    assert!(matches!(error, LockError::Config { .. }), "{error:?}");
    assert!(error.to_string().contains("TLS"), "{error}");
    assert!(took <= within(), "took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_urls_and_settings_are_config_errors() {
    for url in [
        "mysql://u:secret@127.0.0.1:99999/db",
        "mysql://u:secret@127.0.0.1/",
        "mysql://u:secret@127.0.0.1/db?ssl-mode=maybe",
        "mysql://u:secret@127.0.0.1/db?bogus=1",
    ] {
        let (error, took) = refused(url).await;
        assert!(
            matches!(error, LockError::Config { .. }),
            "{url}: {error:?}"
        );
        assert!(!error.to_string().contains("secret"), "{error}");
        assert!(took < Duration::from_secs(1), "{url} took {took:?}");
    }
    let mut config = MySqlConfig::default();
    config.session_timeout = Duration::from_millis(1500);
    let error = MySqlLock::connect_with(&common::url_for(common::shared_port()), config)
        .await
        .unwrap_err();
    assert!(matches!(error, LockError::Config { .. }), "{error:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distlock_connect_picks_this_backend_for_both_schemes() {
    let port = common::shared_port();
    for url in [
        common::url_for(port),
        common::url_for(port).replace("mysql://", "mariadb://"),
    ] {
        let lock = MySqlLock::connect(&url).await.expect("connects");
        assert_eq!(lock.session_counts().0, 1);
    }
}
