//! [`PostgresXactLock`]: transaction-scoped advisory locks (`pg_advisory_xact_lock`),
//! for work that fits in one transaction, and for servers behind a transaction-mode
//! pooler such as PgBouncer.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use distlock_api::{FencingToken, LockError, LockKey, WaitPolicy};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{Acquire as _, Postgres, Transaction};
use tokio::time::Instant;

use crate::config::{parse_url, server_address, session_options, PostgresConfig};
use crate::error::{connect_error, lock_error, sqlstate};
use crate::keys::advisory_key;
use crate::sql::{ensure_schema, Statements};
use crate::POSTGRES_BACKEND;

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

/// Transaction-scoped advisory locks: the lock is taken inside a transaction with
/// `pg_advisory_xact_lock` (keyed by [`crate::advisory_key`], so it excludes session
/// locks of [`crate::PostgresLock`] on the same key) and ends with the transaction,
/// at commit or rollback. The work runs in that same transaction.
///
/// There is no lease to renew and nothing to release: the lock lives exactly as long as
/// the transaction. A holder that dies mid-transaction loses it when the server notices
/// (its connection closes, or TCP keepalives fail). Fencing tokens come from the same
/// sequence as session locks'. All statements are unnamed (not prepared), so this works
/// through PgBouncer in transaction mode.
///
/// Cloning is cheap and shares the pool.
#[derive(Clone)]
pub struct PostgresXactLock {
    pool: PgPool,
    sql: Arc<Statements>,
}

impl fmt::Debug for PostgresXactLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresXactLock")
            .field("pool_size", &self.pool.size())
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
    /// Connects a pool of up to 10 connections to the server named by a `postgres://`
    /// or `postgresql://` URL, and creates the fencing sequence (schema `distlock`) if it
    /// is missing. The connections run with `synchronous_commit = on`, so a fencing
    /// token handed out survives a crash.
    ///
    /// # Errors
    /// As [`crate::PostgresLock::connect`].
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let config = PostgresConfig::default();
        // The URL checks, TCP keepalives and synchronous commit of the session mode;
        // no idle timeout (pooled connections idle between transactions) and no
        // session-wide lock timeout (the work's own statements may wait).
        let options = session_options(&parse_url(url)?, &config)
            .options([("idle_session_timeout", "0"), ("lock_timeout", "0")]);
        let address = server_address(&options);
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(config.request_timeout)
            .connect_with(options)
            .await
            .map_err(|e| connect_error(e, &address))?;
        PostgresXactLock::from_pool(pool, &config.schema).await
    }

    /// Uses `pool` (for example one pointed at PgBouncer), with the fencing sequence in
    /// `schema` (created if missing; `distlock` is the default of the session mode).
    /// Tokens are as durable as the pool's commits: keep `synchronous_commit` on.
    ///
    /// # Errors
    /// [`LockError::Config`] for an invalid schema name or a missing sequence this user
    /// may not create; connection errors.
    pub async fn from_pool(pool: PgPool, schema: &str) -> Result<Self, LockError> {
        let config = PostgresConfig {
            schema: schema.to_owned(),
            ..PostgresConfig::default()
        };
        config.validate()?;
        let sql = Statements::new(schema);
        let address = server_address(&pool.connect_options());
        let mut conn = pool
            .acquire()
            .await
            .map_err(|e| connect_error(e, &address))?;
        ensure_schema(&mut conn, schema, &sql).await?;
        Ok(PostgresXactLock {
            pool,
            sql: Arc::new(sql),
        })
    }

    /// The pool the transactions run on.
    pub fn pool(&self) -> &PgPool {
        &self.pool
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
            .pool
            .acquire()
            .await
            .map_err(|e| connect_error(e, &server_address(&self.pool.connect_options())))?;
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
