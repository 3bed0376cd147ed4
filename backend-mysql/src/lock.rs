//! [`MySqlLock`]: a client of MySQL/MariaDB user locks (`GET_LOCK`), its shared and
//! dedicated sessions, and the tries and waits every primitive's grant is made of.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use distlock_api::backend::sessions::{
    self, ask, compensate, dedicated_session, extend, release, shared_session, SessionPool,
    SessionSource, SESSION_ATTEMPTS,
};
use distlock_api::backend::Request;
use distlock_api::{Lease, LockError, LockKey, LockOptions, OwnerToken, PermitMismatch};
use sqlx::Connection as _;
use tokio::sync::{oneshot, OwnedSemaphorePermit};
use tokio::time::{timeout, Instant};

use crate::client::{ClientState, Settings};
use crate::config::{parse_url, MySqlConfig};
use crate::mailbox::{Command, Failure, Grab, Granted, Kind, Reply, Seat, SessionHandle};
use crate::session;
use crate::sql::ensure_tables;
use crate::MYSQL_BACKEND;

/// Requests in flight per shared session: a session runs one statement at a time and
/// nothing queued on it is batched, so each request in flight gets a session of its
/// own, up to `shared_sessions`.
const QUEUE_PER_SESSION: usize = 1;

/// A MySQL/MariaDB lock client: `GET_LOCK` user locks, multiplexed over a few
/// sessions, for the mutex, the semaphore and leader election. It is the backend's
/// [`Engine`](distlock_api::backend::Engine); use it through [`MySqlLock::client`] or
/// the handles [`MySqlLock::lock`], [`MySqlLock::semaphore`] and
/// [`MySqlLock::election`]. See the crate docs for the protocol and its guarantees.
///
/// Cloning is cheap and shares the sessions. Two separate `connect`s are two clients:
/// they exclude each other on the server like two processes would. Within one client a
/// name is never granted twice at once: a session never asks `GET_LOCK` for a name in
/// use (a second `GET_LOCK` on the session holding it would succeed).
#[derive(Clone)]
pub struct MySqlLock {
    state: Arc<ClientState>,
}

/// Undoes a grant in flight if the acquire future is dropped before it hands out a
/// guard: the release is queued behind the grant on the same session (queued, or run
/// inline and finishing in the background), so it runs after it, whatever the grant's
/// outcome.
struct Pending {
    owner: u128,
    session: Arc<SessionHandle>,
    armed: bool,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.armed {
            compensate(&self.session, self.owner);
        }
    }
}

impl fmt::Debug for MySqlLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (shared, waits) = self.session_counts();
        f.debug_struct("MySqlLock")
            .field("server", &self.state.settings.address)
            .field("shared_sessions", &shared)
            .field("wait_sessions", &waits)
            .finish_non_exhaustive()
    }
}

/// How an acquire takes its lock.
#[derive(Debug, Clone)]
pub(crate) enum Plan {
    /// A mutex: a try on a shared session, then a wait in `GET_LOCK` on a dedicated one.
    Exclusive,
    /// A semaphore permit of `max`: a permit try on a dedicated session, polled at the
    /// options' backoff.
    Permit { max: u32 },
    /// An election's leadership: taken as [`Plan::Exclusive`], and recorded as the
    /// leader by the granting session before it is handed out.
    Lead(Arc<Seat>),
}

/// What a grant asks its session for (see [`MySqlLock::grant_on`]).
struct Ask<'a> {
    name: &'a Arc<str>,
    grab: Grab,
    options: &'a LockOptions,
    /// A dedicated session's wait slot, kept with the grant.
    slot: Option<OwnedSemaphorePermit>,
    seat: Option<&'a Arc<Seat>>,
}

/// A grant as a session made it: the owner token it is held under, and the lease.
pub(crate) type Grant = (OwnerToken, Granted);

impl MySqlLock {
    /// Connects to the server named by a `mysql://` or `mariadb://` URL
    /// (`mysql://user:password@host:port/database?params`; see [`crate::parse_url`]),
    /// with the default [`MySqlConfig`].
    ///
    /// Opens one session at once, and creates distlock's tables in the URL's database if
    /// they are missing (see [`crate::CREATE_TABLES`]); more sessions are opened on
    /// demand.
    ///
    /// # Errors
    /// [`LockError::Config`] for another scheme, a URL that cannot be parsed, refused
    /// credentials, an unknown database, a TLS refusal, or missing tables this user may
    /// not create (the message names the rights needed); [`LockError::Connection`] when
    /// the server cannot be reached within the request timeout.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        MySqlLock::connect_with(url, MySqlConfig::default()).await
    }

    /// Connects with `config`.
    ///
    /// # Errors
    /// As [`MySqlLock::connect`], and [`LockError::Config`] when `config` fails
    /// [`MySqlConfig::validate`].
    pub async fn connect_with(url: &str, config: MySqlConfig) -> Result<Self, LockError> {
        config.validate()?;
        let connect = parse_url(url)?;
        let settings = Settings::new(config, connect);
        let (mut conn, id) = session::connect_retrying(&settings).await?;
        let limit = settings.config.request_timeout;
        let ready = match ensure_tables(&mut conn, &settings.address, limit).await {
            Ok(()) => session::ready_for_tokens(&mut conn, &settings).await,
            Err(e) => Err(e),
        };
        if let Err(e) = ready {
            let _ = timeout(limit, conn.close()).await;
            return Err(e);
        }
        let sessions = SessionPool::new(
            settings.config.shared_sessions,
            settings.config.wait_sessions,
            QUEUE_PER_SESSION,
        );
        let state = Arc::new(ClientState {
            settings: Arc::new(settings),
            sessions: Arc::new(sessions),
        });
        let first = session::start(Kind::Shared, conn, id, &state);
        state.sessions.add_shared(first);
        Ok(MySqlLock { state })
    }

    /// The settings in force.
    pub fn config(&self) -> &MySqlConfig {
        &self.state.settings.config
    }

    /// The sessions open now: `(shared, dedicated)`. Each is one connection.
    pub fn session_counts(&self) -> (usize, usize) {
        self.state.sessions.counts()
    }

    /// The settings every session of this client runs with.
    pub(crate) fn settings(&self) -> &Settings {
        &self.state.settings
    }

    /// Sends `ask` (a grant of `name` by `grab`, under a fresh owner token) to `session`
    /// and waits for its answer, undoing a grant that lands after this future is
    /// dropped. `None` when the session closed before running it (try another).
    async fn grant_on(
        &self,
        session: Arc<SessionHandle>,
        ask: Ask<'_>,
    ) -> Option<Result<Option<Grant>, Failure>> {
        let owner = OwnerToken::random();
        let (tx, rx) = oneshot::channel();
        let command = Command::Grant {
            name: ask.name.clone(),
            grab: ask.grab,
            owner: owner.as_u128(),
            ttl: ask.options.ttl(),
            requested_at: Instant::now(),
            slot: ask.slot,
            seat: ask.seat.cloned(),
            reply: tx,
        };
        // Armed before the command runs: run inline, it finishes even if this future
        // is dropped, and the compensation is queued behind it.
        let mut pending = Pending {
            owner: owner.as_u128(),
            session: session.clone(),
            armed: true,
        };
        if session.run(command).await.is_err() {
            pending.armed = false;
            return None;
        }
        let reply = rx.await;
        pending.armed = false;
        match reply {
            Ok(Ok(granted)) => Some(Ok(granted.map(|g| (owner, g)))),
            Ok(Err(Failure::Closed)) | Err(_) => None,
            Ok(Err(failure)) => Some(Err(failure)),
        }
    }

    /// One try on a shared session: the grant, or `None` when the name is in use
    /// (including by this client).
    async fn try_shared(
        &self,
        name: &Arc<str>,
        options: &LockOptions,
        seat: Option<&Arc<Seat>>,
    ) -> Result<Option<Grant>, LockError> {
        let mut retried_broken = false;
        for _ in 0..SESSION_ATTEMPTS {
            let session = shared_session(&self.state).await?;
            let ask = Ask {
                name,
                grab: Grab::Try,
                options,
                slot: None,
                seat,
            };
            let answer = self.grant_on(session, ask).await;
            match answer {
                None => continue,
                Some(Ok(granted)) => return Ok(granted),
                // The session broke under the command, and its locks ended with it:
                // one more try on a fresh session hides a stale one (a server restart).
                Some(Err(Failure::Lock(e @ LockError::Connection { .. }))) if !retried_broken => {
                    tracing::debug!(error = %e, "shared session broke; retrying on another");
                    retried_broken = true;
                }
                Some(Err(Failure::Lock(e))) => return Err(e),
                Some(Err(Failure::Mismatch(_) | Failure::Closed)) => {
                    return Err(LockError::backend_error(
                        MYSQL_BACKEND,
                        "a permit count answer to a lock try",
                    ))
                }
            }
        }
        Err(self
            .settings()
            .connection_error("no usable session: every one tried closed or broke"))
    }

    /// One `grab` on a dedicated session: the grant, or `None` when the name was held
    /// (the wait ran out, or no dedicated session came free before `deadline`).
    async fn dedicated(
        &self,
        key: &LockKey,
        name: &Arc<str>,
        grab: Grab,
        options: &LockOptions,
        deadline: Option<Instant>,
        seat: Option<&Arc<Seat>>,
    ) -> Result<Option<Grant>, LockError> {
        for _ in 0..SESSION_ATTEMPTS {
            let Some((slot, session)) = dedicated_session(&self.state, deadline, key).await? else {
                return Ok(None);
            };
            let ask = Ask {
                name,
                grab: grab.clone(),
                options,
                slot: Some(slot),
                seat,
            };
            let answer = self.grant_on(session, ask).await;
            match answer {
                None => continue,
                Some(Ok(granted)) => return Ok(granted),
                Some(Err(Failure::Lock(e))) => return Err(e),
                Some(Err(Failure::Mismatch(in_use))) => {
                    let asked = match grab {
                        Grab::Permit { max, .. } => max,
                        _ => 0,
                    };
                    return Err(LockError::PermitMismatch {
                        backend: MYSQL_BACKEND,
                        source: PermitMismatch::new(key.clone(), asked, in_use),
                    });
                }
                Some(Err(Failure::Closed)) => continue,
            }
        }
        Err(self
            .settings()
            .connection_error("no usable session to wait on: every one tried closed"))
    }

    /// One try of `plan` on `name`, without waiting: the grant, or `None` when held.
    async fn try_plan(
        &self,
        key: &LockKey,
        name: &Arc<str>,
        plan: &Plan,
        options: &LockOptions,
    ) -> Result<Option<Grant>, LockError> {
        match plan {
            Plan::Exclusive => self.try_shared(name, options, None).await,
            Plan::Lead(seat) => self.try_shared(name, options, Some(seat)).await,
            Plan::Permit { max } => {
                // A try waits for a dedicated session only as long as a request may take.
                let patience = Instant::now() + self.settings().config.request_timeout;
                let grab = Grab::Permit {
                    key: key.clone(),
                    max: *max,
                };
                self.dedicated(key, name, grab, options, Some(patience), None)
                    .await
            }
        }
    }

    /// After a try of `plan` found the name held: waits until it may be free (a wait
    /// in `GET_LOCK`, or, for a permit, a nap of `nap`), within `deadline`.
    async fn wait_plan(
        &self,
        key: &LockKey,
        name: &Arc<str>,
        plan: &Plan,
        options: &LockOptions,
        deadline: Option<Instant>,
        nap: Duration,
    ) -> Result<Option<Grant>, LockError> {
        let seat = match plan {
            Plan::Lead(seat) => Some(seat),
            Plan::Exclusive => None,
            Plan::Permit { .. } => {
                tokio::time::sleep(nap).await;
                return Ok(None);
            }
        };
        // Never an infinite GET_LOCK (MySQL and MariaDB spell it differently), and never
        // longer than the session timeout: a dead waiter leaves the queue within it.
        let mut wait = self.settings().config.max_wait_statement();
        if let Some(d) = deadline {
            wait = wait.min(d.saturating_duration_since(Instant::now()));
        }
        if wait.is_zero() {
            return Ok(None);
        }
        // Whole milliseconds, rounded up, so the server gives up no earlier than asked.
        let seconds = wait.as_micros().div_ceil(1000) as f64 / 1000.0;
        self.dedicated(key, name, Grab::Wait { seconds }, options, deadline, seat)
            .await
    }

    /// `plan` on `name` for `request`: a try, then, while the name is held and the
    /// deadline allows, a wait (in `GET_LOCK`, or a nap of the options' backoff for a
    /// permit) and another try. `None` once the name is still held at the deadline, at
    /// once for a try; each held answer is noted in the request. Errors are returned
    /// as they come: the caller retries them.
    pub(crate) async fn contend(
        &self,
        request: &Request<'_>,
        name: &Arc<str>,
        plan: &Plan,
    ) -> Result<Option<Grant>, LockError> {
        let (key, options, deadline) = (request.key, request.options, request.deadline);
        sessions::contend(
            request,
            || self.try_plan(key, name, plan, options),
            |nap| self.wait_plan(key, name, plan, options, deadline, nap),
        )
        .await
    }

    /// Owner-checked release of `lease`: `Ok(true)` if this client held it and released
    /// it now, `Ok(false)` if it holds it no more.
    pub(crate) async fn release_lease(&self, lease: &Lease) -> Result<bool, LockError> {
        release(&*self.state, lease.owner().as_u128()).await
    }

    /// Owner-checked extension of `lease`: the new validity deadline, or `None` if this
    /// client holds it no more.
    pub(crate) async fn extend_lease(
        &self,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<Option<Instant>, LockError> {
        extend(&*self.state, lease.owner().as_u128(), ttl).await
    }

    /// Runs a read-only command made by `command` on a shared session.
    pub(crate) async fn ask<T>(
        &self,
        command: impl Fn(Reply<T>) -> Command,
    ) -> Result<T, LockError> {
        ask(&self.state, command).await
    }

    /// The connection id holding the lock `name`, if any.
    pub(crate) async fn holder(&self, name: &str) -> Result<Option<u64>, LockError> {
        self.ask(|reply| Command::Holder {
            name: name.to_owned(),
            reply,
        })
        .await
    }
}

impl SessionSource for ClientState {
    type Command = Command;
    const BACKEND: &'static str = MYSQL_BACKEND;
    const NO_SESSION_FREE: &'static str = "the server had no connection free (max_connections)";

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
