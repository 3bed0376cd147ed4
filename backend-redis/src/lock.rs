//! [`RedisLock`]: the client of one Redis node or a Redlock quorum, and the contention
//! engine every primitive's acquire runs in (attempts, wake-ups, the client's waiter
//! lines); the mutex's own attempt, release, extend and inspect.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use distlock_api::backend::prelude::*;
use distlock_api::backend::{Grant, Request};
use distlock_api::{
    Capabilities, Capability, ExtendOutcome, FencingToken, KeyStatus, Lease, LeaseMonitor,
    LockError, LockKey, LockOptions, OwnerToken, ReleaseOutcome, WaitOrder,
};
use futures_util::future::{join_all, select_all};
use tokio::time::{timeout, Instant};

use crate::config::{parse_url, RedisConfig, Topology};
use crate::keys::KeyNames;
use crate::membership::at_node;
use crate::node::{Holder, Node, NodeGrant, NodeView};
use crate::{REDIS_BACKEND, REDLOCK_BACKEND};

pub(crate) mod election;
pub(crate) mod primitive;
mod queue;
pub(crate) mod rw;
pub(crate) mod semaphore;
mod turns;

use turns::Turns;

/// Why Redlock offers no FIFO waiting.
const REDLOCK_NOT_FIFO: &str = "Redlock's nodes would each order the waiters themselves: waiters arriving together can head the queues of different nodes, so none heads a majority and nobody is granted; FIFO needs one ordering point (use a single node, Postgres or ZooKeeper)";

/// Why Redlock refuses `min_replicas`.
const REDLOCK_NO_REPLICA_WAIT: &str = "Redlock's safety comes from a majority of independent nodes, not from replicas: use min_replicas with a single node, Sentinel or Cluster";

/// A Redis lock client: one node, or Redlock over N independent nodes, for every
/// primitive (see [`RedisLock::client`]).
///
/// Each node gets one multiplexed, auto-reconnecting connection, shared by every lock
/// and waiter of this client. Cloning is cheap and shares the connections.
#[derive(Debug, Clone)]
pub struct RedisLock {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    nodes: Vec<Node>,
    config: RedisConfig,
    /// This client's waiters, lined up per key.
    turns: Turns,
}

/// One acquire attempt's result, when it did not fail: a grant or the key held.
pub(crate) enum Attempt {
    Granted(Grant),
    /// Held elsewhere; the holder's remaining TTL when known.
    Held(Option<Duration>),
}

impl RedisLock {
    /// Connects to the node(s) named by `url` with default settings. See
    /// [`crate::parse_url`] for the URL forms.
    ///
    /// Redlock needs a majority of its nodes to answer; the others join in the
    /// background when they do (see the crate docs).
    ///
    /// # Errors
    /// [`LockError::Config`] for a bad URL, a server that refuses the credentials or the
    /// database, is not a Redis server or does not speak RESP3, or a Redlock server
    /// listed twice; [`LockError::Connection`] when the node, or a majority of Redlock
    /// nodes, cannot be reached. Messages name the addresses, never the password.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        RedisLock::connect_with(url, RedisConfig::default()).await
    }

    /// Connects with `config`. The URL's `fifo=true|false`, `min_replicas=N` and
    /// `replica_timeout=MS` parameters override [`RedisConfig::fifo`],
    /// [`RedisConfig::min_replicas`] and [`RedisConfig::replica_timeout`].
    ///
    /// # Errors
    /// As [`RedisLock::connect`], [`LockError::Config`] for invalid `config` or URL
    /// parameters (see [`crate::parse_url`]), and [`LockError::Unsupported`] for FIFO or
    /// `min_replicas` on a Redlock URL.
    pub async fn connect_with(url: &str, mut config: RedisConfig) -> Result<Self, LockError> {
        let url = parse_url(url)?;
        config.fifo = url.fifo.unwrap_or(config.fifo);
        config.min_replicas = url.min_replicas.unwrap_or(config.min_replicas);
        config.replica_timeout = url.replica_timeout.unwrap_or(config.replica_timeout);
        config.validate()?;
        let redlock = url.topology == Topology::Direct && url.nodes.len() > 1;
        if config.fifo && redlock {
            return Err(LockError::Unsupported {
                backend: REDLOCK_BACKEND,
                operation: distlock_api::FIFO_OPERATION,
                reason: REDLOCK_NOT_FIFO,
            });
        }
        if config.min_replicas > 0 && redlock {
            return Err(LockError::Unsupported {
                backend: REDLOCK_BACKEND,
                operation: "min_replicas",
                reason: REDLOCK_NO_REPLICA_WAIT,
            });
        }
        let nodes = crate::topology::connect(url, config.request_timeout).await?;
        if config.min_replicas > 0 {
            let wait = crate::replicas::ReplicaWait {
                replicas: config.min_replicas,
                timeout: config.replica_timeout,
            };
            for node in &nodes {
                node.require_replicas(wait);
            }
        }
        Ok(RedisLock {
            inner: Arc::new(Inner {
                nodes,
                config,
                turns: Turns::default(),
            }),
        })
    }

    pub(crate) fn is_redlock(&self) -> bool {
        self.inner.nodes.len() > 1
    }

    pub(crate) fn name(&self) -> &'static str {
        if self.is_redlock() {
            REDLOCK_BACKEND
        } else {
            REDIS_BACKEND
        }
    }

    fn quorum(&self) -> usize {
        self.inner.nodes.len() / 2 + 1
    }

    fn node_timeout(&self, ttl: Duration) -> Duration {
        if self.is_redlock() {
            self.inner.config.redlock_node_timeout.unwrap_or_else(|| {
                (ttl / 10).clamp(Duration::from_millis(200), Duration::from_secs(1))
            })
        } else {
            self.inner.config.request_timeout
        }
    }

    /// The master a Sentinel client sends its requests to now, `host:port` (a test
    /// hook for failovers); `None` for other deployments.
    #[doc(hidden)]
    pub fn sentinel_master(&self) -> Option<String> {
        match self.inner.nodes.first()?.connection()? {
            crate::conn::NodeConn::Sentinel(conn) => Some(conn.master()),
            _ => None,
        }
    }

    /// Channels with local waiters, summed over nodes (a test hook for leaks).
    #[doc(hidden)]
    pub fn tracked_wakeup_channels(&self) -> usize {
        self.inner.nodes.iter().map(Node::tracked_channels).sum()
    }

    /// Keys this client's waiters are lined up for (a test hook for leaks).
    #[doc(hidden)]
    pub fn tracked_waiter_lines(&self) -> usize {
        self.inner.turns.len()
    }

    /// How many of this client's waiters are lined up for `key` (a test hook).
    #[doc(hidden)]
    pub fn waiters_in_line(&self, key: &LockKey) -> usize {
        self.inner.turns.in_line(&KeyNames::for_key(key).lock)
    }

    /// Runs `op` on every node in parallel, each bounded by `limit` (Redlock) or by the
    /// connection's response timeout (one node).
    async fn on_all_nodes<'a, T, F, Fut>(
        &'a self,
        limit: Duration,
        op: F,
    ) -> Vec<Result<T, LockError>>
    where
        F: Fn(&'a Node) -> Fut,
        Fut: std::future::Future<Output = Result<T, LockError>>,
    {
        if let [node] = self.inner.nodes.as_slice() {
            // The connection's own response timeout (`request_timeout`) bounds a single
            // node; skipping the extra timer and join keeps the hot path lean.
            return vec![op(node).await];
        }
        join_all(self.inner.nodes.iter().map(|node| {
            let call = op(node);
            async move {
                timeout(limit, call).await.unwrap_or_else(|_| {
                    Err(LockError::connection(
                        REDIS_BACKEND,
                        format!("{} did not answer within {limit:?}", node.address()),
                    ))
                })
            }
        }))
        .await
    }

    /// The error for too few nodes answering, or the single node's own error.
    fn quorum_error(&self, mut errors: Vec<LockError>) -> LockError {
        if !self.is_redlock() {
            if let Some(error) = errors.pop() {
                return error;
            }
        }
        // Every failed node's own error, each naming its address.
        let failures: Vec<String> = errors.iter().map(at_node).collect();
        let message = format!(
            "{} of {} Redlock nodes failed, so no majority of {} is possible: {}",
            failures.len(),
            self.inner.nodes.len(),
            self.quorum(),
            failures.join("; ")
        );
        // Retrying helps only if the nodes that may recover could still make a majority.
        let permanent = errors.iter().filter(|e| !e.is_retryable()).count();
        if self.inner.nodes.len() - permanent < self.quorum() {
            LockError::backend_error(REDLOCK_BACKEND, message)
        } else {
            LockError::connection(REDLOCK_BACKEND, message)
        }
    }

    /// Owner-checked release on every node, including ones that failed or timed out.
    async fn release_everywhere(
        &self,
        names: &KeyNames,
        owner: OwnerToken,
        ttl: Duration,
    ) -> Vec<Result<ReleaseOutcome, LockError>> {
        self.on_all_nodes(
            self.node_timeout(ttl)
                .max(self.inner.config.request_timeout),
            |node| node.release(names, owner),
        )
        .await
    }

    /// The error of a wait that had no answer from the server(s) by its deadline:
    /// whether the key is held is unknown. Names the addresses.
    pub(crate) fn unanswered_error(&self, wait: Duration) -> LockError {
        let addresses: Vec<&str> = self.inner.nodes.iter().map(Node::address).collect();
        let who = if self.is_redlock() {
            format!("a majority of the Redlock nodes ({})", addresses.join(", "))
        } else {
            format!("the server at {}", addresses.join(", "))
        };
        LockError::connection(
            self.name(),
            format!("{who} did not answer within the wait ({wait:?}); whether the lock is held is unknown (a late grant is released)"),
        )
    }

    /// One acquire of `request` (whose names are `names`: the mutex's or a
    /// primitive's): a single attempt for a try, else [`RedisLock::wait_for`].
    /// `attempt(waiting)` makes one attempt (see there).
    pub(crate) async fn contend<F, Fut>(
        &self,
        request: &Request<'_>,
        names: &KeyNames,
        mut attempt: F,
    ) -> Result<Option<Grant>, LockError>
    where
        F: FnMut(Option<Duration>) -> Fut,
        Fut: std::future::Future<Output = Result<Attempt, LockError>>,
    {
        if request.waits() {
            return self.wait_for(request, names, attempt).await;
        }
        match attempt(None).await? {
            Attempt::Granted(grant) => Ok(Some(grant)),
            Attempt::Held(_) => {
                request.saw_held();
                Ok(None)
            }
        }
    }

    /// How long a held key stays marked as waited on after an attempt of a waiter
    /// with `options`: past its next retry (at most the backoff cap later), so a
    /// release in between publishes. Capped (an enormous cap would be an invalid
    /// expiry); a waiter napping longer than that is woken by its safety-net retry
    /// instead. A waiting writer's intent lives as long, for the same reason.
    pub(crate) fn waiting_marker(options: &LockOptions) -> Duration {
        options
            .backoff()
            .max()
            .saturating_mul(2)
            .saturating_add(Duration::from_secs(1))
            .min(distlock_api::MAX_TTL)
    }

    /// The acquire loop: attempts, then waits for a wake-up or a safety-net poll, until
    /// granted (`Some`) or the request's deadline passes with the key held (`None`).
    /// Notes every answer that found the key held on the request. An error ends the
    /// loop: the caller retries it under its error patience. `attempt(waiting)` makes
    /// one attempt; `waiting` is how long a held key stays marked as waited on (`None`
    /// until this waiter listens for wake-ups on `names`).
    ///
    /// Once the key is found held, the waiter lines up behind this client's other
    /// waiters for the key (see [`turns`]) and retries only at the front of the line.
    async fn wait_for<F, Fut>(
        &self,
        request: &Request<'_>,
        names: &KeyNames,
        mut attempt: F,
    ) -> Result<Option<Grant>, LockError>
    where
        F: FnMut(Option<Duration>) -> Fut,
        Fut: std::future::Future<Output = Result<Attempt, LockError>>,
    {
        let (options, deadline) = (request.options, request.deadline);
        let mut backoff = options.backoff().delays();
        let mut tickets = Vec::new();
        // Declared in this order so that the turn is dropped (passed on) before the
        // place in the line is given up.
        let mut line = None;
        let mut turn = None;
        if self.inner.turns.busy(&names.lock) {
            // Others of this client already wait for the key (so it is held): line up
            // behind them without trying first, which would overtake them.
            request.saw_held();
            tickets = self.watch_all(names).await;
            line = Some(self.inner.turns.join(&names.lock));
        }
        let marker = Self::waiting_marker(options);
        loop {
            if let (Some(line), None) = (&line, &turn) {
                // Not at the front by the deadline: the key is held (the line exists
                // only once it was found held).
                let Some(front) = line.turn(deadline).await else {
                    return Ok(None);
                };
                turn = Some(front);
            }
            // Register for wake-ups before the attempt, so a release in between counts.
            let mut woken: Vec<Pin<Box<tokio::sync::futures::Notified<'_>>>> = tickets
                .iter()
                .map(|(ticket, _): &(crate::wakeups::WakeTicket, bool)| {
                    Box::pin(ticket.notify().notified())
                })
                .collect();
            for w in &mut woken {
                w.as_mut().enable();
            }
            let subscribed = !tickets.is_empty() && tickets.iter().all(|(_, ok)| *ok);
            let held_for = match attempt(subscribed.then_some(marker)).await? {
                Attempt::Granted(grant) => return Ok(Some(grant)),
                Attempt::Held(held_for) => {
                    request.saw_held();
                    held_for
                }
            };
            if request.deadline_passed() {
                return Ok(None);
            }
            if tickets.is_empty() {
                // First contention: subscribe on every node, line up, then retry at once
                // (at the front of the line).
                drop(woken);
                tickets = self.watch_all(names).await;
                line = Some(self.inner.turns.join(&names.lock));
                continue;
            }
            // A safety-net poll even when subscribed: foreign holders do not publish.
            let poll = if subscribed {
                // Jittered, so many waiters' safety-net polls do not come in lockstep.
                let cap = options.backoff().max();
                distlock_api::Backoff::new(cap, cap).delays().next_delay()
            } else {
                backoff.next_delay()
            };
            let mut nap = held_for
                .map_or(poll, |h| h.min(poll))
                .max(Duration::from_millis(1));
            if let Some(d) = deadline {
                nap = nap.min(d.saturating_duration_since(Instant::now()));
            }
            tokio::select! {
                _ = select_all(woken) => {}
                _ = tokio::time::sleep(nap) => {}
            }
        }
    }

    /// Subscribes to `names`' wake-ups on every node.
    async fn watch_all(&self, names: &KeyNames) -> Vec<(crate::wakeups::WakeTicket, bool)> {
        join_all(self.inner.nodes.iter().map(|n| n.watch(names, None))).await
    }

    /// One mutex attempt on every node. `waiting`: how long a held key stays marked as
    /// waited on (`None` unless the caller listens for wake-ups).
    pub(crate) async fn attempt(
        &self,
        key: &LockKey,
        names: &KeyNames,
        options: &LockOptions,
        waiting: Option<Duration>,
    ) -> Result<Attempt, LockError> {
        let (owner, ttl) = (OwnerToken::random(), options.ttl());
        let started = Instant::now();
        // Until we hand out the grant, a drop of this future must undo it.
        let compensation = Compensation {
            lock: self,
            key,
            owner,
            ttl,
            armed: true,
        };
        let results = self
            .on_all_nodes(self.node_timeout(ttl), |node| {
                node.try_grant(names, owner, ttl, !self.is_redlock(), waiting)
            })
            .await;
        let (mut granted, mut fence, mut held_for, mut errors) =
            (0, None, None::<Duration>, Vec::new());
        for result in results {
            match result {
                Ok(NodeGrant::Granted(token)) => {
                    granted += 1;
                    // One node only: Redlock's nodes count no grants.
                    fence = token;
                }
                Ok(NodeGrant::Held(pttl)) => {
                    held_for = match (held_for, pttl) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    }
                }
                Err(error) => errors.push(error),
            }
        }
        if granted >= self.quorum() {
            if let Some(grant) = self.grant(key, owner, fence, started, ttl) {
                compensation.disarm();
                return Ok(Attempt::Granted(grant));
            }
        }
        if granted > 0 || !errors.is_empty() {
            // Partial wins, and nodes whose answer we never saw, are undone everywhere.
            self.release_everywhere(names, owner, ttl).await;
        }
        compensation.disarm();
        if errors.len() > self.inner.nodes.len() - self.quorum() {
            return Err(self.quorum_error(errors));
        }
        if granted >= self.quorum() {
            // Granted, but the answers came too late to leave any validity.
            return Err(too_late(self.name(), "acquire"));
        }
        Ok(Attempt::Held(held_for))
    }
}

impl RedisLock {
    /// A mutex grant of `ttl` requested at `started`, or `None` when the answers came
    /// too late to leave any validity.
    fn grant(
        &self,
        key: &LockKey,
        owner: OwnerToken,
        token: Option<FencingToken>,
        started: Instant,
        ttl: Duration,
    ) -> Option<Grant> {
        let valid_until = self.valid_until(started, ttl)?;
        let lease = Lease::new(key.clone(), owner, token, ttl, started);
        Some(Grant::new(lease, LeaseMonitor::new(valid_until)))
    }

    /// The validity deadline of a lease of `ttl` requested at `started`: `started +
    /// ttl − drift`, or `None` when that has passed already.
    pub(crate) fn valid_until(&self, started: Instant, ttl: Duration) -> Option<Instant> {
        started
            .checked_add(ttl)
            .and_then(|end| end.checked_sub(self.inner.config.drift(ttl)))
            .filter(|end| *end > Instant::now())
    }

    /// Whether a mutex acquire with `options` waits in the FIFO queue: asked for by the
    /// options or by the client's configuration (Redlock refuses both, see
    /// [`RedisLock::capabilities`]).
    pub(crate) fn queued(&self, options: &LockOptions) -> bool {
        self.inner.config.fifo || options.order() == WaitOrder::Fifo
    }
}

/// The error for a grant or extend whose answers arrived after its validity ran out:
/// the servers or the network are slow, so it is worth retrying.
fn too_late(backend: &'static str, operation: &str) -> LockError {
    LockError::connection(
        backend,
        format!("the {operation} succeeded, but its answers arrived after the lease's validity ran out (slow server or network)"),
    )
}

/// Releases a grant that may have happened if the acquire future is dropped mid-flight.
/// Borrows, so the common path (disarmed) costs no clones.
struct Compensation<'a> {
    lock: &'a RedisLock,
    key: &'a LockKey,
    owner: OwnerToken,
    ttl: Duration,
    armed: bool,
}

impl Compensation<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Compensation<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (lock, names, owner, ttl) = (
                self.lock.clone(),
                KeyNames::for_key(self.key),
                self.owner,
                self.ttl,
            );
            // Counted, so that a program exiting right after can let it finish.
            distlock_api::backend::spawn_cleanup(&runtime, async move {
                lock.release_everywhere(&names, owner, ttl).await;
            });
        }
    }
}

impl RedisLock {
    /// What each primitive of this client offers: the one statement of every claim,
    /// which the generic checks and the conformance kit read.
    ///
    /// - Every primitive of a single node (direct, Sentinel, Cluster) expires by TTL,
    ///   extends, hands out fencing tokens from a clock-seeded counter, and wakes its
    ///   waiters through pub/sub on release.
    /// - FIFO: the mutex's queue only; the semaphore, the read-write lock and election
    ///   grant in no particular order.
    /// - Redlock: the mutex only, without fencing or FIFO.
    pub(crate) fn capabilities(&self) -> Capabilities {
        let mut capabilities = Capabilities::all_supported();
        capabilities.semaphore.fifo = Capability::Unsupported(primitive::PRIMITIVES_NOT_FIFO);
        capabilities.rw_lock.fifo = Capability::Unsupported(primitive::PRIMITIVES_NOT_FIFO);
        capabilities.election.fifo = Capability::Unsupported(election::ELECTION_NOT_FIFO);
        if self.is_redlock() {
            capabilities.mutex.fifo = Capability::Unsupported(REDLOCK_NOT_FIFO);
            capabilities.mutex.fencing = Capability::Unsupported(
                "Redlock has no consensus: per-node counters drift apart (a node that missed a grant lags, a restarted one starts over), so its grants carry no fencing token",
            );
            capabilities = capabilities
                .mutex_only(primitive::REDLOCK_NO_PRIMITIVES)
                .without_election(election::REDLOCK_NO_ELECTION);
        }
        capabilities
    }

    /// Owner-checked release of a mutex lease on every node.
    ///
    /// # Errors
    /// Connection and backend errors when too few nodes answer for a majority.
    pub(crate) async fn release_mutex(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        let names = KeyNames::for_key(lease.key());
        let results = self
            .release_everywhere(&names, lease.owner(), lease.ttl())
            .await;
        let (mut released, mut held_by_other, mut errors) = (false, false, Vec::new());
        for result in results {
            match result {
                Ok(ReleaseOutcome::Released) => released = true,
                Ok(ReleaseOutcome::HeldByOther) => held_by_other = true,
                Ok(ReleaseOutcome::Expired) => {}
                Err(error) => errors.push(error),
            }
        }
        if released {
            return Ok(ReleaseOutcome::Released);
        }
        if errors.len() > self.inner.nodes.len() - self.quorum() {
            return Err(self.quorum_error(errors));
        }
        Ok(if held_by_other {
            ReleaseOutcome::HeldByOther
        } else {
            ReleaseOutcome::Expired
        })
    }

    /// Owner-checked extension of a mutex lease on every node, to expire `ttl` from now.
    ///
    /// # Errors
    /// Connection and backend errors when too few nodes answer for a majority; a
    /// connection error when the answers came too late to leave any validity.
    pub(crate) async fn extend_mutex(
        &self,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        let names = KeyNames::for_key(lease.key());
        let started = Instant::now();
        let results = self
            .on_all_nodes(
                self.node_timeout(ttl)
                    .max(self.inner.config.request_timeout),
                |node| node.extend(&names, lease.owner(), ttl),
            )
            .await;
        let (mut extended, mut held_by_other, mut errors) = (0, false, Vec::new());
        for result in results {
            match result {
                Ok(ExtendOutcome::Extended { .. }) => extended += 1,
                Ok(ExtendOutcome::HeldByOther) => held_by_other = true,
                // A node never answers Lost (only a guard does).
                Ok(ExtendOutcome::Expired | ExtendOutcome::Lost) => {}
                Err(error) => errors.push(error),
            }
        }
        let valid_until = self.valid_until(started, ttl);
        if let (true, Some(valid_until)) = (extended >= self.quorum(), valid_until) {
            return Ok(ExtendOutcome::Extended { valid_until });
        }
        if errors.len() > self.inner.nodes.len() - self.quorum() {
            return Err(self.quorum_error(errors));
        }
        if extended >= self.quorum() {
            return Err(too_late(self.name(), "extend"));
        }
        Ok(if held_by_other {
            ExtendOutcome::HeldByOther
        } else {
            ExtendOutcome::Expired
        })
    }

    /// The mutex `key` as a majority of nodes store it.
    ///
    /// # Errors
    /// Connection and backend errors when too few nodes answer for a majority.
    pub(crate) async fn inspect_mutex(&self, key: &LockKey) -> Result<KeyStatus, LockError> {
        let names = KeyNames::for_key(key);
        let results = self
            .on_all_nodes(self.inner.config.request_timeout, |node| {
                node.inspect(&names)
            })
            .await;
        let (mut views, mut errors) = (Vec::new(), Vec::new());
        for result in results {
            match result {
                Ok(view) => views.push(view),
                Err(error) => errors.push(error),
            }
        }
        if errors.len() > self.inner.nodes.len() - self.quorum() {
            return Err(self.quorum_error(errors));
        }
        Ok(key_status(&views, self.quorum(), self.is_redlock()))
    }
}

/// What the nodes' views say: held when a majority store one owner (a foreign holder's
/// odd value or key type included). No fencing token: the counter is every key's of
/// its server (or slot), so it is no key's own (Redlock keeps none). No queue on Redlock, and
/// the shortest remaining lease among the majority's nodes.
fn key_status(views: &[NodeView], quorum: usize, redlock: bool) -> KeyStatus {
    let majority_owner = views.iter().filter_map(|v| v.owner.as_ref()).find(|owner| {
        views
            .iter()
            .filter(|v| v.owner.as_ref() == Some(*owner))
            .count()
            >= quorum
    });
    let token = |status: KeyStatus| match views {
        [view] if !redlock => status.with_waiters(Some(view.queued)),
        _ => status,
    };
    // Keys on a minority of nodes (a partial or expiring grant) hold nobody's lock.
    let Some(owner) = majority_owner else {
        return token(KeyStatus::free());
    };
    let remaining = views
        .iter()
        .filter(|v| v.owner.as_ref() == Some(owner))
        .filter_map(|v| v.remaining)
        .min();
    token(
        KeyStatus::held()
            .with_remaining(remaining)
            .with_holder(Some(describe(owner))),
    )
}

/// A holder, for `status`: an owner token authorises release, so only enough of a
/// value to tell holders apart is shown.
fn describe(holder: &Holder) -> String {
    match holder {
        Holder::Value(value) if value.is_empty() => {
            "an empty value (not a distlock owner token: another program holds it)".to_owned()
        }
        Holder::Value(value) => {
            let short: String = value.chars().take(8).collect();
            if short.len() < value.len() {
                format!("owner token {short}…")
            } else {
                format!("value {short:?} (not a distlock owner token)")
            }
        }
        Holder::OtherType(kind) => {
            format!("a key of type {kind} (not a lock value: another program holds it)")
        }
    }
}
