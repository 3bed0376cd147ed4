//! One contender's acquire ([`EtcdLock::contend`]) as the placement of its key: which
//! of the client's shared leases it is on ([`Placement`]), and the steps that move it
//! from one to the other.
//!
//! A contender's key goes on the client's lease of the lock's TTL ([`Placement::Home`],
//! see [`super::shared`]): found free, the grant is made there, and the cycle is two
//! raft writes (this put, the release's delete). A waiter parks on the short waiting
//! lease ([`Placement::Parked`]) when the lock's TTL is longer, so that a waiter whose
//! process dies holds up the queue for seconds, not for the lock's TTL. A key this
//! client last had to wait for goes there straight away.

use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_api::backend::prelude::*;
use distlock_api::backend::WaitReport;
use distlock_api::{FencingToken, Lease, LeaseMonitor, LockError, LockKey, LockOptions};
use tokio::time::Instant;

use super::settle::Parked;
use super::shared::LeaseUse;
use super::{
    delete_when_lost, margin, owner_token, ttl_seconds, unmark_later, vanished, EtcdLock, Held,
    Interruptions, Undo, WAITER_TTL_SECS,
};
use crate::error::Fail;
use crate::keys::{pending_marker, Kind};
use crate::loss::Listener;
use crate::recipe::{Ahead, Requests, Rule, Stamp, Turn};

/// Where a contender's key is.
enum Placement {
    /// On the client's shared lease of the lock's TTL.
    Home(LeaseUse),
    /// On the client's waiting lease; with a use of the lease of the lock's TTL once
    /// one is taken (the key was put there first, or it moves back there).
    Parked {
        waiting: LeaseUse,
        home: Option<LeaseUse>,
    },
}

impl Placement {
    /// The use of the lease the key is on.
    fn on(&self) -> &LeaseUse {
        match self {
            Placement::Home(home) => home,
            Placement::Parked { waiting, .. } => waiting,
        }
    }
}

/// A contender found its turn: what its grant is made of.
struct Won<'a> {
    kind: Kind,
    key: &'a LockKey,
    /// The id its key is named by.
    named: i64,
    /// Its range, key, and create revision.
    place: (&'a str, &'a str, i64),
    token: i64,
    placement: Placement,
    /// When the grant was made (at most the put's send time for a grant at once).
    valid_from: Instant,
    ttl: Duration,
}

impl EtcdLock {
    /// One acquire of `key` by a `kind` contender (a lock's, a candidate's, a permit's,
    /// a reader's or writer's) with `value` in its key: the grant, or `Ok(None)` for a
    /// held key when `wait` is false.
    pub(crate) async fn contend(
        &self,
        kind: Kind,
        key: &LockKey,
        value: &[u8],
        options: &LockOptions,
        report: &WaitReport,
        wait: bool,
    ) -> Result<Option<(Lease, LeaseMonitor)>, LockError> {
        let ttl = options.ttl();
        let secs = ttl_seconds(ttl);
        let prefix = kind.range(self.prefix(), key);
        // A waiter parks on the waiting lease when the lock's TTL is longer, but for
        // the read-write lock (see `Kind::parks`). A key this client last had to wait
        // for is likely held again: its contender goes straight there, sparing the move.
        let parks = secs > WAITER_TTL_SECS && kind.parks();
        let expects_held = self.inner.contended.expects(&prefix);
        let straight = parks && wait && expects_held;
        let first_on = || async {
            Ok::<_, LockError>(if straight {
                Placement::Parked {
                    waiting: self.share_lease(WAITER_TTL_SECS, None).await?,
                    home: None,
                }
            } else {
                Placement::Home(self.share_lease(secs, Some(ttl)).await?)
            })
        };
        let mut placement = first_on().await?;
        // Named by a name of its own (the lease carries other keys, of this range too),
        // one this client's contenders had before if free (see `names`).
        let named = self.inner.names.take();
        let own = kind.own_key(&prefix, named);
        let mut undo = Undo::new(self.clone(), named);
        undo.delete_if_failed(&own, None, placement.on());
        let rule = Rule::of(kind, &prefix);
        // A waiter listens to the client's watch before its put, whose transaction
        // reads the contenders ahead: it then counts them down with no read of its own.
        let listener = if wait && Requests::watches_ahead(&rule, &own) {
            let listened = self.requests().feed.listen(self.requests().timeout).await;
            Some(listened.map_err(|f| self.connection_error(f))?)
        } else {
            None
        };
        let mut sent = Instant::now();
        // A key found held last time is likely held again: its put reads the queue at
        // once rather than first asking whether the range is empty.
        let alone = !expects_held;
        let mut placed = match self
            .requests()
            .place(&rule, &own, value, placement.on().id, alone)
            .await
        {
            // The shared lease ran out or was revoked from outside before its keep-alive
            // task saw it (the put, refused, wrote nothing): once more on a fresh one.
            Err(fail) if fail.is_lease_not_found() => {
                self.inner.shared.retire(placement.on().id);
                placement = first_on().await?;
                undo.delete_if_failed(&own, None, placement.on());
                sent = Instant::now();
                self.requests()
                    .place(&rule, &own, value, placement.on().id, alone)
                    .await
            }
            placed => placed,
        }
        .map_err(|f| self.put_failed(f, placement.on().id))?;
        undo.placed();
        if let Err(mismatch) = crate::semaphore::check_count(kind, key, &own, &placed.seen) {
            undo.delete_now().await;
            return Err(mismatch);
        }
        self.inner.contended.record(&prefix, !placed.first);
        let place = (prefix.as_str(), own.as_str(), placed.revision);
        let mut won = Won {
            kind,
            key,
            named,
            place,
            token: placed.revision,
            placement,
            valid_from: sent,
            ttl,
        };
        if placed.first {
            return self.grant(won, undo).map(Some);
        }
        report.saw_held();
        if !wait {
            undo.delete_now().await;
            return Ok(None);
        }
        // A semaphore or read-write waiter marks its grant pending (with the move to
        // the waiting lease, if any), and stamps it once granted (see `stamp_grant`).
        let pending = kind.pending_range(self.prefix(), key);
        let marker = pending
            .as_deref()
            .map(|p| pending_marker(p, placed.revision));
        won.placement = match won.placement {
            Placement::Home(home) if parks => {
                let waiting = self.share_lease(WAITER_TTL_SECS, None).await?;
                undo.delete_if_failed(&own, marker.as_deref(), &waiting);
                self.rehome(place, waiting.id, marker.as_deref()).await?;
                Placement::Parked {
                    waiting,
                    home: Some(home),
                }
            }
            placement => {
                if let Some(marker) = &marker {
                    let on = placement.on();
                    undo.delete_if_failed(&own, Some(marker), on);
                    let marked = self
                        .requests()
                        .mark_pending(&prefix, &own, placed.revision, marker, on.id)
                        .await;
                    Self::while_waiting(marked.map_err(|f| self.put_failed(f, on.id))?)?;
                }
                placement
            }
        };
        // A parked lock or candidate is granted on the waiting lease, and its key moves
        // back behind the grant (see `settle`): no write on the hand-off's path. A
        // parked permit moves back in the transaction that finds the turn ours (its
        // stamp is written under the lock's lease).
        let back = match &mut won.placement {
            Placement::Parked { home, .. } if marker.is_some() => {
                if home.is_none() {
                    *home = Some(self.share_lease(secs, Some(ttl)).await?);
                }
                home.as_ref().map(|home| home.id)
            }
            _ => None,
        };
        let head_start = listener.zip(placed.ahead.take());
        tokio::select! {
            turn = self.wait_turn((&rule, &own, placed.revision), back, marker.as_deref(), head_start, options.error_patience()) => turn?,
            lost = won.placement.on().gone() => return Err(lost),
        }
        if back.is_some() {
            won.placement = match won.placement {
                Placement::Parked {
                    home: Some(home), ..
                } => {
                    undo.delete_if_failed(&own, marker.as_deref(), &home);
                    Placement::Home(home)
                }
                placement => placement,
            };
        }
        if let Some(pending) = pending.as_deref().zip(marker.as_deref()) {
            let on = won.placement.on();
            tokio::select! {
                stamp = self.stamp_grant(place, pending, on.id, options.error_patience()) => won.token = stamp?,
                lost = on.gone() => return Err(lost),
            }
        }
        won.valid_from = Instant::now();
        let granted = self.grant(won, undo)?;
        if let Some(marker) = marker {
            unmark_later(self.requests().clone(), marker);
        }
        Ok(Some(granted))
    }

    /// The grant of a contender that `won`: its lease and monitor, its records (the
    /// loss watch's, [`Held`]), and, for a parked grant, the move of its key back.
    ///
    /// Valid until its TTL from `valid_from`, or less if the lease its key is on was
    /// last seen alive too long ago (then each keep-alive moves the deadline on).
    ///
    /// # Errors
    /// A retryable [`LockError::Connection`] when that lease is gone (its key with it).
    fn grant(&self, won: Won<'_>, mut undo: Undo) -> Result<(Lease, LeaseMonitor), LockError> {
        let Won {
            kind,
            key,
            named,
            place: (prefix, own, revision),
            token,
            placement,
            valid_from,
            ttl,
        } = won;
        let cap_at = valid_from + ttl - margin(ttl);
        let (mut on, parked) = match placement {
            Placement::Home(home) => (home, None),
            Placement::Parked { waiting, home } => (waiting, Some(home)),
        };
        // Gone since (its keep-alive task saw it), with our key.
        let valid_until = on.valid_until(cap_at).ok_or_else(vanished)?;
        let owner = owner_token(named, revision, kind);
        let token = FencingToken::new(u64::try_from(token).unwrap_or(0));
        let lease = Lease::new(key.clone(), owner, Some(token), ttl, valid_from);
        let monitor = LeaseMonitor::new(valid_until);
        let cap = Arc::new(Mutex::new(cap_at));
        on.carry(&monitor, &cap);
        let current = Arc::new(AtomicI64::new(on.id));
        self.inner
            .loss
            .watched
            .watch(own, revision, monitor.clone());
        let place = (prefix.to_owned(), own.to_owned(), revision);
        let watch = tokio::spawn(delete_when_lost(
            self.clone(),
            place.clone(),
            current.clone(),
            monitor.clone(),
        ))
        .abort_handle();
        self.held().insert(
            owner.as_u128(),
            Held {
                lease: current,
                ttl_secs: on.secs,
                cap: cap.clone(),
                on: Some(on),
                monitor: monitor.clone(),
                watch,
                settle: None,
            },
        );
        if let Some(home) = parked {
            self.settle_later(Parked { place, home }, owner, ttl, &monitor, &cap);
        }
        undo.disarm();
        Ok((lease, monitor))
    }

    /// Moves our contender key (create revision `revision`), and our pending `marker` if
    /// any, to `lease`.
    async fn rehome(
        &self,
        (prefix, own, revision): (&str, &str, i64),
        lease: i64,
        marker: Option<&str>,
    ) -> Result<(), LockError> {
        let moved = self
            .requests()
            .move_to_lease(prefix, own, revision, lease, marker);
        let moved = moved.await.map_err(|f| self.put_failed(f, lease))?;
        Self::while_waiting(moved).map(drop)
    }

    /// The error of a write that put our key (or marker) under `lease`. When etcd no
    /// longer has that shared lease (it ran out before its keep-alive task saw it), the
    /// lease is retired and the acquire tries again on a fresh one.
    pub(super) fn put_failed(&self, fail: Fail, lease: i64) -> LockError {
        if fail.is_lease_not_found() && self.inner.shared.carries(lease) {
            self.inner.shared.retire(lease);
            return vanished();
        }
        self.connection_error(fail)
    }

    /// A write to a waiting contender's key, or the error of its key being gone.
    fn while_waiting(written: Result<i64, bool>) -> Result<i64, LockError> {
        written.map_err(|_| vanished())
    }

    /// Waits until fewer blocking contenders than the rule's room are older than ours
    /// (create revision `revision`). With `back`, the look that finds the turn ours
    /// also moves our key (and pending `marker`) to that lease (in the same
    /// transaction, see [`Requests::turn_and_move`]). A `head_start` (see
    /// [`Requests::watch_turn`]) serves the first look.
    async fn wait_turn(
        &self,
        (rule, own, revision): (&Rule, &str, i64),
        back: Option<i64>,
        marker: Option<&str>,
        mut head_start: Option<(Listener, Ahead)>,
        patience: Duration,
    ) -> Result<(), LockError> {
        let mut interruptions = Interruptions::new(patience);
        // The revision the next look must read at or after: that of the last deletion
        // waited for.
        let mut seen = revision;
        loop {
            let turn = match back {
                Some(lease) => {
                    self.requests()
                        .turn_and_move(rule, own, revision, lease, marker)
                        .await
                }
                None if Requests::watches_ahead(rule, own) => {
                    let started = head_start.take();
                    self.requests()
                        .watch_turn(rule, own, revision, seen, started)
                        .await
                }
                None => self.requests().turn(rule, own, revision, seen).await,
            };
            let outcome = match turn {
                Ok(Turn::Ours) => return Ok(()),
                Ok(Turn::Gone) => return Err(vanished()),
                Ok(Turn::After(older)) => self.requests().deleted(older, &rule.blocking).await,
                Err(fail) => Err(fail),
            };
            match outcome {
                Ok(at) => {
                    seen = seen.max(at);
                    interruptions.answered();
                }
                Err(fail) => interruptions.ride_out(self.connection_error(fail)).await?,
            }
        }
    }

    /// A semaphore or read-write waiter's fencing token, once granted: the revision of
    /// its pending marker `pending`'s `marker` written again, once no older contender's
    /// marker is left. The marker is deleted ([`unmark_later`]) only once the acquire
    /// has nothing left to await.
    ///
    /// Waiters granted by the same deletions learn it in no set order, so their queue
    /// revisions would not rise in the order grants are learned, nor would stamps sent
    /// at once. Chained in queue order, a grant stamps only after the one before it
    /// has returned (a marker of an older contender can only be of one granted with or
    /// before ours: the semaphore and the read-write lock grant in queue order). A
    /// marker whose deletion was lost goes with its grant's release or lease.
    async fn stamp_grant(
        &self,
        (prefix, own, revision): (&str, &str, i64),
        (pending, marker): (&str, &str),
        lease: i64,
        patience: Duration,
    ) -> Result<i64, LockError> {
        let mut interruptions = Interruptions::new(patience);
        loop {
            let outcome = match self.requests().stamp(own, revision, pending, marker).await {
                Ok(Stamp::At(token)) => return Ok(token),
                Ok(Stamp::Gone) => return Self::while_waiting(Err(false)),
                Ok(Stamp::Unmarked) => {
                    let marked = self
                        .requests()
                        .mark_pending(prefix, own, revision, marker, lease)
                        .await;
                    match marked {
                        Ok(Err(_)) => return Self::while_waiting(Err(false)),
                        other => other.map(drop),
                    }
                }
                Ok(Stamp::After(older)) if older.is_empty() => Ok(()),
                Ok(Stamp::After(older)) => self.requests().deleted(older, pending).await.map(drop),
                Err(fail) => Err(fail),
            };
            match outcome {
                Ok(()) => interruptions.answered(),
                Err(fail) => interruptions.ride_out(self.connection_error(fail)).await?,
            }
        }
    }
}
