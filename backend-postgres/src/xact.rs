//! [`PostgresXactLock`]: transaction-scoped advisory locks (`pg_advisory_xact_lock`),
//! for work that fits in one transaction, and for servers behind a transaction-mode
//! pooler such as PgBouncer.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use distlock_api::{FencingToken, LockError, LockKey, WaitPolicy};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{Acquire as _, Connection as _, Postgres, Transaction};
use tokio::sync::OnceCell;
use tokio::time::{timeout, Instant};

use crate::config::{
    parse_url, pooler_options, server_address, PostgresConfig, CLIENT_CHECK_INTERVAL_MS,
};
use crate::error::{connect_error, lock_error, sqlstate};
use crate::keys::advisory_key;
use crate::pinned::XactState;
use crate::session;
use crate::sql::{ensure_schema, Statements};
use crate::xact_sql::XactSql;
use crate::POSTGRES_BACKEND;

/// Connections for short statements beside the leases' transactions (tokens, leader
/// rows, look-ups): each statement holds one for one round trip.
const CONTROL_CONNECTIONS: u32 = 2;

/// The future a [`PostgresXactLock::with_lock`] work closure returns.
pub type XactFuture<'t, T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 't>>;

/// Why [`PostgresXactLock::with_lock`] failed.
///
/// Exhaustive by choice (see `distlock_api`'s stability rules): the lock or the work.
#[derive(Debug)]
pub enum XactError<E> {
    /// The lock was not taken (timeout, connection or server error), or the
    /// transaction could not commit. The work's effects, if any, were rolled back.
    Lock(LockError),
    /// The work failed; the transaction was rolled back, releasing the lock.
    Work(E),
}

impl<E: fmt::Display> fmt::Display for XactError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            XactError::Lock(e) => write!(f, "{e}"),
            XactError::Work(e) => write!(f, "the work under the lock failed: {e}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for XactError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            XactError::Lock(e) => Some(e),
            XactError::Work(e) => Some(e),
        }
    }
}

impl<E> From<LockError> for XactError<E> {
    fn from(e: LockError) -> Self {
        XactError::Lock(e)
    }
}

/// Transaction-scoped advisory locks, correct behind a transaction pooler (PgBouncer's
/// `pool_mode = transaction`) as well as straight to the server. Two ways to use them:
///
/// - **As an engine**, for every primitive ([`PostgresXactLock::client`], or
///   `distlock::connect` with `?pool_mode=transaction`): each grant is a
///   `pg_advisory_xact_lock` in a transaction of its own, kept open on one pooled
///   connection for the lease's life (a transaction pins its server connection in the
///   pooler), ended by `ROLLBACK` at release or TTL. See the crate docs, "Poolers".
/// - **Lock and work in one transaction** ([`PostgresXactLock::with_lock`],
///   [`PostgresXactLock::lock_in`]): the lock ends when the caller's transaction
///   commits or rolls back.
///
/// The locks are keyed by [`crate::advisory_key`] (and the same derived ids as the
/// session design's semaphore, read-write lock and election), so they exclude session
/// locks of [`crate::PostgresLock`] on the same key. Fencing tokens come from the same
/// sequence. Only unnamed statements are used: the engine sends plain text (the simple
/// query protocol), the work mode unnamed prepared statements inside its transaction.
///
/// Cloning is cheap and shares the pools.
#[derive(Clone)]
pub struct PostgresXactLock {
    sql: Arc<Statements>,
    pub(crate) state: Arc<XactState>,
}

impl fmt::Debug for PostgresXactLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresXactLock")
            .field("pool_size", &self.state.locks.size())
            .field("held", &self.held_count())
            .finish_non_exhaustive()
    }
}

/// Closes the pooled connection when dropped before [`CloseUnlessDone::done`]: a
/// transaction cut short mid-statement (an abandoned wait) ends at once, with its lock,
/// instead of when the pool next touches the connection.
struct CloseUnlessDone(Option<PoolConnection<Postgres>>);

impl CloseUnlessDone {
    fn done(mut self) {
        self.0.take();
    }
}

impl Drop for CloseUnlessDone {
    fn drop(&mut self) {
        if let Some(mut conn) = self.0.take() {
            conn.close_on_drop();
        }
    }
}

impl PostgresXactLock {
    /// Connects to the server (or transaction pooler) named by a `postgres://` or
    /// `postgresql://` URL (see [`crate::parse_url`]; `pool_mode` is ignored here: this
    /// design is the one `pool_mode=transaction` selects), with the default
    /// [`PostgresConfig`], and creates the fencing sequence (schema `distlock`) if it is
    /// missing.
    ///
    /// # Errors
    /// As [`crate::PostgresLock::connect`].
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        PostgresXactLock::connect_with(url, PostgresConfig::default()).await
    }

    /// Connects with `config`. Of its fields, this design uses `wait_sessions` (the most
    /// connections of the lock pool: one per held lease and per waiting acquire),
    /// `session_timeout` (each lease's transaction runs with
    /// `idle_in_transaction_session_timeout` set to it), `heartbeat`,
    /// `request_timeout` and `schema`; `shared_sessions` and `dead_peer_timeout` are
    /// the session design's.
    ///
    /// No setting is sent at connection start-up (a pooler refuses unknown start-up
    /// parameters unless told to ignore them): each transaction sets its own with
    /// `SET LOCAL`.
    ///
    /// # Errors
    /// As [`crate::PostgresLock::connect_with`].
    pub async fn connect_with(url: &str, config: PostgresConfig) -> Result<Self, LockError> {
        config.validate()?;
        let options = pooler_options(&parse_url(url)?);
        let pool = PgPoolOptions::new()
            .max_connections(u32::try_from(config.wait_sessions).unwrap_or(u32::MAX))
            .acquire_timeout(config.request_timeout)
            .test_before_acquire(false)
            .connect_lazy_with(options);
        // A first connection, retried while the server starts up (as the session
        // design's first connect is), so the pool's first acquire finds it up.
        let first =
            session::connect_retrying(&pool.connect_options(), config.request_timeout).await?;
        let _ = timeout(config.request_timeout, first.close()).await;
        PostgresXactLock::from_pool_with(pool, config).await
    }

    /// Uses `pool` (for example one pointed at PgBouncer), with the fencing sequence in
    /// `schema` (created if missing; `distlock` is the default of the session mode).
    /// The engine's statements are plain text, so the pool's statement cache is not
    /// used by them.
    ///
    /// # Errors
    /// [`LockError::Config`] for an invalid schema name or a missing sequence this user
    /// may not create; connection errors.
    pub async fn from_pool(pool: PgPool, schema: &str) -> Result<Self, LockError> {
        let config = PostgresConfig {
            schema: schema.to_owned(),
            ..PostgresConfig::default()
        };
        PostgresXactLock::from_pool_with(pool, config).await
    }

    async fn from_pool_with(pool: PgPool, config: PostgresConfig) -> Result<Self, LockError> {
        config.validate()?;
        let sql = Statements::new(&config.schema);
        let options = pool.connect_options();
        let address = server_address(&options);
        let mut conn = timeout(config.request_timeout, pool.acquire())
            .await
            .map_err(|_| {
                LockError::connection_at(
                    POSTGRES_BACKEND,
                    &address,
                    format!("no connection within {:?}", config.request_timeout),
                )
            })?
            .map_err(|e| connect_error(e, &address))?;
        // In a transaction: behind a transaction pooler, the checks' unnamed statements
        // must meet the server connection they were parsed on.
        let mut tx = conn.begin().await.map_err(lock_error)?;
        ensure_schema(&mut tx, &config.schema, &sql).await?;
        tx.commit().await.map_err(lock_error)?;
        drop(conn);
        let control = PgPoolOptions::new()
            .max_connections(CONTROL_CONNECTIONS)
            .acquire_timeout(config.request_timeout)
            .test_before_acquire(false)
            .connect_lazy_with(options.as_ref().clone());
        let state = XactState {
            sql: XactSql::new(&config.schema, config.session_timeout.as_millis()),
            config,
            address,
            locks: pool,
            control,
            holders: Mutex::default(),
            election_table: OnceCell::new(),
        };
        Ok(PostgresXactLock {
            sql: Arc::new(sql),
            state: Arc::new(state),
        })
    }

    /// The session design's statements (the schema checks use them).
    pub(crate) fn statements(&self) -> &Statements {
        &self.sql
    }

    /// How many leases this client holds now: each keeps one connection (and, behind
    /// a transaction pooler, one server connection).
    pub fn held_count(&self) -> usize {
        crate::client::locked(&self.state.holders).len()
    }

    /// The pool the transactions run on.
    pub fn pool(&self) -> &PgPool {
        &self.state.locks
    }

    /// Takes `key` inside the caller's transaction `tx`, waiting as `wait` allows (in the
    /// server's queue, under `lock_timeout`), and returns the grant's fencing token. The
    /// lock ends when `tx` commits or rolls back.
    ///
    /// If this future is dropped while waiting, the statement keeps running on `tx`'s
    /// connection until the server ends the wait; prefer [`PostgresXactLock::with_lock`],
    /// which closes the connection in that case.
    ///
    /// # Errors
    /// [`LockError::Timeout`] when the key stayed held (the transaction is then aborted
    /// and must be rolled back), connection and server errors.
    pub async fn lock_in(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        key: &LockKey,
        wait: WaitPolicy,
    ) -> Result<FencingToken, LockError> {
        let hash = advisory_key(key);
        let started = Instant::now();
        // `None`: one try; `Some(0)`: no lock_timeout (wait forever).
        let timeout_ms = match wait.deadline_from(started) {
            None => Some(0),
            Some(deadline) if deadline <= started => None,
            Some(deadline) => Some(
                u64::try_from((deadline - started).as_micros().div_ceil(1000))
                    .unwrap_or(u64::MAX)
                    .min(i32::MAX as u64),
            ),
        };
        let result = match timeout_ms {
            None => {
                sqlx::query_scalar::<_, Option<i64>>(&self.sql.xact_try)
                    .bind(hash)
                    .persistent(false)
                    .fetch_one(&mut **tx)
                    .await
            }
            Some(ms) => {
                // The server checks a waiter's connection every second, so a waiter
                // that goes away leaves the queue (no start-up setting says so: a
                // pooler may refuse them). Its own statement, before the wait starts.
                let check = format!(
                    "SET LOCAL client_connection_check_interval = {CLIENT_CHECK_INTERVAL_MS}"
                );
                if let Err(e) = crate::xact_sql::run(tx, &check).await {
                    return Err(lock_error(e));
                }
                sqlx::query_scalar::<_, Option<i64>>(&self.sql.xact_wait)
                    .bind(hash)
                    .bind(ms.to_string())
                    .persistent(false)
                    .fetch_one(&mut **tx)
                    .await
            }
        };
        let timed_out = || LockError::Timeout {
            backend: POSTGRES_BACKEND,
            key: key.clone(),
            waited: started.elapsed(),
        };
        match result {
            Ok(Some(token)) => Ok(FencingToken::new(token.unsigned_abs())),
            Ok(None) => Err(timed_out()),
            Err(e) if sqlstate(&e) == Some("55P03") => Err(timed_out()),
            Err(e) => Err(lock_error(e)),
        }
    }

    /// Begins a transaction, takes `key` in it (waiting as `wait` allows), runs `work`
    /// in the same transaction with the grant's fencing token, and commits if `work`
    /// succeeds or rolls back if it fails. The lock is released by that commit or
    /// rollback, so no other holder can see the key free before the work is durable.
    ///
    /// ```no_run
    /// # async fn demo(locks: distlock_postgres::PostgresXactLock) -> Result<(), Box<dyn std::error::Error>> {
    /// use distlock_api::{LockKey, WaitPolicy};
    /// use std::time::Duration;
    ///
    /// let key = LockKey::new("accounts/42")?;
    /// let balance: i64 = locks
    ///     .with_lock(&key, WaitPolicy::Timeout(Duration::from_secs(5)), |tx, token| {
    ///         Box::pin(async move {
    ///             sqlx::query_scalar("UPDATE accounts SET balance = balance - 200, fence = $1 WHERE id = 42 RETURNING balance")
    ///                 .bind(token.get() as i64)
    ///                 .fetch_one(&mut **tx)
    ///                 .await
    ///         })
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// Dropping the returned future at any point closes the connection instead of
    /// returning it to the pool, which rolls the transaction back and releases the lock.
    ///
    /// # Errors
    /// [`XactError::Work`] with `work`'s error (rolled back); [`XactError::Lock`] with
    /// [`LockError::Timeout`] when the key stayed held, or a connection or server error
    /// (including a failed commit).
    pub async fn with_lock<T, E, F>(
        &self,
        key: &LockKey,
        wait: WaitPolicy,
        work: F,
    ) -> Result<T, XactError<E>>
    where
        F: for<'t> FnOnce(&'t mut Transaction<'_, Postgres>, FencingToken) -> XactFuture<'t, T, E>,
    {
        let conn = self
            .state
            .locks
            .acquire()
            .await
            .map_err(|e| connect_error(e, &self.state.address))?;
        let mut holder = CloseUnlessDone(Some(conn));
        let Some(conn) = holder.0.as_mut() else {
            return Err(XactError::Lock(crate::error::connection(
                "the pooled connection went missing",
            )));
        };
        let mut tx = conn.begin().await.map_err(lock_error)?;
        let token = match self.lock_in(&mut tx, key, wait).await {
            Ok(token) => token,
            Err(e) => {
                tx.rollback().await.map_err(lock_error)?;
                holder.done();
                return Err(XactError::Lock(e));
            }
        };
        let outcome = work(&mut tx, token).await;
        let result = match outcome {
            Ok(value) => {
                tx.commit().await.map_err(lock_error)?;
                Ok(value)
            }
            Err(e) => {
                tx.rollback().await.map_err(lock_error)?;
                Err(XactError::Work(e))
            }
        };
        holder.done();
        result
    }
}
