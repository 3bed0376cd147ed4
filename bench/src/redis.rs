//! Redis comparators: the raw bound (`SET NX PX` + compare-and-delete through the
//! redis crate), rslock and distributed-lock 0.2; and the server-side client count.

use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
#[cfg(feature = "compare")]
use distributed_lock_core::{DistributedLock as _, LockHandle as _, LockProvider as _};
#[cfg(feature = "compare")]
use distributed_lock_redis::RedisLockProvider;
use redis::aio::MultiplexedConnection;

#[cfg(feature = "compare")]
use crate::side::PATIENCE;
use crate::side::{BoxError, Contender, Side, TTL};

const COMPARE_AND_DELETE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

async fn connection(url: &str) -> Result<MultiplexedConnection, BoxError> {
    Ok(redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?)
}

/// The number of clients connected to the server (`INFO clients`), this probe included.
pub(crate) async fn connected_clients(url: &str) -> Result<u64, BoxError> {
    let mut conn = connection(url).await?;
    let info: String = redis::cmd("INFO")
        .arg("clients")
        .query_async(&mut conn)
        .await?;
    info.lines()
        .find_map(|line| line.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| "INFO clients has no connected_clients".into())
}

/// CPU time the server has used (`INFO cpu`: used_cpu_user + used_cpu_sys).
pub(crate) async fn server_cpu(url: &str) -> Result<std::time::Duration, BoxError> {
    let mut conn = connection(url).await?;
    let info: String = redis::cmd("INFO").arg("cpu").query_async(&mut conn).await?;
    let field = |name: &str| -> f64 {
        info.lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    Ok(std::time::Duration::from_secs_f64(
        field("used_cpu_user:") + field("used_cpu_sys:"),
    ))
}

/// The server's version (`INFO server`), for the report.
pub(crate) async fn server_version(url: &str) -> Result<String, BoxError> {
    let mut conn = connection(url).await?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await?;
    Ok(info
        .lines()
        .find_map(|line| line.strip_prefix("redis_version:"))
        .map(|v| format!("Redis {}", v.trim()))
        .unwrap_or_else(|| "Redis (version unknown)".into()))
}

/// A bare multiplexed connection shared by all workers, like distlock's.
pub(crate) struct Raw {
    conn: MultiplexedConnection,
    script: redis::Script,
}

impl Raw {
    pub(crate) async fn connect(url: &str) -> Result<Self, BoxError> {
        Ok(Raw {
            conn: connection(url).await?,
            script: redis::Script::new(COMPARE_AND_DELETE),
        })
    }
}

#[async_trait]
impl Side for Raw {
    fn name(&self) -> &'static str {
        "raw"
    }

    fn waits(&self) -> bool {
        false
    }

    async fn contender(&self, _worker: usize) -> Result<Box<dyn Contender>, BoxError> {
        Ok(Box::new(RawContender {
            conn: self.conn.clone(),
            script: self.script.clone(),
        }))
    }
}

struct RawContender {
    conn: MultiplexedConnection,
    script: redis::Script,
}

/// A distinct owner token per grant; uniqueness is all the raw loop needs.
fn token() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("{:032x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

#[async_trait]
impl Contender for RawContender {
    async fn cycle(&mut self, key: &str, held: &mut (dyn FnMut() + Send)) -> Result<(), BoxError> {
        let key = format!("bench/raw/{key}");
        let token = token();
        let set: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(TTL.as_millis() as u64)
            .query_async(&mut self.conn)
            .await?;
        if set.is_none() {
            return Err(format!("raw SET NX found {key} held").into());
        }
        held();
        let _: i64 = self
            .script
            .key(&key)
            .arg(&token)
            .invoke_async(&mut self.conn)
            .await?;
        Ok(())
    }
}

#[cfg(feature = "compare")]
/// rslock 0.10 with its defaults: one `LockManager` (one multiplexed connection)
/// shared by every worker; its acquire retries after a random 0–200 ms sleep.
pub(crate) struct Rslock {
    manager: rslock::LockManager,
}

#[cfg(feature = "compare")]
impl Rslock {
    pub(crate) fn connect(url: &str) -> Self {
        Rslock {
            manager: rslock::LockManager::new(vec![url.to_owned()]),
        }
    }
}

#[cfg(feature = "compare")]
#[async_trait]
impl Side for Rslock {
    fn name(&self) -> &'static str {
        "rslock"
    }

    async fn contender(&self, _worker: usize) -> Result<Box<dyn Contender>, BoxError> {
        Ok(Box::new(RslockContender {
            manager: self.manager.clone(),
        }))
    }
}

#[cfg(feature = "compare")]
struct RslockContender {
    manager: rslock::LockManager,
}

#[cfg(feature = "compare")]
#[async_trait]
impl Contender for RslockContender {
    async fn cycle(&mut self, key: &str, held: &mut (dyn FnMut() + Send)) -> Result<(), BoxError> {
        let resource = format!("bench/rslock/{key}");
        let lock = tokio::time::timeout(
            PATIENCE,
            self.manager.acquire_no_guard(resource.as_bytes(), TTL),
        )
        .await
        .map_err(|_| "rslock: acquire timed out")??;
        held();
        self.manager.unlock(&lock).await;
        Ok(())
    }
}

#[cfg(feature = "compare")]
/// distributed-lock 0.2 (Redis, through the fred client) with its defaults: one
/// provider shared by every worker.
pub(crate) struct DistributedLockRedis {
    provider: std::sync::Arc<RedisLockProvider>,
}

#[cfg(feature = "compare")]
impl DistributedLockRedis {
    pub(crate) async fn connect(url: &str) -> Result<Self, BoxError> {
        Ok(DistributedLockRedis {
            provider: std::sync::Arc::new(
                RedisLockProvider::builder()
                    .url(url)
                    .expiry(TTL)
                    .build()
                    .await?,
            ),
        })
    }
}

#[cfg(feature = "compare")]
#[async_trait]
impl Side for DistributedLockRedis {
    fn name(&self) -> &'static str {
        "distributed-lock"
    }

    /// Its Redis acquire (0.2.0) makes one attempt whatever the timeout and fails with
    /// `Timeout` at once when the key is held, so it cannot contend on a hot key
    /// without a polling loop of the caller's own.
    fn waits(&self) -> bool {
        false
    }

    async fn contender(&self, _worker: usize) -> Result<Box<dyn Contender>, BoxError> {
        Ok(Box::new(DistributedLockRedisContender {
            provider: self.provider.clone(),
        }))
    }
}

#[cfg(feature = "compare")]
struct DistributedLockRedisContender {
    provider: std::sync::Arc<RedisLockProvider>,
}

#[cfg(feature = "compare")]
#[async_trait]
impl Contender for DistributedLockRedisContender {
    async fn cycle(&mut self, key: &str, held: &mut (dyn FnMut() + Send)) -> Result<(), BoxError> {
        let lock = self.provider.create_lock(&format!("bench/dl/{key}"));
        let handle = lock.acquire(Some(PATIENCE)).await?;
        held();
        handle.release().await?;
        Ok(())
    }
}
