//! The Postgres backend of distlock: session-level advisory locks, multiplexed over a
//! few sessions, with server-side waiting, client-enforced leases, loss detection, a
//! persisted fencing sequence, and a transaction-scoped design for transaction poolers
//! such as PgBouncer (`?pool_mode=transaction`, see "Poolers").
//!
//! ```no_run
//! # async fn demo() -> Result<(), distlock_api::LockError> {
//! use std::time::Duration;
//! use distlock_api::{LockKey, LockOptions, WaitPolicy};
//! use distlock_postgres::PostgresLock;
//!
//! let locks = PostgresLock::connect("postgres://app@db.internal/app").await?;
//! let key = LockKey::new("invoices/2026-11")?;
//! let options = LockOptions::new(Duration::from_secs(30))
//!     .with_wait(WaitPolicy::Timeout(Duration::from_secs(5)));
//! let guard = locks.lock().acquire(&key, &options).await?;
//! // Send guard.fencing_token() with every write the lock protects (`None` where the
//! // backend has no fencing: then make the writes idempotent or conditional).
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! [`PostgresLock`] is this backend's [`distlock_api::backend::Engine`]: one client
//! (its sessions) for every primitive. [`PostgresLock::client`] gives it as a
//! [`distlock_api::Client`], and [`PostgresLock::lock`], [`PostgresLock::semaphore`],
//! [`PostgresLock::rw_lock`] and [`PostgresLock::election`] give each primitive, all
//! over the same sessions; their option checks, bounded waits and retries are
//! `distlock_api`'s, the same on every backend. Every primitive is offered, with
//! fencing tokens and TTL expiry; each waits in the server's lock queue (FIFO, woken
//! by a release) except the semaphore, whose waiters poll: its
//! [`distlock_api::Guarantees`] say no FIFO and no wake-on-release, and a FIFO wait
//! for a permit is refused with [`distlock_api::LockError::Unsupported`]. No lease
//! outlives its client (`outlives_client` is unsupported): a client's locks end with
//! its sessions, so [`distlock_api::run_once`] refuses this backend.
//!
//! # Protocol
//! A lock key `K` is the advisory lock [`advisory_key`]`(K)`: the first 8 bytes of
//! SHA-256 of `K`, as a `bigint`. A [`PostgresLock`] client keeps two kinds of
//! sessions (connections), each owned by one task that runs its statements in order:
//! - **shared sessions** (at most [`PostgresConfig::shared_sessions`], default 10)
//!   carry every grant that does not wait, and its release. Requests queued on a
//!   session go to the server together: all queued grants as one statement
//!   `SELECT k, CASE WHEN pg_try_advisory_lock(k) THEN nextval('distlock.fencing_token') END
//!   FROM unnest($1::int8[])` (each with its fencing token), all queued releases as one
//!   `pg_advisory_unlock` statement, all queued extends answered by one round trip.
//!   A client uses about one shared session per 8 requests in flight (opening more in
//!   the background as the load grows), so a busy client batches rather than spreading
//!   thin. Any number of held locks share these sessions: 10,000 held locks need at
//!   most 10 connections.
//! - **wait sessions** (at most [`PostgresConfig::wait_sessions`], default 16): an
//!   `acquire` whose key is held waits in the server's own lock queue with a blocking
//!   `pg_advisory_lock` under `lock_timeout` (the time left of its wait policy), on a
//!   session dedicated to that wait. The release of the holder hands the lock to the
//!   first waiter inside the server, in about one round trip, fairly (FIFO), with no
//!   polling. The session then holds that lock until it ends, and waits again for the
//!   next caller afterwards. When every wait session is in use, further contended
//!   acquires queue in the client for one, within their wait policy.
//!
//! Release is `pg_advisory_unlock` on the session that holds the lock; extend proves
//! that session alive with a round trip. Owner checks are done by the client: it knows
//! which session holds which owner token, and a session can only unlock its own locks.
//! Advisory locks are re-entrant per session, so a client never lets two grants of one
//! key meet on its shared sessions: a second request for a key it holds or is taking
//! there is answered "held" (or waits on a wait session, behind the first).
//!
//! A server connection is never returned anywhere while it may hold a lock: sessions
//! are not pooled, and a session whose state is unknown (a reply timed out, a wait
//! was abandoned) is closed, which ends its locks.
//!
//! A dropped `acquire` future leaves nothing held: a try or wait still queued in its
//! session when the future goes is never sent (the key is never granted), and one on
//! the wire is undone by the session as its answer comes in (a shared session unlocks
//! at once; an abandoned wait's session is closed).
//!
//! # Lease and loss
//! The lock lives as long as its session, and the lease is enforced on top of it:
//! - **TTL.** The holding client unlocks a lease at `acquired_at + TTL` unless extended,
//!   and the guard's `lost()` fires then. `extend` (and auto-renew) proves the session
//!   alive and pushes that deadline. So a hung task loses its lock after one TTL.
//!   When the TTL timer fires a second or more late, the whole process was paused
//!   (SIGSTOP, a suspended VM) or starved, holder included: the lease is lost at once,
//!   but the unlock waits up to a second for the holder's own release, which then
//!   finds the lock still held and reports `Released`, showing that nobody else held
//!   it meanwhile (`distlock exec` passes on its command's exit code then).
//! - **Session.** Every session runs with `idle_session_timeout` =
//!   [`PostgresConfig::session_timeout`] (default 10 s). A session holding locks sends a
//!   heartbeat every [`PostgresConfig::heartbeat`] (default 2 s) when nothing else ran. A
//!   frozen, paused or silently cut-off holder stops sending, and the server ends its
//!   session, freeing its locks, at most `session_timeout` after its last round trip
//!   ([`PostgresConfig::dead_holder_bound`]). A crashed process's connection closes and
//!   its locks are freed at once. TCP keepalives and `tcp_user_timeout`
//!   ([`PostgresConfig::dead_peer_timeout`]) and `client_connection_check_interval`
//!   (1 s) make the server drop the waits of dead waiters too.
//! - **Validity.** The guard's validity deadline is the earlier of the TTL deadline and
//!   the session's last proof of life + `session_timeout` (less 1 % + 2 ms), pushed by
//!   heartbeats: the server cannot have ended the session for idleness before it. For a
//!   grant that waited, the lease starts at the grant as timed by the server; the wait
//!   is not charged to it.
//! - **Suspect and lost.** A reply slower than the heartbeat period marks every lease
//!   of the session suspect; a failed or timed-out round trip ends the session and
//!   marks every lease on it lost, so `lost()` fires within a heartbeat period plus the
//!   request timeout of the session's death (`pg_terminate_backend`, a restart, a cut
//!   connection). That death frees the lock on the server at once, so another client
//!   can take it before this one notices: fence your writes.
//!
//! # Fencing
//! Every grant takes `nextval` of the sequence `distlock.fencing_token` (`bigint`,
//! `MINVALUE 1`, `CACHE 1`) in the same statement that takes the lock: tokens strictly
//! increase across all grants of all keys, hence per key, in grant order. The schema and
//! sequence are created on first connect if missing (`CREATE SCHEMA IF NOT EXISTS`,
//! `CREATE SEQUENCE IF NOT EXISTS`, serialised by a transaction-scoped advisory lock on
//! the two-`int4` key `(0x64697374, 0x6c6f636b)`), or by an owner once; another schema is
//! chosen with [`PostgresConfig::schema`]. A sequence has no row per key, so it does not
//! grow with the number of keys. Sessions run with `synchronous_commit = on` and read
//! the grant's reply to the end (after the commit), so a token handed out is durable:
//! after a crash the sequence resumes above it.
//!
//! # Semaphores and read-write locks
//! [`PostgresLock::semaphore`] and [`PostgresLock::rw_lock`] give the semaphore and
//! the read-write lock over the same client's sessions, with no table of their own:
//! advisory locks on ids derived from the key (SHA-256 of a namespace, a zero byte and
//! the key, so they never meet the mutex's ids but by a hash collision). Their leases,
//! loss detection and fencing are the mutex's, above: a grant lives as long as its
//! session, with the TTL enforced by the client, and every grant, a read or a permit
//! too, takes a token from the fencing sequence, above every earlier grant's of any
//! key. A permit's token orders and identifies grants (several
//! permits are valid at once, so it cannot fence them from each other); a write's
//! fences earlier reads and writes.
//! - **Read-write lock**: readers `pg_advisory_lock_shared`, writers `pg_advisory_lock`,
//!   on the key's rw id. Writer preference is the server's own: a request that
//!   conflicts with one already queued waits behind it (a try is refused), so once a
//!   writer waits, new readers queue behind it. A write goes as the mutex's lock does;
//!   a read is taken and held on a dedicated session (advisory locks are re-entrant per
//!   session, and a session's own shared lock would not exclude its own exclusive one).
//! - **Semaphore**: permit `i` of `M` is the slot id `i` of the key held exclusive,
//!   beside the count id `(count key, M)` (two `int4`s) held shared. One statement takes
//!   the count id, looks in `pg_locks` for the key's count id with another `M` held by
//!   anyone ([`distlock_api::LockError::PermitMismatch`]), then try-locks the slots in
//!   order. A permit is held on a dedicated session; a waiting acquire polls at the
//!   options' backoff. A 32-bit collision of two keys' count keys makes them refuse
//!   each other's counts when those differ; it never over-admits.
//!
//! A read or a permit takes one of the client's dedicated sessions
//! ([`PostgresConfig::wait_sessions`]) for as long as it is held, and ends with
//! `pg_advisory_unlock_all` on it: a client holds at most that many at once (further
//! acquires wait for a session within their wait policy).
//!
//! # Leader election
//! [`PostgresLock::election`] gives leader election over the same sessions: the
//! leadership of a name is a session advisory lock on its election id (SHA-256 of
//! `"distlock-election"`, a zero byte and the name), granted as the mutex's lock is
//! (candidates wait in the server's queue and the first is handed the lock on a
//! resign); its term is the grant's token from the fencing sequence. Before the
//! campaign returns, the granting session writes the row `(name, candidate, term,
//! pid)` of the table `distlock.election` (created on first use if missing, as the
//! sequence is); `leader()` returns the row only while the session `pid` holds the
//! election's lock (per `pg_locks`), so a dead leader's row never reads as leader. A
//! resign deletes the row, and a stale one is overwritten by the next leader: at most
//! one row per election name. Observers poll (`wait_change`'s default). Leases, loss
//! and crash bounds are the mutex's.
//!
//! # Poolers
//! The URL parameter `pool_mode` ([`PoolMode`], removed before the driver sees the
//! URL) selects the design; [`connect`] (what `distlock::connect` calls) follows it.
//! - **`pool_mode=session`** (the default): [`PostgresLock`], above. Straight to the
//!   server, or through a pooler in session mode (PgBouncer's `pool_mode = session`,
//!   with `ignore_startup_parameters = extra_float_digits,options`, since sqlx sends
//!   both and PgBouncer drops `options`). When the server's port is not the URL's
//!   (something stands between), every new session restates its settings with `SET`,
//!   so the session timeout and the rest hold behind a session pooler too. Before any
//!   lock, the first connection is checked to be a server session of its own (it and
//!   a second connection ask in turn for their server process id: a changed or shared
//!   id gives a pooler away); behind a transaction pooler, and on the prepared
//!   statement errors one causes, the client fails with [`distlock_api::LockError::Config`]
//!   naming PgBouncer, transaction pooling and `pool_mode=transaction`. That check is a
//!   heuristic: a transaction pooler under heavy load from other clients can pass it.
//! - **`pool_mode=transaction`**: [`PostgresXactLock`] as an engine, correct behind a
//!   transaction pooler (PgBouncer's `pool_mode = transaction`) and straight to the
//!   server. Each grant is a connection of the client's lock pool (at most
//!   [`PostgresConfig::wait_sessions`]) running `BEGIN` with `SET LOCAL
//!   idle_in_transaction_session_timeout` = [`PostgresConfig::session_timeout`] and
//!   `pg_try_advisory_xact_lock` in one round trip; while the key is held, it waits in
//!   the server's queue in the same transaction (`pg_advisory_xact_lock` under `SET
//!   LOCAL lock_timeout`, the time left; a permit polls at the backoff). The transaction
//!   then stays open, pinning its server connection in the pooler, until the release
//!   or the TTL (`ROLLBACK`); a heartbeat every [`PostgresConfig::heartbeat`] proves it
//!   alive, and a frozen or cut-off holder is ended by the server at the session
//!   timeout. The fencing token is `nextval` in a short transaction of its own,
//!   committed with `synchronous_commit = on` on a control connection after the grant
//!   (so it survives a crash, and rises per key in grant order); an election's leader
//!   row is written there with the holder's server process id. Every statement is plain
//!   text (the simple query protocol): a transaction pooler cannot split a statement's
//!   parse from its execution, and no prepared statement is left on a shared server
//!   connection. No start-up parameter beyond the pooler's own is sent.
//!   Capabilities, leases, loss and fencing are the session design's (semaphore
//!   waiters poll; no lease outlives its client).
//!
//! Server connections per process: the session design holds none when idle (after
//! half the session timeout), shared sessions for held locks (about one per 8 requests
//! in flight, at most [`PostgresConfig::shared_sessions`], for any number of locks),
//! and one dedicated session per waiter, per lock granted after a wait, per read and
//! per permit (at most [`PostgresConfig::wait_sessions`]); a contended acquire's wait
//! bound covers the time it queues at a pooler for a new session, and the error then
//! says so. The transaction design holds one per held lock and per waiter, none when
//! idle, and one more for one round trip per grant, resign and look-up.
//!
//! [`PostgresXactLock::with_lock`] runs the caller's work in the locking transaction
//! itself (`pg_advisory_xact_lock`; the lock ends with the commit or rollback), with
//! unnamed statements inside that transaction: it works behind a transaction pooler
//! too.
//!
//! # TLS
//! URLs take libpq's parameters: `sslmode` (`disable`, `prefer` (the default),
//! `require`, `verify-ca`, `verify-full`), `sslrootcert`, `sslcert` and `sslkey`, with
//! libpq's environment variables (`PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT`,
//! `PGSSLKEY`) and default files (`~/.postgresql/root.crt`, `postgresql.crt`,
//! `postgresql.key`, where `~` is `$HOME`). As in libpq, `prefer` uses TLS when the server
//! offers it and plaintext otherwise; `require` checks the certificate chain when a root
//! certificate is there; `verify-ca` checks the chain and `verify-full` the host name
//! too, and both need a root certificate. TLS itself needs the `tls` feature (rustls,
//! ring); without it `prefer` is plaintext and the modes that need TLS are
//! configuration errors. A certificate the client refuses, a client certificate the
//! server refuses, and a server without TLS under `require` are configuration errors
//! naming the server's address.
//!
//! Differences from libpq:
//! - `allow` is refused (the driver cannot fall back from plaintext to TLS).
//! - A file named by a parameter must be readable; libpq ignores a missing
//!   `sslrootcert` or `sslcert` in the modes that do not verify.
//! - `prefer` never checks the certificate; libpq checks it when a root certificate is
//!   there, and retries in plaintext when that fails.
//! - The system's trusted roots are trusted beside `sslrootcert` (the driver adds the
//!   file to them), so a certificate from a publicly trusted authority is accepted too.
//! - `verify-ca` (and `require` with a root certificate) also checks the host name, as
//!   `verify-full` does: sqlx 0.8 with rustls 0.23.24 or later fails to skip it
//!   (sqlx issue 3793). A server reached under a name its certificate lacks is refused.
//! - `sslrootcert=system` (libpq 16) is read as a file name; the key file's permissions
//!   are not checked.
//!
//! # Caveats
//! - Advisory locks are not WAL-logged: they are lost on failover to a replica, and on a
//!   server restart (holders see `lost()`; waiters retry and get the lock).
//! - Every held lock takes a slot in the server's lock table, shared by all sessions and
//!   sized `max_locks_per_transaction × (max_connections + max_prepared_transactions)`.
//!   When it is full the server refuses further locks; this is reported as
//!   [`LockError::Backend`](distlock_api::LockError::Backend) with a [`LockTableFull`]
//!   source.
//! - Needs PostgreSQL 14 or later (`idle_session_timeout`,
//!   `client_connection_check_interval`).
//! - A hash collision between two keys makes them contend as one lock; it never lets
//!   two holders in.
//!
//! # Connecting
//! [`PostgresLock::connect`] retries a refused or silent port, a server starting up or
//! shutting down (`57P03`, `57P01`) and one without a free connection slot (`53300`),
//! with jittered backoff, until the connect timeout ([`PostgresConfig::request_timeout`],
//! default 5 s) has passed, then fails with the last reason, naming the address and the
//! cause in words. Refused credentials, a missing database and TLS refusals fail at
//! once. Sessions opened later (on demand) make one attempt within the request timeout.

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
mod pinned;
mod pooler;
mod rw;
mod semaphore;
mod session;
mod sql;
mod tls;
mod xact;
mod xact_engine;
mod xact_sql;

pub use config::{parse_url, PoolMode, PostgresConfig, PostgresUrl, POOL_MODE_PARAM, URL_SCHEMES};
pub use error::LockTableFull;
pub use keys::advisory_key;
pub use lock::PostgresLock;
/// The driver this backend is built on, re-exported so its types (for example in error
/// sources) can be named without a separate dependency on a matching version.
pub use sqlx;
pub use xact::{PostgresXactLock, XactError, XactFuture};

/// Connects the design `url`'s `pool_mode` selects ([`PoolMode`]) and returns it as a
/// [`distlock_api::Client`]: [`PostgresLock`] (session advisory locks) by default,
/// [`PostgresXactLock`] (transaction-scoped, pinned transactions) with
/// `pool_mode=transaction`. What `distlock::connect` calls for `postgres://` URLs.
///
/// # Errors
/// As [`PostgresLock::connect`] or [`PostgresXactLock::connect`].
pub async fn connect(url: &str) -> Result<distlock_api::Client, distlock_api::LockError> {
    match parse_url(url)?.pool_mode() {
        PoolMode::Transaction => Ok(PostgresXactLock::connect(url).await?.client()),
        _ => Ok(PostgresLock::connect(url).await?.client()),
    }
}

/// The backend name, in errors and reports.
pub const POSTGRES_BACKEND: &str = "postgres";
