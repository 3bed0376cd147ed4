//! The semaphore's permits: one `GET_LOCK` per permit slot, beside a row that records
//! the permit count in use.
//!
//! Protocol, per key `K` and count `M`: permit `i` is the lock `permit_slot_name(K, i)`,
//! for `i` in `0..M`, held by a dedicated session of the client (one of
//! [`crate::MySqlConfig::wait_sessions`]) for as long as the permit is held, and
//! released with `RELEASE_ALL_LOCKS()` on it. A try runs one transaction on that
//! session:
//! 1. upsert and lock (`FOR UPDATE`) the row `permit_count_name(K)` of
//!    `distlock_permits`, which serialises every try of `K`;
//! 2. if the row records another count `M'`, look whether any of the `M'` slots is in
//!    use (`IS_USED_LOCK`): if one is, the try is refused with
//!    [`distlock_api::LockError::PermitMismatch`] and nothing is taken; if none is, the
//!    holders of `M'` are gone and the row takes `M`;
//! 3. `GET_LOCK(slot, 0)` on the first free slot, and on a grant the next fencing
//!    token (see `sql::establish_run`: tokens rise across every key, so per key across
//!    all its slots);
//! 4. commit.
//!
//! Since every try of `K` holds the row's lock from its read of the count to its
//! commit, and a count changes only when no slot of the old count is in use, holders
//! with two counts never meet. A waiting acquire polls at the options' backoff: no
//! server queue spans several slots. The table keeps one row per semaphore key ever
//! used (a few dozen bytes each), as the fencing table keeps one per lock name.

use distlock_api::LockKey;
use sqlx::{Executor as _, MySqlConnection};

use crate::keys::{permit_count_name, permit_slot_name};
use crate::sql::{fence_token, SLOT_FENCE};

/// Why a semaphore acquire neither waits in FIFO order nor is woken by a release: a
/// permit waiter is held in no queue of the server's.
pub(crate) const POLLED: &str =
    "a permit waiter polls the slots at the options' backoff; it does not queue";

/// What a permit try found.
pub(crate) enum PermitAnswer {
    /// Slot `slot` (its lock name) was taken, with this fencing token.
    Granted { slot: String, token: u64 },
    /// Every slot is held.
    Full,
    /// The semaphore is in use with this other permit count; nothing was taken.
    Mismatch(u32),
}

/// `SELECT` of one flag per name, as `?` placeholders: `expression` applied to each.
fn flags(expression: &str, count: usize) -> String {
    let items: Vec<String> = (0..count).map(|_| expression.to_owned()).collect();
    format!("SELECT CAST(CONCAT_WS(',', {}) AS CHAR)", items.join(", "))
}

/// Whether any slot of the semaphore `key`, under the permit count its row records,
/// is held by anyone.
pub(crate) async fn permits_in_use(
    conn: &mut MySqlConnection,
    key: LockKey,
) -> Result<bool, sqlx::Error> {
    let stored: Option<i64> =
        sqlx::query_scalar("SELECT CAST(permits AS SIGNED) FROM distlock_permits WHERE name = ?")
            .bind(permit_count_name(&key))
            .fetch_optional(&mut *conn)
            .await?;
    let stored = stored
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(0)
        .min(distlock_api::MAX_PERMITS);
    slots_in_use(conn, &key, stored).await
}

/// Whether any of the first `count` slots of `key` is held by anyone.
async fn slots_in_use(
    conn: &mut MySqlConnection,
    key: &LockKey,
    count: u32,
) -> Result<bool, sqlx::Error> {
    if count == 0 {
        return Ok(false);
    }
    let sql = flags("IS_USED_LOCK(?) IS NOT NULL", count as usize);
    let mut query = sqlx::query_scalar::<_, String>(&sql);
    for slot in 0..count {
        query = query.bind(permit_slot_name(key, slot));
    }
    let used = query.fetch_one(&mut *conn).await?;
    Ok(used.split(',').any(|flag| flag == "1"))
}

/// The permit try of `max` permits of `key` on `conn`, a dedicated session holding
/// nothing (see the module docs). On an error the caller rolls back and releases
/// every lock of the session.
pub(crate) async fn try_permit(
    conn: &mut MySqlConnection,
    key: LockKey,
    max: u32,
) -> Result<PermitAnswer, sqlx::Error> {
    let count_name = permit_count_name(&key);
    (&mut *conn).execute("START TRANSACTION").await?;
    sqlx::query(
        "INSERT INTO distlock_permits (name, permits) VALUES (?, ?) \
         ON DUPLICATE KEY UPDATE permits = permits",
    )
    .bind(&count_name)
    .bind(max)
    .execute(&mut *conn)
    .await?;
    let stored: i64 = sqlx::query_scalar(
        "SELECT CAST(permits AS SIGNED) FROM distlock_permits WHERE name = ? FOR UPDATE",
    )
    .bind(&count_name)
    .fetch_one(&mut *conn)
    .await?;
    let stored = u32::try_from(stored)
        .unwrap_or(max)
        .min(distlock_api::MAX_PERMITS);
    if stored != max {
        if slots_in_use(conn, &key, stored).await? {
            (&mut *conn).execute("ROLLBACK").await?;
            return Ok(PermitAnswer::Mismatch(stored));
        }
        sqlx::query("UPDATE distlock_permits SET permits = ? WHERE name = ?")
            .bind(max)
            .bind(&count_name)
            .execute(&mut *conn)
            .await?;
    }
    let slots: Vec<String> = (0..max).map(|slot| permit_slot_name(&key, slot)).collect();
    let sql = flags("IS_FREE_LOCK(?)", slots.len());
    let mut query = sqlx::query_scalar::<_, String>(&sql);
    for slot in &slots {
        query = query.bind(slot);
    }
    let free = query.fetch_one(&mut *conn).await?;
    let mut taken = None;
    for (slot, flag) in slots.into_iter().zip(free.split(',')) {
        if flag != "1" {
            continue;
        }
        let got: Option<i64> = sqlx::query_scalar("SELECT CAST(GET_LOCK(?, 0) AS SIGNED)")
            .bind(&slot)
            .fetch_one(&mut *conn)
            .await?;
        if got == Some(1) {
            taken = Some(slot);
            break;
        }
    }
    let answer = match taken {
        Some(slot) => {
            let fence: String = sqlx::query_scalar(SLOT_FENCE)
                .bind(&slot)
                .fetch_one(&mut *conn)
                .await?;
            match fence_token(&fence) {
                Some(token) => PermitAnswer::Granted { slot, token },
                // No run row (see `sql::establish_run`): refused, and the caller rolls
                // back and releases what the try took.
                None => {
                    return Err(sqlx::Error::Protocol(
                        "no fencing token: the server's fencing run has no row".into(),
                    ))
                }
            }
        }
        None => PermitAnswer::Full,
    };
    (&mut *conn).execute("COMMIT").await?;
    Ok(answer)
}
