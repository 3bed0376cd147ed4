//! [`RedisSemaphore`]: the [`DistributedSemaphore`] on one Redis node (direct,
//! Sentinel or Cluster).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::backend::prelude::*;
use distlock_api::{
    check_permits, BackendInfo, DistributedSemaphore, ExtendOutcome, Lease, LockError, LockGuard,
    LockKey, LockOptions, PermitMismatch, ReleaseOutcome,
};

use super::primitive::{self, Scripts};
use super::{Attempt, RedisLock};
use crate::keys::{KeyNames, Primitive};
use crate::scripts::semaphore as script;

const OPERATION: &str = "semaphores";

/// A semaphore client of a Redis node, made by [`RedisLock::semaphore`], sharing the
/// mutex client's connection, wake-ups and waiter lines.
///
/// Layout, for a key `K` (every name under the mutex's hash tag `{K}`, see
/// [`crate::KeyNames`]): `{K}:semaphore` is a sorted set of the permit holders' owner
/// tokens scored by the server time (ms) at which each expires; `{K}:semaphore:permits`
/// holds the permit count the holders use. One Lua script drops expired holders and
/// grants a permit when fewer than the count hold one, refusing another count with
/// [`LockError::PermitMismatch`]; both keys expire with the longest-lived holder, and
/// the count goes with the last holder, so the next caller's count becomes the key's.
/// Waiting is the mutex's: `{K}:semaphore:waiting` marks a waited-on key, so a release
/// publishes on `{K}:semaphore:released` only then.
///
/// Each permit carries a fencing token from `{K}:semaphore:fence`, a counter seeded
/// from the server's clock like the mutex's `{K}:fence` (see the crate docs): a permit's
/// token is above every earlier permit grant's of the key, so it orders and identifies
/// grants; several permits are valid at once, so it cannot fence off an older holder.
/// Cloning gives another handle on the same client.
#[derive(Debug, Clone)]
pub struct RedisSemaphore {
    lock: RedisLock,
}

static SCRIPTS: Scripts = Scripts {
    acquire: &script::ACQUIRE,
    release: &script::RELEASE,
    extend: &script::EXTEND,
};

impl RedisLock {
    /// A semaphore client sharing this client's connection; see [`RedisSemaphore`].
    ///
    /// # Errors
    /// [`LockError::Unsupported`] on a Redlock client, saying why.
    pub fn semaphore(&self) -> Result<RedisSemaphore, LockError> {
        self.primitive_node(OPERATION)?;
        Ok(RedisSemaphore { lock: self.clone() })
    }
}

impl RedisSemaphore {
    /// The mutex client sharing this one's connection.
    pub fn client(&self) -> &RedisLock {
        &self.lock
    }

    fn checked(&self, max_permits: u32, options: &LockOptions) -> Result<(), LockError> {
        self.lock.check_primitive(options, OPERATION)?;
        check_permits(max_permits).map_err(|e| LockError::invalid_options(self.lock.name(), e))?;
        Ok(())
    }

    async fn attempt(
        &self,
        key: &LockKey,
        names: &KeyNames,
        max_permits: u32,
        options: &LockOptions,
        waiting: Option<Duration>,
    ) -> Result<Attempt, LockError> {
        let answer =
            primitive::attempt(&self.lock, key, names, options, &SCRIPTS, waiting, |cmd| {
                cmd.arg(max_permits);
            })
            .await?;
        answer.into_attempt(
            |lease, monitor| {
                let backend: Arc<dyn DistributedSemaphore> = Arc::new(self.clone());
                LockGuard::for_permit(lease, monitor, backend, options.auto_renew())
            },
            |in_use| LockError::PermitMismatch {
                backend: self.lock.name(),
                source: PermitMismatch::new(
                    key.clone(),
                    max_permits,
                    u32::try_from(in_use).unwrap_or(u32::MAX),
                ),
            },
        )
    }
}

#[async_trait]
impl DistributedSemaphore for RedisSemaphore {
    fn info(&self) -> BackendInfo {
        self.lock.primitive_info()
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        max_permits: u32,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        self.checked(max_permits, options)?;
        let names = KeyNames::for_primitive(key, Primitive::Semaphore);
        match self
            .attempt(key, &names, max_permits, options, None)
            .await?
        {
            Attempt::Granted(guard) => Ok(Some(guard)),
            Attempt::Held(_) => Ok(None),
        }
    }

    async fn acquire(
        &self,
        key: &LockKey,
        max_permits: u32,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        self.checked(max_permits, options)?;
        let names = KeyNames::for_primitive(key, Primitive::Semaphore);
        self.lock
            .acquire_waiting(key, &names, options, |waiting| {
                self.attempt(key, &names, max_permits, options, waiting)
            })
            .await
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        let names = KeyNames::for_primitive(lease.key(), Primitive::Semaphore);
        primitive::release(&self.lock, &names, &SCRIPTS, lease, OPERATION).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        let names = KeyNames::for_primitive(lease.key(), Primitive::Semaphore);
        primitive::extend(&self.lock, &names, &SCRIPTS, lease, ttl, OPERATION).await
    }
}
