//! One lease of the transaction-pooling design ([`crate::PoolMode::Transaction`]): a
//! transaction kept open on one pooled connection for the lease's life, holding a
//! transaction-scoped advisory lock, and the task that owns it.
//!
//! A transaction pooler pins a server connection to a client connection while a
//! transaction is open, so the lock (which the server keeps until the transaction
//! ends) stays on the server connection this task talks to, and no other client's
//! statements run there meanwhile. The task:
//! - ends the lease with `ROLLBACK` at its release or TTL (the connection, clean again,
//!   goes back to the client's pool);
//! - proves the transaction alive with a round trip every heartbeat, which also keeps
//!   the server's `idle_in_transaction_session_timeout` from ending it; a frozen,
//!   paused or cut-off holder stops doing so and the server ends its transaction, and
//!   lock, at most `session_timeout` after its last round trip;
//! - marks the lease lost when a round trip fails (the pooler or server closed the
//!   connection, which ended the transaction and its lock), and closes that connection.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use distlock_api::backend::prelude::*;
use distlock_api::{LeaseMonitor, LockError};
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgPool;
use sqlx::Postgres;
use tokio::sync::{mpsc, oneshot, OnceCell};
use tokio::time::{sleep_until, timeout, Instant};

use crate::client::locked;
use crate::config::PostgresConfig;
use crate::error::lock_error;
use crate::xact_sql::{run, run_on, XactSql};
use crate::POSTGRES_BACKEND;

/// A TTL timer that fires this late shows that the whole process was paused or
/// starved (see the session design's `PAUSED_LATENESS`).
const PAUSED_LATENESS: Duration = Duration::from_secs(1);
/// After such a pause, how long the rollback at the TTL waits for the holder's own
/// release, which then finds its lock still held: nobody else held it meanwhile.
const PAUSE_GRACE: Duration = Duration::from_secs(1);

/// What the holders of one transaction-pooling client share.
pub(crate) struct XactState {
    pub config: PostgresConfig,
    /// The server's (or pooler's) `host:port`, for messages.
    pub address: String,
    pub sql: XactSql,
    /// Connections for the leases' transactions (and waits): one each.
    pub locks: PgPool,
    /// Connections for short statements beside them: tokens, leader rows, look-ups.
    pub control: PgPool,
    /// Owner token of every held lease → its task.
    pub holders: Mutex<HashMap<u128, mpsc::UnboundedSender<Command>>>,
    /// Set once the election table is known to exist.
    pub election_table: OnceCell<()>,
}

impl XactState {
    /// A connection error with a message of ours, at the server's address.
    pub(crate) fn connection_error(&self, why: impl Into<String>) -> LockError {
        LockError::connection_at(POSTGRES_BACKEND, &self.address, why.into())
    }

    /// The task holding `owner`'s lease, if it still runs.
    pub(crate) fn holder(&self, owner: u128) -> Option<mpsc::UnboundedSender<Command>> {
        locked(&self.holders).get(&owner).cloned()
    }
}

/// A request to a lease's task.
#[derive(Debug)]
pub(crate) enum Command {
    /// End the lease (unseat a leader, then roll back).
    Release {
        reply: oneshot::Sender<Result<(), LockError>>,
    },
    /// Prove the transaction alive and hold the lease `ttl` from now: the new validity
    /// deadline, or `None` when the lease already ran out.
    Extend {
        ttl: Duration,
        reply: oneshot::Sender<Result<Option<Instant>, LockError>>,
    },
}

/// A grant just made: its open transaction and lease.
pub(crate) struct Pinned {
    pub conn: PoolConnection<Postgres>,
    pub owner: u128,
    pub monitor: LeaseMonitor,
    pub ttl_deadline: Instant,
    /// When the last round trip on the transaction started.
    pub last_proof: Instant,
    /// A leadership's election name and term, whose row is deleted at the end.
    pub seat: Option<(String, i64)>,
}

/// The validity deadline of a lease: its TTL deadline, or the server's idle cut-off
/// after the last proof of life, whichever is first.
pub(crate) fn validity(config: &PostgresConfig, ttl_deadline: Instant, proof: Instant) -> Instant {
    ttl_deadline.min(proof + config.timing().horizon)
}

/// Starts the task of `pinned`, registered under its owner token.
pub(crate) fn spawn(state: &Arc<XactState>, pinned: Pinned) {
    let (tx, rx) = mpsc::unbounded_channel();
    locked(&state.holders).insert(pinned.owner, tx);
    let task = Task {
        conn: Some(pinned.conn),
        owner: pinned.owner,
        monitor: pinned.monitor,
        ttl_deadline: pinned.ttl_deadline,
        paused_past_ttl: false,
        last_proof: pinned.last_proof,
        seat: pinned.seat,
        state: Arc::downgrade(state),
        config: state.config.clone(),
    };
    tokio::spawn(task.run(rx));
}

struct Task {
    /// `None` once the transaction ended.
    conn: Option<PoolConnection<Postgres>>,
    owner: u128,
    monitor: LeaseMonitor,
    ttl_deadline: Instant,
    /// The TTL ran out during a pause; the rollback waits for the holder's release.
    paused_past_ttl: bool,
    last_proof: Instant,
    seat: Option<(String, i64)>,
    /// Weak, so that dropping every handle of the client ends its leases.
    state: Weak<XactState>,
    config: PostgresConfig,
}

impl Task {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        let heartbeat = self.config.heartbeat();
        loop {
            let wake = self.ttl_deadline.min(self.last_proof + heartbeat);
            tokio::select! {
                command = rx.recv() => match command {
                    // The client is gone: its leases end with it.
                    None => {
                        self.monitor.mark_lost();
                        break;
                    }
                    Some(Command::Release { reply }) => {
                        let ended = self.end().await;
                        self.forget();
                        let _ = reply.send(ended);
                        return;
                    }
                    Some(Command::Extend { ttl, reply }) => {
                        if self.paused_past_ttl {
                            let _ = reply.send(Ok(None));
                            continue;
                        }
                        let sent = Instant::now();
                        match self.ping().await {
                            Ok(()) => {
                                self.last_proof = sent;
                                self.ttl_deadline = sent + ttl;
                                let valid = validity(&self.config, self.ttl_deadline, sent);
                                let held = self.monitor.renewed(valid);
                                let _ = reply.send(Ok(held.then_some(valid)));
                            }
                            Err(e) => {
                                self.monitor.mark_lost();
                                let _ = reply.send(Err(e));
                                break;
                            }
                        }
                    }
                },
                _ = sleep_until(wake) => {
                    let now = Instant::now();
                    if now >= self.ttl_deadline {
                        let late = now.saturating_duration_since(self.ttl_deadline);
                        self.monitor.mark_lost();
                        if !self.paused_past_ttl && late >= PAUSED_LATENESS {
                            self.paused_past_ttl = true;
                            self.ttl_deadline = now + PAUSE_GRACE;
                            continue;
                        }
                        break;
                    }
                    match self.ping().await {
                        Ok(()) => {
                            self.last_proof = now;
                            self.monitor
                                .renewed(validity(&self.config, self.ttl_deadline, now));
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "a Postgres lease's transaction broke; the lease is lost");
                            self.monitor.mark_lost();
                            break;
                        }
                    }
                }
            }
        }
        let _ = self.end().await;
        self.forget();
    }

    /// One round trip in the open transaction, bounded by the request timeout. A
    /// failure closes the connection (the transaction, and its lock, end with it).
    async fn ping(&mut self) -> Result<(), LockError> {
        let limit = self.config.request_timeout;
        let Some(conn) = self.conn.as_mut() else {
            return Err(crate::error::connection(
                "the lease's transaction has ended",
            ));
        };
        let outcome = timeout(limit, run(conn, "SELECT 1")).await;
        match outcome {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => {
                self.close();
                Err(lock_error(e))
            }
            Err(_) => {
                self.close();
                Err(crate::error::connection(format!(
                    "no answer within the request timeout of {limit:?} on a lease's transaction"
                )))
            }
        }
    }

    /// Closes the connection instead of returning it to the pool.
    fn close(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            conn.close_on_drop();
        }
    }

    /// Deletes a leader's row, then rolls the transaction back, ending the lock; the
    /// connection goes back to the pool if that worked, else it is closed (which ends
    /// the transaction on the server too).
    async fn end(&mut self) -> Result<(), LockError> {
        let limit = self.config.request_timeout;
        if let Some((name, term)) = self.seat.take() {
            if let Some(state) = self.state.upgrade() {
                let unseat = state.sql.unseat(&name, term);
                match timeout(limit, run_on(&state.control, &unseat)).await {
                    Ok(Ok(_)) => {}
                    // A stale row never reads as leader (its process no longer holds
                    // the election's lock), and the next leader overwrites it.
                    Ok(Err(e)) => tracing::debug!(error = %e, "could not delete a leader row"),
                    Err(_) => tracing::debug!("no answer deleting a leader row"),
                }
            }
        }
        let Some(mut conn) = self.conn.take() else {
            return Err(crate::error::connection(
                "the lease's transaction had already ended",
            ));
        };
        match timeout(limit, run(&mut conn, "ROLLBACK")).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => {
                conn.close_on_drop();
                Err(lock_error(e))
            }
            Err(_) => {
                conn.close_on_drop();
                Err(crate::error::connection(format!(
                    "no answer to ROLLBACK within {limit:?}; the connection was closed, which \
                     ends the transaction and its lock"
                )))
            }
        }
    }

    fn forget(&self) {
        if let Some(state) = self.state.upgrade() {
            locked(&state.holders).remove(&self.owner);
        }
    }
}
