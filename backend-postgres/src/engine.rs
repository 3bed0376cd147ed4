//! [`PostgresLock`] as an [`Engine`]: each claim goes to the advisory lock and plan
//! that carry it (see `lock::PostgresLock::contend`), and the client hands out the
//! four primitives over it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::backend::{unanswered_message, Claim, Engine, Grant, Request};
use distlock_api::{
    BackendInfo, Capabilities, Capability, Client, DistributedLock, DistributedRwLock,
    DistributedSemaphore, ExtendOutcome, KeyStatus, Leader, LeaderElection, Lease, LockError,
    LockKey, Primitive, ReleaseOutcome, NOT_YET,
};

use crate::keys::advisory_key;
use crate::lock::Plan;
use crate::mailbox::Probe;
use crate::{election, rw, semaphore, PostgresLock, POSTGRES_BACKEND};

/// Why no lease outlives its client: every grant is a lock of one of the client's
/// database sessions.
const SESSION_BOUND: &str = "a lock lives in its client's database session: the server frees \
     it when the client closes or its process exits, whatever the TTL left";

/// What each primitive guarantees, the one place the claims are made:
/// - every grant takes a token from the fencing sequence, and its lease is enforced by
///   the holding client (TTL) and bounded by its session, for every primitive: so no
///   lease outlives its client (`SESSION_BOUND`);
/// - the mutex, a writer, a reader and a candidate wait in the server's lock queue,
///   which hands the lock to the first waiter on a release (FIFO, woken, no polling);
/// - a permit waiter polls the slots at the options' backoff (`semaphore::POLLED`):
///   neither FIFO nor woken by a release.
fn capabilities() -> Capabilities {
    capabilities_bound_by(SESSION_BOUND)
}

/// The claims above, with `bound` as the reason no lease outlives its client: shared
/// by both designs (the transaction-pooling one's grants are bound by their
/// transactions instead of sessions).
pub(crate) fn capabilities_bound_by(bound: &'static str) -> Capabilities {
    let mut capabilities = Capabilities::all_supported()
        .with_every(|g| g.outlives_client = Capability::Unsupported(bound));
    capabilities.semaphore.fifo = Capability::Unsupported(semaphore::POLLED);
    capabilities.semaphore.wake_on_release = Capability::Unsupported(semaphore::POLLED);
    capabilities
}

/// What finds the other holders of `primitive`'s lock on `key`, for the outcome of a
/// release or extend of a lease this client no longer holds.
pub(crate) fn probe(primitive: Primitive, key: &LockKey) -> Probe {
    match primitive {
        Primitive::Mutex => Probe::key(advisory_key(key)),
        Primitive::Semaphore => semaphore::probe(key),
        Primitive::RwLock => rw::probe(key),
        Primitive::Election => election::probe(key),
    }
}

impl PostgresLock {
    /// This client, for every primitive: the handles share its sessions.
    pub fn client(&self) -> Client {
        Client::new(self.clone())
    }

    /// The mutex of this client (`self.client().lock()`).
    pub fn lock(&self) -> Arc<dyn DistributedLock> {
        self.client().lock()
    }

    /// The semaphore of this client: permits held on its dedicated sessions (see the
    /// crate docs). Its waiters poll, so it refuses a FIFO wait with
    /// [`LockError::Unsupported`].
    pub fn semaphore(&self) -> Arc<dyn DistributedSemaphore> {
        self.client().semaphore()
    }

    /// The read-write lock of this client, with writer preference (see the crate docs).
    pub fn rw_lock(&self) -> Arc<dyn DistributedRwLock> {
        self.client().rw_lock()
    }

    /// Leader election on this client (see the crate docs).
    pub fn election(&self) -> Arc<dyn LeaderElection> {
        self.client().election()
    }
}

#[async_trait]
impl Engine for PostgresLock {
    fn info(&self) -> BackendInfo {
        BackendInfo::new(POSTGRES_BACKEND, capabilities()).with_unreleased_lock_ends(
            "a Postgres lock lives as long as its database session: it ended with the server \
             or the connection if they went down, and otherwise ends when its process exits \
             and its session closes",
        )
    }

    /// A try on a shared session (a read or a permit: on a dedicated one), then, while
    /// the key is held, a wait in the server's queue under `lock_timeout` (the time
    /// left) on a dedicated session, or, for a permit, tries at the options' backoff.
    /// A dropped call leaves nothing held: a request still queued in its session is
    /// never sent, and one on the wire is undone by the session as its answer comes in
    /// (a shared session unlocks at once; an abandoned wait's session is closed).
    async fn acquire(&self, request: &Request<'_>) -> Result<Option<Grant>, LockError> {
        let key = request.key;
        let (hash, plan) = match request.claim {
            Claim::Mutex => (advisory_key(key), Plan::Exclusive),
            Claim::Permit { max } => semaphore::plan(key, max),
            Claim::Rw(mode) => (rw::hash(key), rw::plan(mode)),
            Claim::Lead(candidate) => {
                election::ready(self).await?;
                (election::hash(key), election::plan(key, candidate))
            }
            // A claim added to the API after this backend was written.
            other => {
                return Err(LockError::Unsupported {
                    backend: POSTGRES_BACKEND,
                    operation: other.primitive().as_str(),
                    reason: NOT_YET,
                })
            }
        };
        let granted = self.contend(request, hash, &plan).await?;
        Ok(granted.map(|grant| {
            let (owner, granted) = grant;
            let (lease, monitor) = granted.into_lease(key, owner, request.options);
            Grant::new(lease, monitor)
        }))
    }

    async fn release(
        &self,
        primitive: Primitive,
        lease: &Lease,
    ) -> Result<ReleaseOutcome, LockError> {
        self.release_lease(lease, probe(primitive, lease.key()))
            .await
    }

    async fn extend(
        &self,
        primitive: Primitive,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        self.extend_lease(lease, ttl, probe(primitive, lease.key()))
            .await
    }

    /// Held or free, per `pg_locks`. The holder's token lives only in its client and the
    /// lease is the holder's session, so neither token nor remaining time is reported.
    async fn inspect(&self, key: &LockKey) -> Result<KeyStatus, LockError> {
        let held = self.held_by_anyone(Probe::key(advisory_key(key))).await?;
        Ok(if held {
            KeyStatus::held()
        } else {
            KeyStatus::free()
        })
    }

    /// The row of the election's leader while its session holds the election's lock;
    /// observers poll (`wait_change`'s default).
    async fn leader(&self, name: &LockKey) -> Result<Option<Leader>, LockError> {
        election::leader(self, name).await
    }

    /// A connection error naming the server's address, as the backend's others do.
    fn unanswered(&self, wait: Duration) -> LockError {
        self.settings().connection_error(unanswered_message(wait))
    }
}
