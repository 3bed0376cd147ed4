//! [`Harness`]: how the kit gets independent clients of the backend under test.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{
    BackendInfo, DistributedLock, DistributedRwLock, DistributedSemaphore, LeaderElection,
    LockError,
};

/// Fault hooks on one client. All optional: scenarios that need one skip without it.
#[async_trait]
pub trait ClientFaults: Send + Sync {
    /// Makes the client behave like a crashed process: its connection is cut without
    /// releasing anything, and later calls (background releases, renewals) do not
    /// reach the server.
    async fn crash(&self) -> Result<(), LockError>;
}

/// One client of the backend under test, as if in its own process: a
/// [`distlock_api::Client`] (every primitive over one connection) and its fault hooks.
#[derive(Clone)]
#[non_exhaustive]
pub struct Client {
    client: distlock_api::Client,
    /// The client's fault hooks, if the harness offers them. Crashing the client
    /// crashes every primitive of it.
    pub faults: Option<Arc<dyn ClientFaults>>,
}

impl Client {
    /// `client`, without fault hooks.
    pub fn new(client: distlock_api::Client) -> Self {
        Client {
            client,
            faults: None,
        }
    }

    /// Adds fault hooks.
    pub fn with_faults(mut self, faults: Arc<dyn ClientFaults>) -> Self {
        self.faults = Some(faults);
        self
    }

    /// The client's name and guarantees, per primitive.
    pub fn info(&self) -> BackendInfo {
        self.client.info()
    }

    /// The client's mutex.
    pub fn lock(&self) -> Arc<dyn DistributedLock> {
        self.client.lock()
    }

    /// The client's semaphore (it refuses every acquire where the backend offers none).
    pub fn semaphore(&self) -> Arc<dyn DistributedSemaphore> {
        self.client.semaphore()
    }

    /// The client's read-write lock (it refuses every acquire where the backend offers
    /// none).
    pub fn rw_lock(&self) -> Arc<dyn DistributedRwLock> {
        self.client.rw_lock()
    }

    /// The client's election (it refuses every campaign where the backend offers none).
    pub fn election(&self) -> Arc<dyn LeaderElection> {
        self.client.election()
    }
}

/// A connector from URL to client (`distlock::connect`, say), for scenarios about URL
/// handling and harnesses that connect clients by URL.
pub type UrlConnector = Arc<
    dyn Fn(String) -> Pin<Box<dyn Future<Output = Result<distlock_api::Client, LockError>> + Send>>
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
