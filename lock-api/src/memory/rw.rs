//! [`MemoryRwLock`]: the in-memory [`DistributedRwLock`], with writer preference.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::shared::{self, Kind, Want};
use super::{MemoryLock, MEMORY_BACKEND, NOT_FIFO};
use crate::backend::NewGuard;
use crate::{
    check_ttl, BackendInfo, Capability, DistributedLock, DistributedRwLock, ExtendOutcome,
    HolderStatus, Lease, LockError, LockGuard, LockKey, LockOptions, ReleaseOutcome, RwMode,
    RwStatus,
};

/// A read-write lock client of a [`super::MemoryStore`], made by [`MemoryLock::rw_lock`].
///
/// A waiting writer is counted in the store while its acquire runs, and readers are
/// refused meanwhile (writer preference). Waiting is woken by releases and by writers
/// giving up, or at the earliest holder's expiry; no polling. Every grant carries a
/// fencing token from the store's counter. Cloning gives another handle on the same
/// client.
#[derive(Debug, Clone)]
pub struct MemoryRwLock {
    client: MemoryLock,
}

impl MemoryRwLock {
    /// A read-write lock client of a fresh, private store.
    pub fn new() -> Self {
        MemoryLock::new().rw_lock()
    }

    pub(super) fn from_client(client: MemoryLock) -> Self {
        MemoryRwLock { client }
    }

    /// The mutex client sharing this one's store and crash state.
    pub fn client(&self) -> &MemoryLock {
        &self.client
    }

    fn checked(options: &LockOptions) -> Result<(), LockError> {
        options.validate_for(MEMORY_BACKEND)?;
        options.check_order(MEMORY_BACKEND, Capability::Unsupported(NOT_FIFO))
    }

    fn attempt(
        &self,
        key: &LockKey,
        mode: RwMode,
        options: &LockOptions,
    ) -> Result<Result<LockGuard, Option<Instant>>, LockError> {
        let want = match mode {
            RwMode::Read => Want::Read,
            RwMode::Write => Want::Write,
        };
        let granted = shared::attempt(&self.client, Kind::Rw, key, want, options)?;
        Ok(granted.map(|lease| {
            let monitor = shared::monitor(&lease);
            let backend: Arc<dyn DistributedRwLock> = Arc::new(self.clone());
            LockGuard::for_rw(lease, monitor, backend, options.auto_renew())
        }))
    }
}

impl Default for MemoryRwLock {
    fn default() -> Self {
        MemoryRwLock::new()
    }
}

#[async_trait]
impl DistributedRwLock for MemoryRwLock {
    fn info(&self) -> BackendInfo {
        self.client.info()
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        mode: RwMode,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        Self::checked(options)?;
        Ok(self.attempt(key, mode, options)?.ok())
    }

    async fn acquire(
        &self,
        key: &LockKey,
        mode: RwMode,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        Self::checked(options)?;
        let table = &self.client.store.shared;
        // A writer that finds the key free needs no intent; one that waits holds new
        // readers back until it is granted or this future is dropped.
        if mode == RwMode::Write {
            if let Ok(guard) = self.attempt(key, mode, options)? {
                return Ok(guard);
            }
        }
        let _intent = (mode == RwMode::Write).then(|| table.writer_waits(key));
        let wake = table.wake_handle(Kind::Rw, key);
        let (guard, met_held) = super::wait_woken(wake, key, options, MEMORY_BACKEND, || {
            self.attempt(key, mode, options)
        })
        .await?;
        Ok(crate::backend::mark_contended(guard, met_held))
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.client.check_alive()?;
        let table = &self.client.store.shared;
        Ok(table.release(Kind::Rw, lease.key(), lease.owner()))
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        check_ttl(ttl).map_err(|e| LockError::invalid_options(MEMORY_BACKEND, e))?;
        self.client.check_alive()?;
        let table = &self.client.store.shared;
        Ok(table.extend(Kind::Rw, lease.key(), lease.owner(), ttl, Instant::now()))
    }

    async fn inspect(&self, key: &LockKey) -> Result<RwStatus, LockError> {
        self.client.check_alive()?;
        let seen = self.client.store.shared.snapshot(Kind::Rw, key);
        let mode = match seen.holders.first() {
            None => None,
            Some(&(true, _)) => Some(RwMode::Write),
            Some(&(false, _)) => Some(RwMode::Read),
        };
        let holders = seen
            .holders
            .iter()
            .map(|&(_, left)| HolderStatus::new().with_remaining(Some(left)))
            .collect();
        Ok(RwStatus::new(mode, Some(holders)).with_writer_waiting(Some(seen.writer_waiting)))
    }
}
