//! A conformance harness over a real single-node etcd started for the test binary,
//! with each client behind its own fault proxy so it can be cut off like a crashed
//! process.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_api::LockError;
use distlock_conformance::{Client, Harness, UrlConnector};
use distlock_conformance_faults::NetFaults;
use distlock_etcd::EtcdLock;
use distlock_test_servers::{shared_server, EtcdServer, FaultProxy};

/// The TTL the kit's TTL scenarios use: etcd's shortest lease with its default 1 s
/// election timeout.
pub const TTL: Duration = Duration::from_secs(2);

/// The lease a waiter waits under when the lock's TTL is longer.
pub const WAITER_TTL: Duration = Duration::from_secs(3);

/// Starts a single node of our own; one that cannot start fails the test.
pub async fn start_server() -> EtcdServer {
    EtcdServer::start().await.unwrap_or_else(|e| {
        panic!("could not start etcd (run scripts/install-deps.sh, which installs the Debian package `etcd-server`): {e}")
    })
}

/// The port of one server shared by every test of this binary (started on first use,
/// stopped when the test process exits). For tests that do not kill or pause it.
pub fn shared_port() -> u16 {
    static PORT: OnceLock<u16> = OnceLock::new();
    *PORT.get_or_init(|| shared_server(start_server(), EtcdServer::port))
}

pub fn url_for(port: u16) -> String {
    format!("etcd://127.0.0.1:{port}")
}

/// A direct client of the server on `port`.
pub async fn direct(port: u16) -> EtcdLock {
    EtcdLock::connect(&url_for(port))
        .await
        .expect("connects to etcd")
}

/// A fault proxy to the server on `port`, on a runtime of its own (see
/// [`FaultProxy::start_detached`]).
pub async fn network_proxy(port: u16) -> FaultProxy {
    FaultProxy::start_detached(SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .expect("fault proxy starts")
}

/// Runs `etcdctl` (API v3) against 127.0.0.1:`port`; its output, or panics.
pub fn etcdctl(port: u16, args: &[&str]) -> String {
    let out = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints=127.0.0.1:{port}"))
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

/// The ids (hex) `etcdctl lease list` shows: etcdctl 3.4 prints `found N leases`,
/// then one id a line.
pub fn leases(port: u16) -> Vec<String> {
    etcdctl(port, &["lease", "list"])
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with("found "))
        .map(str::to_owned)
        .collect()
}

/// The lease `key` is attached to, from `etcdctl get -w json` (0 for none or no key).
pub fn lease_of(port: u16, key: &str) -> u64 {
    let json = etcdctl(port, &["get", key, "-w", "json"]);
    json.split("\"lease\":")
        .nth(1)
        .and_then(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .unwrap_or(0)
}

/// Every key under `prefix` (`etcdctl get --prefix --keys-only`).
pub fn keys_under(port: u16, prefix: &str) -> Vec<String> {
    etcdctl(port, &["get", "--prefix", "--keys-only", prefix])
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The harness: one shared server, every client behind its own proxy.
pub struct EtcdHarness {
    port: u16,
    /// Every client's proxy, kept for the harness's life.
    proxies: Mutex<Vec<FaultProxy>>,
}

pub async fn harness() -> Arc<dyn Harness> {
    Arc::new(EtcdHarness {
        port: shared_port(),
        proxies: Mutex::new(Vec::new()),
    })
}

fn connector() -> UrlConnector {
    Arc::new(|url: String| Box::pin(async move { Ok(EtcdLock::connect(&url).await?.client()) }))
}

#[async_trait]
impl Harness for EtcdHarness {
    fn name(&self) -> String {
        url_for(self.port)
    }

    async fn client(&self) -> Result<Client, LockError> {
        let proxy = network_proxy(self.port).await;
        let lock = EtcdLock::connect(&url_for(proxy.local_addr().port())).await?;
        if let Ok(mut kept) = self.proxies.lock() {
            kept.push(proxy.clone());
        }
        Ok(Client::new(lock.client()).with_faults(Arc::new(NetFaults::new(vec![proxy]))))
    }

    fn ttl(&self) -> Duration {
        TTL
    }

    fn slack(&self) -> Duration {
        Duration::from_millis(1500)
    }

    /// A cut-off holder keeps its lock until etcd expires the client's lease of that
    /// TTL: the TTL rounded up to whole seconds after its last keep-alive (sent before
    /// the cut), plus the leader's expiry sweep (every 500 ms) and the revoke's raft
    /// round.
    fn crash_bound(&self, ttl: Duration) -> Duration {
        Duration::from_secs(ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0))
            + Duration::from_millis(600)
    }

    /// A waiter waits under a 3 s lease (when the lock's TTL is longer): a waiter
    /// whose process died holds up the queue until that lease runs out.
    fn dead_waiter_bound(&self) -> Duration {
        WAITER_TTL + Duration::from_millis(600)
    }

    fn url_connector(&self) -> Option<UrlConnector> {
        Some(connector())
    }
}

/// Polls `check` every 20 ms until it holds or `limit` passes.
pub async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    check()
}
