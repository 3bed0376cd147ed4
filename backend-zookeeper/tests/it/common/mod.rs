//! A conformance harness over a real ZooKeeper server started for the test binary, with
//! each client behind its own fault proxy so it can be cut off like a crashed process.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::LockError;
use distlock_conformance::{Client, Harness, UrlConnector};
use distlock_conformance_faults::NetFaults;
use distlock_test_servers::FaultProxy;
use distlock_test_servers::{shared_server, ZooKeeperServer, ZooKeeperServerOptions};
use distlock_zookeeper::{ZooKeeperConfig, ZooKeeperLock};
use zookeeper_client as zk;

/// The session timeout conformance clients ask for: short, so that a crashed holder's
/// lock frees fast, yet long enough for a busy two-core machine.
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(2);

/// The server's tick: session expiry is checked (and rounded up) per tick.
pub const TICK: Duration = Duration::from_millis(200);

/// The server settings every test uses: a 200 ms tick, sessions of 0.4 ..= 20 s.
pub fn server_config() -> ZooKeeperServerOptions {
    ZooKeeperServerOptions::default()
}

/// Starts a standalone server of our own; one that cannot start fails the test.
pub async fn start_server() -> ZooKeeperServer {
    ZooKeeperServer::start_with(server_config())
        .await
        .unwrap_or_else(|e| {
            panic!("could not start ZooKeeper (run scripts/test.sh, which installs the Debian package `zookeeper`): {e}")
        })
}

/// The port of one server shared by every test of this binary (started on first use,
/// stopped when the test process exits). For tests that do not kill or pause it.
pub fn shared_port() -> u16 {
    static PORT: OnceLock<u16> = OnceLock::new();
    *PORT.get_or_init(|| shared_server(start_server(), ZooKeeperServer::port))
}

pub fn url_for(port: u16) -> String {
    format!("zookeeper://127.0.0.1:{port}")
}

pub fn config(session_timeout: Duration) -> ZooKeeperConfig {
    ZooKeeperConfig::default().with_session_timeout(session_timeout)
}

/// A direct client of the server on `port`.
pub async fn direct(port: u16, session_timeout: Duration) -> ZooKeeperLock {
    ZooKeeperLock::connect_with(&url_for(port), config(session_timeout))
        .await
        .expect("connects to ZooKeeper")
}

/// A client whose connection goes through its own fault proxy, and the proxy.
pub async fn proxied(
    port: u16,
    session_timeout: Duration,
    tune: impl FnOnce(ZooKeeperConfig) -> ZooKeeperConfig,
) -> (ZooKeeperLock, FaultProxy) {
    let proxy = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .expect("fault proxy starts");
    let lock = ZooKeeperLock::connect_with(
        &url_for(proxy.local_addr().port()),
        tune(config(session_timeout)),
    )
    .await
    .expect("connects through the proxy");
    (lock, proxy)
}

/// A fault proxy to the server on `port`, on a runtime of its own (see
/// [`FaultProxy::start_detached`]).
pub async fn network_proxy(port: u16) -> FaultProxy {
    FaultProxy::start_detached(SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .expect("fault proxy starts")
}

/// A raw `zookeeper-client` session, for looking at nodes.
pub async fn raw(port: u16) -> zk::Client {
    zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(&format!("127.0.0.1:{port}"))
        .await
        .expect("raw ZooKeeper client connects")
}

/// Waits (on child watches, not by polling) until `dir` has exactly `n` children.
pub async fn wait_children(raw: &zk::Client, dir: &str, n: usize, limit: Duration) -> Vec<String> {
    let wait = async {
        loop {
            match raw.get_and_watch_children(dir).await {
                Ok((children, _, watcher)) => {
                    if children.len() == n {
                        return children;
                    }
                    watcher.changed().await;
                }
                Err(zk::Error::NoNode) if n == 0 => return Vec::new(),
                Err(zk::Error::NoNode) => {
                    // Not created yet: wait for it to appear.
                    let (stat, watcher) = raw
                        .check_and_watch_stat(dir)
                        .await
                        .expect("exists watch on the lock directory");
                    if stat.is_none() {
                        watcher.changed().await;
                    }
                }
                Err(e) => panic!("listing {dir}: {e}"),
            }
        }
    };
    tokio::time::timeout(limit, wait)
        .await
        .unwrap_or_else(|_| panic!("{dir} did not get {n} children within {limit:?}"))
}

/// Watches per watched path, from the server's `wchp` four-letter word.
pub async fn watches_by_path(port: u16) -> HashMap<String, usize> {
    let reply = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("4lw connect");
        stream.write_all(b"wchp").expect("4lw write");
        let mut reply = String::new();
        stream.read_to_string(&mut reply).expect("4lw read");
        reply
    })
    .await
    .expect("4lw task");
    let mut watches = HashMap::new();
    let mut current = None;
    for line in reply.lines() {
        if line.starts_with('/') {
            current = Some(line.trim().to_owned());
            watches.entry(line.trim().to_owned()).or_insert(0);
        } else if line.trim().starts_with("0x") {
            if let Some(path) = &current {
                *watches.entry(path.clone()).or_insert(0) += 1;
            }
        }
    }
    watches
}

/// The standalone harness: one shared server, every client behind its own proxy.
pub struct ZkHarness {
    port: u16,
    /// Every client's proxy, kept for the harness's life: scenarios drop a client's
    /// fault hooks but keep its lock.
    proxies: Mutex<Vec<FaultProxy>>,
}

pub async fn harness() -> Arc<dyn Harness> {
    Arc::new(ZkHarness {
        port: shared_port(),
        proxies: Mutex::new(Vec::new()),
    })
}

#[async_trait]
impl Harness for ZkHarness {
    fn name(&self) -> String {
        url_for(self.port)
    }

    async fn client(&self) -> Result<Client, LockError> {
        let proxy = network_proxy(self.port).await;
        let lock = ZooKeeperLock::connect_with(
            &url_for(proxy.local_addr().port()),
            config(SESSION_TIMEOUT),
        )
        .await
        .expect("connects through the proxy");
        if let Ok(mut kept) = self.proxies.lock() {
            kept.push(proxy.clone());
        }
        Ok(Client::new(lock.client()).with_faults(Arc::new(NetFaults::new(vec![proxy]))))
    }

    /// A cut-off holder keeps its lock until the server expires its session: the
    /// negotiated timeout, rounded up to the server's tick, plus a tick for the
    /// expiry sweep.
    fn crash_bound(&self, _ttl: Duration) -> Duration {
        SESSION_TIMEOUT + 2 * TICK
    }

    fn url_connector(&self) -> Option<UrlConnector> {
        Some(connector())
    }
}

/// Clients made from the URL alone, with default settings, and no fault hooks.
pub struct UrlHarness {
    port: u16,
}

pub async fn url_harness() -> Arc<dyn Harness> {
    Arc::new(UrlHarness {
        port: shared_port(),
    })
}

fn connector() -> UrlConnector {
    Arc::new(|url: String| {
        Box::pin(async move { Ok(ZooKeeperLock::connect(&url).await?.client()) })
    })
}

#[async_trait]
impl Harness for UrlHarness {
    fn name(&self) -> String {
        url_for(self.port)
    }

    async fn client(&self) -> Result<Client, LockError> {
        let lock = ZooKeeperLock::connect(&url_for(self.port)).await?;
        Ok(Client::new(lock.client()))
    }

    fn url_connector(&self) -> Option<UrlConnector> {
        Some(connector())
    }
}
