//! [`MemorySemaphore`]: the in-memory [`DistributedSemaphore`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::shared::{self, Kind, Want};
use super::{MemoryLock, MEMORY_BACKEND, NOT_FIFO};
use crate::backend::NewGuard;
use crate::{
    check_ttl, BackendInfo, Capability, DistributedLock, DistributedSemaphore, ExtendOutcome,
    HolderStatus, Lease, LockError, LockGuard, LockKey, LockOptions, ReleaseOutcome,
    SemaphoreStatus,
};

/// A semaphore client of a [`super::MemoryStore`], made by [`MemoryLock::semaphore`].
///
/// Waiting is woken by releases, or at the earliest holder's expiry; no polling. Each
/// permit carries a fencing token from the store's counter, above every earlier grant's.
/// Cloning gives another handle on the same client.
#[derive(Debug, Clone)]
pub struct MemorySemaphore {
    client: MemoryLock,
}

impl MemorySemaphore {
    /// A semaphore client of a fresh, private store.
    pub fn new() -> Self {
        MemoryLock::new().semaphore()
    }

    pub(super) fn from_client(client: MemoryLock) -> Self {
        MemorySemaphore { client }
    }

    /// The mutex client sharing this one's store and crash state.
    pub fn client(&self) -> &MemoryLock {
        &self.client
    }

    fn checked(&self, max_permits: u32, options: &LockOptions) -> Result<(), LockError> {
        crate::backend::check_permit_request(
            MEMORY_BACKEND,
            max_permits,
            options,
            Capability::Unsupported(NOT_FIFO),
        )
    }

    fn attempt(
        &self,
        key: &LockKey,
        max_permits: u32,
        options: &LockOptions,
    ) -> Result<Result<LockGuard, Option<Instant>>, LockError> {
        let granted = shared::attempt(
            &self.client,
            Kind::Semaphore,
            key,
            Want::Permit(max_permits),
            options,
        )?;
        Ok(granted.map(|lease| {
            let monitor = shared::monitor(&lease);
            let backend: Arc<dyn DistributedSemaphore> = Arc::new(self.clone());
            LockGuard::for_permit(lease, monitor, backend, options.auto_renew())
        }))
    }
}

impl Default for MemorySemaphore {
    fn default() -> Self {
        MemorySemaphore::new()
    }
}

#[async_trait]
impl DistributedSemaphore for MemorySemaphore {
    fn info(&self) -> BackendInfo {
        self.client.info()
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        max_permits: u32,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        self.checked(max_permits, options)?;
        Ok(self.attempt(key, max_permits, options)?.ok())
    }

    async fn acquire(
        &self,
        key: &LockKey,
        max_permits: u32,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        self.checked(max_permits, options)?;
        let wake = self.client.store.shared.wake_handle(Kind::Semaphore, key);
        let (guard, met_held) = super::wait_woken(wake, key, options, MEMORY_BACKEND, || {
            self.attempt(key, max_permits, options)
        })
        .await?;
        Ok(crate::backend::mark_contended(guard, met_held))
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.client.check_alive()?;
        let table = &self.client.store.shared;
        Ok(table.release(Kind::Semaphore, lease.key(), lease.owner()))
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        check_ttl(ttl).map_err(|e| LockError::invalid_options(MEMORY_BACKEND, e))?;
        self.client.check_alive()?;
        let table = &self.client.store.shared;
        Ok(table.extend(
            Kind::Semaphore,
            lease.key(),
            lease.owner(),
            ttl,
            Instant::now(),
        ))
    }

    async fn inspect(&self, key: &LockKey) -> Result<SemaphoreStatus, LockError> {
        self.client.check_alive()?;
        let seen = self.client.store.shared.snapshot(Kind::Semaphore, key);
        let holders = seen
            .holders
            .iter()
            .map(|&(_, left)| HolderStatus::new().with_remaining(Some(left)))
            .collect();
        Ok(SemaphoreStatus::new(seen.permits, holders))
    }
}
