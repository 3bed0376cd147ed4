//! etcd comparators: the raw bound (the round trips distlock's uncontended cycle makes:
//! a lease grant, a put-if-absent transaction and a lease revoke, which deletes the key,
//! through etcd-client) and etcd-client's own `lock()`/`unlock()` (etcd's v3lock
//! service), on a lease granted per cycle and revoked after the unlock, and on one
//! lease per worker kept alive for the run, as a Go `concurrency.NewSession` user
//! holds one (two raft writes a cycle: the put and the delete).

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, LeaseGrantOptions, LockOptions, PutOptions, Txn, TxnOp,
};

use crate::side::{BoxError, Contender, Side, PATIENCE, TTL};

/// `http://host:port` for each host of an `etcd://` URL (credentials and TLS are not
/// used by the comparators).
fn endpoints(url: &str) -> Result<Vec<String>, BoxError> {
    let parsed = distlock::etcd::parse_url(url)?;
    Ok(parsed
        .endpoints
        .iter()
        .map(|(h, p)| format!("http://{h}:{p}"))
        .collect())
}

async fn client(url: &str) -> Result<Client, BoxError> {
    Ok(Client::connect(endpoints(url)?, None).await?)
}

/// The server's version, for the report.
pub(crate) async fn server_version(url: &str) -> Result<String, BoxError> {
    let status = client(url).await?.status().await?;
    Ok(format!("etcd {}", status.version()))
}

/// A lease id of our own choosing, as distlock picks them.
fn lease_id() -> i64 {
    i64::try_from(rand_u64() >> 1).unwrap_or(1).max(1)
}

/// A cheap per-call random number (no `rand` dependency here).
fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    hasher.finish()
}

fn ttl_secs() -> i64 {
    i64::try_from(TTL.as_secs()).unwrap_or(30)
}

/// The raw bound: one client shared by every worker, like distlock's.
pub(crate) struct Raw {
    client: Client,
}

impl Raw {
    pub(crate) async fn connect(url: &str) -> Result<Self, BoxError> {
        Ok(Raw {
            client: client(url).await?,
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
            client: self.client.clone(),
        }))
    }
}

struct RawContender {
    client: Client,
}

#[async_trait]
impl Contender for RawContender {
    async fn cycle(&mut self, key: &str, held: &mut (dyn FnMut() + Send)) -> Result<(), BoxError> {
        let id = lease_id();
        self.client
            .lease_grant(ttl_secs(), Some(LeaseGrantOptions::new().with_id(id)))
            .await?;
        let name = format!("bench/raw/{key}/{id:x}");
        let put = Txn::new()
            .when([Compare::create_revision(name.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                name.as_str(),
                "",
                Some(PutOptions::new().with_lease(id)),
            )]);
        if !self.client.txn(put).await?.succeeded() {
            return Err("raw etcd: the key existed".into());
        }
        held();
        // The lease carries the key alone: revoking it deletes the key.
        self.client.lease_revoke(id).await?;
        Ok(())
    }
}

/// etcd-client's `lock()`/`unlock()` on a lease granted per cycle (and revoked after),
/// one client shared by the workers.
pub(crate) struct Recipe {
    client: Client,
}

impl Recipe {
    pub(crate) async fn connect(url: &str) -> Result<Self, BoxError> {
        Ok(Recipe {
            client: client(url).await?,
        })
    }
}

#[async_trait]
impl Side for Recipe {
    fn name(&self) -> &'static str {
        "etcd-client lock"
    }

    async fn contender(&self, _worker: usize) -> Result<Box<dyn Contender>, BoxError> {
        Ok(Box::new(RecipeContender {
            client: self.client.clone(),
        }))
    }
}

struct RecipeContender {
    client: Client,
}

#[async_trait]
impl Contender for RecipeContender {
    async fn cycle(&mut self, key: &str, held: &mut (dyn FnMut() + Send)) -> Result<(), BoxError> {
        let lease = self.client.lease_grant(ttl_secs(), None).await?.id();
        let name = format!("bench/recipe/{key}");
        let locked = tokio::time::timeout(
            PATIENCE,
            self.client
                .lock(name, Some(LockOptions::new().with_lease(lease))),
        )
        .await
        .map_err(|_| "etcd-client lock: acquire timed out")??;
        held();
        self.client.unlock(locked.key()).await?;
        self.client.lease_revoke(lease).await?;
        Ok(())
    }
}

/// etcd-client's `lock()`/`unlock()` on one lease per worker, granted when the worker
/// starts and kept alive by a task of its own (as a Go `concurrency.Session` keeps its
/// lease): a cycle is the lock's put and the unlock's delete. One client shared by the
/// workers.
pub(crate) struct SessionRecipe {
    client: Client,
}

impl SessionRecipe {
    pub(crate) async fn connect(url: &str) -> Result<Self, BoxError> {
        Ok(SessionRecipe {
            client: client(url).await?,
        })
    }
}

#[async_trait]
impl Side for SessionRecipe {
    fn name(&self) -> &'static str {
        "etcd-client lock, lease per worker"
    }

    async fn contender(&self, _worker: usize) -> Result<Box<dyn Contender>, BoxError> {
        let mut client = self.client.clone();
        let lease = client.lease_grant(ttl_secs(), None).await?.id();
        let (mut keeper, mut answers) = client.lease_keep_alive(lease).await?;
        // Keeps the lease alive every third of its TTL until the worker goes; then
        // revokes it (a task that outlives a dropped runtime is not needed: the run's
        // server is thrown away, and the TTL bounds what is left).
        let period = std::time::Duration::from_secs(u64::try_from(ttl_secs()).unwrap_or(30) / 3);
        let keep = tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                if keeper.keep_alive().await.is_err() || answers.message().await.is_err() {
                    return;
                }
            }
        });
        Ok(Box::new(SessionContender {
            client: self.client.clone(),
            lease,
            keep,
        }))
    }
}

struct SessionContender {
    client: Client,
    lease: i64,
    keep: tokio::task::JoinHandle<()>,
}

impl Drop for SessionContender {
    fn drop(&mut self) {
        self.keep.abort();
        let (mut client, lease) = (self.client.clone(), self.lease);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = client.lease_revoke(lease).await;
            });
        }
    }
}

#[async_trait]
impl Contender for SessionContender {
    async fn cycle(&mut self, key: &str, held: &mut (dyn FnMut() + Send)) -> Result<(), BoxError> {
        let name = format!("bench/session/{key}");
        let locked = tokio::time::timeout(
            PATIENCE,
            self.client
                .lock(name, Some(LockOptions::new().with_lease(self.lease))),
        )
        .await
        .map_err(|_| "etcd-client lock on a worker's lease: acquire timed out")??;
        held();
        self.client.unlock(locked.key()).await?;
        Ok(())
    }
}
