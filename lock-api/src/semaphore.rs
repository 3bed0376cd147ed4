//! The [`DistributedSemaphore`] trait: at most `max` holders of one key at once.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::lease_backend::{inspect_unsupported, lease_backend_for};
use crate::multi::{MultiGuard, Taking};
use crate::{
    BackendInfo, ExtendOutcome, Lease, LockError, LockGuard, LockKey, LockOptions, OptionsError,
    ReleaseOutcome, SemaphoreStatus,
};

/// The largest permit count a semaphore accepts. Bounded so that backends which keep
/// one record per permit (the file backend's slot files) stay small.
pub const MAX_PERMITS: u32 = 1024;

/// Checks a semaphore's permit count: at least 1 and at most [`MAX_PERMITS`].
///
/// # Errors
/// [`OptionsError::Permits`] naming the count and the bounds.
pub fn check_permits(max_permits: u32) -> Result<(), OptionsError> {
    if max_permits == 0 || max_permits > MAX_PERMITS {
        return Err(OptionsError::Permits {
            permits: max_permits,
            max: MAX_PERMITS,
        });
    }
    Ok(())
}

/// A distributed counting semaphore: a key with `max_permits` permits; each grant takes
/// one, so at most `max_permits` guards on one key are held at once, across clients.
///
/// Object-safe; share it as `Arc<dyn DistributedSemaphore>`. A grant is a
/// [`LockGuard`] with the mutex's semantics: owner-checked release and extend with typed
/// outcomes, a lease with [`LockGuard::lost`] and a validity deadline, auto-renew, and
/// a `Drop` that releases in the background and never blocks.
///
/// **The permit count is part of the key's identity.** Every holder and waiter of a key
/// must ask for the same `max_permits`; one that asks for another count while the key
/// is in use gets [`LockError::PermitMismatch`], never a grant that would over-admit.
/// Once nobody holds a permit of the key, the next caller's count becomes the key's
/// (waiters do not pin it: a waiter whose count no longer matches gets the error at its
/// next attempt).
///
/// **Fencing tokens.** Where the backend gives them (its docs say; the memory backend
/// does, the file backend does not, whatever
/// [`Guarantees::fencing`](crate::Guarantees::fencing) says of its mutex), a
/// permit's token is above every earlier permit grant's on the key.
/// Several permits are valid at once, so a resource cannot refuse "everything below the
/// highest token seen" as it does for a mutex: the token identifies and orders grants,
/// nothing more.
///
/// Semaphore keys are a namespace of their own: the mutex key `a` and the semaphore key
/// `a` are different locks.
///
/// Contract for implementors (checked by `distlock-conformance`): never more than
/// `max_permits` unexpired grants per key; `release` and `extend` act only on the
/// lease's own permit, atomically with the check; dropping an acquire future leaves no
/// permit held; options and the count are checked ([`LockOptions::validate`],
/// [`check_permits`]) before touching the server.
#[async_trait]
pub trait DistributedSemaphore: Send + Sync + fmt::Debug {
    /// The backend's name and guarantees ([`Capabilities::semaphore`](crate::Capabilities::semaphore)).
    fn info(&self) -> BackendInfo;

    /// Tries once to take a permit of `key`, without waiting. `Ok(None)` when all
    /// `max_permits` are held.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] for bad options or a count outside
    /// `1..=`[`MAX_PERMITS`], [`LockError::PermitMismatch`] when the key is in use with
    /// another count, [`LockError::Unsupported`], or connection and backend errors.
    async fn try_acquire(
        &self,
        key: &LockKey,
        max_permits: u32,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError>;

    /// Takes a permit of `key`, waiting as the options' [`crate::WaitPolicy`] allows.
    ///
    /// # Errors
    /// [`LockError::Timeout`] when the wait runs out, and the errors of
    /// [`DistributedSemaphore::try_acquire`].
    async fn acquire(
        &self,
        key: &LockKey,
        max_permits: u32,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError>;

    /// Owner-checked release of the permit `lease`. Prefer [`LockGuard::release`].
    /// [`ReleaseOutcome::HeldByOther`] means our permit was gone and others hold the key.
    ///
    /// # Errors
    /// Connection and backend errors only.
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError>;

    /// Owner-checked extension of the permit `lease` to expire `ttl` from now. Prefer
    /// [`LockGuard::extend`].
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] for a TTL out of bounds, and connection and
    /// backend errors.
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError>;

    /// Takes every key of `keys` (a permit of each), all or nothing: in one canonical order (the
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
        max_permits: u32,
        options: &LockOptions,
    ) -> Result<MultiGuard, LockError> {
        let mut taking = Taking::new(self.info().name, keys, options, true)?;
        for key in taking.keys() {
            match self
                .acquire(&key, max_permits, &taking.next_options())
                .await
            {
                Ok(part) => taking.took(part),
                Err(error) => return Err(taking.abandon(error).await),
            }
        }
        Ok(taking.done())
    }

    /// Tries once to take every key of `keys` (a permit of each), all or nothing, in the canonical
    /// order of [`Self::acquire_all`]: `Ok(None)`, with every part taken released, when
    /// one is held.
    ///
    /// # Errors
    /// Those of [`Self::acquire_all`] but the timeout.
    async fn try_acquire_all(
        &self,
        keys: &[LockKey],
        max_permits: u32,
        options: &LockOptions,
    ) -> Result<Option<MultiGuard>, LockError> {
        let mut taking = Taking::new(self.info().name, keys, options, false)?;
        for key in taking.keys() {
            match self
                .try_acquire(&key, max_permits, &taking.next_options())
                .await
            {
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

    /// Looks at `key` without taking a permit: who holds it, and whatever else the backend
    /// can tell (see [`SemaphoreStatus`]). A snapshot: it may be stale by the time it returns, so
    /// never use it to decide whether to act.
    ///
    /// # Errors
    /// [`LockError::Unsupported`] from backends that cannot look (the default), and
    /// connection and backend errors.
    async fn inspect(&self, key: &LockKey) -> Result<SemaphoreStatus, LockError> {
        let _ = key;
        Err(inspect_unsupported(self.info().name))
    }
}

lease_backend_for!(DistributedSemaphore);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permit_counts_are_bounded() {
        assert!(check_permits(0).is_err());
        assert!(check_permits(1).is_ok());
        assert!(check_permits(MAX_PERMITS).is_ok());
        let refused = check_permits(MAX_PERMITS + 1).expect_err("above the bound");
        assert!(refused.to_string().contains("1025"), "{refused}");
    }
}
