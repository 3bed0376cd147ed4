//! [`MySqlLock`] as an [`Engine`]: each claim goes to the lock name and plan that carry
//! it, and the client hands out the primitives over it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::backend::{unanswered_message, Claim, Engine, Grant, Request};
use distlock_api::{
    BackendInfo, Capabilities, Capability, Client, DistributedLock, DistributedSemaphore,
    ExtendOutcome, Guarantees, KeyStatus, Leader, LeaderElection, Lease, LockError, LockKey,
    Primitive, ReleaseOutcome, NOT_YET,
};

use crate::keys::{election_name, lock_name, permit_count_name};
use crate::lock::Plan;
use crate::mailbox::Command;
use crate::{election, semaphore, MySqlLock, MYSQL_BACKEND};

/// Why no lease outlives its client: every grant is a lock of one of the client's
/// database sessions.
const SESSION_BOUND: &str = "a lock lives in its client's database session: the server frees \
     it when the client closes or its process exits, whatever the TTL left";

/// Why there is no read-write lock.
pub(crate) const EXCLUSIVE_ONLY: &str =
    "GET_LOCK is exclusive only: MySQL and MariaDB have no shared user lock, and a read \
     lock taken as exclusive would serialise readers";

/// Why waiters are not promised FIFO order.
const NO_FIFO_PROMISE: &str = "GET_LOCK waiters are woken by the server, in an order \
     neither MySQL nor MariaDB documents, and a wait longer than the session timeout queues again";

/// What each primitive guarantees, the one place the claims are made:
/// - every grant takes a token from the durable fencing counter of its lock name (per
///   key for a permit), and its lease is enforced by the holding client (TTL) and
///   bounded by its session: so no lease outlives its client (`SESSION_BOUND`);
/// - the mutex and a candidate wait in `GET_LOCK`, woken by the server on a release,
///   in no documented order (`NO_FIFO_PROMISE`);
/// - a permit waiter polls the slots (`semaphore::POLLED`);
/// - no read-write lock (`EXCLUSIVE_ONLY`).
fn capabilities() -> Capabilities {
    let mut capabilities = Capabilities::all_supported()
        .with_every(|g| g.outlives_client = Capability::Unsupported(SESSION_BOUND));
    capabilities.mutex.fifo = Capability::Unsupported(NO_FIFO_PROMISE);
    capabilities.election.fifo = Capability::Unsupported(NO_FIFO_PROMISE);
    capabilities.semaphore.fifo = Capability::Unsupported(semaphore::POLLED);
    capabilities.semaphore.wake_on_release = Capability::Unsupported(semaphore::POLLED);
    capabilities.rw_lock = Guarantees::not_offered(EXCLUSIVE_ONLY);
    capabilities
}

impl MySqlLock {
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

    /// Leader election on this client (see the crate docs).
    pub fn election(&self) -> Arc<dyn LeaderElection> {
        self.client().election()
    }

    /// Whether anyone holds `primitive`'s lock of `key` now, for the outcome of a
    /// release or extend of a lease this client no longer holds.
    async fn held_by_anyone(&self, primitive: Primitive, key: &LockKey) -> Result<bool, LockError> {
        match primitive {
            Primitive::Semaphore => {
                let key = key.clone();
                self.ask(|reply| Command::PermitsInUse {
                    key: key.clone(),
                    reply,
                })
                .await
            }
            Primitive::Election => Ok(self.holder(&election_name(key)).await?.is_some()),
            _ => Ok(self.holder(&lock_name(key)).await?.is_some()),
        }
    }
}

#[async_trait]
impl Engine for MySqlLock {
    fn info(&self) -> BackendInfo {
        BackendInfo::new(MYSQL_BACKEND, capabilities()).with_unreleased_lock_ends(
            "a MySQL lock lives as long as its database session: it ended with the server or \
             the connection if they went down, and otherwise ends when its process exits and \
             its session closes",
        )
    }

    /// A try on a shared session (a permit: on a dedicated one), then, while the name
    /// is held, a wait in `GET_LOCK` (bounded by the time left and the session timeout)
    /// on a dedicated session, or, for a permit, tries at the options' backoff. A
    /// dropped call leaves nothing held: a request still queued in its session is
    /// never sent, and one on the wire is undone by the session as its answer comes in
    /// (a shared session releases at once; an abandoned wait's session is closed and
    /// killed).
    async fn acquire(&self, request: &Request<'_>) -> Result<Option<Grant>, LockError> {
        let key = request.key;
        let (name, plan) = match request.claim {
            Claim::Mutex => (lock_name(key), Plan::Exclusive),
            Claim::Permit { max } => (permit_count_name(key), Plan::Permit { max }),
            Claim::Lead(candidate) => (election_name(key), election::plan(key, candidate)),
            // Refused by the generic checks (`offered`), and a claim added to the API
            // after this backend was written.
            other => {
                return Err(LockError::Unsupported {
                    backend: MYSQL_BACKEND,
                    operation: other.primitive().as_str(),
                    reason: match other {
                        Claim::Rw(_) => EXCLUSIVE_ONLY,
                        _ => NOT_YET,
                    },
                })
            }
        };
        let name: Arc<str> = Arc::from(name);
        let granted = self.contend(request, &name, &plan).await?;
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
        if self.release_lease(lease).await? {
            return Ok(ReleaseOutcome::Released);
        }
        Ok(if self.held_by_anyone(primitive, lease.key()).await? {
            ReleaseOutcome::HeldByOther
        } else {
            ReleaseOutcome::Expired
        })
    }

    async fn extend(
        &self,
        primitive: Primitive,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        if let Some(valid_until) = self.extend_lease(lease, ttl).await? {
            return Ok(ExtendOutcome::Extended { valid_until });
        }
        Ok(if self.held_by_anyone(primitive, lease.key()).await? {
            ExtendOutcome::HeldByOther
        } else {
            ExtendOutcome::Expired
        })
    }

    /// Held or free, per `IS_USED_LOCK`, with the holder's connection id (as
    /// `connection <id>`, what `SHOW PROCESSLIST` and `KILL` take). The holder's token
    /// lives only in its client and the lease is the holder's session, so neither
    /// token nor remaining time is reported.
    async fn inspect(&self, key: &LockKey) -> Result<KeyStatus, LockError> {
        Ok(match self.holder(&lock_name(key)).await? {
            Some(id) => KeyStatus::held().with_holder(Some(format!("connection {id}"))),
            None => KeyStatus::free(),
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
