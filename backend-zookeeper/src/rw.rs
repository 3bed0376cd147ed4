//! [`ZooKeeperRwLock`]: the [`DistributedRwLock`] over ZooKeeper, in the node layout of
//! Curator's `InterProcessReadWriteLock`.
//!
//! Readers and writers of a key are ephemeral-sequential nodes of one directory (see
//! [`ZooKeeperLock::rw_path`]): `_c_<guid>-__READ__<seq>` and `_c_<guid>-__WRIT__<seq>`,
//! ranked together by sequence. A writer holds when its node is the lowest of all and
//! watches the next lower node; a reader holds when no writer node is ranked before it
//! and watches the first such writer. It is the mutex's recipe with Curator's
//! `ReadLock` predicate, and the same creation, clean-up, lease and release.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::backend::prelude::*;
use distlock_api::{
    BackendInfo, DistributedLock, DistributedRwLock, ExtendOutcome, Lease, LockError, LockGuard,
    LockKey, LockOptions, ReleaseOutcome, RwMode,
};

use crate::keys::NodeKind;
use crate::lock::{Recipe, Won};
use crate::ZooKeeperLock;

/// A read-write lock client of the ZooKeeper backend, made by
/// [`ZooKeeperLock::rw_lock`]: Curator `InterProcessReadWriteLock`-compatible, sharing
/// the lock client's session.
///
/// **Fairness.** A reader is held back by every writer whose node is older than its
/// own, waiting or holding; so once a writer waits, readers that come after it queue
/// behind it (a read `try_acquire` reports the key held), and writers are granted in
/// arrival order. A writer that gives up deletes its node, which lets the readers
/// behind it in at once.
///
/// **Fencing tokens**: the grant's node's `czxid`. A writer is granted only when every
/// older node is gone and a reader only when every older writer is, so a writer's
/// token is above that of every grant before it and below that of every grant after
/// it; readers granted together do not fence each other.
///
/// Like the mutex, a grant is held until it is released or its session ends (no TTL
/// expiry). Cloning is cheap and shares the session.
#[derive(Debug, Clone)]
pub struct ZooKeeperRwLock {
    lock: ZooKeeperLock,
}

impl ZooKeeperLock {
    /// A read-write lock client on this client's session.
    pub fn rw_lock(&self) -> ZooKeeperRwLock {
        ZooKeeperRwLock { lock: self.clone() }
    }

    /// The directory of `key`'s read-write lock:
    /// `[chroot]{base_path}/.rw/{encode_key(key)}` (never a mutex's directory: no key
    /// encodes to a name starting with `.`). A Curator
    /// `new InterProcessReadWriteLock(client, path)` on this path shares it with ours.
    pub fn rw_path(&self, key: &LockKey) -> String {
        self.namespaced_dir(".rw", key)
    }
}

impl ZooKeeperRwLock {
    fn grant(&self, key: &LockKey, options: &LockOptions, won: Won) -> LockGuard {
        let (lease, monitor) = self.lock.register(key, options, won);
        let backend: Arc<dyn DistributedRwLock> = Arc::new(self.clone());
        LockGuard::for_rw(lease, monitor, backend, options.auto_renew())
    }
}

fn recipe(mode: RwMode) -> Recipe<'static> {
    match mode {
        RwMode::Read => Recipe::Read,
        RwMode::Write => Recipe::Write,
    }
}

#[async_trait]
impl DistributedRwLock for ZooKeeperRwLock {
    fn info(&self) -> BackendInfo {
        DistributedLock::info(&self.lock)
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        mode: RwMode,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        let dir = self.lock.rw_path(key);
        self.lock
            .try_within(&dir, recipe(mode), key, options, |won| {
                self.grant(key, options, won)
            })
            .await
    }

    async fn acquire(
        &self,
        key: &LockKey,
        mode: RwMode,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        let dir = self.lock.rw_path(key);
        self.lock
            .acquire_within_wait(&dir, recipe(mode), key, options, |won| {
                self.grant(key, options, won)
            })
            .await
    }

    /// Deletes our node, as the mutex's release deletes its contender.
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        let dir = self.lock.rw_path(lease.key());
        // Either kind ranks the directory's readers and writers alike.
        self.lock.release_node(&dir, NodeKind::Write, lease).await
    }

    /// Proves the session alive and our node present, as the mutex's extend.
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        let dir = self.lock.rw_path(lease.key());
        self.lock
            .extend_lease(&dir, NodeKind::Write, lease, ttl)
            .await
    }
}
