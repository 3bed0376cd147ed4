//! Leader election on one Redis node (direct, Sentinel or Cluster), sharing the mutex
//! client's connection, wake-ups and waiter lines.
//!
//! **Layout**, for an election name `K` (every name under the mutex's hash tag `{K}`,
//! see [`crate::KeyNames`], in a namespace of its own: the mutex `K` is `{K}`, the
//! election `K` is `{K}:election`):
//! - `{K}:election`: the leader's record, a hash of its `owner` token (128 random
//!   bits), its `term` and its `candidate` identity, with a `PX` expiry: the
//!   leadership's lease. A campaign writes it only when none exists; resign (delete)
//!   and extend (`PEXPIRE`) check the owner token, all in Lua, so the record is
//!   written, extended and removed whole.
//! - The term: the next value of the mutex's fencing counter
//!   ([`crate::node::Node::fence`]), taken by the campaign script that wins.
//! - `{K}:election:waiting` and the channel `{K}:election:released`: as the mutex's,
//!   so a resign wakes the waiting candidates within a round trip.
//! - `{K}:election:watched` and the channel `{K}:election:changed`: an observer in
//!   `wait_change` marks the name watched (for 11 s, refreshed at
//!   every look, at least every 5 s), and every new leadership and resign then
//!   publishes on `:changed`.
//!
//! Every key expires, so an election that ended leaves nothing behind.
//!
//! **Semantics.**
//! - At most one leader at a time, as the mutex on the same node promises exclusion:
//!   a restart without persistence forgets the leader, and a Sentinel or Cluster
//!   failover to an asynchronous replica can lose a fresh leadership (two leaders
//!   then; the terms, seeded from the server's clock, still rise, so fence writes).
//! - The term is the fencing token of the leadership (the lease carries it): above
//!   every earlier term of the name, within the mutex's trust model (the crate docs).
//! - `leader` reads candidate, term and remaining lease of the live
//!   leader in one script: an expired or resigned leader is never reported.
//! - A leader's validity ends TTL − drift after its campaign was sent; `lost()` fires
//!   then at the latest unless renewed. A crashed leader is replaced once its record
//!   expires (a waiting candidate retries at the leader's remaining `PTTL`); a resign
//!   wakes the waiting candidates and observers through pub/sub at once.
//! - Dropping a campaign future resigns in the background any leadership that may have
//!   landed; a waiting candidate leaves nothing but its `:waiting` marker, which lapses.
//!
//! Campaigns are not granted in arrival order (`WaitOrder::Fifo` is refused).

use std::time::Duration;

use distlock_api::backend::{Grant, Request};
use distlock_api::{
    Candidate, ExtendOutcome, FencingToken, Leader, Lease, LockError, LockKey, Primitive,
    ReleaseOutcome, OBSERVE_POLL,
};
use redis::Value;
use tokio::time::Instant;

use super::primitive::{self, Answer, Scripts};
use super::{Attempt, RedisLock};
use crate::keys::{self, KeyNames};
use crate::node::{evalsha, ttl_millis, Node};
use crate::scripts::election as script;

/// Why Redlock offers no election.
pub(crate) const REDLOCK_NO_ELECTION: &str = "Redlock has no consensus: its nodes keep no common counter (a node that missed a grant lags, a restarted one starts over), so terms could not rise strictly, and the leader a majority recorded is not every node's; use a single node, Sentinel or Cluster, or a consensus store (ZooKeeper)";

/// Why campaigns are not granted in arrival order.
pub(crate) const ELECTION_NOT_FIFO: &str = "the Redis election keeps no queue of candidates: after a resign or an expiry, any waiting candidate may win";

/// How long an observer waits at most before it looks again (and refreshes its
/// `:watched` marker), whatever its patience.
const WATCH_STEP: Duration = Duration::from_secs(5);

/// How long an observer's `:watched` marker lives: past its next look.
const WATCH_MARK: Duration = Duration::from_secs(11);

static SCRIPTS: Scripts = Scripts {
    primitive: Primitive::Election,
    acquire: &script::CAMPAIGN,
    release: &script::RESIGN,
    extend: &script::EXTEND,
};

fn names(name: &LockKey) -> KeyNames {
    KeyNames::for_primitive(name, keys::Primitive::Election)
}

/// `candidate`'s campaign for `request.key`, waiting as the mutex does. The grant's
/// fencing token is the term the campaign script took.
///
/// # Errors
/// Connection and backend errors.
pub(crate) async fn campaign(
    lock: &RedisLock,
    request: &Request<'_>,
    candidate: &Candidate,
) -> Result<Option<Grant>, LockError> {
    let (name, options) = (request.key, request.options);
    let names = &names(name);
    lock.contend(request, names, |waiting| async move {
        let answer = primitive::attempt(lock, name, names, options, &SCRIPTS, waiting, |cmd| {
            cmd.arg(candidate.as_bytes());
        })
        .await?;
        match answer {
            Answer::Granted(grant) => Ok(Attempt::Granted(grant)),
            Answer::Held(lapse) => Ok(Attempt::Held(lapse)),
            Answer::Refused(detail) => Err(LockError::backend_error(
                lock.name(),
                format!("unexpected refusal {detail} from the campaign script"),
            )),
        }
    })
    .await
}

/// Owner-checked resign of a leadership.
///
/// # Errors
/// Connection and backend errors.
pub(crate) async fn resign(lock: &RedisLock, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
    primitive::release(lock, &names(lease.key()), &SCRIPTS, lease).await
}

/// Owner-checked extension of a leadership to expire `ttl` from now.
///
/// # Errors
/// Connection and backend errors.
pub(crate) async fn extend(
    lock: &RedisLock,
    lease: &Lease,
    ttl: Duration,
) -> Result<ExtendOutcome, LockError> {
    primitive::extend(lock, &names(lease.key()), &SCRIPTS, lease, ttl).await
}

/// The live leader of `name`.
///
/// # Errors
/// Connection and backend errors; [`LockError::Unsupported`] on Redlock.
pub(crate) async fn leader(lock: &RedisLock, name: &LockKey) -> Result<Option<Leader>, LockError> {
    let node = lock.primitive_node(Primitive::Election)?;
    read_leader(lock, node, &names(name), None).await
}

/// Waits for the name's `:changed` announcements: subscribes first, then reads the
/// leader (marking the name watched), then waits for an announcement, the leader's
/// expiry (which nobody announces), or the patience, whichever comes first. Without a
/// subscription it looks every [`OBSERVE_POLL`].
///
/// # Errors
/// Connection and backend errors; [`LockError::Unsupported`] on Redlock.
pub(crate) async fn wait_change(
    lock: &RedisLock,
    name: &LockKey,
    seen: Option<FencingToken>,
    patience: Duration,
) -> Result<Option<Leader>, LockError> {
    let node = lock.primitive_node(Primitive::Election)?;
    let names = names(name);
    let deadline = Instant::now().checked_add(patience);
    let (ticket, subscribed) = node.watch_channel(&changed_channel(&names)).await;
    loop {
        let woken = ticket.notify().notified();
        tokio::pin!(woken);
        // Registered before the read, so an announcement in between still counts.
        woken.as_mut().enable();
        let now = read_leader(lock, node, &names, subscribed.then_some(WATCH_MARK)).await?;
        let looked = Instant::now();
        if now.as_ref().map(|l| l.term) != seen || deadline.is_some_and(|d| looked >= d) {
            return Ok(now);
        }
        let step = if subscribed { WATCH_STEP } else { OBSERVE_POLL };
        let mut at = looked + step;
        if let Some(left) = now.and_then(|l| l.remaining) {
            // A leader's lease running out is announced by nobody: look again then.
            at = at.min(looked + left.max(Duration::from_millis(1)));
        }
        if let Some(deadline) = deadline {
            at = at.min(deadline);
        }
        tokio::select! {
            _ = &mut woken => {}
            _ = tokio::time::sleep_until(at) => {}
        }
    }
}

/// Reads the live leader of `names`, marking the name watched for `watched` first.
async fn read_leader(
    lock: &RedisLock,
    node: &Node,
    names: &KeyNames,
    watched: Option<Duration>,
) -> Result<Option<Leader>, LockError> {
    let script = &*script::LEADER;
    let mut cmd = evalsha(script, &[&names.lock]);
    cmd.arg(watched.map_or(0, ttl_millis));
    let answer: Vec<Value> = node.run(script, &cmd).await?;
    parse_leader(lock.name(), &answer)
}

fn parse_leader(backend: &'static str, answer: &[Value]) -> Result<Option<Leader>, LockError> {
    let malformed =
        || LockError::backend_error(backend, format!("malformed leader record: {answer:?}"));
    match answer {
        [] => Ok(None),
        [candidate, term, pttl] => {
            let candidate = match candidate {
                Value::BulkString(bytes) => Candidate::new(bytes.clone()).ok(),
                _ => None,
            };
            let term = match term {
                Value::BulkString(bytes) => std::str::from_utf8(bytes)
                    .ok()
                    .and_then(|t| t.parse::<u64>().ok()),
                _ => None,
            };
            let remaining = match pttl {
                Value::Int(ms) => u64::try_from(*ms).ok().map(Duration::from_millis),
                _ => None,
            };
            match (candidate, term) {
                (Some(candidate), Some(term)) => Ok(Some(
                    Leader::new(candidate, FencingToken::new(term)).with_remaining(remaining),
                )),
                _ => Err(malformed()),
            }
        }
        _ => Err(malformed()),
    }
}

/// The channel every change of leader of `names` is announced on, while observed.
fn changed_channel(names: &KeyNames) -> String {
    [names.lock.as_str(), ":changed"].concat()
}
