//! The Redis backend of distlock: one node, a master behind Sentinel, a Redis Cluster,
//! or Redlock over N independent nodes.
//!
//! ```no_run
//! # async fn demo() -> Result<(), distlock_api::LockError> {
//! use std::time::Duration;
//! use distlock_api::{LockKey, LockOptions, WaitPolicy};
//! use distlock_redis::RedisLock;
//!
//! // Or "redis+redlock://h1:6379,h2:6379,h3:6379" for Redlock.
//! let client = RedisLock::connect("redis://127.0.0.1:6379").await?.client();
//! let options = LockOptions::new(Duration::from_secs(10))
//!     .with_wait(WaitPolicy::Timeout(Duration::from_secs(5)));
//! let guard = client.lock().acquire(&LockKey::new("billing/close-month")?, &options).await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! [`RedisLock`] is this backend's [`distlock_api::backend::Engine`]: its
//! [`RedisLock::client`] (or `distlock::connect`) hands out the mutex, the semaphore,
//! the read-write lock and election over one set of connections, with the option
//! checks, the bounded wait, the error patience and the metrics every backend shares.
//! What each primitive offers here is [`distlock_api::Client::info`]'s to say: a
//! primitive a deployment does not offer (Redlock's semaphore, say) refuses every
//! acquire with `LockError::Unsupported` and the reason.
//!
//! The driver is re-exported as [`redis`], so its types need no separate dependency.
//!
//! # Protocol
//! For a lock key `K` (see [`KeyNames`]):
//! - **acquire**: the first attempt is a pipeline without a script, `SET {K} <owner>
//!   NX PX <ttl>` and (not on Redlock, which hands out no token) `INCR` of the key's
//!   fencing counter (the server's one counter, [`KeyNames::fence`]; on a Cluster the
//!   key's hash slot's, [`KeyNames::cluster_fence`]), whose new value is the fencing token;
//!   a waiter's later attempts run a Lua script doing the same that, when the key is
//!   held, marks it `{K}:waiting` (with an expiry) and returns the holder's `PTTL`, the
//!   longest the waiter has to wait;
//! - **release** is an owner-checked `DEL` in Lua, of the lock and its `{K}:waiting`
//!   marker together, that `PUBLISH`es on `{K}:released` only when the marker was
//!   there (FIFO waiters mark it too while queued; woken waiters that find the key held
//!   again mark it again); **extend** is an
//!   owner-checked `PEXPIRE` in Lua. Both tell "gone" apart from "held by another
//!   owner".
//!
//! The owner token is 32 lowercase hex digits (128 random bits). The stored value is the
//! bare token with a `PX` expiry, the layout redis-py's `Lock`, redsync and rslock use:
//! a lock they hold on the Redis key `{K}` excludes ours on `K`, and ours excludes theirs.
//!
//! # Waiting
//! A waiter's first failed attempt subscribes the client's connection to `{K}:released`
//! (once per channel, however many tasks wait), then retries at once, so a release in
//! between is not missed. Releases wake it within a round trip. As a safety net (for
//! foreign holders, which do not publish, and for lost connections) it also retries
//! after the holder's remaining TTL or the backoff's maximum, whichever is sooner; when
//! the subscription is down it falls back to exponential backoff with jitter.
//!
//! A `WaitPolicy::Timeout` bounds the whole call, whatever the servers do (the rule
//! every backend shares): an attempt still unanswered at the deadline plus the grace is
//! dropped, its possible grant released in the background (a clean-up
//! `distlock_api::settle_cleanups` waits for), and the call fails with
//! `LockError::Connection` naming the servers (the lock's state is unknown) — or
//! `LockError::Timeout` if an earlier attempt of the call saw the key held. Failed
//! attempts (a server down or restarting, a Redlock majority missed) are retried under
//! the options' error patience. `NoWait` makes one attempt, bounded by the request
//! timeout.
//!
//! # FIFO mode
//! With `?fifo=true` in the URL ([`RedisConfig::fifo`]), or for an acquire asking for
//! `WaitOrder::Fifo`, waiters are granted in arrival order (single node only; Redlock
//! refuses it with `LockError::Unsupported`, as its nodes would each order waiters
//! themselves). Two more keys per lock key, both under the hash tag `{K}`:
//! `{K}:queue` (waiter ids scored by arrival) and `{K}:queue:deadlines` (the same ids
//! scored by the server time at which each entry expires). The FIFO acquire script
//! drops expired entries, grants the lock only to the head of the queue and only when
//! the lock key is free, and otherwise queues the waiter (or refreshes its entry for
//! [`RedisConfig::fifo_entry_ttl`]); while anyone is queued it keeps `{K}:waiting`
//! marked, for as long as the queue lives (a grant that leaves others queued marks it
//! again). The release script, finding the mark, drops expired entries too and
//! publishes the head's id on `{K}:released`, and a client wakes only the waiter of that
//! id. A waiter refreshes its entry at least every third of the entry TTL; one that
//! gives up (its wait ran out, an error) removes it before its attempt returns and
//! wakes the next (it makes no attempt past its deadline; a failed attempt that is
//! retried queues again, at the tail); one whose call is dropped, or cut at the wait
//! plus the grace on a slow server, removes it in the background (see
//! `distlock_api::settle_cleanups`); one that dies is dropped by the next script run
//! after its deadline, which the waiters behind it time their naps to. Both queue keys expire with their longest-lived entry
//! and vanish when empty.
//! The lock key keeps its plain layout, so other libraries still exclude both ways, but
//! their `SET NX` (like a distlock client not asking for FIFO) takes a free key ahead of
//! the queue. The queue's deadlines follow the server's clock: a step forward expires
//! live entries early (their waiters rejoin at the tail), a step back keeps a dead
//! entry longer.
//!
//! # Connections
//! One multiplexed RESP3 connection per node (redis-rs `ConnectionManager`, which
//! reconnects and resubscribes on its own) carries commands and wake-ups for every lock
//! and waiter of a [`RedisLock`]. Redis 6 or later is needed for RESP3.
//!
//! Connect errors name the server's address (never the URL, which may carry a password)
//! and say what the server answered: authentication failed (`WRONGPASS`, `NOAUTH`), no
//! such database, not a Redis server, no RESP3. Those are [`distlock_api::LockError::Config`];
//! an unreachable server is a [`distlock_api::LockError::Connection`].
//!
//! Redlock connects when a majority of its nodes answers. A node down at start-up is
//! retried in the background and joins when it answers; until then its share of each
//! operation fails at once. One server listed twice, found by resolving host names and
//! by comparing the servers' `run_id`s, is a configuration error at connect; a late node
//! that duplicates another never joins.
//!
//! # Sentinel and Cluster
//! `redis+sentinel://s1:26379,s2:26379/MASTER[?db=N]` finds the master through the
//! Sentinels (the address most answering Sentinels name, checked with `ROLE`) and
//! follows a failover: it asks again every 500 ms and at once when a request fails as
//! a failover makes it fail, then switches to the new master, subscribes its wake-up
//! channels there and wakes its waiters. `redis+cluster://n1:6379,n2:6379` uses the
//! driver's cluster connection, which routes each script to the master of the lock's
//! slot and follows `MOVED`/`ASK`. Every name of one lock shares one hash tag (see
//! [`KeyNames`]), and a release's `PUBLISH` reaches every Cluster node. Both bound
//! their connect by the request timeout. Leases across a failover follow the rules of
//! a reconnect (suspect, then kept or lost, as the new master shows); replication is
//! asynchronous, so a grant, or the fencing counter's last increment, that had not
//! reached the replica is lost with the master.
//!
//! # Replica acknowledgement
//! `min_replicas=N` (and `replica_timeout=MS`, default 500 ms) in the URL, or
//! [`RedisConfig::min_replicas`]: every grant, extend and leadership renewal is
//! followed, in one pipeline on the same connection, by `WAIT N MS` to the master that
//! took it, and counts only when N replicas acknowledged. Fewer: a grant is released
//! and the call fails with [`distlock_api::LockError::Transient`] whose source is a
//! [`TooFewReplicas`]; an extend is not counted (the lease turns suspect, then lost,
//! as for any failing renewal). A failover to an acknowledging replica then keeps the
//! grant and the fencing counter. `WAIT` is not consensus: a failover to a replica that
//! did not acknowledge still loses it. Single node, Sentinel and Cluster; Redlock
//! refuses it. `WAIT` holds the client's one connection until it answers.
//!
//! # Semaphores and read-write locks
//! [`RedisLock::semaphore`] and [`RedisLock::rw_lock`] share the client's connection,
//! wake-ups and waiter lines, on a single node, a Sentinel master or a Cluster (Redlock
//! refuses every acquire of them, and its capabilities say why). Their names live
//! under the key's hash tag, in namespaces of their own (`{K}:semaphore…`, `{K}:rw…`,
//! see [`KeyNames`]): holders are a sorted set of owner tokens scored by expiry, pruned
//! by every script, and every key expires with its longest-lived entry.
//! - Semaphore: `{K}:semaphore` holds the permit holders' owner tokens scored by the
//!   server time (ms) at which each expires, `{K}:semaphore:permits` the count they use;
//!   another count is refused with `LockError::PermitMismatch`, and the count goes with
//!   the last holder. A permit's fencing token orders and identifies grants (several
//!   permits are valid at once, so it cannot fence off an older holder).
//! - Read-write lock, with writer preference: `{K}:rw` holds the readers, `{K}:rw:writer`
//!   the writer's token with a `PX` expiry, `{K}:rw:intent` the waiting writers scored by
//!   when each intent lapses (`2 × the backoff cap + 1 s` after its last retry); while an
//!   intent lives new readers are refused. A writer that gives up withdraws its intent
//!   before its call returns (a dropped one, in the background). Every grant's token is
//!   above every earlier grant's of the key, so a fenced resource can refuse a writer
//!   whose lease ran out.
//!
//! Waiting and the `:waiting` marker work as for the mutex, and their fencing tokens
//! come from the mutex's counter (below), so a released key leaves nothing behind.
//! FIFO waiting is the mutex's only. Across a Sentinel or Cluster failover they follow
//! the mutex's rules: replication is asynchronous, so a grant not yet on the replica is
//! lost with the master.
//!
//! # Leader election
//! [`RedisLock::election`] (single node, Sentinel, Cluster; Redlock refuses every
//! campaign: without consensus its terms could not rise strictly). The
//! leadership is the mutex recipe on the record `{K}:election`, a hash of the owner
//! token, the term and the candidate identity with the lease as its `PX`, written,
//! extended and deleted whole by Lua scripts; the term is the next value of the
//! mutex's fencing counter, taken in the winning campaign's script and carried by the
//! lease as its fencing token. `leader()` reads
//! the live leader's identity, term and remaining `PTTL` in one script. Candidates
//! wait as mutex waiters do (a resign publishes on `{K}:election:released`); observers
//! (`wait_change`, and so `LeaderWatch`) subscribe to `{K}:election:changed`, on which
//! every new leadership and resign is announced while they mark the name watched, and
//! look again at the leader's expiry, which nobody announces. Every key expires.
//! Campaigns are not granted in arrival order. A dropped campaign resigns in the
//! background any leadership that may have landed.
//!
//! # Guarantees and caveats
//! - Lease: the key's TTL. The guard's validity deadline is `start + TTL − drift`, where
//!   `start` is before the request was sent and drift is 1 % of the TTL + 2 ms.
//! - Fencing: every primitive's grants take the server's one counter
//!   ([`KeyNames::fence`]; on a Cluster the key's hash slot's,
//!   [`KeyNames::cluster_fence`]), never expiring, and
//!   seeded from the server's clock (its µs since 1970, below 2^53 until about 2255,
//!   so tokens stay exact in JSON and JavaScript) whenever it is gone (forgotten by a
//!   restart without persistence), so tokens keep rising unless the server's clock
//!   steps back just then (the Redis guide's "Fencing" states how far is tolerated). A
//!   restart without persistence still forgets held locks. Failover to an asynchronous
//!   replica can grant a lock twice. Clients of earlier releases (per-key `{K}:fence`
//!   and `{K}:<kind>:fence` counters, or per-slot counters on a single server or
//!   Sentinel) exclude these on every key, but their tokens must not be mixed: finish
//!   the upgrade first (see the guide's "Upgrading from earlier counters").
//! - Redlock: needs a majority of nodes and a remaining validity
//!   (TTL − elapsed − drift) above zero; assumes bounded clock drift and pauses.
//!   Independent nodes cannot agree on one ordered counter (even without faults, a node
//!   that missed a grant lags), so Redlock reports fencing unsupported, its guards'
//!   `fencing_token()` is `None`, and it keeps no `{K}:fence` key. Protect resources
//!   with idempotent or conditional writes, or use a backend with fencing.
//! - Cancel-safety: a dropped acquire runs an owner-checked release in the background
//!   for any grant that may have landed.
//!
//! # Connecting
//! [`RedisLock::connect`] to one node retries a refused or silent port and a server
//! still loading its dataset (`LOADING`), with jittered backoff, until the connect
//! timeout ([`RedisConfig::request_timeout`], default 2 s) has passed, then fails with
//! the last reason (a [`distlock_api::LockError::Connection`] naming the address and
//! the cause in words, such as "connection refused"). Refused credentials or
//! database, and a server that is not Redis (or wants TLS), fail at once. Redlock,
//! Sentinel and Cluster URLs retry the same way within that timeout: Redlock the nodes
//! that refuse for now, until a majority is up; Sentinel while the Sentinels refuse
//! connections or do not know the master yet (a misspelt name is a
//! [`distlock_api::LockError::Config`] at the timeout) and while the master they
//! name refuses, loads or is still a replica; Cluster while its seeds refuse or the
//! Cluster is not `cluster_state:ok`. A malformed URL is a configuration error saying
//! what is wrong, naming the `host:port` it gives, never its password.

// docs.rs (`--cfg docsrs`, nightly) shows which feature each gated item needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

mod config;
mod conn;
mod driver;
mod engine;
mod error;
mod keys;
mod lock;
mod membership;
mod native;
mod node;
mod replicas;
mod scripts;
mod slots;
mod topology;
mod wakeups;

pub use config::{parse_url, RedisConfig, RedisUrl, SentinelUrl, Topology};
pub use keys::{KeyNames, SERVER_FENCE};
pub use lock::RedisLock;
/// The driver this backend is built on, re-exported so its types (for example in error
/// sources) can be named without a separate dependency on a matching version.
pub use redis;
pub use replicas::TooFewReplicas;

/// The backend name of a single-node client, in errors and reports.
pub const REDIS_BACKEND: &str = "redis";

/// The backend name of a Redlock client.
pub const REDLOCK_BACKEND: &str = "redlock";
