//! Leader election: one `GET_LOCK` per election name, with the leader's identity in a
//! table beside it.
//!
//! - **Leadership** is the lock `election_name(name)` (`de#` and a hash: its own name
//!   space, apart from the mutex's and the semaphore's), granted as the mutex's is: a
//!   try on a shared session, then a wait in `GET_LOCK` on a dedicated one. At most
//!   one leader per name while the server runs.
//! - **Term**: the grant's fencing token from the counter of the election's lock name,
//!   so terms rise strictly per name.
//! - **Identity**: before the campaign returns, the granting session writes the row
//!   `(name, candidate, term, connection_id)` of `distlock_election`, where
//!   `connection_id` is its `CONNECTION_ID()`. [`leader`] returns the row only while
//!   that connection holds the election's lock (`IS_USED_LOCK`), so the row of a
//!   leader whose session ended never reads as leader. A resign (and the TTL's expiry)
//!   deletes the row, owner-checked by term, before releasing; a stale row is
//!   overwritten by the next leader: at most one row per election name.
//! - **Observers** poll (`wait_change`'s default).

use std::sync::Arc;

use distlock_api::{Candidate, FencingToken, Leader, LockError, LockKey};

use crate::keys::election_name;
use crate::lock::Plan;
use crate::mailbox::{Command, Seat};
use crate::{MySqlLock, MYSQL_BACKEND};

/// How `candidate` campaigns for `name`: taken as the mutex's lock, and recorded as the
/// leader by the granting session before it is handed out.
pub(crate) fn plan(name: &LockKey, candidate: &Candidate) -> Plan {
    Plan::Lead(Arc::new(Seat {
        name: election_name(name),
        candidate: candidate.as_bytes().to_vec(),
    }))
}

/// The current leader of `name`: its row, while the session that wrote it holds the
/// election's lock.
///
/// # Errors
/// Connection and backend errors; [`LockError::Backend`] for a row holding no valid
/// candidate identity.
pub(crate) async fn leader(locks: &MySqlLock, name: &LockKey) -> Result<Option<Leader>, LockError> {
    let lock = election_name(name);
    let row = locks
        .ask(|reply| Command::Leader {
            name: lock.clone(),
            reply,
        })
        .await?;
    row.map(|(candidate, term)| {
        let candidate = Candidate::new(candidate).map_err(|e| {
            LockError::backend_error(
                MYSQL_BACKEND,
                format!("the leader row of election {name} holds no valid identity: {e}"),
            )
        })?;
        Ok(Leader::new(candidate, FencingToken::new(term)))
    })
    .transpose()
}
