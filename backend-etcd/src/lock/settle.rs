//! A parked waiter's grant, handed out before its key is back on the lock's lease.
//!
//! A waiter whose lock has a longer TTL than [`super::WAITER_TTL_SECS`] waits with its
//! key on the client's waiting lease of that short TTL ([`super::waiting`]), so that a
//! waiter whose process dies holds up the queue for seconds, not for the lock's TTL.
//! Moving the key back to a lease of the lock's TTL is a raft write. Made before the
//! grant, it put a second write on every hand-off's path (the release, then the move);
//! made at once behind it, it still loaded etcd on every contended cycle, though most
//! locks handed off under contention are held briefly. So the grant is handed out as
//! soon as the turn is seen ours, valid for as long as the waiting lease, which is kept
//! alive; the key moves back only once the grant has been held for one keep-alive
//! period of that lease (a second), or at once when an extend asks for it. A grant
//! released before then is one delete of its key.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use distlock_api::backend::prelude::*;
use distlock_api::{LeaseMonitor, LeaseState, LockError, OwnerToken};
use tokio::sync::{watch, Notify};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::waiting::Parking;
use super::{margin, revoke_in_background, EtcdLock};
use crate::ETCD_BACKEND;

/// A parked grant whose key is still on the waiting lease.
pub(super) struct Parked {
    /// The key's range, the key, and its create revision.
    pub(super) place: (String, String, i64),
    /// The use of the waiting lease the key is on.
    pub(super) short: Parking,
    /// The lock's own lease (granted when the acquire began, not renewed since), its
    /// TTL in seconds, and when its grant was sent; none when the contender was placed
    /// on the waiting lease straight away (a fresh one is granted for the move).
    pub(super) full: Option<(i64, i64, Instant)>,
}

/// Where a parked grant's key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// On the short lease; no move sent.
    Parked,
    /// A move is sent (or may have landed), to the lock's lease or to `fresh`, a lease
    /// granted for it.
    Moving { fresh: Option<i64> },
    /// On the lock's lease or a fresh one, which the grant's records name.
    Moved,
    /// Released (or given up) while parked or moving: the release deletes the key and
    /// revokes the leases.
    Released,
}

/// The move of a parked grant's key back to a lease of the lock's TTL.
pub(super) struct Settle {
    /// The task that keeps the short lease alive and then moves the key.
    task: AbortHandle,
    stage: Arc<Mutex<Stage>>,
    /// Wakes the task to move at once.
    hurry: Arc<Notify>,
    /// Closed (its sender dropped) once the task has ended.
    done: watch::Receiver<()>,
    /// The lock's own lease, if any.
    full: Option<i64>,
    /// A use of the waiting lease, which outlives the task: held until the key has
    /// moved off it or the release has deleted it, so that the lease is not revoked as
    /// idle before.
    _parking: Arc<Mutex<Option<Parking>>>,
}

impl Settle {
    /// Marks the grant released and stops the task; returns where the key was and the
    /// leases it was in charge of (for the release to revoke).
    pub(super) fn release(&self) -> (Stage, Vec<i64>) {
        let stage = std::mem::replace(&mut *stage_of(&self.stage), Stage::Released);
        self.task.abort();
        (stage, leases_at(stage, self.full))
    }
}

/// The leases a grant's move is in charge of at `stage` (never the waiting lease, which
/// is not revoked for one grant): all but the one the key ends on, once it has moved.
fn leases_at(stage: Stage, full: Option<i64>) -> Vec<i64> {
    match stage {
        Stage::Parked => full.into_iter().collect(),
        Stage::Moving { fresh } => [full, fresh].into_iter().flatten().collect(),
        Stage::Moved | Stage::Released => Vec::new(),
    }
}

fn stage_of(stage: &Mutex<Stage>) -> std::sync::MutexGuard<'_, Stage> {
    stage.lock().unwrap_or_else(PoisonError::into_inner)
}

impl EtcdLock {
    /// Keeps a parked grant's short lease alive (and the grant's validity with it) in a
    /// background task, and moves its key back to a lease of the lock's `ttl` after a
    /// keep-alive period or when an extend hurries it; the grant `owner`'s records
    /// (`current`, its TTL) follow the move.
    pub(super) fn settle_later(
        &self,
        parked: Parked,
        owner: OwnerToken,
        ttl: Duration,
        monitor: &LeaseMonitor,
        current: Arc<AtomicI64>,
    ) {
        let (signal, done) = watch::channel(());
        let stage = Arc::new(Mutex::new(Stage::Parked));
        let hurry = Arc::new(Notify::new());
        let full = parked.full.map(|(id, _, _)| id);
        let parking = Arc::new(Mutex::new(Some(parked.short.share())));
        let task = {
            let (lock, monitor) = (self.clone(), monitor.clone());
            let (stage, hurry, parking) = (stage.clone(), hurry.clone(), parking.clone());
            tokio::spawn(async move {
                let _signal = signal;
                let moving = Moving {
                    parked: &parked,
                    owner,
                    ttl,
                    monitor: &monitor,
                    current: &current,
                    stage: &stage,
                };
                lock.settle(&moving, &hurry).await;
                // Moved off the waiting lease, or the key gone with it.
                drop(
                    parking
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .take(),
                );
                // Ended with the key neither moved nor released (the key gone, the lease
                // run out): its leases are nobody else's to revoke.
                let ended = std::mem::replace(&mut *stage_of(&stage), Stage::Released);
                for lease in leases_at(ended, full) {
                    revoke_in_background(lock.clone(), lease);
                }
            })
            .abort_handle()
        };
        if let Some(held) = self.held().get_mut(&owner.as_u128()) {
            held.settle = Some(Settle {
                task,
                stage,
                hurry,
                done,
                full,
                _parking: parking,
            });
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

    async fn settle(&self, moving: &Moving<'_>, hurry: &Notify) {
        let Moving {
            parked, monitor, ..
        } = moving;
        let short_ttl = Duration::from_secs(u64::try_from(parked.short.secs).unwrap_or(1));
        let alive = |sent: Instant| {
            monitor.renewed(sent + short_ttl - margin(short_ttl));
        };
        let later = async {
            tokio::select! {
                () = tokio::time::sleep(short_ttl / 3) => {}
                () = hurry.notified() => {}
            }
            self.move_back(moving).await;
        };
        tokio::select! {
            () = later => {}
            // The waiting lease ran out: the loss watch sees the key go.
            _ = parked.short.follow(alive) => {}
            () = monitor.lost() => {}
        }
    }

    /// Moves the key to the lock's own lease while two thirds of its TTL are left (the
    /// watchdog's first renewal comes at a third), else to a fresh one; retries what
    /// fails while the grant lasts, unless it is released.
    async fn move_back(&self, moving: &Moving<'_>) {
        let Moving {
            parked,
            owner,
            ttl,
            monitor,
            current,
            stage,
        } = *moving;
        let (prefix, own, revision) = &parked.place;
        let mut fresh = None;
        let mut pause = Duration::from_millis(20);
        while monitor.state() != LeaseState::Lost {
            let usable = parked
                .full
                .filter(|(_, _, full_sent)| Instant::now() < *full_sent + ttl / 3);
            let target = if let Some(full) = usable {
                Ok(full)
            } else if let Some(granted) = fresh {
                Ok(granted)
            } else {
                let id = super::new_lease_id();
                self.live().add(id);
                if !self.mark(stage, Stage::Moving { fresh: Some(id) }) {
                    self.live().remove(id);
                    return;
                }
                let sent = Instant::now();
                let secs = super::ttl_seconds(ttl);
                self.requests()
                    .grant(id, secs)
                    .await
                    .map(|_| {
                        fresh = Some((id, secs, sent));
                        (id, secs, sent)
                    })
                    .map_err(|f| self.connection_error(f))
            };
            let error = match target {
                Ok((lease, secs, sent)) => {
                    let fresh_id = fresh.map(|(id, _, _)| id);
                    if !self.mark(stage, Stage::Moving { fresh: fresh_id }) {
                        return;
                    }
                    let moved = self
                        .requests()
                        .move_to_lease(prefix, own, *revision, lease, None)
                        .await;
                    match moved {
                        Ok(Ok(_)) => {
                            if !self.mark(stage, Stage::Moved) {
                                return;
                            }
                            current.store(lease, Ordering::Release);
                            if let Some(held) = self.held().get_mut(&owner.as_u128()) {
                                held.ttl_secs = secs;
                            }
                            monitor.renewed(sent + ttl - margin(ttl));
                            if let Some((full, _, _)) =
                                parked.full.filter(|(id, _, _)| *id != lease)
                            {
                                revoke_in_background(self.clone(), full);
                            }
                            return;
                        }
                        // The key is gone: the loss watch reports it.
                        Ok(Err(_)) => return,
                        Err(fail) => self.connection_error(fail),
                    }
                }
                Err(error) => error,
            };
            tracing::debug!(%error, "moving a granted key back to its lock's lease failed; retrying");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// Moves `stage` on to `next` unless the grant was released; whether it did.
    fn mark(&self, stage: &Mutex<Stage>, next: Stage) -> bool {
        let mut stage = stage_of(stage);
        if *stage == Stage::Released {
            return false;
        }
        *stage = next;
        true
    }
}

/// What the move of one grant's key works with.
#[derive(Clone, Copy)]
struct Moving<'a> {
    parked: &'a Parked,
    owner: OwnerToken,
    ttl: Duration,
    monitor: &'a LeaseMonitor,
    current: &'a AtomicI64,
    stage: &'a Mutex<Stage>,
}
