//! [`ZooKeeperElection`]: the [`LeaderElection`] over ZooKeeper, in the node layout of
//! Curator's `LeaderLatch`.
//!
//! The candidates of an election at `path` (see [`ZooKeeperLock::election_path`]) are
//! ephemeral-sequential nodes `_c_<guid>-latch-<seq>` holding the candidate's identity;
//! the lowest sequence leads, and every other candidate watches the next lower node
//! only. It is the mutex's recipe with Curator's latch name and the identity as node
//! data, and the same creation, clean-up, lease, release and extend.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::backend::{
    bounded_wait, check_campaign_request, leadership, WaitBound, WaitReport,
};
use distlock_api::{
    BackendInfo, Candidate, Capability, DistributedLock, ExtendOutcome, FencingToken, Leader,
    LeaderElection, Leadership, Lease, LockError, LockKey, LockOptions, ReleaseOutcome,
};
use tokio::time::{sleep_until, Instant};
use zookeeper_client as zk;

use crate::error::within;
use crate::keys::{rank_kind, NodeKind};
use crate::lock::{Recipe, Won, ANSWER_GRACE};
use crate::session::Session;
use crate::{ZooKeeperLock, ZOOKEEPER_BACKEND};

/// How many times one look at the leader starts over when the lowest candidate left
/// between the listing and the read of its node.
const LOOKS: usize = 10;

/// An election client of the ZooKeeper backend, made by [`ZooKeeperLock::election`]:
/// Curator `LeaderLatch`-compatible, sharing the lock client's session.
///
/// **Semantics.** A campaign creates an ephemeral-sequential candidate node
/// `_c_<guid>-latch-<seq>` in the election's directory
/// ([`ZooKeeperLock::election_path`]), holding the candidate's identity
/// ([`Candidate::as_bytes`]). The lowest sequence leads; a waiting candidate watches
/// only the next lower node, so a resignation wakes one candidate (no herd), and
/// candidates lead in the order they campaigned. A candidate that gives up (a timeout,
/// a `NoWait` campaign meeting a leader, a dropped campaign future) deletes its node,
/// as the mutex's waiters do, and the directory is a container node, which the server
/// removes once the election is empty: nothing is left behind.
///
/// - **At most one leader** per name, as the ZooKeeper mutex excludes: while its
///   session lives, the lowest node's owner leads.
/// - **Term: the leader's node's `czxid`**, the zxid of the transaction that created
///   it. Nodes of a directory are created in sequence order and only the lowest leads,
///   so each new leader's term is above every earlier one's, across session expiries
///   and a recreated directory (zxids are ensemble-wide).
/// - **The lease is the session**, as for the mutex: a leader leads until it resigns or
///   its session ends, whatever TTL the options ask for (`ttl_expiry` is unsupported).
///   A disconnect makes the leadership *suspect*, the session's expiry *lost*
///   ([`Leadership::lost`] fires), and without news `lost()` fires at the validity
///   deadline (`t + session timeout`, `t` when a request the server answered was sent).
///   A crashed leader is replaced once the server expires its session: the negotiated
///   session timeout, rounded up to the server's tick.
/// - [`LeaderElection::leader`] reads the lowest candidate node: its data as the
///   identity and its `czxid` as the term, with no remaining lease (`None`: the lease is
///   a session). Its node exists only while its session does, so it never reports a
///   leader whose session has ended.
/// - [`LeaderElection::wait_change`] waits on a ZooKeeper child watch of the
///   election's directory (an exists watch while there is none), not by polling: a
///   candidate joining or leaving wakes observers, who look again.
///
/// **Curator interoperability.** A Java service running
/// `new LeaderLatch(client, path, id)` on the same path (the base path, `/.election/`,
/// and [`crate::encode_key`] of the name, below the chroot: see
/// [`ZooKeeperLock::election_path`]) campaigns in the same election: one of all leads,
/// Curator's `getLeader().getId()` reads our identity (as UTF-8, lossily), and
/// [`LeaderElection::leader`] reads Curator's `id`. A Curator participant whose id is
/// empty (Curator's default) or longer than [`distlock_api::MAX_CANDIDATE_LEN`] bytes
/// reads as its node's name (`_c_<guid>-latch-<seq>`) instead.
///
/// Cloning is cheap and shares the session.
#[derive(Debug, Clone)]
pub struct ZooKeeperElection {
    lock: ZooKeeperLock,
}

impl ZooKeeperLock {
    /// An election client on this client's session.
    pub fn election(&self) -> ZooKeeperElection {
        ZooKeeperElection { lock: self.clone() }
    }

    /// The directory of the election `name`:
    /// `[chroot]{base_path}/.election/{encode_key(name)}` (never a mutex's directory: no
    /// key encodes to a name starting with `.`). With the defaults, the election
    /// `scheduler` is `/distlock/.election/scheduler`; a Curator
    /// `new LeaderLatch(client, path, id)` on this path (below the same chroot)
    /// campaigns with ours.
    pub fn election_path(&self, name: &LockKey) -> String {
        self.namespaced_dir(".election", name)
    }
}

impl ZooKeeperElection {
    /// Registers a won candidate node as held and wraps it in a [`Leadership`].
    async fn lead(
        &self,
        name: &LockKey,
        candidate: &Candidate,
        options: &LockOptions,
        won: Won,
    ) -> Result<Leadership, LockError> {
        let (lease, monitor) = self.lock.register(name, options, won);
        let backend: Arc<dyn LeaderElection> = Arc::new(self.clone());
        let granted = leadership(
            lease.clone(),
            monitor,
            backend,
            options.auto_renew(),
            candidate.clone(),
        );
        if granted.is_err() {
            // Not reached (the lease carries the node's czxid), but a grant that cannot
            // be handed out must not be left leading.
            let _ = self.release(&lease).await;
        }
        granted
    }

    /// One look at the election in `dir`: its leader and, with `watch`, a watcher that
    /// fires at the next change of its candidates (or of the directory's existence).
    async fn look(
        &self,
        session: &Session,
        dir: &str,
        watch: bool,
    ) -> Result<(Option<Leader>, Option<zk::OneshotWatcher>), LockError> {
        let limit = self.lock.limit(session);
        for _ in 0..LOOKS {
            let (children, watcher) = if watch {
                match within(limit, session.client.get_and_watch_children(dir)).await {
                    Ok((children, _, watcher)) => (children, Some(watcher)),
                    Err(f) if f.is_no_node() => {
                        let exists = session.client.check_and_watch_stat(dir);
                        match within(limit, exists).await? {
                            // Created since: list it.
                            (Some(_), _) => continue,
                            (None, watcher) => return Ok((None, Some(watcher))),
                        }
                    }
                    Err(f) => return Err(f.into()),
                }
            } else {
                match within(limit, session.client.list_children(dir)).await {
                    Ok(children) => (children, None),
                    Err(f) if f.is_no_node() => return Ok((None, None)),
                    Err(f) => return Err(f.into()),
                }
            };
            let Some((_, first)) = rank_kind(&children, NodeKind::Latch).first().copied() else {
                return Ok((None, watcher));
            };
            match within(limit, session.client.get_data(&format!("{dir}/{first}"))).await {
                Ok((data, stat)) => {
                    return Ok((Some(leader_of(first, data, stat.czxid)?), watcher))
                }
                // The leader left since the listing: look again.
                Err(f) if f.is_no_node() => continue,
                Err(f) => return Err(f.into()),
            }
        }
        Err(LockError::backend_error(
            ZOOKEEPER_BACKEND,
            format!("the leader changed {LOOKS} times while being read; try again"),
        ))
    }
}

/// The leader a candidate node `name` with `data`, created at `czxid`, stands for.
fn leader_of(name: &str, data: Vec<u8>, czxid: i64) -> Result<Leader, LockError> {
    let term = u64::try_from(czxid).map_err(|_| {
        LockError::backend_error(
            ZOOKEEPER_BACKEND,
            format!("the server gave a negative czxid {czxid}"),
        )
    })?;
    // A Curator participant without an id (or with a long one) is known by its node.
    let candidate = Candidate::new(data)
        .or_else(|_| Candidate::new(name.as_bytes()))
        .map_err(|e| {
            LockError::backend_error(
                ZOOKEEPER_BACKEND,
                format!("the leader's node {name:?} names no usable identity: {e}"),
            )
        })?;
    Ok(Leader::new(candidate, FencingToken::new(term)))
}

#[async_trait]
impl LeaderElection for ZooKeeperElection {
    fn info(&self) -> BackendInfo {
        DistributedLock::info(&self.lock)
    }

    async fn try_campaign(
        &self,
        name: &LockKey,
        candidate: &Candidate,
        options: &LockOptions,
    ) -> Result<Option<Leadership>, LockError> {
        // The candidates' queue is FIFO: every wait order is honoured.
        check_campaign_request(ZOOKEEPER_BACKEND, options, Capability::Supported)?;
        let dir = self.lock.election_path(name);
        let recipe = Recipe::Lead {
            identity: candidate.as_bytes(),
        };
        let report = WaitReport::new();
        let won = self
            .lock
            .obtain(&dir, recipe, name, options, false, &report)
            .await
            .map_err(|e| self.lock.located(e))?;
        match won {
            Some(won) => Ok(Some(self.lead(name, candidate, options, won).await?)),
            None => Ok(None),
        }
    }

    /// Waits in the candidates' queue (FIFO), watching the next lower candidate. A wait
    /// bounds the whole call, as the mutex's acquire: once it (plus a grace of 50 ms)
    /// has passed, the request in flight is dropped and our node removed.
    async fn campaign(
        &self,
        name: &LockKey,
        candidate: &Candidate,
        options: &LockOptions,
    ) -> Result<Leadership, LockError> {
        check_campaign_request(ZOOKEEPER_BACKEND, options, Capability::Supported)?;
        let dir = self.lock.election_path(name);
        let recipe = Recipe::Lead {
            identity: candidate.as_bytes(),
        };
        let bound = WaitBound::starting_now(options, ANSWER_GRACE);
        let report = WaitReport::new();
        let attempts = async {
            let won = self
                .lock
                .obtain(&dir, recipe, name, options, true, &report)
                .await?
                .ok_or_else(|| LockError::Timeout {
                    backend: ZOOKEEPER_BACKEND,
                    key: name.clone(),
                    waited: bound.started.elapsed(),
                })?;
            self.lead(name, candidate, options, won).await
        };
        let result = bounded_wait(ZOOKEEPER_BACKEND, name, bound, &report, attempts, |wait| {
            LockError::connection(
                ZOOKEEPER_BACKEND,
                format!(
                    "ZooKeeper did not answer within the wait of {wait:?}; whether the \
                     campaign won is unknown (a late candidate node is removed)"
                ),
            )
        })
        .await;
        result.map_err(|e| self.lock.located(e))
    }

    /// Deletes our candidate node, as the mutex's release deletes its contender: the
    /// next candidate's watch fires and it leads.
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        let dir = self.lock.election_path(lease.key());
        self.lock.release_node(&dir, NodeKind::Latch, lease).await
    }

    /// Proves the session alive and our candidate node present, as the mutex's extend.
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        let dir = self.lock.election_path(lease.key());
        self.lock
            .extend_lease(&dir, NodeKind::Latch, lease, ttl)
            .await
    }

    /// The lowest candidate node: its data (the identity) and `czxid` (the term).
    async fn leader(&self, name: &LockKey) -> Result<Option<Leader>, LockError> {
        let dir = self.lock.election_path(name);
        let looked = async {
            let session = self.lock.session().await?;
            self.look(&session, &dir, false).await
        };
        let (leader, _) = looked.await.map_err(|e| self.lock.located(e))?;
        Ok(leader)
    }

    /// Waits on a child watch of the election's directory (an exists watch while it
    /// does not exist) instead of polling.
    async fn wait_change(
        &self,
        name: &LockKey,
        seen: Option<FencingToken>,
        patience: Duration,
    ) -> Result<Option<Leader>, LockError> {
        let deadline = Instant::now() + patience;
        let dir = self.lock.election_path(name);
        loop {
            let looked = async {
                let session = self.lock.session().await?;
                self.look(&session, &dir, true).await
            };
            let (now, watcher) = looked.await.map_err(|e| self.lock.located(e))?;
            if now.as_ref().map(|l| l.term) != seen || Instant::now() >= deadline {
                return Ok(now);
            }
            let Some(watcher) = watcher else {
                return Ok(now);
            };
            // A session event (only terminal ones reach node watchers) also ends the
            // wait: the next look opens a new session.
            tokio::select! {
                _ = watcher.changed() => {}
                _ = sleep_until(deadline) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_without_a_usable_identity_is_known_by_its_node() {
        let node = "_c_01234567-89ab-cdef-0011-223344556677-latch-0000000004";
        let read = leader_of(node, b"host-a".to_vec(), 7).expect("a leader");
        assert_eq!(read.candidate.as_bytes(), b"host-a");
        assert_eq!(read.term, FencingToken::new(7));
        assert_eq!(read.remaining, None);
        for foreign in [Vec::new(), vec![b'x'; distlock_api::MAX_CANDIDATE_LEN + 1]] {
            let read = leader_of(node, foreign, 7).expect("a leader");
            assert_eq!(read.candidate.as_bytes(), node.as_bytes());
        }
        assert!(leader_of(node, b"a".to_vec(), -1).is_err());
    }
}
