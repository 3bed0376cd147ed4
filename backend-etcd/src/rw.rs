//! [`EtcdRwLock`]: the [`DistributedRwLock`] in the key layout of etcd's
//! `recipes.RWMutex` (`client/v3/experimental/recipes/rwmutex.go`).
//!
//! Readers and writers of key `K` are keys of one range `P/+rw/<K>/` (see
//! [`EtcdLock::rw_prefix`]), each under its contender's lease: `P/+rw/<K>/read/<id>`
//! and `P/+rw/<K>/write/<id>`, ranked together by revision. A writer holds when no key
//! of the range is older than its own and watches the youngest older one; a reader
//! holds when no writer key is older than its own and watches the youngest older
//! writer. That is `recipes.RWMutex`'s `Lock` and `RLock`, so a Go
//! `recipe.NewRWMutex(session, "P/+rw/<K>")` and ours exclude each other. It is the
//! mutex's recipe with another rule of which older contenders block; leases,
//! keep-alives, the loss watch, release, extend and clean-up are the mutex's. (The Go
//! recipe's differences in ranking are on [`EtcdRwLock`].)

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::backend::prelude::*;
use distlock_api::backend::WaitReport;
use distlock_api::{
    BackendInfo, DistributedLock, DistributedRwLock, ExtendOutcome, Lease, LeaseMonitor, LockError,
    LockGuard, LockKey, LockOptions, ReleaseOutcome, RwMode,
};

use crate::keys::Kind;
use crate::lock::{reads, ETCD_CAPABILITIES};
use crate::{EtcdLock, ETCD_BACKEND};

/// A read-write lock client of the etcd backend, made by [`EtcdLock::rw_lock`],
/// sharing the lock client's connection, leases and loss watch.
///
/// **Fairness: writer preference, FIFO.** A reader is held back by every writer older
/// than itself, waiting or holding; so once a writer waits, readers that come after it
/// queue behind it (a read `try_acquire` reports the key held), and writers are
/// granted in arrival order. A writer that gives up deletes its key, which lets the
/// readers behind it in at once.
///
/// **Fencing tokens.** A grant at once carries its key's create revision (the put that
/// placed it was the grant). A grant after a wait carries its stamp's revision, as a
/// semaphore permit's (see [`crate::EtcdSemaphore`]): the waiter's pending marker is
/// `P/+rw-pending/<K>/<its key's create revision, 20 digits>`, under its lease,
/// outside every range a contender reads (Go's included), and its key is never
/// written again (Go's `RWMutex` ranks by mod revision). (The key's create revision
/// would not do: readers granted by one deletion each learn it on their own, so the
/// younger could return first with the lower token, and a writer queued before such
/// a reader's grant could follow it with a lower token.) A writer is granted only
/// when every older key is gone and a reader only when every older writer is, so
/// every grant's token is above that of every grant learned before it on the key,
/// and a writer's is below that of every grant after it; readers holding together do
/// not fence each other.
///
/// **Beside Go's `recipes.RWMutex`.** That recipe ranks contenders by *mod* revision,
/// ours by create revision: the same for a key never written again. Hence two
/// differences from the mutex:
/// - a waiter waits under its lock's own lease, kept alive, and not under the
///   mutex's short waiting lease: moving the key to another lease would write it
///   again. So a waiter whose process dies holds up the queue for the lock's TTL.
/// - an `extend` to a TTL longer than the lease's own moves the key to a new lease
///   (as the mutex's does), which writes it again: a Go `RWMutex` contender looking
///   after that may rank the key behind its own. Between distlock clients nothing
///   changes (they rank by create revision); beside Go contenders, extend only up to
///   the TTL the lock was taken with (auto-renew does).
///
/// Our keys are named by lease id, the Go recipe's by `time.Now().UnixNano()`; both
/// are unique within the range, and neither side ranks by name. Ours only checks the
/// shape of the keys ahead of its own: `read/` or `write/` and an id of hex digits
/// (decimal ones included), under a lease; anything else in the range is another
/// tool's data, which may never go, and the acquire fails with
/// [`LockError::Config`] naming it.
///
/// Cloning is cheap and shares the connection.
#[derive(Debug, Clone)]
pub struct EtcdRwLock {
    lock: EtcdLock,
}

impl EtcdLock {
    /// A read-write lock client on this client's connection.
    pub fn rw_lock(&self) -> EtcdRwLock {
        EtcdRwLock { lock: self.clone() }
    }

    /// The range of `key`'s read-write lock, `PREFIX/+rw/<encoded key>/` (never a
    /// mutex's range: no key encodes to a name with `+`). A Go
    /// `recipe.NewRWMutex(session, prefix)` with this range less its trailing `/`
    /// shares the lock with ours.
    pub fn rw_prefix(&self, key: &LockKey) -> String {
        Kind::Write.range(self.prefix(), key)
    }
}

fn kind(mode: RwMode) -> Kind {
    match mode {
        RwMode::Read => Kind::Read,
        RwMode::Write => Kind::Write,
    }
}

/// A reader's or a writer's lease: its owner token tells.
fn kind_of(lease: &Lease) -> Kind {
    if reads(lease) {
        Kind::Read
    } else {
        Kind::Write
    }
}

impl EtcdRwLock {
    fn checked(options: &LockOptions) -> Result<(), LockError> {
        options.validate_for(ETCD_BACKEND)?;
        options.check_order(ETCD_BACKEND, ETCD_CAPABILITIES.rw_lock.fifo)
    }

    fn guard(&self, lease: Lease, monitor: LeaseMonitor, options: &LockOptions) -> LockGuard {
        let backend: Arc<dyn DistributedRwLock> = Arc::new(self.clone());
        LockGuard::for_rw(lease, monitor, backend, options.auto_renew())
    }
}

#[async_trait]
impl DistributedRwLock for EtcdRwLock {
    fn info(&self) -> BackendInfo {
        DistributedLock::info(&self.lock)
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        mode: RwMode,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        Self::checked(options)?;
        let won = self
            .lock
            .contend(kind(mode), key, b"", options, &WaitReport::new(), false)
            .await?;
        Ok(won.map(|(lease, monitor)| self.guard(lease, monitor, options)))
    }

    async fn acquire(
        &self,
        key: &LockKey,
        mode: RwMode,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        Self::checked(options)?;
        self.lock
            .wait_for(kind(mode), key, b"", options, |lease, monitor| {
                Ok(self.guard(lease, monitor, options))
            })
            .await
    }

    /// Revokes our key's lease (deleting the key), as the mutex's release.
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.lock.release_in(kind_of(lease), lease).await
    }

    /// Keeps our lease alive (or moves the key to a longer one: see the module docs),
    /// as the mutex's extend.
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        self.lock.extend_in(kind_of(lease), lease, ttl).await
    }
}
