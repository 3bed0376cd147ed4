//! The etcd backend of distlock: etcd's own `concurrency.Mutex` recipe, so that
//! distlock, `etcdctl lock NAME` and Go services locking with `concurrency.NewMutex`
//! exclude each other on one name; lease TTLs kept alive by the guard's watchdog; the
//! holder key's create revision as fencing token. Leader election
//! ([`EtcdLock::election`]) is etcd's `concurrency.Election` on the same machinery, so
//! `etcdctl elect` and Go's `concurrency.NewElection` campaign with distlock. A
//! semaphore ([`EtcdLock::semaphore`]) and a read-write lock ([`EtcdLock::rw_lock`],
//! in the layout of etcd's `recipes.RWMutex`) on the same recipe.
//!
//! [`EtcdLock`] is one client (one connection, its leases and one watch of the prefix)
//! and implements [`distlock_api::backend::Engine`]: [`EtcdLock::client`] gives the
//! [`distlock_api::Client`] whose four primitives share it, and [`EtcdLock::lock`],
//! [`EtcdLock::semaphore`], [`EtcdLock::rw_lock`] and [`EtcdLock::election`] each one
//! of them. Every primitive is offered, with every guarantee (FIFO, fencing, TTL
//! expiry, wake on release, extend) but one: no lease outlives its client, since a
//! clean exit revokes them all (see "Leaving nothing behind"), so
//! [`distlock_api::run_once`] refuses here.
//!
//! ```no_run
//! # async fn demo() -> Result<(), distlock_api::LockError> {
//! use std::time::Duration;
//! use distlock_api::{AutoRenew, DistributedLock, LockKey, LockOptions, WaitPolicy};
//! use distlock_etcd::EtcdLock;
//!
//! let locks = EtcdLock::connect("etcd://etcd1:2379,etcd2:2379,etcd3:2379/app").await?;
//! let key = LockKey::new("invoices-2026-11")?;
//! let options = LockOptions::new(Duration::from_secs(10))
//!     .with_wait(WaitPolicy::Timeout(Duration::from_secs(5)))
//!     .with_auto_renew(AutoRenew::new());
//! let guard = locks.lock().acquire(&key, &options).await?;
//! // Send guard.fencing_token() (the key's create revision) with every protected write.
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Protocol
//! Lock `K` under the URL's prefix `P` (default [`DEFAULT_PREFIX`]) is the key range
//! `P/<encode_key(K)>/` ([`encode_key`] keeps plain names as they are, so `etcdctl
//! lock P/orders` is the lock of key `orders`).
//!
//! - **acquire** grants a lease of the options' TTL (rounded up to whole seconds; the
//!   id is chosen by the client, so a dropped acquire can always revoke it), then puts
//!   `P/<K>/<lease id in hex>` under that lease in a transaction that creates it only if
//!   absent (`CreateRevision == 0`) and reads the oldest contender in the same round
//!   trip. Contenders are ranked by create revision; the oldest holds the lock. That is
//!   exactly `concurrency.Mutex`, so foreign contenders in the range (an `etcdctl lock`,
//!   a Go service) count, and ours count for them. A key ahead of ours that does not
//!   have a contender's shape (named by a lease id in lowercase hex, attached to a
//!   lease) is another tool's data under this prefix, which may never go: the acquire
//!   fails with [`distlock_api::LockError::Config`] naming it, and revokes its lease.
//! - A waiter learns every contender older than its own (up to 64 of them) from the
//!   transaction that put its key (which reads them, oldest first), else one read, then
//!   counts their deletions down as the client's one watch of its prefix (see below;
//!   etcd filters out the puts) passes them on, so the deletion that makes the turn
//!   ours is seen in the watch event itself, with no read after it: the lock passes on
//!   in FIFO order of arrival, one raft write (the release) and one event from holder
//!   to holder. No contender older than ours can appear later (create revisions only
//!   rise), and the waiter listens before the read, which is made at or after the
//!   revision the watch has passed on up to, so the count is exact. A wait opens no
//!   watch of its own: etcd sends each deletion once per client, not once per waiter.
//!   With more than 64 ahead, a waiter watches only the youngest contender older than
//!   itself (the recipe's way, no herd) and looks again, with one serializable read of
//!   the range, when it goes.
//! - A waiter waits under the client's waiting lease of 3 s (when the lock's TTL is
//!   longer; its key moves there, keeping its create revision): one lease shared by
//!   every waiter of the client, kept alive every second while any is on it and revoked
//!   once none has been for two seconds. So a waiter whose process dies holds up the
//!   queue for seconds, not for the lock's TTL, and waiting costs no lease grant or
//!   revoke of its own. A mutex or election waiter is granted on that lease (valid
//!   until the send time of its last answered keep-alive plus 3 s, less the margin),
//!   and its key moves back to a lease of the lock's TTL once the grant has been held
//!   for a second, or when an extend asks: to the lease granted for it while two thirds
//!   of that lease's TTL are left, else to a fresh one; the validity deadline is then
//!   that lease's. So the move is off the hand-off's path, and a lock held briefly
//!   never moves: its release is one delete of its key (the shared lease is never
//!   revoked for one contender; a failed or dropped acquire deletes its key too). A
//!   release while the move is under way deletes the key by its create revision; an
//!   extend waits for the move. A waiter rides out retryable errors (a member going
//!   away, a leader election) in its place for at most the options' error patience
//!   ([`distlock_api::LockOptions::error_patience`]); past it, the attempt ends (its
//!   key goes) and the acquire is retried, or fails, as on every backend.
//! - An acquire (that may wait) of a key whose last acquire by this client found it
//!   held puts its key straight on the waiting lease (named by an id of its own),
//!   granting no lease of the lock's TTL first: a contended cycle is then two raft
//!   writes (the put and, at the release, the delete) instead of six. Found free all
//!   the same, the grant is a parked one, as a waiter's: valid for the waiting lease's
//!   3 s until its key moves to a fresh lease of the lock's TTL a second later. An
//!   acquire that finds the key free clears the hint, so an uncontended key always gets
//!   its own lease at once.
//! - **release** of a lock this client holds is one lease revoke: the lease carries
//!   that key alone, so etcd deletes the key in the same raft entry, and the lock is
//!   free for others when the release returns. When the lease is gone (it ran out, or
//!   was revoked from outside), when the loss watch saw the key deleted, or for a lease
//!   another client took, the release deletes the key if its create revision is still
//!   the one the lease records (in its owner token; for the mutex it is also the
//!   fencing token) in one transaction, then revokes the lease. A key that is
//!   gone reads `Expired`, or `HeldByOther` while another contender is in the range.
//!   (A key deleted from outside, by `etcdctl del`, within the loss watch's delay,
//!   under a millisecond, before a release reads `Released`: the revoke cannot tell.)
//! - **extend** by up to the lease's own TTL is a lease keep-alive (with a check, in the
//!   same round trip, that the key is still ours); by another TTL it grants a lease of
//!   that TTL, moves the key to it in a transaction guarded by the create revision (the
//!   revision, hence the token and the queue place, stays), and revokes the old lease.
//! - **try-acquire** (and `NoWait`) revoke their lease again when they do not hold.
//!
//! # Leader election
//! [`EtcdLock::election`] is the mutex's recipe in the range
//! [`election_prefix`] (`P/+election/<encode_key(name)>/`, which no lock's range
//! covers), with the candidate's identity as the contender key's value: the layout of
//! etcd's `concurrency.Election`. The oldest key leads, its create revision is the term,
//! and [`distlock_api::LeaderElection::leader`] reads the oldest key's value, create
//! revision and lease TTL left; observers wait on an etcd watch of the range. See
//! [`EtcdLock::election`].
//!
//! # Semaphore and read-write lock
//! Both are the mutex's recipe with another rule of which older contenders keep a
//! contender waiting, in namespaces of their own under the prefix (`+semaphore`,
//! `+rw`: no key encodes to a name with `+`, so they never meet a mutex's range).
//! Leases, keep-alives, the loss watch, validity deadline, release (one revoke),
//! extend and leaving nothing behind are the mutex's. So is the fencing token of a grant at once (the key's create
//! revision), but not of a grant after a wait: several waiters can be granted by the
//! same deletion and learn it in any order. A waiter marks its grant pending
//! (`P/+semaphore-pending/<K>/<revision>` or `P/+rw-pending/<K>/<revision>`, under its
//! lease); once granted, and once no older contender's marker is left, it writes its
//! marker again (that write's revision is its token) and deletes it as the acquire
//! returns. Grants thus stamp in queue order, each after the one before it returned,
//! and every grant's token is above that of every grant learned before it on the key.
//! A marker whose deletion was lost goes with its grant's release or lease (holding
//! back the next waiter's stamp till then).
//!
//! A semaphore waiter parks on the short waiting lease as a mutex waiter does, but its
//! key moves back before the grant (its stamp is written under the lock's lease): with
//! room for one permit in the transaction that finds the turn ours, with more in a
//! second request (a range compare cannot count).
//! Foreign keys of another shape ahead of ours, in a primitive's range or among the
//! pending markers, are configuration errors, as in a lock's range.
//!
//! - [`EtcdLock::semaphore`]: contenders put
//!   `P/+semaphore/<K>/<lease id in hex>` holding `distlock:permits=<max>`; the `max`
//!   oldest hold a permit. A waiter counts down the contenders ahead as a mutex
//!   waiter does, except one parked on the waiting lease: it watches the `max` youngest
//!   contenders older than its own (it can be granted only once one of them goes), so
//!   no deletion wakes the whole queue; permits pass on in FIFO order. An acquire whose count differs from
//!   one recorded by the oldest contenders is
//!   [`distlock_api::LockError::PermitMismatch`] and leaves nothing behind. etcd has
//!   no semaphore recipe of its own.
//! - [`EtcdLock::rw_lock`]: the key layout of etcd's
//!   `recipes.RWMutex`: readers put `P/+rw/<K>/read/<id>` and writers
//!   `P/+rw/<K>/write/<id>`; a writer waits for every older key, a reader for every
//!   older writer (writer preference, FIFO), so a Go `recipe.NewRWMutex(session,
//!   "P/+rw/<K>")` and ours exclude each other. Because that recipe ranks by mod
//!   revision, a read-write waiter waits under its lock's own lease (not the short
//!   waiting lease, whose move would write the key again), and an extend beyond the
//!   lock's TTL, which moves the key to a new lease, is unsafe beside Go contenders
//!   (see [`EtcdLock::rw_lock`]).
//!
//! # Leases and fencing
//! The validity deadline is the send time of the lease grant (or of the last keep-alive
//! answered before the grant) plus the TTL less a margin (1 % + 2 ms); for a waiter
//! granted on its waiting lease, that lease's until its key has moved (see above). One
//! watch per client over the prefix (which also feeds its waiters) marks a held lock
//! lost as soon as its key is deleted: the lease expired, was revoked (`etcdctl lease
//! revoke`), or the key was deleted from outside; a lock lost by its deadline has its
//! lease revoked at once. The
//! mutex's fencing token is the key's create revision (for the other primitives, see
//! above): etcd's revision is one counter for the
//! whole cluster, kept through leader elections and restarts, so tokens rise across all
//! of them.
//!
//! A restart of etcd (one node, or every member of a cluster) keeps keys, leases and
//! the revision, but not a lease's remaining TTL: the leader elected afterwards
//! refreshes every lease to its full TTL (measured in
//! `tests/fault_conformance.rs`). So etcd's expiry only moves later than the holder's
//! validity deadline, never earlier: a holder whose keep-alives resume before its
//! deadline keeps its lock; one cut off past it sees `lost()` at the deadline, and its
//! key (unless its revoke got through) stays up to a full TTL after etcd is back,
//! which waiters wait out.
//!
//! etcd grants no lease shorter than 1.5 × its election timeout, rounded up to whole
//! seconds (2 s with the default 1 s election timeout); asking for less is
//! [`distlock_api::LockError::InvalidOptions`] and leaves nothing behind. A TTL that is
//! not a whole number of seconds is rounded up on the server (the lock may outlive an
//! unrenewed lease by under a second; the validity deadline uses the TTL asked for).
//!
//! # Leaving nothing behind
//! Every lease this client grants is listed until revoked. A dropped acquire revokes
//! its lease (and with it its key) in the background; so does a dropped guard. If the
//! runtime shuts down first (a program exiting while it waits), a task spawned at
//! connect revokes every listed lease from a fresh connection as the runtime drops it,
//! within a second. A process killed outright leaves its keys until their lease's TTL.
//!
//! # Connecting
//! [`EtcdLock::connect`] connects and reads the prefix once. A refused or silent port,
//! a member without a leader and other unavailability are retried, with jittered
//! backoff, until the connect timeout ([`EtcdConfig::connect_timeout`], default 5 s) has
//! passed; then the connect fails with the last reason, naming the endpoints and the
//! cause in words ("connection refused"; the driver's error is the `source()`).
//! Refused credentials, a connection that opened and broke before etcd answered (TLS
//! on one side only, a refused TLS handshake) and a server of another kind fail at
//! once.

// docs.rs (`--cfg docsrs`, nightly) shows which feature each gated item needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod ahead;
mod config;
mod election;
mod engine;
mod error;
mod keys;
mod lock;
mod loss;
mod ranges;
mod recipe;
mod rw;
mod semaphore;
mod session;

pub use config::{parse_url, EtcdConfig, EtcdUrl, TlsFiles, DEFAULT_PORT, DEFAULT_PREFIX};
pub use keys::{
    election_prefix, encode_key, lock_prefix, ELECTION_SEGMENT, RW_SEGMENT, SEMAPHORE_SEGMENT,
};
pub use lock::EtcdLock;
pub use semaphore::PERMITS_VALUE_PREFIX;

/// The driver this backend is built on.
pub use etcd_client;

/// The backend's name in errors and reports.
pub const ETCD_BACKEND: &str = "etcd";
