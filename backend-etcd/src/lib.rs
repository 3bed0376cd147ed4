//! The etcd backend of distlock: etcd's own `concurrency.Mutex` recipe, so that
//! distlock, `etcdctl lock NAME` and Go services locking with `concurrency.NewMutex`
//! exclude each other on one name; lease TTLs kept alive by the guard's watchdog; the
//! holder key's create revision as fencing token. Leader election
//! ([`EtcdLock::election`]) is etcd's `concurrency.Election` on the same machinery, so
//! `etcdctl elect` and Go's `concurrency.NewElection` campaign with distlock. A
//! semaphore ([`EtcdLock::semaphore`]) and a read-write lock ([`EtcdLock::rw_lock`],
//! in the layout of etcd's `recipes.RWMutex`) on the same recipe.
//!
//! Like a Go service's `concurrency.Session`, a client puts all its keys of one TTL
//! under one lease, kept alive by one task, so that an uncontended acquire and release
//! is two raft writes (the put, the delete), not a lease grant and revoke besides
//! (see "Leases and fencing").
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
//! - **acquire** puts `P/<K>/<client id>-<slot>` (in hex: key layout 2, see "Key
//!   names") under the client's shared lease of the options' TTL (see "Leases and
//!   fencing"),
//!   in a transaction that creates it only if absent (`CreateRevision == 0`) and, in
//!   the same round trip, finds the range empty (a range compare: then ours holds, and
//!   nothing is read back; not for a key this client last found held) or reads the
//!   oldest contenders. Contenders are ranked by create revision; the oldest holds
//!   the lock. That is exactly `concurrency.Mutex`, so foreign contenders in the range
//!   (an `etcdctl lock`, a Go service) count, and ours count for them. A key ahead of
//!   ours that does not have a contender's shape (named as ours are, or by a lease id
//!   in lowercase hex, and attached to a lease) is another tool's data under this
//!   prefix, which may never go: the acquire fails with
//!   [`distlock_api::LockError::Config`] naming it, and deletes its key.
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
//!   for a second, or when an extend asks: to the client's shared lease of the lock's
//!   TTL. So the move is off the hand-off's path, and a lock held briefly never moves.
//!   A release while the move is under way deletes the key wherever it is, as every
//!   release does (a move that lands after it fails its create-revision compare); an
//!   extend waits for the move. A waiter rides out retryable
//!   errors (a member going away, a leader election) in its place for at most the
//!   options' error patience
//!   ([`distlock_api::LockOptions::error_patience`]); past it, the attempt ends (its
//!   key goes) and the acquire is retried, or fails, as on every backend.
//! - An acquire (that may wait) of a key whose last acquire by this client found it
//!   held puts its key straight on the waiting lease, sparing the move there: a
//!   contended cycle is then two raft writes (the put and, at the release, the delete).
//!   Found free all the same, the grant is a parked one, as a waiter's: valid for the
//!   waiting lease's 3 s until its key moves to the lease of the lock's TTL a second
//!   later. An acquire that finds the key free clears the hint.
//! - **release** of a grant this client records is one plain delete of its key by name
//!   (asking for the deleted key back), as etcd's own `Mutex.Unlock` and etcd-client's
//!   `unlock()` delete theirs: the name is reserved to the grant while the client
//!   records it (see "Key names"), so no other contender's key can be there, and the
//!   deleted key's create revision is checked against the one the grant records (in
//!   its owner token; for the mutex it is also the fencing token). A release of a grant
//!   the client does not record (a lease released twice) is a transaction that deletes
//!   the key only if its create revision is still that one, since the name may serve a
//!   later contender by then. One raft write either way, and the lock is free for
//!   others when the release returns. The shared lease is never revoked for one lock.
//!   A key that is gone (or, never seen, another incarnation of the name) reads
//!   `Expired`, or `HeldByOther` while another contender is in the range. Not a
//!   transaction because etcd 3.4 serves each transaction from a copy of the writes its
//!   backend has not yet committed: under load a delete in a transaction cost the
//!   server about 1.5 times a plain one (see `Requests::delete_reserved`).
//! - **extend** by up to the TTL of the lease the key is on is a keep-alive of that
//!   lease (with a check, in the same round trip, that the key is still ours); by a
//!   longer TTL it moves the key to the client's lease of that TTL in a transaction
//!   guarded by the create revision (the revision, hence the token and the queue place,
//!   stays). Either way the grant's own deadline is the new TTL from the extend.
//! - **try-acquire** (and `NoWait`) delete their key again when they do not hold.
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
//! Leases, keep-alives, the loss watch, validity deadline, release (one delete),
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
//!   `P/+semaphore/<K>/<name>` holding `distlock:permits=<max>`; the `max`
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
//!   revision, a read-write waiter waits under its lock's TTL's lease (not the short
//!   waiting lease, whose move would write the key again), and an extend beyond the
//!   lock's TTL, which moves the key to a new lease, is unsafe beside Go contenders
//!   (see [`EtcdLock::rw_lock`]).
//!
//! # Key names
//! Key layout 2 (this release): a client names its contender keys `<client id>-<slot>`
//! in hex, the client id drawn at random when it connects, the slot the lowest one
//! none of its live contenders uses, so a lock taken again and again by one client
//! puts a key of the same name each time, as a Go `concurrency.Mutex` on one session
//! (named by its lease) does. etcd keeps every name ever written in its index as a dead
//! revision until a compaction (none by default), and a read of a range, as every
//! acquire's check that the range is empty, walks them all: with a fresh name per
//! acquire (layout 1, releases before this one), each acquire left one more and made
//! the next slower (about 55 ns of server time per dead name on the bench host). A
//! range now holds about as many names as its clients had contenders at once, plus one
//! per contender whose key's end was not confirmed (a put never answered, a failed
//! deletion), whose name is never used again.
//!
//! A name serves one key after another, so a deletion is matched to the key it ends by
//! revision: a deletion at revision `D` ends only a key of that name created before
//! `D`, and a key read back with another create revision than ours means ours is gone,
//! in the loss watch, a waiter's count-down and the watch of one key. A name is reused
//! only once nothing of its client can write it again (its release, or its abandoned
//! key's deletion after its put was answered). Every other write to a key is guarded
//! by its create revision, but the release of a grant the client records: the name is
//! then the grant's alone, and the release deletes it by name (see above).
//!
//! **Mixed versions.** Clients of layout 1 matched deletions by name alone, so one of
//! them waiting behind a reused name could take its former key's deletion for its
//! current one's and hold beside it. The `-` keeps that from happening: to a layout-1
//! client a layout-2 key is not a contender's shape, and its acquire fails with
//! [`distlock_api::LockError::Config`] naming the key rather than queue behind it
//! (while layout-2 clients queue behind layout-1 keys as behind any contender). So old
//! and new clients still exclude each other, but old ones fail their acquires while new
//! ones are in the range: move every client of a prefix to this release together.
//! `etcdctl lock`/`elect` and Go's recipes do not read names, and each of them waits
//! for a deletion from the revision it read at, then reads again, which reuse does not
//! mislead.
//!
//! # Leases and fencing
//! A client keeps one etcd lease per TTL in use (in whole seconds, rounded up), as a Go
//! service keeps a `concurrency.Session` of a TTL: every key of that TTL, held or
//! waiting, is put under it. One task per lease keeps it alive every third of its TTL
//! while any key or acquire of the client uses it, and revokes it once none has for two
//! seconds. A lock's TTL keeps its meaning:
//!
//! - **validity deadline**: the grant's send time (or, after a wait, the moment the
//!   turn was seen ours; or the last extend's send time) plus the TTL, less a margin
//!   (1 % + 2 ms), but never later than the send time of the lease's last answered
//!   keep-alive plus the lease's TTL, less the margin: etcd keeps the key at least
//!   until then. Each keep-alive moves that bound on, so a grant is valid for its whole
//!   TTL once the lease's next keep-alive (a third of the TTL at most) has answered. A
//!   parked grant is valid as long as the waiting lease until its key has moved (see
//!   above).
//! - **a deadline passed unrenewed**: the client deletes the key at once (the lease
//!   lives on for the client's other keys), and the next contender is granted.
//! - **a frozen, killed or cut-off client**: its keep-alives stop, and etcd deletes every
//!   key on the lease one TTL (rounded up, plus the leader's 500 ms expiry sweep) after
//!   the last keep-alive it answered: within the TTL of the client stopping, which is
//!   as soon as a per-lock lease renewed by a watchdog would go. A lock left unrenewed
//!   on purpose and frozen near its deadline may therefore stay up to one TTL past it
//!   (a lease of its own would go at the deadline); the holder, frozen, cannot act on
//!   it, and its validity deadline has passed, so safety does not depend on it.
//!
//! One watch per client over the prefix (which also feeds its waiters) marks a held
//! lock lost as soon as its key is deleted: the lease expired, was revoked (`etcdctl
//! lease revoke`, which takes every lock of the client on that lease), or the key was
//! deleted from outside. The
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
//! not a whole number of seconds is rounded up for the lease (the validity deadline
//! uses the TTL asked for).
//!
//! # Leaving nothing behind
//! Every lease this client grants is listed until revoked. A dropped acquire deletes
//! its key in the background; so does a dropped guard. A shared lease is revoked two
//! seconds after its last use. If the runtime shuts down first (a program exiting while
//! it waits), a task spawned at connect revokes every listed lease (and with them
//! every key) from a fresh connection as the runtime drops it, within a second. A
//! process killed outright leaves its keys until their lease's TTL.
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
