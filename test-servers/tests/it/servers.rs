//! Smoke tests for the real-server harness in `distlock_test_servers`:
//! every server starts, answers its protocol, survives kill + restart on the
//! same port, stops answering while paused, and leaves nothing behind.
//!
//! A server that cannot start is a loud skip, or a failure when
//! `require_servers()` is true (CI=true or DISTLOCK_REQUIRE_SERVERS=1).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use distlock_test_servers::ServerControl;
use distlock_test_servers::{
    EtcdCluster, EtcdServer, PostgresServer, RedisServer, RedisServerOptions, ServerError,
    ZooKeeperEnsemble, ZooKeeperMode, ZooKeeperServer,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const SHORT: Duration = Duration::from_millis(300);
const NORMAL: Duration = Duration::from_secs(2);

/// Unwraps a server start, or skips / fails the test per `require_servers()`.
macro_rules! start_or_skip {
    ($test:expr, $start:expr) => {
        match $start {
            Ok(server) => server,
            Err(err) => {
                distlock_test_servers::skip_or_panic($test, &err);
                return;
            }
        }
    };
}

fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

async fn port_refuses(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).await.is_err()
}

/// Checks what every handle promises after drop: process reaped, port
/// closed, directory removed.
async fn assert_gone(what: &str, pid: u32, port: u16, dir: PathBuf) {
    assert!(!pid_alive(pid), "{what}: pid {pid} still alive after drop");
    assert!(
        port_refuses(port).await,
        "{what}: port {port} still accepts connections after drop"
    );
    assert!(!dir.exists(), "{what}: {} not removed", dir.display());
}

/// Sends one RESP command and returns the first reply line.
async fn redis_cmd(port: u16, args: &[&str]) -> String {
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to redis");
    stream.write_all(req.as_bytes()).await.expect("write");
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).await.expect("read");
    if line.starts_with('$') && !line.starts_with("$-1") {
        let mut value = String::new();
        reader.read_line(&mut value).await.expect("read bulk");
        return value.trim_end().to_string();
    }
    line.trim_end().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_server_lifecycle() {
    let test = "redis_server_lifecycle";
    let mut cfg = RedisServerOptions::persistent();
    cfg.extra_args = vec!["--appendfsync".into(), "always".into()];
    let mut redis = start_or_skip!(test, RedisServer::start_with(cfg).await);
    let port = redis.port();
    assert_eq!(redis.url(), format!("redis://127.0.0.1:{port}"));
    redis.ping(NORMAL).await.expect("PING after start");
    assert_eq!(redis_cmd(port, &["SET", "k", "v"]).await, "+OK");

    // Pause: the kernel still accepts, the server answers nothing.
    redis.pause().expect("pause");
    assert!(redis.is_paused());
    assert!(
        redis.ping(SHORT).await.is_err(),
        "PING answered while paused"
    );
    redis.resume().expect("resume");
    redis.ping(NORMAL).await.expect("PING after resume");

    // Kill: the port goes dead; restart brings it back on the same port, and
    // the append-only file brings the data back.
    let old_pid = redis.pid().expect("pid");
    redis.kill();
    assert!(!redis.is_running());
    assert!(!pid_alive(old_pid));
    assert!(redis.ping(SHORT).await.is_err(), "PING answered after kill");
    assert!(matches!(redis.pause(), Err(ServerError::NotRunning { .. })));
    redis.restart().await.expect("restart");
    assert_eq!(redis.port(), port);
    redis.ping(NORMAL).await.expect("PING after restart");
    assert_eq!(redis_cmd(port, &["GET", "k"]).await, "v");

    let pid = redis.pid().expect("pid");
    let dir = redis.data_dir().to_path_buf();
    drop(redis);
    assert_gone(test, pid, port, dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_server_lifecycle() {
    let test = "postgres_server_lifecycle";
    let mut pg = start_or_skip!(test, PostgresServer::start().await);
    let port = pg.port();
    assert_eq!(
        pg.url(),
        format!("postgres://postgres@127.0.0.1:{port}/postgres")
    );
    pg.ping(NORMAL).await.expect("handshake after start");
    assert_select_1(&pg.url()).await;

    pg.pause().expect("pause");
    assert!(pg.ping(SHORT).await.is_err(), "handshake while paused");
    pg.resume().expect("resume");
    pg.ping(NORMAL).await.expect("handshake after resume");

    let old_pid = pg.pid().expect("pid");
    pg.kill();
    assert!(!pg.is_running());
    assert!(!pid_alive(old_pid));
    assert!(pg.ping(SHORT).await.is_err(), "handshake after kill");
    pg.restart()
        .await
        .expect("restart after kill (crash recovery)");
    assert_eq!(pg.port(), port);
    assert_select_1(&pg.url()).await;

    let pid = pg.pid().expect("pid");
    let dir = pg.dir().to_path_buf();
    assert!(pg.data_dir().starts_with(&dir));
    drop(pg);
    assert_gone(test, pid, port, dir).await;
}

/// `psql URL -c 'select 1'` prints 1 (skipped with a note if psql is absent).
async fn assert_select_1(url: &str) {
    let out = match tokio::process::Command::new("psql")
        .args([url, "-XtAc", "select 1"])
        .output()
        .await
    {
        Ok(out) => out,
        Err(e) => {
            eprintln!("note: psql not runnable ({e}); relying on the protocol handshake");
            return;
        }
    };
    assert!(
        out.status.success(),
        "psql failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_server_lifecycle() {
    let test = "zookeeper_server_lifecycle";
    let mut zk = start_or_skip!(test, ZooKeeperServer::start().await);
    let port = zk.port();
    assert_eq!(zk.url(), format!("zookeeper://127.0.0.1:{port}"));
    zk.ping(NORMAL).await.expect("ruok after start");
    assert_eq!(
        zk.mode(NORMAL).await.expect("srvr"),
        ZooKeeperMode::Standalone
    );

    zk.pause().expect("pause");
    assert!(zk.ping(SHORT).await.is_err(), "imok while paused");
    zk.resume().expect("resume");
    zk.ping(NORMAL).await.expect("ruok after resume");

    let old_pid = zk.pid().expect("pid");
    zk.kill();
    assert!(!pid_alive(old_pid));
    assert!(zk.ping(SHORT).await.is_err(), "imok after kill");
    zk.restart().await.expect("restart");
    assert_eq!(zk.port(), port);
    zk.ping(NORMAL).await.expect("ruok after restart");

    let pid = zk.pid().expect("pid");
    let dir = zk.dir().to_path_buf();
    drop(zk);
    assert_gone(test, pid, port, dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_ensemble_reelects_after_leader_kill() {
    let test = "zookeeper_ensemble_reelects_after_leader_kill";
    let started = Instant::now();
    let mut ensemble = start_or_skip!(test, ZooKeeperEnsemble::start(3).await);
    eprintln!(
        "{test}: 3-node ensemble serving after {:?}",
        started.elapsed()
    );
    assert_eq!(ensemble.len(), 3);
    assert_eq!(ensemble.url().matches("127.0.0.1:").count(), 3);

    let old = ensemble
        .wait_for_leader(Duration::from_secs(10))
        .await
        .expect("initial leader");
    ensemble.kill_node(old).expect("kill leader");
    let killed_at = Instant::now();
    let new = ensemble
        .wait_for_leader(Duration::from_secs(20))
        .await
        .expect("a new leader after killing the old one");
    eprintln!(
        "{test}: node {new} took over from node {old} after {:?}",
        killed_at.elapsed()
    );
    assert_ne!(new, old);

    // The old leader rejoins as a follower on its old ports.
    ensemble
        .restart_node(old)
        .await
        .expect("restart old leader");
    let mode = ensemble
        .node(old)
        .expect("node")
        .mode(NORMAL)
        .await
        .expect("srvr");
    assert_eq!(mode, ZooKeeperMode::Follower);

    let leftovers: Vec<(u32, u16, PathBuf)> = ensemble
        .nodes()
        .iter()
        .map(|n| (n.pid().expect("pid"), n.port(), n.dir().to_path_buf()))
        .collect();
    drop(ensemble);
    for (pid, port, dir) in leftovers {
        assert_gone(test, pid, port, dir).await;
    }
}

/// Runs `etcdctl` (API v3) against `endpoints`; its stdout, or panics with stderr.
fn etcdctl(endpoints: &str, args: &[&str]) -> String {
    let out = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg("--endpoints")
        .arg(endpoints)
        .arg("--dial-timeout=2s")
        .arg("--command-timeout=5s")
        .args(args)
        .output()
        .expect("run etcdctl (Debian package etcd-client)");
    assert!(
        out.status.success(),
        "etcdctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_server_lifecycle() {
    let test = "etcd_server_lifecycle";
    let mut etcd = start_or_skip!(test, EtcdServer::start().await);
    let port = etcd.port();
    assert_eq!(etcd.url(), format!("etcd://127.0.0.1:{port}"));
    etcd.ping(NORMAL).await.expect("health after start");
    etcdctl(&etcd.endpoint(), &["put", "k", "v"]);
    assert_eq!(
        etcdctl(&etcd.endpoint(), &["get", "--print-value-only", "k"]).trim(),
        "v"
    );

    etcd.pause().expect("pause");
    assert!(etcd.ping(SHORT).await.is_err(), "healthy while paused");
    etcd.resume().expect("resume");
    etcd.ping(NORMAL).await.expect("health after resume");

    let old_pid = etcd.pid().expect("pid");
    etcd.kill();
    assert!(!pid_alive(old_pid));
    assert!(etcd.ping(SHORT).await.is_err(), "healthy after kill");
    etcd.restart().await.expect("restart");
    assert_eq!(etcd.port(), port);
    assert_eq!(
        etcdctl(&etcd.endpoint(), &["get", "--print-value-only", "k"]).trim(),
        "v",
        "data survives a restart"
    );

    let pid = etcd.pid().expect("pid");
    let dir = etcd.dir().to_path_buf();
    drop(etcd);
    assert_gone(test, pid, port, dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_cluster_reelects_after_leader_kill() {
    let test = "etcd_cluster_reelects_after_leader_kill";
    let started = Instant::now();
    let mut cluster = start_or_skip!(test, EtcdCluster::start(3).await);
    eprintln!("{test}: 3 members serving after {:?}", started.elapsed());
    assert_eq!(cluster.len(), 3);
    assert_eq!(cluster.url().matches("127.0.0.1:").count(), 3);
    etcdctl(&cluster.endpoints(), &["put", "k", "v"]);

    let old = cluster
        .wait_for_leader(Duration::from_secs(10))
        .await
        .expect("initial leader");
    cluster.kill_node(old).expect("kill leader");
    let killed_at = Instant::now();
    let new = cluster
        .wait_for_leader(Duration::from_secs(20))
        .await
        .expect("a new leader after killing the old one");
    eprintln!(
        "{test}: member {new} took over from member {old} after {:?}",
        killed_at.elapsed()
    );
    assert_ne!(new, old);

    cluster.restart_node(old).await.expect("restart old leader");
    let back = cluster.nodes()[old].endpoint();
    assert_eq!(
        etcdctl(&back, &["get", "--print-value-only", "k"]).trim(),
        "v"
    );
    cluster.restart_all().await.expect("whole-cluster restart");
    assert_eq!(
        etcdctl(&cluster.endpoints(), &["get", "--print-value-only", "k"]).trim(),
        "v"
    );
    // Every member killed, then restarted one by one (as the fault kit does): the first
    // comes back without a majority, so it is only started; the second makes one.
    for node in 0..3 {
        cluster.kill_node(node).expect("kill");
    }
    for node in 0..3 {
        cluster
            .restart_node(node)
            .await
            .expect("restart one by one");
    }
    cluster
        .wait_for_leader(Duration::from_secs(20))
        .await
        .expect("a leader after the members came back one by one");
    assert_eq!(
        etcdctl(&cluster.endpoints(), &["get", "--print-value-only", "k"]).trim(),
        "v"
    );

    let leftovers: Vec<(u32, u16, PathBuf)> = cluster
        .nodes()
        .iter()
        .map(|n| (n.pid().expect("pid"), n.port(), n.dir().to_path_buf()))
        .collect();
    drop(cluster);
    for (pid, port, dir) in leftovers {
        assert_gone(test, pid, port, dir).await;
    }
}

/// `DISTLOCK_TEST_SERVERS` picks the provider; the default is local binaries, and a
/// value that names no provider is a typed error.
#[test]
fn provider_comes_from_the_environment() {
    // Only this test touches the variable, and only through the parser's input: the
    // parser is checked on the current value, whatever the caller set.
    let current = std::env::var(distlock_test_servers::PROVIDER_VAR).unwrap_or_default();
    let parsed = distlock_test_servers::Provider::from_env();
    match current.trim().to_ascii_lowercase().as_str() {
        "" | "local" => assert_eq!(parsed.ok(), Some(distlock_test_servers::Provider::Local)),
        "docker" => assert_eq!(parsed.ok(), Some(distlock_test_servers::Provider::Docker)),
        _ => assert!(matches!(parsed, Err(ServerError::InvalidArgument(_)))),
    }
}
