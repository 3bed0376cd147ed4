//! The [`DistributedLock`] trait.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::lease_backend::{inspect_unsupported, lease_backend_for};
use crate::multi::{MultiGuard, Taking};
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

    /// Takes every key of `keys`, all or nothing: in one canonical order (the
    /// keys sorted, duplicates once), so that callers whose sets overlap never deadlock,
    /// waiting as the options' wait allows for the whole set (one deadline). On a
    /// failure or timeout part way, every part taken is released before this returns;
    /// dropping the future releases them in the background. See [`MultiGuard`].
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] for an empty set or bad options (before any key is
    /// taken), [`LockError::Timeout`] when the wait runs out, and the errors of one
    /// part's acquire.
    async fn acquire_all(
        &self,
        keys: &[LockKey],
        options: &LockOptions,
    ) -> Result<MultiGuard, LockError> {
        crate::multi::acquire_all(self, keys, options).await
    }

    /// Tries once to take every key of `keys`, all or nothing, in the canonical
    /// order of [`Self::acquire_all`]: `Ok(None)`, with every part taken released, when
    /// one is held.
    ///
    /// # Errors
    /// Those of [`Self::acquire_all`] but the timeout.
    async fn try_acquire_all(
        &self,
        keys: &[LockKey],
        options: &LockOptions,
    ) -> Result<Option<MultiGuard>, LockError> {
        let mut taking = Taking::new(self.info().name, keys, options, false)?;
        for key in taking.keys() {
            match self.try_acquire(&key, &taking.next_options()).await {
                Ok(Some(part)) => taking.took(part),
                Ok(None) => {
                    taking.refused().await;
                    return Ok(None);
                }
                Err(error) => return Err(taking.abandon(error).await),
            }
        }
        Ok(Some(taking.done()))
    }

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
