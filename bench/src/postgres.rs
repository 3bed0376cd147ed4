//! Postgres comparators: the raw bound (`pg_try_advisory_lock` + `pg_advisory_unlock`
//! through sqlx) and sqlx's own `PgAdvisoryLock`; and the server-side connection count.
//!
//! distributed-lock's Postgres lock is not a comparator: its crate turns on sqlx's
//! `native-tls`, and sqlx then uses OpenSSL instead of rustls in every crate of the same
//! build, the Postgres backend's TLS included.

use async_trait::async_trait;
use sqlx::postgres::PgAdvisoryLock;
use sqlx::{Connection as _, PgConnection};

use crate::side::{BoxError, Contender, Side};

/// Client connections open on the server (`pg_stat_activity`), this probe included.
pub(crate) async fn client_connections(url: &str) -> Result<u64, BoxError> {
    let mut conn = PgConnection::connect(url).await?;
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'",
    )
    .fetch_one(&mut conn)
    .await?;
    conn.close().await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// The server's version, for the report.
pub(crate) async fn server_version(url: &str) -> Result<String, BoxError> {
    let mut conn = PgConnection::connect(url).await?;
    let v: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&mut conn)
        .await?;
    conn.close().await?;
    Ok(format!("PostgreSQL {v}"))
}

/// FNV-1a: the raw loop's key string to an advisory-lock id.
fn key_id(key: &str) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    i64::from_ne_bytes(hash.to_ne_bytes())
}

/// Bare sqlx connections, one per worker (a connection runs one query at a time).
pub(crate) struct Raw {
    url: String,
}

impl Raw {
    pub(crate) fn new(url: &str) -> Self {
        Raw {
            url: url.to_owned(),
        }
    }
}

#[async_trait]
impl Side for Raw {
    fn name(&self) -> &'static str {
        "raw"
    }

    fn waits(&self) -> bool {
        false
    }

    async fn contender(&self, _worker: usize) -> Result<Box<dyn Contender>, BoxError> {
        Ok(Box::new(RawContender {
            conn: PgConnection::connect(&self.url).await?,
        }))
    }
}

struct RawContender {
    conn: PgConnection,
}

#[async_trait]
impl Contender for RawContender {
    async fn cycle(&mut self, key: &str, held: &mut (dyn FnMut() + Send)) -> Result<(), BoxError> {
        let id = key_id(&format!("bench/raw/{key}"));
        let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(id)
            .fetch_one(&mut self.conn)
            .await?;
        if !got {
            return Err(format!("raw pg_try_advisory_lock found {key} held").into());
        }
        held();
        // `execute`, as sqlx's own PgAdvisoryLock does: the answer is not needed, and
        // it returns sooner than fetching the row.
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(id)
            .execute(&mut self.conn)
            .await?;
        Ok(())
    }
}

/// sqlx's `PgAdvisoryLock`: it takes a connection for as long as the lock is held, so
/// each worker has its own; its acquire waits on the server (`pg_advisory_lock`).
pub(crate) struct SqlxAdvisory {
    url: String,
}

impl SqlxAdvisory {
    pub(crate) fn new(url: &str) -> Self {
        SqlxAdvisory {
            url: url.to_owned(),
        }
    }
}

#[async_trait]
impl Side for SqlxAdvisory {
    fn name(&self) -> &'static str {
        "sqlx PgAdvisoryLock"
    }

    async fn contender(&self, _worker: usize) -> Result<Box<dyn Contender>, BoxError> {
        Ok(Box::new(SqlxContender {
            conn: Some(PgConnection::connect(&self.url).await?),
        }))
    }
}

struct SqlxContender {
    /// `None` only after a failed acquire consumed it.
    conn: Option<PgConnection>,
}

#[async_trait]
impl Contender for SqlxContender {
    async fn cycle(&mut self, key: &str, held: &mut (dyn FnMut() + Send)) -> Result<(), BoxError> {
        let conn = self.conn.take().ok_or("sqlx: connection lost earlier")?;
        let lock = PgAdvisoryLock::new(format!("bench/sqlx/{key}"));
        let guard = lock.acquire(conn).await?;
        held();
        self.conn = Some(guard.release_now().await?);
        Ok(())
    }
}
