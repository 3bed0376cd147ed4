//! A conformance harness over real redis-server processes started for the test, with
//! each client behind its own fault proxy so it can be cut off like a crashed process.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use distlock_api::{DistributedLock, LockError};
use distlock_conformance::{Client, Harness};
use distlock_conformance_faults::NetFaults;
use distlock_redis::RedisLock;
use distlock_test_servers::FaultProxy;
use distlock_test_servers::RedisServer;
use tokio::sync::Mutex;

/// `nodes` throwaway servers: one is a single node, more is Redlock.
pub struct RedisHarness {
    pub servers: Mutex<Vec<RedisServer>>,
    pub ports: Vec<u16>,
    /// Every client's proxies, kept for the harness's life: scenarios keep a client's
    /// lock but drop its fault hooks.
    proxies: std::sync::Mutex<Vec<FaultProxy>>,
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
        proxies: std::sync::Mutex::new(Vec::new()),
    }
}

pub async fn harness(nodes: usize) -> Arc<dyn Harness> {
    Arc::new(start(nodes).await)
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

#[async_trait]
impl Harness for RedisHarness {
    fn name(&self) -> String {
        self.url()
    }

    async fn client(&self) -> Result<Client, LockError> {
        let (lock, proxies) = self.proxied_client().await;
        if let Ok(mut kept) = self.proxies.lock() {
            kept.extend(proxies.iter().cloned());
        }
        let lock: Arc<dyn DistributedLock> = Arc::new(lock);
        // The kit's crash hook: every proxy of the client cut at once.
        Ok(Client::new(lock).with_faults(Arc::new(NetFaults::new(proxies))))
    }
}
