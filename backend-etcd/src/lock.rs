//! [`EtcdLock`]: the mutex on etcd's `concurrency.Mutex` recipe.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use distlock_api::backend::prelude::*;
use distlock_api::backend::spawn_cleanup;
use distlock_api::{ExtendOutcome, Lease, LeaseMonitor, LockError, OwnerToken, ReleaseOutcome};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::config::{parse_url, EtcdConfig, EtcdUrl};
use crate::error::{at_servers, Fail};
use crate::keys::{pending_marker, Kind};
use crate::loss::LossWatch;
use crate::recipe::Requests;
use crate::session::{LiveLeases, Session};
use crate::ETCD_BACKEND;

mod contended;
mod interruptions;
mod names;
mod placement;
mod settle;
mod shared;

use contended::Contended;
use interruptions::Interruptions;
use names::Names;
use settle::Settle;
use shared::{Cap, LeaseUse, SharedLeases};

/// The TTL, in seconds, of the lease a waiter waits under (when the lock's is longer):
/// how long a waiter whose process died (without revoking) holds up the queue behind it.
/// It is the client's shared lease of that TTL (see [`shared`]).
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
    /// The leases this client's keys are on, one per TTL.
    shared: SharedLeases,
    /// The names of this client's contender keys, reused.
    names: Names,
}

/// A lock this client holds.
struct Held {
    /// The shared lease its key is on now (a parked grant's move and an extend to a
    /// longer TTL change it), shared with the task that deletes the key once the lock
    /// is lost, which retires that lease if it cannot.
    lease: Arc<AtomicI64>,
    /// That lease's TTL in whole seconds.
    ttl_secs: i64,
    /// The grant's own validity deadline, which the lease's keep-alives do not pass.
    cap: Cap,
    /// The use of that lease, which carries the grant (see [`shared`]).
    on: Option<LeaseUse>,
    monitor: LeaseMonitor,
    /// The task that deletes the key once the lock is lost.
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
                shared: SharedLeases::default(),
                names: Names::default(),
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

    /// What a release or extend of a lease that is not (any more) ours reports.
    fn not_ours<T>(held_by_other: bool, held: T, expired: T) -> T {
        if held_by_other {
            held
        } else {
            expired
        }
    }

    /// The lease a held lock's key is attached to now and its TTL in seconds: from this
    /// client's records, else read from etcd. `Err(held_by_other)` when the key is gone.
    ///
    /// Read from etcd (a grant this client no longer records), the lease's TTL is not
    /// known: it reads as 0, so that an extend moves the key to a lease of its own.
    async fn current_lease(
        &self,
        lease: &Lease,
        prefix: &str,
        own: &str,
        revision: i64,
    ) -> Result<Result<(i64, i64), bool>, LockError> {
        if let Some(held) = self.held().get(&lease.owner().as_u128()) {
            return Ok(Ok((held.lease.load(Ordering::Acquire), held.ttl_secs)));
        }
        match self
            .requests()
            .own_key(prefix, own, revision)
            .await
            .map_err(|f| self.connection_error(f))?
        {
            Ok(kv) => Ok(Ok((kv.lease(), 0))),
            Err(other) => Ok(Err(other)),
        }
    }
}

/// The low bit of an owner token that marks a reader's lease (the rest is the name id
/// of its key and the key's create revision).
const READ_TAG: u64 = 1;

/// A grant's owner token: the name id of its key (high 64 bits, see `names`), its key's
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

    /// Owner-checked release of a `kind` contender's `lease`: one delete of its key by
    /// its create revision (the lease it is on carries other keys of this client, so
    /// it is never revoked for one grant), which frees the lock in the same raft entry.
    /// A key that is gone reads `Expired`, or `HeldByOther` while another contender is
    /// in the range.
    pub(crate) async fn release_in(
        &self,
        kind: Kind,
        lease: &Lease,
    ) -> Result<ReleaseOutcome, LockError> {
        let (prefix, own, revision, marker) = self.place_of(kind, lease);
        let held = self.held().remove(&lease.owner().as_u128());
        if let Some(held) = &held {
            held.watch.abort();
            // A parked grant's move stops here: the delete below takes the key wherever
            // it is.
            if let Some(settle) = &held.settle {
                settle.stop();
            }
            self.inner.loss.watched.forget(&own, revision);
        }
        // A grant this client records deletes its key by its reserved name (see
        // `Requests::delete_reserved`); any other (a lease released twice, a forged
        // one) by create revision, since its name may serve a later contender by now.
        let deleted = match &held {
            Some(_) => self
                .requests()
                .delete_reserved(&prefix, &own, revision, marker.as_deref())
                .await
                .map(|deleted| deleted.map(|()| 0)),
            None => {
                self.requests()
                    .delete_own(&prefix, &own, revision, marker.as_deref(), true)
                    .await
            }
        };
        let deleted = match deleted {
            Ok(deleted) => deleted,
            Err(fail) => {
                // A key left on a shared lease goes with it, once retired.
                if let Some(held) = &held {
                    self.inner.shared.retire(held.lease.load(Ordering::Acquire));
                }
                return Err(self.connection_error(fail));
            }
        };
        // Our key is deleted, or gone (a key of this name is written by this client
        // alone, and the grant's put was answered): its name serves the next contender.
        // Only a grant this client records: a lease released twice may name a key
        // that a later contender of this client has put since.
        if held.is_some() {
            self.inner.names.give_back(named_by(lease));
        }
        Ok(match deleted {
            Ok(attached) => {
                // A key of an older client, named by a lease of its own, leaves that
                // lease empty: revoked rather than left to run out.
                if held.is_none()
                    && attached == named_by(lease)
                    && !self.inner.shared.carries(attached)
                {
                    if let Err(fail) = self.requests().revoke(attached).await {
                        tracing::debug!(error = %LockError::from(fail), "revoking a released lock's lease failed; it runs out");
                    }
                }
                ReleaseOutcome::Released
            }
            Err(other) => {
                Self::not_ours(other, ReleaseOutcome::HeldByOther, ReleaseOutcome::Expired)
            }
        })
    }

    /// Owner-checked extend of a `kind` contender's `lease` to `ttl`: the grant's own
    /// deadline moves to `ttl` from now. Up to the TTL of the lease its key is on, that
    /// is a keep-alive of that lease (with a check, in the same round trip, that the
    /// key is still ours); beyond it, a move of the key to the client's lease of `ttl`
    /// (keeping its create revision, hence the token and the queue place), with a
    /// keep-alive of that lease beside it.
    pub(crate) async fn extend_in(
        &self,
        kind: Kind,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        self.settled(lease.owner()).await?;
        let (prefix, own, revision, _) = self.place_of(kind, lease);
        let prefix = prefix.as_str();
        let (current, secs) = match self.current_lease(lease, prefix, &own, revision).await? {
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
        let valid_until = sent + ttl - margin(ttl);
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
            if let Some(held) = self.held().get(&lease.owner().as_u128()) {
                *held.cap.lock().unwrap_or_else(PoisonError::into_inner) = valid_until;
            }
        } else {
            // A longer TTL: the key moves to the client's lease of that TTL.
            let mut home = self.share_lease(ttl_seconds(ttl), Some(ttl)).await?;
            let (moved, alive) = tokio::join!(
                self.requests()
                    .move_to_lease(prefix, &own, revision, home.id, None),
                self.requests().keep_alive(home.id)
            );
            let moved = moved.map_err(|f| self.put_failed(f, home.id))?;
            if let Err(other) = moved {
                return Ok(Self::not_ours(
                    other,
                    ExtendOutcome::HeldByOther,
                    ExtendOutcome::Expired,
                ));
            }
            if let Err(fail) = alive {
                // Moved, but not known to be kept alive from `sent`: the deadline its
                // last keep-alive proves, if any.
                tracing::debug!(error = %LockError::from(fail), "the keep-alive beside an extend's move failed");
                let proven = home.valid_until(valid_until).unwrap_or(sent);
                if proven < valid_until {
                    return Err(LockError::connection(
                        ETCD_BACKEND,
                        "the lease an extend moved the key to was not kept alive in time",
                    ));
                }
            }
            let mut held = self.held();
            if let Some(held) = held.get_mut(&lease.owner().as_u128()) {
                *held.cap.lock().unwrap_or_else(PoisonError::into_inner) = valid_until;
                home.carry(&held.monitor, &held.cap);
                held.lease.store(home.id, Ordering::Release);
                held.ttl_secs = home.secs;
                held.on = Some(home);
            }
        }
        Ok(ExtendOutcome::Extended { valid_until })
    }
}

/// Deletes a contender's key unless disarmed: on a failed or dropped acquire, at once
/// when awaited ([`Undo::delete_now`]), else in the background on drop. The key is on
/// one of the client's shared leases, which are not revoked for one contender.
struct Undo {
    lock: EtcdLock,
    /// The name id of our key.
    named: i64,
    /// Our key and pending marker, and a use of the lease they may be on that lasts
    /// until they are deleted.
    key: Option<(String, Option<String>, LeaseUse)>,
    /// Whether the put of our key was answered: one whose answer was not may still
    /// land after the key's deletion (so its name is never reused).
    placed: bool,
}

impl Undo {
    fn new(lock: EtcdLock, named: i64) -> Self {
        Undo {
            lock,
            named,
            key: None,
            placed: false,
        }
    }

    /// Takes charge of our key `own` (and pending `marker`), which may be put on the
    /// lease of `on` from now on.
    fn delete_if_failed(&mut self, own: &str, marker: Option<&str>, on: &LeaseUse) {
        self.key = Some((own.to_owned(), marker.map(str::to_owned), on.share()));
    }

    /// The put of our key was answered.
    fn placed(&mut self) {
        self.placed = true;
    }

    /// The acquire succeeded: its key now belongs to the grant.
    fn disarm(&mut self) {
        self.key = None;
    }

    /// Deletes our key (and marker). When that fails, or a put of it may yet land, the
    /// lease it is on is retired, so that it goes once its other users have.
    async fn delete_now(&mut self) {
        if let Some((own, marker, on)) = self.key.take() {
            let deleted = delete_keys(&self.lock, &own, marker.as_deref()).await;
            if deleted.is_err() || !self.placed {
                self.lock.inner.shared.retire(on.id);
            } else {
                self.lock.inner.names.give_back(self.named);
            }
            if deleted.is_err() {
                // Left to the background, which tries once more.
                self.key = Some((own, marker, on));
            }
        }
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        let Some((own, marker, on)) = self.key.take() else {
            return;
        };
        if !self.placed {
            self.lock.inner.shared.retire(on.id);
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (lock, placed, named) = (self.lock.clone(), self.placed, self.named);
            spawn_cleanup(&runtime, async move {
                let mut deleted = delete_keys(&lock, &own, marker.as_deref()).await;
                if !placed && deleted.is_ok() {
                    // A put sent but not answered may be applied after that delete (etcd
                    // serves concurrent requests in no set order): once more, later.
                    tokio::time::sleep(LATE_PUT).await;
                    deleted = delete_keys(&lock, &own, marker.as_deref()).await;
                } else if placed && deleted.is_ok() {
                    lock.inner.names.give_back(named);
                }
                if let Err(fail) = deleted {
                    lock.inner.shared.retire(on.id);
                    tracing::warn!(error = %LockError::from(fail), "deleting an abandoned contender's key failed; it goes with its lease, retired");
                }
                drop(on);
            });
        } else {
            self.lock.inner.shared.retire(on.id);
        }
    }
}

/// How long after deleting the key of a put whose answer never came the key is
/// deleted again, should the put have been applied after the first deletion.
const LATE_PUT: Duration = Duration::from_millis(300);

/// Deletes our key `own` (named by an id no other contender uses while this one lives)
/// and its pending `marker`, if any.
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
                tracing::warn!(error = %LockError::from(fail), "revoking an abandoned lease failed; it runs out")
            }
        }
    });
}

/// How often a lost lock's key deletion is tried before its lease is retired.
const LOST_DELETE_TRIES: u32 = 5;

/// Deletes a lost lock's key (at `place`: range, key, create revision) once `monitor`
/// reads lost, by its deadline passing unrenewed, a refused renewal, or the key's
/// deletion (see [`crate::loss`]): the client's own end of the lock's TTL, since the
/// lease the key is on (`lease`, the current one) lives on for the client's other
/// keys. When the deletion keeps failing, that lease is retired, so that it goes (with
/// the key) once its other users have. Runs until aborted, which the release does.
async fn delete_when_lost(
    lock: EtcdLock,
    (prefix, own, revision): (String, String, i64),
    lease: Arc<AtomicI64>,
    monitor: LeaseMonitor,
) {
    monitor.lost().await;
    let mut pause = Duration::from_millis(100);
    for _ in 0..LOST_DELETE_TRIES {
        match lock
            .requests()
            .delete_own(&prefix, &own, revision, None, false)
            .await
        {
            Ok(_) => return,
            Err(fail) => {
                tracing::debug!(error = %LockError::from(fail), "deleting a lost lock's key failed; retrying");
            }
        }
        tokio::time::sleep(pause).await;
        pause *= 2;
    }
    lock.inner.shared.retire(lease.load(Ordering::Acquire));
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
