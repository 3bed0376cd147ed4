//! The Lua scripts: each check-and-act runs atomically on the server.

use std::sync::LazyLock;

use redis::Script;

/// A waiter's attempt (the first attempt of an acquire is the pipeline of
/// `crate::node::Node::try_grant`, without a script). `KEYS = [lock, fence]` (fenced)
/// or `[lock]` (Redlock, which keeps no counter), `ARGV = [token, ttl_ms, waiting_ms]`.
/// Returns the fencing token as a string (see [`SLOT_TOKEN`]) when granted, `1`
/// without a fence key; else `-1 - PTTL` of the holder, so `0` or less: `0` when the
/// holder's key has no expiry. A held key marks `{K}:waiting` for `waiting_ms`, so
/// that a release knows to publish a wake-up.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        &[
            EFFECTS_REPLICATION,
            r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if not KEYS[2] then
    return 1
  end
  local fence = KEYS[2]
",
            SLOT_TOKEN,
            r"
  return token
end
if ARGV[3] then
  redis.call('SET', KEYS[1] .. ':waiting', '1', 'PX', ARGV[3])
end
return -1 - redis.call('PTTL', KEYS[1])
",
        ]
        .concat(),
    )
});

/// Sets `token` (a string) to the next value of the mutex's counter named by the local
/// `fence` (the server's one, or a Cluster slot's: see [`crate::KeyNames::fence`]).
///
/// `INCR` gives the next token while the counter lives; it never expires. A counter
/// that is gone (a restart without persistence, a flush) comes back from `INCR` as a
/// small number, below [`SEED_FLOOR`]: it is seeded with the server's time in µs since
/// 1970 (about 1.8 × 10^15 in 2026, below 2^53 until about 2255, so a token survives a
/// JSON or JavaScript consumer's doubles). That is above every value the counter held
/// before unless it counted more `INCR`s than µs passed since its own seed (more than
/// one grant per µs, sustained: see the Redis guide's "Fencing") or the server's clock
/// stepped back. The token is read back with `GET`, as a string, never taken from
/// Lua arithmetic (doubles): a counter someone set past 2^53 still reads exactly.
const SLOT_TOKEN: &str = r"
if redis.call('INCR', fence) < 1000000000000000 then
  local t = redis.call('TIME')
  redis.call('SET', fence, t[1] .. string.format('%06d', t[2]))
end
local token = redis.call('GET', fence)
";

/// The value below which a mutex counter is one `INCR` created (a value no seed from
/// a clock after 2001 gives): the counter is then seeded (see [`SLOT_TOKEN`]).
pub(crate) const SEED_FLOOR: i64 = 1_000_000_000_000_000;

/// `KEYS = [fence]`: the next token of a mutex counter that `INCR` found gone, seeded
/// (see [`SLOT_TOKEN`]), as a string.
pub(crate) static SEEDED_TOKEN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        &[
            EFFECTS_REPLICATION,
            "local fence = KEYS[1]\n",
            SLOT_TOKEN,
            "return token\n",
        ]
        .concat(),
    )
});

/// [`SLOT_TOKEN`] as the function `slot_token(fence)` (closed by [`SLOT_TOKEN_END`]),
/// which answers the token: for the FIFO acquire, which grants in two places, and the
/// semaphore's, read-write lock's and election's acquires, whose tokens come from the
/// same counter as the mutex's.
const SLOT_TOKEN_FUNCTION: &str = "local function slot_token(fence)\n";

/// Ends the function [`SLOT_TOKEN_FUNCTION`] starts, after [`SLOT_TOKEN`].
const SLOT_TOKEN_END: &str = "return token\nend\n";

/// `KEYS = [lock]`, `ARGV = [token]`; the other names are derived from the lock's.
/// Returns 1 when released, 2 when another owner holds the key (or a key of another
/// type is there), 0 when the key is gone. A wake-up is published only when someone
/// waits: the release deletes `{K}:waiting` with the lock, in the same `DEL`, and a
/// count of 2 says a waiter had marked it (unordered waiters mark it when they find the
/// key held, FIFO waiters while they are queued, see [`QUEUED_ACQUIRE`]); so an
/// uncontended release is `GET` and `DEL`, as a plain compare-and-delete. The woken
/// waiters mark the key again if they find it held. The wake-up names the head of the
/// FIFO queue, so only that queued waiter wakes (empty when nobody is queued: every
/// unordered waiter wakes); expired entries are dropped first, so it never names a
/// dead waiter.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        &[
            EFFECTS_REPLICATION,
            r"
local holder = redis.pcall('GET', KEYS[1])
if holder == ARGV[1] then
  if redis.call('DEL', KEYS[1], KEYS[1] .. ':waiting') > 1 then
    local queue = KEYS[1] .. ':queue'
    local deadlines = queue .. ':deadlines'
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if head then
",
            PURGE_EXPIRED,
            r"
      head = redis.call('ZRANGE', queue, 0, 0)[1]
    end
    redis.call('PUBLISH', KEYS[1] .. ':released', head or '')
  end
  return 1
elseif holder then
  return 2
end
return 0
",
        ]
        .concat(),
    )
});

/// `KEYS = [lock]`, `ARGV = [token, ttl_ms]`.
/// Returns 1 when extended, 2 when another owner holds the key (or a key of another
/// type is there), 0 when it is gone.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local holder = redis.pcall('GET', KEYS[1])
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

/// `KEYS = [lock, queue deadlines]`. Returns `{type of the lock key ('none' when
/// absent), its value ('' unless a string), PTTL of the lock, live FIFO queue
/// entries}`: one consistent read of a key's state, for `inspect`. A foreign holder may
/// leave any value or type on the key: it is reported, never an error.
pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local kind = redis.call('TYPE', KEYS[1])['ok']
local owner = ''
if kind == 'string' then
  owner = redis.call('GET', KEYS[1])
end
local queued = 0
if redis.call('TYPE', KEYS[2])['ok'] == 'zset' then
  local t = redis.call('TIME')
  local now = t[1] * 1000 + math.floor(t[2] / 1000)
  queued = redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')
end
return {kind, owner, redis.call('PTTL', KEYS[1]), queued}
",
    )
});

/// The first line of every script that reads `TIME` and then writes: that needs
/// effects replication, the only mode of Redis 7, switched on here for Redis 6, where
/// it must come before any write command is called (even one that writes nothing, as
/// a `SET NX` on a held key).
const EFFECTS_REPLICATION: &str = "redis.replicate_commands()\n";

/// Drops the queue entries whose deadline (server time, ms) has passed. The script
/// defines `queue` and `deadlines` (the queue's names) first. Defines `now`. The script must start with
/// [`EFFECTS_REPLICATION`].
const PURGE_EXPIRED: &str = r"
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local dead = redis.call('ZRANGEBYSCORE', deadlines, '-inf', now)
if #dead > 0 then
  redis.call('ZREMRANGEBYSCORE', deadlines, '-inf', now)
  for i = 1, #dead, 1000 do
    redis.call('ZREM', queue, unpack(dead, i, math.min(i + 999, #dead)))
  end
end
";

/// Defines `queue` and `deadlines` for [`PURGE_EXPIRED`] in the FIFO scripts, whose
/// `KEYS[3]` and `KEYS[4]` they are.
const QUEUE_NAMES: &str = "local queue, deadlines = KEYS[3], KEYS[4]\n";

/// The FIFO acquire. `KEYS = [lock, fence, queue, queue deadlines, channel]`,
/// `ARGV = [token, ttl_ms, waiter id, entry_ttl_ms, join]`.
///
/// When nobody is queued it is the plain acquire (`SET NX PX`, the next token). Otherwise
/// expired entries are dropped first. The lock is granted (`SET PX`, the next token,
/// and the waiter leaves the queue) when it is free and the queue is empty or headed
/// by this waiter. Otherwise, with `join` = `1`, the waiter is queued at the tail (or
/// keeps its place) and its entry's deadline is pushed to now + `entry_ttl_ms`; both
/// queue keys then expire with their longest-lived entry. A free lock whose head is
/// another waiter gets that head woken, in case its wake-up went astray. While anyone
/// is queued, `{K}:waiting` is marked for as long as the queue lives, so that a release
/// wakes the head (see [`RELEASE`], which deletes the mark): each queued attempt marks
/// it, and so does a grant that leaves others queued.
///
/// Returns `{1, fencing_token}` (the token a string, see [`SLOT_TOKEN`]) when granted, else `{0, holder PTTL (negative when
/// free or without expiry), ms until the queue's earliest entry deadline (-1: none),
/// this waiter's 0-based place in the queue (-1: not queued)}`.
pub(crate) static QUEUED_ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        &[
            EFFECTS_REPLICATION,
            SLOT_TOKEN_FUNCTION,
            SLOT_TOKEN,
            SLOT_TOKEN_END,
            QUEUE_NAMES,
            // Nobody queued (the queue key is deleted when it empties): the plain
            // acquire, without reading the clock.
            r"
if redis.call('EXISTS', KEYS[3]) == 0 then
  if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return {1, slot_token(KEYS[2])}
  end
  if ARGV[5] ~= '1' then
    return {0, redis.call('PTTL', KEYS[1]), -1, -1}
  end
end
",
            PURGE_EXPIRED,
            r"
-- Never shortens a mark an unordered waiter set for longer.
local function mark_waiting(keep)
  local waiting = KEYS[1] .. ':waiting'
  if redis.call('PTTL', waiting) < keep then
    redis.call('SET', waiting, '1', 'PX', keep)
  end
end
local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
local free = redis.call('EXISTS', KEYS[1]) == 0
if free and (not head or head == ARGV[3]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  if head then
    redis.call('ZREM', KEYS[3], head)
    redis.call('ZREM', KEYS[4], head)
    -- Others still queued: the holder's release must wake the next head.
    local latest = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')[2]
    if latest then
      mark_waiting(tonumber(latest) - now + 1)
    end
  end
  return {1, slot_token(KEYS[2])}
end
if ARGV[5] == '1' then
  if not redis.call('ZSCORE', KEYS[3], ARGV[3]) then
    local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2]
    redis.call('ZADD', KEYS[3], (tonumber(last) or 0) + 1, ARGV[3])
  end
  redis.call('ZADD', KEYS[4], now + tonumber(ARGV[4]), ARGV[3])
  local latest = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')[2]
  local keep = tonumber(latest) - now + 1
  redis.call('PEXPIRE', KEYS[3], keep)
  redis.call('PEXPIRE', KEYS[4], keep)
  mark_waiting(keep)
  head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
end
if free and head and head ~= ARGV[3] then
  redis.call('PUBLISH', KEYS[5], head)
end
local first = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')[2]
local first_in = -1
if first then first_in = tonumber(first) - now end
local place = redis.call('ZRANK', KEYS[3], ARGV[3]) or -1
return {0, redis.call('PTTL', KEYS[1]), first_in, place}
",
        ]
        .concat(),
    )
});

/// A waiter leaves the FIFO queue. `KEYS = [lock, channel, queue, queue deadlines]`,
/// `ARGV = [waiter id]`. When it was queued and the lock is free, the new head is
/// woken (expired entries dropped first, so that it is a live one), so a waiter giving
/// up never holds up the one behind it. Returns 1 when the entry was there.
pub(crate) static LEAVE_QUEUE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        &[
            EFFECTS_REPLICATION,
            QUEUE_NAMES,
            r"
local removed = redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
if removed == 1 and redis.call('EXISTS', KEYS[1]) == 0 then
",
            PURGE_EXPIRED,
            r"
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if head then
    redis.call('PUBLISH', KEYS[2], head)
  end
end
return removed
",
        ]
        .concat(),
    )
});

pub(crate) mod election;
pub(crate) mod rw;
pub(crate) mod semaphore;

/// The start of the semaphore's and the read-write lock's scripts, whose `KEYS[1]` is
/// a sorted set of holders (owner tokens scored by the server time, in ms, at which
/// each expires). Refuses a key of another type with a `WRONGTYPE` error naming it
/// (another program uses the name), defines `now` (server time, ms), drops the expired
/// holders, and defines `keep_alive(holders, companion)`, which makes `holders` (and
/// `companion`, a key stored beside it) expire with its longest-lived entry, and
/// `first_expiry(holders)`, the ms until its earliest entry expires (-1: empty). Must
/// follow [`EFFECTS_REPLICATION`].
const HOLDERS: &str = r"
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'zset' and kind ~= 'none' then
  return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' is a ' .. kind .. ', not a set of distlock holders: another program uses this name')
end
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local function keep_alive(holders, companion)
  local last = redis.call('ZRANGE', holders, -1, -1, 'WITHSCORES')[2]
  if last then
    local keep = tonumber(last) - now + 1
    redis.call('PEXPIRE', holders, keep)
    if companion then
      redis.call('PEXPIRE', companion, keep)
    end
  end
end
local function first_expiry(holders)
  local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')[2]
  if first then
    return tonumber(first) - now
  end
  return -1
end
local function wake_waiters()
  if redis.call('EXISTS', KEYS[1] .. ':waiting') == 1 then
    redis.call('PUBLISH', KEYS[1] .. ':released', '')
  end
end
";

/// The owner-checked end of a holder's entry shared by both primitives' release and
/// extend scripts: after [`HOLDERS`], the script returns 2 when others still hold the
/// key and 0 when it is gone.
const NOT_OURS: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 2
end
return 0
";
