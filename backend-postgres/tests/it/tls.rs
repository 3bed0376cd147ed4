//! TLS against a real PostgreSQL server with `ssl=on` and throwaway certificates: each
//! `sslmode` as libpq has it, client certificates, and the refusals (wrong CA, wrong
//! host name, no TLS on the server, missing files) as typed errors in time.

#![cfg(feature = "tls")]

use crate::common;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_api::{DistributedLock, LockError, LockKey, LockOptions};
use distlock_conformance::{Client, Harness, UrlConnector};
use distlock_postgres::{parse_url, PostgresConfig, PostgresLock, PostgresXactLock};
use distlock_test_servers::{
    shared_server, CertUse, IssuedCert, PostgresServer, PostgresTlsServer, ServerError,
    CLIENT_CERT_DATABASE,
};
use sqlx::{Connection, PgConnection};

/// The addresses and certificates of the binary's shared TLS server.
struct TlsServer {
    port: u16,
    ca: PathBuf,
    other_ca: PathBuf,
    client: IssuedCert,
    /// A client certificate from the other CA, which the server does not trust.
    stranger: IssuedCert,
}

/// One TLS server (with its CAs and certificates) for every test of this binary that
/// needs TLS: started on first use, stopped when the test process exits. Making the
/// certificates, `initdb` and the start take seconds, most of a test. The tests only
/// connect to it, each under names (keys, `application_name`) of its own.
fn tls_server() -> &'static TlsServer {
    static SERVER: OnceLock<TlsServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let start = async {
            let server = PostgresTlsServer::start().await?;
            let stranger = server
                .tls()
                .other_ca()
                .issue("stranger", "postgres", CertUse::Client)
                .await?;
            Ok::<_, ServerError>((server, stranger))
        };
        shared_server(start, |started| match started {
            Ok((server, stranger)) => TlsServer {
                port: server.port(),
                ca: server.tls().ca_cert(),
                other_ca: server.tls().other_ca_cert(),
                client: server.tls().client_cert().clone(),
                stranger: stranger.clone(),
            },
            Err(e) => panic!(
                "could not start PostgreSQL with TLS (run scripts/test.sh, which installs it and openssl): {e}"
            ),
        })
    })
}

impl TlsServer {
    /// `postgres://postgres@127.0.0.1:PORT/postgres?QUERY` (no `?` when `query` is
    /// empty), as [`PostgresTlsServer::url`].
    fn url(&self, query: &str) -> String {
        self.url_to("127.0.0.1", "postgres", query)
    }

    /// `postgres://postgres@HOST:PORT/DATABASE?QUERY`, as [`PostgresTlsServer::url_to`].
    fn url_to(&self, host: &str, database: &str, query: &str) -> String {
        let base = format!("postgres://postgres@{host}:{}/{database}", self.port);
        if query.is_empty() {
            base
        } else {
            format!("{base}?{query}")
        }
    }
}

/// `sslmode=MODE&sslrootcert=CA`.
fn verified(mode: &str, ca: &std::path::Path) -> String {
    format!("sslmode={mode}&sslrootcert={}", ca.display())
}

/// Whether the session `options` of `url` open is encrypted, as the server sees it.
async fn session_is_tls(url: &str) -> bool {
    let options = parse_url(url).expect("parses").options().clone();
    let mut conn = PgConnection::connect_with(&options)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let (ssl,): (bool,) =
        sqlx::query_as("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(&mut conn)
            .await
            .expect("pg_stat_ssl");
    ssl
}

/// How many sessions named `name` the server has, seen over plaintext.
async fn sessions_named(server_url: &str, name: &str) -> i64 {
    let mut raw = PgConnection::connect(&format!("{server_url}?sslmode=disable"))
        .await
        .expect("plain connection");
    let (count,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
            .bind(name)
            .fetch_one(&mut raw)
            .await
            .expect("pg_stat_activity");
    count
}

/// Takes and releases a lock through `locks`, and checks its fencing token.
async fn lock_cycle(locks: &dyn DistributedLock) {
    let key = LockKey::new("tls/cycle").expect("key");
    let guard = locks
        .acquire(&key, &LockOptions::new(Duration::from_secs(30)))
        .await
        .expect("acquires over TLS");
    assert!(guard.fencing_token().is_some());
    guard.release().await.expect("releases over TLS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tls_mode_connects_and_locks_over_tls() {
    let server = tls_server();
    let ca = server.ca.as_path();
    for query in [
        String::new(), // prefer, the default
        "sslmode=prefer".into(),
        "sslmode=require".into(),
        verified("require", ca),
        verified("verify-ca", ca),
        verified("verify-full", ca),
    ] {
        let url = server.url(&format!("{query}&application_name=tls_modes"));
        assert!(session_is_tls(&url).await, "{query}: not encrypted");
        let locks = PostgresLock::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("{query}: {e}"));
        lock_cycle(locks.lock().as_ref()).await;
        let xact = PostgresXactLock::connect(&url)
            .await
            .unwrap_or_else(|e| panic!("{query}: transaction client: {e}"));
        drop(xact);
    }
    // `localhost` is in the certificate too.
    let url = server.url_to("localhost", "postgres", &verified("verify-full", ca));
    assert!(session_is_tls(&url).await);
    let plain = server.url("sslmode=disable");
    assert!(!session_is_tls(&plain).await, "sslmode=disable encrypted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_sessions_themselves_are_encrypted() {
    let server = tls_server();
    let url = server.url(&format!(
        "{}&application_name=tls_sessions",
        verified("verify-full", &server.ca)
    ));
    let locks = PostgresLock::connect(&url).await.expect("connects");
    let key = LockKey::new("tls/held").expect("key");
    let guard = locks
        .lock()
        .acquire(&key, &LockOptions::new(Duration::from_secs(30)))
        .await
        .expect("acquires");
    let mut raw = PgConnection::connect(&server.url("sslmode=disable"))
        .await
        .expect("plain connection");
    let rows: Vec<(bool,)> = sqlx::query_as(
        "SELECT s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
         WHERE a.application_name = 'tls_sessions'",
    )
    .fetch_all(&mut raw)
    .await
    .expect("pg_stat_ssl");
    assert!(!rows.is_empty(), "no distlock session seen");
    assert!(rows.iter().all(|(ssl,)| *ssl), "{rows:?}");
    guard.release().await.expect("releases");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_opens_the_database_that_demands_one() {
    let server = tls_server();
    let client = &server.client;
    let with_cert = format!(
        "{}&sslcert={}&sslkey={}",
        verified("verify-full", &server.ca),
        client.cert.display(),
        client.key.display()
    );
    let url = server.url_to("127.0.0.1", CLIENT_CERT_DATABASE, &with_cert);
    let locks = PostgresLock::connect(&url)
        .await
        .expect("connects with a client certificate");
    lock_cycle(locks.lock().as_ref()).await;
    // Without the certificate, with one from a CA the server does not trust, or
    // without TLS, the server refuses: a configuration error (retrying cannot fix it)
    // naming the address.
    let stranger = &server.stranger;
    let address = format!("127.0.0.1:{}", server.port);
    for query in [
        verified("verify-full", &server.ca),
        format!(
            "{}&sslcert={}&sslkey={}",
            verified("verify-full", &server.ca),
            stranger.cert.display(),
            stranger.key.display()
        ),
        "sslmode=disable".to_owned(),
    ] {
        let url = server.url_to("127.0.0.1", CLIENT_CERT_DATABASE, &query);
        match PostgresLock::connect(&url).await {
            Err(error @ LockError::Config { .. }) => {
                eprintln!("{query}: {error}");
                assert!(error.to_string().contains(&address), "{error}")
            }
            other => panic!("{query}: {other:?}"),
        }
    }
}

/// Connects both client kinds to `url`, expecting a configuration error naming
/// `expect` within the request timeout, and leaving no session behind.
async fn refused(url: &str, server_url: &str, expect: &str) {
    let url = format!("{url}&application_name=refused");
    let config = common::test_config();
    let started = Instant::now();
    let session = PostgresLock::connect_with(&url, config.clone()).await;
    let xact = PostgresXactLock::connect(&url).await;
    let took = started.elapsed();
    eprintln!("refused in {took:?} (both clients): {url}");
    for (kind, result) in [
        ("session", session.map(|_| ())),
        ("transaction", xact.map(|_| ())),
    ] {
        match result {
            Err(error @ LockError::Config { .. }) => {
                let message = format!("{error} {:?}", std::error::Error::source(&error));
                assert!(message.contains(expect), "{kind} {url}: {message}");
            }
            other => panic!("{kind} client, {url}: {other:?}"),
        }
    }
    // Each client kind may use its whole request timeout (5 s for the transaction
    // client's default), plus slack for a loaded machine.
    let bound =
        config.request_timeout + PostgresConfig::default().request_timeout + Duration::from_secs(3);
    assert!(took < bound, "{url}: refused after {took:?}");
    assert_eq!(
        sessions_named(server_url, "refused").await,
        0,
        "{url}: a session was left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_refuses_a_wrong_ca_and_a_wrong_host_name() {
    let server = tls_server();
    let address = format!("127.0.0.1:{}", server.port);
    let base = server.url("");
    refused(
        &server.url(&verified("verify-full", &server.other_ca)),
        &base,
        &address,
    )
    .await;
    // `require` with a root certificate verifies the chain, as libpq's does.
    refused(
        &server.url(&verified("require", &server.other_ca)),
        &base,
        "certificate",
    )
    .await;
    refused(
        &server.url(&verified("verify-ca", &server.other_ca)),
        &base,
        "certificate",
    )
    .await;
    // 127.0.0.2 is the same server, under a name its certificate does not carry:
    // verify-full refuses it. So does verify-ca, unlike libpq's, through a driver bug
    // (sqlx issue 3793, documented in the crate docs); when the driver is fixed, this
    // connects.
    let other_name = server.url_to(
        "127.0.0.2",
        "postgres",
        &verified("verify-full", &server.ca),
    );
    refused(&other_name, &base, "127.0.0.2").await;
    let chain_only = server.url_to("127.0.0.2", "postgres", &verified("verify-ca", &server.ca));
    refused(&chain_only, &base, "127.0.0.2").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_server_refuses_require_and_prefer_falls_back() {
    let server = PostgresServer::start()
        .await
        .unwrap_or_else(|e| panic!("could not start PostgreSQL (run scripts/test.sh): {e}"));
    let base = server.url();
    refused(&format!("{base}?sslmode=require"), &base, "TLS").await;
    let locks = PostgresLock::connect(&format!("{base}?sslmode=prefer"))
        .await
        .expect("prefer falls back to plaintext");
    lock_cycle(locks.lock().as_ref()).await;
    assert!(!session_is_tls(&base).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tls_parameters_are_config_errors_before_connecting() {
    // Nothing needs to listen: these fail while parsing.
    for (query, expect) in [
        ("sslmode=bogus", "is not one of"),
        ("sslmode=allow", "not supported"),
        (
            "sslmode=require&sslrootcert=/no/such/root.crt",
            "/no/such/root.crt",
        ),
        (
            "sslmode=verify-full&sslrootcert=/no/such/root.crt",
            "/no/such/root.crt",
        ),
        (
            "sslcert=/no/such/client.crt&sslkey=/no/such/client.key",
            "/no/such/client.crt",
        ),
    ] {
        let url = format!("postgres://postgres:pw-secret@127.0.0.1:1/postgres?{query}");
        let started = Instant::now();
        match PostgresLock::connect(&url).await {
            Err(LockError::Config { message, .. }) => {
                assert!(message.contains(expect), "{query}: {message}");
                assert!(!message.contains("pw-secret"), "{message}");
            }
            other => panic!("{query}: {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(1), "{query}");
    }
}

/// What `distlock conformance --backend postgres://…?sslmode=verify-full&…` runs: plain
/// clients with the default settings, every session over verified TLS.
struct TlsHarness {
    url: String,
    config: PostgresConfig,
}

async fn tls_harness() -> Arc<dyn Harness> {
    let server = tls_server();
    let url = server.url(&verified("verify-full", &server.ca));
    Arc::new(TlsHarness {
        url,
        config: PostgresConfig::default(),
    })
}

#[async_trait]
impl Harness for TlsHarness {
    fn name(&self) -> String {
        self.url.clone()
    }

    async fn client(&self) -> Result<Client, LockError> {
        let lock = PostgresLock::connect_with(&self.url, self.config.clone()).await?;
        Ok(Client::new(lock.client()))
    }

    fn crash_bound(&self, ttl: Duration) -> Duration {
        ttl.max(self.config.dead_holder_bound()) + self.config.heartbeat()
    }

    fn url_connector(&self) -> Option<UrlConnector> {
        let config = self.config.clone();
        Some(Arc::new(move |url: String| {
            let config = config.clone();
            Box::pin(async move { Ok(PostgresLock::connect_with(&url, config).await?.client()) })
        }))
    }
}

mod conformance_over_tls {
    distlock_conformance::conformance_tests!(super::tls_harness());
}
