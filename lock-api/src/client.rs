//! [`Client`]: one connection to a lock service, for every primitive.

use std::sync::Arc;

use crate::engine::Engine;
use crate::primitives::{ElectionHandle, MutexHandle, Route, RwHandle, SemaphoreHandle};
use crate::{
    BackendInfo, DistributedLock, DistributedRwLock, DistributedSemaphore, LeaderElection,
    Primitive,
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
        let route = |primitive| Arc::new(Route::new(engine.clone(), primitive));
        Client {
            lock: Arc::new(MutexHandle(route(Primitive::Mutex))),
            semaphore: Arc::new(SemaphoreHandle(route(Primitive::Semaphore))),
            rw_lock: Arc::new(RwHandle(route(Primitive::RwLock))),
            election: Arc::new(ElectionHandle(route(Primitive::Election))),
        }
    }

    /// A client over four given handles instead of one engine: for wrappers that add
    /// behaviour to each primitive, and for test doubles. The handles should share one
    /// connection, as an engine's do; [`Client::info`] is the mutex's. Unlike
    /// [`Client::new`], nothing here checks, bounds or measures the acquires: the
    /// handles answer as they are.
    pub fn from_handles(
        lock: Arc<dyn DistributedLock>,
        semaphore: Arc<dyn DistributedSemaphore>,
        rw_lock: Arc<dyn DistributedRwLock>,
        election: Arc<dyn LeaderElection>,
    ) -> Self {
        Client {
            lock,
            semaphore,
            rw_lock,
            election,
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
