//! The MySQL/MariaDB backend of distlock: `GET_LOCK` user locks multiplexed over a few
//! sessions, with server-side waiting, client-enforced leases, loss detection and a
//! durable per-key fencing counter.
//!
//! ```no_run
//! # async fn demo() -> Result<(), distlock_api::LockError> {
//! use std::time::Duration;
//! use distlock_api::{LockKey, LockOptions, WaitPolicy};
//! use distlock_mysql::MySqlLock;
//!
//! let locks = MySqlLock::connect("mysql://app:secret@db.internal/app").await?;
//! let key = LockKey::new("invoices/2026-11")?;
//! let options = LockOptions::new(Duration::from_secs(30))
//!     .with_wait(WaitPolicy::Timeout(Duration::from_secs(5)));
//! let guard = locks.lock().acquire(&key, &options).await?;
//! // Send guard.fencing_token() with every write the lock protects.
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! [`MySqlLock`] is this backend's [`distlock_api::backend::Engine`]: one client (its
//! sessions) for every primitive. [`MySqlLock::client`] gives it as a
//! [`distlock_api::Client`]; [`MySqlLock::lock`], [`MySqlLock::semaphore`] and
//! [`MySqlLock::election`] give each primitive over the same sessions. The read-write
//! lock is refused with [`distlock_api::LockError::Unsupported`]: `GET_LOCK` is
//! exclusive only. No lease outlives its client (`outlives_client` is unsupported).
//!
//! # Protocol
//! A lock key `K` is the user lock [`lock_name`]`(K)`: `dl:K` for keys of at most 61
//! lowercase ASCII letters, digits and `_ - . / :`, else `dl#` and 60 hex digits of
//! SHA-256 of `K` (names are at most 64 characters, and MySQL compares them
//! case-insensitively, so every name is lowercase and the mapping is injective). A
//! client keeps two kinds of sessions (connections), each owned by one task that runs
//! its statements in order:
//! - **shared sessions** (at most [`MySqlConfig::shared_sessions`], default 10) carry
//!   every grant that does not wait, and its release: `IF(IS_USED_LOCK(n) IS NULL,
//!   GET_LOCK(n, 0), 0)` (with the token, see Fencing). A session never asks
//!   for a name in use, its own included: `GET_LOCK` on the session that holds the
//!   lock succeeds again (a count), so two local grants of one key must not meet on
//!   a session. Any number of held locks share these sessions.
//! - **dedicated sessions** (at most [`MySqlConfig::wait_sessions`], default 16): an
//!   `acquire` whose key is held waits in `GET_LOCK(n, t)` on a session of its own,
//!   where `t` is the time left of its wait policy, capped at
//!   [`MySqlConfig::session_timeout`] per statement (then it waits again). The timeout
//!   is never infinite (MariaDB spells infinity `0xFFFFFFFF`, MySQL `-1`). The server
//!   wakes a waiter on the release; the session then holds that lock until it ends.
//!
//! Release is `RELEASE_LOCK(n)` on the session that holds the lock; extend proves the
//! session alive with a round trip. Owner checks are done by the client: it knows
//! which session holds which owner token, and a session can only release its own
//! locks. A server connection is never reused while it may hold a lock it does not
//! know of: a session whose state is unknown (a reply timed out, a wait was abandoned)
//! is closed, and an abandoned wait's session is also killed from another connection
//! (`KILL CONNECTION id`: a server blocked in `GET_LOCK` does not notice its client
//! leaving), which ends its wait or the lock it was just granted.
//!
//! # Lease and loss
//! - **TTL.** The holding client releases a lease at `acquired_at + TTL` unless
//!   extended, and the guard's `lost()` fires then. So a hung task loses its lock
//!   after one TTL. When the TTL timer fires a second or more late, the whole process
//!   was paused: the lease is lost at once, but the release waits up to a second for
//!   the holder's own, which then reports `Released`.
//! - **Session.** Every session runs with `wait_timeout` =
//!   [`MySqlConfig::session_timeout`] (default 10 s). A session holding locks sends a
//!   heartbeat every [`MySqlConfig::heartbeat`] (default 2 s) when nothing else ran. A
//!   frozen, paused or silently cut-off holder stops sending, and the server closes its
//!   session, freeing its locks, at most [`MySqlConfig::dead_holder_bound`] after its
//!   last round trip. A crashed process's connection closes and its locks are freed at
//!   once.
//! - **Validity.** The guard's validity deadline is the earlier of the TTL deadline and
//!   the session's last proof of life + `session_timeout` (less 1 % + 2 ms). For a
//!   grant that waited, the lease starts at the grant as timed by the server.
//! - **Suspect and lost.** A reply slower than the heartbeat period marks every lease
//!   of the session suspect; a failed or timed-out round trip ends the session and
//!   marks every lease on it lost (a `KILL`, a restart, a cut connection). That death
//!   frees the lock on the server at once, so another client can take it before this
//!   one notices: fence your writes.
//!
//! # Fencing
//! Every grant takes its token in the statement that takes the lock (after `GET_LOCK`
//! returned 1: while the lock is held, on the session holding it, before `acquire`
//! returns): the server run's epoch times 2^44 plus the count of `UUID_SHORT()` values
//! handed out since the run began (a server-global counter under a mutex). The epoch is
//! the one durable write: the first session after a server start finds the MEMORY
//! table `distlock_run` empty, raises the row of `distlock_epoch` (InnoDB, autocommitted)
//! and then writes the run's row. So tokens rise strictly across all keys (hence per
//! key, in grant order) within a run, and every token of a run is above those of
//! earlier runs, after a stop or a crash, as durably as the server's commits (InnoDB
//! with `innodb_flush_log_at_trx_commit = 1`, the default) and without using any clock.
//! A grant costs no commit. The tables are created on first connect if missing;
//! [`CREATE_TABLES`] creates them ahead.
//!
//! # Semaphores and elections
//! - **Semaphore**: permit `i` of `M` is the lock of slot `i` (`dp#…`), held on a
//!   dedicated session, with the count in use recorded in `distlock_permits` and
//!   checked under that row's lock, so two counts never meet
//!   ([`distlock_api::LockError::PermitMismatch`]). Waiters poll at the options'
//!   backoff. Tokens come from one counter per key.
//! - **Election**: the lock of the election's name (`de#…`), plus the leader's row in
//!   `distlock_election`, read as leader only while its connection holds the lock.
//!
//! # TLS
//! URLs take the MySQL drivers' parameters `ssl-mode` (`disabled`, `preferred` (the
//! default), `required`, `verify_ca`, `verify_identity`), `ssl-ca`, `ssl-cert` and
//! `ssl-key` (see [`parse_url`]). TLS needs the `tls` feature (rustls, ring; never
//! OpenSSL); without it `preferred` is plaintext and the modes that need TLS are
//! configuration errors. A refused certificate or handshake is a configuration error.
//! `required` never checks the certificate, even with `ssl-ca`; `verify_ca` also
//! checks the host name, as `verify_identity` does (sqlx issue 3793).
//!
//! # Caveats
//! - User locks live on one server: they are not replicated, so a failover (or a
//!   Galera cluster, where each node has its own) loses them; holders see `lost()`.
//! - Tested against MariaDB 10.11 (Debian's `mariadb-server`), in plaintext and over
//!   TLS; MySQL is not tested.

// docs.rs (`--cfg docsrs`, nightly) shows which feature each gated item needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

mod client;
mod config;
mod election;
mod engine;
mod error;
mod keys;
mod lock;
mod mailbox;
mod semaphore;
mod session;
mod sql;

pub use config::{parse_url, MySqlConfig, URL_SCHEMES};
pub use keys::{lock_name, MAX_NAME_CHARS};
pub use lock::MySqlLock;
pub use sql::{CREATE_TABLES, ELECTION_TABLE, FENCE_TABLE, PERMITS_TABLE, RUN_TABLE};
/// The driver this backend is built on, re-exported so its types (for example in error
/// sources) can be named without a separate dependency on a matching version.
pub use sqlx;

/// The backend name, in errors and reports.
pub const MYSQL_BACKEND: &str = "mysql";
