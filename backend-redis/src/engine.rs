//! [`RedisLock`] as a [`distlock_api::backend::Engine`]: each claim dispatched to its
//! protocol (the mutex, its FIFO queue, the semaphore, the read-write lock, election),
//! and the [`Client`] handles over it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::backend::{Claim, Engine, Grant, Request};
use distlock_api::{
    BackendInfo, Client, DistributedLock, DistributedRwLock, DistributedSemaphore, ExtendOutcome,
    FencingToken, KeyStatus, Leader, LeaderElection, Lease, LockError, LockKey, Primitive,
    ReleaseOutcome,
};

use crate::keys::KeyNames;
use crate::lock::{election, rw, semaphore};
use crate::RedisLock;

impl RedisLock {
    /// This client, for every primitive: its mutex, semaphore, read-write lock and
    /// election share its connections, wake-ups and waiter lines. On Redlock, the
    /// semaphore, the read-write lock and election refuse every acquire with
    /// [`LockError::Unsupported`], as [`Client::info`] says why.
    pub fn client(&self) -> Client {
        Client::new(self.clone())
    }

    /// The mutex of this client (`self.client().lock()`).
    pub fn lock(&self) -> Arc<dyn DistributedLock> {
        self.client().lock()
    }

    /// The semaphore of this client (`self.client().semaphore()`); refused on Redlock.
    pub fn semaphore(&self) -> Arc<dyn DistributedSemaphore> {
        self.client().semaphore()
    }

    /// The read-write lock of this client (`self.client().rw_lock()`); refused on
    /// Redlock.
    pub fn rw_lock(&self) -> Arc<dyn DistributedRwLock> {
        self.client().rw_lock()
    }

    /// Leader election on this client (`self.client().election()`); refused on Redlock.
    pub fn election(&self) -> Arc<dyn LeaderElection> {
        self.client().election()
    }

    /// One mutex acquire: in the FIFO queue when asked for, else contending.
    async fn acquire_mutex(&self, request: &Request<'_>) -> Result<Option<Grant>, LockError> {
        if self.queued(request.options) {
            return self.acquire_queued(request).await;
        }
        let (key, options) = (request.key, request.options);
        let names = &KeyNames::for_key(key);
        self.contend(request, names, |waiting| {
            self.attempt(key, names, options, waiting)
        })
        .await
    }
}

#[async_trait]
impl Engine for RedisLock {
    fn info(&self) -> BackendInfo {
        let info = BackendInfo::new(self.name(), self.capabilities());
        if self.is_redlock() {
            // Our value found on one node says nothing of the other nodes.
            info.with_unreleased_lock_ends(
                "it is freed when its lease (the TTL) runs out on each node",
            )
            .without_release_continuity()
        } else {
            info.with_unreleased_lock_ends(
                "it is freed when its lease (the TTL) runs out on the server",
            )
        }
    }

    async fn acquire(&self, request: &Request<'_>) -> Result<Option<Grant>, LockError> {
        match request.claim {
            Claim::Mutex => self.acquire_mutex(request).await,
            Claim::Permit { max } => semaphore::acquire(self, request, max).await,
            Claim::Rw(mode) => rw::acquire(self, request, mode).await,
            Claim::Lead(candidate) => election::campaign(self, request, candidate).await,
            other => Err(LockError::Unsupported {
                backend: self.name(),
                operation: other.primitive().as_str(),
                reason: distlock_api::NOT_YET,
            }),
        }
    }

    async fn release(
        &self,
        primitive: Primitive,
        lease: &Lease,
    ) -> Result<ReleaseOutcome, LockError> {
        match primitive {
            Primitive::Mutex => self.release_mutex(lease).await,
            Primitive::Semaphore => semaphore::release(self, lease).await,
            Primitive::RwLock => rw::release(self, lease).await,
            Primitive::Election => election::resign(self, lease).await,
        }
    }

    async fn extend(
        &self,
        primitive: Primitive,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        match primitive {
            Primitive::Mutex => self.extend_mutex(lease, ttl).await,
            Primitive::Semaphore => semaphore::extend(self, lease, ttl).await,
            Primitive::RwLock => rw::extend(self, lease, ttl).await,
            Primitive::Election => election::extend(self, lease, ttl).await,
        }
    }

    async fn inspect(&self, key: &LockKey) -> Result<KeyStatus, LockError> {
        self.inspect_mutex(key).await
    }

    async fn leader(&self, name: &LockKey) -> Result<Option<Leader>, LockError> {
        election::leader(self, name).await
    }

    async fn wait_change(
        &self,
        name: &LockKey,
        seen: Option<FencingToken>,
        patience: Duration,
    ) -> Result<Option<Leader>, LockError> {
        election::wait_change(self, name, seen, patience).await
    }

    fn unanswered(&self, wait: Duration) -> LockError {
        self.unanswered_error(wait)
    }
}
