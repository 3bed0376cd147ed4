//! The election's scripts. `KEYS[1]` is `{K}:election`: the leader's record, a hash of
//! its `owner` token, its `term` and its `candidate` identity, with a `PX` expiry (the
//! leadership's lease). Derived names: `:waiting` (set by waiting candidates; a resign
//! then publishes on `:released`) and `:watched` (set by observers; every change of
//! leader then publishes on `:changed`). The term comes from the mutex's counter.

use std::sync::LazyLock;

use redis::Script;

use super::{EFFECTS_REPLICATION, SLOT_TOKEN, SLOT_TOKEN_END, SLOT_TOKEN_FUNCTION};

/// Refuses a record of another type (another program uses the name) and defines
/// `announce()`, which tells the observers of the name that the leader changed.
const RECORD: &str = r"
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'hash' and kind ~= 'none' then
  return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' is a ' .. kind .. ', not a distlock leader record: another program uses this name')
end
local function announce()
  if redis.call('EXISTS', KEYS[1] .. ':watched') == 1 then
    redis.call('PUBLISH', KEYS[1] .. ':changed', '')
  end
end
";

/// `KEYS = [record, fence]`, `ARGV = [token, ttl_ms, waiting_ms, candidate]`; `fence`
/// is the mutex's counter ([`crate::node::Node::fence`]).
///
/// Nobody leading: writes the record (owner, the next term from the fence counter,
/// candidate) expiring in `ttl_ms`, announces it, and returns `{1, term}`. Else
/// returns `{0, leader's PTTL}`, marking `:waiting` for `waiting_ms` unless it is `0`.
pub(crate) static CAMPAIGN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        &[
            EFFECTS_REPLICATION,
            SLOT_TOKEN_FUNCTION,
            SLOT_TOKEN,
            SLOT_TOKEN_END,
            RECORD,
            r"
if kind == 'none' then
  local term = slot_token(KEYS[2])
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'term', term, 'candidate', ARGV[4])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  announce()
  return {1, term}
end
if ARGV[3] ~= '0' then
  redis.call('SET', KEYS[1] .. ':waiting', '1', 'PX', ARGV[3])
end
return {0, redis.call('PTTL', KEYS[1])}
",
        ]
        .concat(),
    )
});

/// `KEYS = [record]`, `ARGV = [token]`. Returns 1 when the leadership was resigned
/// (waking waiting candidates and observers if any marked the name), 2 when another
/// leads, 0 when nobody does.
pub(crate) static RESIGN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        &[
            RECORD,
            r"
if kind == 'none' then
  return 0
end
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
  return 2
end
redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[1] .. ':waiting') == 1 then
  redis.call('PUBLISH', KEYS[1] .. ':released', '')
end
announce()
return 1
",
        ]
        .concat(),
    )
});

/// `KEYS = [record]`, `ARGV = [token, ttl_ms]`. Returns 1 when the leadership now
/// expires `ttl_ms` from now, 2 when another leads, 0 when nobody does.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        &[
            RECORD,
            r"
if kind == 'none' then
  return 0
end
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
  return 2
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
",
        ]
        .concat(),
    )
});

/// `KEYS = [record]`, `ARGV = [watched_ms]`. Marks the name `:watched` for
/// `watched_ms` unless it is `0`, then returns `{}` when nobody leads, else
/// `{candidate, term, PTTL}` of the live leader (an expired record is gone: Redis
/// never shows it).
pub(crate) static LEADER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        &[
            RECORD,
            r"
if ARGV[1] ~= '0' then
  redis.call('SET', KEYS[1] .. ':watched', '1', 'PX', ARGV[1])
end
if kind == 'none' then
  return {}
end
local record = redis.call('HMGET', KEYS[1], 'candidate', 'term')
return {record[1] or '', record[2] or '', redis.call('PTTL', KEYS[1])}
",
        ]
        .concat(),
    )
});
