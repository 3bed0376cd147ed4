//! Real redis-server processes started for the test: the conformance harness (the
//! fault kit's `ServerHarness`, each client behind its own fault proxies with a crash
//! hook) and, for the backend's own tests, direct and proxied clients.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::LockError;
use distlock_conformance::{Client, Harness, UrlConnector};
use distlock_conformance_faults::ServerHarness;
use distlock_redis::{RedisConfig, RedisLock};
use distlock_test_servers::{FaultProxy, RedisServer, ServerControl};
use tokio::sync::Mutex;

/// `nodes` throwaway servers: one is a single node, more is Redlock.
pub struct RedisHarness {
    pub servers: Mutex<Vec<RedisServer>>,
    pub ports: Vec<u16>,
}

/// Starts `nodes` servers; a server that cannot start fails the test.
pub async fn start(nodes: usize) -> RedisHarness {
    let mut servers = Vec::new();
    for _ in 0..nodes {
        match RedisServer::start().await {
            Ok(server) => servers.push(server),
            Err(e) => {
                panic!("could not start redis-server (run scripts/test.sh, which installs it): {e}")
            }
        }
    }
    let ports = servers.iter().map(RedisServer::port).collect();
    RedisHarness {
        servers: Mutex::new(servers),
        ports,
    }
}

/// The conformance harness: `nodes` fresh servers, every client behind its own
/// proxies with the kit's crash hook (its proxies cut).
pub async fn harness(nodes: usize) -> Arc<dyn Harness> {
    let mut servers: Vec<Box<dyn ServerControl>> = Vec::new();
    for _ in 0..nodes {
        let server = RedisServer::start().await.unwrap_or_else(|e| {
            panic!("could not start redis-server (run scripts/test.sh, which installs it): {e}")
        });
        servers.push(Box::new(server));
    }
    let template = if nodes == 1 {
        "redis://{hosts}"
    } else {
        "redis+redlock://{hosts}"
    };
    let connector: UrlConnector = Arc::new(|url: String| {
        Box::pin(async move { Ok(RedisLock::connect(&url).await?.client()) })
    });
    Arc::new(ServerHarness::new(servers, template, connector))
}

/// The URL for `ports`: one node, or Redlock over all.
pub fn url_for(ports: &[u16]) -> String {
    match ports {
        [port] => format!("redis://127.0.0.1:{port}"),
        _ => {
            let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
            format!("redis+redlock://{}", hosts.join(","))
        }
    }
}

impl RedisHarness {
    /// The direct URL (no proxies).
    pub fn url(&self) -> String {
        url_for(&self.ports)
    }

    /// A client whose every connection goes through its own proxy, and the proxies.
    pub async fn proxied_client(&self) -> (RedisLock, Vec<FaultProxy>) {
        let mut proxies = Vec::new();
        for port in &self.ports {
            let upstream = SocketAddr::from(([127, 0, 0, 1], *port));
            proxies.push(
                FaultProxy::start(upstream)
                    .await
                    .expect("fault proxy starts"),
            );
        }
        let ports: Vec<u16> = proxies.iter().map(|p| p.local_addr().port()).collect();
        let lock = RedisLock::connect(&url_for(&ports))
            .await
            .expect("connects through the proxy");
        (lock, proxies)
    }

    /// A raw connection to node `index`, for inspecting keys.
    pub async fn raw(&self, index: usize) -> redis::aio::MultiplexedConnection {
        let url = format!("redis://127.0.0.1:{}", self.ports[index]);
        redis::Client::open(url)
            .expect("valid URL")
            .get_multiplexed_async_connection()
            .await
            .expect("raw connection")
    }
}

/// A conformance harness over a Sentinel or Cluster URL: each client is a fresh
/// connect. There are no fault hooks (a client's connections go to servers the
/// topology names, past any proxy), so the crash scenarios are skipped.
pub struct TopologyHarness {
    pub url: String,
    pub config: RedisConfig,
}

#[async_trait]
impl Harness for TopologyHarness {
    fn name(&self) -> String {
        self.url.clone()
    }

    async fn client(&self) -> Result<Client, LockError> {
        let lock = RedisLock::connect_with(&self.url, self.config.clone()).await?;
        Ok(Client::new(lock.client()))
    }
}

/// Runs the whole conformance kit against `url` and fails on any failed scenario.
pub async fn kit_passes(url: &str) {
    kit_passes_with(url, RedisConfig::default()).await
}

/// How long a request of a TLS topology's kit client may take, its connect included:
/// the kit connects many clients at once, each with TLS handshakes to several nodes
/// (a debug build's rustls), which on a busy two-core machine took longer than the
/// default 2 s ("no Cluster seed answered within 2s").
pub const TLS_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// [`kit_passes`] for a TLS URL: clients get [`TLS_REQUEST_TIMEOUT`].
pub async fn tls_kit_passes(url: &str) {
    let mut config = RedisConfig::default();
    config.request_timeout = TLS_REQUEST_TIMEOUT;
    kit_passes_with(url, config).await
}

/// [`kit_passes`] with clients connected with `config`.
pub async fn kit_passes_with(url: &str, config: RedisConfig) {
    let report = distlock_conformance::run_all(Arc::new(TopologyHarness {
        url: url.to_owned(),
        config,
    }))
    .await;
    println!("{}", report.to_table());
    assert!(report.all_passed(), "failed: {:?}", report.failed());
}

/// Waits (at most 10 s, in `WAIT 1 200` steps) until a replica of the server behind
/// `conn` acknowledged every write so far.
pub async fn wait_for_replica(conn: &mut redis::aio::MultiplexedConnection) {
    let started = std::time::Instant::now();
    loop {
        let acked: i64 = redis::cmd("WAIT")
            .arg(1)
            .arg(200)
            .query_async(conn)
            .await
            .expect("WAIT answers");
        if acked >= 1 {
            return;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "no replica acknowledged the writes within 10 s"
        );
    }
}

/// Polls until the (single) server holds no key but the mutex's one fencing counter
/// (`distlock_redis::SERVER_FENCE`), allowing the
/// primitives' fencing records' life after a grant of `ttl` (the TTL plus the margin)
/// and some slack.
pub async fn until_nothing_left(raw: &mut redis::aio::MultiplexedConnection, ttl: Duration) {
    let deadline = tokio::time::Instant::now() + ttl + Duration::from_secs(10 + 15);
    loop {
        // Every key but the server's fencing counter, which never expires (one per
        // server, whatever the keys locked; a slot counter here would be a leftover).
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(raw).await.unwrap();
        let left: Vec<&String> = keys
            .iter()
            .filter(|k| k.as_str() != distlock_redis::SERVER_FENCE)
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} keys left behind, among them {:?}",
            left.len(),
            &left[..left.len().min(50)]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A plain multiplexed connection to the redis-server on `port`, for a test's own
/// commands beside the backend's.
pub async fn raw(port: u16) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}
