//! [`PostgresLock`]: a client of Postgres session advisory locks, its shared and
//! dedicated sessions, and the tries and waits every primitive's grant is made of.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_api::backend::sessions::{
    self, ask, compensate, dedicated_session, extend, release, shared_session, SessionPool,
    SessionSource, SESSION_ATTEMPTS,
};
use distlock_api::backend::Request;
use distlock_api::{
    ExtendOutcome, Lease, LockError, LockKey, LockOptions, OwnerToken, PermitMismatch,
    ReleaseOutcome,
};
use sqlx::Connection as _;
use tokio::sync::{oneshot, OnceCell};
use tokio::time::Instant;

use crate::client::{ClientState, Settings};
use crate::config::{
    parse_url, session_options, session_set_statements, PoolMode, PostgresConfig, POOL_MODE_PARAM,
};
use crate::mailbox::{Command, Failure, Grab, Granted, Kind, Probe, Seat, SessionHandle};
use crate::pooler;
use crate::session;
use crate::sql::{ensure_schema, Statements};
use crate::POSTGRES_BACKEND;

/// Requests in flight per shared session: what is queued on a session goes in one
/// statement, so a little queueing saves server work, and a few sessions let the
/// server work on one batch while the client prepares the next.
const QUEUE_PER_SESSION: usize = 8;

/// A Postgres lock client: session-level advisory locks, multiplexed over a few
/// sessions, for every primitive. It is the backend's
/// [`Engine`](distlock_api::backend::Engine); use it through [`PostgresLock::client`]
/// or the handles [`PostgresLock::lock`], [`PostgresLock::semaphore`],
/// [`PostgresLock::rw_lock`] and [`PostgresLock::election`]. See the crate docs for
/// the protocol and its guarantees.
///
/// Cloning is cheap and shares the sessions. Two separate `connect`s are two clients:
/// they exclude each other on the server like two processes would. Within one client a
/// key is never granted twice at once (advisory locks are re-entrant per session, so the
/// client tracks the keys its shared sessions hold).
#[derive(Clone)]
pub struct PostgresLock {
    state: Arc<ClientState>,
}

/// Undoes a grant in flight if the acquire future is dropped before it hands out a
/// guard: the release is queued behind the grant on the same session, so it runs after
/// it, whatever the grant's outcome.
struct Pending<'a> {
    state: &'a ClientState,
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
        let queued = self
            .session
            .as_ref()
            .is_some_and(|s| compensate(s, self.owner));
        if !queued && self.reserved {
            // Never sent, or the session is gone (and its locks with it).
            self.state.forget_shared_key(self.hash, self.owner);
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
    /// sqlx accepts: `postgres://user:password@host:port/database?options`; see
    /// [`crate::parse_url`]), with the default [`PostgresConfig`].
    ///
    /// Opens one session at once, and creates the fencing sequence (schema `distlock`)
    /// if it is missing; more sessions are opened on demand.
    ///
    /// # Errors
    /// [`LockError::Config`] for another scheme, a URL sqlx cannot parse, refused
    /// credentials, a missing database, a server older than PostgreSQL 14, a missing
    /// fencing sequence this user may not create, a URL with `pool_mode=transaction`
    /// (that design is [`crate::PostgresXactLock`]), or a transaction pooler in front
    /// of the server (PgBouncer with `pool_mode = transaction`: the error names the URL
    /// form that works there; see the crate docs, "Poolers"); [`LockError::Connection`] when the
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
        let parsed = parse_url(url)?;
        if parsed.pool_mode() == PoolMode::Transaction {
            return Err(LockError::config(
                POSTGRES_BACKEND,
                format!(
                    "{POOL_MODE_PARAM}=transaction selects the transaction-pooling design: \
                     connect with distlock::connect, distlock_postgres::connect or \
                     PostgresXactLock::connect"
                ),
            ));
        }
        let connect = session_options(&parsed, &config);
        let sql = Statements::new(&config.schema);
        let mut conn = session::connect_retrying(&connect, config.request_timeout).await?;
        // Before any lock: a transaction pooler would strand them (see `pooler`).
        let checked =
            pooler::refuse_transaction_pooler(&mut conn, &connect, config.request_timeout).await;
        let restate = match checked {
            Ok(true) => Some(session_set_statements(&config)),
            Ok(false) => None,
            Err(e) => {
                let _ = conn.close().await;
                return Err(e);
            }
        };
        if let Some(sql) = &restate {
            if let Err(e) = session::restate(&mut conn, sql, config.request_timeout).await {
                let _ = conn.close().await;
                return Err(e);
            }
        }
        if let Err(e) = ensure_schema(&mut conn, &config.schema, &sql).await {
            let _ = conn.close().await;
            return Err(e);
        }
        let sessions = SessionPool::new(
            config.shared_sessions,
            config.wait_sessions,
            QUEUE_PER_SESSION,
        );
        let state = Arc::new(ClientState {
            settings: Arc::new(Settings {
                config,
                connect,
                sql,
                restate,
            }),
            shared_keys: Mutex::default(),
            sessions: Arc::new(sessions),
            election_table: OnceCell::new(),
        });
        let first = session::start(Kind::Shared, conn, &state);
        state.sessions.add_shared(first);
        Ok(PostgresLock { state })
    }

    /// The settings in force.
    pub fn config(&self) -> &PostgresConfig {
        &self.state.settings.config
    }

    /// The sessions open now: `(shared, dedicated to waits)`. Each is one connection.
    pub fn session_counts(&self) -> (usize, usize) {
        self.state.sessions.counts()
    }

    /// One try on a shared session: the grant, or `None` when the key is held
    /// (including by this client).
    async fn try_shared(
        &self,
        hash: i64,
        options: &LockOptions,
        seat: Option<&Arc<Seat>>,
    ) -> Result<Option<Grant>, LockError> {
        let mut retried_broken = false;
        for _ in 0..SESSION_ATTEMPTS {
            let owner = OwnerToken::random();
            let owner_bits = owner.as_u128();
            if !self.state.reserve_shared_key(hash, owner_bits) {
                return Ok(None);
            }
            let mut pending = Pending {
                state: &self.state,
                hash,
                owner: owner_bits,
                reserved: true,
                session: None,
                armed: true,
            };
            let session = shared_session(&self.state).await?;
            let (tx, rx) = oneshot::channel();
            let command = Command::TryGrant {
                hash,
                owner: owner_bits,
                ttl: options.ttl(),
                requested_at: Instant::now(),
                seat: seat.cloned(),
                reply: tx,
            };
            // Armed before the command runs: run inline, it finishes even if this
            // future is dropped, and the compensation is queued behind it.
            pending.session = Some(session.clone());
            if session.run(command).await.is_err() {
                pending.session = None;
                continue;
            }
            let reply = rx.await;
            pending.disarm();
            match reply {
                Ok(Ok(Some(granted))) => return Ok(Some((owner, granted))),
                Ok(Ok(None)) => return Ok(None),
                Ok(Err(Failure::Closed)) => continue,
                Err(_) => {
                    self.state.forget_shared_key(hash, owner_bits);
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
                Ok(Err(Failure::Mismatch(_))) => {
                    return Err(LockError::backend_error(
                        POSTGRES_BACKEND,
                        "a permit count answer to a lock try",
                    ))
                }
            }
        }
        Err(self
            .state
            .settings
            .connection_error("no usable session: every one tried closed or broke"))
    }

    /// One `grab` on a dedicated session (a wait in the server's queue until
    /// `deadline`, or a try): the grant, or `None` when the key was held (the wait ran
    /// out, or no dedicated session came free before `deadline`).
    async fn wait_dedicated(
        &self,
        key: &LockKey,
        hash: i64,
        grab: &Grab,
        options: &LockOptions,
        deadline: Option<Instant>,
        seat: Option<&Arc<Seat>>,
    ) -> Result<Option<Grant>, LockError> {
        for _ in 0..SESSION_ATTEMPTS {
            // Opening a session may queue at a pooler for a server connection: that
            // counts against the wait too, and the error says so.
            let Some((slot, session)) = dedicated_session(&self.state, deadline, key).await? else {
                return Ok(None);
            };
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
                grab: grab.clone(),
                owner: owner.as_u128(),
                ttl: options.ttl(),
                lock_timeout_ms,
                slot,
                seat: seat.cloned(),
                reply: tx,
            };
            let mut pending = Pending {
                state: &self.state,
                hash,
                owner: owner.as_u128(),
                reserved: false,
                session: Some(session.clone()),
                armed: true,
            };
            if session.run(command).await.is_err() {
                pending.disarm();
                continue;
            }
            let reply = rx.await;
            pending.disarm();
            match reply {
                Ok(Ok(Some(granted))) => return Ok(Some((owner, granted))),
                Ok(Ok(None)) => return Ok(None),
                Ok(Err(Failure::Closed)) | Err(_) => continue,
                Ok(Err(Failure::Lock(e))) => return Err(e),
                Ok(Err(Failure::Mismatch(in_use))) => {
                    let asked = match grab {
                        Grab::PermitTry { max, .. } => *max,
                        _ => 0,
                    };
                    return Err(LockError::PermitMismatch {
                        backend: POSTGRES_BACKEND,
                        source: PermitMismatch::new(key.clone(), asked, in_use),
                    });
                }
            }
        }
        Err(self
            .state
            .settings
            .connection_error("no usable session to wait on: every one tried closed"))
    }

    /// One try of `plan` on `hash`, without waiting: the grant, or `None` when held.
    pub(crate) async fn try_plan(
        &self,
        key: &LockKey,
        hash: i64,
        plan: &Plan,
        options: &LockOptions,
    ) -> Result<Option<Grant>, LockError> {
        let grab = match plan {
            Plan::Exclusive => return self.try_shared(hash, options, None).await,
            Plan::Lead(seat) => return self.try_shared(hash, options, Some(seat)).await,
            Plan::Shared => Grab::SharedTry,
            Plan::Permit(grab) => grab.clone(),
        };
        // A try does not wait in the server; it waits for a dedicated session only
        // as long as a request may take.
        let patience = Instant::now() + self.state.settings.config.request_timeout;
        self.wait_dedicated(key, hash, &grab, options, Some(patience), None)
            .await
    }

    /// After a try of `plan` found the key held: waits until it may be free (a wait
    /// in the server's queue, or, for a permit, a nap of `nap`), within `deadline`.
    async fn wait_plan(
        &self,
        key: &LockKey,
        hash: i64,
        plan: &Plan,
        options: &LockOptions,
        deadline: Option<Instant>,
        nap: Duration,
    ) -> Result<Option<Grant>, LockError> {
        let grab = match plan {
            Plan::Exclusive | Plan::Lead(_) => Grab::Exclusive,
            Plan::Shared => Grab::SharedWait,
            Plan::Permit(_) => {
                tokio::time::sleep(nap).await;
                return Ok(None);
            }
        };
        let seat = match plan {
            Plan::Lead(seat) => Some(seat),
            _ => None,
        };
        self.wait_dedicated(key, hash, &grab, options, deadline, seat)
            .await
    }

    /// `plan` on `hash` for `request`: a try, then, while the key is held and the
    /// deadline allows, a wait (in the server's queue, or a nap of the options'
    /// backoff for a permit) and another try. `None` once the key is still held at the
    /// deadline, at once for a try; each held answer is noted in the request. Errors
    /// are returned as they come: the caller retries them.
    pub(crate) async fn contend(
        &self,
        request: &Request<'_>,
        hash: i64,
        plan: &Plan,
    ) -> Result<Option<Grant>, LockError> {
        let (key, options, deadline) = (request.key, request.options, request.deadline);
        sessions::contend(
            request,
            || self.try_plan(key, hash, plan, options),
            |nap| self.wait_plan(key, hash, plan, options, deadline, nap),
        )
        .await
    }

    /// Owner-checked release of `lease`, of any primitive: `probe` finds the key's
    /// other holders for the outcome when the lease is not held here any more.
    pub(crate) async fn release_lease(
        &self,
        lease: &Lease,
        probe: Probe,
    ) -> Result<ReleaseOutcome, LockError> {
        if release(&*self.state, lease.owner().as_u128()).await? {
            return Ok(ReleaseOutcome::Released);
        }
        Ok(if self.held_by_anyone(probe).await? {
            ReleaseOutcome::HeldByOther
        } else {
            ReleaseOutcome::Expired
        })
    }

    /// Owner-checked extension of `lease`, of any primitive; `probe` as for
    /// [`PostgresLock::release_lease`].
    pub(crate) async fn extend_lease(
        &self,
        lease: &Lease,
        ttl: Duration,
        probe: Probe,
    ) -> Result<ExtendOutcome, LockError> {
        if let Some(valid_until) = extend(&*self.state, lease.owner().as_u128(), ttl).await? {
            return Ok(ExtendOutcome::Extended { valid_until });
        }
        Ok(if self.held_by_anyone(probe).await? {
            ExtendOutcome::HeldByOther
        } else {
            ExtendOutcome::Expired
        })
    }

    /// Whether any session of the database holds a lock matching `probe` (per `pg_locks`).
    pub(crate) async fn held_by_anyone(&self, probe: Probe) -> Result<bool, LockError> {
        ask(&self.state, |reply| Command::HeldByAnyone { probe, reply }).await
    }

    /// The leader row `(candidate, term)` of the election `name` (advisory key `hash`),
    /// if the session that wrote it holds the election's lock (per `pg_locks`).
    pub(crate) async fn leader_row(
        &self,
        name: &LockKey,
        hash: i64,
    ) -> Result<Option<(Vec<u8>, i64)>, LockError> {
        ask(&self.state, |reply| Command::Leader {
            name: name.as_str().to_owned(),
            hash,
            reply,
        })
        .await
    }

    /// The settings every session of this client runs with.
    pub(crate) fn settings(&self) -> &Settings {
        &self.state.settings
    }

    /// Set once this client knows the election table exists.
    pub(crate) fn election_table(&self) -> &OnceCell<()> {
        &self.state.election_table
    }
}

impl SessionSource for ClientState {
    type Command = Command;
    const BACKEND: &'static str = POSTGRES_BACKEND;
    const NO_SESSION_FREE: &'static str = "the server, or a pooler's session pool, had no \
        connection free (budget one per waiter and per lock taken after a wait, beside the \
        shared ones)";

    fn sessions(&self) -> &Arc<SessionPool<Command>> {
        &self.sessions
    }

    async fn open(self: Arc<Self>, kind: Kind) -> Result<Arc<SessionHandle>, LockError> {
        session::open(kind, &self).await
    }

    fn connection_error(&self, why: &str) -> LockError {
        self.settings.connection_error(why)
    }
}

/// A grant as a session made it: the owner token it is held under, and the lease.
pub(crate) type Grant = (OwnerToken, Granted);

/// How an acquire takes its advisory lock.
#[derive(Debug, Clone)]
pub(crate) enum Plan {
    /// A mutex or a writer: `pg_try_advisory_lock` on a shared session, then a wait in
    /// the server's queue on a dedicated one.
    Exclusive,
    /// A reader: `pg_try_advisory_lock_shared`, then a shared wait in the server's
    /// queue, both on a dedicated session.
    Shared,
    /// A semaphore permit: this permit try on a dedicated session, polled at the
    /// options' backoff.
    Permit(Grab),
    /// An election's leadership: taken as [`Plan::Exclusive`], and recorded as the
    /// leader by the granting session before it is handed out.
    Lead(Arc<Seat>),
}
