//! [`Harness`]: how the kit gets independent clients of the backend under test.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{
    DistributedLock, DistributedRwLock, DistributedSemaphore, LeaderElection, LockError,
};

/// Fault hooks on one client. All optional: scenarios that need one skip without it.
#[async_trait]
pub trait ClientFaults: Send + Sync {
    /// Makes the client behave like a crashed process: its connection is cut without
    /// releasing anything, and later calls (background releases, renewals) do not
    /// reach the server.
    async fn crash(&self) -> Result<(), LockError>;
}

/// One client of the backend under test, as if in its own process.
#[derive(Clone)]
#[non_exhaustive]
pub struct Client {
    /// The client's lock handle.
    pub lock: Arc<dyn DistributedLock>,
    /// The client's fault hooks, if the harness offers them.
    pub faults: Option<Arc<dyn ClientFaults>>,
    /// The client's semaphore handle, where the backend offers one: the semaphore
    /// scenarios skip without it. Crashing the client crashes it too.
    pub semaphore: Option<Arc<dyn DistributedSemaphore>>,
    /// The client's read-write lock handle, where the backend offers one: the
    /// read-write scenarios skip without it. Crashing the client crashes it too.
    pub rw_lock: Option<Arc<dyn DistributedRwLock>>,
    /// The client's election handle, where the backend offers one: the election
    /// scenarios skip without it. Crashing the client crashes it too.
    pub election: Option<Arc<dyn LeaderElection>>,
}

impl Client {
    /// A client without fault hooks.
    pub fn new(lock: Arc<dyn DistributedLock>) -> Self {
        Client {
            lock,
            faults: None,
            semaphore: None,
            rw_lock: None,
            election: None,
        }
    }

    /// Adds the election handle of the same client.
    pub fn with_election(mut self, election: Arc<dyn LeaderElection>) -> Self {
        self.election = Some(election);
        self
    }

    /// Adds the semaphore handle of the same client.
    pub fn with_semaphore(mut self, semaphore: Arc<dyn DistributedSemaphore>) -> Self {
        self.semaphore = Some(semaphore);
        self
    }

    /// Adds the read-write lock handle of the same client.
    pub fn with_rw_lock(mut self, rw_lock: Arc<dyn DistributedRwLock>) -> Self {
        self.rw_lock = Some(rw_lock);
        self
    }

    /// Adds fault hooks.
    pub fn with_faults(mut self, faults: Arc<dyn ClientFaults>) -> Self {
        self.faults = Some(faults);
        self
    }
}

/// A connector from URL to lock, for scenarios about URL handling.
pub type UrlConnector = Arc<
    dyn Fn(
            String,
        )
            -> Pin<Box<dyn Future<Output = Result<Arc<dyn DistributedLock>, LockError>> + Send>>
        + Send
        + Sync,
>;

/// The backend under test, as the scenarios see it.
#[async_trait]
pub trait Harness: Send + Sync {
    /// A name for reports (`memory`, `redis://127.0.0.1:6379`, …).
    fn name(&self) -> String;

    /// A new, independent client: its own connection or session.
    ///
    /// # Errors
    /// Whatever connecting to the backend raised.
    async fn client(&self) -> Result<Client, LockError>;

    /// The short TTL the TTL and expiry scenarios use. Keep it well above the
    /// backend's round trip; the default is 500 ms.
    fn ttl(&self) -> Duration {
        Duration::from_millis(500)
    }

    /// Tolerance for "promptly" and "within a bound" checks, for a noisy machine.
    /// The default is 1 s.
    fn slack(&self) -> Duration {
        Duration::from_secs(1)
    }

    /// The longest a crashed holder's lock survives for a lease of `ttl`: the TTL for
    /// TTL-based backends (the default), the session timeout for session-bound ones.
    fn crash_bound(&self, ttl: Duration) -> Duration {
        ttl
    }

    /// The longest a crashed waiter holds up the waiters queued behind it on a FIFO
    /// backend: how long its queue entry outlives it (Redis: the FIFO entry TTL;
    /// ZooKeeper: the session timeout; Postgres: until the server sees the connection
    /// gone). The default is [`Harness::crash_bound`] of [`Harness::ttl`].
    fn dead_waiter_bound(&self) -> Duration {
        self.crash_bound(self.ttl())
    }

    /// A URL connector, if the harness has one (`distlock::connect`, say).
    fn url_connector(&self) -> Option<UrlConnector> {
        None
    }
}
