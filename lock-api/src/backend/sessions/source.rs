//! [`SessionSource`]: a client's state as the session code sees it, and the ways a
//! client reaches its sessions: the least busy shared one, a dedicated one, the one
//! holding a lease.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, OwnedSemaphorePermit};
use tokio::time::{timeout_at, Instant};

use super::handle::{Failure, Kind, LeaseCommand, Reply, SessionHandle};
use super::pool::SessionPool;
use crate::{LockError, LockKey};

/// Attempts on other sessions when the chosen one closed before running a command.
pub const SESSION_ATTEMPTS: usize = 4;

/// A client's state, shared by its handles and its session tasks: where its sessions
/// are, and how it opens one.
pub trait SessionSource: Send + Sync + 'static {
    /// The backend's commands.
    type Command: Send + 'static;

    /// The backend's name, in errors.
    const BACKEND: &'static str;

    /// Why opening a dedicated session may outlast a wait: said when it does (see
    /// [`dedicated_session`]).
    const NO_SESSION_FREE: &'static str;

    /// The client's sessions.
    fn sessions(&self) -> &Arc<SessionPool<Self::Command>>;

    /// Opens a session of `kind` and starts its task.
    fn open(
        self: Arc<Self>,
        kind: Kind,
    ) -> impl Future<Output = Result<Arc<SessionHandle<Self::Command>>, LockError>> + Send + 'static;

    /// A connection error with a message of ours, naming the server's address.
    fn connection_error(&self, why: &str) -> LockError;
}

/// The least busy shared session of `state`, opening one if all are busy and there
/// is room (see [`SessionPool::shared_session`]).
///
/// # Errors
/// When no session is open and opening one fails.
pub async fn shared_session<S: SessionSource>(
    state: &Arc<S>,
) -> Result<Arc<SessionHandle<S::Command>>, LockError> {
    state
        .sessions()
        .shared_session(|| state.clone().open(Kind::Shared))
        .await
}

/// An idle dedicated session of `state`, or a new one. The caller holds a wait slot.
///
/// # Errors
/// When opening a session fails.
pub async fn wait_session<S: SessionSource>(
    state: &Arc<S>,
) -> Result<Arc<SessionHandle<S::Command>>, LockError> {
    state
        .sessions()
        .wait_session(|| state.clone().open(Kind::Wait))
        .await
}

/// A wait slot and a dedicated session (idle or new) for a grab of `key`, waiting
/// for both until `deadline` (`None`: as long as it takes); `None` when no slot came
/// free in time. Opening a session counts against the wait too.
///
/// # Errors
/// A connection error when opening the session fails, or outlasts the deadline
/// (the message says [`SessionSource::NO_SESSION_FREE`]).
pub async fn dedicated_session<S: SessionSource>(
    state: &Arc<S>,
    deadline: Option<Instant>,
    key: &LockKey,
) -> Result<Option<(OwnedSemaphorePermit, Arc<SessionHandle<S::Command>>)>, LockError> {
    let slot = state
        .sessions()
        .wait_slot(deadline)
        .await
        .map_err(|_| state.connection_error("the client is shutting down"))?;
    let Some(slot) = slot else {
        return Ok(None);
    };
    let session = match deadline {
        Some(d) => {
            let started = Instant::now();
            timeout_at(d, wait_session(state)).await.map_err(|_| {
                state.connection_error(&format!(
                    "waited {:?} for a new session to wait for {key} in: {}",
                    started.elapsed(),
                    S::NO_SESSION_FREE
                ))
            })??
        }
        None => wait_session(state).await?,
    };
    Ok(Some((slot, session)))
}

/// Runs the command `command` makes (a read-only one) on a shared session, on another
/// if that one closed before running it.
///
/// # Errors
/// The command's error; a connection error when no session is usable.
pub async fn ask<S: SessionSource, T>(
    state: &Arc<S>,
    command: impl Fn(Reply<T>) -> S::Command,
) -> Result<T, LockError> {
    for _ in 0..SESSION_ATTEMPTS {
        let session = shared_session(state).await?;
        let (tx, rx) = oneshot::channel();
        if session.run(command(tx)).await.is_err() {
            continue;
        }
        match rx.await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(Failure::Closed)) | Err(_) => continue,
            Ok(Err(Failure::Lock(e))) => return Err(e),
            Ok(Err(Failure::Mismatch(_))) => {
                return Err(LockError::backend_error(
                    S::BACKEND,
                    "a permit count answer to a look-up",
                ))
            }
        }
    }
    Err(state.connection_error("no usable session: every one tried closed"))
}

/// Sends the command `command` makes to the session holding `owner`'s lease; `None` if
/// no session of this client holds it (any more).
///
/// # Errors
/// The command's error.
pub async fn to_holder<S: SessionSource, T>(
    state: &S,
    owner: u128,
    command: impl FnOnce(Reply<T>) -> S::Command,
) -> Result<Option<T>, LockError> {
    let Some(session) = state.sessions().route(owner) else {
        return Ok(None);
    };
    let (tx, rx) = oneshot::channel();
    if session.run(command(tx)).await.is_err() {
        return Ok(None);
    }
    match rx.await {
        Ok(Ok(value)) => Ok(Some(value)),
        // The session ended before running it, and its locks with it.
        Ok(Err(Failure::Closed)) | Err(_) => Ok(None),
        Ok(Err(Failure::Lock(e))) => Err(e),
        Ok(Err(Failure::Mismatch(_))) => Err(LockError::backend_error(
            S::BACKEND,
            "a permit count answer to a release or extend",
        )),
    }
}

/// Owner-checked release of `owner`'s lease: `true` if this client held it and
/// released it now, `false` if it holds it no more.
///
/// # Errors
/// The release's error (a broken session: its locks ended with it).
pub async fn release<S>(state: &S, owner: u128) -> Result<bool, LockError>
where
    S: SessionSource,
    S::Command: From<LeaseCommand>,
{
    let released = to_holder(state, owner, |reply| {
        LeaseCommand::Release {
            owner,
            reply: Some(reply),
        }
        .into()
    })
    .await?;
    Ok(released == Some(true))
}

/// Owner-checked extension of `owner`'s lease to `ttl` from a proof of life: the new
/// validity deadline, or `None` if this client holds it no more.
///
/// # Errors
/// The proof's error (a broken session: its locks ended with it).
pub async fn extend<S>(state: &S, owner: u128, ttl: Duration) -> Result<Option<Instant>, LockError>
where
    S: SessionSource,
    S::Command: From<LeaseCommand>,
{
    let extended = to_holder(state, owner, |reply| {
        LeaseCommand::Extend { owner, ttl, reply }.into()
    })
    .await?;
    Ok(extended.flatten())
}

/// Queues the release of `owner`'s lease on `session` without waiting for it: the
/// compensation for a grant in flight whose caller went away (queued behind the grant,
/// it runs after it, whatever the grant's outcome). `false` if the session is gone
/// (and its locks with it).
pub fn compensate<C: From<LeaseCommand>>(session: &SessionHandle<C>, owner: u128) -> bool {
    session
        .send(LeaseCommand::Release { owner, reply: None }.into())
        .is_ok()
}
