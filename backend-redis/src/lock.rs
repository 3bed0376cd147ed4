//! [`RedisLock`]: the [`DistributedLock`] over one Redis node or a Redlock quorum.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::backend::prelude::*;
use distlock_api::backend::{bounded_wait, mark_contended, Granted, WaitBound, WaitReport};
use distlock_api::{
    check_ttl, BackendInfo, Capabilities, Capability, DistributedLock, ExtendOutcome, FencingToken,
    KeyStatus, Lease, LeaseMonitor, LockError, LockGuard, LockKey, LockOptions, OwnerToken,
    ReleaseOutcome, WaitOrder,
};
use futures_util::future::{join_all, select_all};
use tokio::time::{timeout, Instant};

use crate::config::{parse_url, RedisConfig, Topology};
use crate::keys::KeyNames;
use crate::membership::at_node;
use crate::node::{Holder, Node, NodeGrant, NodeView};
use crate::{REDIS_BACKEND, REDLOCK_BACKEND};

mod election;
mod primitive;
mod queue;
mod rw;
mod semaphore;
mod turns;

pub use election::RedisElection;
pub use rw::RedisRwLock;
pub use semaphore::RedisSemaphore;

use turns::Turns;

/// Why Redlock offers no FIFO waiting.
const REDLOCK_NOT_FIFO: &str = "Redlock's nodes would each order the waiters themselves: waiters arriving together can head the queues of different nodes, so none heads a majority and nobody is granted; FIFO needs one ordering point (use a single node, Postgres or ZooKeeper)";

/// How long an acquire keeps retrying a single node that fails.
const ERROR_PATIENCE: Duration = Duration::from_secs(30);

/// How many Redlock attempts in a row may miss the majority through node failures
/// before an acquire gives up: slow nodes get another chance, a lost majority fails fast.
const REDLOCK_ATTEMPTS: u32 = 3;

/// How long past its wait an acquire lets an attempt already in flight answer, so a
/// slow but live server still gets a definite "held" or "granted" in.
const DEADLINE_GRACE: Duration = Duration::from_millis(50);

/// A Redis lock client: one node, or Redlock over N independent nodes.
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

/// One acquire attempt's result, when it did not fail: a guard (or, for a campaign, a
/// leadership) or the key held.
pub(crate) enum Attempt<G = LockGuard> {
    Granted(G),
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

    /// Connects with `config`. A `fifo=true|false` parameter in the URL's query string
    /// overrides [`RedisConfig::fifo`].
    ///
    /// # Errors
    /// As [`RedisLock::connect`], [`LockError::Config`] for invalid `config` or a
    /// `fifo` parameter that is not `true` or `false`, and [`LockError::Unsupported`]
    /// for FIFO on a Redlock URL.
    pub async fn connect_with(url: &str, mut config: RedisConfig) -> Result<Self, LockError> {
        let url = parse_url(url)?;
        config.fifo = url.fifo.unwrap_or(config.fifo);
        config.validate()?;
        let redlock = url.topology == Topology::Direct && url.nodes.len() > 1;
        if config.fifo && redlock {
            return Err(LockError::Unsupported {
                backend: REDLOCK_BACKEND,
                operation: distlock_api::FIFO_OPERATION,
                reason: REDLOCK_NOT_FIFO,
            });
        }
        let nodes = crate::topology::connect(url, config.request_timeout).await?;
        Ok(RedisLock {
            inner: Arc::new(Inner {
                nodes,
                config,
                turns: Turns::default(),
            }),
        })
    }

    fn is_redlock(&self) -> bool {
        self.inner.nodes.len() > 1
    }

    fn name(&self) -> &'static str {
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
            crate::topology::NodeConn::Sentinel(conn) => Some(conn.master()),
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

    /// Whether a failed attempt may be retried: only while waiting, until the deadline,
    /// and for at most [`ERROR_PATIENCE`] (one node) or [`REDLOCK_ATTEMPTS`] attempts
    /// (Redlock) of consecutive failures.
    fn retry_or_give_up(
        &self,
        error: LockError,
        deadline: Option<Instant>,
        started: Instant,
        failing: &mut Option<(Instant, u32)>,
    ) -> Result<Option<Duration>, LockError> {
        let (since, attempts) = failing.get_or_insert((Instant::now(), 0));
        *attempts += 1;
        let patience_spent = if self.is_redlock() {
            *attempts >= REDLOCK_ATTEMPTS
        } else {
            since.elapsed() >= ERROR_PATIENCE
        };
        let out_of_time = deadline.is_some_and(|d| d == started || Instant::now() >= d);
        if patience_spent || out_of_time {
            return Err(error);
        }
        Ok(None)
    }

    /// The error for a wait that ran out: `Timeout` when an attempt saw the key held,
    /// else a connection error, as no answer says who holds it.
    fn out_of_wait(&self, key: &LockKey, started: Instant, held_seen: bool) -> LockError {
        let waited = started.elapsed();
        if held_seen {
            return LockError::Timeout {
                backend: self.name(),
                key: key.clone(),
                waited,
            };
        }
        let addresses: Vec<&str> = self.inner.nodes.iter().map(Node::address).collect();
        let who = if self.is_redlock() {
            format!("a majority of the Redlock nodes ({})", addresses.join(", "))
        } else {
            format!("the server at {}", addresses.join(", "))
        };
        LockError::connection(
            self.name(),
            format!("{who} did not answer within the wait ({waited:?}); whether the lock is held is unknown"),
        )
    }

    /// A waiting acquire of `key` (whose names are `names`: the mutex's or a
    /// primitive's) bounded by its wait: [`RedisLock::wait_for`] within
    /// [`bounded_wait`]. `attempt` makes one attempt (see [`RedisLock::wait_for`]).
    pub(crate) async fn acquire_waiting<F, Fut, G>(
        &self,
        key: &LockKey,
        names: &KeyNames,
        options: &LockOptions,
        attempt: F,
    ) -> Result<G, LockError>
    where
        F: FnMut(Option<Duration>) -> Fut,
        Fut: std::future::Future<Output = Result<Attempt<G>, LockError>>,
        G: Granted,
    {
        let bound = WaitBound::starting_now(options, DEADLINE_GRACE);
        let (started, deadline) = (bound.started, bound.deadline);
        let report = WaitReport::new();
        let waiting = async {
            self.wait_for(key, names, options, started, deadline, &report, attempt)
                .await
        };
        // The wait bounds the call whatever the servers do. Dropping an attempt in
        // flight arms its compensation, which releases a grant the server applies late.
        bounded_wait(self.name(), key, bound, &report, waiting, |_| {
            self.out_of_wait(key, started, false)
        })
        .await
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
    /// granted or `deadline` passes. Sets `held_seen` once any attempt finds the key held,
    /// so a caller cutting this short knows whether "held by another owner" is known.
    /// `attempt(waiting)` makes one attempt; `waiting` is how long a held key stays
    /// marked as waited on (`None` until this waiter listens for wake-ups on `names`).
    ///
    /// Once the key is found held, the waiter lines up behind this client's other
    /// waiters for the key (see [`turns`]) and retries only at the front of the line.
    #[allow(clippy::too_many_arguments)]
    async fn wait_for<F, Fut, G>(
        &self,
        key: &LockKey,
        names: &KeyNames,
        options: &LockOptions,
        started: Instant,
        deadline: Option<Instant>,
        report: &WaitReport,
        mut attempt: F,
    ) -> Result<G, LockError>
    where
        F: FnMut(Option<Duration>) -> Fut,
        Fut: std::future::Future<Output = Result<Attempt<G>, LockError>>,
    {
        let mut backoff = options.backoff().delays();
        let mut tickets = Vec::new();
        let mut failing: Option<(Instant, u32)> = None;
        // Declared in this order so that the turn is dropped (passed on) before the
        // place in the line is given up.
        let mut line = None;
        let mut turn = None;
        if self.inner.turns.busy(&names.lock) {
            // Others of this client already wait for the key (so it is held): line up
            // behind them without trying first, which would overtake them.
            report.saw_held();
            tickets = self.watch_all(names).await;
            line = Some(self.inner.turns.join(&names.lock));
        }
        let marker = Self::waiting_marker(options);
        loop {
            if let (Some(line), None) = (&line, &turn) {
                turn = Some(
                    line.turn(deadline)
                        .await
                        .ok_or_else(|| self.out_of_wait(key, started, report.held_seen()))?,
                );
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
            let held_for = match attempt(subscribed.then_some(marker)).await {
                Ok(Attempt::Granted(guard)) => return Ok(guard),
                Ok(Attempt::Held(held_for)) => {
                    failing = None;
                    report.saw_held();
                    held_for
                }
                // A single node restarting, or Redlock nodes slow to answer: keep trying
                // while the wait allows, within a bounded patience.
                Err(error) if error.is_retryable() => {
                    self.retry_or_give_up(error, deadline, started, &mut failing)?
                }
                Err(error) => return Err(error),
            };
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(self.out_of_wait(key, started, report.held_seen()));
            }
            if tickets.is_empty() {
                // First contention: subscribe on every node, line up, then retry at once
                // (at the front of the line).
                drop(woken);
                tickets = self.watch_all(names).await;
                line = Some(self.inner.turns.join(&names.lock));
                continue;
            }
            let subscribed = subscribed && failing.is_none();
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

    /// One attempt on every node. `waiting`: how long a held key stays marked as waited
    /// on (`None` unless the caller listens for wake-ups).
    async fn attempt(
        &self,
        key: &LockKey,
        names: &KeyNames,
        options: &LockOptions,
        waiting: Option<Duration>,
    ) -> Result<Attempt, LockError> {
        let (owner, ttl) = (OwnerToken::random(), options.ttl());
        let started = Instant::now();
        // Until we hand out a guard, a drop of this future must undo any grant.
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
            if let Some(guard) = self.guard(key, owner, fence, started, options) {
                compensation.disarm();
                return Ok(Attempt::Granted(guard));
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
    /// The guard for a grant requested at `started`, or `None` when the answers came
    /// too late to leave any validity.
    fn guard(
        &self,
        key: &LockKey,
        owner: OwnerToken,
        token: Option<FencingToken>,
        started: Instant,
        options: &LockOptions,
    ) -> Option<LockGuard> {
        let ttl = options.ttl();
        let valid_until = self.valid_until(started, ttl)?;
        let lease = Lease::new(key.clone(), owner, token, ttl, started);
        Some(LockGuard::new(
            lease,
            LeaseMonitor::new(valid_until),
            Arc::new(self.clone()),
            options.auto_renew(),
        ))
    }

    /// The validity deadline of a lease of `ttl` requested at `started`: `started +
    /// ttl − drift`, or `None` when that has passed already.
    pub(crate) fn valid_until(&self, started: Instant, ttl: Duration) -> Option<Instant> {
        started
            .checked_add(ttl)
            .and_then(|end| end.checked_sub(self.inner.config.drift(ttl)))
            .filter(|end| *end > Instant::now())
    }

    /// Whether an acquire with `options` waits in the FIFO queue: asked for by the
    /// options or by the client's configuration.
    ///
    /// # Errors
    /// [`LockError::Unsupported`] for FIFO asked of a Redlock client.
    fn queued(&self, options: &LockOptions) -> Result<bool, LockError> {
        options.check_order(self.name(), self.fifo_capability())?;
        Ok(self.inner.config.fifo || options.order() == WaitOrder::Fifo)
    }

    fn fifo_capability(&self) -> Capability {
        if self.is_redlock() {
            Capability::Unsupported(REDLOCK_NOT_FIFO)
        } else {
            Capability::Supported
        }
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
    /// What every primitive of this client offers: every handle reports this.
    pub(crate) fn capabilities(&self) -> Capabilities {
        let mut capabilities = Capabilities::all_supported();
        capabilities.mutex.fifo = self.fifo_capability();
        capabilities.semaphore.fifo = Capability::Unsupported(primitive::PRIMITIVES_NOT_FIFO);
        capabilities.rw_lock.fifo = Capability::Unsupported(primitive::PRIMITIVES_NOT_FIFO);
        capabilities.election.fifo = Capability::Unsupported(election::ELECTION_NOT_FIFO);
        if self.is_redlock() {
            capabilities.mutex.fencing = Capability::Unsupported(
                "Redlock has no consensus: per-node counters drift apart (a node that missed a grant lags, a restarted one starts over), so its grants carry no fencing token",
            );
            capabilities = capabilities
                .mutex_only(primitive::REDLOCK_NO_PRIMITIVES)
                .without_election(election::REDLOCK_NO_ELECTION);
        }
        capabilities
    }
}

#[async_trait]
impl DistributedLock for RedisLock {
    fn info(&self) -> BackendInfo {
        BackendInfo::new(self.name(), self.capabilities())
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        options.validate_for(self.name())?;
        if self.queued(options)? {
            return self.try_ahead_of_queue(key, options).await;
        }
        match self
            .attempt(key, &KeyNames::for_key(key), options, None)
            .await?
        {
            Attempt::Granted(guard) => Ok(Some(guard)),
            Attempt::Held(_) => Ok(None),
        }
    }

    async fn acquire(&self, key: &LockKey, options: &LockOptions) -> Result<LockGuard, LockError> {
        options.validate_for(self.name())?;
        if self.queued(options)? {
            let bound = WaitBound::starting_now(options, DEADLINE_GRACE);
            let report = WaitReport::new();
            // Bounds its own steps by the wait, and leaves the queue before it returns.
            let granted = self
                .wait_in_queue(key, options, bound.started, bound.deadline, &report)
                .await?;
            return Ok(mark_contended(granted, report.held_seen()));
        }
        let names = KeyNames::for_key(key);
        self.acquire_waiting(key, &names, options, |waiting| {
            self.attempt(key, &names, options, waiting)
        })
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
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

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        check_ttl(ttl).map_err(|e| LockError::invalid_options(self.name(), e))?;
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

    async fn inspect(&self, key: &LockKey) -> Result<KeyStatus, LockError> {
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
/// odd value or key type included). Redlock reports no token (it keeps no counters) and
/// no queue, and the shortest remaining lease among the majority's nodes.
fn key_status(views: &[NodeView], quorum: usize, redlock: bool) -> KeyStatus {
    let majority_owner = views.iter().filter_map(|v| v.owner.as_ref()).find(|owner| {
        views
            .iter()
            .filter(|v| v.owner.as_ref() == Some(*owner))
            .count()
            >= quorum
    });
    let token = |status: KeyStatus| match views {
        [view] if !redlock => status
            .with_fencing_token(view.fence)
            .with_waiters(Some(view.queued)),
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
