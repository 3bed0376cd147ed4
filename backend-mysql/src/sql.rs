//! The SQL this backend runs, and the tables it needs (created on first connect if
//! missing, or ahead by an administrator with [`CREATE_TABLES`]).

use std::time::Duration;

use distlock_api::LockError;
use sqlx::{Executor as _, MySqlConnection};
use tokio::time::timeout;

use crate::error::{error_number, lock_error};
use crate::MYSQL_BACKEND;

/// The fencing epoch, durable (InnoDB): one row, raised once per server run.
pub const FENCE_TABLE: &str = "distlock_epoch";
/// The current server run's epoch and counter base, in memory (`ENGINE=MEMORY`: empty
/// after every server start): one row.
pub const RUN_TABLE: &str = "distlock_run";
/// The permit count in use per semaphore, one row per semaphore key ever used.
pub const PERMITS_TABLE: &str = "distlock_permits";
/// The leader of each election, one row per election name led and not resigned.
pub const ELECTION_TABLE: &str = "distlock_election";

/// The tables, as an administrator can create them ahead in the URL's database
/// (then the lock user needs only `SELECT, INSERT, UPDATE, DELETE` on them).
pub const CREATE_TABLES: &str = "\
CREATE TABLE IF NOT EXISTS distlock_epoch (
  id TINYINT UNSIGNED NOT NULL PRIMARY KEY,
  epoch BIGINT UNSIGNED NOT NULL
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS distlock_run (
  id TINYINT UNSIGNED NOT NULL PRIMARY KEY,
  epoch BIGINT UNSIGNED NOT NULL,
  base BIGINT UNSIGNED NOT NULL
) ENGINE=MEMORY;
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

/// A grant's fencing token, as text, an expression binding the lock's name: the run's
/// epoch times 2^64 plus the count of `UUID_SHORT()` values the server handed out since
/// the run's base (a server-global counter under a mutex, so later calls give larger
/// values); read by [`fence_token`]. `'-'` without a run row (see [`establish_run`]),
/// and also unless this session holds the name: so a server that evaluated it before
/// the grant would fail closed (no token, and the grant is undone), never hand out a
/// token drawn before the grant.
///
/// The run row may be read when the statement starts (MariaDB reads a one-row table
/// while planning): it cannot change under the statement, whose read lock on the
/// MEMORY table holds a `DELETE` or `INSERT` of it until the statement ends.
macro_rules! holder_fence {
    () => {
        "COALESCE((SELECT IF(IS_USED_LOCK(?) = CONNECTION_ID(), \
         CAST(r.epoch * 18446744073709551616 + (UUID_SHORT() - r.base) AS CHAR), NULL) \
         FROM distlock_run r WHERE r.id = 1), '-')"
    };
}

/// A try on a shared session, binding the name three times, answered as [`WAIT_LOCK`]
/// is (read by [`lock_answer`], the wait being `0`): `'0'` when the name is in use (by
/// anyone, this session included: `GET_LOCK` on a session that holds the lock would
/// succeed again, so a name in use is never asked for), `NULL` on a server error, and
/// on a grant `0`, a space and the token ([`holder_fence`]).
///
/// No derived table: materialising one costs about as much as the rest of the
/// statement (a try that read its token through two of them cost the server 8–10 µs
/// more per lock cycle). `ELT` evaluates its index once and then only the argument it
/// picks, so the token is drawn only after `GET_LOCK` returned 1.
pub(crate) const TRY_LOCK: &str = concat!(
    "SELECT ELT(IF(IS_USED_LOCK(?) IS NULL, GET_LOCK(?, 0), 0) + 1, '0', CONCAT('0 ', ",
    holder_fence!(),
    "))"
);
/// A wait on a dedicated session, `?` seconds at most, binding the name, the seconds
/// and the name, in one column (read by [`lock_answer`]): `'0'` when it timed out;
/// `NULL` when `GET_LOCK` answered `NULL` (an error on the server); on a grant, how
/// long the statement waited, in microseconds by the server's clock (`SYSDATE(6)` read
/// after `GET_LOCK` returned, `NOW(6)` at the statement's start), a space, and the
/// token ([`holder_fence`]). As in [`TRY_LOCK`], `ELT` draws the token only after the
/// grant, and no derived table is used.
pub(crate) const WAIT_LOCK: &str = concat!(
    "SELECT ELT(GET_LOCK(?, ?) + 1, '0', \
     CONCAT(CAST(TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6)) AS SIGNED), ' ', ",
    holder_fence!(),
    "))"
);

/// What [`TRY_LOCK`] or [`WAIT_LOCK`] answered.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum LockAnswer {
    /// `GET_LOCK` answered `NULL`: an error on the server.
    Failed,
    /// The name was in use (a try), or the wait timed out.
    NotGranted,
    /// Granted after `waited` µs (server clock; `0` for a try), with the token read by
    /// [`fence_token`].
    Granted { waited: i64, token: Option<u64> },
}

/// Reads [`TRY_LOCK`]'s or [`WAIT_LOCK`]'s answer.
pub(crate) fn lock_answer(answer: Option<&str>) -> LockAnswer {
    let Some(answer) = answer else {
        return LockAnswer::Failed;
    };
    let Some((waited, fence)) = answer.split_once(' ') else {
        return LockAnswer::NotGranted;
    };
    LockAnswer::Granted {
        waited: waited.parse().unwrap_or(0),
        token: fence_token(fence),
    }
}

/// The fencing token in [`holder_fence`]'s text: the epoch times 2^44 plus the count.
/// `None` for `'-'`, once 2^44 values were used in one run (a grant without a token
/// fails rather than hand out a lower one), past `i64::MAX` (tokens are kept as
/// signed 64-bit integers by fenced stores), or for `0`.
pub(crate) fn fence_token(fence: &str) -> Option<u64> {
    let v = fence.parse::<u128>().ok()?;
    let (epoch, count) = (v >> 64, v & u128::from(u64::MAX));
    (count < 1 << 44)
        .then_some((epoch << 44) | count)
        .and_then(|t| u64::try_from(t).ok())
        .filter(|t| (1..=i64::MAX.unsigned_abs()).contains(t))
}

/// The token of a permit slot this session holds, binding the slot's name (in the
/// permit's transaction, after its `GET_LOCK`): [`holder_fence`]'s text.
pub(crate) const SLOT_FENCE: &str = concat!("SELECT ", holder_fence!());
/// The current run's epoch, if the run row exists.
const RUN_EPOCH: &str = "SELECT CAST(epoch AS SIGNED) FROM distlock_run WHERE id = 1";
/// Raises the durable epoch by one (autocommitted: durable before the next statement),
/// read back through `LAST_INSERT_ID`.
const RAISE_EPOCH: &str = "INSERT INTO distlock_epoch (id, epoch) VALUES (1, LAST_INSERT_ID(1)) \
     ON DUPLICATE KEY UPDATE epoch = LAST_INSERT_ID(epoch + 1)";
/// The run row with epoch `?`, based at the next `UUID_SHORT()`, unless another client
/// wrote it first.
const START_RUN: &str =
    "INSERT IGNORE INTO distlock_run (id, epoch, base) VALUES (1, ?, UUID_SHORT())";
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

/// Makes sure the server's current run has its run row before this session hands out
/// a token: a server start empties [`RUN_TABLE`] (a MEMORY table), and the first
/// session after it raises the durable epoch, then writes the run row. Every epoch
/// used was read from the durable row, which only rises, and a run's row is written
/// only after its epoch was committed; so every token of a run is above every token
/// of the runs before it, whether the server stopped or crashed, and whatever its
/// clock did. Within a run, tokens follow `UUID_SHORT()`, a server-global counter.
///
/// # Errors
/// As the statements' (run within the caller's timeout).
pub(crate) async fn establish_run(conn: &mut MySqlConnection) -> Result<(), sqlx::Error> {
    let epoch: Option<i64> = sqlx::query_scalar(RUN_EPOCH)
        .fetch_optional(&mut *conn)
        .await?;
    if epoch.is_some() {
        return Ok(());
    }
    let raised = sqlx::query(RAISE_EPOCH)
        .execute(&mut *conn)
        .await?
        .last_insert_id();
    sqlx::query(START_RUN)
        .bind(raised)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

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
             WHERE table_schema = DATABASE() AND table_name IN (?, ?, ?, ?)",
        )
        .bind(FENCE_TABLE)
        .bind(RUN_TABLE)
        .bind(PERMITS_TABLE)
        .bind(ELECTION_TABLE)
        .fetch_all(&mut *conn),
    )
    .await
    .map_err(|_| no_answer(address, limit))?
    .map_err(lock_error)?;
    for statement in CREATE_TABLES.split_inclusive(';') {
        let Some(table) = [FENCE_TABLE, RUN_TABLE, PERMITS_TABLE, ELECTION_TABLE]
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

#[cfg(test)]
mod tests {
    use super::{lock_answer, LockAnswer};

    #[test]
    fn a_lock_answer_splits_into_the_wait_and_the_token() {
        let granted = |waited, token| LockAnswer::Granted { waited, token };
        assert_eq!(lock_answer(None), LockAnswer::Failed);
        assert_eq!(lock_answer(Some("0")), LockAnswer::NotGranted);
        // Epoch 3, count 5: 3 × 2^64 + 5.
        let answer = format!("120 {}", (3u128 << 64) + 5);
        assert_eq!(
            lock_answer(Some(&answer)),
            granted(120, Some((3 << 44) + 5))
        );
        // Granted without a run row, or past the run's 2^44 values: no token.
        assert_eq!(lock_answer(Some("7 -")), granted(7, None));
        let spent = format!("7 {}", (3u128 << 64) + (1 << 44));
        assert_eq!(lock_answer(Some(&spent)), granted(7, None));
        // A token past i64::MAX is none either.
        let high = format!("7 {}", 1u128 << 83);
        assert_eq!(lock_answer(Some(&high)), granted(7, None));
    }
}
