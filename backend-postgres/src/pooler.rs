//! The session design's refusal of a transaction pooler.
//!
//! Session advisory locks belong to a server session. A transaction pooler (PgBouncer's
//! `pool_mode = transaction`) lends a server connection to a client for one
//! transaction only: a lock taken through it stays on a server connection that other
//! clients use next (advisory locks are re-entrant per session, so two clients could
//! both be granted the same key), and is freed only when that connection closes. So the
//! session design ([`crate::PoolMode::Session`]) makes sure, before it takes any lock,
//! that its first connection is its own server session, and fails with a
//! [`LockError::Config`] naming the cure otherwise:
//!
//! - **Is anything in between?** The first connection asks the server which port it
//!   serves (`inet_server_port()`); straight to the server, it is the port the URL
//!   names, and the check ends there (no extra connection).
//! - **Is it a transaction pooler?** Otherwise a second connection and the first ask
//!   in turn, eight times, for their server process id. The first connection's own
//!   session always answers with the same id, and never with the second's; through a
//!   transaction pooler each statement runs on whichever server connection the pooler
//!   lends (PgBouncer lends the most recently released first, so the second
//!   connection usually gets the one the first just used). A changed id, a shared id,
//!   or no answer within a second means a transaction pooler.
//! - **Its errors.** A pooler's refusal of the start-up settings, and the prepared
//!   statement errors a transaction pooler causes, are turned into the same kind of
//!   error (see `crate::error`).
//!
//! The probe is a heuristic: under other clients' load a transaction pooler could lend
//! the first connection the same server connection every time, and the second others. The pooler's
//! own errors catch most of what it misses.

use std::time::Duration;

use distlock_api::LockError;
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection as _, PgConnection, Row as _};
use tokio::time::timeout;

use crate::config::server_address;
use crate::error::transaction_pooler;
use crate::xact_sql::run;
use crate::POSTGRES_BACKEND;

/// How long the first connection's own session may take to answer during the probe,
/// and the probe's connection to be served.
const OWN_SESSION_ANSWER: Duration = Duration::from_secs(1);
/// Rounds of the probe: each asks the second connection, then the first, for its
/// server process.
const PROBE_ROUNDS: usize = 8;

/// The pid of the session `conn` is on, within `limit` (`None` on timeout).
async fn pid(conn: &mut PgConnection, limit: Duration) -> Result<Option<i32>, LockError> {
    match timeout(limit, run(conn, "SELECT pg_backend_pid()")).await {
        Err(_) => Ok(None),
        Ok(rows) => {
            let rows = rows.map_err(crate::error::lock_error)?;
            let row = rows.last().ok_or_else(|| {
                LockError::backend_error(POSTGRES_BACKEND, "no row from pg_backend_pid()")
            })?;
            Ok(Some(row.try_get(0).map_err(crate::error::lock_error)?))
        }
    }
}

/// Fails with [`transaction_pooler`] when `conn` (the client's first connection, made
/// with `options`) is not a server session of its own; see the module docs. Returns
/// whether something stands between the client and the server (a session pooler, a
/// proxy): its start-up settings may have been dropped, and must be restated.
///
/// # Errors
/// [`LockError::Config`] behind a transaction pooler; connection and backend errors.
pub(crate) async fn refuse_transaction_pooler(
    conn: &mut PgConnection,
    options: &PgConnectOptions,
    limit: Duration,
) -> Result<bool, LockError> {
    let address = server_address(options);
    let direct = timeout(limit, run(conn, "SELECT inet_server_port()"))
        .await
        .map_err(|_| crate::error::connection("no answer to the first query"))?
        .map_err(crate::error::lock_error)?;
    let served: Option<i32> = direct
        .last()
        .and_then(|row| row.try_get::<Option<i32>, _>(0).ok())
        .flatten();
    let tcp = options.get_socket().is_none();
    if tcp && served == Some(i32::from(options.get_port())) {
        return Ok(false);
    }
    let Some(first) = pid(conn, limit).await? else {
        return Err(crate::error::connection("no answer to the first query"));
    };
    // The probe: a connection of its own. If it cannot be had in time (a session pool
    // with every server connection in use), nothing can be concluded: the pooler's
    // own errors remain the check.
    let Ok(Ok(mut probe)) = timeout(limit, PgConnection::connect_with(options)).await else {
        tracing::debug!(%address, "could not open the pooler probe's connection");
        return Ok(true);
    };
    let verdict = async {
        for _ in 0..PROBE_ROUNDS {
            // Bounded short: in a full session pool the probe waits for a server
            // connection, and a connect should not wait on it for long.
            let Some(other) = pid(&mut probe, OWN_SESSION_ANSWER).await? else {
                return Ok::<_, LockError>(None);
            };
            if other == first {
                return Ok(Some(
                    "a second connection was served by the first one's server process",
                ));
            }
            match pid(conn, OWN_SESSION_ANSWER).await? {
                None => {
                    return Ok(Some(
                        "the first connection waited for a server connection to be lent",
                    ))
                }
                Some(again) if again != first => {
                    return Ok(Some(
                        "the first connection's server process changed between statements",
                    ))
                }
                Some(_) => {}
            }
        }
        Ok(None)
    }
    .await;
    let _ = timeout(limit, probe.close()).await;
    match verdict? {
        Some(evidence) => Err(transaction_pooler(&address, evidence)),
        None => Ok(true),
    }
}
