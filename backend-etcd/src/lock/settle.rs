//! A parked waiter's grant, handed out before its key is back on the lock's lease.
//!
//! A waiter whose lock has a longer TTL than [`super::WAITER_TTL_SECS`] waits with its
//! key on the client's waiting lease of that short TTL (see [`super::placement`]), so
//! that a waiter whose process dies holds up the queue for seconds, not for the lock's
//! TTL. Moving the key back to the client's lease of the lock's TTL is a raft write.
//! Made before the grant, it put a second write on every hand-off's path (the release,
//! then the move); made at once behind it, it still loaded etcd on every contended
//! cycle, though most locks handed off under contention are held briefly. So the grant
//! is handed out as soon as the turn is seen ours, valid as long as the waiting lease
//! (whose keep-alives move its deadline on, see [`super::shared`]); the key moves back
//! only once the grant has been held for one keep-alive period of that lease (a
//! second), or at once when an extend asks for it. A grant released before then is one
//! delete of its key, as every release is.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use distlock_api::backend::prelude::*;
use distlock_api::{LeaseMonitor, LeaseState, LockError, OwnerToken};
use tokio::sync::{watch, Notify};
use tokio::task::AbortHandle;

use super::shared::{cap_of, Cap, LeaseUse};
use super::{ttl_seconds, EtcdLock, WAITER_TTL_SECS};
use crate::ETCD_BACKEND;

/// A parked grant whose key is still on the waiting lease.
pub(super) struct Parked {
    /// The key's range, the key, and its create revision.
    pub(super) place: (String, String, i64),
    /// The use of the lease of the lock's TTL, if the acquire took one (else one is
    /// taken for the move).
    pub(super) home: Option<LeaseUse>,
}

/// The move of a parked grant's key back to the lease of the lock's TTL.
pub(super) struct Settle {
    /// The task that waits and then moves the key.
    task: AbortHandle,
    /// Wakes the task to move at once.
    hurry: Arc<Notify>,
    /// Closed (its sender dropped) once the task has ended.
    done: watch::Receiver<()>,
}

impl Settle {
    /// Stops the move (the release deletes the key wherever it is: a move that lands
    /// first is deleted with it, one that lands after fails its create-revision
    /// compare).
    pub(super) fn stop(&self) {
        self.task.abort();
    }
}

impl EtcdLock {
    /// Moves a parked grant's key back to the lease of the lock's `ttl` after a
    /// keep-alive period of the waiting lease, or when an extend hurries it, in a
    /// background task; the grant `owner`'s records follow the move.
    pub(super) fn settle_later(
        &self,
        parked: Parked,
        owner: OwnerToken,
        ttl: Duration,
        monitor: &LeaseMonitor,
        cap: &Cap,
    ) {
        let (signal, done) = watch::channel(());
        let hurry = Arc::new(Notify::new());
        let task = {
            let (lock, monitor, cap, hurry) =
                (self.clone(), monitor.clone(), cap.clone(), hurry.clone());
            tokio::spawn(async move {
                let _signal = signal;
                let period = Duration::from_secs(u64::try_from(WAITER_TTL_SECS).unwrap_or(3)) / 3;
                let later = async {
                    tokio::select! {
                        () = tokio::time::sleep(period) => {}
                        () = hurry.notified() => {}
                    }
                    lock.move_back(parked, owner, ttl, &monitor, &cap).await;
                };
                tokio::select! {
                    () = later => {}
                    // The waiting lease ran out, or the key went: the loss watch says so.
                    () = monitor.lost() => {}
                }
            })
            .abort_handle()
        };
        if let Some(held) = self.held().get_mut(&owner.as_u128()) {
            held.settle = Some(Settle { task, hurry, done });
        }
    }

    /// Has the key of the grant `owner` moved back at once if it is still parked, and
    /// waits (up to the request timeout) until it has.
    ///
    /// # Errors
    /// A retryable [`LockError::Connection`] when the move has not ended by then (an
    /// extend must not move the key beside it).
    pub(super) async fn settled(&self, owner: OwnerToken) -> Result<(), LockError> {
        let pending = self.held().get(&owner.as_u128()).and_then(|held| {
            let settle = held.settle.as_ref()?;
            settle.hurry.notify_one();
            Some(settle.done.clone())
        });
        if let Some(mut done) = pending {
            let limit = self.requests().timeout;
            if tokio::time::timeout(limit, done.changed()).await.is_err() {
                return Err(LockError::connection(
                    ETCD_BACKEND,
                    format!(
                        "the granted key's move to its lock's lease did not end within {limit:?}"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Moves the key to the client's lease of the lock's TTL; retries what fails while
    /// the grant lasts. Once moved, the grant's records name that lease, which carries
    /// the grant from then on.
    async fn move_back(
        &self,
        mut parked: Parked,
        owner: OwnerToken,
        ttl: Duration,
        monitor: &LeaseMonitor,
        cap: &Cap,
    ) {
        let (prefix, own, revision) = &parked.place;
        let mut pause = Duration::from_millis(20);
        while monitor.state() != LeaseState::Lost {
            let home = match parked.home.take() {
                Some(home) => Ok(home),
                None => self.share_lease(ttl_seconds(ttl), Some(ttl)).await,
            };
            let error = match home {
                Ok(mut home) => {
                    let moved = self
                        .requests()
                        .move_to_lease(prefix, own, *revision, home.id, None)
                        .await;
                    match moved {
                        Ok(Ok(_)) => {
                            let valid = home.valid_until(cap_of(cap));
                            home.carry(monitor, cap);
                            if let Some(held) = self.held().get_mut(&owner.as_u128()) {
                                held.lease.store(home.id, Ordering::Release);
                                held.ttl_secs = home.secs;
                                // The waiting lease's use goes: it carries the grant no more.
                                held.on = Some(home);
                            }
                            if let Some(valid) = valid {
                                monitor.renewed(valid);
                            }
                            return;
                        }
                        // The key is gone: the loss watch reports it.
                        Ok(Err(_)) => return,
                        Err(fail) => {
                            parked.home = Some(home);
                            self.connection_error(fail)
                        }
                    }
                }
                Err(error) => error,
            };
            tracing::debug!(%error, "moving a granted key back to its lock's lease failed; retrying");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }
}
