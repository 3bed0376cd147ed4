//! [`PostgresRwLock`]: the [`DistributedRwLock`] over one advisory lock per key, taken
//! shared by readers and exclusive by writers.
//!
//! Writer preference comes from the server's lock manager: a lock request that
//! conflicts with a request already waiting in the lock's queue waits behind it (and a
//! try is refused), even when it is compatible with the current holders. So once a
//! writer waits in the queue (`pg_advisory_lock`), new readers' `pg_advisory_lock_shared`
//! queue behind it and their `pg_try_advisory_lock_shared` fail; the writer is granted
//! when the readers already inside leave, and the readers queued behind it are granted
//! together after it. A writer that gives up leaves the queue (its wait statement ends,
//! or its session is closed), which lets the readers behind it in at once.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::backend::prelude::*;
use distlock_api::{
    BackendInfo, DistributedLock, DistributedRwLock, ExtendOutcome, Lease, LockError, LockGuard,
    LockKey, LockOptions, ReleaseOutcome, RwMode,
};

use crate::keys::rw_advisory_key;
use crate::lock::{lease_of, Grant, Plan};
use crate::mailbox::Probe;
use crate::{PostgresLock, POSTGRES_BACKEND};

/// A read-write lock client of the Postgres backend, made by [`PostgresLock::rw_lock`],
/// with writer preference: sessions, leases and fencing as the mutex's (see the crate
/// docs).
///
/// A write is taken as the mutex's lock is (a try on a shared session, then a wait in
/// the server's queue on a dedicated one). A read is taken and held on a dedicated
/// session of the client (one of [`crate::PostgresConfig::wait_sessions`]), since
/// advisory locks are re-entrant per session and a session's own shared lock would not
/// exclude its own exclusive one. Every grant, read or write, carries a fencing token
/// from the backend's sequence, above every earlier grant's. Cloning gives another
/// handle on the same client.
#[derive(Debug, Clone)]
pub struct PostgresRwLock {
    locks: PostgresLock,
}

impl PostgresRwLock {
    pub(crate) fn new(locks: PostgresLock) -> Self {
        PostgresRwLock { locks }
    }

    /// The mutex client whose sessions this one shares.
    pub fn client(&self) -> &PostgresLock {
        &self.locks
    }

    fn plan(mode: RwMode) -> Plan {
        match mode {
            RwMode::Read => Plan::Shared,
            RwMode::Write => Plan::Exclusive,
        }
    }

    fn guard(&self, key: &LockKey, grant: Grant, options: &LockOptions) -> LockGuard {
        let (lease, monitor) = lease_of(key, grant, options);
        let backend: Arc<dyn DistributedRwLock> = Arc::new(self.clone());
        LockGuard::for_rw(lease, monitor, backend, options.auto_renew())
    }
}

#[async_trait]
impl DistributedRwLock for PostgresRwLock {
    fn info(&self) -> BackendInfo {
        DistributedLock::info(&self.locks)
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        mode: RwMode,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        options.validate_for(POSTGRES_BACKEND)?;
        let hash = rw_advisory_key(key);
        let grant = self
            .locks
            .try_plan(key, hash, &Self::plan(mode), options)
            .await?;
        Ok(grant.map(|grant| self.guard(key, grant, options)))
    }

    async fn acquire(
        &self,
        key: &LockKey,
        mode: RwMode,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        options.validate_for(POSTGRES_BACKEND)?;
        let hash = rw_advisory_key(key);
        self.locks
            .acquire_plan(key, hash, &Self::plan(mode), options, |grant| {
                self.guard(key, grant, options)
            })
            .await
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        let probe = Probe::key(rw_advisory_key(lease.key()));
        self.locks.release_lease(lease, probe).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        let probe = Probe::key(rw_advisory_key(lease.key()));
        self.locks.extend_lease(lease, ttl, probe).await
    }
}
