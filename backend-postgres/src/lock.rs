//! [`PostgresLock`]: the [`DistributedLock`] over Postgres session advisory locks.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::{
    check_ttl, BackendInfo, Capabilities, DistributedLock, ExtendOutcome, FencingToken, KeyStatus,
    Lease, LockError, LockGuard, LockKey, LockOptions, OwnerToken, ReleaseOutcome,
};
use sqlx::postgres::PgConnectOptions;
use sqlx::Connection as _;
use tokio::sync::{oneshot, Notify, Semaphore};
use tokio::time::{timeout_at, Instant};

use crate::config::{connect_options, server_address, PostgresConfig};
use crate::error;
use crate::hash::advisory_key;
use crate::session::{self, Command, Failure, Granted, Kind, SessionHandle};
use crate::sql::{ensure_schema, Statements};
use crate::POSTGRES_BACKEND;

/// How long an `acquire` that waits forever keeps retrying while the server is down.
const ERROR_PATIENCE: Duration = Duration::from_secs(30);
/// Requests in flight per shared session in use: a client with `n` requests in flight
/// spreads new ones over its first `n / 8 + 1` shared sessions (least busy first),
/// opening more, up to the configured number, as the load grows.
const QUEUE_PER_SESSION: usize = 8;
/// How long past a wait's deadline an acquire still waits for an answer on its way
/// (the server ends a wait at the deadline, then the reply travels back) before it
/// gives up on the server.
const ANSWER_GRACE: Duration = Duration::from_millis(50);
/// Attempts on other sessions when the chosen one closed before running a command.
const SESSION_ATTEMPTS: usize = 4;

/// What every session of a client is opened and run with.
#[derive(Debug)]
pub(crate) struct Settings {
    pub config: PostgresConfig,
    pub connect: PgConnectOptions,
    pub sql: Statements,
}

impl Settings {
    /// A connection error with a message of ours, at the server's address.
    pub(crate) fn connection_error(&self, why: impl Into<String>) -> LockError {
        LockError::connection_at(POSTGRES_BACKEND, server_address(&self.connect), why.into())
    }
}

/// A Postgres lock client: session-level advisory locks, multiplexed over a few
/// sessions. See the crate docs for the protocol and its guarantees.
///
/// Cloning is cheap and shares the sessions. Two separate `connect`s are two clients:
/// they exclude each other on the server like two processes would. Within one client a
/// key is never granted twice at once (advisory locks are re-entrant per session, so the
/// client tracks the keys its shared sessions hold).
#[derive(Clone)]
pub struct PostgresLock {
    shared: Arc<Shared>,
}

/// The state shared by a client's handles and its session tasks.
pub(crate) struct Shared {
    pub settings: Arc<Settings>,
    registry: Mutex<Registry>,
    pool: Mutex<Pool>,
    /// Signalled when a shared session is added or an opening attempt ends.
    pool_changed: Notify,
    /// Dedicated sessions holding nothing, ready for the next wait.
    idle_waits: Mutex<Vec<Arc<SessionHandle>>>,
    /// One permit per dedicated session in use (waiting, or holding what it waited for).
    wait_slots: Arc<Semaphore>,
    /// Open sessions of each kind, counted by the session tasks.
    pub(crate) open_shared: AtomicUsize,
    pub(crate) open_waits: AtomicUsize,
}

#[derive(Default)]
struct Registry {
    /// Owner token of every held lease → the session holding it.
    routes: HashMap<u128, Arc<SessionHandle>>,
    /// Key hash → owner, for every key granted or being granted on a shared session
    /// of this client: a second grant of the same key would be re-entrant.
    shared_keys: HashMap<i64, u128>,
}

#[derive(Default)]
struct Pool {
    sessions: Vec<Arc<SessionHandle>>,
    /// Shared sessions being opened.
    opening: usize,
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section is a few map operations that cannot panic half-way.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    pub(crate) fn forget_shared_key(&self, hash: i64, owner: u128) {
        let mut registry = locked(&self.registry);
        if registry.shared_keys.get(&hash) == Some(&owner) {
            registry.shared_keys.remove(&hash);
        }
    }

    pub(crate) fn add_route(&self, owner: u128, session: Arc<SessionHandle>) {
        locked(&self.registry).routes.insert(owner, session);
    }

    pub(crate) fn remove_route(&self, owner: u128, hash: i64) {
        let mut registry = locked(&self.registry);
        registry.routes.remove(&owner);
        if registry.shared_keys.get(&hash) == Some(&owner) {
            registry.shared_keys.remove(&hash);
        }
    }

    fn route(&self, owner: u128) -> Option<Arc<SessionHandle>> {
        locked(&self.registry).routes.get(&owner).cloned()
    }

    pub(crate) fn return_wait_session(&self, session: Arc<SessionHandle>) {
        let mut idle = locked(&self.idle_waits);
        if session.is_alive() && !idle.iter().any(|s| Arc::ptr_eq(s, &session)) {
            idle.push(session);
        }
    }

    pub(crate) fn drop_session(&self, session: &Arc<SessionHandle>) {
        locked(&self.idle_waits).retain(|s| !Arc::ptr_eq(s, session));
        locked(&self.pool)
            .sessions
            .retain(|s| !Arc::ptr_eq(s, session));
        self.pool_changed.notify_waiters();
    }

    /// Reserves the key for a grant on a shared session; `false` if this client holds
    /// it, or is taking it, already.
    fn reserve_shared_key(&self, hash: i64, owner: u128) -> bool {
        let mut registry = locked(&self.registry);
        if registry.shared_keys.contains_key(&hash) {
            return false;
        }
        registry.shared_keys.insert(hash, owner);
        true
    }
}

/// Counts a shared session being opened, until dropped.
struct Opening(Arc<Shared>);

impl Drop for Opening {
    fn drop(&mut self) {
        let mut pool = locked(&self.0.pool);
        pool.opening = pool.opening.saturating_sub(1);
        drop(pool);
        self.0.pool_changed.notify_waiters();
    }
}

/// Undoes a grant in flight if the acquire future is dropped before it hands out a
/// guard: the release is queued behind the grant on the same session, so it runs after
/// it, whatever the grant's outcome.
struct Pending<'a> {
    shared: &'a Shared,
    hash: i64,
    owner: u128,
    /// Whether a shared key was reserved for this grant.
    reserved: bool,
    session: Option<Arc<SessionHandle>>,
    armed: bool,
}

impl Pending<'_> {
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let queued = self.session.as_ref().is_some_and(|s| {
            s.send(Command::Release {
                owner: self.owner,
                reply: None,
            })
            .is_ok()
        });
        if !queued && self.reserved {
            // Never sent, or the session is gone (and its locks with it).
            self.shared.forget_shared_key(self.hash, self.owner);
        }
    }
}

impl fmt::Debug for PostgresLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (shared, waits) = self.session_counts();
        f.debug_struct("PostgresLock")
            .field("shared_sessions", &shared)
            .field("wait_sessions", &waits)
            .finish_non_exhaustive()
    }
}

impl PostgresLock {
    /// Connects to the server named by a `postgres://` or `postgresql://` URL (the forms
    /// sqlx accepts: `postgres://user:password@host:port/database?options`), with the
    /// default [`PostgresConfig`].
    ///
    /// Opens one session at once, and creates the fencing sequence (schema `distlock`)
    /// if it is missing; more sessions are opened on demand.
    ///
    /// # Errors
    /// [`LockError::Config`] for another scheme, a URL sqlx cannot parse, refused
    /// credentials, a missing database, a server older than PostgreSQL 14, or a missing
    /// fencing sequence this user may not create; [`LockError::Connection`] when the
    /// server cannot be reached within the request timeout.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        PostgresLock::connect_with(url, PostgresConfig::default()).await
    }

    /// Connects with `config`.
    ///
    /// # Errors
    /// As [`PostgresLock::connect`], and [`LockError::Config`] when `config` fails
    /// [`PostgresConfig::validate`].
    pub async fn connect_with(url: &str, config: PostgresConfig) -> Result<Self, LockError> {
        config.validate()?;
        let connect = connect_options(url, &config)?;
        let sql = Statements::new(&config.schema);
        let mut conn = session::connect(&connect, config.request_timeout).await?;
        if let Err(e) = ensure_schema(&mut conn, &config.schema, &sql).await {
            let _ = conn.close().await;
            return Err(e);
        }
        let shared = Arc::new(Shared {
            wait_slots: Arc::new(Semaphore::new(config.wait_sessions)),
            settings: Arc::new(Settings {
                config,
                connect,
                sql,
            }),
            registry: Mutex::default(),
            pool: Mutex::default(),
            pool_changed: Notify::new(),
            idle_waits: Mutex::default(),
            open_shared: AtomicUsize::new(0),
            open_waits: AtomicUsize::new(0),
        });
        let first = session::start(Kind::Shared, conn, &shared);
        locked(&shared.pool).sessions.push(first);
        Ok(PostgresLock { shared })
    }

    /// The settings in force.
    pub fn config(&self) -> &PostgresConfig {
        &self.shared.settings.config
    }

    /// The sessions open now: `(shared, dedicated to waits)`. Each is one connection.
    pub fn session_counts(&self) -> (usize, usize) {
        (
            self.shared.open_shared.load(Ordering::Relaxed),
            self.shared.open_waits.load(Ordering::Relaxed),
        )
    }

    /// The least busy shared session, opening one if all are busy and there is room.
    async fn shared_session(&self) -> Result<Arc<SessionHandle>, LockError> {
        let shared = &self.shared;
        let max = shared.settings.config.shared_sessions;
        enum Next {
            Use(Arc<SessionHandle>),
            OpenAside(Arc<SessionHandle>),
            Open,
            Wait,
        }
        // Armed only once there is something to wait for, so the common path takes
        // no lock on the notifier.
        let mut changed = None;
        loop {
            let next = {
                let mut pool = locked(&shared.pool);
                pool.sessions.retain(|s| s.is_alive());
                // Use as many sessions as the load needs, about one per
                // QUEUE_PER_SESSION requests in flight: what is queued on a session
                // goes in one statement, so a little queueing saves server work, and a
                // few sessions let the server work on one batch while the client
                // prepares the next.
                let load: usize = pool.sessions.iter().map(|s| s.load()).sum();
                let needed = (load / QUEUE_PER_SESSION + 1).min(max);
                let best = pool
                    .sessions
                    .iter()
                    .take(needed)
                    .min_by_key(|s| s.load())
                    .cloned();
                let room = pool.sessions.len() + pool.opening < needed;
                match best {
                    Some(s) if room && s.load() > 0 => {
                        pool.opening += 1;
                        Next::OpenAside(s)
                    }
                    Some(s) => Next::Use(s),
                    None if pool.opening == 0 => {
                        pool.opening += 1;
                        Next::Open
                    }
                    None => Next::Wait,
                }
            };
            match next {
                Next::Use(session) => return Ok(session),
                // Every slot is being opened: wait for one to finish (registering
                // first, then looking again, so no notification is missed).
                Next::Wait => match changed.take() {
                    None => {
                        let mut armed = Box::pin(shared.pool_changed.notified());
                        armed.as_mut().enable();
                        changed = Some(armed);
                    }
                    Some(armed) => armed.await,
                },
                Next::Open => {
                    let _opening = Opening(shared.clone());
                    let session = session::open(Kind::Shared, shared).await?;
                    locked(&shared.pool).sessions.push(session.clone());
                    return Ok(session);
                }
                Next::OpenAside(session) => {
                    // Busy sessions: open one more in the background, and meanwhile
                    // join the least busy one's next batch.
                    let shared = shared.clone();
                    tokio::spawn(async move {
                        let _opening = Opening(shared.clone());
                        match session::open(Kind::Shared, &shared).await {
                            Ok(opened) => locked(&shared.pool).sessions.push(opened),
                            Err(error) => {
                                tracing::debug!(%error, "could not open another shared session")
                            }
                        }
                    });
                    return Ok(session);
                }
            }
        }
    }

    /// An idle dedicated session, or a new one. The caller holds a wait slot.
    async fn wait_session(&self) -> Result<Arc<SessionHandle>, LockError> {
        loop {
            let idle = locked(&self.shared.idle_waits).pop();
            match idle {
                Some(s) if s.is_alive() => return Ok(s),
                Some(_) => continue,
                None => return session::open(Kind::Wait, &self.shared).await,
            }
        }
    }

    fn guard(
        &self,
        key: &LockKey,
        owner: OwnerToken,
        granted: Granted,
        options: &LockOptions,
    ) -> LockGuard {
        // The sequence starts at 1 (MINVALUE 1), so the token is positive.
        let token = FencingToken::new(granted.token.unsigned_abs());
        let lease = Lease::new(
            key.clone(),
            owner,
            Some(token),
            options.ttl(),
            granted.acquired_at,
        );
        LockGuard::new(
            lease,
            granted.monitor,
            Arc::new(self.clone()),
            options.auto_renew(),
        )
    }

    /// One try on a shared session: the guard, or `None` when the key is held
    /// (including by this client).
    async fn try_shared(
        &self,
        key: &LockKey,
        hash: i64,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        let mut retried_broken = false;
        for _ in 0..SESSION_ATTEMPTS {
            let owner = OwnerToken::random();
            let owner_bits = owner.as_u128();
            if !self.shared.reserve_shared_key(hash, owner_bits) {
                return Ok(None);
            }
            let mut pending = Pending {
                shared: &self.shared,
                hash,
                owner: owner_bits,
                reserved: true,
                session: None,
                armed: true,
            };
            let session = self.shared_session().await?;
            let (tx, rx) = oneshot::channel();
            let command = Command::TryGrant {
                hash,
                owner: owner_bits,
                ttl: options.ttl(),
                requested_at: Instant::now(),
                reply: tx,
            };
            if session.send(command).is_err() {
                continue;
            }
            pending.session = Some(session);
            let reply = rx.await;
            pending.disarm();
            match reply {
                Ok(Ok(Some(granted))) => return Ok(Some(self.guard(key, owner, granted, options))),
                Ok(Ok(None)) => return Ok(None),
                Ok(Err(Failure::Closed)) => continue,
                Err(_) => {
                    self.shared.forget_shared_key(hash, owner_bits);
                    continue;
                }
                // The session broke under the command, and its locks ended with it:
                // one more try on a fresh session hides a stale one (a server restart).
                Ok(Err(Failure::Lock(e @ LockError::Connection { .. }))) if !retried_broken => {
                    tracing::debug!(error = %e, "shared session broke; retrying on another");
                    retried_broken = true;
                    continue;
                }
                Ok(Err(Failure::Lock(e))) => return Err(e),
            }
        }
        Err(self
            .shared
            .settings
            .connection_error("no usable session: every one tried closed or broke"))
    }

    /// One wait in the server's queue on a dedicated session, until `deadline`: the
    /// guard, or `None` when the wait ran out.
    async fn wait_dedicated(
        &self,
        key: &LockKey,
        hash: i64,
        options: &LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Option<LockGuard>, LockError> {
        for _ in 0..SESSION_ATTEMPTS {
            let slots = self.shared.wait_slots.clone();
            let slot = match deadline {
                Some(d) => match timeout_at(d, slots.acquire_owned()).await {
                    Ok(slot) => slot,
                    Err(_) => return Ok(None),
                },
                None => slots.acquire_owned().await,
            }
            .map_err(|_| error::connection("the client is shutting down"))?;
            let session = self.wait_session().await?;
            let lock_timeout_ms = match deadline {
                None => 0,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(None);
                    }
                    // Round up, so the server gives up no earlier than the deadline.
                    let ms = left.as_micros().div_ceil(1000);
                    u64::try_from(ms).unwrap_or(u64::MAX).min(i32::MAX as u64)
                }
            };
            let owner = OwnerToken::random();
            let (tx, rx) = oneshot::channel();
            let command = Command::Wait {
                hash,
                owner: owner.as_u128(),
                ttl: options.ttl(),
                lock_timeout_ms,
                slot,
                reply: tx,
            };
            if session.send(command).is_err() {
                continue;
            }
            let mut pending = Pending {
                shared: &self.shared,
                hash,
                owner: owner.as_u128(),
                reserved: false,
                session: Some(session),
                armed: true,
            };
            let reply = rx.await;
            pending.disarm();
            match reply {
                Ok(Ok(Some(granted))) => return Ok(Some(self.guard(key, owner, granted, options))),
                Ok(Ok(None)) => return Ok(None),
                Ok(Err(Failure::Closed)) | Err(_) => continue,
                Ok(Err(Failure::Lock(e))) => return Err(e),
            }
        }
        Err(self
            .shared
            .settings
            .connection_error("no usable session to wait on: every one tried closed"))
    }

    /// The body of `acquire`, unbounded by the wait when the server
    /// does not answer; notes in `seen_held` each answer saying the key is held.
    async fn acquire_until(
        &self,
        key: &LockKey,
        options: &LockOptions,
        started: Instant,
        deadline: Option<Instant>,
        seen_held: &AtomicBool,
    ) -> Result<LockGuard, LockError> {
        let hash = advisory_key(key);
        let timed_out = || LockError::Timeout {
            backend: POSTGRES_BACKEND,
            key: key.clone(),
            waited: started.elapsed(),
        };
        let mut backoff = options.backoff().delays();
        let mut failing_since: Option<Instant> = None;
        loop {
            let attempt = match self.try_shared(key, hash, options).await {
                Ok(None) => {
                    seen_held.store(true, Ordering::Relaxed);
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(timed_out());
                    }
                    self.wait_dedicated(key, hash, options, deadline).await
                }
                other => other,
            };
            match attempt {
                Ok(Some(guard)) => return Ok(guard),
                Ok(None) => {
                    seen_held.store(true, Ordering::Relaxed);
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(timed_out());
                    }
                    // The server's wait was capped below our deadline: wait again.
                    failing_since = None;
                }
                // The server is down or restarting: retry while the wait allows.
                Err(error @ LockError::Connection { .. }) if deadline != Some(started) => {
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    let out_of_time =
                        deadline.map_or(since.elapsed() >= ERROR_PATIENCE, |d| Instant::now() >= d);
                    if out_of_time {
                        return Err(error);
                    }
                    let mut nap = backoff.next_delay();
                    if let Some(d) = deadline {
                        nap = nap.min(d.saturating_duration_since(Instant::now()));
                    }
                    tracing::debug!(%error, ?nap, "acquire failed on a connection error; retrying");
                    tokio::time::sleep(nap).await;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// Whether any session of the database holds `hash` (per `pg_locks`).
    async fn held_by_anyone(&self, hash: i64) -> Result<bool, LockError> {
        for _ in 0..SESSION_ATTEMPTS {
            let session = self.shared_session().await?;
            let (tx, rx) = oneshot::channel();
            if session
                .send(Command::HeldByAnyone { hash, reply: tx })
                .is_err()
            {
                continue;
            }
            match rx.await {
                Ok(Ok(held)) => return Ok(held),
                Ok(Err(Failure::Closed)) | Err(_) => continue,
                Ok(Err(Failure::Lock(e))) => return Err(e),
            }
        }
        Err(self
            .shared
            .settings
            .connection_error("no usable session: every one tried closed"))
    }

    /// Sends `command` to the session holding `owner`'s lease; `None` if no session of
    /// this client holds it (any more).
    async fn to_holder<T>(
        &self,
        owner: u128,
        command: impl FnOnce(session::Reply<T>) -> Command,
    ) -> Result<Option<T>, LockError> {
        let Some(session) = self.shared.route(owner) else {
            return Ok(None);
        };
        let (tx, rx) = oneshot::channel();
        if session.send(command(tx)).is_err() {
            return Ok(None);
        }
        match rx.await {
            Ok(Ok(value)) => Ok(Some(value)),
            // The session ended before running it, and its locks with it.
            Ok(Err(Failure::Closed)) | Err(_) => Ok(None),
            Ok(Err(Failure::Lock(e))) => Err(e),
        }
    }
}

#[async_trait]
impl DistributedLock for PostgresLock {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            name: POSTGRES_BACKEND,
            capabilities: Capabilities::all_supported(),
        }
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        options.validate_for(POSTGRES_BACKEND)?;
        self.try_shared(key, advisory_key(key), options).await
    }

    /// A wait bounds the whole call, whatever the server does: once the deadline (plus
    /// a grace of 50 ms for an answer on its way) passes, the request in flight is dropped, and its drop guards
    /// undo a grant the server applies later (a shared session's grant is released
    /// behind it; a dedicated session is closed, which ends its wait or lock). `NoWait`
    /// and `Forever` are bounded by the request timeout and the error patience instead.
    async fn acquire(&self, key: &LockKey, options: &LockOptions) -> Result<LockGuard, LockError> {
        options.validate_for(POSTGRES_BACKEND)?;
        let started = Instant::now();
        let deadline = options.wait().deadline_from(started);
        let seen_held = AtomicBool::new(false);
        let attempt = self.acquire_until(key, options, started, deadline, &seen_held);
        let Some((wait, cut)) = deadline
            .filter(|d| *d > started)
            .and_then(|d| Some((d - started, d.checked_add(ANSWER_GRACE)?)))
        else {
            return attempt.await;
        };
        match timeout_at(cut, attempt).await {
            Ok(result) => result,
            // An answer of this call said the key is held: that is what the wait saw.
            Err(_) if seen_held.load(Ordering::Relaxed) => Err(LockError::Timeout {
                backend: POSTGRES_BACKEND,
                key: key.clone(),
                waited: started.elapsed(),
            }),
            Err(_) => Err(self.shared.settings.connection_error(format!(
                "the server did not answer within the wait of {:?}; whether the lock was \
                 granted is unknown (a late grant is released)",
                wait
            ))),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        let owner = lease.owner().as_u128();
        let released = self
            .to_holder(owner, |reply| Command::Release {
                owner,
                reply: Some(reply),
            })
            .await?;
        if released == Some(true) {
            return Ok(ReleaseOutcome::Released);
        }
        Ok(if self.held_by_anyone(advisory_key(lease.key())).await? {
            ReleaseOutcome::HeldByOther
        } else {
            ReleaseOutcome::Expired
        })
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        check_ttl(ttl).map_err(|e| LockError::invalid_options(POSTGRES_BACKEND, e))?;
        let owner = lease.owner().as_u128();
        let extended = self
            .to_holder(owner, |reply| Command::Extend { owner, ttl, reply })
            .await?;
        if let Some(Some(valid_until)) = extended {
            return Ok(ExtendOutcome::Extended { valid_until });
        }
        Ok(if self.held_by_anyone(advisory_key(lease.key())).await? {
            ExtendOutcome::HeldByOther
        } else {
            ExtendOutcome::Expired
        })
    }

    /// Held or free, per `pg_locks`. The holder's token lives only in its client and the
    /// lease is the holder's session, so neither token nor remaining time is reported.
    async fn inspect(&self, key: &LockKey) -> Result<KeyStatus, LockError> {
        Ok(if self.held_by_anyone(advisory_key(key)).await? {
            KeyStatus::held()
        } else {
            KeyStatus::free()
        })
    }
}
