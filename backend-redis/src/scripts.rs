//! The Lua scripts: each check-and-act runs atomically on the server.

use std::sync::LazyLock;

use redis::Script;

/// `KEYS = [lock, fence]` (fenced) or `[lock]` (Redlock, which keeps no counter),
/// `ARGV = [token, ttl_ms]`.
/// Returns `{1, fencing_token}` when granted (`{1, 0}` without a fence key), else
/// `{0, pttl_ms}` of the holder (`-1` when the holder's key has no expiry).
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if KEYS[2] then
    return {1, redis.call('INCR', KEYS[2])}
  end
  return {1, 0}
end
return {0, redis.call('PTTL', KEYS[1])}
",
    )
});

/// `KEYS = [lock, channel]`, `ARGV = [token]`.
/// Returns 1 when released (and a wake-up is published), 2 when another owner holds
/// the key, 0 when the key is gone.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', KEYS[2], '')
  return 1
elseif holder then
  return 2
end
return 0
",
    )
});

/// `KEYS = [lock]`, `ARGV = [token, ttl_ms]`.
/// Returns 1 when extended, 2 when another owner holds the key, 0 when it is gone.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
elseif holder then
  return 2
end
return 0
",
    )
});

/// `KEYS = [lock, fence]`. Returns `{owner or '', PTTL of the lock, counter or ''}`:
/// one consistent read of a key's state, for `inspect`.
pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local owner = redis.call('GET', KEYS[1]) or ''
local fence = redis.call('GET', KEYS[2]) or ''
return {owner, redis.call('PTTL', KEYS[1]), fence}
",
    )
});
