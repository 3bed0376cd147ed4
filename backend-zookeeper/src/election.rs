//! Leader election over ZooKeeper, in the node layout of Curator's `LeaderLatch` (the
//! engine's [`distlock_api::backend::Claim::Lead`]), and reading the leader.
//!
//! The candidates of an election at `path` (see [`ZooKeeperLock::election_path`]) are
//! ephemeral-sequential nodes `_c_<guid>-latch-<seq>` holding the candidate's identity;
//! the lowest sequence leads, and every other candidate watches the next lower node
//! only. It is the mutex's recipe with Curator's latch name and the identity as node
//! data, and the same creation, clean-up, lease, release and extend. Observers wait on
//! a child watch of the election's directory, not by polling.

use std::time::Duration;

use distlock_api::{Candidate, FencingToken, Leader, LockError, LockKey};
use tokio::time::{sleep_until, Instant};
use zookeeper_client as zk;

use crate::error::within;
use crate::keys::{rank_kind, NodeKind};
use crate::session::Session;
use crate::{ZooKeeperLock, ZOOKEEPER_BACKEND};

/// How many times one look at the leader starts over when the lowest candidate left
/// between the listing and the read of its node.
const LOOKS: usize = 10;

impl ZooKeeperLock {
    /// The directory of the election `name`:
    /// `[chroot]{base_path}/.election/{encode_key(name)}` (never a mutex's directory: no
    /// key encodes to a name starting with `.`). With the defaults, the election
    /// `scheduler` is `/distlock/.election/scheduler`; a Curator
    /// `new LeaderLatch(client, path, id)` on this path (below the same chroot)
    /// campaigns with ours.
    pub fn election_path(&self, name: &LockKey) -> String {
        self.namespaced_dir(".election", name)
    }

    /// One look at the election in `dir`: its leader and, with `watch`, a watcher that
    /// fires at the next change of its candidates (or of the directory's existence).
    async fn look(
        &self,
        session: &Session,
        dir: &str,
        watch: bool,
    ) -> Result<(Option<Leader>, Option<zk::OneshotWatcher>), LockError> {
        let limit = self.limit(session);
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

impl ZooKeeperLock {
    /// The leader of the election `name`: the lowest candidate node, its data (the
    /// identity) and `czxid` (the term), with no remaining lease (the lease is a
    /// session). Its node exists only while its session does, so it never reports a
    /// leader whose session has ended.
    ///
    /// # Errors
    /// Connection and backend errors, naming the servers.
    pub(crate) async fn read_leader(&self, name: &LockKey) -> Result<Option<Leader>, LockError> {
        let dir = self.election_path(name);
        let looked = async {
            let session = self.session().await?;
            self.look(&session, &dir, false).await
        };
        let (leader, _) = looked.await.map_err(|e| self.located(e))?;
        Ok(leader)
    }

    /// Waits until the leadership of `name` differs from `seen`, or `patience` has
    /// passed, on a child watch of the election's directory (an exists watch while it
    /// does not exist) instead of polling: a candidate joining or leaving wakes the
    /// observer, which looks again.
    ///
    /// # Errors
    /// Connection and backend errors, naming the servers.
    pub(crate) async fn await_leader_change(
        &self,
        name: &LockKey,
        seen: Option<FencingToken>,
        patience: Duration,
    ) -> Result<Option<Leader>, LockError> {
        let deadline = Instant::now() + patience;
        let dir = self.election_path(name);
        loop {
            let looked = async {
                let session = self.session().await?;
                self.look(&session, &dir, true).await
            };
            let (now, watcher) = looked.await.map_err(|e| self.located(e))?;
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
