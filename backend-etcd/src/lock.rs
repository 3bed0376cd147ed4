//! [`EtcdLock`]: the mutex on etcd's `concurrency.Mutex` recipe.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use distlock_api::backend::prelude::*;
use distlock_api::backend::{spawn_cleanup, WaitReport};
use distlock_api::{
    ExtendOutcome, FencingToken, Lease, LeaseMonitor, LockError, LockKey, LockOptions,
    OptionsError, OwnerToken, ReleaseOutcome,
};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::config::{parse_url, EtcdConfig, EtcdUrl};
use crate::error::{at_servers, Fail};
use crate::keys::{pending_marker, Kind};
use crate::loss::{Listener, LossWatch};
use crate::recipe::{Requests, Rule, Stamp, Turn};
use crate::session::{LiveLeases, Session};
use crate::ETCD_BACKEND;

mod contended;
mod interruptions;
mod settle;
mod waiting;

use contended::Contended;
use interruptions::Interruptions;
use settle::{Parked, Settle, Stage};
use waiting::{Parking, WaitingLease};

/// The TTL, in seconds, of the lease a waiter waits under (when the lock's is longer):
/// how long a waiter whose process died (without revoking) holds up the queue behind it.
pub(crate) const WAITER_TTL_SECS: i64 = 3;

/// A distributed lock client on etcd (see the crate docs for the protocol).
///
/// Cheap to clone: clones share the connection and the leases.
#[derive(Clone)]
pub struct EtcdLock {
    inner: Arc<Inner>,
}

struct Inner {
    session: Session,
    requests: Requests,
    /// The key prefix (no trailing `/`).
    prefix: String,
    /// The held locks of this client, by owner token.
    held: Mutex<HashMap<u128, Held>>,
    /// The watch that marks held locks lost when their keys go.
    loss: LossWatch,
    /// The keys whose last acquire waited.
    contended: Contended,
    /// The lease this client's waiters wait under.
    waiting: WaitingLease,
}

/// A lock this client holds.
struct Held {
    /// The lease its key is attached to now (an extend to a longer TTL moves it),
    /// shared with the loss watch, which revokes it once the lock is lost.
    lease: Arc<AtomicI64>,
    /// That lease's TTL in whole seconds.
    ttl_secs: i64,
    /// The task that revokes the lease once the lock is lost.
    watch: AbortHandle,
    /// The move of a parked grant's key back to the lock's lease, while under way.
    settle: Option<Settle>,
}

impl std::fmt::Debug for EtcdLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdLock")
            .field("session", &self.inner.session)
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

impl EtcdLock {
    /// Connects to the etcd cluster named by `url` (see [`parse_url`]) with the default
    /// [`EtcdConfig`].
    ///
    /// # Errors
    /// [`LockError::Config`] for a bad URL or credentials etcd refuses;
    /// [`LockError::Connection`] (naming the endpoints) when no endpoint answers within
    /// the timeouts.
    pub async fn connect(url: &str) -> Result<EtcdLock, LockError> {
        Self::connect_with(url, EtcdConfig::default()).await
    }

    /// [`EtcdLock::connect`] with explicit settings.
    ///
    /// # Errors
    /// As [`EtcdLock::connect`].
    pub async fn connect_with(url: &str, config: EtcdConfig) -> Result<EtcdLock, LockError> {
        let url = parse_url(url)?;
        Self::connect_parsed(&url, config).await
    }

    /// [`EtcdLock::connect_with`] for an already parsed URL.
    ///
    /// # Errors
    /// As [`EtcdLock::connect`].
    pub async fn connect_parsed(url: &EtcdUrl, config: EtcdConfig) -> Result<EtcdLock, LockError> {
        let session = Session::connect(url, &config).await?;
        let loss = LossWatch::spawn(session.client.clone(), &url.prefix, config.request_timeout);
        let requests = Requests {
            client: session.client.clone(),
            timeout: config.request_timeout,
            feed: loss.feed.clone(),
        };
        Ok(EtcdLock {
            inner: Arc::new(Inner {
                session,
                requests,
                prefix: url.prefix.clone(),
                held: Mutex::new(HashMap::new()),
                loss,
                contended: Contended::default(),
                waiting: WaitingLease::default(),
            }),
        })
    }

    /// The key prefix (no trailing `/`).
    pub(crate) fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    pub(crate) fn requests(&self) -> &Requests {
        &self.inner.requests
    }

    fn live(&self) -> &Arc<LiveLeases> {
        &self.inner.session.live
    }

    /// The endpoints, for errors (`h1:p1,h2:p2`, no credentials).
    pub(crate) fn hosts(&self) -> &str {
        &self.inner.session.hosts
    }

    pub(crate) fn connection_error(&self, fail: Fail) -> LockError {
        at_servers(&self.inner.session.hosts, fail.into())
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<u128, Held>> {
        self.inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Grants a fresh lease of `ttl` (listed as live first, so that a drop or a
    /// shutdown revokes it); returns its id and TTL in seconds.
    async fn fresh_lease(&self, ttl: Duration, undo: &mut Undo) -> Result<(i64, i64), LockError> {
        let ttl_secs = ttl_seconds(ttl);
        let (id, granted) = self.grant_lease(ttl_secs, undo).await?;
        if granted > ttl_secs {
            undo.revoke_now().await;
            return Err(LockError::invalid_options(
                ETCD_BACKEND,
                OptionsError::TtlTooShort {
                    ttl,
                    min: Duration::from_secs(u64::try_from(granted).unwrap_or(u64::MAX)),
                },
            ));
        }
        Ok((id, ttl_secs))
    }

    /// Grants a fresh lease of `secs` (listed as live first); returns its id and the
    /// TTL etcd granted.
    async fn grant_lease(&self, secs: i64, undo: &mut Undo) -> Result<(i64, i64), LockError> {
        let id = new_lease_id();
        undo.arm(id);
        let granted = self
            .requests()
            .grant(id, secs)
            .await
            .map_err(|f| self.connection_error(f))?;
        Ok((id, granted))
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

    /// The error of a write that put our key (or marker) under `lease`. When that is
    /// the waiting lease and etcd no longer has it (it ran out before its keep-alive
    /// task saw it), the lease is retired and the acquire tries again on a fresh one.
    fn put_failed(&self, fail: Fail, lease: i64) -> LockError {
        if fail.is_lease_not_found() && self.inner.waiting.carries(lease) {
            self.inner.waiting.retire(lease);
            return vanished();
        }
        self.connection_error(fail)
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

    /// A write to a waiting contender's key, or the error of its key being gone.
    fn while_waiting(written: Result<i64, bool>) -> Result<i64, LockError> {
        written.map_err(|_| vanished())
    }

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
        let mut undo = Undo::new(self.clone());
        let mut sent = Instant::now();
        let prefix = kind.range(self.prefix(), key);
        // Whether a waiter waits under the client's waiting lease (see below), and
        // whether this contender goes there straight away: a key this client last had
        // to wait for is likely held again, so its contender is placed on that lease
        // with no lease of the lock's TTL yet, sparing a contended cycle that lease's
        // grant and revoke and the move onto the waiting lease. Granted at once all the
        // same, it is a parked grant (see `settle`), as a waiter's would be.
        let parks = ttl_seconds(ttl) > WAITER_TTL_SECS && kind.parks();
        let straight = parks && wait && self.inner.contended.expects(&prefix);
        // The lock's own lease, when granted here: its id, TTL in seconds, and when its
        // grant was sent.
        let mut full = None;
        // This contender's use of the client's waiting lease, while its key is on it.
        let mut parking = None;
        // The key is named by the first lease's id, and keeps that name when it moves
        // to others; on the shared waiting lease, by an id of its own.
        let (named, mut lease, mut ttl_secs) = if straight {
            let parked = self.park().await?;
            sent = parked.alive_since().unwrap_or(sent);
            let placing = (new_lease_id(), parked.id, parked.secs);
            parking = Some(parked);
            placing
        } else {
            let (id, secs) = self.fresh_lease(ttl, &mut undo).await?;
            full = Some((id, secs, sent));
            (id, id, secs)
        };
        let own = kind.own_key(&prefix, named);
        if let Some(parked) = &parking {
            undo.delete_if_failed(&own, None, parked);
        }
        let rule = Rule::of(kind, &prefix);
        // A waiter listens to the client's watch before its put, whose transaction
        // reads the contenders ahead: it then counts them down with no read of its own.
        let listener = if wait && Requests::watches_ahead(&rule, &own) {
            let listened = self.requests().feed.listen(self.requests().timeout).await;
            Some(listened.map_err(|f| self.connection_error(f))?)
        } else {
            None
        };
        let mut placed = self
            .requests()
            .place(&rule, &own, value, lease)
            .await
            .map_err(|f| self.put_failed(f, lease))?;
        undo.placed();
        if let Err(mismatch) = crate::semaphore::check_count(kind, key, &own, &placed.seen) {
            undo.revoke_now().await;
            return Err(mismatch);
        }
        if parks {
            self.inner.contended.record(&prefix, !placed.first);
        }
        // The fencing token: the placement's revision, unless a semaphore or read-write
        // contender waits (then its stamp's, see `stamp_grant`).
        let mut token = placed.revision;
        let mut stamped = None;
        // A parked grant whose key is still to move back (see `settle`), and how long
        // the grant is valid for from `sent`: the waiting lease's TTL until the move lands.
        let mut settling = None;
        let mut valid_for = ttl;
        let short_lived = |secs: i64| Duration::from_secs(u64::try_from(secs).unwrap_or(1));
        if placed.first {
            if let Some(parked) = parking.take() {
                settling = Some(Parked {
                    place: (prefix.clone(), own.clone(), placed.revision),
                    short: parked,
                    full: None,
                });
                valid_for = short_lived(ttl_secs);
            }
        }
        if !placed.first {
            report.saw_held();
            if !wait {
                undo.revoke_now().await;
                return Ok(None);
            }
            // Wait under the client's short waiting lease, so that a waiter whose process
            // dies holds up the queue behind it for seconds, not for the lock's TTL
            // (see `waiting`). The lock's own lease, if granted, is kept (not renewed)
            // to move back to when the wait was short. Not for the read-write lock (see
            // `Kind::parks`). A semaphore or read-write waiter marks its grant pending
            // (with the move, if any).
            let pending = kind.pending_range(self.prefix(), key);
            let marker = pending
                .as_deref()
                .map(|p| pending_marker(p, placed.revision));
            let place = (prefix.as_str(), own.as_str(), placed.revision);
            if parks && !straight {
                let parked = self.park().await?;
                undo.delete_if_failed(&own, marker.as_deref(), &parked);
                self.rehome(place, parked.id, marker.as_deref()).await?;
                (lease, ttl_secs) = (parked.id, parked.secs);
                // Valid, while the key is on it, as of that lease's last keep-alive.
                sent = parked.alive_since().unwrap_or(sent);
                parking = Some(parked);
            } else if let Some(marker) = &marker {
                if let Some(parked) = &parking {
                    undo.delete_if_failed(&own, Some(marker), parked);
                }
                let marked = self
                    .requests()
                    .mark_pending(&prefix, &own, placed.revision, marker, lease)
                    .await;
                Self::while_waiting(marked.map_err(|f| self.put_failed(f, lease))?)?;
            }
            // A parked lock or candidate is granted on the waiting lease, and its key
            // moves back behind the grant (see `settle`): no write on the hand-off's
            // path. Others move back in the transaction that finds the turn
            // ours, while two thirds of the lock's TTL are left (the watchdog's first
            // renewal comes at a third), else to a fresh lease below.
            let later = parks && marker.is_none();
            let back = full
                .filter(|_| parks && !later)
                .map(|(id, _, granted_at)| (id, granted_at + ttl / 3));
            let head_start = listener.zip(placed.ahead.take());
            let alive_since = Mutex::new(sent);
            let keep_alive = async {
                match &parking {
                    Some(parked) => parked.follow(|at| record(&alive_since, at)).await,
                    None => {
                        self.keep_alive_while_waiting(lease, ttl_secs, |at| {
                            record(&alive_since, at)
                        })
                        .await
                    }
                }
            };
            let moved = tokio::select! {
                turn = self.wait_turn((&rule, &own, placed.revision), back, marker.as_deref(), head_start, options.error_patience()) => turn?,
                lost = keep_alive => return Err(lost),
            };
            sent = *alive_since.lock().unwrap_or_else(PoisonError::into_inner);
            match (full, parking.take()) {
                (full, Some(parked)) if later => {
                    settling = Some(Parked {
                        place: (prefix.clone(), own.clone(), placed.revision),
                        short: parked,
                        full,
                    });
                    valid_for = short_lived(ttl_secs);
                }
                // The key has left the waiting lease (which is dropped here).
                (Some((id, secs, granted_at)), Some(_)) if moved => {
                    undo.moved_off_waiting();
                    sent = granted_at;
                    (lease, ttl_secs) = (id, secs);
                }
                (full, Some(_parked)) => {
                    // The lock's own lease only once the key is on the fresh lease: a
                    // move to it whose answer was lost may have landed.
                    sent = Instant::now();
                    let (fresh, fresh_secs) = self.fresh_lease(ttl, &mut undo).await?;
                    self.rehome(place, fresh, marker.as_deref()).await?;
                    undo.moved_off_waiting();
                    if let Some((id, _, _)) = full {
                        undo.let_go(id);
                    }
                    (lease, ttl_secs) = (fresh, fresh_secs);
                }
                (_, None) => {}
            }
            if let Some(pending) = pending.as_deref().zip(marker.as_deref()) {
                let alive_since = Mutex::new(sent);
                tokio::select! {
                    stamp = self.stamp_grant(place, pending, lease, options.error_patience()) => token = stamp?,
                    lost = self.keep_alive_while_waiting(lease, ttl_secs, |at| record(&alive_since, at)) => return Err(lost),
                }
                sent = *alive_since.lock().unwrap_or_else(PoisonError::into_inner);
                stamped = marker;
            }
        }
        let valid_from = sent;
        let owner = owner_token(named, placed.revision, kind);
        let token = FencingToken::new(u64::try_from(token).unwrap_or(0));
        let granted = Lease::new(key.clone(), owner, Some(token), ttl, valid_from);
        let monitor = LeaseMonitor::new(valid_from + valid_for - margin(valid_for));
        let current = Arc::new(AtomicI64::new(lease));
        self.inner.loss.watched.watch(&own, monitor.clone());
        let watch = tokio::spawn(revoke_when_lost(
            self.clone(),
            current.clone(),
            monitor.clone(),
        ))
        .abort_handle();
        self.held().insert(
            owner.as_u128(),
            Held {
                lease: current.clone(),
                ttl_secs,
                watch,
                settle: None,
            },
        );
        // The settle task has the parked grant's leases in charge from here.
        if let Some(parked) = settling {
            self.settle_later(parked, owner, ttl, &monitor, current);
        }
        undo.disarm();
        if let Some(marker) = stamped {
            unmark_later(self.requests().clone(), marker);
        }
        Ok(Some((granted, monitor)))
    }

    /// Waits until fewer blocking contenders than the rule's room are older than ours
    /// (create revision `revision`). With `back` = (lease, deadline), the look that
    /// finds the turn ours also moves our key (and pending `marker`) to that lease if
    /// sent before the deadline (in the same transaction, see
    /// [`Requests::turn_and_move`]); returns whether it did. A `head_start` (see
    /// [`Requests::watch_turn`]) serves the first look.
    async fn wait_turn(
        &self,
        (rule, own, revision): (&Rule, &str, i64),
        back: Option<(i64, Instant)>,
        marker: Option<&str>,
        mut head_start: Option<(Listener, HashSet<Vec<u8>>)>,
        patience: Duration,
    ) -> Result<bool, LockError> {
        let mut interruptions = Interruptions::new(patience);
        // The revision the next look must read at or after: that of the last deletion
        // waited for.
        let mut seen = revision;
        loop {
            let to = back.filter(|(_, deadline)| Instant::now() < *deadline);
            let turn = match to {
                Some((lease, _)) => {
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
                Ok(Turn::Ours) => return Ok(to.is_some()),
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

    /// Keeps a waiter's lease alive every third of its TTL, telling `alive` when each
    /// answered keep-alive was sent; returns only when the lease is gone.
    pub(crate) async fn keep_alive_while_waiting(
        &self,
        lease: i64,
        ttl_secs: i64,
        alive: impl Fn(Instant),
    ) -> LockError {
        let period = Duration::from_secs(u64::try_from(ttl_secs).unwrap_or(1)) / 3;
        loop {
            tokio::time::sleep(period).await;
            let sent = Instant::now();
            match self.requests().keep_alive(lease).await {
                Ok(()) => alive(sent),
                Err(fail) if fail.is_lease_not_found() => {
                    return LockError::connection(
                        ETCD_BACKEND,
                        "the waiting contender's lease expired while it waited",
                    )
                }
                Err(fail) => {
                    tracing::debug!(error = %LockError::from(fail), "keep-alive of a waiter failed; retrying")
                }
            }
        }
    }

    /// What a release or extend of a lease that is not (any more) ours reports.
    fn not_ours<T>(held_by_other: bool, held: T, expired: T) -> T {
        if held_by_other {
            held
        } else {
            expired
        }
    }

    /// The lease a held lock's key is attached to now, its TTL in seconds, and whether
    /// it is the grant's own to revoke: from this client's records, else read from
    /// etcd. `Err(held_by_other)` when the key is gone.
    ///
    /// Read from etcd, a lease is known to be the grant's own only when it is the one
    /// the key is named by; any other (another client's waiting lease, which carries
    /// others' keys, or one of unknown TTL) reads as TTL 0, so that an extend moves the
    /// key off it, and is not revoked.
    async fn current_lease(
        &self,
        lease: &Lease,
        prefix: &str,
        own: &str,
        revision: i64,
    ) -> Result<Result<(i64, i64, bool), bool>, LockError> {
        if let Some(held) = self.held().get(&lease.owner().as_u128()) {
            let id = held.lease.load(Ordering::Acquire);
            return Ok(Ok((id, held.ttl_secs, !self.inner.waiting.carries(id))));
        }
        match self
            .requests()
            .own_key(prefix, own, revision)
            .await
            .map_err(|f| self.connection_error(f))?
        {
            Ok(kv) if kv.lease() == named_by(lease) => {
                Ok(Ok((kv.lease(), ttl_seconds(lease.ttl()), true)))
            }
            Ok(kv) => Ok(Ok((kv.lease(), 0, false))),
            Err(other) => Ok(Err(other)),
        }
    }
}

/// The low bit of an owner token that marks a reader's lease (the rest is the lease id
/// the key is named by and the key's create revision).
const READ_TAG: u64 = 1;

/// A grant's owner token: the lease id its key is named by (high 64 bits), its key's
/// create revision (shifted left by one) and its kind's tag. A release or extend finds
/// the key by it (the fencing token of a waited permit or read-write grant is another
/// revision).
fn owner_token(named: i64, revision: i64, kind: Kind) -> OwnerToken {
    let tag = match kind {
        Kind::Read => READ_TAG,
        _ => 0,
    };
    OwnerToken::from_u128(
        (u128::from(named as u64) << 64) | u128::from((revision as u64) << 1) | u128::from(tag),
    )
}

/// The id a grant's key is named by (see [`owner_token`]).
fn named_by(lease: &Lease) -> i64 {
    (lease.owner().as_u128() >> 64) as u64 as i64
}

/// Whether `lease` is a reader's (by its owner token's tag, see [`owner_token`]).
pub(crate) fn reads(lease: &Lease) -> bool {
    lease.owner().as_u128() as u64 & READ_TAG != 0
}

impl EtcdLock {
    /// Where a `kind` lease's key is: its range, its own key, its create revision (all
    /// from the owner token, see [`owner_token`]), and where its pending marker would
    /// be. A forged token may name a key that is not there, which reads as not ours.
    /// A permit's count does not matter here.
    fn place_of(&self, kind: Kind, lease: &Lease) -> (String, String, i64, Option<String>) {
        let prefix = kind.range(self.prefix(), lease.key());
        let own = kind.own_key(&prefix, named_by(lease));
        let revision = (lease.owner().as_u128() as u64 >> 1) as i64;
        let marker = kind
            .pending_range(self.prefix(), lease.key())
            .map(|pending| pending_marker(&pending, revision));
        (prefix, own, revision, marker)
    }

    /// Owner-checked release of a `kind` contender's `lease`.
    pub(crate) async fn release_in(
        &self,
        kind: Kind,
        lease: &Lease,
    ) -> Result<ReleaseOutcome, LockError> {
        let (prefix, own, revision, marker) = self.place_of(kind, lease);
        let held = self.held().remove(&lease.owner().as_u128());
        // A parked grant's move stops here. The leases it had in charge are revoked
        // (in the background, as `spare` drops) but for the one revoked below.
        let mut spare = Undo::new(self.clone());
        let mut moving = false;
        if let Some(settle) = held.as_ref().and_then(|h| h.settle.as_ref()) {
            let (stage, leases) = settle.release();
            moving = matches!(stage, Stage::Moving { .. });
            spare.leases = leases;
        }
        if let Some(held) = &held {
            held.watch.abort();
            let present = self.inner.loss.watched.forget(&own);
            let lease_id = held.lease.load(Ordering::Acquire);
            // One request: the lease carries this key alone (and its pending marker, if
            // still there), so revoking it deletes the key (and frees the lock) in the
            // same raft entry. Not when the loss watch saw the key deleted: the
            // transaction below tells who holds the lock then. Nor while a parked
            // grant's key is on the waiting lease, which carries others' keys too, or
            // may be moving to another lease.
            if present && !moving && !self.inner.waiting.carries(lease_id) {
                spare.leases.retain(|l| *l != lease_id);
                let revoked = self
                    .requests()
                    .revoke(lease_id)
                    .await
                    .map_err(|f| self.connection_error(f))?;
                self.live().remove(lease_id);
                if revoked {
                    return Ok(ReleaseOutcome::Released);
                }
                // The lease ran out (or was revoked from outside), taking the key.
            }
        }
        let deleted = match self
            .requests()
            .delete_own(&prefix, &own, revision, marker.as_deref())
            .await
        {
            Ok(deleted) => deleted,
            Err(fail) => {
                // A key left on the waiting lease goes with it, once retired.
                if let Some(held) = &held {
                    self.inner
                        .waiting
                        .retire(held.lease.load(Ordering::Acquire));
                }
                return Err(self.connection_error(fail));
            }
        };
        if let Some(held) = &held {
            let lease_id = held.lease.load(Ordering::Acquire);
            spare.leases.retain(|l| *l != lease_id);
        }
        let outcome = match deleted {
            Ok(attached) => {
                // A lease read from etcd is revoked only when it is the one the key is
                // named by: another may be another client's waiting lease.
                let lease_id = match &held {
                    Some(held) => held.lease.load(Ordering::Acquire),
                    None if attached == named_by(lease) => attached,
                    None => 0,
                };
                if lease_id != 0 && !self.inner.waiting.carries(lease_id) {
                    // The key is gone already; an empty lease would only run out.
                    if let Err(fail) = self.requests().revoke(lease_id).await {
                        tracing::debug!(error = %LockError::from(fail), "revoking a released lock's lease failed; it runs out");
                    }
                    self.live().remove(lease_id);
                }
                ReleaseOutcome::Released
            }
            Err(other) => {
                if let Some(held) = &held {
                    let lease_id = held.lease.load(Ordering::Acquire);
                    if !self.inner.waiting.carries(lease_id) {
                        let _ = self.requests().revoke(lease_id).await;
                        self.live().remove(lease_id);
                    }
                }
                Self::not_ours(other, ReleaseOutcome::HeldByOther, ReleaseOutcome::Expired)
            }
        };
        Ok(outcome)
    }

    /// Owner-checked extend of a `kind` contender's `lease` to `ttl`.
    pub(crate) async fn extend_in(
        &self,
        kind: Kind,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        self.settled(lease.owner()).await?;
        let (prefix, own, revision, _) = self.place_of(kind, lease);
        let prefix = prefix.as_str();
        let (current, secs, revocable) =
            match self.current_lease(lease, prefix, &own, revision).await? {
                Ok(found) => found,
                Err(other) => {
                    return Ok(Self::not_ours(
                        other,
                        ExtendOutcome::HeldByOther,
                        ExtendOutcome::Expired,
                    ))
                }
            };
        let sent = Instant::now();
        // A TTL up to the lease's own is a keep-alive (etcd then holds the key up to
        // the lease's TTL, the validity deadline says `ttl`); a longer one needs a
        // longer lease.
        if ttl_seconds(ttl) <= secs {
            let (alive, key) = tokio::join!(
                self.requests().keep_alive(current),
                self.requests().own_key(prefix, &own, revision)
            );
            let key = key.map_err(|f| self.connection_error(f))?;
            match (alive, key) {
                (Ok(()), Ok(_)) => {}
                (Err(fail), _) if !fail.is_lease_not_found() => {
                    return Err(self.connection_error(fail))
                }
                (_, Err(other)) => {
                    return Ok(Self::not_ours(
                        other,
                        ExtendOutcome::HeldByOther,
                        ExtendOutcome::Expired,
                    ))
                }
                (Err(_), Ok(_)) => return Ok(ExtendOutcome::Expired),
            }
        } else {
            // Another TTL: move the key to a lease of that TTL, keeping its revision.
            let mut undo = Undo::new(self.clone());
            let (fresh, fresh_secs) = self.fresh_lease(ttl, &mut undo).await?;
            let moved = self
                .requests()
                .move_to_lease(prefix, &own, revision, fresh, None)
                .await
                .map_err(|f| self.connection_error(f))?;
            if let Err(other) = moved {
                undo.revoke_now().await;
                return Ok(Self::not_ours(
                    other,
                    ExtendOutcome::HeldByOther,
                    ExtendOutcome::Expired,
                ));
            }
            undo.disarm();
            if let Some(held) = self.held().get_mut(&lease.owner().as_u128()) {
                held.lease.store(fresh, Ordering::Release);
                held.ttl_secs = fresh_secs;
            }
            if revocable {
                if let Err(fail) = self.requests().revoke(current).await {
                    tracing::debug!(error = %LockError::from(fail), "revoking the replaced lease failed; it runs out");
                }
                self.live().remove(current);
            }
        }
        Ok(ExtendOutcome::Extended {
            valid_until: sent + ttl - margin(ttl),
        })
    }
}

/// Revokes a contender's leases unless disarmed: on a failed or dropped acquire, at
/// once when awaited ([`Undo::revoke_now`]), else in the background on drop. A key on
/// the client's waiting lease, which is not revoked for one contender, is deleted.
struct Undo {
    lock: EtcdLock,
    leases: Vec<i64>,
    /// Our key and pending marker while they may be on the waiting lease, and a use of
    /// that lease that lasts until they are deleted.
    parked: Option<(String, Option<String>, Parking)>,
    /// Whether the put of our key was answered: one whose answer was not may still
    /// land after the key's deletion.
    placed: bool,
}

impl Undo {
    fn new(lock: EtcdLock) -> Self {
        Undo {
            lock,
            leases: Vec::new(),
            parked: None,
            placed: false,
        }
    }

    /// Lists `lease` as live before it is granted, and takes charge of it.
    fn arm(&mut self, lease: i64) {
        self.lock.live().add(lease);
        self.leases.push(lease);
    }

    /// Takes charge of our key `own` (and pending `marker`), which may be put on the
    /// waiting lease of `parked` from now on.
    fn delete_if_failed(&mut self, own: &str, marker: Option<&str>, parked: &Parking) {
        self.parked = Some((own.to_owned(), marker.map(str::to_owned), parked.share()));
    }

    /// The put of our key was answered.
    fn placed(&mut self) {
        self.placed = true;
    }

    /// Our key (and marker) have moved off the waiting lease.
    fn moved_off_waiting(&mut self) {
        self.parked = None;
    }

    /// The acquire succeeded: its lease and key now belong to the grant.
    fn disarm(&mut self) {
        self.leases.clear();
        self.parked = None;
    }

    /// Deletes a parked key and revokes every lease in charge now.
    async fn revoke_now(&mut self) {
        if let Some((own, marker, parked)) = self.parked.take() {
            let deleted = delete_keys(&self.lock, &own, marker.as_deref()).await;
            if deleted.is_err() || !self.placed {
                self.lock.inner.waiting.retire(parked.id);
            }
            if deleted.is_err() {
                // Left to the background, which tries once more.
                self.parked = Some((own, marker, parked));
            }
        }
        for lease in std::mem::take(&mut self.leases) {
            if self.lock.requests().revoke(lease).await.is_ok() {
                self.lock.live().remove(lease);
            } else {
                self.leases.push(lease);
            }
        }
    }

    /// Revokes `lease` (no longer needed) in the background.
    fn let_go(&mut self, lease: i64) {
        self.leases.retain(|l| *l != lease);
        revoke_in_background(self.lock.clone(), lease);
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        if let Some((own, marker, parked)) = self.parked.take() {
            if !self.placed {
                self.lock.inner.waiting.retire(parked.id);
            }
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let lock = self.lock.clone();
                spawn_cleanup(&runtime, async move {
                    if let Err(fail) = delete_keys(&lock, &own, marker.as_deref()).await {
                        lock.inner.waiting.retire(parked.id);
                        tracing::warn!(error = %LockError::from(fail), "deleting an abandoned contender's key failed; it goes with the waiting lease, retired");
                    }
                    drop(parked);
                });
            } else {
                self.lock.inner.waiting.retire(parked.id);
            }
        }
        for lease in std::mem::take(&mut self.leases) {
            revoke_in_background(self.lock.clone(), lease);
        }
    }
}

/// Deletes our key `own` (named by an id no other contender uses) and its pending
/// `marker`, if any.
async fn delete_keys(lock: &EtcdLock, own: &str, marker: Option<&str>) -> Result<(), Fail> {
    lock.requests().unmark(own).await?;
    if let Some(marker) = marker {
        lock.requests().unmark(marker).await?;
    }
    Ok(())
}

/// Deletes a stamped grant's pending `marker` in the background, letting the next
/// grant stamp: spawned as the acquire returns, so that the next grant's stamp comes
/// after this grant was learned (see [`EtcdLock::stamp_grant`]).
fn unmark_later(requests: Requests, marker: String) {
    tokio::spawn(async move {
        if let Err(fail) = requests.unmark(&marker).await {
            tracing::debug!(error = %LockError::from(fail), "deleting a grant's pending marker failed; it goes with the grant");
        }
    });
}

/// Revokes `lease` in a background clean-up on the current runtime (if any).
fn revoke_in_background(lock: EtcdLock, lease: i64) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    spawn_cleanup(&runtime, async move {
        match lock.requests().revoke(lease).await {
            Ok(_) => lock.live().remove(lease),
            Err(fail) => {
                tracing::warn!(error = %LockError::from(fail), "revoking an abandoned contender's lease failed; it runs out")
            }
        }
    });
}

/// Revokes a lost lock's lease (`lease`, the current one) once `monitor` reads lost,
/// by its deadline passing unrenewed, a refused renewal, or the key's deletion (see
/// [`crate::loss`]), so that etcd does not keep the key for the rest of its
/// (whole-second) TTL; not the waiting lease, which carries other contenders' keys:
/// that is retired, so that it goes (with the key) once its other users have. Runs
/// until aborted, which the release does.
async fn revoke_when_lost(lock: EtcdLock, lease: Arc<AtomicI64>, monitor: LeaseMonitor) {
    monitor.lost().await;
    let id = lease.load(Ordering::Acquire);
    if lock.inner.waiting.carries(id) {
        lock.inner.waiting.retire(id);
        return;
    }
    match lock.requests().revoke(id).await {
        Ok(_) => lock.live().remove(id),
        Err(fail) => {
            tracing::debug!(error = %LockError::from(fail), "revoking a lost lock's lease failed; it runs out")
        }
    }
}

/// Records `at` as when a waiter's lease was last kept alive.
fn record(alive_since: &Mutex<Instant>, at: Instant) {
    *alive_since.lock().unwrap_or_else(PoisonError::into_inner) = at;
}

/// A waiting contender's key is gone: a retryable error, the acquire tries again.
fn vanished() -> LockError {
    LockError::connection(
        ETCD_BACKEND,
        "the waiting contender's key vanished (its lease expired or was revoked)",
    )
}

/// A TTL in whole seconds, rounded up (etcd's leases count seconds).
pub(crate) fn ttl_seconds(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

/// How much earlier than `sent + ttl` a lease is considered over: 1 % of the TTL and
/// 2 ms, for clock drift between us and etcd's leader.
fn margin(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// A random positive lease id (etcd refuses 0 and negative ids are unusual).
fn new_lease_id() -> i64 {
    (rand::random::<u64>() >> 1).max(1) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_seconds() {
        assert_eq!(ttl_seconds(Duration::from_millis(10)), 1);
        assert_eq!(ttl_seconds(Duration::from_secs(2)), 2);
        assert_eq!(ttl_seconds(Duration::from_millis(2001)), 3);
        assert!(new_lease_id() > 0);
        assert!(margin(Duration::from_secs(2)) < Duration::from_millis(30));
    }
}
