//! The [`DistributedLock`] trait and the typed outcomes of release and extend.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::{BackendInfo, KeyStatus, Lease, LockError, LockGuard, LockKey, LockOptions};

/// What an owner-checked release found.
///
/// Exhaustive by choice (see the crate docs): these are the cases a caller handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// Our lease was removed; the key is free.
    Released,
    /// The key no longer carried our lease (it expired or was already released) and
    /// nobody else holds it. Nothing was changed.
    Expired,
    /// Another owner holds the key. Their lock was left untouched.
    HeldByOther,
}

/// What an owner-checked extend found.
///
/// Exhaustive by choice (see the crate docs): these are the cases a caller handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtendOutcome {
    /// Our lease now lasts until `valid_until` (client monotonic clock, conservative).
    Extended {
        /// The new validity deadline.
        valid_until: Instant,
    },
    /// The key no longer carries our lease and nobody else holds it.
    Expired,
    /// Another owner holds the key. Their lock was left untouched.
    HeldByOther,
    /// The guard's lease was already lost (reported lost, or its validity deadline
    /// passed, possibly while this extend was in flight), so it was not extended: lost
    /// is final. Only [`LockGuard::extend`] reports it; backends answer `Expired` or
    /// `HeldByOther` instead.
    Lost,
}

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
        Err(LockError::Unsupported {
            backend: self.info().name,
            operation: "inspect",
            reason: "this backend cannot look at a key without taking it",
        })
    }
}
