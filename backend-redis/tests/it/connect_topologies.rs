//! Connecting Redlock, Sentinel and Cluster URLs through transient refusals, and what
//! a malformed URL or a refused connect says:
//!
//! - many clients connecting while the servers restart (Redlock, Cluster), or before a
//!   Sentinel is up and knows the master, all succeed within their connect timeout;
//! - a topology whose servers never come up fails after the connect timeout, not
//!   before and not long after; a refusal retrying cannot fix (a wrong password) fails
//!   at once;
//! - every message is a sentence naming `host:port` where there is one, never the
//!   URL's password nor a `Debug` dump of the driver's error.

use std::net::{Ipv4Addr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use distlock_api::{looks_like_debug, LockError, LockKey, LockOptions};
use distlock_redis::{RedisConfig, RedisLock};
use distlock_test_servers::{RedisCluster, RedisServer, ServerControl};

/// Clients connecting at once in each round.
const CLIENTS: usize = 8;
/// The connect timeout of the restart tests: restarting several servers on a loaded
/// 2-core machine takes seconds.
const PATIENT: Duration = Duration::from_secs(40);
/// The connect timeout of the tests of servers that never answer.
const SHORT: Duration = Duration::from_secs(2);
/// How long past its connect timeout a connect may take to fail.
const SLACK: Duration = Duration::from_secs(4);
const SECRET: &str = "hunter2-secret-7731";

fn config(timeout: Duration) -> RedisConfig {
    let mut config = RedisConfig::default();
    config.request_timeout = timeout;
    config
}

async fn connect(url: String, timeout: Duration) -> Result<RedisLock, LockError> {
    RedisLock::connect_with(&url, config(timeout)).await
}

/// A loopback port nothing listens on (bound, then released).
fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a free port");
    listener.local_addr().expect("local address").port()
}

/// Spawns [`CLIENTS`] connects to `url`.
fn spawn_clients(url: &str) -> Vec<tokio::task::JoinHandle<Result<RedisLock, LockError>>> {
    (0..CLIENTS)
        .map(|_| tokio::spawn(connect(url.to_owned(), PATIENT)))
        .collect()
}

/// Every client of `clients` connected, and the first can take and release a lock.
async fn all_connected(
    what: &str,
    clients: Vec<tokio::task::JoinHandle<Result<RedisLock, LockError>>>,
) {
    let mut locks = Vec::new();
    for (n, client) in clients.into_iter().enumerate() {
        match client.await.expect("a connect task panicked") {
            Ok(lock) => locks.push(lock),
            Err(error) => panic!("{what}, client {n}: {error}"),
        }
    }
    let key = LockKey::new(format!("connect-topologies/{what}")).unwrap();
    let guard = locks[0]
        .lock()
        .acquire(&key, &LockOptions::new(Duration::from_secs(10)))
        .await
        .unwrap_or_else(|e| panic!("{what}: acquire after connect: {e}"));
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_clients_connect_while_its_servers_restart() {
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(RedisServer::start().await.expect("start redis-server"));
    }
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let url = format!("redis+redlock://{}", hosts.join(","));
    for round in 0..2 {
        for server in &mut servers {
            server.kill();
        }
        let clients = spawn_clients(&url);
        for server in &mut servers {
            server.restart().await.expect("restart redis-server");
        }
        all_connected(&format!("redlock round {round}"), clients).await;
    }
}

/// A Sentinel process (killed on drop) on `port`, monitoring nothing until told.
struct BareSentinel {
    child: Child,
    _dir: tempfile::TempDir,
}

impl BareSentinel {
    fn start(port: u16) -> BareSentinel {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndaemonize no\nlogfile \"\"\ndir {}\n",
                dir.path().display()
            ),
        )
        .unwrap();
        let child = Command::new(redis_server())
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server --sentinel");
        BareSentinel { child, _dir: dir }
    }
}

impl Drop for BareSentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn redis_server() -> std::path::PathBuf {
    std::env::var_os("DISTLOCK_REDIS_SERVER")
        .map(Into::into)
        .unwrap_or_else(|| Path::new("redis-server").to_path_buf())
}

/// Sends `args` to 127.0.0.1:`port` until it answers (at most 20 s).
async fn command_until_answered(port: u16, args: &[&str]) -> redis::Value {
    let started = Instant::now();
    loop {
        let attempt = async {
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
            let mut conn = client.get_multiplexed_async_connection().await?;
            let mut cmd = redis::cmd(args[0]);
            for arg in &args[1..] {
                cmd.arg(*arg);
            }
            cmd.query_async::<redis::Value>(&mut conn).await
        };
        match attempt.await {
            Ok(value) => return value,
            Err(e) => assert!(
                started.elapsed() < Duration::from_secs(20),
                "{args:?} at {port}: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_clients_connect_before_the_sentinel_is_up_and_knows_the_master() {
    let master = RedisServer::start().await.expect("start redis-server");
    let port = free_port();
    let url = format!("redis+sentinel://127.0.0.1:{port}/late");
    // Refused first (nothing listens), then a Sentinel that knows no master "late".
    let clients = spawn_clients(&url);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _sentinel = BareSentinel::start(port);
    command_until_answered(port, &["PING"]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let master_port = master.port().to_string();
    command_until_answered(
        port,
        &[
            "SENTINEL",
            "MONITOR",
            "late",
            "127.0.0.1",
            &master_port,
            "1",
        ],
    )
    .await;
    all_connected("sentinel", clients).await;

    // A refusal retrying cannot fix fails at once, with its typed error.
    let started = Instant::now();
    let error = connect(
        format!("redis+sentinel://nobody:{SECRET}@127.0.0.1:{port}/late"),
        PATIENT,
    )
    .await
    .err()
    .unwrap_or_else(|| panic!("a user the master does not have is refused"));
    assert!(matches!(error, LockError::Config { .. }), "{error:?}");
    assert!(started.elapsed() < SHORT, "took {:?}", started.elapsed());
    assert_sentence(&error, &format!("127.0.0.1:{}", master.port()));

    // A name the Sentinel never learns fails at the connect timeout, as a
    // configuration error.
    let started = Instant::now();
    let error = connect(
        format!("redis+sentinel://127.0.0.1:{port}/nosuchmaster"),
        SHORT,
    )
    .await
    .err()
    .unwrap_or_else(|| panic!("an unknown master name is refused"));
    let took = started.elapsed();
    assert!(matches!(error, LockError::Config { .. }), "{error:?}");
    assert!(took >= SHORT && took <= SHORT + SLACK, "took {took:?}");
    assert!(error.to_string().contains("nosuchmaster"), "{error}");
    assert_sentence(&error, &format!("127.0.0.1:{port}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_clients_connect_while_the_cluster_restarts() {
    let mut cluster = RedisCluster::start().await.expect("start a Redis Cluster");
    let url = cluster.url();
    for node in cluster.nodes() {
        node.kill();
    }
    let clients = spawn_clients(&url);
    for node in cluster.nodes() {
        node.restart().await.expect("restart a Cluster node");
    }
    all_connected("cluster", clients).await;

    // A refusal retrying cannot fix fails at once, with its typed error.
    let seed = cluster.nodes()[0].port();
    let started = Instant::now();
    let error = connect(
        format!("redis+cluster://nobody:{SECRET}@127.0.0.1:{seed}"),
        PATIENT,
    )
    .await
    .err()
    .unwrap_or_else(|| panic!("a user the nodes do not have is refused"));
    assert!(matches!(error, LockError::Config { .. }), "{error:?}");
    assert!(started.elapsed() < SHORT, "took {:?}", started.elapsed());
    assert_sentence(&error, &format!("127.0.0.1:{seed}"));
}

/// Asserts `error` reads as a sentence naming `address`, without the password or a
/// `Debug` dump.
fn assert_sentence(error: &LockError, address: &str) {
    let message = error.to_string();
    assert!(message.contains(address), "no {address} in: {message}");
    assert!(!message.contains(SECRET), "password leaked: {message}");
    assert!(!looks_like_debug(&message), "a Debug dump: {message}");
    assert!(!message.contains("InvalidClientConfig"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topologies_that_never_come_up_fail_at_the_connect_timeout() {
    let (a, b, c) = (free_port(), free_port(), free_port());
    let cases = [
        (
            "redlock",
            format!("redis+redlock://:{SECRET}@127.0.0.1:{a},127.0.0.1:{b},127.0.0.1:{c}"),
        ),
        (
            "sentinel",
            format!("redis+sentinel://:{SECRET}@127.0.0.1:{a},127.0.0.1:{b}/distlock"),
        ),
        (
            "cluster",
            format!("redis+cluster://:{SECRET}@127.0.0.1:{a},127.0.0.1:{b}"),
        ),
    ];
    let attempts = cases.iter().map(|(what, url)| async move {
        let started = Instant::now();
        let result = connect(url.clone(), SHORT).await;
        (*what, result.err(), started.elapsed())
    });
    for (what, error, took) in futures_util::future::join_all(attempts).await {
        let error = error.unwrap_or_else(|| panic!("{what}: connected"));
        eprintln!("{what} ({took:?}): {error}");
        assert!(
            matches!(error, LockError::Connection { .. }),
            "{what}: {error:?}"
        );
        assert!(took >= SHORT, "{what} gave up after {took:?}: {error}");
        assert!(took <= SHORT + SLACK, "{what} took {took:?}: {error}");
        assert_sentence(&error, &format!("127.0.0.1:{a}"));
        assert!(error.to_string().contains("refused"), "{what}: {error}");
    }
}

#[tokio::test]
async fn malformed_urls_say_what_is_wrong_and_where() {
    for (url, address, words) in [
        (
            format!("redis://:{SECRET}@127.0.0.1:notaport"),
            "127.0.0.1:notaport",
            "port",
        ),
        (
            format!("redis://:{SECRET}@127.0.0.1:99999"),
            "127.0.0.1:99999",
            "port",
        ),
        (
            format!("redis://:{SECRET}@127.0.0.1:6379/notadb"),
            "127.0.0.1:6379",
            "database",
        ),
        (
            format!("redis+redlock://:{SECRET}@127.0.0.1:1,127.0.0.1:x,127.0.0.1:3"),
            "127.0.0.1:x",
            "port",
        ),
        (
            format!("redis+cluster://:{SECRET}@127.0.0.1:x"),
            "127.0.0.1:x",
            "host:port",
        ),
        (
            format!("redis+sentinel://:{SECRET}@127.0.0.1:x/m"),
            "127.0.0.1:x",
            "host:port",
        ),
    ] {
        let error = RedisLock::connect(&url)
            .await
            .err()
            .unwrap_or_else(|| panic!("{url} connected"));
        eprintln!("{url}: {error}");
        assert!(
            matches!(error, LockError::Config { .. }),
            "{url}: {error:?}"
        );
        assert_sentence(&error, address);
        assert!(error.to_string().contains(words), "{url}: {error}");
    }
    // Without a host there is no address to name; still words.
    let error = RedisLock::connect(&format!("redis://:{SECRET}@"))
        .await
        .err()
        .unwrap_or_else(|| panic!("no host"));
    let message = error.to_string();
    assert!(
        !message.contains(SECRET) && !looks_like_debug(&message),
        "{message}"
    );
    assert!(message.contains("host"), "{message}");
}
