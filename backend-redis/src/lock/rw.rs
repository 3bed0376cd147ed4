//! [`RedisRwLock`]: the [`DistributedRwLock`] on one Redis node (direct, Sentinel or
//! Cluster), with writer preference.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::backend::prelude::*;
use distlock_api::{
    BackendInfo, DistributedRwLock, ExtendOutcome, Lease, LockError, LockGuard, LockKey,
    LockOptions, OwnerToken, ReleaseOutcome, RwMode,
};

use super::primitive::{self, Scripts};
use super::{Attempt, RedisLock};
use crate::keys::{KeyNames, Primitive};
use crate::node::{evalsha, hex, ttl_millis};
use crate::scripts::rw as script;

const OPERATION: &str = "read-write locks";

/// A read-write lock client of a Redis node, made by [`RedisLock::rw_lock`], sharing
/// the mutex client's connection, wake-ups and waiter lines.
///
/// Layout, for a key `K` (every name under the mutex's hash tag `{K}`, see
/// [`crate::KeyNames`]): `{K}:rw` is a sorted set of the readers' owner tokens scored
/// by the server time (ms) at which each expires, `{K}:rw:writer` the writer's owner
/// token with a `PX` expiry, and `{K}:rw:intent` the waiting writers, scored by when
/// each intent lapses. Every key expires with its longest-lived entry.
///
/// **Writer preference.** A writer that finds the key held records its intent, and
/// refreshes it at each retry (it lapses `2 × the backoff cap + 1 s` after the last);
/// while an intent lives, new readers are refused, so the writer is granted once the
/// readers inside leave. A writer that gives up withdraws its intent before its call
/// returns (a dropped acquire future, in the background) and wakes the readers it held
/// back. Waiting is the mutex's: `{K}:rw:waiting` marks a waited-on key, so a release
/// publishes on `{K}:rw:released` only then.
///
/// Every grant, read or write, carries a fencing token from `{K}:rw:fence`, a counter
/// seeded from the server's clock like the mutex's `{K}:fence` (see the crate docs),
/// above every earlier grant's of the key: a resource recording the highest token seen
/// can refuse a writer whose lease ran out before a later grant. Cloning gives another
/// handle on the same client.
#[derive(Debug, Clone)]
pub struct RedisRwLock {
    lock: RedisLock,
}

static SCRIPTS: Scripts = Scripts {
    acquire: &script::ACQUIRE,
    release: &script::RELEASE,
    extend: &script::EXTEND,
};

impl RedisLock {
    /// A read-write lock client sharing this client's connection; see [`RedisRwLock`].
    ///
    /// # Errors
    /// [`LockError::Unsupported`] on a Redlock client, saying why.
    pub fn rw_lock(&self) -> Result<RedisRwLock, LockError> {
        self.primitive_node(OPERATION)?;
        Ok(RedisRwLock { lock: self.clone() })
    }
}

impl RedisRwLock {
    /// The mutex client sharing this one's connection.
    pub fn client(&self) -> &RedisLock {
        &self.lock
    }

    /// One attempt; `writer` is a waiting writer's id, recording its intent when the
    /// key is held.
    async fn attempt(
        &self,
        key: &LockKey,
        names: &KeyNames,
        mode: RwMode,
        options: &LockOptions,
        waiting: Option<Duration>,
        writer: Option<&str>,
    ) -> Result<Attempt, LockError> {
        let intent = RedisLock::waiting_marker(options);
        let answer =
            primitive::attempt(&self.lock, key, names, options, &SCRIPTS, waiting, |cmd| {
                cmd.arg(match mode {
                    RwMode::Read => "r",
                    RwMode::Write => "w",
                })
                .arg(writer.unwrap_or(""))
                .arg(ttl_millis(intent));
            })
            .await?;
        answer.into_attempt(
            |lease, monitor| {
                let backend: Arc<dyn DistributedRwLock> = Arc::new(self.clone());
                LockGuard::for_rw(lease, monitor, backend, options.auto_renew())
            },
            |detail| {
                LockError::backend_error(
                    self.lock.name(),
                    format!("unexpected refusal {detail} from the read-write acquire script"),
                )
            },
        )
    }
}

#[async_trait]
impl DistributedRwLock for RedisRwLock {
    fn info(&self) -> BackendInfo {
        self.lock.primitive_info()
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        mode: RwMode,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        self.lock.check_primitive(options, OPERATION)?;
        let names = KeyNames::for_primitive(key, Primitive::Rw);
        match self.attempt(key, &names, mode, options, None, None).await? {
            Attempt::Granted(guard) => Ok(Some(guard)),
            Attempt::Held(_) => Ok(None),
        }
    }

    async fn acquire(
        &self,
        key: &LockKey,
        mode: RwMode,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        self.lock.check_primitive(options, OPERATION)?;
        let names = KeyNames::for_primitive(key, Primitive::Rw);
        let intent = (mode == RwMode::Write).then(|| Intent {
            lock: self.lock.clone(),
            names: names.clone(),
            writer: String::from_utf8_lossy(&hex(OwnerToken::random())).into_owned(),
            armed: true,
        });
        let writer = intent.as_ref().map(|intent| intent.writer.as_str());
        let granted = self
            .lock
            .acquire_waiting(key, &names, options, |waiting| {
                self.attempt(key, &names, mode, options, waiting, writer)
            })
            .await;
        if let Some(intent) = intent {
            match &granted {
                // The grant removed the intent.
                Ok(_) => intent.disarm(),
                // Giving up: withdraw it before returning, so readers go on at once.
                Err(_) => intent.withdraw().await,
            }
        }
        granted
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        let names = KeyNames::for_primitive(lease.key(), Primitive::Rw);
        primitive::release(&self.lock, &names, &SCRIPTS, lease, OPERATION).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        let names = KeyNames::for_primitive(lease.key(), Primitive::Rw);
        primitive::extend(&self.lock, &names, &SCRIPTS, lease, ttl, OPERATION).await
    }
}

/// A waiting writer's intent: withdrawn when it gives up, or in the background when
/// its acquire future is dropped. It lapses by itself besides (see [`RedisRwLock`]).
struct Intent {
    lock: RedisLock,
    names: KeyNames,
    writer: String,
    armed: bool,
}

impl Intent {
    fn disarm(mut self) {
        self.armed = false;
    }

    /// Withdraws the intent now. A failure leaves it to lapse by itself.
    async fn withdraw(mut self) {
        self.armed = false;
        let _ = withdraw(&self.lock, &self.names, &self.writer).await;
    }
}

impl Drop for Intent {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (lock, names, writer) = (
                self.lock.clone(),
                self.names.clone(),
                std::mem::take(&mut self.writer),
            );
            distlock_api::backend::spawn_cleanup(&runtime, async move {
                let _ = withdraw(&lock, &names, &writer).await;
            });
        }
    }
}

/// Removes `writer`'s intent, waking the readers it held back.
async fn withdraw(lock: &RedisLock, names: &KeyNames, writer: &str) -> Result<(), LockError> {
    let node = lock.primitive_node(OPERATION)?;
    let script = &*script::WITHDRAW;
    let mut cmd = evalsha(script, &[&names.lock]);
    cmd.arg(writer);
    let _: i64 = node.run(script, &cmd).await?;
    Ok(())
}
