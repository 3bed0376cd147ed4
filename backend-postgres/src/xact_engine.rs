//! [`PostgresXactLock`] as an [`Engine`]: the transaction-pooling design
//! ([`crate::PoolMode::Transaction`]), for every primitive.
//!
//! An acquire takes a connection of the client's lock pool, begins a transaction and
//! tries the claim's advisory lock in it (`pg_try_advisory_xact_lock`, one round trip
//! with `BEGIN`); while the key is held it waits in the server's queue in the same
//! transaction (`pg_advisory_xact_lock` under `SET LOCAL lock_timeout`, the time
//! left), or for a permit tries again at the options' backoff. A grant then takes its
//! fencing token in a short transaction of its own on a control connection (committed
//! with `synchronous_commit = on` before it is handed out), a leadership writes its
//! leader row there too, and the transaction, still open, passes to the lease's task
//! (`pinned`) until release or TTL.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::backend::{unanswered_message, Claim, Engine, Grant, Request};
use distlock_api::backend::{MonitorWriter, NewLease};
use distlock_api::{
    BackendInfo, Candidate, Capabilities, Client, DistributedLock, DistributedRwLock,
    DistributedSemaphore, ExtendOutcome, FencingToken, KeyStatus, Leader, LeaderElection, Lease,
    LeaseMonitor, LockError, LockKey, OwnerToken, PermitMismatch, Primitive, ReleaseOutcome,
    RwMode, NOT_YET,
};
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgRow;
use sqlx::{Connection as _, Postgres, Row as _};
use tokio::sync::oneshot;
use tokio::time::{sleep_until, timeout, timeout_at, Instant};

use crate::election::leader_of;
use crate::engine::{capabilities_bound_by, probe};
use crate::error::{lock_error, sqlstate};
use crate::keys::{
    advisory_key, election_advisory_key, permit_count_key, permit_slot_key, rw_advisory_key,
};
use crate::mailbox::Probe;
use crate::pinned::{self, validity, Command, Pinned, XactState};
use crate::sql::ensure_election_table;
use crate::xact_sql::{run, run_on, XactGrab};
use crate::{PostgresXactLock, POSTGRES_BACKEND};

/// Why no lease outlives its client: every grant is an open transaction of it.
const TRANSACTION_BOUND: &str = "a lock lives in its client's open transaction: the server \
     ends it when the client closes or its process exits, whatever the TTL left";

/// SQLSTATE lock_not_available: `lock_timeout` fired.
const LOCK_TIMEOUT: &str = "55P03";

/// What each primitive guarantees in this design: as the session design's (tokens from
/// the sequence, leases enforced by the client and bounded by the transaction, waits
/// in the server's queue, permits polled).
fn capabilities() -> Capabilities {
    capabilities_bound_by(TRANSACTION_BOUND)
}

/// Closes a pooled connection when dropped armed: a transaction cut short (an acquire
/// dropped mid-statement, a statement that failed oddly) ends on the server with its
/// lock, instead of going back to the pool in an unknown state.
struct Armed(Option<PoolConnection<Postgres>>);

impl Armed {
    fn conn(&mut self) -> Result<&mut PoolConnection<Postgres>, LockError> {
        self.0
            .as_mut()
            .ok_or_else(|| crate::error::connection("the pooled connection went missing"))
    }

    /// Hands the connection over, disarmed.
    fn take(mut self) -> Option<PoolConnection<Postgres>> {
        self.0.take()
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        if let Some(mut conn) = self.0.take() {
            conn.close_on_drop();
        }
    }
}

/// What one attempt found.
enum Attempt {
    Granted(Grant),
    Held,
}

/// The claim's lock: its key, how it is taken, and whether it waits in the server's
/// queue (a permit polls instead).
struct Plan<'a> {
    hash: i64,
    grab: XactGrab,
    queues: bool,
    candidate: Option<&'a Candidate>,
}

impl PostgresXactLock {
    /// This client, for every primitive: each lease keeps one connection of the pool.
    pub fn client(&self) -> Client {
        Client::new(self.clone())
    }

    /// The mutex of this client (`self.client().lock()`).
    pub fn lock(&self) -> Arc<dyn DistributedLock> {
        self.client().lock()
    }

    /// The semaphore of this client; its waiters poll, so a FIFO wait is refused with
    /// [`LockError::Unsupported`].
    pub fn semaphore(&self) -> Arc<dyn DistributedSemaphore> {
        self.client().semaphore()
    }

    /// The read-write lock of this client, with the server's writer preference.
    pub fn rw_lock(&self) -> Arc<dyn DistributedRwLock> {
        self.client().rw_lock()
    }

    /// Leader election on this client.
    pub fn election(&self) -> Arc<dyn LeaderElection> {
        self.client().election()
    }

    fn state(&self) -> &Arc<XactState> {
        &self.state
    }

    /// A connection of the lock pool, waiting for one no later than `until`.
    async fn lock_connection(
        &self,
        until: Option<Instant>,
    ) -> Result<PoolConnection<Postgres>, LockError> {
        let state = self.state();
        let started = Instant::now();
        let acquire = state.locks.acquire();
        let acquired = match until {
            Some(until) => timeout_at(until, acquire).await.map_err(|_| {
                state.connection_error(format!(
                    "waited {:?} for a connection of this client's pool of {} (each held lock \
                     and each waiting acquire keeps one; raise PostgresConfig::wait_sessions)",
                    started.elapsed(),
                    state.config.wait_sessions
                ))
            })?,
            None => acquire.await,
        };
        acquired.map_err(|e| match e {
            sqlx::Error::PoolTimedOut => state.connection_error(format!(
                "waited {:?} for a connection of this client's pool of {} (each held lock and \
                 each waiting acquire keeps one; raise PostgresConfig::wait_sessions)",
                started.elapsed(),
                state.config.wait_sessions
            )),
            e => crate::error::connect_error(e, &state.address),
        })
    }

    /// Runs `sql` (plain text) on `conn`, returning its rows, within `until`; `what`
    /// names the wait in the error.
    async fn rows(
        &self,
        conn: &mut PoolConnection<Postgres>,
        sql: &str,
        until: Instant,
        what: &str,
    ) -> Result<Result<Vec<PgRow>, sqlx::Error>, LockError> {
        let started = Instant::now();
        timeout_at(until, run(conn, sql)).await.map_err(|_| {
            self.state().connection_error(format!(
                "no answer {what} within {:?}: the server is slow or unreachable, or the \
                     pooler has no server connection free (budget one per held lock and per \
                     waiter)",
                started.elapsed()
            ))
        })
    }

    /// A short statement on a control connection, within the request timeout.
    async fn control(&self, sql: &str) -> Result<Vec<PgRow>, LockError> {
        let state = self.state();
        let limit = state.config.request_timeout;
        timeout(limit, run_on(&state.control, sql))
            .await
            .map_err(|_| state.connection_error(format!("no answer within {limit:?}")))?
            .map_err(|e| match e {
                sqlx::Error::PoolTimedOut => {
                    state.connection_error(format!("no control connection within {limit:?}"))
                }
                e => lock_error(e),
            })
    }

    /// One attempt: begin, try, and wait in the server's queue if the plan does and
    /// the deadline allows.
    async fn attempt(&self, request: &Request<'_>, plan: &Plan<'_>) -> Result<Attempt, LockError> {
        let state = self.state();
        let config = &state.config;
        let waits = request.waits();
        // A try waits for a connection and an answer up to the request timeout; a wait
        // up to its deadline (which bounds the whole acquire, queueing included).
        let try_until = Instant::now() + config.request_timeout;
        let until = if waits {
            request.deadline
        } else {
            Some(try_until)
        };
        let mut conn = Armed(Some(self.lock_connection(until).await?));
        let sent = Instant::now();
        let answer = self
            .rows(
                conn.conn()?,
                &state.sql.begin_try(&plan.grab, plan.hash),
                until.unwrap_or(sent + Duration::from_secs(365 * 86_400)),
                "to the grant's first statement",
            )
            .await?
            .map_err(lock_error)?;
        let row = answer
            .last()
            .ok_or_else(|| LockError::backend_error(POSTGRES_BACKEND, "no row from a lock try"))?;
        let granted: Option<i64> = row.try_get(0).map_err(lock_error)?;
        let other_count: Option<i64> = row.try_get(1).map_err(lock_error)?;
        let pid: i32 = row.try_get(2).map_err(lock_error)?;
        if let Some(in_use) = other_count {
            self.roll_back(conn).await;
            let asked = match plan.grab {
                XactGrab::Permit { max, .. } => max,
                _ => 0,
            };
            return Err(LockError::PermitMismatch {
                backend: POSTGRES_BACKEND,
                source: PermitMismatch::new(
                    request.key.clone(),
                    asked,
                    u32::try_from(in_use).unwrap_or(u32::MAX),
                ),
            });
        }
        let mut lease_start = sent;
        if granted.is_none() {
            request.saw_held();
            let left = request
                .deadline
                .map(|d| d.saturating_duration_since(Instant::now()));
            if !plan.queues || !waits || left.is_some_and(|l| l.is_zero()) {
                self.roll_back(conn).await;
                return Ok(Attempt::Held);
            }
            // Round up, so the server gives up no earlier than the deadline; 0 is none.
            let lock_timeout_ms = left.map_or(0, |l| {
                u64::try_from(l.as_micros().div_ceil(1000))
                    .unwrap_or(u64::MAX)
                    .clamp(1, i32::MAX as u64)
            });
            let shared = matches!(plan.grab, XactGrab::Shared);
            let wait_sent = Instant::now();
            // The server ends the wait at lock_timeout; the caller cuts the acquire
            // at its deadline (dropping this future closes the connection).
            let wait = state.sql.wait(shared, plan.hash, lock_timeout_ms);
            let waited = run(conn.conn()?, &wait).await;
            match waited {
                Ok(rows) => {
                    let seconds: f64 = rows
                        .last()
                        .map(|r| r.try_get(0))
                        .transpose()
                        .map_err(lock_error)?
                        .unwrap_or(0.0);
                    let waited =
                        Duration::try_from_secs_f64(seconds.max(0.0) * 0.99).unwrap_or_default();
                    lease_start = (wait_sent + waited).min(Instant::now());
                }
                Err(e) if sqlstate(&e) == Some(LOCK_TIMEOUT) => {
                    self.roll_back(conn).await;
                    return Ok(Attempt::Held);
                }
                Err(e) => return Err(lock_error(e)),
            }
        }
        self.granted(request, plan, conn, pid, lease_start).await
    }

    /// Ends a refused attempt's transaction; the connection goes back to the pool, or
    /// is closed if the rollback fails.
    async fn roll_back(&self, mut conn: Armed) {
        let limit = self.state().config.request_timeout;
        let Ok(c) = conn.conn() else { return };
        if let Ok(Ok(_)) = timeout(limit, run(c, "ROLLBACK")).await {
            drop(conn.take());
        }
    }

    /// Takes the grant's token (and writes a leader's row), then hands the open
    /// transaction to the lease's task.
    async fn granted(
        &self,
        request: &Request<'_>,
        plan: &Plan<'_>,
        conn: Armed,
        pid: i32,
        lease_start: Instant,
    ) -> Result<Attempt, LockError> {
        let state = self.state();
        let token_rows = self.control(&state.sql.token()).await?;
        let token: i64 = token_rows
            .last()
            .ok_or_else(|| LockError::backend_error(POSTGRES_BACKEND, "no fencing token"))?
            .try_get(0)
            .map_err(lock_error)?;
        let seat = match plan.candidate {
            Some(candidate) => {
                let name = request.key.as_str().to_owned();
                self.control(&state.sql.seat(&name, candidate.as_bytes(), token, pid))
                    .await?;
                Some((name, token))
            }
            None => None,
        };
        let ttl = request.options.ttl();
        let ttl_deadline = lease_start + ttl;
        let monitor = <LeaseMonitor as MonitorWriter>::new(validity(
            &state.config,
            ttl_deadline,
            lease_start,
        ));
        let owner = OwnerToken::random();
        let lease = <Lease as NewLease>::new(
            request.key.clone(),
            owner,
            Some(FencingToken::new(token.unsigned_abs())),
            ttl,
            lease_start,
        );
        let Some(conn) = conn.take() else {
            return Err(crate::error::connection(
                "the pooled connection went missing",
            ));
        };
        pinned::spawn(
            state,
            Pinned {
                conn,
                owner: owner.as_u128(),
                monitor: monitor.clone(),
                ttl_deadline,
                last_proof: lease_start,
                seat,
            },
        );
        Ok(Attempt::Granted(Grant::new(lease, monitor)))
    }

    /// Whether anyone holds a lock matching `probe`.
    async fn held_by_anyone(&self, probe: Probe) -> Result<bool, LockError> {
        let rows = self
            .control(&self.state().sql.held_by_anyone(probe))
            .await?;
        rows.last()
            .ok_or_else(|| LockError::backend_error(POSTGRES_BACKEND, "no row from pg_locks"))?
            .try_get(0)
            .map_err(lock_error)
    }

    /// Creates the election table on first use, in a transaction of its own.
    async fn election_ready(&self) -> Result<(), LockError> {
        let state = self.state();
        state
            .election_table
            .get_or_try_init(|| async {
                let limit = state.config.request_timeout;
                let create = async {
                    let mut conn = state.control.acquire().await.map_err(lock_error)?;
                    let mut tx = conn.begin().await.map_err(lock_error)?;
                    ensure_election_table(&mut tx, &state.config.schema, self.statements()).await?;
                    tx.commit().await.map_err(lock_error)
                };
                timeout(limit, create).await.unwrap_or_else(|_| {
                    Err(state.connection_error(format!(
                        "no answer within {limit:?} while checking the election table"
                    )))
                })
            })
            .await
            .map(|_| ())
    }

    /// A lease's task, asked `command`; `None` when the lease has no task any more.
    async fn ask<T>(
        &self,
        lease: &Lease,
        command: impl FnOnce(oneshot::Sender<Result<T, LockError>>) -> Command,
    ) -> Option<Result<T, LockError>> {
        let holder = self.state().holder(lease.owner().as_u128())?;
        let (tx, rx) = oneshot::channel();
        holder.send(command(tx)).ok()?;
        rx.await.ok()
    }

    /// The outcome for a lease this client no longer holds.
    async fn not_held(&self, primitive: Primitive, lease: &Lease) -> Result<bool, LockError> {
        self.held_by_anyone(probe(primitive, lease.key())).await
    }
}

#[async_trait]
impl Engine for PostgresXactLock {
    fn info(&self) -> BackendInfo {
        BackendInfo::new(POSTGRES_BACKEND, capabilities())
    }

    /// Tries in a new transaction, then waits in the server's queue in it (a permit
    /// polls at the options' backoff). A dropped call closes the attempt's connection,
    /// which ends its transaction and anything it was granted.
    async fn acquire(&self, request: &Request<'_>) -> Result<Option<Grant>, LockError> {
        let key = request.key;
        let plan = match request.claim {
            Claim::Mutex => Plan {
                hash: advisory_key(key),
                grab: XactGrab::Exclusive,
                queues: true,
                candidate: None,
            },
            Claim::Rw(mode) => Plan {
                hash: rw_advisory_key(key),
                grab: match mode {
                    RwMode::Read => XactGrab::Shared,
                    _ => XactGrab::Exclusive,
                },
                queues: true,
                candidate: None,
            },
            Claim::Permit { max } => Plan {
                hash: permit_slot_key(key, 0),
                grab: XactGrab::Permit {
                    count_key: permit_count_key(key),
                    max,
                    slots: (0..max).map(|slot| permit_slot_key(key, slot)).collect(),
                },
                queues: false,
                candidate: None,
            },
            Claim::Lead(candidate) => {
                self.election_ready().await?;
                Plan {
                    hash: election_advisory_key(key),
                    grab: XactGrab::Exclusive,
                    queues: true,
                    candidate: Some(candidate),
                }
            }
            other => {
                return Err(LockError::Unsupported {
                    backend: POSTGRES_BACKEND,
                    operation: other.primitive().as_str(),
                    reason: NOT_YET,
                })
            }
        };
        let mut backoff = request.options.backoff().delays();
        loop {
            match self.attempt(request, &plan).await? {
                Attempt::Granted(grant) => return Ok(Some(grant)),
                Attempt::Held if plan.queues || !request.waits() => return Ok(None),
                Attempt::Held => {
                    let nap = Instant::now() + backoff.next_delay();
                    match request.deadline {
                        Some(deadline) if nap >= deadline => return Ok(None),
                        _ => sleep_until(nap).await,
                    }
                }
            }
        }
    }

    async fn release(
        &self,
        primitive: Primitive,
        lease: &Lease,
    ) -> Result<ReleaseOutcome, LockError> {
        match self.ask(lease, |reply| Command::Release { reply }).await {
            Some(Ok(())) => Ok(ReleaseOutcome::Released),
            Some(Err(e)) => Err(e),
            None => Ok(if self.not_held(primitive, lease).await? {
                ReleaseOutcome::HeldByOther
            } else {
                ReleaseOutcome::Expired
            }),
        }
    }

    async fn extend(
        &self,
        primitive: Primitive,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        match self
            .ask(lease, |reply| Command::Extend { ttl, reply })
            .await
        {
            Some(Ok(Some(valid_until))) => Ok(ExtendOutcome::Extended { valid_until }),
            Some(Err(e)) => Err(e),
            Some(Ok(None)) | None => Ok(if self.not_held(primitive, lease).await? {
                ExtendOutcome::HeldByOther
            } else {
                ExtendOutcome::Expired
            }),
        }
    }

    /// Held or free, per `pg_locks`; neither token nor remaining time is reported.
    async fn inspect(&self, key: &LockKey) -> Result<KeyStatus, LockError> {
        Ok(
            if self.held_by_anyone(Probe::key(advisory_key(key))).await? {
                KeyStatus::held()
            } else {
                KeyStatus::free()
            },
        )
    }

    /// The leader row while its server process holds the election's lock.
    async fn leader(&self, name: &LockKey) -> Result<Option<Leader>, LockError> {
        self.election_ready().await?;
        let sql = self
            .state()
            .sql
            .leader(name.as_str(), election_advisory_key(name));
        let rows = self.control(&sql).await?;
        let Some(row) = rows.last() else {
            return Ok(None);
        };
        let candidate: Vec<u8> = row.try_get(0).map_err(lock_error)?;
        let term: i64 = row.try_get(1).map_err(lock_error)?;
        leader_of(name, candidate, term).map(Some)
    }

    fn unanswered(&self, wait: Duration) -> LockError {
        self.state().connection_error(unanswered_message(wait))
    }
}
