//! The [`DistributedLock`] trait.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::lease_backend::{inspect_unsupported, lease_backend_for};
use crate::{
    BackendInfo, ExtendOutcome, KeyStatus, Lease, LockError, LockGuard, LockKey, LockOptions,
    ReleaseOutcome,
};

/// A distributed lock service: one backend, one connection pool or session, any keys.
///
/// Object-safe; share it as `Arc<dyn DistributedLock>`.
///
/// Contract for implementors (checked by `distlock-conformance`):
/// - at most one unexpired lease per key; each grant carries a fresh random
///   [`crate::OwnerToken`] and a [`crate::FencingToken`] above every earlier grant's for
///   that key;
/// - `release` and `extend` act only if the backend still stores the lease's owner
///   token, atomically with the check;
/// - dropping an `acquire` or `try_acquire` future at any await point leaves no lock
///   held (a grant that arrives late is released);
/// - options are checked with [`LockOptions::validate`] before touching the server.
#[async_trait]
pub trait DistributedLock: Send + Sync + fmt::Debug {
    /// The backend's name and guarantees.
    fn info(&self) -> BackendInfo;

    /// Tries once to take `key`, without waiting.
    ///
    /// Returns `Ok(None)` when another owner holds it.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`], or connection and backend errors.
    async fn try_acquire(
        &self,
        key: &LockKey,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError>;

    /// Takes `key`, waiting as the options' [`crate::WaitPolicy`] allows.
    ///
    /// # Errors
    /// [`LockError::Timeout`] when the wait runs out (at once for `NoWait`),
    /// [`LockError::InvalidOptions`], or connection and backend errors.
    async fn acquire(&self, key: &LockKey, options: &LockOptions) -> Result<LockGuard, LockError>;

    /// Owner-checked release of `lease`. Prefer [`LockGuard::release`].
    ///
    /// # Errors
    /// Connection and backend errors only; "not ours" is an [`ReleaseOutcome`].
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError>;

    /// Owner-checked extension of `lease` to expire `ttl` from now. Prefer
    /// [`LockGuard::extend`].
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] for a TTL out of bounds,
    /// [`LockError::Unsupported`] on backends without extend, and connection and
    /// backend errors; "not ours" is an [`ExtendOutcome`].
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError>;

    /// Looks at `key` without taking or changing it: whether it is held, and whatever
    /// else the backend can tell (see [`KeyStatus`]). A snapshot: it may be stale by
    /// the time it returns, so never use it to decide whether to write.
    ///
    /// # Errors
    /// [`LockError::Unsupported`] from backends that cannot look (the default), and
    /// connection and backend errors.
    async fn inspect(&self, key: &LockKey) -> Result<KeyStatus, LockError> {
        let _ = key;
        Err(inspect_unsupported(self.info().name))
    }
}

lease_backend_for!(DistributedLock);
