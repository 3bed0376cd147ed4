//! One Postgres session (connection) and the task that owns it.
//!
//! A session task runs the session's commands one statement at a time, in the order
//! they were sent, batching runs of grants, unlocks and extends into one statement
//! each (a caller finding the session idle runs its command in its own task, with the
//! same code: see `distlock_api::backend::sessions`). It owns what the session holds: for each lease, its key hash, its
//! client-enforced TTL deadline and its [`LeaseMonitor`]. It unlocks a lease when its
//! TTL runs out, proves the session alive (a heartbeat) while it holds anything, marks
//! every lease it holds suspect when a reply is slow and lost when the session ends,
//! and closes the session once it holds nothing and has been unused for a while.
//!
//! Nothing here can leave an advisory lock behind a caller's back: a grant whose
//! caller went away is unlocked by the task (or by the caller's drop guard, whose
//! release is queued behind the grant), and a session whose protocol state is unknown
//! (a reply timed out, a wait was abandoned) is closed, which ends its locks.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::backend::sessions::{self, End, Extension, Held, SessionTask, TaskCore};
use distlock_api::connect_retry::{retry_connect, Refused};
use distlock_api::LockError;
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{timeout, Instant};

use crate::client::{ClientState, Settings};
use crate::config::server_address;
use crate::error::{connect_error, ends_session, lock_error, sqlstate, LockTableFull};
use crate::keys::pg_locks_ids;
use crate::mailbox::{
    Command, Failure, Grab, Granted, Kind, LeaseCommand, Probe, Reply, Seat, SessionHandle,
};
use crate::POSTGRES_BACKEND;

/// A dedicated session's server process: `(pid, start time as text)`.
const BACKEND_IDENTITY: &str = "SELECT pid, backend_start::text FROM pg_stat_activity \
     WHERE pid = pg_backend_pid()";
/// `$1` pid, `$2` start time as text: terminates that server process if it still runs.
const TERMINATE_BACKEND: &str = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
     WHERE pid = $1 AND backend_start::text = $2";
/// SQLSTATE lock_not_available: `lock_timeout` fired.
const LOCK_TIMEOUT: &str = "55P03";
/// What a session holds for one lease, beside its TTL and monitor.
#[derive(Debug)]
struct Lock {
    hash: i64,
    /// The session's only grant, released with `pg_advisory_unlock_all` (a read, a
    /// permit): see [`Task::unlock`].
    unlock_all: bool,
    /// An election's leadership, once its row is written: the candidacy and its term,
    /// whose row is deleted before the lock is unlocked.
    seat: Option<(Arc<Seat>, i64)>,
}

/// A grant the server just made, for [`Task::grant`].
struct NewGrant {
    hash: i64,
    owner: u128,
    token: i64,
    /// When the lease starts (its TTL counts from here).
    lease_start: Instant,
    ttl: Duration,
    /// A dedicated session's wait slot.
    slot: Option<OwnedSemaphorePermit>,
    /// Whether it is released with `pg_advisory_unlock_all` (see [`Lock::unlock_all`]).
    unlock_all: bool,
    /// An election's grant: its leader's row is written before the reply.
    seat: Option<Arc<Seat>>,
}

/// The result of one round trip.
type Trip<T> = sessions::Trip<T, sqlx::Error>;

/// Opens a session of `kind` and starts its task.
pub(crate) async fn open(
    kind: Kind,
    client: &Arc<ClientState>,
) -> Result<Arc<SessionHandle>, LockError> {
    let mut conn = connect(
        &client.settings.connect,
        client.settings.config.request_timeout,
    )
    .await?;
    if let Some(sql) = &client.settings.restate {
        restate(&mut conn, sql, client.settings.config.request_timeout).await?;
    }
    let backend = match kind {
        Kind::Shared => None,
        Kind::Wait => Some(
            timeout(
                client.settings.config.request_timeout,
                sqlx::query_as::<_, (i32, String)>(BACKEND_IDENTITY).fetch_one(&mut conn),
            )
            .await
            .map_err(|_| {
                client.settings.connection_error(format!(
                    "no answer to a new session's first query within {:?}: the server is slow, \
                     or a pooler in front of it has no server connection free",
                    client.settings.config.request_timeout
                ))
            })?
            .map_err(lock_error)?,
        ),
    };
    Ok(start_as(kind, conn, client, backend))
}

/// Runs `sql` (the session's settings as `SET` statements) on a new session.
///
/// # Errors
/// Connection and backend errors; a connection error when `limit` passes first.
pub(crate) async fn restate(
    conn: &mut PgConnection,
    sql: &str,
    limit: Duration,
) -> Result<(), LockError> {
    timeout(limit, crate::xact_sql::run(conn, sql))
        .await
        .map_err(|_| {
            crate::error::connection(format!(
                "no answer to a new session's settings within {limit:?}"
            ))
        })?
        .map_err(lock_error)?;
    Ok(())
}

/// Opens a connection with `options` within `limit`.
///
/// # Errors
/// As [`connect_error`]; a connection error when `limit` passes first. Each names the
/// server's address.
pub(crate) async fn connect(
    options: &PgConnectOptions,
    limit: Duration,
) -> Result<PgConnection, LockError> {
    let address = server_address(options);
    timeout(limit, PgConnection::connect_with(options))
        .await
        .map_err(|_| {
            LockError::connection_at(
                POSTGRES_BACKEND,
                &address,
                format!("no connection within the request timeout of {limit:?}"),
            )
        })?
        .map_err(|e| connect_error(e, &address))
}

/// [`connect`] for a client's first connection: a refused or silent port, a server
/// starting up or shutting down (`57P03`, `57P01`) and one with no connection slot
/// free (`53300`) are retried with backoff until `limit` has passed since the call,
/// then the last reason is returned; other refusals fail at once.
///
/// # Errors
/// As [`connect`].
pub(crate) async fn connect_retrying(
    options: &PgConnectOptions,
    limit: Duration,
) -> Result<PgConnection, LockError> {
    let address = server_address(options);
    retry_connect(
        limit,
        |deadline| {
            let address = address.as_str();
            async move {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                match tokio::time::timeout(left, PgConnection::connect_with(options)).await {
                    Ok(Ok(conn)) => Ok(conn),
                    Ok(Err(error)) => Err(Refused::by_kind_if(
                        connect_may_pass(&error),
                        connect_error(error, address),
                    )),
                    Err(_) => Err(Refused::Passing(LockError::connection_at(
                        POSTGRES_BACKEND,
                        address,
                        format!(
                            "no connection within the request timeout of {} ms",
                            limit.as_millis()
                        ),
                    ))),
                }
            }
        },
        |last| {
            last.unwrap_or_else(|| {
                LockError::connection_at(
                    POSTGRES_BACKEND,
                    &address,
                    format!(
                        "no connection within the request timeout of {} ms",
                        limit.as_millis()
                    ),
                )
            })
        },
    )
    .await
}

/// Whether a failed connect may succeed shortly: see [`connect_retrying`].
fn connect_may_pass(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(io) => matches!(
            io.kind(),
            std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::TimedOut
        ),
        _ => sqlstate(error).is_some_and(|code| ["57P03", "57P01", "53300"].contains(&code)),
    }
}

/// Starts the task of a session over `conn`.
pub(crate) fn start(
    kind: Kind,
    conn: PgConnection,
    client: &Arc<ClientState>,
) -> Arc<SessionHandle> {
    start_as(kind, conn, client, None)
}

/// [`start`], knowing the session's server process as `(pid, start time)`.
fn start_as(
    kind: Kind,
    conn: PgConnection,
    client: &Arc<ClientState>,
    backend: Option<(i32, String)>,
) -> Arc<SessionHandle> {
    let timing = client.settings.config.timing();
    let (handle, core) = TaskCore::new(conn, kind, &client.sessions, timing, "Postgres");
    let task = Task {
        core,
        client: Arc::downgrade(client),
        settings: client.settings.clone(),
        backend,
    };
    tokio::spawn(task.run());
    handle
}

struct Task {
    /// The connection, the mailbox and what the session holds.
    core: TaskCore<Command, Lock, PgConnection>,
    client: Weak<ClientState>,
    settings: Arc<Settings>,
    /// A dedicated session's server process, `(pid, backend_start as text)`: an
    /// abandoned wait is ended through it (see [`Task::end_abandoned_wait`]).
    backend: Option<(i32, String)>,
}

#[async_trait]
impl SessionTask for Task {
    type Command = Command;
    type Lock = Lock;
    type Conn = PgConnection;

    /// Runs of grants, releases and extends go as one statement each.
    const MAX_BATCH: usize = 256;

    fn core(&mut self) -> &mut TaskCore<Command, Lock, PgConnection> {
        &mut self.core
    }

    /// Runs a batch of commands: all grants as one statement, then all releases as
    /// one, then all extends with one proof of life, then the rest in order.
    ///
    /// Reordering is safe: a release that compensates a grant comes after it (grants
    /// go first), and a key is never granted while a release of it by this client is
    /// pending (the client reserves a key until its unlock has run).
    async fn process(&mut self, batch: Vec<Command>) -> Result<(), End> {
        self.run_batch(batch).await
    }

    async fn expire(&mut self, owners: Vec<u128>) -> Result<(), End> {
        self.unlock(owners, Vec::new()).await
    }

    async fn ping(&mut self) -> Result<(), End> {
        let sql = self.settings.sql.ping;
        self.trip(move |c| {
            Box::pin(async move { sqlx::query_scalar::<_, i32>(sql).fetch_one(c).await })
        })
        .await
        .or_end("heartbeat")
        .map(|_| ())
    }

    fn forget(&mut self, owner: u128) {
        self.forget_held(owner);
    }

    fn refuse(&mut self, command: Command) {
        self.forget_command(&command);
        command.fail(Failure::Closed);
    }

    async fn close(conn: PgConnection) {
        let _ = conn.close().await;
    }
}

impl Task {
    /// A connection error of this session: `why`, at the server's address.
    fn broken(&self, why: impl Into<String>) -> LockError {
        self.settings.connection_error(why)
    }

    /// Runs one statement, bounded by the request timeout; marks held leases suspect
    /// while the reply is late.
    async fn trip<T, F>(&mut self, run: F) -> Trip<T>
    where
        F: for<'c> FnOnce(
            &'c mut PgConnection,
        ) -> std::pin::Pin<
            Box<dyn Future<Output = Result<T, sqlx::Error>> + Send + 'c>,
        >,
    {
        let limit = self.settings.config.request_timeout;
        self.core.trip(limit, run, ends_session).await
    }

    async fn run_batch(&mut self, batch: Vec<Command>) -> Result<(), End> {
        let (mut grants, mut releases, mut extends, mut others) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for command in batch {
            match command {
                Command::TryGrant { .. } => grants.push(command),
                Command::Lease(LeaseCommand::Release { .. }) => releases.push(command),
                Command::Lease(LeaseCommand::Extend { .. }) => extends.push(command),
                _ => others.push(command),
            }
        }
        let mut groups = [grants, releases, extends]
            .into_iter()
            .filter(|g| !g.is_empty());
        let mut others = others.into_iter();
        loop {
            let result = if let Some(group) = groups.next() {
                match group.first() {
                    Some(Command::TryGrant { .. }) => self.try_grants(group).await,
                    Some(Command::Lease(LeaseCommand::Release { .. })) => {
                        self.releases(group).await
                    }
                    _ => self.extends(group).await,
                }
            } else if let Some(command) = others.next() {
                match command {
                    Command::HeldByAnyone { probe, reply } => {
                        self.held_by_anyone(probe, reply).await
                    }
                    Command::Leader { name, hash, reply } => {
                        self.read_leader(name, hash, reply).await
                    }
                    command => self.wait(command).await,
                }
            } else {
                return Ok(());
            };
            if let Err(end) = result {
                let why = match &end {
                    End::Broken(why) => why.clone(),
                    _ => "the session closed".to_owned(),
                };
                for command in groups.flatten().chain(others) {
                    self.forget_command(&command);
                    command.fail(Failure::Lock(self.broken(why.clone())));
                }
                return Err(end);
            }
        }
    }

    /// Undoes the client's bookkeeping for a grant that will not happen.
    fn forget_command(&self, command: &Command) {
        if let Command::TryGrant { hash, owner, .. } = command {
            self.forget_pending(*hash, *owner);
        }
    }

    fn forget_pending(&self, hash: i64, owner: u128) {
        if let Some(client) = self.client.upgrade() {
            client.forget_shared_key(hash, owner);
        }
    }

    /// Records a grant and hands it to its caller; unlocks at once if the caller left.
    async fn grant(&mut self, grant: NewGrant, reply: Reply<Option<Granted>>) -> Result<(), End> {
        let NewGrant {
            hash,
            owner,
            token,
            lease_start,
            ttl,
            slot,
            unlock_all,
            seat,
        } = grant;
        let registered = self.core.register(owner);
        let lock = Lock {
            hash,
            unlock_all,
            seat: None,
        };
        let monitor = self.core.leases.insert(owner, lease_start, ttl, slot, lock);
        if let Some(seat) = seat.filter(|_| registered && !reply.is_closed()) {
            // The leader's row, in this session, before anyone is told it leads.
            match self.seat(&seat, token).await {
                Trip::Done(()) => {
                    if let Some(held) = self.core.leases.get_mut(owner) {
                        held.lock.seat = Some((seat, token));
                    }
                }
                Trip::Refused(e) => {
                    let _ = reply.send(Err(Failure::Lock(lock_error(e))));
                    return self.unlock(vec![owner], Vec::new()).await;
                }
                Trip::Broken(why) => {
                    let _ = reply.send(Err(Failure::Lock(self.broken(why.clone()))));
                    return Err(End::Broken(why));
                }
            }
        }
        let granted = Granted {
            // The sequence starts at 1 (MINVALUE 1), so the token is positive.
            token: token.unsigned_abs(),
            acquired_at: lease_start,
            monitor,
        };
        if !registered || reply.send(Ok(Some(granted))).is_err() {
            // Nobody will ever release it: undo the grant now.
            self.unlock(vec![owner], Vec::new()).await?;
        }
        Ok(())
    }

    async fn try_grants(&mut self, group: Vec<Command>) -> Result<(), End> {
        // A try whose caller went away while it was queued is never sent: its key is
        // not granted at all, rather than granted late and then released. (One whose
        // caller leaves while it is on the wire is undone in `grant`.)
        let group: Vec<Command> = group
            .into_iter()
            .filter(|command| match command {
                Command::TryGrant {
                    hash, owner, reply, ..
                } if reply.is_closed() => {
                    self.forget_pending(*hash, *owner);
                    false
                }
                _ => true,
            })
            .collect();
        if group.is_empty() {
            return Ok(());
        }
        let hashes: Vec<i64> = group
            .iter()
            .filter_map(|c| match c {
                Command::TryGrant { hash, .. } => Some(*hash),
                _ => None,
            })
            .collect();
        let sql = self.settings.clone();
        let batch = hashes.clone();
        let outcome = self
            .trip(move |c| {
                Box::pin(async move {
                    match batch[..] {
                        [hash] => sqlx::query_scalar::<_, Option<i64>>(&sql.sql.try_grant_one)
                            .bind(hash)
                            .fetch_one(c)
                            .await
                            .map(|token| vec![(hash, token)]),
                        _ => {
                            sqlx::query_as::<_, (i64, Option<i64>)>(&sql.sql.try_grant)
                                .bind(batch)
                                .fetch_all(c)
                                .await
                        }
                    }
                })
            })
            .await;
        let (tokens, failure) = match outcome {
            Trip::Done(rows) => (
                rows.into_iter().collect::<HashMap<i64, Option<i64>>>(),
                None,
            ),
            Trip::Refused(e) => {
                // Keys granted before the error would be held by nobody: unlock them.
                let cleanup = self.unlock_any_held(hashes).await;
                (HashMap::new(), Some((lock_error(e), cleanup)))
            }
            Trip::Broken(why) => (
                HashMap::new(),
                Some((self.broken(why.clone()), Err(End::Broken(why)))),
            ),
        };
        if let Some((error, cleanup)) = failure {
            let mut group = group.into_iter();
            let last = group.next_back();
            for command in group {
                self.forget_command(&command);
                command.fail(Failure::Lock(copy_error(&error)));
            }
            if let Some(command) = last {
                self.forget_command(&command);
                command.fail(Failure::Lock(error));
            }
            return cleanup;
        }
        for command in group {
            let Command::TryGrant {
                hash,
                owner,
                ttl,
                requested_at,
                seat,
                reply,
            } = command
            else {
                continue;
            };
            match tokens.get(&hash).copied().flatten() {
                Some(token) => {
                    self.grant(
                        NewGrant {
                            hash,
                            owner,
                            token,
                            lease_start: requested_at,
                            ttl,
                            slot: None,
                            unlock_all: false,
                            seat,
                        },
                        reply,
                    )
                    .await?
                }
                None => {
                    self.forget_pending(hash, owner);
                    let _ = reply.send(Ok(None));
                }
            }
        }
        Ok(())
    }

    /// After a failed statement: unlocks whichever of `hashes` this session holds.
    async fn unlock_any_held(&mut self, hashes: Vec<i64>) -> Result<(), End> {
        let fallback = hashes.clone();
        let sql = self.settings.sql.unlock_any_held;
        match self
            .trip(move |c| {
                Box::pin(async move {
                    sqlx::query_as::<_, (i64, bool)>(sql)
                        .bind(hashes)
                        .fetch_all(c)
                        .await
                })
            })
            .await
        {
            Trip::Done(_) => return Ok(()),
            Trip::Refused(e) => {
                tracing::debug!(error = %e, "pg_locks unreadable; unlocking every key of the failed statement");
            }
            Trip::Broken(why) => return Err(End::Broken(why)),
        }
        // None of `hashes` was held by this session before the failed statement, so
        // unlocking each is right (the server warns about those it did not grant).
        let sql = self.settings.sql.unlock;
        match self
            .trip(move |c| {
                Box::pin(async move {
                    sqlx::query_as::<_, (i64, bool)>(sql)
                        .bind(fallback)
                        .fetch_all(c)
                        .await
                })
            })
            .await
        {
            Trip::Done(_) => Ok(()),
            // Cannot tell what the session holds: end it, which ends its locks.
            Trip::Refused(e) => Err(End::Broken(format!(
                "could not clean up after an error: {e}"
            ))),
            Trip::Broken(why) => Err(End::Broken(why)),
        }
    }

    /// `pg_advisory_unlock_all`: ends every advisory lock of the session. A session
    /// whose locks cannot be told apart any more is ended, which ends them too.
    async fn unlock_everything(&mut self) -> Result<(), End> {
        let sql = self.settings.sql.unlock_all;
        match self
            .trip(move |c| Box::pin(async move { sqlx::query(sql).execute(c).await.map(|_| ()) }))
            .await
        {
            Trip::Done(()) => Ok(()),
            Trip::Refused(e) => Err(End::Broken(format!("unlock refused: {e}"))),
            Trip::Broken(why) => Err(End::Broken(why)),
        }
    }

    /// Unlocks the held leases of `owners` (those still held), replying `true` to the
    /// matching `replies`; marks them lost and forgets them.
    async fn unlock(
        &mut self,
        owners: Vec<u128>,
        replies: Vec<(u128, Reply<bool>)>,
    ) -> Result<(), End> {
        let (whole, owners): (Vec<u128>, Vec<u128>) = owners
            .into_iter()
            .filter(|o| self.core.leases.contains(*o))
            .partition(|o| self.core.leases.get(*o).is_some_and(|h| h.lock.unlock_all));
        // Leaders' rows go first, while their locks still hold.
        let mut result = self.unseat(owners.iter().chain(&whole)).await;
        // A dedicated session's only grant: everything the session holds is that grant.
        if result.is_ok() && !whole.is_empty() {
            result = self.unlock_everything().await;
        }
        let hashes: Vec<i64> = owners
            .iter()
            .filter_map(|o| self.core.leases.get(*o))
            .map(|h| h.lock.hash)
            .collect();
        let unlocked: HashMap<i64, bool> = if hashes.is_empty() || result.is_err() {
            HashMap::new()
        } else {
            let (many, one) = (self.settings.sql.unlock, self.settings.sql.unlock_one);
            match self
                .trip(move |c| {
                    Box::pin(async move {
                        match hashes[..] {
                            [hash] => {
                                sqlx::query_as::<_, (i64, bool)>(one)
                                    .bind(hash)
                                    .fetch_all(c)
                                    .await
                            }
                            _ => {
                                sqlx::query_as::<_, (i64, bool)>(many)
                                    .bind(hashes)
                                    .fetch_all(c)
                                    .await
                            }
                        }
                    })
                })
                .await
            {
                Trip::Done(rows) => rows.into_iter().collect(),
                Trip::Refused(e) => {
                    let why = format!("unlock refused: {e}");
                    result = Err(End::Broken(why));
                    HashMap::new()
                }
                Trip::Broken(why) => {
                    result = Err(End::Broken(why));
                    HashMap::new()
                }
            }
        };
        if let Err(End::Broken(why)) = &result {
            for (_, reply) in replies {
                let _ = reply.send(Err(Failure::Lock(self.broken(why.clone()))));
            }
            return result;
        }
        let mut released = HashMap::new();
        let mut ended = Vec::new();
        for owner in whole {
            if let Some(held) = self.forget_held(owner) {
                released.insert(owner, true);
                ended.push(held);
            }
        }
        for owner in owners {
            if let Some(held) = self.forget_held(owner) {
                let was_held = unlocked.get(&held.lock.hash).copied().unwrap_or(false);
                if !was_held {
                    tracing::warn!(
                        hash = held.lock.hash,
                        "the session did not hold a lock it had been granted"
                    );
                }
                released.insert(owner, was_held);
                ended.push(held);
            }
        }
        for (owner, reply) in replies {
            let _ = reply.send(Ok(released.get(&owner).copied().unwrap_or(false)));
        }
        // Back on the idle list before the wait slot frees, so the next waiter finds
        // this session instead of opening another.
        self.core.return_if_idle();
        drop(ended);
        Ok(())
    }

    /// Forgets a held lease: marks it lost (it no longer is held) and removes it from
    /// the client's tables.
    fn forget_held(&mut self, owner: u128) -> Option<Held<Lock>> {
        let held = self.core.forget(owner)?;
        self.forget_pending(held.lock.hash, owner);
        Some(held)
    }

    async fn releases(&mut self, group: Vec<Command>) -> Result<(), End> {
        let mut owners = Vec::new();
        let mut replies = Vec::new();
        for command in group {
            let Command::Lease(LeaseCommand::Release { owner, reply }) = command else {
                continue;
            };
            if self.core.leases.contains(owner) {
                owners.push(owner);
                if let Some(reply) = reply {
                    replies.push((owner, reply));
                }
            } else if let Some(reply) = reply {
                let _ = reply.send(Ok(false));
            }
        }
        if owners.is_empty() {
            return Ok(());
        }
        self.unlock(owners, replies).await
    }

    async fn extends(&mut self, group: Vec<Command>) -> Result<(), End> {
        let mut live = Vec::new();
        let mut lost = Vec::new();
        for command in group {
            let Command::Lease(LeaseCommand::Extend { owner, ttl, reply }) = command else {
                continue;
            };
            if !self.core.leases.contains(owner) {
                let _ = reply.send(Ok(None));
            } else if self.core.leases.is_lost(owner) {
                // Lost is final (the TTL ran out, or the session's horizon passed): the
                // lock must go, not be revived.
                lost.push(owner);
                let _ = reply.send(Ok(None));
            } else {
                live.push((owner, ttl, reply));
            }
        }
        if !lost.is_empty() {
            self.unlock(lost, Vec::new()).await?;
        }
        if live.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        if let Err(End::Broken(why)) = self.ping().await {
            for (_, _, reply) in live {
                let _ = reply.send(Err(Failure::Lock(self.broken(why.clone()))));
            }
            return Err(End::Broken(why));
        }
        let mut lapsed = Vec::new();
        for (owner, ttl, reply) in live {
            match self.core.leases.extend(owner, started, ttl) {
                Extension::NotHeld => {
                    let _ = reply.send(Ok(None));
                }
                Extension::Lapsed => {
                    lapsed.push(owner);
                    let _ = reply.send(Ok(None));
                }
                Extension::Extended(valid_until) => {
                    let _ = reply.send(Ok(Some(valid_until)));
                }
            }
        }
        if !lapsed.is_empty() {
            self.unlock(lapsed, Vec::new()).await?;
        }
        Ok(())
    }

    /// Writes `seat` as its election's leader in `term`, as this session.
    async fn seat(&mut self, seat: &Arc<Seat>, term: i64) -> Trip<()> {
        let seat = seat.clone();
        let settings = self.settings.clone();
        self.trip(move |c| {
            Box::pin(async move {
                sqlx::query(&settings.sql.seat)
                    .bind(seat.name.as_str())
                    .bind(seat.candidate.as_slice())
                    .bind(term)
                    .execute(c)
                    .await
                    .map(|_| ())
            })
        })
        .await
    }

    /// Deletes the leader rows of those of `owners` that lead an election. A row that
    /// cannot be deleted ends the session: a row of this session must never outlive
    /// its leadership while the session lives (see `Statements::leader`).
    async fn unseat(&mut self, owners: impl Iterator<Item = &u128>) -> Result<(), End> {
        let (names, terms): (Vec<String>, Vec<i64>) = owners
            .filter_map(|o| self.core.leases.get(*o)?.lock.seat.as_ref())
            .map(|(seat, term)| (seat.name.clone(), *term))
            .unzip();
        if names.is_empty() {
            return Ok(());
        }
        let settings = self.settings.clone();
        match self
            .trip(move |c| {
                Box::pin(async move {
                    sqlx::query(&settings.sql.unseat)
                        .bind(names)
                        .bind(terms)
                        .execute(c)
                        .await
                        .map(|_| ())
                })
            })
            .await
        {
            Trip::Done(()) => Ok(()),
            Trip::Refused(e) => Err(End::Broken(format!(
                "could not delete an election's leader row: {e}"
            ))),
            Trip::Broken(why) => Err(End::Broken(why)),
        }
    }

    async fn read_leader(
        &mut self,
        name: String,
        hash: i64,
        reply: Reply<Option<(Vec<u8>, i64)>>,
    ) -> Result<(), End> {
        let (high, low) = pg_locks_ids(hash);
        let settings = self.settings.clone();
        let trip = self
            .trip(move |c| {
                Box::pin(async move {
                    sqlx::query_as::<_, (Vec<u8>, i64)>(&settings.sql.leader)
                        .bind(name)
                        .bind(high)
                        .bind(low)
                        .fetch_optional(c)
                        .await
                })
            })
            .await;
        trip.answer(reply, lock_error, |why| self.broken(why))
    }

    async fn held_by_anyone(&mut self, probe: Probe, reply: Reply<bool>) -> Result<(), End> {
        let sql = self.settings.sql.held_by_anyone;
        let trip = self
            .trip(move |c| {
                Box::pin(async move {
                    sqlx::query_scalar::<_, bool>(sql)
                        .bind(probe.classid)
                        .bind(probe.objid)
                        .bind(probe.objsubid)
                        .fetch_one(c)
                        .await
                })
            })
            .await;
        trip.answer(reply, lock_error, |why| self.broken(why))
    }

    /// Waits in the server's queue. If the caller goes away meanwhile, the session is
    /// abandoned (closed), which ends the wait, or the lock if it was just granted.
    async fn wait(&mut self, command: Command) -> Result<(), End> {
        let Command::Wait {
            hash,
            grab,
            owner,
            ttl,
            lock_timeout_ms,
            slot,
            seat,
            mut reply,
        } = command
        else {
            return Ok(());
        };
        if reply.is_closed() {
            // The caller went away while the wait was queued: never start it, so the
            // key is not granted late, and the session stays usable.
            self.core.return_if_idle();
            drop(slot);
            return Ok(());
        }
        let started = Instant::now();
        let shared = self.settings.clone();
        let limit = match lock_timeout_ms {
            _ if !grab.waits() => Some(shared.config.request_timeout),
            0 => None,
            ms => Some(Duration::from_millis(ms) + shared.config.request_timeout),
        };
        let unlock_all = !matches!(grab, Grab::Exclusive);
        let Some(conn) = self.core.conn_mut() else {
            let _ = reply.send(Err(Failure::Closed));
            return Err(End::Broken("the session was abandoned".into()));
        };
        let query = grab_query(&shared, conn, &grab, hash, lock_timeout_ms);
        let bounded = async {
            match limit {
                Some(limit) => timeout(limit, query).await.ok(),
                None => Some(query.await),
            }
        };
        let outcome = tokio::select! {
            outcome = bounded => outcome,
            _ = reply.closed() => {
                // Mid-statement: the connection cannot be reused. Closing it makes the
                // server drop the wait (or the lock, if it was granted meanwhile).
                self.core.abandon();
                self.end_abandoned_wait();
                return Err(End::Broken("the waiting caller went away".into()));
            }
        };
        match outcome {
            Some(Ok(Answer {
                other_count: Some(other),
                ..
            })) => {
                let other = u32::try_from(other).unwrap_or(u32::MAX);
                let _ = reply.send(Err(Failure::Mismatch(other)));
                self.core.return_if_idle();
                drop(slot);
                Ok(())
            }
            Some(Ok(Answer { token: None, .. })) => {
                let _ = reply.send(Ok(None));
                self.core.return_if_idle();
                drop(slot);
                Ok(())
            }
            Some(Ok(Answer {
                token: Some(token),
                waited,
                ..
            })) => {
                // The server's idle clock starts after the grant, which came `waited`
                // seconds into the statement: charge the lease from there.
                let waited =
                    Duration::try_from_secs_f64(waited.max(0.0) * 0.99).unwrap_or_default();
                let granted_at = (started + waited).min(Instant::now());
                self.core.leases.note_proof(granted_at);
                self.grant(
                    NewGrant {
                        hash,
                        owner,
                        token,
                        lease_start: granted_at,
                        ttl,
                        slot: Some(slot),
                        unlock_all,
                        seat,
                    },
                    reply,
                )
                .await
            }
            Some(Err(e)) if sqlstate(&e) == Some(LOCK_TIMEOUT) => {
                // The lock may have been granted just as the timeout fired.
                let checked = Instant::now();
                let (high, low) = pg_locks_ids(hash);
                let trip = self
                    .trip(move |c| {
                        Box::pin(async move {
                            sqlx::query_scalar::<_, Option<i64>>(&shared.sql.granted_after_timeout)
                                .bind(high)
                                .bind(low)
                                .fetch_one(c)
                                .await
                        })
                    })
                    .await;
                match trip {
                    Trip::Done(Some(token)) => {
                        self.grant(
                            NewGrant {
                                hash,
                                owner,
                                token,
                                lease_start: checked,
                                ttl,
                                slot: Some(slot),
                                unlock_all,
                                seat,
                            },
                            reply,
                        )
                        .await
                    }
                    Trip::Done(None) => {
                        let _ = reply.send(Ok(None));
                        self.core.return_if_idle();
                        drop(slot);
                        Ok(())
                    }
                    Trip::Refused(e) => {
                        let _ = reply.send(Err(Failure::Lock(lock_error(e))));
                        Err(End::Broken(
                            "could not check pg_locks after a lock timeout".into(),
                        ))
                    }
                    Trip::Broken(why) => {
                        let _ = reply.send(Err(Failure::Lock(self.broken(why.clone()))));
                        Err(End::Broken(why))
                    }
                }
            }
            Some(Err(e)) if ends_session(&e) => {
                let why = format!("the session ended while waiting: {e}");
                let _ = reply.send(Err(Failure::Lock(lock_error(e))));
                Err(End::Broken(why))
            }
            Some(Err(e)) => {
                // Refused for another reason: make sure nothing stayed held.
                let _ = reply.send(Err(Failure::Lock(lock_error(e))));
                if unlock_all {
                    self.unlock_everything().await?;
                } else {
                    self.unlock_any_held(vec![hash]).await?;
                }
                self.core.return_if_idle();
                drop(slot);
                Ok(())
            }
            None => {
                self.core.abandon();
                self.end_abandoned_wait();
                let why =
                    "the server did not end the wait within lock_timeout plus the request timeout";
                let _ = reply.send(Err(Failure::Lock(self.broken(why))));
                Err(End::Broken(why.into()))
            }
        }
    }

    /// Terminates this dedicated session's server process from another connection, in
    /// the background. A server blocked in a lock wait notices its client's closed
    /// connection only at its next `client_connection_check_interval`, and until then
    /// its queued request holds back later requests that conflict with it: readers
    /// behind an abandoned writer. Matched on the process's start time as well as its
    /// pid, so a reused pid is never hit.
    fn end_abandoned_wait(&self) {
        let Some((pid, started)) = self.backend.clone() else {
            return;
        };
        let settings = self.settings.clone();
        tokio::spawn(async move {
            let limit = settings.config.request_timeout;
            let Ok(mut conn) = connect(&settings.connect, limit).await else {
                return;
            };
            let terminate = sqlx::query(TERMINATE_BACKEND)
                .bind(pid)
                .bind(started)
                .execute(&mut conn);
            // Best effort: the server's own check of the closed connection is the backstop.
            if let Ok(Err(e)) = timeout(limit, terminate).await {
                tracing::debug!(error = %e, "could not end an abandoned wait's session");
            }
            let _ = timeout(limit, conn.close()).await;
        });
    }
}

/// What a dedicated session's grant statement answered.
struct Answer {
    /// The fencing token, or `None` when the key (every slot) was held.
    token: Option<i64>,
    /// Seconds the statement waited on the server before the grant.
    waited: f64,
    /// A permit try's finding: the semaphore is in use with this other count.
    other_count: Option<i64>,
}

/// The statement of `grab` on `hash`, run on `conn`.
fn grab_query<'c>(
    settings: &'c Settings,
    conn: &'c mut PgConnection,
    grab: &Grab,
    hash: i64,
    lock_timeout_ms: u64,
) -> std::pin::Pin<Box<dyn Future<Output = Result<Answer, sqlx::Error>> + Send + 'c>> {
    let sql = &settings.sql;
    match grab {
        Grab::Exclusive | Grab::SharedWait => {
            let statement = match grab {
                Grab::Exclusive => &sql.wait_grant,
                _ => &sql.wait_grant_shared,
            };
            Box::pin(async move {
                let (token, waited) = sqlx::query_as::<_, (i64, f64)>(statement)
                    .bind(hash)
                    .bind(lock_timeout_ms.to_string())
                    .fetch_one(conn)
                    .await?;
                Ok(Answer {
                    token: Some(token),
                    waited,
                    other_count: None,
                })
            })
        }
        Grab::SharedTry => Box::pin(async move {
            let (token, waited) = sqlx::query_as::<_, (Option<i64>, f64)>(&sql.try_grant_shared)
                .bind(hash)
                .fetch_one(conn)
                .await?;
            Ok(Answer {
                token,
                waited,
                other_count: None,
            })
        }),
        Grab::PermitTry {
            count_key,
            max,
            slots,
        } => {
            let (count_key, slots) = (*count_key, slots.clone());
            // Bounded by MAX_PERMITS, far below i32::MAX.
            let max = i32::try_from(*max).unwrap_or(i32::MAX);
            Box::pin(async move {
                let (token, other_count) =
                    sqlx::query_as::<_, (Option<i64>, Option<i64>)>(&sql.permit_try)
                        .bind(count_key)
                        .bind(max)
                        .bind(slots)
                        .fetch_one(conn)
                        .await?;
                Ok(Answer {
                    token,
                    waited: 0.0,
                    other_count,
                })
            })
        }
    }
}

/// A fresh copy of `error` for one more caller of a failed batch.
fn copy_error(error: &LockError) -> LockError {
    match error {
        LockError::Backend { source, .. } => match source.downcast_ref::<LockTableFull>() {
            Some(full) => LockError::backend_error(POSTGRES_BACKEND, full.clone()),
            None => LockError::backend_error(POSTGRES_BACKEND, source.to_string()),
        },
        LockError::Connection { source, .. } => {
            LockError::connection(POSTGRES_BACKEND, source.to_string())
        }
        LockError::Transient { source, .. } => {
            LockError::transient(POSTGRES_BACKEND, source.to_string())
        }
        other => LockError::backend_error(POSTGRES_BACKEND, other.to_string()),
    }
}
