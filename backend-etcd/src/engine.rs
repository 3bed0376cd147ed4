//! [`EtcdLock`] as an [`Engine`]: every claim is one contender of its kind in the
//! recipe ([`EtcdLock::contend`]), released and extended by its key; and the handles
//! of the four primitives over it ([`EtcdLock::client`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::backend::{unanswered_message, Claim, Engine, Grant, Request};
use distlock_api::{
    BackendInfo, Capabilities, Capability, Client, DistributedLock, DistributedRwLock,
    DistributedSemaphore, ExtendOutcome, FencingToken, KeyStatus, Leader, LeaderElection, Lease,
    LockError, LockKey, Primitive, ReleaseOutcome,
};

use crate::keys::Kind;
use crate::semaphore::value_of;
use crate::{rw, EtcdLock, ETCD_BACKEND};

/// Why no lease outlives its client here (see [`capabilities`]).
const REVOKED_AT_EXIT: &str = "a process that exits cleanly revokes every lease its etcd client \
     holds as its runtime shuts down, a lease left to run out included (only a killed process \
     leaves its leases to their TTL)";

/// What the etcd backend promises, per primitive: the same for all four, since each is
/// the one recipe ([`EtcdLock::contend`]) with its own rule of which older contenders
/// keep a contender waiting. Supported:
/// - **offered** and **extend**: all four (an extend is a keep-alive of the key's
///   lease, or a move of the key to a longer one);
/// - **TTL expiry**: every key lives under the client's etcd lease of the TTL asked
///   for, rounded up to whole seconds, which etcd ends only later, never earlier (a
///   restart refreshes it); a grant's deadline passed unrenewed, its client deletes
///   the key, and a client that stops leaves it to that lease, gone one TTL after the
///   client's last keep-alive;
/// - **wake on release**: waiters learn of the deletions ahead of them from watches
///   (the client's prefix watch, or one of the keys ahead), never by polling;
/// - **FIFO**: contenders rank by create revision, and a younger one is granted only
///   once fewer than its room of older ones are left, so every primitive's waiters are
///   granted in arrival order (the read-write lock's with writer preference);
/// - **fencing**: the mutex's and the election's token is the key's create revision
///   (the term); a semaphore's or read-write lock's waited grant stamps a pending
///   marker in queue order instead (see [`EtcdLock::semaphore`]), so on every
///   primitive each grant's token is above every earlier grant's of the key.
///
/// Unsupported: **outlives client**. The client revokes every lease it lists when its
/// runtime shuts down (see the crate docs, "Leaving nothing behind"), and a lease left
/// to run out ([`distlock_api::LockGuard::let_expire`]) is still listed, so a done
/// mark would go with the process that set it.
fn capabilities() -> Capabilities {
    Capabilities::all_supported()
        .with_every(|g| g.outlives_client = Capability::Unsupported(REVOKED_AT_EXIT))
}

/// The contender a claim puts in, and the value its key holds: nothing for a lock, a
/// reader or a writer, the count for a permit, the identity for a candidate.
fn contender(claim: Claim<'_>) -> Result<(Kind, Vec<u8>), LockError> {
    Ok(match claim {
        Claim::Mutex => (Kind::Mutex, Vec::new()),
        Claim::Permit { max } => {
            let kind = Kind::Permit(max);
            (kind, value_of(kind).into_bytes())
        }
        Claim::Rw(mode) => (rw::kind(mode), Vec::new()),
        Claim::Lead(candidate) => (Kind::Candidate, candidate.as_bytes().to_vec()),
        other => {
            return Err(LockError::Unsupported {
                backend: ETCD_BACKEND,
                operation: other.primitive().as_str(),
                reason: distlock_api::NOT_YET,
            })
        }
    })
}

/// The contender kind of `primitive`'s grant `lease` (a permit's count does not matter
/// to its release or extend).
fn kind_of(primitive: Primitive, lease: &Lease) -> Kind {
    match primitive {
        Primitive::Mutex => Kind::Mutex,
        Primitive::Semaphore => Kind::Permit(1),
        Primitive::RwLock => rw::kind_of(lease),
        Primitive::Election => Kind::Candidate,
    }
}

#[async_trait]
impl Engine for EtcdLock {
    fn info(&self) -> BackendInfo {
        BackendInfo::new(ETCD_BACKEND, capabilities()).with_unreleased_lock_ends(
            "it is freed when its etcd lease runs out (the TTL, plus the leader's expiry sweep), \
             or at once when its process exits and revokes the lease",
        )
    }

    /// One contender's acquire, waiting on watches until the request's deadline.
    /// Retryable errors (a member going away, a leader election) end the attempt (its
    /// key and leases are taken back) and are retried by the caller, under the options'
    /// error patience.
    async fn acquire(&self, request: &Request<'_>) -> Result<Option<Grant>, LockError> {
        let (kind, value) = contender(request.claim)?;
        let attempt = self.contend(
            kind,
            request.key,
            &value,
            request.options,
            request.report,
            request.waits(),
        );
        let won = until_deadline(request, attempt).await?;
        Ok(won.map(|(lease, monitor)| Grant::new(lease, monitor)))
    }

    async fn release(
        &self,
        primitive: Primitive,
        lease: &Lease,
    ) -> Result<ReleaseOutcome, LockError> {
        self.release_in(kind_of(primitive, lease), lease).await
    }

    async fn extend(
        &self,
        primitive: Primitive,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        self.extend_in(kind_of(primitive, lease), lease, ttl).await
    }

    /// The oldest contender of the lock's range: its key, create revision (the token)
    /// and lease's remaining TTL, and how many wait behind it (foreign contenders, an
    /// `etcdctl lock`, count).
    async fn inspect(&self, key: &LockKey) -> Result<KeyStatus, LockError> {
        let oldest = self
            .requests()
            .oldest(&self.lock_prefix(key))
            .await
            .map_err(|f| self.connection_error(f))?;
        Ok(match oldest {
            None => KeyStatus::free(),
            Some((holder, count, remaining)) => KeyStatus::held()
                .with_fencing_token(
                    u64::try_from(holder.create_revision())
                        .ok()
                        .map(FencingToken::new),
                )
                .with_remaining(
                    remaining
                        .and_then(|s| u64::try_from(s).ok())
                        .map(Duration::from_secs),
                )
                .with_holder(Some(String::from_utf8_lossy(holder.key()).into_owned()))
                .with_waiters(usize::try_from(count.saturating_sub(1)).ok()),
        })
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
        self.wait_leader_change(name, seen, patience).await
    }

    fn unanswered(&self, wait: Duration) -> LockError {
        LockError::connection_at(ETCD_BACKEND, self.hosts(), unanswered_message(wait))
    }
}

/// Runs a contender's `attempt`, which waits for as long as it is let, until the
/// request's deadline. Then, if an answer showed the key held, the attempt is dropped
/// (its clean-up takes back its key and leases) and the key is still held: `None`.
/// Else nothing answered yet, and the attempt runs on until the caller cuts it as
/// unanswered.
async fn until_deadline<T>(
    request: &Request<'_>,
    attempt: impl Future<Output = Result<Option<T>, LockError>>,
) -> Result<Option<T>, LockError> {
    let deadline = match request.deadline {
        Some(deadline) if request.waits() => deadline,
        _ => return attempt.await,
    };
    tokio::pin!(attempt);
    tokio::select! {
        biased;
        done = &mut attempt => return done,
        () = tokio::time::sleep_until(deadline) => {}
    }
    if request.report.held_seen() {
        return Ok(None);
    }
    attempt.await
}

impl EtcdLock {
    /// This client, for every primitive: one connection, one set of leases and one loss
    /// watch shared by all.
    pub fn client(&self) -> Client {
        Client::new(self.clone())
    }

    /// The mutex (`self.client().lock()`): etcd's `concurrency.Mutex` recipe, so that
    /// `etcdctl lock` and Go's `concurrency.NewMutex` on [`EtcdLock::lock_prefix`]
    /// (without its trailing `/`) exclude ours. The fencing token is the holder key's
    /// create revision. See the crate docs for the protocol.
    pub fn lock(&self) -> Arc<dyn DistributedLock> {
        self.client().lock()
    }

    /// The counting semaphore (`self.client().semaphore()`), on the mutex's recipe with
    /// room for `max` holders (see the crate docs).
    ///
    /// **Fencing tokens.** A permit granted at once carries its key's create revision
    /// (the put that placed it was the grant). A waiter first marks its grant pending:
    /// it puts `P/+semaphore-pending/<K>/<its key's create revision, 20 digits>` under
    /// its lease. Once granted, it writes that marker again in a transaction guarded by
    /// its key still being its own and by no older contender's marker being left; that
    /// write's revision is its token, and it deletes the marker as the acquire returns.
    /// So waiters granted by the same deletions (two holders leaving at once), which
    /// learn it in no set order, stamp one after the other in queue order, each only
    /// after the one before it has returned, and a permit's token is above that of
    /// every permit granted before it on the key in the order the grants are learned.
    /// (A waiter's create revision would not do: the younger could return first, with
    /// the lower token.) It orders and identifies grants; since several permits are
    /// valid at once, a resource cannot use it to refuse "everything below the highest
    /// token seen".
    ///
    /// **Permit counts.** Every permit key records its count. An acquire reads the
    /// `max` oldest contenders in the transaction that puts its key; one recording
    /// another count (the oldest always holds, so a key in use is always seen) is a
    /// [`LockError::PermitMismatch`], and the acquire withdraws its key. Keys without a
    /// recorded count (not ours) count as contenders but cannot be checked.
    pub fn semaphore(&self) -> Arc<dyn DistributedSemaphore> {
        self.client().semaphore()
    }

    /// The read-write lock (`self.client().rw_lock()`), in the key layout of etcd's
    /// `recipes.RWMutex` (see the crate docs).
    ///
    /// **Fairness: writer preference, FIFO.** A reader is held back by every writer
    /// older than itself, waiting or holding; so once a writer waits, readers that come
    /// after it queue behind it (a read `try_acquire` reports the key held), and
    /// writers are granted in arrival order. A writer that gives up deletes its key,
    /// which lets the readers behind it in at once.
    ///
    /// **Fencing tokens.** A grant at once carries its key's create revision (the put
    /// that placed it was the grant). A grant after a wait carries its stamp's
    /// revision, as a semaphore permit's (see [`EtcdLock::semaphore`]): the waiter's
    /// pending marker is `P/+rw-pending/<K>/<its key's create revision, 20 digits>`,
    /// under its lease, outside every range a contender reads (Go's included), and its
    /// key is never written again (Go's `RWMutex` ranks by mod revision). (The key's
    /// create revision would not do: readers granted by one deletion each learn it on
    /// their own, so the younger could return first with the lower token, and a writer
    /// queued before such a reader's grant could follow it with a lower token.) A
    /// writer is granted only when every older key is gone and a reader only when
    /// every older writer is, so every grant's token is above that of every grant
    /// learned before it on the key, and a writer's is below that of every grant after
    /// it; readers holding together do not fence each other.
    ///
    /// **Beside Go's `recipes.RWMutex`.** That recipe ranks contenders by *mod*
    /// revision, ours by create revision: the same for a key never written again.
    /// Hence two differences from the mutex:
    /// - a waiter waits under the client's lease of its lock's TTL, kept alive, and
    ///   not under the mutex's short waiting lease: moving the key to another lease
    ///   would write it again. So a waiter whose process dies holds up the queue for
    ///   the lock's TTL.
    /// - an `extend` to a TTL longer than the lease's own moves the key to another lease
    ///   (as the mutex's does), which writes it again: a Go `RWMutex` contender
    ///   looking after that may rank the key behind its own. Between distlock clients
    ///   nothing changes (they rank by create revision); beside Go contenders, extend
    ///   only up to the TTL the lock was taken with (auto-renew does).
    ///
    /// Our keys are named `<client id>-<slot>` in hex (reused by their client, see the
    /// crate docs' "Key names"), the Go recipe's by `time.Now().UnixNano()`; no two
    /// live keys share a name, and neither side ranks by name. Ours only checks the
    /// shape of the keys ahead of its own: `read/` or `write/` and either our names or
    /// an id of hex digits (decimal ones included), under a lease; anything else in the
    /// range is another tool's data, which may never go, and the acquire fails with
    /// [`LockError::Config`] naming it.
    pub fn rw_lock(&self) -> Arc<dyn DistributedRwLock> {
        self.client().rw_lock()
    }

    /// Leader election (`self.client().election()`), in the key layout of etcd's own
    /// `concurrency.Election` (behind `etcdctl elect`).
    ///
    /// **Semantics.** The candidates of the election `name` put their keys in the range
    /// [`EtcdLock::election_prefix`] (`P/+election/<encode_key(name)>/`), each
    /// `<range><id in hex>` under the client's lease of the options' TTL (see the
    /// crate docs, "Leases and fencing"), created only if absent,
    /// with the candidate's identity ([`distlock_api::Candidate::as_bytes`]) as its
    /// value. The key with the lowest create revision leads; a waiting candidate learns
    /// of the deletions ahead of it from watches, so candidates lead in the order they
    /// campaigned. Everything else is the mutex's (see the crate docs): a waiting
    /// candidate waits under a 3 s lease, a candidate that gives up (a timeout, a
    /// `NoWait` campaign meeting a leader, a dropped campaign future) deletes its key,
    /// and nothing is left in the range once every candidate has left.
    ///
    /// - **At most one leader** per name, as the etcd mutex excludes: while its lease
    ///   lives, the oldest key's owner leads.
    /// - **Term: the leader key's create revision.** etcd's revision is one counter
    ///   for the whole cluster, kept through leader changes and restarts, and a newer
    ///   key is always younger than every key in the range, so each new leader's term
    ///   is above every earlier one's.
    /// - **The lease** is the options' TTL (whole seconds; at least 2 s with etcd's
    ///   default election timeout), the key on the client's etcd lease of that TTL,
    ///   renewed by the guard's watchdog with auto-renew. [`distlock_api::Leadership::lost`] fires when the key is
    ///   deleted (its lease expired or was revoked, or someone deleted it: one watch
    ///   per client sees it), when a renewal is refused, and at the validity deadline
    ///   without news. A crashed leader is replaced once etcd expires its lease: the
    ///   TTL after its last keep-alive, plus etcd's expiry sweep.
    /// - [`LeaderElection::leader`] reads the oldest key of the range, as
    ///   `concurrency.Election.Leader` does: its value as the identity, its create
    ///   revision as the term, and its lease's remaining TTL (whole seconds, from
    ///   `LeaseTimeToLive`). A key exists only while its lease does, so a leader whose
    ///   lease etcd has ended is never reported.
    /// - [`LeaderElection::wait_change`] waits on an etcd watch of the range, not by
    ///   polling: a deletion (or, while nobody leads, a new candidate) wakes observers,
    ///   who look again.
    ///
    /// **etcd interoperability.** `etcdctl elect P/+election/<name> PROPOSAL` and a Go
    /// service running `concurrency.NewElection(session, "P/+election/<name>")`
    /// campaign in the same election: one of all leads, `etcdctl elect -l` and
    /// `Election.Observe` read our identity (as the key's value), and
    /// [`LeaderElection::leader`] reads their proposal. A foreign leader whose value is
    /// empty or longer than [`distlock_api::MAX_CANDIDATE_LEN`] bytes reads as its
    /// key's name instead. A Go leader's `Proclaim` changes its value, not its term.
    pub fn election(&self) -> Arc<dyn LeaderElection> {
        self.client().election()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use distlock_api::{Candidate, RwMode};

    #[test]
    fn every_claim_is_a_contender_of_its_own_kind() {
        let candidate = Candidate::new("host-a").unwrap();
        let kinds = [
            (Claim::Mutex, Kind::Mutex, &b""[..]),
            (
                Claim::Permit { max: 3 },
                Kind::Permit(3),
                b"distlock:permits=3",
            ),
            (Claim::Rw(RwMode::Read), Kind::Read, b""),
            (Claim::Rw(RwMode::Write), Kind::Write, b""),
            (Claim::Lead(&candidate), Kind::Candidate, b"host-a"),
        ];
        for (claim, kind, value) in kinds {
            let (got, held) = contender(claim).unwrap();
            assert_eq!((got, held.as_slice()), (kind, value));
        }
    }
}
