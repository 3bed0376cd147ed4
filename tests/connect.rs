//! Connecting to real servers, on every server backend:
//!
//! - a server that is restarting refuses connections, then (ZooKeeper, Postgres)
//!   accepts them without serving for a moment: many clients connecting right then
//!   all succeed, retrying within their connect timeout;
//! - a server that never comes up fails a connect after the connect timeout, not
//!   before and not long after;
//! - every connection error reads as a sentence that names the address and the cause
//!   in words, never a `Debug` dump of the driver's error.
//!
//! Needs the server binaries (see the README, *Testing*); without them each test skips
//! loudly, or fails with `DISTLOCK_REQUIRE_SERVERS=1`.

use std::future::Future;
use std::net::{Ipv4Addr, TcpListener};
use std::time::{Duration, Instant};

use distlock::etcd::{EtcdConfig, EtcdLock};
use distlock::postgres::{PostgresConfig, PostgresLock};
use distlock::redis::{RedisConfig, RedisLock};
use distlock::zookeeper::{ZooKeeperConfig, ZooKeeperLock};
use distlock::{looks_like_debug, LockError};
use distlock_test_servers::{
    skip_or_panic, EtcdServer, EtcdTlsServer, PostgresServer, RedisServer, RedisServerOptions,
    ServerControl, ServerError, TestCa, ZooKeeperServer, ZooKeeperTlsServer,
};

/// Clients connecting at once in each round.
const CLIENTS: usize = 8;
/// Rounds of kill, then restart while the clients connect.
const ROUNDS: usize = 3;
/// The connect timeout of the restart tests: a restart on a loaded 2-core machine
/// (a JVM, a Postgres recovery) takes seconds.
const PATIENT: Duration = Duration::from_secs(40);
/// The connect timeout of the tests of servers that never answer.
const SHORT: Duration = Duration::from_secs(2);
/// How long past its connect timeout a connect may take to fail: one last attempt
/// cut at the deadline, and a scheduler on a busy machine.
const SLACK: Duration = Duration::from_secs(4);

/// Starts a server, or skips (or fails, as [`skip_or_panic`] decides).
async fn start<S>(test: &str, started: impl Future<Output = Result<S, ServerError>>) -> Option<S> {
    match started.await {
        Ok(server) => Some(server),
        Err(error) => {
            skip_or_panic(test, &error);
            None
        }
    }
}

/// A loopback port nothing listens on (bound, then released).
fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a free port");
    listener.local_addr().expect("local address").port()
}

/// A listener that never accepts: connections complete in the kernel's backlog, and
/// nothing is ever said on them.
fn silent_listener() -> (TcpListener, u16) {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a silent port");
    let port = listener.local_addr().expect("local address").port();
    (listener, port)
}

/// A listener that closes every connection as soon as it accepts it.
async fn closing_listener() -> u16 {
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .expect("bind a closing port");
    let port = listener.local_addr().expect("local address").port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            drop(stream);
        }
    });
    port
}

fn redis_config(timeout: Duration) -> RedisConfig {
    let mut config = RedisConfig::default();
    config.request_timeout = timeout;
    config
}

fn postgres_config(timeout: Duration) -> PostgresConfig {
    let mut config = PostgresConfig::default();
    config.request_timeout = timeout;
    config
}

fn zookeeper_config(timeout: Duration) -> ZooKeeperConfig {
    ZooKeeperConfig::default().with_connect_timeout(timeout)
}

fn etcd_config(timeout: Duration) -> EtcdConfig {
    EtcdConfig::default()
        .with_connect_timeout(timeout)
        .with_request_timeout(timeout)
}

async fn connect_redis(url: String, timeout: Duration) -> Result<(), LockError> {
    RedisLock::connect_with(&url, redis_config(timeout))
        .await
        .map(drop)
}

async fn connect_postgres(url: String, timeout: Duration) -> Result<(), LockError> {
    PostgresLock::connect_with(&url, postgres_config(timeout))
        .await
        .map(drop)
}

async fn connect_zookeeper(url: String, timeout: Duration) -> Result<(), LockError> {
    ZooKeeperLock::connect_with(&url, zookeeper_config(timeout))
        .await
        .map(drop)
}

async fn connect_etcd(url: String, timeout: Duration) -> Result<(), LockError> {
    EtcdLock::connect_with(&url, etcd_config(timeout))
        .await
        .map(drop)
}

/// Kills `server`, then restarts it while [`CLIENTS`] clients connect through
/// `connect`, [`ROUNDS`] times; every connect must succeed.
async fn connects_through_restarts<S, F, Fut>(name: &str, server: &mut S, connect: F)
where
    S: ServerControl,
    F: Fn(String) -> Fut,
    Fut: Future<Output = Result<(), LockError>> + Send + 'static,
{
    for round in 0..ROUNDS {
        server.kill();
        let clients: Vec<_> = (0..CLIENTS)
            .map(|_| tokio::spawn(connect(server.url())))
            .collect();
        server
            .restart()
            .await
            .unwrap_or_else(|e| panic!("{name}: restart in round {round}: {e}"));
        for (n, client) in clients.into_iter().enumerate() {
            let connected = client.await.expect("a connect task panicked");
            assert!(
                connected.is_ok(),
                "{name}, round {round}, client {n}: {}",
                connected.err().map(|e| e.to_string()).unwrap_or_default()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_clients_connect_through_a_restart() {
    let test = "zookeeper_clients_connect_through_a_restart";
    let Some(mut server) = start(test, ZooKeeperServer::start()).await else {
        return;
    };
    connects_through_restarts("zookeeper", &mut server, |url| {
        connect_zookeeper(url, PATIENT)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_clients_connect_through_a_restart() {
    let test = "etcd_clients_connect_through_a_restart";
    let Some(mut server) = start(test, EtcdServer::start()).await else {
        return;
    };
    connects_through_restarts("etcd", &mut server, |url| connect_etcd(url, PATIENT)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_clients_connect_through_a_restart() {
    let test = "redis_clients_connect_through_a_restart";
    let Some(mut server) = start(test, RedisServer::start()).await else {
        return;
    };
    connects_through_restarts("redis", &mut server, |url| connect_redis(url, PATIENT)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_clients_connect_through_a_restart() {
    let test = "postgres_clients_connect_through_a_restart";
    let Some(mut server) = start(test, PostgresServer::start()).await else {
        return;
    };
    connects_through_restarts("postgres", &mut server, |url| {
        connect_postgres(url, PATIENT)
    })
    .await;
}

/// Each backend, connecting to a port nothing listens on with a [`SHORT`] connect
/// timeout, fails no sooner than the timeout and no later than [`SLACK`] after it,
/// saying the connection was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_comes_up_fails_at_the_connect_timeout() {
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let (redis, postgres, zookeeper, etcd) = tokio::join!(
        timed(connect_redis(format!("redis://{address}"), SHORT)),
        timed(connect_postgres(
            format!("postgres://postgres@{address}/postgres"),
            SHORT
        )),
        timed(connect_zookeeper(format!("zookeeper://{address}"), SHORT)),
        timed(connect_etcd(format!("etcd://{address}"), SHORT)),
    );
    for (name, (result, took)) in [
        ("redis", redis),
        ("postgres", postgres),
        ("zookeeper", zookeeper),
        ("etcd", etcd),
    ] {
        let error = result.err().unwrap_or_else(|| panic!("{name}: connected"));
        let message = error.to_string();
        eprintln!("{name} ({took:?}): {message}");
        assert!(
            matches!(error, LockError::Connection { .. }),
            "{name}: {message}"
        );
        assert!(took >= SHORT, "{name} gave up after {took:?}: {message}");
        assert!(
            took <= SHORT + SLACK,
            "{name} took {took:?} to fail: {message}"
        );
        assert!(message.contains(&address), "{name}: {message}");
        assert!(message.contains("connection refused"), "{name}: {message}");
    }
}

async fn timed<T>(future: impl Future<Output = T>) -> (T, Duration) {
    let start = Instant::now();
    let out = future.await;
    (out, start.elapsed())
}

/// One connection-error case: what was tried, the address it concerns, and how it
/// ended.
struct Case {
    what: String,
    address: String,
    result: Result<(), LockError>,
}

async fn case(what: &str, port: u16, connect: impl Future<Output = Result<(), LockError>>) -> Case {
    Case {
        what: what.to_owned(),
        address: format!("127.0.0.1:{port}"),
        result: connect.await,
    }
}

/// Every connection-error path of every backend, against real refusals, reads as a
/// sentence naming the address, without `Debug` markers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_error_is_a_sentence() {
    let test = "every_connection_error_is_a_sentence";
    let mut options = RedisServerOptions::default();
    options.password = Some("right-password".into());
    let (redis, postgres, zookeeper, etcd, zookeeper_tls, etcd_tls, stranger) = tokio::join!(
        start(test, RedisServer::start_with(options)),
        start(test, PostgresServer::start()),
        start(test, ZooKeeperServer::start()),
        start(test, EtcdServer::start()),
        start(test, ZooKeeperTlsServer::start(false)),
        start(test, EtcdTlsServer::start(false)),
        start(test, TestCa::create("stranger")),
    );
    let (
        Some(redis),
        Some(postgres),
        Some(zookeeper),
        Some(etcd),
        Some(zookeeper_tls),
        Some(etcd_tls),
        Some(stranger),
    ) = (
        redis,
        postgres,
        zookeeper,
        etcd,
        zookeeper_tls,
        etcd_tls,
        stranger,
    )
    else {
        return;
    };
    let t = Duration::from_secs(1);
    let refused = free_port();
    let (_silent, silent) = silent_listener();
    let closing = closing_listener().await;
    let (redis_port, zk_port, etcd_port, pg_port) =
        (redis.port(), zookeeper.port(), etcd.port(), postgres.port());
    let (zk_tls_port, etcd_tls_port) = (zookeeper_tls.secure_port(), etcd_tls.port());
    let stranger_ca = stranger.cert().display().to_string();
    let own_ca = etcd_tls.tls().ca_cert().display().to_string();
    let zk_ca = zookeeper_tls.tls().ca_cert().display().to_string();

    let mut cases = Vec::new();
    for (what, port) in [
        ("refused", refused),
        ("timed out", silent),
        ("closed", closing),
    ] {
        let at = |scheme: &str| format!("{scheme}://127.0.0.1:{port}");
        cases.push(
            case(
                &format!("redis {what}"),
                port,
                connect_redis(at("redis"), t),
            )
            .await,
        );
        cases.push(
            case(
                &format!("postgres {what}"),
                port,
                connect_postgres(format!("postgres://postgres@127.0.0.1:{port}/postgres"), t),
            )
            .await,
        );
        cases.push(
            case(
                &format!("zookeeper {what}"),
                port,
                connect_zookeeper(at("zookeeper"), t),
            )
            .await,
        );
        cases.push(case(&format!("etcd {what}"), port, connect_etcd(at("etcd"), t)).await);
    }
    // Servers of the wrong kind.
    cases.push(
        case(
            "redis at a ZooKeeper server",
            zk_port,
            connect_redis(format!("redis://127.0.0.1:{zk_port}"), t),
        )
        .await,
    );
    cases.push(
        case(
            "postgres at a Redis server",
            redis_port,
            connect_postgres(
                format!("postgres://postgres@127.0.0.1:{redis_port}/postgres"),
                t,
            ),
        )
        .await,
    );
    cases.push(
        case(
            "zookeeper at a Redis server",
            redis_port,
            connect_zookeeper(format!("zookeeper://127.0.0.1:{redis_port}"), t),
        )
        .await,
    );
    cases.push(
        case(
            "zookeeper at an etcd server",
            etcd_port,
            connect_zookeeper(format!("zookeeper://127.0.0.1:{etcd_port}"), t),
        )
        .await,
    );
    cases.push(
        case(
            "etcd at a Redis server",
            redis_port,
            connect_etcd(format!("etcd://127.0.0.1:{redis_port}"), t),
        )
        .await,
    );
    cases.push(
        case(
            "etcd at a ZooKeeper server",
            zk_port,
            connect_etcd(format!("etcd://127.0.0.1:{zk_port}"), t),
        )
        .await,
    );
    // Authentication.
    cases.push(
        case(
            "redis with a wrong password",
            redis_port,
            connect_redis(format!("redis://:wrong@127.0.0.1:{redis_port}"), t),
        )
        .await,
    );
    cases.push(
        case(
            "redis without the password",
            redis_port,
            connect_redis(format!("redis://127.0.0.1:{redis_port}"), t),
        )
        .await,
    );
    cases.push(
        case(
            "postgres with an unknown user",
            pg_port,
            connect_postgres(format!("postgres://nobody@127.0.0.1:{pg_port}/postgres"), t),
        )
        .await,
    );
    // TLS on one side only, and a CA that did not sign the server's certificate.
    cases.push(
        case(
            "postgres requiring TLS of a plaintext server",
            pg_port,
            connect_postgres(
                format!("postgres://postgres@127.0.0.1:{pg_port}/postgres?sslmode=require"),
                t,
            ),
        )
        .await,
    );
    cases.push(
        case(
            "zookeeper+tls at a plaintext port",
            zk_port,
            connect_zookeeper(format!("zookeeper+tls://127.0.0.1:{zk_port}?ca={zk_ca}"), t),
        )
        .await,
    );
    cases.push(
        case(
            "zookeeper plaintext at a TLS port",
            zk_tls_port,
            connect_zookeeper(format!("zookeeper://127.0.0.1:{zk_tls_port}"), t),
        )
        .await,
    );
    cases.push(
        case(
            "zookeeper+tls with a CA that did not sign the server",
            zk_tls_port,
            connect_zookeeper(
                format!("zookeeper+tls://127.0.0.1:{zk_tls_port}?ca={stranger_ca}"),
                t,
            ),
        )
        .await,
    );
    cases.push(
        case(
            "etcd+tls at a plaintext port",
            etcd_port,
            connect_etcd(format!("etcd+tls://127.0.0.1:{etcd_port}?ca={own_ca}"), t),
        )
        .await,
    );
    cases.push(
        case(
            "etcd plaintext at a TLS port",
            etcd_tls_port,
            connect_etcd(format!("etcd://127.0.0.1:{etcd_tls_port}"), t),
        )
        .await,
    );
    cases.push(
        case(
            "etcd+tls with a CA that did not sign the server",
            etcd_tls_port,
            connect_etcd(
                format!("etcd+tls://127.0.0.1:{etcd_tls_port}?ca={stranger_ca}"),
                t,
            ),
        )
        .await,
    );

    let mut bad = Vec::new();
    for Case {
        what,
        address,
        result,
    } in &cases
    {
        let Err(error) = result else {
            bad.push(format!("{what}: connected"));
            continue;
        };
        let message = error.to_string();
        eprintln!("{what}: {message}");
        if looks_like_debug(&message) {
            bad.push(format!("{what}: a Debug dump: {message}"));
        }
        if !message.contains(address.as_str()) {
            bad.push(format!("{what}: does not name {address}: {message}"));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
