//! The SQL this backend runs, and the tables it needs (created on first connect if
//! missing, or ahead by an administrator with [`CREATE_TABLES`]).

use std::time::Duration;

use distlock_api::LockError;
use sqlx::{Executor as _, MySqlConnection};
use tokio::time::timeout;

use crate::error::{error_number, lock_error};
use crate::MYSQL_BACKEND;

/// The fencing counters, one row per lock name ever granted.
pub const FENCE_TABLE: &str = "distlock_fence";
/// The permit count in use per semaphore, one row per semaphore key ever used.
pub const PERMITS_TABLE: &str = "distlock_permits";
/// The leader of each election, one row per election name led and not resigned.
pub const ELECTION_TABLE: &str = "distlock_election";

/// The tables, as an administrator can create them ahead in the URL's database
/// (then the lock user needs only `SELECT, INSERT, UPDATE, DELETE` on them).
pub const CREATE_TABLES: &str = "\
CREATE TABLE IF NOT EXISTS distlock_fence (
  name VARBINARY(64) NOT NULL PRIMARY KEY,
  token BIGINT UNSIGNED NOT NULL
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS distlock_permits (
  name VARBINARY(64) NOT NULL PRIMARY KEY,
  permits INT UNSIGNED NOT NULL
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS distlock_election (
  name VARBINARY(64) NOT NULL PRIMARY KEY,
  candidate VARBINARY(1024) NOT NULL,
  term BIGINT UNSIGNED NOT NULL,
  connection_id BIGINT UNSIGNED NOT NULL
) ENGINE=InnoDB;";

/// A try on a shared session: `1` granted, `0` held (by anyone, this session
/// included: `GET_LOCK` on a session that holds the lock would succeed again, so a
/// lock in use is never asked for), `NULL` on a server error.
pub(crate) const TRY_LOCK: &str =
    "SELECT CAST(CASE WHEN IS_USED_LOCK(?) IS NULL THEN GET_LOCK(?, 0) ELSE 0 END AS SIGNED)";
/// A wait on a dedicated session, `?` seconds at most: `1` granted, `0` timed out;
/// then how long the statement waited, in microseconds by the server's clock
/// (`SYSDATE(6)` is read after `GET_LOCK` returns, `NOW(6)` at the statement's start).
pub(crate) const WAIT_LOCK: &str = "SELECT CAST(GET_LOCK(?, ?) AS SIGNED), \
     CAST(TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6)) AS SIGNED)";
/// The next fencing token of a lock name, set as `LAST_INSERT_ID` (read from the
/// statement's OK packet): the counter's row is created at 1 or bumped, in one
/// autocommitted statement.
pub(crate) const NEXT_TOKEN: &str = "INSERT INTO distlock_fence (name, token) \
     VALUES (?, LAST_INSERT_ID(1)) ON DUPLICATE KEY UPDATE token = LAST_INSERT_ID(token + 1)";
/// `1` released, `0` held by another session, `NULL` not held by anyone.
pub(crate) const RELEASE_LOCK: &str = "SELECT CAST(RELEASE_LOCK(?) AS SIGNED)";
/// Releases every user lock of the session (a permit's dedicated session).
pub(crate) const RELEASE_ALL: &str = "SELECT CAST(RELEASE_ALL_LOCKS() AS SIGNED)";
/// The connection id holding a name, `NULL` when free.
pub(crate) const HOLDER: &str = "SELECT CAST(IS_USED_LOCK(?) AS SIGNED)";
pub(crate) const PING: &str = "SELECT 1";
/// The session's connection id, for ending an abandoned wait from another session.
pub(crate) const CONNECTION_ID: &str = "SELECT CAST(CONNECTION_ID() AS SIGNED)";
/// Records the leader of an election, in the session that holds its lock.
pub(crate) const SEAT: &str =
    "INSERT INTO distlock_election (name, candidate, term, connection_id) \
     VALUES (?, ?, ?, CONNECTION_ID()) ON DUPLICATE KEY UPDATE candidate = VALUES(candidate), \
     term = VALUES(term), connection_id = VALUES(connection_id)";
/// Deletes a leader's row, owner-checked by term.
pub(crate) const UNSEAT: &str = "DELETE FROM distlock_election WHERE name = ? AND term = ?";
/// The leader row, only while the session that wrote it holds the election's lock.
pub(crate) const LEADER: &str = "SELECT candidate, CAST(term AS SIGNED) FROM distlock_election \
     WHERE name = ? AND connection_id = IS_USED_LOCK(?)";

/// Creates the tables that are missing, on `conn`, within `limit`. Only missing
/// tables are created, so a user without `CREATE` works once they exist.
///
/// # Errors
/// [`LockError::Config`] naming the rights needed and [`CREATE_TABLES`]'s way ahead
/// when the server refuses the `CREATE`; connection and backend errors otherwise.
pub(crate) async fn ensure_tables(
    conn: &mut MySqlConnection,
    address: &str,
    limit: Duration,
) -> Result<(), LockError> {
    let existing: Vec<(String,)> = timeout(
        limit,
        sqlx::query_as(
            "SELECT CAST(table_name AS CHAR) FROM information_schema.tables \
             WHERE table_schema = DATABASE() AND table_name IN (?, ?, ?)",
        )
        .bind(FENCE_TABLE)
        .bind(PERMITS_TABLE)
        .bind(ELECTION_TABLE)
        .fetch_all(&mut *conn),
    )
    .await
    .map_err(|_| no_answer(address, limit))?
    .map_err(lock_error)?;
    for statement in CREATE_TABLES.split_inclusive(';') {
        let Some(table) = [FENCE_TABLE, PERMITS_TABLE, ELECTION_TABLE]
            .into_iter()
            .find(|t| statement.contains(&format!("EXISTS {t} ")))
        else {
            continue;
        };
        if existing.iter().any(|(t,)| t.eq_ignore_ascii_case(table)) {
            continue;
        }
        let created = timeout(limit, (&mut *conn).execute(statement))
            .await
            .map_err(|_| no_answer(address, limit))?;
        match created {
            Ok(_) => {}
            Err(e) if error_number(&e).is_some_and(|n| [1142, 1044, 1227].contains(&n)) => {
                let said = match &e {
                    sqlx::Error::Database(db) => db.message().to_owned(),
                    _ => String::new(),
                };
                return Err(LockError::Config {
                    backend: MYSQL_BACKEND,
                    message: format!(
                        "{address}: the table {table} is missing and this user may not create it \
                         (server said: {said}). Grant CREATE, SELECT, INSERT, UPDATE and DELETE \
                         on the URL's database, or have an administrator create the tables ahead \
                         (distlock_mysql::CREATE_TABLES, also in the guide) and grant SELECT, \
                         INSERT, UPDATE and DELETE on them"
                    ),
                    source: Some(e.into()),
                });
            }
            Err(e) => return Err(lock_error(e)),
        }
    }
    Ok(())
}

fn no_answer(address: &str, limit: Duration) -> LockError {
    LockError::connection_at(
        MYSQL_BACKEND,
        address,
        format!("no answer within {limit:?} while checking distlock's tables"),
    )
}
