//! Leader election: one session advisory lock per election name, with the leader's
//! identity in a table beside it.
//!
//! - **Leadership** is a session advisory lock on the name's election id (SHA-256 of
//!   `"distlock-election"`, a zero byte and the name: its own key space, apart from
//!   the mutex's, semaphore's and read-write lock's ids of the same name), granted as
//!   the mutex's is: a try on a shared session, then a wait in the server's queue on a
//!   dedicated one. At most one leader per name while the server runs; a resign hands
//!   the lock to the first waiting candidate inside the server (woken by the server,
//!   FIFO, no polling).
//! - **Term**: the grant's token from the fencing sequence, taken after the lock in
//!   the same statement, so terms rise strictly per name (and across names).
//! - **Identity**: before the campaign returns, the granting session writes the row
//!   `(name, candidate, term, pid)` of the table `distlock.election` (created on the
//!   client's first campaign or look-up if missing, as the sequence is), where `pid`
//!   is its server process. [`leader`] returns the row only while that process holds
//!   the election's lock (per `pg_locks`), so the row of a leader whose session ended
//!   (a crash, a cut connection, a server-side timeout) never reads as leader. A
//!   resign (and the TTL's expiry) deletes the row, owner-checked by term, before
//!   unlocking; a stale row is overwritten by the next leader. So the table holds at
//!   most one row per election name ever led and not resigned: bounded by the live
//!   names. A leader's `remaining` is `None`: the lease is the session's.
//! - **Loss and crashes**: as the mutex's. A crashed process's connection closes and
//!   the next candidate leads at once; a silent or frozen one is cut off by the server
//!   within [`crate::PostgresConfig::dead_holder_bound`] of its last round trip, and
//!   learns it (its leadership's `lost()`) by its validity deadline.
//! - **Observers**: `wait_change` keeps the polling default (every
//!   [`distlock_api::OBSERVE_POLL`]): the end of a crashed leader's session notifies
//!   nobody, so a `LISTEN` would still need the poll, and one more connection.
//!
//! Caveat: the process id in a row is recycled by the operating system. If a crashed
//! leader's pid comes back as the session of the next leader of the same name, that
//! leader reads as the old identity for the one round trip between its grant and its
//! row.

use std::sync::Arc;

use distlock_api::{Candidate, FencingToken, Leader, LockError, LockKey};
use sqlx::Connection as _;
use tokio::time::timeout;

use crate::keys::election_advisory_key;
use crate::lock::Plan;
use crate::mailbox::{Probe, Seat};
use crate::session;
use crate::sql::ensure_election_table;
use crate::{PostgresLock, POSTGRES_BACKEND};

/// Creates the election table on the client's first use of it, on a connection of its
/// own; each step is bounded by the request timeout (and a waiting campaign by its
/// wait, which the caller cuts).
pub(crate) async fn ready(locks: &PostgresLock) -> Result<(), LockError> {
    locks
        .election_table()
        .get_or_try_init(|| async {
            let settings = locks.settings();
            let limit = settings.config.request_timeout;
            let mut conn = session::connect(&settings.connect, limit).await?;
            let created = timeout(
                limit,
                ensure_election_table(&mut conn, &settings.config.schema, &settings.sql),
            )
            .await
            .unwrap_or_else(|_| {
                Err(settings.connection_error(format!(
                    "no answer within {limit:?} while checking the election table"
                )))
            });
            let _ = timeout(limit, conn.close()).await;
            created
        })
        .await
        .map(|_| ())
}

/// How `candidate` campaigns for `name`: taken as the mutex's lock, and recorded as the
/// leader by the granting session before it is handed out.
pub(crate) fn plan(name: &LockKey, candidate: &Candidate) -> Plan {
    Plan::Lead(Arc::new(Seat {
        name: name.as_str().to_owned(),
        candidate: candidate.as_bytes().to_vec(),
    }))
}

/// The advisory key of the election `name`.
pub(crate) fn hash(name: &LockKey) -> i64 {
    election_advisory_key(name)
}

/// What finds the holder of the election `name`'s lock.
pub(crate) fn probe(name: &LockKey) -> Probe {
    Probe::key(election_advisory_key(name))
}

/// The current leader of `name`: its row, while the session that wrote it holds the
/// election's lock.
///
/// # Errors
/// Connection and backend errors; [`LockError::Backend`] for a row holding no valid
/// candidate identity.
pub(crate) async fn leader(
    locks: &PostgresLock,
    name: &LockKey,
) -> Result<Option<Leader>, LockError> {
    ready(locks).await?;
    let row = locks.leader_row(name, hash(name)).await?;
    row.map(|(candidate, term)| leader_of(name, candidate, term))
        .transpose()
}

/// The leader a row of the election `name` records.
///
/// # Errors
/// [`LockError::Backend`] for a row holding no valid candidate identity.
pub(crate) fn leader_of(
    name: &LockKey,
    candidate: Vec<u8>,
    term: i64,
) -> Result<Leader, LockError> {
    let candidate = Candidate::new(candidate).map_err(|e| {
        LockError::backend_error(
            POSTGRES_BACKEND,
            format!("the leader row of election {name} holds no valid identity: {e}"),
        )
    })?;
    Ok(Leader::new(
        candidate,
        FencingToken::new(term.unsigned_abs()),
    ))
}
