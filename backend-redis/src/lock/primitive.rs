//! What the semaphore, the read-write lock and election share on top of the mutex's
//! machinery: the one node they run on, an attempt's script answer turned into a
//! grant, and owner-checked release and extend. Waiting is the mutex's own loop
//! ([`RedisLock::contend`]: wake-ups, the `:waiting` marker, turns).

use std::sync::LazyLock;
use std::time::Duration;

use distlock_api::backend::prelude::*;
use distlock_api::backend::Grant;
use distlock_api::{
    Capability, ExtendOutcome, FencingToken, Lease, LeaseMonitor, LockError, LockKey, LockOptions,
    OwnerToken, Primitive, ReleaseOutcome,
};
use redis::{Cmd, Script};
use tokio::time::Instant;

use super::{too_late, Attempt, RedisLock};
use crate::keys::KeyNames;
use crate::node::{evalsha, hex, ttl_millis, Node};
use crate::REDIS_BACKEND;

/// Why Redlock offers neither a semaphore nor a read-write lock.
pub(crate) const REDLOCK_NO_PRIMITIVES: &str = "Redlock's nodes would each count holders themselves: a holder counted on a majority is not on every node, so the counts of different majorities disagree and more than N permits (or a reader beside a writer) could be granted; use a single node, Sentinel or Cluster";

/// Why the semaphore and the read-write lock grant in no particular order.
pub(crate) const PRIMITIVES_NOT_FIFO: &str = "the Redis semaphore and read-write lock keep no queue of waiters (the FIFO queue is the mutex's); waiters are granted in no particular order, with writer preference for the read-write lock";

impl RedisLock {
    /// The one node `primitive` (the semaphore, the read-write lock, election) runs on.
    ///
    /// # Errors
    /// [`LockError::Unsupported`] on a Redlock client, with the reason its
    /// capabilities give (which refuse every acquire of these before it gets here; a
    /// lease from another client may still).
    pub(crate) fn primitive_node(&self, primitive: Primitive) -> Result<&Node, LockError> {
        match self.inner.nodes.as_slice() {
            [node] => Ok(node),
            _ => {
                let reason = match self.capabilities().of(primitive).offered {
                    Capability::Unsupported(reason) => reason,
                    Capability::Supported => "it needs exactly one node",
                };
                Err(LockError::Unsupported {
                    backend: self.name(),
                    operation: primitive.as_str(),
                    reason,
                })
            }
        }
    }
}

/// One primitive's acquire, release and extend scripts.
pub(crate) struct Scripts {
    /// The primitive they serve.
    pub(crate) primitive: Primitive,
    /// Answers `{1, token}`, `{0, ms until a holder lapses}` or `{2, detail}`.
    pub(crate) acquire: &'static LazyLock<Script>,
    /// Owner-checked release (see [`Node::release_with`]).
    pub(crate) release: &'static LazyLock<Script>,
    /// Owner-checked extend (see [`Node::extend_with`]).
    pub(crate) extend: &'static LazyLock<Script>,
}

/// What one acquire script run answered.
pub(crate) enum Answer {
    /// Granted, with the lease's fencing token (for a campaign, its term).
    Granted(Grant),
    /// Held; a holder lapses within this long, when known.
    Held(Option<Duration>),
    /// `{2, detail}`: the primitive's refusal (a semaphore's count in use).
    Refused(i64),
}

/// Runs one attempt of `scripts.acquire` on the client's node for `key` (`KEYS = [lock,
/// fence]`, the fence the mutex's counter ([`Node::fence`]); `ARGV = [token, ttl_ms,
/// waiting_ms, extra…]`, the extras added by `extra`). Until the grant is handed out, a
/// dropped or failed attempt releases in the background whatever grant may have landed.
///
/// # Errors
/// The node's errors; a connection error when the answer came too late to leave any
/// validity; a backend error for an answer of another shape.
pub(crate) async fn attempt(
    lock: &RedisLock,
    key: &LockKey,
    names: &KeyNames,
    options: &LockOptions,
    scripts: &'static Scripts,
    waiting: Option<Duration>,
    extra: impl FnOnce(&mut Cmd),
) -> Result<Answer, LockError> {
    let node = lock.primitive_node(scripts.primitive)?;
    let (owner, ttl) = (OwnerToken::random(), options.ttl());
    let mut cmd = evalsha(scripts.acquire, &[&names.lock, &node.fence(names)]);
    cmd.arg(&hex(owner)[..])
        .arg(ttl_millis(ttl))
        .arg(waiting.map_or(0, ttl_millis));
    extra(&mut cmd);
    let started = Instant::now();
    let undo = Undo {
        lock: lock.clone(),
        names: names.clone(),
        owner,
        scripts,
        armed: true,
    };
    let (answer, short): (Vec<i64>, _) = node.run_acked(scripts.acquire, &cmd).await?;
    if let (Some(short), [1, _]) = (short, answer.as_slice()) {
        // Granted, but too few replicas have it: released before the error returns
        // (in the background by `undo` if this release fails).
        if node
            .release_with(scripts.release, names, owner)
            .await
            .is_ok()
        {
            undo.disarm();
        }
        return Err(short);
    }
    let answer = match answer.as_slice() {
        [1, token] => {
            let Some(valid_until) = lock.valid_until(started, ttl) else {
                return Err(too_late(lock.name(), "acquire"));
            };
            let token = FencingToken::new(u64::try_from(*token).unwrap_or(0));
            let lease = Lease::new(key.clone(), owner, Some(token), ttl, started);
            Answer::Granted(Grant::new(lease, LeaseMonitor::new(valid_until)))
        }
        [0, lapse] => Answer::Held(u64::try_from(*lapse).ok().map(Duration::from_millis)),
        [2, detail] => Answer::Refused(*detail),
        other => {
            return Err(LockError::backend_error(
                REDIS_BACKEND,
                format!("unexpected answer to an acquire script: {other:?}"),
            ))
        }
    };
    undo.disarm();
    Ok(answer)
}

impl Answer {
    /// The attempt's result for the wait loop: granted or held; a refusal is the error
    /// `refused` makes of it.
    pub(crate) fn into_attempt(
        self,
        refused: impl FnOnce(i64) -> LockError,
    ) -> Result<Attempt, LockError> {
        match self {
            Answer::Granted(grant) => Ok(Attempt::Granted(grant)),
            Answer::Held(lapse) => Ok(Attempt::Held(lapse)),
            Answer::Refused(detail) => Err(refused(detail)),
        }
    }
}

/// Owner-checked release of `lease` with `scripts.release`.
///
/// # Errors
/// Connection and backend errors; [`LockError::Unsupported`] on Redlock.
pub(crate) async fn release(
    lock: &RedisLock,
    names: &KeyNames,
    scripts: &Scripts,
    lease: &Lease,
) -> Result<ReleaseOutcome, LockError> {
    lock.primitive_node(scripts.primitive)?
        .release_with(scripts.release, names, lease.owner())
        .await
}

/// Owner-checked extension of `lease` with `scripts.extend` to expire `ttl` from now.
///
/// # Errors
/// A connection error when the answer came too late to leave any validity, and
/// connection and backend errors; [`LockError::Unsupported`] on Redlock.
pub(crate) async fn extend(
    lock: &RedisLock,
    names: &KeyNames,
    scripts: &Scripts,
    lease: &Lease,
    ttl: Duration,
) -> Result<ExtendOutcome, LockError> {
    let node = lock.primitive_node(scripts.primitive)?;
    let started = Instant::now();
    match node
        .extend_with(scripts.extend, names, lease.owner(), ttl)
        .await?
    {
        ExtendOutcome::Extended { .. } => match lock.valid_until(started, ttl) {
            Some(valid_until) => Ok(ExtendOutcome::Extended { valid_until }),
            None => Err(too_late(lock.name(), "extend")),
        },
        other => Ok(other),
    }
}

/// Releases in the background, with the primitive's release script, a grant that may
/// have landed when an attempt is dropped or fails before handing it out.
struct Undo {
    lock: RedisLock,
    names: KeyNames,
    owner: OwnerToken,
    scripts: &'static Scripts,
    armed: bool,
}

impl Undo {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (lock, names, owner, release, primitive) = (
                self.lock.clone(),
                self.names.clone(),
                self.owner,
                self.scripts.release,
                self.scripts.primitive,
            );
            distlock_api::backend::spawn_cleanup(&runtime, async move {
                if let Ok(node) = lock.primitive_node(primitive) {
                    let _ = node.release_with(release, &names, owner).await;
                }
            });
        }
    }
}
