//! The semaphore's recipe over ZooKeeper, in the node layout of Curator's
//! `InterProcessSemaphoreV2` (the engine's [`distlock_api::backend::Claim::Permit`]).
//!
//! A semaphore at `path` (see [`ZooKeeperLock::semaphore_path`]) has two directories:
//! `path/locks`, an `InterProcessMutex` (`_c_<guid>-lock-<seq>` contenders) that guards
//! the second, and `path/leases`, one ephemeral-sequential node
//! `_c_<guid>-lease-<seq>` per permit. An acquire takes the mutex, adds its lease node,
//! and lists `path/leases`: with at most `max` children the permit is granted; with
//! more it waits, still holding the mutex, for a child to go (a children watch), so
//! only one acquirer at a time can be over the count and it withdraws before anyone
//! else adds a node. The mutex is released once the lease is granted or withdrawn.
//!
//! So waiters queue in the guard mutex's FIFO order, woken by its predecessor watch,
//! and the one at its head is woken by the children watch when a permit goes: permits
//! are granted in arrival order, and no waiter polls.

use std::sync::Arc;
use std::time::Duration;

use distlock_api::backend::WaitReport;
use distlock_api::{LockError, LockKey, OwnerToken, PermitMismatch};
use tokio::time::{sleep_until, Instant};
use zookeeper_client as zk;

use crate::error::{within, Fail};
use crate::keys::NodeKind;
use crate::lock::{Contend, Won};
use crate::recipe::{create_contender, Cleanup};
use crate::session::Session;
use crate::{ZooKeeperLock, ZOOKEEPER_BACKEND};

/// Curator's name for the semaphore's guard mutex directory.
const LOCKS: &str = "locks";
/// Curator's name for the semaphore's lease directory.
const LEASES: &str = "leases";
/// What our lease nodes hold, before the permit count: `distlock:permits=3`. Curator's
/// lease nodes hold the client's IP address (or `setNodeData`'s bytes) instead.
pub const PERMITS_DATA_PREFIX: &str = "distlock:permits=";

impl ZooKeeperLock {
    /// The path of `key`'s semaphore: `[chroot]{base_path}/.semaphore/{encode_key(key)}`
    /// (no key encodes to a name starting with `.`, so it never meets a mutex's
    /// directory). A Curator `new InterProcessSemaphoreV2(client, path, max)` on this
    /// path shares its permits with ours.
    pub fn semaphore_path(&self, key: &LockKey) -> String {
        self.namespaced_dir(".semaphore", key)
    }

    /// The directory of `key`'s semaphore's lease nodes: the grants.
    pub(crate) fn leases_dir(&self, key: &LockKey) -> String {
        format!("{}/{LEASES}", self.semaphore_path(key))
    }

    /// Takes a permit of `max` in the semaphore at `dir`: the guard mutex, then a lease.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn take_permit(
        &self,
        session: &Arc<Session>,
        dir: &str,
        max: u32,
        key: &LockKey,
        deadline: Option<Instant>,
        waits: bool,
        report: &WaitReport,
    ) -> Result<Contend, LockError> {
        let limit = self.limit(session);
        let locks = format!("{dir}/{LOCKS}");
        let leases = format!("{dir}/{LEASES}");
        let mutex = |deadline, waits| {
            self.contend(
                session,
                &locks,
                NodeKind::Lock,
                &[],
                deadline,
                waits,
                report,
            )
        };
        let guard = match mutex(deadline, waits).await? {
            Contend::Granted(won) => won,
            // A try meets the mutex held: by a waiter (then the permits are all taken
            // and it holds one node too many), or by an acquire passing through, which
            // lets it go within a round trip or two: wait for that one, briefly.
            Contend::Held if !waits && permits_free(session, &leases, max, limit).await? => {
                match mutex(Instant::now().checked_add(limit), true).await? {
                    Contend::Granted(won) => won,
                    other => return Ok(other),
                }
            }
            other => return Ok(other),
        };
        let outcome = self
            .lease(session, &leases, max, key, deadline, waits, report)
            .await;
        let Won {
            path, mut cleanup, ..
        } = guard;
        match within(limit, session.client.delete(&path, None)).await {
            Ok(()) => cleanup.disarm(),
            Err(f) if f.is_no_node() || f.session_ended() => cleanup.disarm(),
            // Still armed: the guard mutex's node is removed in the background.
            Err(f) => tracing::debug!(%path, ?f, "semaphore guard mutex left to the background"),
        }
        outcome
    }

    /// Adds our lease node to `leases` (we hold the guard mutex) and waits until at
    /// most `max` lease nodes are left, or gives up and withdraws it.
    #[allow(clippy::too_many_arguments)]
    async fn lease(
        &self,
        session: &Arc<Session>,
        leases: &str,
        max: u32,
        key: &LockKey,
        deadline: Option<Instant>,
        waits: bool,
        report: &WaitReport,
    ) -> Result<Contend, LockError> {
        let limit = self.limit(session);
        let owner = OwnerToken::random();
        // Armed from before the create is sent: a drop at any await removes our node.
        let mut cleanup = Cleanup::new(session.clone(), leases, owner, limit);
        let data = format!("{PERMITS_DATA_PREFIX}{max}");
        let created = create_contender(
            session,
            leases,
            owner,
            NodeKind::Lease,
            data.as_bytes(),
            limit,
        );
        let Some(created) = created.await? else {
            return Ok(Contend::Restart);
        };
        let fence = u64::try_from(created.fence).map_err(|_| {
            LockError::backend_error(
                ZOOKEEPER_BACKEND,
                format!("the server gave a negative czxid {}", created.fence),
            )
        })?;
        let path = format!("{leases}/{}", created.name);
        let won = |sent, cleanup| {
            Contend::Granted(Won {
                session: session.clone(),
                owner,
                path: path.clone(),
                fence,
                sent,
                cleanup,
            })
        };
        if created.listing.is_some() {
            // Alone in the directory: one lease, within any count.
            return Ok(won(created.sent, cleanup));
        }
        let mut checked = false;
        loop {
            let sent = Instant::now();
            let (children, _, watcher) =
                match within(limit, session.client.get_and_watch_children(leases)).await {
                    Ok(listed) => listed,
                    Err(f) if f.is_no_node() || f.session_ended() => return Ok(Contend::Restart),
                    Err(f) => return Err(f.into()),
                };
            if !children.contains(&created.name) {
                // Our node is gone: the session expired, or someone deleted it.
                return Ok(Contend::Restart);
            }
            if !checked {
                let others = children.iter().filter(|c| **c != created.name);
                if let Some(in_use) = other_count(session, leases, others, max, limit).await? {
                    withdraw(session, &path, limit, &mut cleanup).await?;
                    return Err(LockError::PermitMismatch {
                        backend: ZOOKEEPER_BACKEND,
                        source: PermitMismatch::new(key.clone(), max, in_use),
                    });
                }
                checked = true;
            }
            // Every child counts, as Curator counts them.
            if children.len() <= max as usize {
                return Ok(won(sent, cleanup));
            }
            report.saw_held();
            if !waits || deadline.is_some_and(|d| Instant::now() >= d) {
                withdraw(session, &path, limit, &mut cleanup).await?;
                return Ok(Contend::Held);
            }
            let event = match deadline {
                Some(d) => tokio::select! {
                    event = watcher.changed() => Some(event),
                    _ = sleep_until(d) => None,
                },
                None => Some(watcher.changed().await),
            };
            if event.is_some_and(|e| e.event_type == zk::EventType::Session) {
                // Only terminal session states reach node watchers.
                return Ok(Contend::Restart);
            }
        }
    }
}

/// Deletes our lease node after we gave up on it; a failure leaves it to `cleanup`,
/// which stays armed.
async fn withdraw(
    session: &Session,
    path: &str,
    limit: Duration,
    cleanup: &mut Cleanup,
) -> Result<(), LockError> {
    match within(limit, session.client.delete(path, None)).await {
        Ok(()) => {}
        Err(f) if f.is_no_node() || f.session_ended() => {}
        Err(f) => return Err(f.into()),
    }
    cleanup.disarm();
    Ok(())
}

/// Whether fewer than `max` lease nodes exist in `leases` now.
async fn permits_free(
    session: &Session,
    leases: &str,
    max: u32,
    limit: Duration,
) -> Result<bool, LockError> {
    match within(limit, session.client.list_children(leases)).await {
        Ok(children) => Ok(children.len() < max as usize),
        Err(f) if f.is_no_node() => Ok(true),
        Err(f) => Err(f.into()),
    }
}

/// The permit count another lease node among `others` records, if one records a count
/// other than `max`. Nodes without a recorded count (Curator's) and nodes gone since
/// the listing are skipped.
async fn other_count(
    session: &Session,
    leases: &str,
    others: impl Iterator<Item = &String>,
    max: u32,
    limit: Duration,
) -> Result<Option<u32>, LockError> {
    let mut reader = session.client.new_multi_reader();
    let mut any = false;
    for name in others {
        reader
            .add_get_data(&format!("{leases}/{name}"))
            .map_err(|e| LockError::from(Fail::Zk(e)))?;
        any = true;
    }
    if !any {
        reader.abort();
        return Ok(None);
    }
    let results = match tokio::time::timeout(limit, reader.commit()).await {
        Ok(results) => results.map_err(|e| LockError::from(Fail::Zk(e)))?,
        Err(_) => return Err(Fail::TimedOut(limit).into()),
    };
    Ok(results.into_iter().find_map(|result| match result {
        zk::MultiReadResult::Data { data, .. } => {
            recorded_count(&data).filter(|count| *count != max)
        }
        _ => None,
    }))
}

/// The permit count a lease node's data records, if it is one of ours.
fn recorded_count(data: &[u8]) -> Option<u32> {
    std::str::from_utf8(data)
        .ok()?
        .strip_prefix(PERMITS_DATA_PREFIX)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_lease_data_records_a_count() {
        assert_eq!(recorded_count(b"distlock:permits=3"), Some(3));
        for foreign in [&b"127.0.0.1"[..], b"", b"distlock:permits=", b"\xff"] {
            assert_eq!(recorded_count(foreign), None);
        }
    }
}
