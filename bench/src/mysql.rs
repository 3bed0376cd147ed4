//! MySQL/MariaDB comparators: the raw bound (`GET_LOCK(n, 0)` + `RELEASE_LOCK(n)`
//! through sqlx, one connection per worker); and the server-side connection count.
//! The Rust peer `distributed-lock`'s MySQL crate is not compared: it turns on sqlx's
//! `native-tls` feature, which would switch sqlx to OpenSSL in the whole workspace; the
//! separate cargo project `bench/peers-mysql` compares it, outside the workspace.

use async_trait::async_trait;
use sqlx::{Connection as _, MySqlConnection};

use crate::side::{BoxError, Contender, Side};

/// `mysql://` for the driver, which knows no `mariadb://`.
fn driver_url(url: &str) -> String {
    match url.split_once("://") {
        Some((_, rest)) => format!("mysql://{rest}"),
        None => url.to_owned(),
    }
}

/// Client connections open on the server (the process list), this probe included.
pub(crate) async fn client_connections(url: &str) -> Result<u64, BoxError> {
    let mut conn = MySqlConnection::connect(&driver_url(url)).await?;
    let n: i64 = sqlx::query_scalar(
        "SELECT CAST(COUNT(*) AS SIGNED) FROM information_schema.processlist \
         WHERE command <> 'Daemon'",
    )
    .fetch_one(&mut conn)
    .await?;
    conn.close().await?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// The server's version, for the report.
pub(crate) async fn server_version(url: &str) -> Result<String, BoxError> {
    let mut conn = MySqlConnection::connect(&driver_url(url)).await?;
    let v: String = sqlx::query_scalar("SELECT CAST(VERSION() AS CHAR)")
        .fetch_one(&mut conn)
        .await?;
    conn.close().await?;
    Ok(format!("MySQL/MariaDB {v}"))
}

/// FNV-1a of the raw loop's key, as a lock name well within 64 characters.
fn lock_name(key: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("bench-raw:{hash:016x}")
}

/// Bare sqlx connections, one per worker (a connection runs one query at a time).
pub(crate) struct Raw {
    url: String,
}

impl Raw {
    pub(crate) fn new(url: &str) -> Self {
        Raw {
            url: driver_url(url),
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
            conn: MySqlConnection::connect(&self.url).await?,
        }))
    }
}

struct RawContender {
    conn: MySqlConnection,
}

#[async_trait]
impl Contender for RawContender {
    async fn cycle(&mut self, key: &str, held: &mut (dyn FnMut() + Send)) -> Result<(), BoxError> {
        let name = lock_name(key);
        let got: Option<i64> = sqlx::query_scalar("SELECT CAST(GET_LOCK(?, 0) AS SIGNED)")
            .bind(&name)
            .fetch_one(&mut self.conn)
            .await?;
        if got != Some(1) {
            return Err(format!("raw GET_LOCK found {key} held").into());
        }
        held();
        sqlx::query("DO RELEASE_LOCK(?)")
            .bind(&name)
            .execute(&mut self.conn)
            .await?;
        Ok(())
    }
}
