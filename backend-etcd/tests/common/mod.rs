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
use distlock_test_servers::{EtcdServer, FaultProxy};

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

static SHARED: Mutex<Option<EtcdServer>> = Mutex::new(None);

extern "C" fn stop_shared_server() {
    // Dropping the handle kills etcd and deletes its directory.
    if let Ok(mut shared) = SHARED.lock() {
        shared.take();
    }
}

/// The port of one server shared by every test of this binary (started on first use,
/// stopped when the test process exits). For tests that do not kill or pause it.
#[allow(unsafe_code)] // FFI: see the SAFETY note
pub fn shared_port() -> u16 {
    static PORT: OnceLock<u16> = OnceLock::new();
    *PORT.get_or_init(|| {
        // The handle does not depend on a runtime; start it on a private one.
        let server = std::thread::spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime to start etcd on")
                .block_on(start_server())
        })
        .join()
        .unwrap_or_else(|_| panic!("starting the shared etcd server panicked"));
        let port = server.port();
        *SHARED.lock().expect("shared server slot") = Some(server);
        // SAFETY: registers a plain `extern "C"` function with no captured state.
        unsafe {
            libc::atexit(stop_shared_server);
        }
        port
    })
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

/// A fault proxy to the server on `port` that runs on a runtime of its own: it is the
/// network, not part of the client's process, so it outlives the runtime the client
/// runs on (a scenario shuts a client's runtime down to play its process exiting, and
/// the client then revokes its leases through the proxy).
pub async fn network_proxy(port: u16) -> FaultProxy {
    static NETWORK: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    let network = NETWORK.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fault-proxy")
            .enable_all()
            .build()
            .expect("a runtime for the fault proxies")
    });
    network
        .spawn(FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], port))))
        .await
        .expect("the proxy's start does not panic")
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

/// A kit client of `lock` with its election, semaphore and read-write lock handles.
pub fn with_primitives(lock: EtcdLock) -> Client {
    Client::new(lock.lock())
        .with_election(lock.election())
        .with_semaphore(lock.semaphore())
        .with_rw_lock(lock.rw_lock())
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
    Arc::new(|url: String| {
        Box::pin(async move {
            let lock = EtcdLock::connect(&url).await?;
            Ok(lock.lock())
        })
    })
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
        Ok(with_primitives(lock).with_faults(Arc::new(NetFaults::new(vec![proxy]))))
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
