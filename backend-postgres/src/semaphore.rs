//! [`PostgresSemaphore`]: the [`DistributedSemaphore`] over advisory locks, one per
//! permit slot, beside a shared "count" lock that records the permit count in use.
//!
//! Protocol, per key `K` and count `M`: permit `i` is the `bigint` advisory lock
//! `permit_slot_key(K, i)` held exclusive, for `i` in `0..M`; beside it the holder
//! holds the two-`int4` advisory lock `(permit_count_key(K), M)` shared, the count id.
//! One statement takes the count id, reads `pg_locks` for a count id of `K` with
//! another count held by anyone, and only if there is none try-locks the slots in
//! order (see `Statements::permit_try`). Since every holder takes its count id before
//! it looks, of two callers with different counts the later to look sees the earlier:
//! never both granted ([`LockError::PermitMismatch`] instead; two that race may both be
//! refused). Once the last holder of `K` leaves, no count id is held and the next
//! caller's count becomes the key's.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::backend::check_permit_request;
use distlock_api::backend::prelude::*;
use distlock_api::{
    BackendInfo, Capability, DistributedLock, DistributedSemaphore, ExtendOutcome, Lease,
    LockError, LockGuard, LockKey, LockOptions, ReleaseOutcome,
};

use crate::keys::{permit_count_key, permit_slot_key};
use crate::lock::{lease_of, Grant, Plan};
use crate::mailbox::{Grab, Probe};
use crate::{PostgresLock, POSTGRES_BACKEND};

/// Why a semaphore acquire does not wait in FIFO order.
pub(crate) const POLLED: &str =
    "a permit waiter polls the slots at the options' backoff; it does not queue";

/// A semaphore client of the Postgres backend, made by [`PostgresLock::semaphore`]:
/// sessions, leases and fencing as the mutex's (see the crate docs).
///
/// Each permit is held by a dedicated session of the client (one of
/// [`crate::PostgresConfig::wait_sessions`]) for as long as it is held, and released
/// with `pg_advisory_unlock_all` on it. A waiting `acquire` tries again at the options'
/// backoff; it does not queue in the server. Each permit carries a fencing token from
/// the backend's sequence, above every earlier grant's. Cloning gives another handle on
/// the same client.
#[derive(Debug, Clone)]
pub struct PostgresSemaphore {
    locks: PostgresLock,
}

impl PostgresSemaphore {
    pub(crate) fn new(locks: PostgresLock) -> Self {
        PostgresSemaphore { locks }
    }

    /// The mutex client whose sessions this one shares.
    pub fn client(&self) -> &PostgresLock {
        &self.locks
    }

    fn checked(max_permits: u32, options: &LockOptions) -> Result<(), LockError> {
        check_permit_request(
            POSTGRES_BACKEND,
            max_permits,
            options,
            Capability::Unsupported(POLLED),
        )
    }

    /// The permit try of `max` permits of `key`, and the hash it is filed under.
    fn plan(key: &LockKey, max: u32) -> (i64, Plan) {
        let slots: Vec<i64> = (0..max).map(|slot| permit_slot_key(key, slot)).collect();
        let first = permit_slot_key(key, 0);
        let grab = Grab::PermitTry {
            count_key: permit_count_key(key),
            max,
            slots,
        };
        (first, Plan::Permit(grab))
    }

    fn guard(&self, key: &LockKey, grant: Grant, options: &LockOptions) -> LockGuard {
        let (lease, monitor) = lease_of(key, grant, options);
        let backend: Arc<dyn DistributedSemaphore> = Arc::new(self.clone());
        LockGuard::for_permit(lease, monitor, backend, options.auto_renew())
    }

    fn probe(key: &LockKey) -> Probe {
        Probe::permit_counts(permit_count_key(key))
    }
}

#[async_trait]
impl DistributedSemaphore for PostgresSemaphore {
    fn info(&self) -> BackendInfo {
        DistributedLock::info(&self.locks)
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        max_permits: u32,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        Self::checked(max_permits, options)?;
        let (hash, plan) = Self::plan(key, max_permits);
        let grant = self.locks.try_plan(key, hash, &plan, options).await?;
        Ok(grant.map(|grant| self.guard(key, grant, options)))
    }

    async fn acquire(
        &self,
        key: &LockKey,
        max_permits: u32,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        Self::checked(max_permits, options)?;
        let (hash, plan) = Self::plan(key, max_permits);
        self.locks
            .acquire_plan(key, hash, &plan, options, |grant| {
                self.guard(key, grant, options)
            })
            .await
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.locks
            .release_lease(lease, Self::probe(lease.key()))
            .await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        self.locks
            .extend_lease(lease, ttl, Self::probe(lease.key()))
            .await
    }
}
