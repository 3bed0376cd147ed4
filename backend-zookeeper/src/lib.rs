//! The ZooKeeper backend of distlock: Curator-compatible ephemeral-sequential locks,
//! predecessor watches, a lease that is the ZooKeeper session, and the lock node's
//! `czxid` as fencing token.
//!
//! ```no_run
//! # async fn demo() -> Result<(), distlock_api::LockError> {
//! use std::time::Duration;
//! use distlock_api::{LockKey, LockOptions, WaitPolicy};
//! use distlock_zookeeper::ZooKeeperLock;
//!
//! let client = ZooKeeperLock::connect("zookeeper://zk1:2181,zk2:2181,zk3:2181/app").await?;
//! let key = LockKey::new("invoices/2026-11")?;
//! let options = LockOptions::new(Duration::from_secs(30))
//!     .with_wait(WaitPolicy::Timeout(Duration::from_secs(5)));
//! let guard = client.lock().acquire(&key, &options).await?;
//! // Send guard.fencing_token() (the lock node's czxid) with every protected write.
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! [`ZooKeeperLock`] is the backend's [`distlock_api::backend::Engine`]: one session
//! for every primitive. [`ZooKeeperLock::client`] gives the [`distlock_api::Client`],
//! and [`ZooKeeperLock::lock`], [`ZooKeeperLock::semaphore`],
//! [`ZooKeeperLock::rw_lock`] and [`ZooKeeperLock::election`] its four primitives. The
//! options, the bounded wait and the retries of errors are `distlock_api`'s, the same
//! on every backend; this crate contends natively (watches) up to the wait's deadline.
//!
//! # Protocol
//! Lock key `K` has the lock directory `[chroot]/distlock/{encode_key(K)}` (see
//! [`encode_key`] for the injective, path-safe encoding, and
//! [`ZooKeeperConfig::base_path`]). Its ancestors are created on demand as **container
//! nodes**, which the server deletes once they are empty.
//!
//! - **acquire** creates an ephemeral-sequential contender node
//!   `_c_<guid>-lock-<sequence>` in the directory. The contender with the lowest
//!   sequence holds the lock. The create is one multi transaction with an empty
//!   `setData` on the directory, whose returned `Stat` says how many children the
//!   directory has right after our create: one means we hold the lock, so an
//!   uncontended acquire is a single round trip (the same as a bare create). Otherwise
//!   the client lists the directory. (Should the directory's ACL refuse the write, a
//!   plain create is pipelined with the listing instead.)
//! - A contender that does not hold the lock sets a data watch on the **next lower**
//!   node only, so a release wakes exactly one waiter (no herd effect) and the lock
//!   passes on in FIFO order of arrival. When the watch fires the waiter lists again:
//!   the predecessor may have been a waiter that gave up.
//! - **release** deletes the node. The client does not resend a request that a dropped
//!   connection cut off, so such a delete is retried (the node found by its GUID) once
//!   the session has reconnected, within the request timeout; should that fail too, the
//!   release returns the connection error and the node is removed in the background as
//!   soon as the server answers again (or goes with the session): a failed release
//!   never leaves the lock to a session that lives on. **extend** sends a `sync` and, right behind it,
//!   checks that the node still exists with the lease's `czxid`, owned by our live
//!   session (see *Lease* below).
//! - **try-acquire** (and `NoWait`) create, look, and delete their node again if they
//!   do not hold the lock.
//!
//! # Curator interoperability
//! The `<guid>` is the lease's owner token written as a UUID, so contender names have
//! exactly the layout of Apache Curator's protected nodes (`ProtectedUtils`) and its
//! `InterProcessMutex` (lock name `lock-`, ordered by the digits after the last
//! `lock-`). A Java service using `new InterProcessMutex(client, dir)` on the same
//! directory ([`ZooKeeperLock::lock_dir`]) and a Rust service using this crate exclude
//! each other and queue fairly together.
//!
//! kazoo's `Lock` names its contenders `<uuid>__lock__<sequence>`; those are ranked by
//! their sequence too ([`lock_sequence`]), and the server numbers every sequential node
//! of a directory in one series, so kazoo, Curator and this crate exclude each other on
//! one directory (kazoo sees ours when given `extra_lock_patterns=["-lock-"]`). Children
//! without a `lock-<digits>` or `__lock__<digits>` suffix are ignored (Curator would
//! sort them by name).
//!
//! The GUID also makes creates safe to retry: after a `ConnectionLoss` during the
//! create, the client lists the directory and looks for its own GUID before it creates
//! anything again (the create may have been applied), and a lease can be released by
//! any client that has it, even after a reconnect.
//!
//! # Semaphores and read-write locks
//! [`ZooKeeperLock::semaphore`] and [`ZooKeeperLock::rw_lock`] give the other two
//! primitives on the client's session, in the node layouts of Curator's
//! `InterProcessSemaphoreV2` (at [`ZooKeeperLock::semaphore_path`]: a guard
//! `InterProcessMutex` in `path/locks`, one `_c_<guid>-lease-<seq>` node per permit in
//! `path/leases`) and `InterProcessReadWriteLock` (at [`ZooKeeperLock::rw_path`]:
//! `_c_<guid>-__READ__<seq>` and `_c_<guid>-__WRIT__<seq>` nodes ranked together; a
//! reader is blocked only by older writers, so writers are preferred in arrival order).
//! A Java service using those recipes on the same paths shares permits and locks with
//! us. They reuse the mutex's machinery: the contender creation (one round trip, GUID
//! lookup after a lost connection), the drop-guard clean-up, the lease that is the
//! session, release and extend. Tokens are the grant's node's `czxid`; see
//! [`ZooKeeperLock::semaphore`] and [`ZooKeeperLock::rw_lock`] for what they mean there
//! and how a mismatched permit count is detected.
//!
//! # Leader election
//! [`ZooKeeperLock::election`] gives a [`distlock_api::LeaderElection`] on the client's
//! session, in the node layout of Curator's `LeaderLatch` (at
//! [`ZooKeeperLock::election_path`], `[chroot]{base_path}/.election/{encode_key(name)}`):
//! candidates are ephemeral-sequential `_c_<guid>-latch-<seq>` nodes whose data is the
//! candidate's identity; the lowest sequence leads, each other candidate watches the next
//! lower node. A Java `new LeaderLatch(client, path, id)` on that path campaigns with us,
//! and each side reads the other's identity. The term is the leader node's `czxid`; the
//! lease is the session (crash failover: the session timeout, rounded up to the server's
//! tick); observers wait on a child watch. See [`ZooKeeperLock::election`].
//!
//! # Security
//! - **TLS**: `zookeeper+tls://…?ca=PATH[&cert=PATH&key=PATH]` (feature `tls`) connects
//!   to the servers' `secureClientPort` through rustls, trusting the CAs in the PEM file
//!   `ca` (and only those) and checking that a server's certificate names the URL's host;
//!   `cert`/`key` present a client certificate to servers that ask for one. The files
//!   are read once, at connect: a missing or invalid one is a
//!   [`distlock_api::LockError::Config`] naming it. A failed handshake is a connection
//!   error.
//! - **Digest credentials**: `user:password@` in the URL. Each session authenticates with
//!   `addauth digest user:password` as soon as it is established (and the client repeats
//!   it on every reconnect), and every node the client creates (missing ancestors of the
//!   base path, lock directories, contenders) gets the ACL *creator ALL, world READ*:
//!   anyone may list the contenders and read the holder ([`distlock_api::DistributedLock::inspect`]
//!   needs no credentials), but ZooKeeper checks a node's parent for creating and
//!   deleting children, so only that identity (same user, same password) can contend
//!   for, release or remove a lock there. Anyone else gets a
//!   [`distlock_api::LockError::Config`] (`NoAuth`, not retryable) at once, and leaves
//!   nothing behind. Clients that share a lock must share its credentials; services with
//!   different identities use different chroots or base paths.
//! - **Without credentials** nodes get the open ACL (`world:anyone` ALL), as ZooKeeper's
//!   and Curator's defaults: an unauthenticated client works as it always did. The ACL
//!   protects only nodes this client creates: in a directory an open client made, anyone
//!   may delete contenders.
//!
//! # Sessions
//! One ZooKeeper session serves every lock and waiter of a [`ZooKeeperLock`] and its
//! clones. The session timeout asked for ([`ZooKeeperConfig::session_timeout`], or
//! `?session_timeout_ms=` in the URL) is negotiated by the server; the negotiated value
//! is read back ([`ZooKeeperLock::session_timeout`]) and used everywhere below. An
//! expired session is never resumed: the next operation opens a new one.
//!
//! The client works with session timeouts from [`MIN_SESSION_TIMEOUT`] (500 ms) to
//! [`MAX_SESSION_TIMEOUT`]: asking for one outside that range, or a server granting
//! less than the minimum, is a [`distlock_api::LockError::Config`], on every run.
//! Connection errors name the servers of the URL (`ZooKeeper at h1:p1,h2:p2: …`).
//!
//! # Lease, loss and fencing
//! - **The lease is the session.** A lock is held until it is released or its session
//!   ends, whatever TTL the options ask for: the capabilities report `ttl_expiry`
//!   unsupported. **Liveness bound:** a crashed or cut-off holder keeps its locks until
//!   the server expires its session, the negotiated session timeout after it last
//!   heard from it (rounded up to the server's tick). The options' TTL is kept in the
//!   lease and only sets the auto-renew watchdog's cadence (TTL/3).
//! - **Validity.** The guard's deadline is `t + session timeout`, where `t` is when the
//!   last request the server answered on that session was sent: the server heard from
//!   us after `t`, so it cannot expire the session before then. While locks are held a
//!   per-session task sends a `sync` (which goes through the leader) every third of the
//!   session timeout and pushes every lease's deadline forward, so no auto-renew is
//!   needed to keep a lock; the same beat reads all held nodes in one multi-read.
//!   **extend** proves the session alive *and* the node present and pushes the
//!   deadline the same way (the TTL it is given only has to be valid), so the
//!   auto-renew watchdog adds a periodic check of the node.
//! - **Three states.** A disconnect makes the session's leases *suspect*; a reconnect
//!   within the session makes them *held* again at the next `sync`. Session expiry (or
//!   close) makes them *lost* and fires `lost()` at once, and so does a held lock node
//!   found deleted (by an operator) at the next beat. Without any news, a lease whose
//!   deadline passes reads lost on the client's clock, before the server can have
//!   expired the session.
//! - **Fencing token: the lock node's `czxid`**, the zxid of the transaction that
//!   created it. It is 64-bit and totally ordered across the ensemble; contenders of a
//!   key are granted in creation order, so tokens strictly increase with every grant,
//!   across expiry takeovers and even after the container directory was deleted and
//!   recreated. (The sequence suffix is not a token: it is per directory and 32-bit.)
//!   On the fast path it is read as the directory's `mzxid` from the same transaction,
//!   which equals our node's `czxid` (a create's own `Stat` inside a multi is not
//!   reliable before ZooKeeper 3.8.2, ZOOKEEPER-4026).
//!
//! # Cancel-safety
//! Until a grant is handed out, an acquire holds a drop guard. Dropping the acquire
//! future at any await point (or giving up after an error or a timeout), wherever it
//! is dropped, spawns on the session's runtime a task that lists the directory through
//! the same session and
//! deletes every node with our GUID. Because it is sent after the create, it also
//! catches a create whose reply was still in flight. It retries through connection
//! trouble until it succeeds or the session ends, which removes the ephemeral node
//! anyway: an orphaned contender never outlives our session. Waiters that give up
//! delete their own node before returning.
//!
//! Background tasks do not outlive their runtime: when the runtime that opened a
//! session shuts down (a program returning from `main`, or `distlock exec` exiting on
//! a signal, while an acquire waits), tokio drops them unfinished. So as the runtime
//! shuts down, the leases held on the session are marked lost and the session is
//! closed on the server from a fresh connection, waiting at most 1 s: its contender
//! nodes and locks go at once, and a waiter that died never holds up the queue behind
//! it until its session times out. (A process killed with `-9` cannot do this: its
//! nodes go at session expiry.)
//!
//! # Why not `zookeeper-client`'s own lock recipe
//! `zookeeper_client::Client::lock(LockPrefix::new_curator(dir, "lock-"), …)` implements
//! the same Curator-compatible recipe (protected names, predecessor watch, GUID lookup
//! after `ConnectionLoss`, a drop guard). This crate builds beside it, on the same
//! client, because:
//! - it generates its own random UUID, so the GUID cannot be the lease's owner token,
//!   and it drops the create's `Stat`, so the fencing `czxid` would cost another round
//!   trip;
//! - it only waits forever (no deadline, no try-once): a `NoWait` or zero-timeout try
//!   built by cancelling it cannot tell "held" from "granted just now";
//! - it creates, then lists in a second round trip; our multi (create + directory
//!   `Stat`) makes an uncontended acquire one request and one round trip;
//! - it treats only `ConnectionLoss` as an uncertain create (the client reports a reset
//!   connection as an I/O error), retries with no backoff, and its lock handle borrows
//!   the client, which does not fit a [`distlock_api::LockGuard`] that outlives the call.
//!
//! The node layout, ordering and watch strategy are the same, so locks taken through
//! either exclude each other (a test checks this).
//!
//! # Caveats
//! - A holder whose session survives a long partition can be reported lost by its own
//!   clock (conservative) while the server still has its node; the guard's drop or
//!   release then deletes the node.
//! - ZooKeeper 3.5 or later is needed (container nodes, `create2`).
//! - Without credentials, nodes are created with the open ACL (`world:anyone`), as
//!   Curator's defaults; the GUIDs in node names are readable by anyone who can list
//!   the directory, and a lease's GUID is all it takes to release it (with credentials,
//!   only for a client of the same identity: see *Security*).
//! - Every acquire writes the lock directory's (empty) data, so its data version
//!   counts acquires; nothing, Curator included, reads it.
//!
//! # Connecting
//! A session is opened with one pass over the connect string's servers per attempt. A
//! pass that no server answered is explained by asking each server `srvr` (which
//! ZooKeeper answers from the moment it listens): a refused or silent port, a server
//! not serving requests yet and a handshake that failed are retried, with jittered
//! backoff, until the connect timeout ([`ZooKeeperConfig::connect_timeout`]; by default
//! the session timeout, 10 s unless `?session_timeout_ms=` says otherwise) has passed;
//! then the connect fails with the last reason in words. A server that is not
//! ZooKeeper (a [`distlock_api::LockError::Config`]), a `+tls` URL at a plaintext port
//! and a plaintext URL at a TLS port (both [`distlock_api::LockError::Connection`])
//! fail at once. A TLS handshake that a TLS port refuses (a CA that did not sign the
//! server's certificate) cannot be told from a server not serving yet, so it is
//! retried until the timeout and the message says what to check.

// docs.rs (`--cfg docsrs`, nightly) shows which feature each gated item needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

mod config;
mod election;
mod engine;
mod error;
mod keys;
mod lock;
mod probe;
mod recipe;
mod rw;
mod security;
mod semaphore;
mod session;
mod shutdown;

pub use config::{
    parse_url, ZooKeeperConfig, ZooKeeperUrl, DEFAULT_PORT, MAX_SESSION_TIMEOUT,
    MIN_SESSION_TIMEOUT,
};
pub use keys::{
    decode_key, encode_key, lock_sequence, owner_guid, owner_of, KAZOO_LOCK_NAME, LATCH_NAME,
    LEASE_NAME, LOCK_NAME, PROTECTED_PREFIX, READ_NAME, WRITE_NAME,
};
pub use lock::ZooKeeperLock;
pub use security::{Credentials, TlsFiles};
pub use semaphore::PERMITS_DATA_PREFIX;
/// The driver this backend is built on, re-exported so its types (for example in error
/// sources) can be named without a separate dependency on a matching version.
pub use zookeeper_client;

/// The backend name, in errors and reports.
pub const ZOOKEEPER_BACKEND: &str = "zookeeper";
