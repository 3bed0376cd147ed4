//! [`Client`]: one connection to a lock service, for every primitive.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::engine::{Engine, Grant, Request};
use crate::primitives::{ElectionHandle, MutexHandle, Route, RwHandle, SemaphoreHandle};
use crate::{
    BackendInfo, Capability, DistributedLock, DistributedRwLock, DistributedSemaphore,
    ExtendOutcome, LeaderElection, Lease, LockError, Primitive, ReleaseOutcome,
};

/// A client of one lock service: one connection, pool or session, shared by every
/// primitive it hands out. `distlock::connect(url)` returns one.
///
/// Each primitive is a trait object over the same backend connection:
/// [`Client::lock`], [`Client::semaphore`], [`Client::rw_lock`] and
/// [`Client::election`]. Their acquires are checked, bounded, retried and measured in
/// one place, the same on every backend (see [`crate::observe`] for the metrics), and
/// a primitive the backend does not offer (see [`Client::info`]) refuses every acquire
/// with [`crate::LockError::Unsupported`].
///
/// Cheap to clone: clones share the connection.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock_api::LockError> {
/// use std::time::Duration;
/// use distlock_api::{Client, LockKey, LockOptions, MemoryLock};
///
/// let client = Client::new(MemoryLock::new());
/// let options = LockOptions::new(Duration::from_secs(10));
/// let guard = client.lock().acquire(&LockKey::new("report")?, &options).await?;
/// let permit = client.semaphore().acquire(&LockKey::new("jobs")?, 4, &options).await?;
/// permit.release().await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Client {
    lock: Arc<dyn DistributedLock>,
    semaphore: Arc<dyn DistributedSemaphore>,
    rw_lock: Arc<dyn DistributedRwLock>,
    election: Arc<dyn LeaderElection>,
}

impl Client {
    /// A client over `engine`, a backend's connection.
    pub fn new(engine: impl Engine + 'static) -> Self {
        Client::from_engine(Arc::new(engine))
    }

    /// A client over a shared `engine`.
    pub fn from_engine(engine: Arc<dyn Engine>) -> Self {
        let route = |primitive| Route::new(engine.clone(), primitive);
        Client {
            lock: Arc::new(MutexHandle(route(Primitive::Mutex))),
            semaphore: Arc::new(SemaphoreHandle(route(Primitive::Semaphore))),
            rw_lock: Arc::new(RwHandle(route(Primitive::RwLock))),
            election: Arc::new(ElectionHandle(route(Primitive::Election))),
        }
    }

    /// A client of a backend that still implements the public traits itself, from its
    /// handles on one connection; a primitive it lacks (`None`) refuses every acquire
    /// with [`crate::LockError::Unsupported`], per the mutex's [`BackendInfo`].
    ///
    /// Transitional: it goes once every backend implements [`Engine`].
    #[doc(hidden)]
    pub fn from_parts(
        lock: Arc<dyn DistributedLock>,
        semaphore: Option<Arc<dyn DistributedSemaphore>>,
        rw_lock: Option<Arc<dyn DistributedRwLock>>,
        election: Option<Arc<dyn LeaderElection>>,
    ) -> Self {
        let refusing = Client::from_engine(Arc::new(NotOffered(lock.info())));
        Client {
            semaphore: semaphore.unwrap_or(refusing.semaphore),
            rw_lock: rw_lock.unwrap_or(refusing.rw_lock),
            election: election.unwrap_or(refusing.election),
            lock,
        }
    }

    /// The backend's name and guarantees, per primitive.
    pub fn info(&self) -> BackendInfo {
        self.lock.info()
    }

    /// The mutex.
    pub fn lock(&self) -> Arc<dyn DistributedLock> {
        self.lock.clone()
    }

    /// The counting semaphore.
    pub fn semaphore(&self) -> Arc<dyn DistributedSemaphore> {
        self.semaphore.clone()
    }

    /// The read-write lock.
    pub fn rw_lock(&self) -> Arc<dyn DistributedRwLock> {
        self.rw_lock.clone()
    }

    /// Leader election.
    pub fn election(&self) -> Arc<dyn LeaderElection> {
        self.election.clone()
    }
}

/// The engine behind [`Client::from_parts`]'s missing primitives: its info is the
/// backend's, whose capabilities mark them not offered, so the generic checks refuse
/// every acquire before reaching it.
#[derive(Debug)]
struct NotOffered(BackendInfo);

#[async_trait]
impl Engine for NotOffered {
    fn info(&self) -> BackendInfo {
        self.0.clone()
    }

    async fn acquire(&self, request: &Request<'_>) -> Result<Option<Grant>, LockError> {
        Err(self.refused(request.claim.primitive()))
    }

    async fn release(&self, primitive: Primitive, _: &Lease) -> Result<ReleaseOutcome, LockError> {
        Err(self.refused(primitive))
    }

    async fn extend(
        &self,
        primitive: Primitive,
        _: &Lease,
        _: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        Err(self.refused(primitive))
    }
}

impl NotOffered {
    fn refused(&self, primitive: Primitive) -> LockError {
        let reason = match self.0.capabilities.of(primitive).offered {
            Capability::Unsupported(reason) => reason,
            Capability::Supported => "the backend gave no handle for it",
        };
        LockError::Unsupported {
            backend: self.0.name,
            operation: primitive.as_str(),
            reason,
        }
    }
}
