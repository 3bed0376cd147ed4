//! The semaphore's scripts. `KEYS[1]` is `{K}:semaphore`: the permit holders, owner
//! tokens scored by expiry (see [`HOLDERS`]); `{K}:semaphore:permits` beside it holds
//! the permit count the holders agreed on and expires with them.

use std::sync::LazyLock;

use redis::Script;

use super::{
    EFFECTS_REPLICATION, HOLDERS, NOT_OURS, SLOT_TOKEN, SLOT_TOKEN_END, SLOT_TOKEN_FUNCTION,
};

/// `KEYS = [holders, fence]`, `ARGV = [token, ttl_ms, waiting_ms, max]`; `fence` is the
/// mutex's counter ([`crate::node::Node::fence`]).
///
/// Returns `{1, fencing_token}` when a permit is granted; `{2, count}` when the key's
/// holders use another permit count (nothing taken); else `{0, ms until the earliest
/// holder expires}`, marking `{K}:semaphore:waiting` for `waiting_ms` unless it is `0`.
/// With nobody holding a permit, the caller's count becomes the key's.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        &[
            EFFECTS_REPLICATION,
            SLOT_TOKEN_FUNCTION,
            SLOT_TOKEN,
            SLOT_TOKEN_END,
            HOLDERS,
            r"
local permits = KEYS[1] .. ':permits'
local max = tonumber(ARGV[4])
local held = redis.call('ZCARD', KEYS[1])
if held > 0 then
  local in_use = tonumber(redis.call('GET', permits))
  if in_use and in_use ~= max then
    return {2, in_use}
  end
end
if held < max then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  redis.call('SET', permits, ARGV[4])
  keep_alive(KEYS[1], permits)
  return {1, slot_token(KEYS[2])}
end
if ARGV[3] ~= '0' then
  redis.call('SET', KEYS[1] .. ':waiting', '1', 'PX', ARGV[3])
end
return {0, first_expiry(KEYS[1])}
",
        ]
        .concat(),
    )
});

/// `KEYS = [holders]`, `ARGV = [token]`. Returns 1 when the permit was released
/// (waking waiters if any marked the key), 2 when it was gone and others hold permits,
/// 0 when nobody does. The count goes with the last holder.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        &[
            EFFECTS_REPLICATION,
            HOLDERS,
            r"
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  if redis.call('EXISTS', KEYS[1]) == 0 then
    redis.call('DEL', KEYS[1] .. ':permits')
  end
  wake_waiters()
  return 1
end
",
            NOT_OURS,
        ]
        .concat(),
    )
});

/// `KEYS = [holders]`, `ARGV = [token, ttl_ms]`. Returns 1 when the permit now expires
/// `ttl_ms` from now, 2 when it was gone and others hold permits, 0 when nobody does.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        &[
            EFFECTS_REPLICATION,
            HOLDERS,
            r"
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
  keep_alive(KEYS[1], KEYS[1] .. ':permits')
  return 1
end
",
            NOT_OURS,
        ]
        .concat(),
    )
});
