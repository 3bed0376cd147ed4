//! [`PostgresElection`]: the [`LeaderElection`] over one session advisory lock per
//! election name, with the leader's identity in a table beside it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::backend::{check_campaign_request, leadership, WaitBound};
use distlock_api::{
    BackendInfo, Candidate, Capability, DistributedLock, ExtendOutcome, FencingToken, Leader,
    LeaderElection, Leadership, Lease, LockError, LockKey, LockOptions, ReleaseOutcome,
};
use sqlx::Connection as _;
use tokio::sync::OnceCell;
use tokio::time::{timeout, timeout_at};

use crate::keys::election_advisory_key;
use crate::lock::{lease_of, Grant, Plan, ANSWER_GRACE};
use crate::mailbox::{Probe, Seat};
use crate::session;
use crate::sql::ensure_election_table;
use crate::{PostgresLock, POSTGRES_BACKEND};

/// A leader-election client of the Postgres backend, made by
/// [`PostgresLock::election`]: sessions, leases, loss detection and fencing as the
/// mutex's (see the crate docs).
///
/// - **Leadership** is a session advisory lock on the name's election id (SHA-256 of `"distlock-election"`, a zero byte and the name: its own
///   key space, apart from the mutex's, semaphore's and read-write lock's ids of the
///   same name), granted as the mutex's is: a try on a shared session, then a wait in
///   the server's queue on a dedicated one. At most one leader per name while the
///   server runs; a resign hands the lock to the first waiting candidate inside the
///   server (woken by the server, FIFO, no polling).
/// - **Term**: the grant's token from the fencing sequence, taken after the lock in
///   the same statement, so terms rise strictly per name (and across names).
/// - **Identity**: before the campaign returns, the granting session writes the row
///   `(name, candidate, term, pid)` of the table `distlock.election` (created on the
///   first use of the handle if missing, as the sequence is), where `pid` is its
///   server process. [`LeaderElection::leader`] returns the row only while that process
///   holds the election's lock (per `pg_locks`), so the row of a leader whose session
///   ended (a crash, a cut connection, a server-side timeout) never reads as leader.
///   A resign (and the TTL's expiry) deletes the row, owner-checked by term, before
///   unlocking; a stale row is overwritten by the next leader. So the table holds at
///   most one row per election name ever led and not resigned: bounded by the live
///   names. [`Leader::remaining`] is `None`: the lease is the session's.
/// - **Loss and crashes**: as the mutex's. A crashed process's connection closes and
///   the next candidate leads at once; a silent or frozen one is cut off by the server
///   within [`crate::PostgresConfig::dead_holder_bound`] of its last round trip, and
///   learns it ([`Leadership::lost`]) by its validity deadline.
/// - **Observers**: [`LeaderElection::wait_change`] keeps the polling default (every
///   [`distlock_api::OBSERVE_POLL`]): the end of a crashed leader's session notifies
///   nobody, so a `LISTEN` would still need the poll, and one more connection.
///
/// Caveat: the process id in a row is recycled by the operating system. If a crashed
/// leader's pid comes back as the session of the next leader of the same name, that
/// leader reads as the old identity for the one round trip between its grant and its
/// row. Cloning gives another handle on the same client.
#[derive(Debug, Clone)]
pub struct PostgresElection {
    locks: PostgresLock,
    /// Set once the election table is known to exist.
    table: Arc<OnceCell<()>>,
}

impl PostgresElection {
    pub(crate) fn new(locks: PostgresLock) -> Self {
        PostgresElection {
            locks,
            table: Arc::default(),
        }
    }

    /// The mutex client whose sessions this one shares.
    pub fn client(&self) -> &PostgresLock {
        &self.locks
    }

    /// Creates the election table on first use, on a connection of its own.
    async fn ready(&self) -> Result<(), LockError> {
        self.table
            .get_or_try_init(|| async {
                let settings = self.locks.settings();
                let limit = settings.config.request_timeout;
                let mut conn = session::connect(&settings.connect, limit).await?;
                let created = timeout(
                    limit,
                    ensure_election_table(&mut conn, &settings.config.schema, &settings.sql),
                )
                .await
                .unwrap_or_else(|_| {
                    Err(settings.connection_error(format!(
                        "no answer within {limit:?} while checking the election table"
                    )))
                });
                let _ = timeout(limit, conn.close()).await;
                created
            })
            .await
            .map(|_| ())
    }

    /// [`ready`](Self::ready) within the campaign's wait (plus the answer grace), as
    /// the mutex's acquire bounds its session's connect: a campaign against a silent
    /// server returns within its wait, not after the request timeout.
    async fn ready_within(&self, options: &LockOptions) -> Result<(), LockError> {
        let bound = WaitBound::starting_now(options, ANSWER_GRACE);
        let cut = bound
            .deadline
            .filter(|d| *d > bound.started)
            .and_then(|d| Some((d - bound.started, d.checked_add(bound.grace)?)));
        match cut {
            None => self.ready().await,
            Some((wait, cut)) => timeout_at(cut, self.ready()).await.unwrap_or_else(|_| {
                Err(self.locks.settings().connection_error(format!(
                    "the server did not answer within the wait of {wait:?} while checking the \
                     election table"
                )))
            }),
        }
    }

    fn plan(name: &LockKey, candidate: &Candidate) -> Plan {
        Plan::Lead(Arc::new(Seat {
            name: name.as_str().to_owned(),
            candidate: candidate.as_bytes().to_vec(),
        }))
    }

    fn leadership(
        &self,
        name: &LockKey,
        grant: Grant,
        candidate: &Candidate,
        options: &LockOptions,
    ) -> Result<Leadership, LockError> {
        let (lease, monitor) = lease_of(name, grant, options);
        let backend: Arc<dyn LeaderElection> = Arc::new(self.clone());
        leadership(
            lease,
            monitor,
            backend,
            options.auto_renew(),
            candidate.clone(),
        )
    }

    fn probe(name: &LockKey) -> Probe {
        Probe::key(election_advisory_key(name))
    }
}

#[async_trait]
impl LeaderElection for PostgresElection {
    fn info(&self) -> BackendInfo {
        DistributedLock::info(&self.locks)
    }

    async fn try_campaign(
        &self,
        name: &LockKey,
        candidate: &Candidate,
        options: &LockOptions,
    ) -> Result<Option<Leadership>, LockError> {
        check_campaign_request(POSTGRES_BACKEND, options, Capability::Supported)?;
        self.ready().await?;
        let plan = Self::plan(name, candidate);
        let hash = election_advisory_key(name);
        let grant = self.locks.try_plan(name, hash, &plan, options).await?;
        grant
            .map(|grant| self.leadership(name, grant, candidate, options))
            .transpose()
    }

    /// Bounded by the options' wait as the mutex's `acquire` is; a campaign that found
    /// another leader first is marked [`Leadership::contended`].
    async fn campaign(
        &self,
        name: &LockKey,
        candidate: &Candidate,
        options: &LockOptions,
    ) -> Result<Leadership, LockError> {
        check_campaign_request(POSTGRES_BACKEND, options, Capability::Supported)?;
        self.ready_within(options).await?;
        let plan = Self::plan(name, candidate);
        let hash = election_advisory_key(name);
        let (grant, contended) = self.locks.acquire_grant(name, hash, &plan, options).await?;
        let won = self.leadership(name, grant, candidate, options)?;
        Ok(distlock_api::backend::mark_contended(won, contended))
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.locks
            .release_lease(lease, Self::probe(lease.key()))
            .await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        self.locks
            .extend_lease(lease, ttl, Self::probe(lease.key()))
            .await
    }

    async fn leader(&self, name: &LockKey) -> Result<Option<Leader>, LockError> {
        self.ready().await?;
        let row = self
            .locks
            .leader_row(name, election_advisory_key(name))
            .await?;
        row.map(|(candidate, term)| {
            let candidate = Candidate::new(candidate).map_err(|e| {
                LockError::backend_error(
                    POSTGRES_BACKEND,
                    format!("the leader row of election {name} holds no valid identity: {e}"),
                )
            })?;
            Ok(Leader::new(
                candidate,
                FencingToken::new(term.unsigned_abs()),
            ))
        })
        .transpose()
    }
}
