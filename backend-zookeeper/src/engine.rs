//! [`ZooKeeperLock`] as a [`distlock_api::backend::Engine`]: each claim is contended
//! for by its Curator recipe (`lock.rs`, `semaphore.rs`, `rw.rs`, `election.rs`), and
//! [`Client`] implements the four public primitives over it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::backend::{unanswered_message, Claim, Engine, Grant, Request};
use distlock_api::{
    BackendInfo, Capabilities, Capability, Client, DistributedLock, DistributedRwLock,
    DistributedSemaphore, ExtendOutcome, FencingToken, KeyStatus, Leader, LeaderElection, Lease,
    LockError, LockKey, Primitive, ReleaseOutcome, RwMode,
};

use crate::keys::NodeKind;
use crate::lock::Recipe;
use crate::{ZooKeeperLock, ZOOKEEPER_BACKEND};

/// Why no primitive's lease expires after the options' TTL.
const SESSION_LEASE: &str = "the lease is the ZooKeeper session: a lock is held until it is \
     released or its session expires (the negotiated session timeout), not for a TTL";

/// Why no grant survives its client.
const SESSION_BOUND: &str = "the lease is the ZooKeeper session: the server deletes a client's \
     nodes once its session is closed (at the latest when its runtime shuts down) or expires";

/// What the backend promises, per primitive; [`Engine::info`] reads nothing else.
///
/// Every primitive is a queue of ephemeral-sequential nodes (the semaphore's is its
/// guard mutex's), so for each of them:
/// - `fifo`: contenders are ranked by the sequence the server gave their nodes, and a
///   node leaves the queue only when it is granted or gives up; the semaphore's head
///   holds the guard mutex until it has its permit, so permits too go in arrival
///   order, and readers are held back by every older writer;
/// - `wake_on_release`: a waiter watches the node that blocks it (the semaphore's
///   head, the lease directory's children) and looks again when it goes; none polls;
/// - `fencing`: the token is the grant's node's `czxid`, and a node is granted only
///   once every node that could block it, all older, is gone (semaphore leases are
///   created one at a time under the guard mutex);
/// - `extend`: proves the session alive and the node present, pushing the validity
///   deadline out by the session timeout;
/// - `ttl_expiry`: unsupported, see [`SESSION_LEASE`];
/// - `outlives_client`: unsupported, see [`SESSION_BOUND`].
pub(crate) fn capabilities() -> Capabilities {
    Capabilities::all_supported().with_every(|g| {
        g.ttl_expiry = Capability::Unsupported(SESSION_LEASE);
        g.outlives_client = Capability::Unsupported(SESSION_BOUND);
    })
}

/// The Curator recipe a claim is contended for by, and the directory it runs in.
///
/// # Errors
/// [`LockError::Unsupported`] for a claim newer than this backend.
fn recipe_of<'a>(
    lock: &ZooKeeperLock,
    request: &Request<'a>,
) -> Result<(String, Recipe<'a>), LockError> {
    let key = request.key;
    Ok(match request.claim {
        Claim::Mutex => (lock.lock_dir(key), Recipe::Mutex),
        Claim::Permit { max } => (lock.semaphore_path(key), Recipe::Permit { max }),
        Claim::Rw(RwMode::Read) => (lock.rw_path(key), Recipe::Read),
        Claim::Rw(RwMode::Write) => (lock.rw_path(key), Recipe::Write),
        Claim::Lead(candidate) => {
            let identity = candidate.as_bytes();
            (lock.election_path(key), Recipe::Lead { identity })
        }
        other => {
            return Err(LockError::Unsupported {
                backend: ZOOKEEPER_BACKEND,
                operation: other.primitive().as_str(),
                reason: "a claim this backend has no recipe for",
            })
        }
    })
}

impl ZooKeeperLock {
    /// The directory holding `primitive`'s grants of `key`, and the kind of node by
    /// which anyone else's contention there is recognised.
    fn grants_of(&self, primitive: Primitive, key: &LockKey) -> (String, NodeKind) {
        match primitive {
            Primitive::Mutex => (self.lock_dir(key), NodeKind::Lock),
            Primitive::Semaphore => (self.leases_dir(key), NodeKind::Lease),
            // Either kind ranks the directory's readers and writers alike.
            Primitive::RwLock => (self.rw_path(key), NodeKind::Write),
            Primitive::Election => (self.election_path(key), NodeKind::Latch),
        }
    }

    /// This client, for every primitive, on its one session.
    pub fn client(&self) -> Client {
        Client::new(self.clone())
    }

    /// The mutex (`self.client().lock()`): Curator `InterProcessMutex`-compatible, in
    /// [`ZooKeeperLock::lock_dir`]. See the crate docs for the protocol.
    pub fn lock(&self) -> Arc<dyn DistributedLock> {
        self.client().lock()
    }

    /// The semaphore, on this client's session: Curator
    /// `InterProcessSemaphoreV2`-compatible, at [`ZooKeeperLock::semaphore_path`].
    ///
    /// A permit is a lease node; like the mutex, it is held until it is released or
    /// its session ends (no TTL expiry). Waiters queue in the guard mutex in arrival
    /// order (FIFO waits are honoured) and are woken by watches. The fencing token is
    /// the lease node's `czxid`: lease nodes are created one at a time under the guard
    /// mutex and granted in that order, so a permit's token is above every earlier
    /// permit grant's on the key. It orders and identifies grants; since several
    /// permits are valid at once, a resource cannot use it to refuse "everything below
    /// the highest token seen".
    ///
    /// **Permit counts.** Curator keeps no count in the tree (each client passes its
    /// own `maxLeases` or reads a `SharedCount`); our lease nodes record theirs in their
    /// data ([`crate::PERMITS_DATA_PREFIX`]`N`). An acquirer, holding the guard mutex,
    /// reads the other lease nodes' data, and one recording another count is a
    /// [`LockError::PermitMismatch`]. Lease nodes without that data (Curator's) are
    /// counted but cannot be checked: a Curator client with another `maxLeases` admits
    /// by its own count, as Curator clients with different counts do among themselves.
    ///
    /// A try takes the guard mutex without waiting, or, when permits are free and
    /// another acquire is passing through it, waits for it up to the request timeout.
    pub fn semaphore(&self) -> Arc<dyn DistributedSemaphore> {
        self.client().semaphore()
    }

    /// The read-write lock, on this client's session: Curator
    /// `InterProcessReadWriteLock`-compatible, at [`ZooKeeperLock::rw_path`].
    ///
    /// **Fairness.** A reader is held back by every writer whose node is older than
    /// its own, waiting or holding; so once a writer waits, readers that come after it
    /// queue behind it (a read try reports the key held), and everyone is granted in
    /// arrival order (FIFO waits are honoured). A writer that gives up deletes its
    /// node, which lets the readers behind it in at once.
    ///
    /// **Fencing tokens**: the grant's node's `czxid`. A writer is granted only when
    /// every older node is gone and a reader only when every older writer is, so a
    /// writer's token is above that of every grant before it and below that of every
    /// grant after it; readers granted together do not fence each other.
    ///
    /// Like the mutex, a grant is held until it is released or its session ends (no
    /// TTL expiry).
    pub fn rw_lock(&self) -> Arc<dyn DistributedRwLock> {
        self.client().rw_lock()
    }

    /// Leader election, on this client's session: Curator `LeaderLatch`-compatible, at
    /// [`ZooKeeperLock::election_path`].
    ///
    /// A campaign creates an ephemeral-sequential candidate node
    /// `_c_<guid>-latch-<seq>` holding the candidate's identity
    /// ([`distlock_api::Candidate::as_bytes`]). The lowest sequence leads; a waiting
    /// candidate watches only the next lower node, so a resignation wakes one
    /// candidate (no herd), and candidates lead in the order they campaigned. A
    /// candidate that gives up (a timeout, a `NoWait` campaign meeting a leader, a
    /// dropped campaign future) deletes its node, and the directory is a container
    /// node, which the server removes once the election is empty.
    ///
    /// - **At most one leader** per name: while its session lives, the lowest node's
    ///   owner leads.
    /// - **Term: the leader's node's `czxid`**. Nodes of a directory are created in
    ///   sequence order and only the lowest leads, so each new leader's term is above
    ///   every earlier one's, across session expiries and a recreated directory.
    /// - **The lease is the session**: a leader leads until it resigns or its session
    ///   ends, whatever TTL the options ask for. A disconnect makes the leadership
    ///   *suspect*, the session's expiry *lost*, and without news `lost()` fires at the
    ///   validity deadline (`t + session timeout`, `t` when a request the server
    ///   answered was sent). A crashed leader is replaced once the server expires its
    ///   session.
    /// - [`LeaderElection::leader`] reads the lowest candidate node: its data as the
    ///   identity, its `czxid` as the term, no remaining lease.
    ///   [`LeaderElection::wait_change`] waits on a child watch, not by polling.
    ///
    /// **Curator interoperability.** A Java `new LeaderLatch(client, path, id)` on
    /// the same path campaigns in the same election: Curator's `getLeader().getId()`
    /// reads our identity (as UTF-8, lossily), and [`LeaderElection::leader`] reads
    /// Curator's `id`. A Curator participant whose id is empty (Curator's default) or
    /// longer than [`distlock_api::MAX_CANDIDATE_LEN`] bytes reads as its node's name
    /// (`_c_<guid>-latch-<seq>`) instead.
    pub fn election(&self) -> Arc<dyn LeaderElection> {
        self.client().election()
    }
}

#[async_trait]
impl Engine for ZooKeeperLock {
    fn info(&self) -> BackendInfo {
        BackendInfo::new(ZOOKEEPER_BACKEND, capabilities()).with_unreleased_lock_ends(
            "it is freed when its holder's ZooKeeper session closes (the process exits) or, if \
             the server cannot be reached, expires (the session timeout, whatever the TTL); \
             already, if the session ended",
        )
    }

    /// Contends by the claim's recipe, waiting on watches until the request's deadline.
    /// Dropping the future at any await removes our node (the recipes' drop guards),
    /// including one whose create is still in flight.
    async fn acquire(&self, request: &Request<'_>) -> Result<Option<Grant>, LockError> {
        let (dir, recipe) = recipe_of(self, request)?;
        let won = self.obtain(&dir, recipe, request).await;
        let won = won.map_err(|e| self.located(e))?;
        Ok(won.map(|won| {
            let (lease, monitor) = self.register(request.key, request.options, won);
            Grant::new(lease, monitor)
        }))
    }

    async fn release(
        &self,
        primitive: Primitive,
        lease: &Lease,
    ) -> Result<ReleaseOutcome, LockError> {
        let (dir, kind) = self.grants_of(primitive, lease.key());
        self.release_node(&dir, kind, lease).await
    }

    /// The TTL is not used: the lease is the session, and extend proves it alive.
    async fn extend(
        &self,
        primitive: Primitive,
        lease: &Lease,
        _ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        let (dir, kind) = self.grants_of(primitive, lease.key());
        self.extend_lease(&dir, kind, lease).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<KeyStatus, LockError> {
        self.inspect_mutex(key).await
    }

    async fn leader(&self, name: &LockKey) -> Result<Option<Leader>, LockError> {
        self.read_leader(name).await
    }

    async fn wait_change(
        &self,
        name: &LockKey,
        seen: Option<FencingToken>,
        patience: Duration,
    ) -> Result<Option<Leader>, LockError> {
        self.await_leader_change(name, seen, patience).await
    }

    fn unanswered(&self, wait: Duration) -> LockError {
        let error = LockError::connection(ZOOKEEPER_BACKEND, unanswered_message(wait));
        self.located(error)
    }
}
