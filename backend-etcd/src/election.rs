//! [`EtcdElection`]: the [`LeaderElection`] over etcd, in the key layout of etcd's own
//! `concurrency.Election` (behind `etcdctl elect`).
//!
//! It is the mutex's recipe in the election's range, with the candidate's identity as
//! the contender key's value: the same leases, queue, loss watch, release, extend and
//! clean-up ([`EtcdLock::contend`] and its kin).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::backend::{check_campaign_request, leadership, WaitReport};
use distlock_api::{
    BackendInfo, Candidate, DistributedLock, ExtendOutcome, FencingToken, Leader, LeaderElection,
    Leadership, Lease, LeaseMonitor, LockError, LockKey, LockOptions, ReleaseOutcome,
};
use etcd_client::{EventType, WatchOptions, WatchStream};
use tokio::time::{timeout_at, Instant};

use crate::error::{sent, within, Fail};
use crate::keys::{election_prefix, prefix_end, Kind};
use crate::{EtcdLock, ETCD_BACKEND, ETCD_CAPABILITIES};

/// How long a broken watch of an election waits before it is made again.
const REWATCH_PAUSE: Duration = Duration::from_millis(20);

/// A leader-election client of the etcd backend, made by [`EtcdLock::election`]:
/// etcd `concurrency.Election`-compatible, sharing the lock client's connection,
/// leases and loss watch.
///
/// **Semantics.** The candidates of the election `name` put their keys in the range
/// [`EtcdLock::election_prefix`] (`P/+election/<encode_key(name)>/`), each
/// `<range><lease id in hex>` under a lease of its own, created only if absent, with
/// the candidate's identity ([`Candidate::as_bytes`]) as its value. The key with the
/// lowest create revision leads; a waiting candidate watches only the youngest key
/// older than its own, so a resignation wakes one candidate (no herd), and candidates
/// lead in the order they campaigned. Everything else is the mutex's (see the crate
/// docs): a waiting candidate waits under a 3 s lease, a candidate that gives up (a
/// timeout, a `NoWait` campaign meeting a leader, a dropped campaign future) revokes
/// its lease and with it its key, and nothing is left in the range once every
/// candidate has left.
///
/// - **At most one leader** per name, as the etcd mutex excludes: while its lease
///   lives, the oldest key's owner leads.
/// - **Term: the leader key's create revision.** etcd's revision is one counter for
///   the whole cluster, kept through leader changes and restarts, and a newer key is
///   always younger than every key in the range, so each new leader's term is above
///   every earlier one's.
/// - **The lease** is an etcd lease of the options' TTL (whole seconds; at least 2 s
///   with etcd's default election timeout), kept alive by the guard's watchdog with
///   auto-renew. [`Leadership::lost`] fires when the key is deleted (its lease expired
///   or was revoked, or someone deleted it: one watch per client sees it), when a
///   renewal is refused, and at the validity deadline without news. A crashed leader is
///   replaced once etcd expires its lease: the TTL plus etcd's expiry sweep.
/// - [`LeaderElection::leader`] reads the oldest key of the range, as
///   `concurrency.Election.Leader` does: its value as the identity, its create revision
///   as the term, and its lease's remaining TTL (whole seconds, from
///   `LeaseTimeToLive`). A key exists only while its lease does, so a leader whose
///   lease etcd has ended is never reported.
/// - [`LeaderElection::wait_change`] waits on an etcd watch of the range, not by
///   polling: a deletion (or, while nobody leads, a new candidate) wakes observers,
///   who look again.
///
/// **etcd interoperability.** `etcdctl elect P/+election/<name> PROPOSAL` and a Go
/// service running `concurrency.NewElection(session, "P/+election/<name>")` campaign in
/// the same election: one of all leads, `etcdctl elect -l` and `Election.Observe` read
/// our identity (as the key's value), and [`LeaderElection::leader`] reads their
/// proposal. A foreign leader whose value is empty or longer than
/// [`distlock_api::MAX_CANDIDATE_LEN`] bytes reads as its key's name instead. A Go
/// leader's `Proclaim` changes its value, not its term.
///
/// Cloning is cheap and shares the connection.
#[derive(Debug, Clone)]
pub struct EtcdElection {
    lock: EtcdLock,
}

impl EtcdLock {
    /// An election client on this client's connection.
    pub fn election(&self) -> EtcdElection {
        EtcdElection { lock: self.clone() }
    }

    /// The range the candidates of the election `name` put their keys in
    /// (`P/+election/<encode_key(name)>/`, see [`election_prefix`]): never a lock's
    /// range. `etcdctl elect` on it without the trailing `/` campaigns in the same
    /// election.
    pub fn election_prefix(&self, name: &LockKey) -> String {
        election_prefix(self.prefix(), name)
    }
}

impl EtcdElection {
    /// The lock client whose connection this one shares.
    pub fn client(&self) -> &EtcdLock {
        &self.lock
    }

    /// Wraps a won candidacy as a [`Leadership`].
    fn lead(
        &self,
        lease: Lease,
        monitor: LeaseMonitor,
        candidate: &Candidate,
        options: &LockOptions,
    ) -> Result<Leadership, LockError> {
        let backend: Arc<dyn LeaderElection> = Arc::new(self.clone());
        leadership(
            lease,
            monitor,
            backend,
            options.auto_renew(),
            candidate.clone(),
        )
    }

    /// The oldest key of the election's `range`, as a leader.
    async fn look(&self, range: &str) -> Result<Option<Leader>, LockError> {
        let oldest = self
            .lock
            .requests()
            .oldest(range)
            .await
            .map_err(|f| self.lock.connection_error(f))?;
        oldest
            .map(|(kv, _, remaining)| {
                leader_of(kv.key(), kv.value(), kv.create_revision(), remaining)
            })
            .transpose()
    }

    /// A watch of every change in `range` from now, once etcd has created it.
    async fn watch(&self, range: &str) -> Result<WatchStream, Fail> {
        let requests = self.lock.requests();
        let options = WatchOptions::new().with_range(prefix_end(range));
        let mut stream = sent(requests.timeout, || {
            let (mut watch, options) = (requests.client.watch_client(), options.clone());
            async move { watch.watch(range, Some(options)).await }
        })
        .await?;
        loop {
            match within(requests.timeout, stream.message()).await? {
                Some(response) if response.created() => return Ok(stream),
                Some(response) if !response.canceled() => continue,
                _ => {
                    return Err(Fail::Etcd(etcd_client::Error::WatchError(
                        "etcd refused the watch of the election".into(),
                    )))
                }
            }
        }
    }
}

/// The leader that `key` (the oldest of its range) with `value`, created at `revision`,
/// stands for, its lease having `remaining` seconds left (when known).
fn leader_of(
    key: &[u8],
    value: &[u8],
    revision: i64,
    remaining: Option<i64>,
) -> Result<Leader, LockError> {
    let term = u64::try_from(revision).map_err(|_| {
        LockError::backend_error(
            ETCD_BACKEND,
            format!("etcd gave a negative create revision {revision}"),
        )
    })?;
    // A foreign candidate without a usable value (a Go `Campaign(ctx, "")`) is known
    // by its key, which etcd never leaves empty.
    let candidate = Candidate::new(value)
        .or_else(|_| Candidate::new(key))
        .map_err(|e| {
            LockError::backend_error(
                ETCD_BACKEND,
                format!("the leader's key names no usable identity: {e}"),
            )
        })?;
    let remaining = remaining
        .and_then(|secs| u64::try_from(secs).ok())
        .map(Duration::from_secs);
    Ok(Leader::new(candidate, FencingToken::new(term)).with_remaining(remaining))
}

#[async_trait]
impl LeaderElection for EtcdElection {
    fn info(&self) -> BackendInfo {
        DistributedLock::info(&self.lock)
    }

    async fn try_campaign(
        &self,
        name: &LockKey,
        candidate: &Candidate,
        options: &LockOptions,
    ) -> Result<Option<Leadership>, LockError> {
        check_campaign_request(ETCD_BACKEND, options, ETCD_CAPABILITIES.election.fifo)?;
        let won = self
            .lock
            .contend(
                Kind::Candidate,
                name,
                candidate.as_bytes(),
                options,
                &WaitReport::new(),
                false,
            )
            .await?;
        match won {
            None => Ok(None),
            Some((lease, monitor)) => self
                .lock
                .hand_out(Kind::Candidate, lease, monitor, |lease, monitor| {
                    self.lead(lease, monitor, candidate, options)
                })
                .await
                .map(Some),
        }
    }

    /// Waits in the candidates' queue (FIFO), watching the next older candidate, as the
    /// mutex's acquire waits: a wait bounds the whole call (plus a grace of 50 ms), and
    /// retryable errors are retried within it.
    async fn campaign(
        &self,
        name: &LockKey,
        candidate: &Candidate,
        options: &LockOptions,
    ) -> Result<Leadership, LockError> {
        check_campaign_request(ETCD_BACKEND, options, ETCD_CAPABILITIES.election.fifo)?;
        self.lock
            .wait_for(
                Kind::Candidate,
                name,
                candidate.as_bytes(),
                options,
                |lease, monitor| self.lead(lease, monitor, candidate, options),
            )
            .await
    }

    /// Deletes our candidate key (if it is still ours) and revokes its lease, as the
    /// mutex's release: the next candidate's watch fires and it leads.
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.lock.release_in(Kind::Candidate, lease).await
    }

    /// Keeps the key's lease alive (or moves the key to a lease of another TTL), as the
    /// mutex's extend.
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        self.lock.extend_in(Kind::Candidate, lease, ttl).await
    }

    /// The oldest key of the range: its value (the identity), create revision (the
    /// term) and lease's remaining TTL.
    async fn leader(&self, name: &LockKey) -> Result<Option<Leader>, LockError> {
        self.look(&self.lock.election_prefix(name)).await
    }

    /// Waits on an etcd watch of the election's range instead of polling: it is made
    /// before the look, so no change between the two is missed. Only a deletion can end
    /// a leadership (and only a put start one while nobody leads): other events do not
    /// make it look again.
    async fn wait_change(
        &self,
        name: &LockKey,
        seen: Option<FencingToken>,
        patience: Duration,
    ) -> Result<Option<Leader>, LockError> {
        let deadline = Instant::now() + patience;
        let range = self.lock.election_prefix(name);
        loop {
            let mut stream = self
                .watch(&range)
                .await
                .map_err(|f| self.lock.connection_error(f))?;
            let mut now = self.look(&range).await?;
            loop {
                if now.as_ref().map(|l| l.term) != seen || Instant::now() >= deadline {
                    return Ok(now);
                }
                let message = match timeout_at(deadline, stream.message()).await {
                    Err(_) => return self.look(&range).await,
                    Ok(message) => message,
                };
                match message {
                    Ok(Some(response)) if !response.canceled() => {
                        let events = response.events();
                        if events.iter().any(|e| {
                            e.event_type() == EventType::Delete
                                || (seen.is_none() && e.event_type() == EventType::Put)
                        }) {
                            now = self.look(&range).await?;
                        }
                    }
                    // The watch broke (a member went away): make another.
                    _ => {
                        tokio::time::sleep(REWATCH_PAUSE).await;
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_without_a_usable_value_is_known_by_its_key() {
        let key = b"distlock/+election/jobs/694d7a1b";
        let read = leader_of(key, b"host-a", 7, Some(5)).expect("a leader");
        assert_eq!(read.candidate.as_bytes(), b"host-a");
        assert_eq!(read.term, FencingToken::new(7));
        assert_eq!(read.remaining, Some(Duration::from_secs(5)));
        let long = vec![b'x'; distlock_api::MAX_CANDIDATE_LEN + 1];
        for foreign in [&b""[..], &long] {
            let read = leader_of(key, foreign, 7, Some(-1)).expect("a leader");
            assert_eq!(read.candidate.as_bytes(), key);
            assert_eq!(read.remaining, None);
        }
        assert!(leader_of(key, b"a", -1, None).is_err());
    }
}
