//! A parked waiter's grant, handed out before its key is back on the lock's lease.
//!
//! A waiter whose lock has a longer TTL than [`super::WAITER_TTL_SECS`] waits with its key
//! on a lease of that short TTL, so that a waiter whose process dies holds up the
//! queue for seconds, not for the lock's TTL. Moving the key back to a lease of the
//! lock's TTL is a raft write; made before the grant, it put a second write on every
//! hand-off's path (the release, then the move). So the grant is handed out as soon as
//! the turn is seen ours, valid for as long as the short lease (which is kept alive
//! meanwhile), and the key moves back behind it. Until the move has landed, a release
//! deletes the key by its create revision rather than revoking a lease, and an extend
//! waits for the move.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_api::backend::prelude::*;
use distlock_api::{LeaseMonitor, LeaseState, OwnerToken};
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::{margin, EtcdLock, Undo};

/// A parked grant whose key is still on its short waiting lease.
pub(super) struct Parked {
    /// The key's range, the key, and its create revision.
    pub(super) place: (String, String, i64),
    /// The short lease the key is on, and its TTL in seconds.
    pub(super) short: i64,
    pub(super) short_secs: i64,
    /// The lock's own lease (granted when the acquire began, not renewed since), its
    /// TTL in seconds, and when its grant was sent.
    pub(super) full: (i64, i64, Instant),
}

/// The move of a parked grant's key, while under way.
pub(super) struct Settle {
    /// The task making it.
    task: AbortHandle,
    /// Closed (its sender dropped) once the task has ended.
    done: watch::Receiver<()>,
}

impl Settle {
    /// Whether the move is still under way.
    pub(super) fn pending(&self) -> bool {
        !self.task.is_finished()
    }

    /// Stops the move; the leases it was in charge of are revoked in the background.
    pub(super) fn abort(&self) {
        self.task.abort();
    }

    /// Resolves once the move has ended, or after `patience`.
    pub(super) async fn ended(mut self, patience: Duration) {
        let _ = tokio::time::timeout(patience, self.done.changed()).await;
    }

    fn clone_waiter(&self) -> Settle {
        Settle {
            task: self.task.clone(),
            done: self.done.clone(),
        }
    }
}

impl EtcdLock {
    /// Moves a parked grant's key back to a lease of the lock's `ttl` in a background
    /// task, keeping the short lease alive (and the grant's validity with it) until it
    /// has; `undo` is in charge of the grant's leases until then.
    pub(super) fn settle_later(
        &self,
        parked: Parked,
        owner: OwnerToken,
        ttl: Duration,
        monitor: &LeaseMonitor,
        current: Arc<AtomicI64>,
        undo: Undo,
    ) {
        let (signal, done) = watch::channel(());
        let lock = self.clone();
        let monitor = monitor.clone();
        let task = tokio::spawn(async move {
            let _signal = signal;
            lock.settle(parked, owner, ttl, &monitor, &current, undo)
                .await;
        })
        .abort_handle();
        if let Some(held) = self.held().get_mut(&owner.as_u128()) {
            held.settle = Some(Settle { task, done });
        }
    }

    /// Waits (up to the request timeout) for the move of the key of the grant
    /// `owner`, if one is under way.
    pub(super) async fn settled(&self, owner: OwnerToken) {
        let settle = self
            .held()
            .get(&owner.as_u128())
            .and_then(|held| held.settle.as_ref().map(Settle::clone_waiter));
        if let Some(settle) = settle {
            settle.ended(self.requests().timeout).await;
        }
    }

    async fn settle(
        &self,
        parked: Parked,
        owner: OwnerToken,
        ttl: Duration,
        monitor: &LeaseMonitor,
        current: &AtomicI64,
        mut undo: Undo,
    ) {
        let short_ttl = Duration::from_secs(u64::try_from(parked.short_secs).unwrap_or(1));
        let alive = |sent: Instant| {
            monitor.renewed(sent + short_ttl - margin(short_ttl));
        };
        tokio::select! {
            () = self.move_back(&parked, owner, ttl, monitor, current, &mut undo) => {}
            // The short lease ran out: the loss watch sees the key go.
            _ = self.keep_alive_while_waiting(parked.short, parked.short_secs, alive) => {}
            () = monitor.lost() => {}
        }
    }

    /// Moves the key to the lock's own lease while two thirds of its TTL are left (the
    /// watchdog's first renewal comes at a third), else to a fresh one; retries what
    /// fails while the grant lasts.
    async fn move_back(
        &self,
        parked: &Parked,
        owner: OwnerToken,
        ttl: Duration,
        monitor: &LeaseMonitor,
        current: &AtomicI64,
        undo: &mut Undo,
    ) {
        let (prefix, own, revision) = &parked.place;
        let (full, full_secs, full_sent) = parked.full;
        let mut fresh = None;
        let mut pause = Duration::from_millis(20);
        while monitor.state() != LeaseState::Lost {
            let target = if Instant::now() < full_sent + ttl / 3 {
                Ok((full, full_secs, full_sent))
            } else if let Some(granted) = fresh {
                Ok(granted)
            } else {
                let sent = Instant::now();
                self.fresh_lease(ttl, undo).await.map(|(id, secs)| {
                    fresh = Some((id, secs, sent));
                    (id, secs, sent)
                })
            };
            let error = match target {
                Ok((lease, secs, sent)) => {
                    let moved = self
                        .requests()
                        .move_to_lease(prefix, own, *revision, lease, None)
                        .await;
                    match moved {
                        Ok(Ok(_)) => {
                            current.store(lease, Ordering::Release);
                            if let Some(held) = self.held().get_mut(&owner.as_u128()) {
                                held.ttl_secs = secs;
                            }
                            monitor.renewed(sent + ttl - margin(ttl));
                            undo.let_go(parked.short);
                            if lease != full {
                                undo.let_go(full);
                            }
                            undo.disarm();
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
}
