//! The read-write lock's scripts. `KEYS[1]` is `{K}:rw`: the readers, owner tokens
//! scored by expiry (see [`HOLDERS`]). Beside it, `{K}:rw:writer` holds the writer's
//! owner token with a `PX` expiry, and `{K}:rw:intent` the waiting writers: waiter ids
//! scored by the server time (ms) at which each intent lapses unless refreshed. While
//! a live intent is there, readers are refused (writer preference).

use std::sync::LazyLock;

use redis::Script;

use super::{
    EFFECTS_REPLICATION, HOLDERS, NOT_OURS, SLOT_TOKEN, SLOT_TOKEN_END, SLOT_TOKEN_FUNCTION,
};

/// Defines `writer` and `intent` (their names) and drops the lapsed intents. Follows
/// [`HOLDERS`].
const RW_NAMES: &str = r"
local writer = KEYS[1] .. ':writer'
local intent = KEYS[1] .. ':intent'
redis.call('ZREMRANGEBYSCORE', intent, '-inf', now)
";

/// `KEYS = [readers, fence]`, `ARGV = [token, ttl_ms, waiting_ms, mode ('r' or 'w'),
/// waiter id ('' for none), intent_ms]`; `fence` is the mutex's counter
/// ([`crate::node::Node::fence`]).
///
/// A write is granted when there is neither a writer nor a reader, and removes the
/// waiter's intent; otherwise a waiter id records (or refreshes) its intent for
/// `intent_ms`. A read is granted when there is no writer and no intent. Returns
/// `{1, fencing_token}` when granted, else `{0, ms until the soonest holder or intent
/// lapses (-1: unknown)}`, marking `{K}:rw:waiting` for `waiting_ms` unless it is `0`.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        &[
            EFFECTS_REPLICATION,
            SLOT_TOKEN_FUNCTION,
            SLOT_TOKEN,
            SLOT_TOKEN_END,
            HOLDERS,
            RW_NAMES,
            r"
local granted = false
if ARGV[4] == 'w' then
  if redis.call('EXISTS', KEYS[1], writer) == 0 then
    redis.call('SET', writer, ARGV[1], 'PX', ARGV[2])
    if ARGV[5] ~= '' then
      redis.call('ZREM', intent, ARGV[5])
    end
    granted = true
  elseif ARGV[5] ~= '' then
    redis.call('ZADD', intent, now + tonumber(ARGV[6]), ARGV[5])
    keep_alive(intent)
  end
elseif redis.call('EXISTS', writer, intent) == 0 then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  keep_alive(KEYS[1])
  granted = true
end
if granted then
  return {1, slot_token(KEYS[2])}
end
if ARGV[3] ~= '0' then
  redis.call('SET', KEYS[1] .. ':waiting', '1', 'PX', ARGV[3])
end
local soonest = -1
for _, lapse in ipairs({redis.call('PTTL', writer), first_expiry(KEYS[1]), first_expiry(intent)}) do
  if lapse >= 0 and (soonest < 0 or lapse < soonest) then
    soonest = lapse
  end
end
return {0, soonest}
",
        ]
        .concat(),
    )
});

/// `KEYS = [readers]`, `ARGV = [token]`: releases a read or a write grant. Returns 1
/// when released (waking waiters if any marked the key), 2 when it was gone and others
/// hold the key, 0 when nobody does.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        &[
            EFFECTS_REPLICATION,
            HOLDERS,
            RW_NAMES,
            r"
local released = redis.call('ZREM', KEYS[1], ARGV[1]) == 1
if not released and redis.call('GET', writer) == ARGV[1] then
  released = redis.call('DEL', writer) == 1
end
if released then
  wake_waiters()
  return 1
end
if redis.call('EXISTS', writer) == 1 then
  return 2
end
",
            NOT_OURS,
        ]
        .concat(),
    )
});

/// `KEYS = [readers]`, `ARGV = [token, ttl_ms]`: extends a read or a write grant to
/// expire `ttl_ms` from now. Returns 1 when extended, 2 when it was gone and others
/// hold the key, 0 when nobody does.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        &[
            EFFECTS_REPLICATION,
            HOLDERS,
            RW_NAMES,
            r"
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
  keep_alive(KEYS[1])
  return 1
end
if redis.call('GET', writer) == ARGV[1] then
  redis.call('PEXPIRE', writer, ARGV[2])
  return 1
end
if redis.call('EXISTS', writer) == 1 then
  return 2
end
",
            NOT_OURS,
        ]
        .concat(),
    )
});

/// `KEYS = [readers]`, `ARGV = [waiter id]`: a writer that gave up withdraws its
/// intent, waking the waiters (readers held back by it) if any marked the key.
pub(crate) static WITHDRAW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        &[
            EFFECTS_REPLICATION,
            HOLDERS,
            RW_NAMES,
            r"
if redis.call('ZREM', intent, ARGV[1]) == 1 then
  wake_waiters()
end
return 0
",
        ]
        .concat(),
    )
});
