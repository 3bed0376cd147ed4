//! The [`DistributedRwLock`] trait: shared (read) and exclusive (write) guards on one key.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::lease_backend::{inspect_unsupported, lease_backend_for};
use crate::multi::{MultiGuard, Taking};
use crate::{
    BackendInfo, ExtendOutcome, Lease, LockError, LockGuard, LockKey, LockOptions, ReleaseOutcome,
    RwStatus,
};

/// Which side of a read-write lock to take.
///
/// Exhaustive by choice: a read-write lock has exactly these two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RwMode {
    /// Shared: any number of readers at once, never beside a writer.
    Read,
    /// Exclusive: one writer, beside no reader and no other writer.
    Write,
}

impl RwMode {
    /// `"read"` or `"write"`, for errors and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            RwMode::Read => "read",
            RwMode::Write => "write",
        }
    }
}

/// A distributed read-write lock: many readers or one writer per key, across clients.
///
/// Object-safe; share it as `Arc<dyn DistributedRwLock>`. A grant of either mode is a
/// [`LockGuard`] with the mutex's semantics: owner-checked release and extend with typed
/// outcomes, a lease with [`LockGuard::lost`] and a validity deadline, auto-renew, and
/// a `Drop` that releases in the background and never blocks.
///
/// **Fairness: writer preference.** Once a writer waits on a key, new readers wait
/// behind it (a `try_acquire` of a read reports the key held), so a steady stream of
/// readers cannot starve a writer: it is granted as soon as the readers already holding
/// leave. Readers waiting behind a writer are granted together after it. A writer that
/// gives up (timeout, dropped future) stops holding readers back at once.
///
/// **Fencing tokens.** Where the backend gives them (its docs say; the memory backend
/// does, the file backend does not), every grant's token, read or
/// write, is above every earlier grant's on the key. A resource that records the highest
/// token it has seen can so refuse a writer whose lease ran out before a later reader or
/// writer was granted. Readers' tokens do not fence each other (readers do not write).
///
/// Read-write keys are a namespace of their own: the mutex key `a` and the read-write
/// key `a` are different locks.
///
/// Contract for implementors (checked by `distlock-conformance`): never a reader beside
/// a writer, never two writers; writer preference as above; `release` and `extend` act
/// only on the lease's own grant, atomically with the check; dropping an acquire future
/// leaves nothing held and no writer intent behind; options are checked with
/// [`LockOptions::validate`] before touching the server.
#[async_trait]
pub trait DistributedRwLock: Send + Sync + fmt::Debug {
    /// The backend's name and guarantees ([`Capabilities::rw_lock`](crate::Capabilities::rw_lock)).
    fn info(&self) -> BackendInfo;

    /// Tries once to take `key` in `mode`, without waiting. `Ok(None)` when the key is
    /// held in a conflicting mode (or, for a read, a writer waits).
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`], [`LockError::Unsupported`], or connection and
    /// backend errors.
    async fn try_acquire(
        &self,
        key: &LockKey,
        mode: RwMode,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError>;

    /// Takes `key` in `mode`, waiting as the options' [`crate::WaitPolicy`] allows. A
    /// waiting write holds new readers back (see the fairness note above).
    ///
    /// # Errors
    /// [`LockError::Timeout`] when the wait runs out, and the errors of
    /// [`DistributedRwLock::try_acquire`].
    async fn acquire(
        &self,
        key: &LockKey,
        mode: RwMode,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError>;

    /// Owner-checked release of `lease`, of either mode. Prefer [`LockGuard::release`].
    ///
    /// # Errors
    /// Connection and backend errors only.
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError>;

    /// Owner-checked extension of `lease` to expire `ttl` from now. Prefer
    /// [`LockGuard::extend`].
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] for a TTL out of bounds, and connection and
    /// backend errors.
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError>;

    /// Takes every key of `keys` in `mode`, all or nothing: in one canonical order (the
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
        mode: RwMode,
        options: &LockOptions,
    ) -> Result<MultiGuard, LockError> {
        let mut taking = Taking::new(self.info().name, keys, options, true)?;
        for key in taking.keys() {
            match self.acquire(&key, mode, &taking.next_options()).await {
                Ok(part) => taking.took(part),
                Err(error) => return Err(taking.abandon(error).await),
            }
        }
        Ok(taking.done())
    }

    /// Tries once to take every key of `keys` in `mode`, all or nothing, in the canonical
    /// order of [`Self::acquire_all`]: `Ok(None)`, with every part taken released, when
    /// one is held.
    ///
    /// # Errors
    /// Those of [`Self::acquire_all`] but the timeout.
    async fn try_acquire_all(
        &self,
        keys: &[LockKey],
        mode: RwMode,
        options: &LockOptions,
    ) -> Result<Option<MultiGuard>, LockError> {
        let mut taking = Taking::new(self.info().name, keys, options, false)?;
        for key in taking.keys() {
            match self.try_acquire(&key, mode, &taking.next_options()).await {
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

    /// Looks at `key` without taking it: who holds it, and whatever else the backend
    /// can tell (see [`RwStatus`]). A snapshot: it may be stale by the time it returns, so
    /// never use it to decide whether to act.
    ///
    /// # Errors
    /// [`LockError::Unsupported`] from backends that cannot look (the default), and
    /// connection and backend errors.
    async fn inspect(&self, key: &LockKey) -> Result<RwStatus, LockError> {
        let _ = key;
        Err(inspect_unsupported(self.info().name))
    }
}

lease_backend_for!(DistributedRwLock);
