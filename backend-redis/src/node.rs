//! One Redis server: a multiplexed, auto-reconnecting RESP3 connection, the scripts run
//! on it, and the wake-ups it carries.

use std::sync::Arc;
use std::time::Duration;

use distlock_api::{ExtendOutcome, FencingToken, LockError, OwnerToken, ReleaseOutcome};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{
    Cmd, ErrorKind, FromRedisValue, IntoConnectionInfo, ProtocolVersion, RedisError, Script,
    ServerErrorKind,
};

use crate::keys::KeyNames;
use crate::wakeups::{WakeTicket, Wakeups};
use crate::REDIS_BACKEND;

/// What one node said to an acquire attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeGrant {
    /// Granted, with the node's fencing counter after `INCR`.
    Granted(FencingToken),
    /// Held by another owner for at most this long (`None`: no expiry set).
    Held(Option<Duration>),
}

/// What the node said to a FIFO acquire attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QueueGrant {
    /// Granted, with the node's fencing counter after `INCR`.
    Granted(FencingToken),
    /// Not granted: the lock is held, or other waiters are ahead.
    Waiting {
        /// The holder's remaining `PX`, if held with an expiry.
        held_for: Option<Duration>,
        /// Time until the earliest queue entry's deadline, if anyone is queued: a dead
        /// waiter ahead leaves the queue then at the latest.
        next_deadline: Option<Duration>,
        /// This waiter's 0-based place in the queue, if queued.
        place: Option<u64>,
    },
}

/// One node's view of a key, read atomically.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeView {
    /// The stored owner token, if the key is held.
    pub(crate) owner: Option<String>,
    /// The lock's remaining `PX`, if held with an expiry.
    pub(crate) remaining: Option<Duration>,
    /// The key's fencing counter: the last token this node handed out.
    pub(crate) fence: Option<FencingToken>,
    /// Live entries in the key's FIFO queue.
    pub(crate) queued: usize,
}

/// A connection to one Redis server.
#[derive(Clone)]
pub(crate) struct Node {
    address: String,
    conn: ConnectionManager,
    wakeups: Arc<Wakeups>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("address", &self.address)
            .finish()
    }
}

/// Maps a driver error to the API's error kinds.
pub(crate) fn lock_error(error: RedisError) -> LockError {
    if error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
    {
        LockError::connection(REDIS_BACKEND, error)
    } else {
        LockError::backend_error(REDIS_BACKEND, error)
    }
}

impl Node {
    /// Connects to the server at `url` (`redis://…`), speaking RESP3 so that pub/sub
    /// pushes share the command connection.
    pub(crate) async fn connect(url: &str, connect_timeout: Duration) -> Result<Node, LockError> {
        let info = url.into_connection_info().map_err(|e| LockError::Config {
            backend: REDIS_BACKEND,
            // Not the URL itself: it may carry a password.
            message: "invalid Redis URL".to_owned(),
            source: Some(Box::new(e)),
        })?;
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let info = info.set_redis_settings(settings);
        let address = info.addr().to_string();
        #[cfg(feature = "tls")]
        {
            // One process-wide crypto provider; another crate may have installed one first.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let client = redis::Client::open(info).map_err(lock_error)?;
        let wakeups = Arc::new(Wakeups::default());
        let router = wakeups.clone();
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(connect_timeout))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500))
            .set_automatic_resubscription()
            .set_push_sender(move |push| {
                router.on_push(push);
                Ok::<(), ()>(())
            });
        let conn = client
            .get_connection_manager_with_config(config)
            .await
            .map_err(|e| match lock_error(e) {
                LockError::Backend { source, .. } => LockError::Config {
                    backend: REDIS_BACKEND,
                    message: format!("{address} did not accept a RESP3 Redis connection (Redis 6 or later is needed)"),
                    source: Some(source),
                },
                other => other,
            })?;
        Ok(Node {
            address,
            conn,
            wakeups,
        })
    }

    /// `host:port` of the server.
    pub(crate) fn address(&self) -> &str {
        &self.address
    }

    /// Runs the acquire script.
    pub(crate) async fn try_grant(
        &self,
        names: &KeyNames,
        owner: OwnerToken,
        ttl: Duration,
    ) -> Result<NodeGrant, LockError> {
        let script = &*crate::scripts::ACQUIRE;
        let mut cmd = evalsha(script, &[&names.lock, &names.fence]);
        cmd.arg(&hex(owner)[..]).arg(ttl_millis(ttl));
        let (granted, value): (i64, i64) = self.run(script, &cmd).await?;
        Ok(match granted {
            1 => NodeGrant::Granted(FencingToken::new(value.max(0) as u64)),
            _ => NodeGrant::Held(u64::try_from(value).ok().map(Duration::from_millis)),
        })
    }

    /// Runs the FIFO acquire script for the queued waiter `waiter`: joins the queue
    /// (or refreshes its entry for `entry_ttl`) when `join`, else only tries.
    pub(crate) async fn try_grant_in_queue(
        &self,
        names: &KeyNames,
        owner: OwnerToken,
        ttl: Duration,
        waiter: &str,
        entry_ttl: Duration,
        join: bool,
    ) -> Result<QueueGrant, LockError> {
        let script = &*crate::scripts::QUEUED_ACQUIRE;
        let (queue, deadlines) = (names.queue(), names.queue_deadlines());
        let mut cmd = evalsha(
            script,
            &[
                &names.lock,
                &names.fence,
                &queue,
                &deadlines,
                &names.channel,
            ],
        );
        cmd.arg(&hex(owner)[..])
            .arg(ttl_millis(ttl))
            .arg(waiter)
            .arg(ttl_millis(entry_ttl))
            .arg(if join { "1" } else { "0" });
        let answer: Vec<i64> = self.run(script, &cmd).await?;
        let millis = |ms: i64| u64::try_from(ms).ok().map(Duration::from_millis);
        Ok(match answer.as_slice() {
            [1, token] => QueueGrant::Granted(FencingToken::new((*token).max(0) as u64)),
            [0, held_for, next_deadline, place] => QueueGrant::Waiting {
                held_for: millis(*held_for),
                next_deadline: millis(*next_deadline),
                place: u64::try_from(*place).ok(),
            },
            other => {
                return Err(LockError::backend_error(
                    REDIS_BACKEND,
                    format!("unexpected answer to the FIFO acquire script: {other:?}"),
                ))
            }
        })
    }

    /// Removes `waiter` from the FIFO queue, waking the new head if the lock is free.
    pub(crate) async fn leave_queue(
        &self,
        names: &KeyNames,
        waiter: &str,
    ) -> Result<(), LockError> {
        let script = &*crate::scripts::LEAVE_QUEUE;
        let (queue, deadlines) = (names.queue(), names.queue_deadlines());
        let mut cmd = evalsha(script, &[&names.lock, &names.channel, &queue, &deadlines]);
        cmd.arg(waiter);
        let _removed: i64 = self.run(script, &cmd).await?;
        Ok(())
    }

    /// Runs the owner-checked release script.
    pub(crate) async fn release(
        &self,
        names: &KeyNames,
        owner: OwnerToken,
    ) -> Result<ReleaseOutcome, LockError> {
        let script = &*crate::scripts::RELEASE;
        let queue = names.queue();
        let mut cmd = evalsha(script, &[&names.lock, &names.channel, &queue]);
        cmd.arg(&hex(owner)[..]);
        let found: i64 = self.run(script, &cmd).await?;
        Ok(match found {
            1 => ReleaseOutcome::Released,
            2 => ReleaseOutcome::HeldByOther,
            _ => ReleaseOutcome::Expired,
        })
    }

    /// Runs the owner-checked extend script. `Extended`'s deadline is filled in by the caller.
    pub(crate) async fn extend(
        &self,
        names: &KeyNames,
        owner: OwnerToken,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        let script = &*crate::scripts::EXTEND;
        let mut cmd = evalsha(script, &[&names.lock]);
        cmd.arg(&hex(owner)[..]).arg(ttl_millis(ttl));
        let found: i64 = self.run(script, &cmd).await?;
        Ok(match found {
            1 => ExtendOutcome::Extended {
                valid_until: tokio::time::Instant::now(),
            },
            2 => ExtendOutcome::HeldByOther,
            _ => ExtendOutcome::Expired,
        })
    }

    /// Reads the lock and its counter without changing them.
    pub(crate) async fn inspect(&self, names: &KeyNames) -> Result<NodeView, LockError> {
        let (owner, pttl, fence, queued): (String, i64, String, i64) = crate::scripts::INSPECT
            .key(&names.lock)
            .key(&names.fence)
            .key(names.queue_deadlines())
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(lock_error)?;
        Ok(NodeView {
            owner: Some(owner).filter(|o| !o.is_empty()),
            remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
            fence: fence.parse().ok().map(FencingToken::new),
            queued: usize::try_from(queued).unwrap_or(0),
        })
    }

    /// Runs an `EVALSHA` of `script`, loading the script once on `NOSCRIPT` (a server
    /// that never saw it, or restarted) and trying again.
    async fn run<T: FromRedisValue>(&self, script: &Script, cmd: &Cmd) -> Result<T, LockError> {
        let mut conn = self.conn.clone();
        match cmd.query_async(&mut conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                script.load_async(&mut conn).await.map_err(lock_error)?;
                cmd.query_async(&mut conn).await.map_err(lock_error)
            }
            other => other.map_err(lock_error),
        }
    }

    /// Subscribes (once per channel per client) to `names`' release channel; `queued`
    /// is a FIFO waiter's id (see [`Wakeups::watch`]).
    pub(crate) async fn watch(&self, names: &KeyNames, queued: Option<&str>) -> (WakeTicket, bool) {
        self.wakeups.watch(&self.conn, &names.channel, queued).await
    }

    /// Channels this node's connection currently tracks.
    pub(crate) fn tracked_channels(&self) -> usize {
        self.wakeups.tracked()
    }
}

/// `EVALSHA <sha> <keys…>`, ready for the script's (at most two) arguments. One command
/// built in place and sized once: redis-rs' `ScriptInvocation` copies every key and
/// argument into vectors first, and a growing command reallocates.
fn evalsha(script: &Script, keys: &[&str]) -> Cmd {
    // Name, hash, key count, keys, then an owner token (32) and a TTL (up to 20 digits).
    let data = 7 + script.get_hash().len() + 2 + keys.iter().map(|k| k.len()).sum::<usize>() + 52;
    let mut cmd = Cmd::with_capacity(3 + keys.len() + 2, data);
    cmd.arg("EVALSHA")
        .arg(script.get_hash())
        .arg(keys.len())
        .arg(keys);
    cmd
}

/// The owner token as stored: 32 lowercase hex digits (as its `Display`), without
/// going through the formatter or the heap.
pub(crate) fn hex(owner: OwnerToken) -> [u8; 32] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let bits = owner.as_u128();
    let mut out = [0u8; 32];
    for (i, digit) in out.iter_mut().enumerate() {
        *digit = DIGITS[((bits >> (124 - 4 * i)) & 0xf) as usize];
    }
    out
}

/// Milliseconds for `PX`/`PEXPIRE`; TTLs are validated to at least 10 ms, so nothing
/// rounds to zero.
fn ttl_millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_matches_display() {
        for bits in [
            0,
            1,
            0xabc,
            u128::MAX,
            0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
        ] {
            let owner = OwnerToken::from_u128(bits);
            assert_eq!(hex(owner)[..], *owner.to_string().as_bytes());
        }
    }
}
