//! A conformance harness over real redis-server processes started for the test.

#![allow(dead_code)]

use std::sync::Arc;

use async_trait::async_trait;
use distlock_api::{DistributedLock, LockError};
use distlock_conformance::servers::RedisServer;
use distlock_conformance::{Client, Harness};
use distlock_redis::RedisLock;
use tokio::sync::Mutex;

/// `nodes` throwaway servers: one is a single node, more is Redlock.
pub struct RedisHarness {
    pub servers: Mutex<Vec<RedisServer>>,
    pub url: String,
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
    let url = if nodes == 1 {
        servers[0].url()
    } else {
        let hosts: Vec<String> = servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        format!("redis+redlock://{}", hosts.join(","))
    };
    RedisHarness {
        servers: Mutex::new(servers),
        url,
    }
}

pub async fn harness(nodes: usize) -> Arc<dyn Harness> {
    Arc::new(start(nodes).await)
}

#[async_trait]
impl Harness for RedisHarness {
    fn name(&self) -> String {
        self.url.clone()
    }

    async fn client(&self) -> Result<Client, LockError> {
        let lock: Arc<dyn DistributedLock> = Arc::new(RedisLock::connect(&self.url).await?);
        Ok(Client::new(lock))
    }
}
