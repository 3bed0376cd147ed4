//! The client's shared leases: one etcd lease per TTL (in whole seconds) in use, which
//! every key of this client with that TTL is put under, as a Go `concurrency.Session`
//! puts all its locks under one lease. One task per lease keeps it alive every third of
//! its TTL while anyone uses it, and revokes it once nobody has for two seconds (so
//! nothing is left once the client's locks end). The short lease parked waiters wait
//! under ([`super::WAITER_TTL_SECS`], see [`super::settle`]) is the one of that TTL.
//!
//! A lease of its own per contender cost a grant and a revoke, two raft writes, on
//! every cycle: on a shared lease an uncontended cycle is the put of its key and, at
//! the release, its deletion by its reserved name (never a revoke of the lease, which
//! carries the others' keys too).
//!
//! A grant's validity deadline is its own (the lock's TTL from the grant, `cap`) but
//! never later than the send time of the lease's last answered keep-alive plus the
//! lease's TTL, less the margin: etcd keeps the key at least that long. So each grant
//! on a lease is registered with it ([`LeaseUse::carry`]), and every answered
//! keep-alive moves its deadline on, up to its cap. A client that stops (frozen,
//! killed, cut off) stops the keep-alives, and etcd deletes every key on the lease one
//! TTL after the last one; a client that lives deletes a key whose deadline passed
//! unrenewed itself.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use distlock_api::backend::prelude::*;
use distlock_api::{LeaseMonitor, LockError, OptionsError};
use tokio::sync::watch;
use tokio::time::Instant;

use super::{margin, new_lease_id, EtcdLock};
use crate::ETCD_BACKEND;

/// How long a shared lease may go unused before it is revoked.
const IDLE: Duration = Duration::from_secs(2);

/// The shared leases of one client.
#[derive(Debug, Default)]
pub(super) struct SharedLeases {
    /// The lease in use for each TTL asked for, in seconds. Users are counted under this
    /// lock, so the task that revokes an idle lease cannot race a contender taking it.
    slots: tokio::sync::Mutex<HashMap<i64, Shared>>,
    /// Every shared lease of this client not yet revoked or run out: never revoked for
    /// one grant's sake (see [`SharedLeases::carries`]).
    ids: Mutex<HashSet<i64>>,
    /// Those of them given no new users (see [`SharedLeases::retire`]).
    retired: Mutex<HashSet<i64>>,
}

#[derive(Debug)]
struct Shared {
    id: i64,
    secs: i64,
    users: Arc<AtomicUsize>,
    alive: watch::Receiver<Alive>,
    grants: Arc<Grants>,
}

/// What is known of a shared lease's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Alive {
    /// Alive, as of this send time of its grant or of its last answered keep-alive.
    Since(Instant),
    /// Revoked or run out.
    Gone,
}

/// The grants whose keys are on one lease: their monitors and validity caps.
#[derive(Debug, Default)]
struct Grants {
    next: AtomicU64,
    carried: Mutex<HashMap<u64, (LeaseMonitor, Cap)>>,
}

/// A grant's own validity deadline (its TTL from its grant or last extend, less the
/// margin), which the extend moves; shared with the lease that carries the key.
pub(super) type Cap = Arc<Mutex<Instant>>;

/// The instant `cap` holds.
pub(super) fn cap_of(cap: &Cap) -> Instant {
    *cap.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Grants {
    /// Moves every grant's deadline on to what a keep-alive sent at `at` of a lease of
    /// `ttl` proves, up to its cap; never back.
    fn renew(&self, at: Instant, ttl: Duration) {
        let proven = at + ttl - margin(ttl);
        for (monitor, cap) in lock(&self.carried).values() {
            // The cap is read under its lock, which an extend holds while moving it.
            let capped = cap.lock().unwrap_or_else(PoisonError::into_inner);
            let until = proven.min(*capped);
            if until > monitor.valid_until() {
                monitor.renewed(until);
            }
        }
    }

    /// The lease is gone, and every key on it with it.
    fn lost(&self) {
        for (monitor, _) in lock(&self.carried).values() {
            monitor.mark_lost();
        }
    }
}

/// One contender's use of a shared lease: counted while it lives, and, once a grant is
/// carried ([`LeaseUse::carry`]), that grant's deadline follows the lease's keep-alives.
#[derive(Debug)]
pub(super) struct LeaseUse {
    /// The lease's id and its TTL in seconds.
    pub(super) id: i64,
    pub(super) secs: i64,
    users: Arc<AtomicUsize>,
    alive: watch::Receiver<Alive>,
    grants: Arc<Grants>,
    /// The grant this use carries, by its number in `grants`.
    carried: Option<u64>,
}

impl Drop for LeaseUse {
    fn drop(&mut self) {
        if let Some(number) = self.carried {
            lock(&self.grants.carried).remove(&number);
        }
        self.users.fetch_sub(1, Ordering::AcqRel);
    }
}

impl LeaseUse {
    /// Another use of the same lease (counted apart, carrying nothing).
    pub(super) fn share(&self) -> LeaseUse {
        self.users.fetch_add(1, Ordering::AcqRel);
        LeaseUse {
            id: self.id,
            secs: self.secs,
            users: self.users.clone(),
            alive: self.alive.clone(),
            grants: self.grants.clone(),
            carried: None,
        }
    }

    /// The lease's TTL.
    pub(super) fn ttl(&self) -> Duration {
        Duration::from_secs(u64::try_from(self.secs).unwrap_or(1))
    }

    /// The send time of the lease's grant or of its last answered keep-alive; `None`
    /// once it is gone.
    pub(super) fn alive_since(&self) -> Option<Instant> {
        match *self.alive.borrow() {
            Alive::Since(at) => Some(at),
            Alive::Gone => None,
        }
    }

    /// The validity deadline of a grant capped at `cap` whose key is on this lease:
    /// `cap`, or earlier if the lease's last answered keep-alive proves less; `None`
    /// once the lease is gone.
    pub(super) fn valid_until(&self, cap: Instant) -> Option<Instant> {
        let ttl = self.ttl();
        self.alive_since()
            .map(|at| (at + ttl - margin(ttl)).min(cap))
    }

    /// From now on, every answered keep-alive of the lease moves `monitor`'s deadline
    /// on, up to `cap`; and the lease's end marks it lost. Until this use is dropped.
    pub(super) fn carry(&mut self, monitor: &LeaseMonitor, cap: &Cap) {
        let number = self.grants.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.grants.carried).insert(number, (monitor.clone(), cap.clone()));
        if let Some(previous) = self.carried.replace(number) {
            lock(&self.grants.carried).remove(&previous);
        }
    }

    /// Returns only once the lease is gone, with the error of a waiter whose key went
    /// with it.
    pub(super) async fn gone(&self) -> LockError {
        let mut watching = self.alive.clone();
        while *watching.borrow_and_update() != Alive::Gone {
            if watching.changed().await.is_err() {
                break;
            }
        }
        LockError::connection(
            ETCD_BACKEND,
            "the waiting contender's lease expired while it waited",
        )
    }
}

impl SharedLeases {
    /// Whether lease `id` is (or was) one of this client's shared leases.
    pub(super) fn carries(&self, id: i64) -> bool {
        self.ids().contains(&id)
    }

    /// Gives shared lease `id` no new users: it is revoked once its present ones are
    /// gone. For when a key of ours may be left on it (a clean-up that failed, a put
    /// whose answer was lost), which would otherwise live as long as the client keeps
    /// using locks of that TTL.
    pub(super) fn retire(&self, id: i64) {
        if self.carries(id) {
            lock(&self.retired).insert(id);
        }
    }

    fn ids(&self) -> std::sync::MutexGuard<'_, HashSet<i64>> {
        lock(&self.ids)
    }

    /// Forgets lease `id`, revoked or run out.
    fn ended(&self, id: i64) {
        self.ids().remove(&id);
        lock(&self.retired).remove(&id);
    }
}

/// A shared lease being granted: revoked in the background if the grant fails or
/// its future is dropped, unless it was answered.
struct Granting<'a> {
    lock: &'a EtcdLock,
    id: Option<i64>,
}

impl Drop for Granting<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.lock.inner.shared.ended(id);
            super::revoke_in_background(self.lock.clone(), id);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl EtcdLock {
    /// A use of the client's shared lease of `secs` seconds, granting one if none is
    /// alive. With `asked` (the TTL a lock asked for), a lease etcd grants longer than
    /// `secs` (its shortest lease is longer) is revoked at once and refused.
    ///
    /// # Errors
    /// A retryable [`LockError::Connection`] when etcd does not grant it in time;
    /// [`LockError::InvalidOptions`] for a TTL below etcd's shortest lease.
    pub(super) async fn share_lease(
        &self,
        secs: i64,
        asked: Option<Duration>,
    ) -> Result<LeaseUse, LockError> {
        let shared = &self.inner.shared;
        let mut slots = shared.slots.lock().await;
        if let Some(slot) = slots.get(&secs) {
            // Not one retired, nor one whose keep-alives are late (a keep-alive period
            // and a half since the last answered one): a grant on it would be valid
            // for little, and it may have run out on the server (a put onto it would
            // be refused). Its present users keep it; a fresh one serves the others.
            let ttl = Duration::from_secs(u64::try_from(slot.secs).unwrap_or(1));
            let usable = match *slot.alive.borrow() {
                Alive::Since(at) => Instant::now() < at + ttl / 2,
                Alive::Gone => false,
            };
            // A lock's TTL is not served by a lease etcd granted longer (a waiting
            // lease above etcd's shortest, say): asked again, it is refused.
            let fits = asked.is_none() || slot.secs <= secs;
            if usable && fits && !lock(&shared.retired).contains(&slot.id) {
                slot.users.fetch_add(1, Ordering::AcqRel);
                return Ok(LeaseUse {
                    id: slot.id,
                    secs: slot.secs,
                    users: slot.users.clone(),
                    alive: slot.alive.clone(),
                    grants: slot.grants.clone(),
                    carried: None,
                });
            }
        }
        let id = new_lease_id();
        self.live().add(id);
        shared.ids().insert(id);
        // A grant that fails or is dropped unanswered may have landed: revoked behind.
        let mut granting = Granting {
            lock: self,
            id: Some(id),
        };
        let sent = Instant::now();
        let granted = self
            .requests()
            .grant(id, secs)
            .await
            .map_err(|fail| self.connection_error(fail))?;
        granting.id = None;
        if let Some(ttl) = asked.filter(|_| granted > secs) {
            drop(slots);
            shared.ended(id);
            if self.requests().revoke(id).await.is_ok() {
                self.live().remove(id);
            } else {
                super::revoke_in_background(self.clone(), id);
            }
            return Err(LockError::invalid_options(
                ETCD_BACKEND,
                OptionsError::TtlTooShort {
                    ttl,
                    min: Duration::from_secs(u64::try_from(granted).unwrap_or(u64::MAX)),
                },
            ));
        }
        let users = Arc::new(AtomicUsize::new(1));
        let grants = Arc::new(Grants::default());
        let (told, alive) = watch::channel(Alive::Since(sent));
        tokio::spawn(self.clone().keep_shared_lease(
            (secs, id, granted),
            users.clone(),
            grants.clone(),
            told,
        ));
        slots.insert(
            secs,
            Shared {
                id,
                secs: granted,
                users: users.clone(),
                alive: alive.clone(),
                grants: grants.clone(),
            },
        );
        Ok(LeaseUse {
            id,
            secs: granted,
            users,
            alive,
            grants,
            carried: None,
        })
    }

    /// Keeps the shared lease `id` (of the slot for `slot` seconds, granted for
    /// `secs`) alive every third of its TTL while it has users (each keep-alive bounded
    /// by that period, a failed one tried again soon), telling `told` and the grants it
    /// carries each answered keep-alive's send time; revokes it once it has had none
    /// for [`IDLE`]. Ends when it is revoked or gone.
    async fn keep_shared_lease(
        self,
        (slot, id, secs): (i64, i64, i64),
        users: Arc<AtomicUsize>,
        grants: Arc<Grants>,
        told: watch::Sender<Alive>,
    ) {
        let ttl = Duration::from_secs(u64::try_from(secs).unwrap_or(1));
        let period = ttl / 3;
        // Idleness is looked at this often, whatever the TTL.
        let tick = period.min(IDLE / 2);
        let mut due = Instant::now() + period;
        let mut idle_since = None;
        loop {
            let now = Instant::now();
            tokio::time::sleep(tick.min(due.saturating_duration_since(now))).await;
            let now = Instant::now();
            if users.load(Ordering::Acquire) == 0 {
                let since = *idle_since.get_or_insert(now);
                if now >= since + IDLE {
                    let mut slots = self.inner.shared.slots.lock().await;
                    if users.load(Ordering::Acquire) == 0 {
                        if slots.get(&slot).is_some_and(|shared| shared.id == id) {
                            slots.remove(&slot);
                        }
                        drop(slots);
                        told.send_replace(Alive::Gone);
                        match self.requests().revoke(id).await {
                            Ok(_) => self.live().remove(id),
                            Err(fail) => {
                                tracing::debug!(error = %LockError::from(fail), "revoking an idle shared lease failed; it runs out")
                            }
                        }
                        self.inner.shared.ended(id);
                        return;
                    }
                }
            } else {
                idle_since = None;
            }
            if now < due {
                continue;
            }
            let sent = Instant::now();
            let answered = tokio::time::timeout(period, self.requests().keep_alive(id)).await;
            match answered {
                Ok(Ok(())) => {
                    told.send_replace(Alive::Since(sent));
                    grants.renew(sent, ttl);
                    due = sent + period;
                }
                Ok(Err(fail)) if fail.is_lease_not_found() => {
                    let mut slots = self.inner.shared.slots.lock().await;
                    if slots.get(&slot).is_some_and(|shared| shared.id == id) {
                        slots.remove(&slot);
                    }
                    drop(slots);
                    told.send_replace(Alive::Gone);
                    grants.lost();
                    self.live().remove(id);
                    self.inner.shared.ended(id);
                    return;
                }
                Ok(Err(fail)) => {
                    tracing::debug!(error = %LockError::from(fail), "keep-alive of a shared lease failed; retrying");
                    due = Instant::now() + Duration::from_millis(100);
                }
                Err(_) => {
                    tracing::debug!("keep-alive of a shared lease unanswered; retrying");
                    due = Instant::now() + Duration::from_millis(100);
                }
            }
        }
    }
}
