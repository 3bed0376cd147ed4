//! One MySQL session (connection) and the task that owns it.
//!
//! A session task runs the session's commands one at a time, in the order they were
//! sent (a caller finding the session idle runs its command in its own task, with the
//! same code: see `distlock_api::backend::sessions`). It owns what the session holds: for each lease, its lock name, its
//! client-enforced TTL deadline and its [`LeaseMonitor`]. It releases a lease when its
//! TTL runs out, proves the session alive (a heartbeat) while it holds anything, marks
//! every lease it holds suspect when a reply is slow and lost when the session ends,
//! and closes the session once it holds nothing and has been unused for a while.
//!
//! Nothing here can leave a lock behind a caller's back: a grant whose caller went
//! away is released by the task (or by the caller's drop guard, whose release is
//! queued behind the grant), and a session whose protocol state is unknown (a reply
//! timed out, a wait was abandoned) is closed and killed on the server, which ends
//! its locks.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::backend::sessions::{self, End, Extension, Held, SessionTask, TaskCore};
use distlock_api::connect_retry::{retry_connect, Refused};
use distlock_api::LockError;
use sqlx::{Connection, Executor as _, MySqlConnection};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{timeout, Instant};

use crate::client::{ClientState, Settings};
use crate::error::{connect_error, connect_may_pass, ends_session, lock_error};
use crate::mailbox::{
    Command, Failure, Grab, Granted, Kind, LeaseCommand, Reply, Seat, SessionHandle,
};
use crate::semaphore::{self, PermitAnswer};
use crate::sql;
use crate::MYSQL_BACKEND;

/// What a session holds for one lease, beside its TTL and monitor.
#[derive(Debug)]
struct Lock {
    name: Arc<str>,
    /// The session's only grant, released with `RELEASE_ALL_LOCKS` (a permit).
    release_all: bool,
    /// An election's leadership, once its row is written: the candidacy and its term,
    /// whose row is deleted before the lock is released.
    seat: Option<(Arc<Seat>, u64)>,
}

/// The result of one round trip.
type Trip<T> = sessions::Trip<T, sqlx::Error>;

type Statement<'c, T> = sessions::Statement<'c, T, sqlx::Error>;

/// Opens a session of `kind` and starts its task.
pub(crate) async fn open(
    kind: Kind,
    client: &Arc<ClientState>,
) -> Result<Arc<SessionHandle>, LockError> {
    let (mut conn, id) = connect(&client.settings).await?;
    if let Err(e) = ready_for_tokens(&mut conn, &client.settings).await {
        let _ = timeout(client.settings.config.request_timeout, conn.close()).await;
        return Err(e);
    }
    Ok(start(kind, conn, id, client))
}

/// Makes sure the server's current run can hand out tokens (see
/// [`sql::establish_run`]), within the request timeout.
///
/// # Errors
/// A connection error when the request timeout passes first; the server's refusal.
pub(crate) async fn ready_for_tokens(
    conn: &mut MySqlConnection,
    settings: &Settings,
) -> Result<(), LockError> {
    let limit = settings.config.request_timeout;
    timeout(limit, sql::establish_run(conn))
        .await
        .map_err(|_| {
            settings.connection_error(format!(
                "no answer within {limit:?} while starting the fencing run"
            ))
        })?
        .map_err(lock_error)
}

/// Opens a connection within the request timeout and prepares it (see [`prepare`]):
/// the connection and its connection id.
///
/// # Errors
/// As [`connect_error`]; a connection error when the request timeout passes first.
/// Each names the server's address.
pub(crate) async fn connect(settings: &Settings) -> Result<(MySqlConnection, u64), LockError> {
    let limit = settings.config.request_timeout;
    let mut conn = timeout(limit, MySqlConnection::connect_with(&settings.connect))
        .await
        .map_err(|_| {
            settings.connection_error(format!(
                "no connection within the request timeout of {limit:?}"
            ))
        })?
        .map_err(|e| connect_error(e, &settings.address))?;
    match prepare(&mut conn, settings).await {
        Ok(id) => Ok((conn, id)),
        Err(e) => {
            let _ = timeout(limit, conn.close()).await;
            Err(e)
        }
    }
}

/// Sets the session's `wait_timeout` (the bound on a silent holder) and
/// `innodb_lock_wait_timeout` (no fencing-row write waits longer than a request), and
/// reads its connection id.
async fn prepare(conn: &mut MySqlConnection, settings: &Settings) -> Result<u64, LockError> {
    let limit = settings.config.request_timeout;
    let set = format!(
        "SET SESSION wait_timeout = {}, SESSION innodb_lock_wait_timeout = {}",
        settings.config.session_timeout.as_secs(),
        limit.as_secs().max(1)
    );
    let prepared = async {
        (&mut *conn).execute(set.as_str()).await?;
        sqlx::query_scalar::<_, i64>(sql::CONNECTION_ID)
            .fetch_one(&mut *conn)
            .await
    };
    let id = timeout(limit, prepared)
        .await
        .map_err(|_| {
            settings.connection_error(format!(
                "no answer to a new session's settings within {limit:?}"
            ))
        })?
        .map_err(lock_error)?;
    Ok(id.unsigned_abs())
}

/// [`connect`] for a client's first connection: a refused or silent port, a server
/// starting up or shutting down and one with no connection free are retried with
/// backoff until the request timeout has passed since the call, then the last reason
/// is returned; other refusals fail at once.
///
/// # Errors
/// As [`connect`].
pub(crate) async fn connect_retrying(
    settings: &Settings,
) -> Result<(MySqlConnection, u64), LockError> {
    let limit = settings.config.request_timeout;
    let address = settings.address.as_str();
    let no_connection = || {
        LockError::connection_at(
            MYSQL_BACKEND,
            address,
            format!(
                "no connection within the request timeout of {} ms",
                limit.as_millis()
            ),
        )
    };
    let conn = retry_connect(
        limit,
        |deadline| async move {
            let left = deadline.saturating_duration_since(Instant::now());
            match timeout(left, MySqlConnection::connect_with(&settings.connect)).await {
                Ok(Ok(conn)) => Ok(conn),
                Ok(Err(error)) => Err(Refused::by_kind_if(
                    connect_may_pass(&error),
                    connect_error(error, address),
                )),
                Err(_) => Err(Refused::Passing(no_connection())),
            }
        },
        |last| last.unwrap_or_else(no_connection),
    )
    .await?;
    let mut conn = conn;
    match prepare(&mut conn, settings).await {
        Ok(id) => Ok((conn, id)),
        Err(e) => {
            let _ = timeout(limit, conn.close()).await;
            Err(e)
        }
    }
}

/// Starts the task of a session over `conn`, whose connection id is `id`.
pub(crate) fn start(
    kind: Kind,
    conn: MySqlConnection,
    id: u64,
    client: &Arc<ClientState>,
) -> Arc<SessionHandle> {
    let timing = client.settings.config.timing();
    let (handle, core) = TaskCore::new(conn, kind, &client.sessions, timing, "MySQL");
    let task = Task {
        core,
        connection_id: id,
        settings: client.settings.clone(),
    };
    tokio::spawn(task.run());
    handle
}

struct Task {
    /// The connection, the mailbox and what the session holds.
    core: TaskCore<Command, Lock, MySqlConnection>,
    /// The session's `CONNECTION_ID()`: an abandoned wait is killed through it.
    connection_id: u64,
    settings: Arc<Settings>,
}

#[async_trait]
impl SessionTask for Task {
    type Command = Command;
    type Lock = Lock;
    type Conn = MySqlConnection;

    /// One command at a time.
    const MAX_BATCH: usize = 1;

    fn core(&mut self) -> &mut TaskCore<Command, Lock, MySqlConnection> {
        &mut self.core
    }

    async fn process(&mut self, batch: Vec<Command>) -> Result<(), End> {
        for command in batch {
            self.command(command).await?;
        }
        Ok(())
    }

    async fn expire(&mut self, owners: Vec<u128>) -> Result<(), End> {
        for owner in owners {
            self.unlock(owner, None).await?;
        }
        Ok(())
    }

    async fn ping(&mut self) -> Result<(), End> {
        self.request(|c| Box::pin(async move { c.execute(sql::PING).await.map(|_| ()) }))
            .await
            .or_end("heartbeat")
    }

    fn forget(&mut self, owner: u128) {
        self.forget_held(owner);
    }

    fn refuse(&mut self, command: Command) {
        command.fail(Failure::Closed);
    }

    async fn close(conn: MySqlConnection) {
        let _ = conn.close().await;
    }
}

impl Task {
    /// A connection error of this session: `why`, at the server's address.
    fn broken(&self, why: impl Into<String>) -> LockError {
        self.settings.connection_error(why)
    }

    /// Runs one statement, bounded by `limit`; marks held leases suspect while the
    /// reply is later than the heartbeat period.
    async fn trip<T, F>(&mut self, limit: Duration, run: F) -> Trip<T>
    where
        F: for<'c> FnOnce(&'c mut MySqlConnection) -> Statement<'c, T>,
    {
        self.core.trip(limit, run, ends_session).await
    }

    /// [`Task::trip`] within the request timeout.
    async fn request<T, F>(&mut self, run: F) -> Trip<T>
    where
        F: for<'c> FnOnce(&'c mut MySqlConnection) -> Statement<'c, T>,
    {
        let limit = self.settings.config.request_timeout;
        self.trip(limit, run).await
    }

    async fn command(&mut self, command: Command) -> Result<(), End> {
        match command {
            Command::Grant {
                name,
                grab,
                owner,
                ttl,
                requested_at,
                slot,
                seat,
                reply,
            } => {
                if reply.is_closed() {
                    // The caller went away while the grant was queued: never send it,
                    // so the name is not granted late, and the session stays usable.
                    self.core.return_if_idle();
                    return Ok(());
                }
                let grant = NewGrant {
                    name,
                    owner,
                    ttl,
                    lease_start: requested_at,
                    slot,
                    release_all: matches!(grab, Grab::Permit { .. }),
                    seat,
                };
                match grab {
                    Grab::Try => self.try_grant(grant, reply).await,
                    Grab::Wait { seconds } => self.wait(grant, seconds, reply).await,
                    Grab::Permit { key, max } => self.permit(grant, key, max, reply).await,
                }
            }
            Command::Lease(LeaseCommand::Release { owner, reply }) => {
                if self.core.leases.contains(owner) {
                    self.unlock(owner, reply).await
                } else {
                    if let Some(reply) = reply {
                        let _ = reply.send(Ok(false));
                    }
                    Ok(())
                }
            }
            Command::Lease(LeaseCommand::Extend { owner, ttl, reply }) => {
                self.extend(owner, ttl, reply).await
            }
            Command::Holder { name, reply } => {
                let trip = self
                    .request(move |c| {
                        Box::pin(async move {
                            sqlx::query_scalar::<_, Option<i64>>(sql::HOLDER)
                                .bind(name)
                                .fetch_one(c)
                                .await
                        })
                    })
                    .await;
                self.answer(trip.map(|id| id.map(i64::unsigned_abs)), reply)
            }
            Command::PermitsInUse { key, reply } => {
                let trip = self
                    .request(move |c| Box::pin(semaphore::permits_in_use(c, key)))
                    .await;
                self.answer(trip, reply)
            }
            Command::Leader { name, reply } => {
                let trip = self
                    .request(move |c| {
                        Box::pin(async move {
                            sqlx::query_as::<_, (Vec<u8>, i64)>(sql::LEADER)
                                .bind(name.as_str())
                                .bind(name.as_str())
                                .fetch_optional(c)
                                .await
                        })
                    })
                    .await;
                self.answer(
                    trip.map(|row| row.map(|(c, term)| (c, term.unsigned_abs()))),
                    reply,
                )
            }
        }
    }

    /// Sends a read-only statement's outcome to its caller.
    fn answer<T>(&self, trip: Trip<T>, reply: Reply<T>) -> Result<(), End> {
        trip.answer(reply, lock_error, |why| self.broken(why))
    }

    /// A try: `GET_LOCK(name, 0)` unless the name is in use, then its token.
    async fn try_grant(
        &mut self,
        grant: NewGrant,
        reply: Reply<Option<Granted>>,
    ) -> Result<(), End> {
        let name = grant.name.clone();
        let trip = self
            .request(move |c| {
                Box::pin(async move {
                    sqlx::query_scalar::<_, Option<String>>(sql::TRY_LOCK)
                        .bind(&*name)
                        .bind(&*name)
                        .bind(&*name)
                        .fetch_one(c)
                        .await
                })
            })
            .await;
        let trip = trip.map(|answer| sql::lock_answer(answer.as_deref()));
        self.after_lock(trip, grant, reply).await
    }

    /// After a try's or a wait's answer: the grant, or the answer "held", or the error.
    async fn after_lock(
        &mut self,
        trip: Trip<sql::LockAnswer>,
        grant: NewGrant,
        reply: Reply<Option<Granted>>,
    ) -> Result<(), End> {
        let token = match trip {
            Trip::Done(sql::LockAnswer::Granted { token, .. }) => token,
            Trip::Done(sql::LockAnswer::NotGranted) => {
                let _ = reply.send(Ok(None));
                self.core.return_if_idle();
                return Ok(());
            }
            Trip::Done(sql::LockAnswer::Failed) => {
                let _ = reply.send(Err(Failure::Lock(LockError::backend_error(
                    MYSQL_BACKEND,
                    "GET_LOCK returned NULL (an error on the server, such as running out of memory)",
                ))));
                self.core.return_if_idle();
                return Ok(());
            }
            Trip::Refused(e) => {
                let _ = reply.send(Err(Failure::Lock(lock_error(e))));
                self.core.return_if_idle();
                return Ok(());
            }
            Trip::Broken(why) => {
                let _ = reply.send(Err(Failure::Lock(self.broken(why.clone()))));
                return Err(End::Broken(why));
            }
        };
        match token {
            Some(token) => self.grant(grant, token, reply).await,
            None => {
                // No run row: the server restarted or `distlock_run` was emptied under
                // this session. A new session starts the run again; the caller may retry
                // there (a connection error).
                let why = "no fencing token: the server's fencing run has no row (it restarted, \
                           or distlock_run was emptied)";
                let _ = reply.send(Err(Failure::Lock(self.broken(why))));
                self.release_name(&grant.name).await?;
                Err(End::Broken(why.into()))
            }
        }
    }

    /// Releases a lock this session took but hands to nobody.
    async fn release_name(&mut self, name: &Arc<str>) -> Result<(), End> {
        let name = name.clone();
        match self
            .request(move |c| {
                Box::pin(async move {
                    sqlx::query_scalar::<_, Option<i64>>(sql::RELEASE_LOCK)
                        .bind(&*name)
                        .fetch_one(c)
                        .await
                })
            })
            .await
        {
            Trip::Done(_) => {
                self.core.return_if_idle();
                Ok(())
            }
            // Cannot tell what the session holds: end it, which ends its locks.
            Trip::Refused(e) => Err(End::Broken(format!("could not release a lock: {e}"))),
            Trip::Broken(why) => Err(End::Broken(why)),
        }
    }

    /// Records a grant and hands it to its caller; releases at once if the caller left.
    async fn grant(
        &mut self,
        grant: NewGrant,
        token: u64,
        reply: Reply<Option<Granted>>,
    ) -> Result<(), End> {
        let NewGrant {
            name,
            owner,
            ttl,
            lease_start,
            slot,
            release_all,
            seat,
        } = grant;
        let registered = self.core.register(owner);
        let lock = Lock {
            name,
            release_all,
            seat: None,
        };
        let monitor = self.core.leases.insert(owner, lease_start, ttl, slot, lock);
        if let Some(seat) = seat.filter(|_| registered && !reply.is_closed()) {
            // The leader's row, in this session, before anyone is told it leads.
            let row = seat.clone();
            let written = self
                .request(move |c| {
                    Box::pin(async move {
                        sqlx::query(sql::SEAT)
                            .bind(row.name.as_str())
                            .bind(row.candidate.as_slice())
                            .bind(token)
                            .execute(c)
                            .await
                            .map(|_| ())
                    })
                })
                .await;
            match written {
                Trip::Done(()) => {
                    if let Some(held) = self.core.leases.get_mut(owner) {
                        held.lock.seat = Some((seat, token));
                    }
                }
                Trip::Refused(e) => {
                    let _ = reply.send(Err(Failure::Lock(lock_error(e))));
                    return self.unlock(owner, None).await;
                }
                Trip::Broken(why) => {
                    let _ = reply.send(Err(Failure::Lock(self.broken(why.clone()))));
                    return Err(End::Broken(why));
                }
            }
        }
        let granted = Granted {
            token,
            acquired_at: lease_start,
            monitor,
        };
        if !registered || reply.send(Ok(Some(granted))).is_err() {
            // Nobody will ever release it: undo the grant now.
            self.unlock(owner, None).await?;
        }
        Ok(())
    }

    /// Waits in `GET_LOCK` for at most `seconds`. If the caller goes away meanwhile,
    /// the session is abandoned: closed, and killed on the server from another
    /// connection (a server blocked in `GET_LOCK` does not notice a closed client), which
    /// ends the wait, or the lock if it was just granted.
    async fn wait(
        &mut self,
        mut grant: NewGrant,
        seconds: f64,
        mut reply: Reply<Option<Granted>>,
    ) -> Result<(), End> {
        let started = Instant::now();
        let limit = Duration::from_secs_f64(seconds) + self.settings.config.request_timeout;
        let name = grant.name.clone();
        let trip = {
            let statement = self.trip(limit, move |c| {
                Box::pin(async move {
                    sqlx::query_scalar::<_, Option<String>>(sql::WAIT_LOCK)
                        .bind(&*name)
                        .bind(seconds)
                        .bind(&*name)
                        .fetch_one(c)
                        .await
                })
            });
            tokio::select! {
                trip = statement => Some(trip),
                _ = reply.closed() => None,
            }
        };
        let Some(trip) = trip else {
            self.abandon();
            return Err(End::Broken("the waiting caller went away".into()));
        };
        if let Trip::Broken(_) = &trip {
            // Whether the server still waits, or holds the lock, is unknown.
            self.abandon();
        }
        // The lease starts at the grant, which came `waited` microseconds into the
        // statement by the server's clock: the wait is not charged to it (less 1 % for
        // clock-rate differences, so the lease never starts later than the grant).
        let trip = trip.map(|answer| sql::lock_answer(answer.as_deref()));
        if let Trip::Done(sql::LockAnswer::Granted { waited, .. }) = &trip {
            let waited = Duration::from_micros(u64::try_from(*waited).unwrap_or(0)).mul_f64(0.99);
            grant.lease_start = (started + waited).min(Instant::now());
        }
        self.after_lock(trip, grant, reply).await
    }

    /// Drops the connection and kills its server session from another connection, in
    /// the background.
    fn abandon(&mut self) {
        self.core.abandon();
        let settings = self.settings.clone();
        let id = self.connection_id;
        tokio::spawn(async move {
            let limit = settings.config.request_timeout;
            let Ok((mut conn, _)) = connect(&settings).await else {
                return;
            };
            let kill_sql = format!("KILL CONNECTION {id}");
            let kill = (&mut conn).execute(kill_sql.as_str());
            // Best effort: the server's own wait bound is the backstop.
            if let Ok(Err(e)) = timeout(limit, kill).await {
                tracing::debug!(error = %e, "could not end an abandoned wait's session");
            }
            let _ = timeout(limit, conn.close()).await;
        });
    }

    /// A semaphore permit's try (see `semaphore::try_permit`).
    async fn permit(
        &mut self,
        grant: NewGrant,
        key: distlock_api::LockKey,
        max: u32,
        reply: Reply<Option<Granted>>,
    ) -> Result<(), End> {
        let trip = self
            .request(move |c| Box::pin(semaphore::try_permit(c, key, max)))
            .await;
        match trip {
            Trip::Done(PermitAnswer::Granted { slot, token }) => {
                let grant = NewGrant {
                    name: Arc::from(slot.as_str()),
                    ..grant
                };
                self.grant(grant, token, reply).await
            }
            Trip::Done(PermitAnswer::Full) => {
                let _ = reply.send(Ok(None));
                self.core.return_if_idle();
                Ok(())
            }
            Trip::Done(PermitAnswer::Mismatch(other)) => {
                let _ = reply.send(Err(Failure::Mismatch(other)));
                self.core.return_if_idle();
                Ok(())
            }
            Trip::Refused(e) => {
                let _ = reply.send(Err(Failure::Lock(lock_error(e))));
                // Whatever the statements took goes with the rollback and the release.
                match self
                    .request(|c| {
                        Box::pin(async move {
                            (&mut *c).execute("ROLLBACK").await?;
                            c.execute(sql::RELEASE_ALL).await.map(|_| ())
                        })
                    })
                    .await
                {
                    Trip::Done(()) => {
                        self.core.return_if_idle();
                        Ok(())
                    }
                    Trip::Refused(e) => {
                        Err(End::Broken(format!("could not clean up a permit try: {e}")))
                    }
                    Trip::Broken(why) => Err(End::Broken(why)),
                }
            }
            Trip::Broken(why) => {
                let _ = reply.send(Err(Failure::Lock(self.broken(why.clone()))));
                Err(End::Broken(why))
            }
        }
    }

    /// Releases the held lease of `owner` (if still held), replying `true` if this
    /// session still held it; marks it lost and forgets it.
    async fn unlock(&mut self, owner: u128, reply: Option<Reply<bool>>) -> Result<(), End> {
        let Some(Lock {
            name,
            release_all,
            seat,
        }) = self.core.leases.get(owner).map(|held| &held.lock)
        else {
            if let Some(reply) = reply {
                let _ = reply.send(Ok(false));
            }
            return Ok(());
        };
        let (name, release_all, seat) = (
            name.clone(),
            *release_all,
            seat.as_ref().map(|(s, t)| (s.name.clone(), *t)),
        );
        // The leader's row first, while the lock still holds. A row that cannot be
        // deleted ends the session: it must never outlive its leadership while the
        // session lives (`LEADER` reads it only while this session holds the lock).
        let mut outcome = Ok(true);
        if let Some((election, term)) = seat {
            outcome = match self
                .request(move |c| {
                    Box::pin(async move {
                        sqlx::query(sql::UNSEAT)
                            .bind(election)
                            .bind(term)
                            .execute(c)
                            .await
                            .map(|_| ())
                    })
                })
                .await
            {
                Trip::Done(()) => Ok(true),
                Trip::Refused(e) => Err(format!("could not delete an election's leader row: {e}")),
                Trip::Broken(why) => Err(why),
            };
        }
        if outcome.is_ok() {
            let statement = if release_all {
                sql::RELEASE_ALL
            } else {
                sql::RELEASE_LOCK
            };
            outcome = match self
                .request(move |c| {
                    Box::pin(async move {
                        let query = sqlx::query_scalar::<_, Option<i64>>(statement);
                        let query = if release_all {
                            query
                        } else {
                            query.bind(&*name)
                        };
                        query.fetch_one(c).await
                    })
                })
                .await
            {
                Trip::Done(released) => Ok(released.is_some_and(|n| n > 0)),
                Trip::Refused(e) => Err(format!("release refused: {e}")),
                Trip::Broken(why) => Err(why),
            };
        }
        let held = self.forget_held(owner);
        match outcome {
            Ok(released) => {
                if !released {
                    tracing::warn!("the session did not hold a lock it had been granted");
                }
                if let Some(reply) = reply {
                    let _ = reply.send(Ok(released));
                }
                // Back on the idle list before the wait slot frees, so the next waiter
                // finds this session instead of opening another.
                self.core.return_if_idle();
                drop(held);
                Ok(())
            }
            Err(why) => {
                if let Some(reply) = reply {
                    let _ = reply.send(Err(Failure::Lock(self.broken(why.clone()))));
                }
                Err(End::Broken(why))
            }
        }
    }

    /// Forgets a held lease: marks it lost (it no longer is held) and removes it from
    /// the client's routes.
    fn forget_held(&mut self, owner: u128) -> Option<Held<Lock>> {
        self.core.forget(owner)
    }

    async fn extend(
        &mut self,
        owner: u128,
        ttl: Duration,
        reply: Reply<Option<Instant>>,
    ) -> Result<(), End> {
        if !self.core.leases.contains(owner) {
            let _ = reply.send(Ok(None));
            return Ok(());
        }
        if self.core.leases.is_lost(owner) {
            // Lost is final (the TTL ran out, or the session's horizon passed): the
            // lock must go, not be revived.
            let _ = reply.send(Ok(None));
            return self.unlock(owner, None).await;
        }
        let started = Instant::now();
        if let Err(End::Broken(why)) = self.ping().await {
            let _ = reply.send(Err(Failure::Lock(self.broken(why.clone()))));
            return Err(End::Broken(why));
        }
        match self.core.leases.extend(owner, started, ttl) {
            Extension::NotHeld => {
                let _ = reply.send(Ok(None));
                Ok(())
            }
            Extension::Lapsed => {
                let _ = reply.send(Ok(None));
                self.unlock(owner, None).await
            }
            Extension::Extended(valid_until) => {
                let _ = reply.send(Ok(Some(valid_until)));
                Ok(())
            }
        }
    }
}

/// A grant being made, for [`Task::grant`].
struct NewGrant {
    name: Arc<str>,
    owner: u128,
    ttl: Duration,
    /// When the lease starts (its TTL counts from here).
    lease_start: Instant,
    /// A dedicated session's wait slot.
    slot: Option<OwnedSemaphorePermit>,
    /// Whether it is released with `RELEASE_ALL_LOCKS` (see [`Held::release_all`]).
    release_all: bool,
    /// An election's grant: its leader's row is written before the reply.
    seat: Option<Arc<Seat>>,
}
