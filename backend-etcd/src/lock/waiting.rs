//! The client's waiting lease: one short lease ([`super::WAITER_TTL_SECS`]) that every
//! parked contender of the client waits under (see [`super::settle`]), kept alive every
//! third of its TTL by one task while anyone is on it, and revoked once nobody has been
//! for two keep-alive periods.
//!
//! A lease of its own per waiter cost a grant and a revoke, two raft writes, on every
//! contended cycle. On the shared lease a waiter's key is placed or moved there, and a
//! parked grant is released by deleting its key by its create revision (never by
//! revoking the lease, which carries the others' keys too).

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use distlock_api::LockError;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{new_lease_id, EtcdLock, WAITER_TTL_SECS};
use crate::ETCD_BACKEND;

/// The waiting lease of one client.
#[derive(Debug, Default)]
pub(super) struct WaitingLease {
    /// The lease in use, if any. Users are counted under this lock, so the task that
    /// revokes an idle lease cannot race a contender taking it.
    slot: tokio::sync::Mutex<Option<Shared>>,
    /// Every waiting lease of this client not yet revoked or run out: never revoked
    /// for one grant's sake (see [`WaitingLease::carries`]).
    ids: Mutex<HashSet<i64>>,
    /// Those of them given no new users (see [`WaitingLease::retire`]).
    retired: Mutex<HashSet<i64>>,
}

#[derive(Debug)]
struct Shared {
    id: i64,
    secs: i64,
    users: Arc<AtomicUsize>,
    alive: watch::Receiver<Alive>,
}

/// What is known of a waiting lease's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Alive {
    /// Alive, as of this send time of its grant or of its last answered keep-alive.
    Since(Instant),
    /// Revoked or run out.
    Gone,
}

/// One contender's use of the waiting lease: counted while it lives.
#[derive(Debug)]
pub(super) struct Parking {
    /// The lease's id and its TTL in seconds.
    pub(super) id: i64,
    pub(super) secs: i64,
    users: Arc<AtomicUsize>,
    alive: watch::Receiver<Alive>,
}

impl Drop for Parking {
    fn drop(&mut self) {
        self.users.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Parking {
    /// Another use of the same lease (counted apart).
    pub(super) fn share(&self) -> Parking {
        self.users.fetch_add(1, Ordering::AcqRel);
        Parking {
            id: self.id,
            secs: self.secs,
            users: self.users.clone(),
            alive: self.alive.clone(),
        }
    }

    /// The send time of the lease's grant or of its last answered keep-alive; `None`
    /// once it is gone.
    pub(super) fn alive_since(&self) -> Option<Instant> {
        match *self.alive.borrow() {
            Alive::Since(at) => Some(at),
            Alive::Gone => None,
        }
    }

    /// Tells `alive` the send time of every keep-alive answered from now on; returns
    /// only once the lease is gone.
    pub(super) async fn follow(&self, alive: impl Fn(Instant)) -> LockError {
        let mut watching = self.alive.clone();
        loop {
            match *watching.borrow_and_update() {
                Alive::Since(at) => alive(at),
                Alive::Gone => break,
            }
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

impl WaitingLease {
    /// Whether lease `id` is (or was) one of this client's waiting leases.
    pub(super) fn carries(&self, id: i64) -> bool {
        self.ids().contains(&id)
    }

    /// Gives waiting lease `id` no new users: it is revoked once its present ones are
    /// gone. For when a key of ours may be left on it (a clean-up that failed, a put
    /// whose answer was lost, a grant lost on it), which would otherwise live as long
    /// as the client keeps contending.
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

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl EtcdLock {
    /// A use of the client's waiting lease, granting one if none is alive.
    ///
    /// # Errors
    /// A retryable [`LockError::Connection`] when etcd does not grant it in time.
    pub(super) async fn park(&self) -> Result<Parking, LockError> {
        let waiting = &self.inner.waiting;
        let mut slot = waiting.slot.lock().await;
        if let Some(shared) = slot.as_ref() {
            // Not one retired, nor one whose keep-alives are late (a keep-alive period
            // and a half since the last answered one): a grant on it would be valid
            // for little, and it may have run out on the server (a put onto it would
            // be refused). Its present users keep it; a fresh one serves the others.
            let ttl = Duration::from_secs(u64::try_from(shared.secs).unwrap_or(1));
            let usable = match *shared.alive.borrow() {
                Alive::Since(at) => Instant::now() < at + ttl / 2,
                Alive::Gone => false,
            };
            if usable && !lock(&waiting.retired).contains(&shared.id) {
                shared.users.fetch_add(1, Ordering::AcqRel);
                return Ok(Parking {
                    id: shared.id,
                    secs: shared.secs,
                    users: shared.users.clone(),
                    alive: shared.alive.clone(),
                });
            }
        }
        let id = new_lease_id();
        self.live().add(id);
        waiting.ids().insert(id);
        let sent = Instant::now();
        let secs = match self.requests().grant(id, WAITER_TTL_SECS).await {
            Ok(secs) => secs,
            Err(fail) => {
                // The grant may have landed: revoked (or left to run out) behind.
                waiting.ended(id);
                super::revoke_in_background(self.clone(), id);
                return Err(self.connection_error(fail));
            }
        };
        let users = Arc::new(AtomicUsize::new(1));
        let (told, alive) = watch::channel(Alive::Since(sent));
        tokio::spawn(
            self.clone()
                .keep_waiting_lease(id, secs, users.clone(), told),
        );
        *slot = Some(Shared {
            id,
            secs,
            users: users.clone(),
            alive: alive.clone(),
        });
        Ok(Parking {
            id,
            secs,
            users,
            alive,
        })
    }

    /// Keeps the waiting lease `id` alive every third of its TTL while it has users
    /// (each keep-alive bounded by that period, a failed one tried again soon), telling
    /// `told` each answered keep-alive's send time; revokes it once it has had none at
    /// two keep-alive times in a row. Ends when it is revoked or gone.
    async fn keep_waiting_lease(
        self,
        id: i64,
        secs: i64,
        users: Arc<AtomicUsize>,
        told: watch::Sender<Alive>,
    ) {
        let period = Duration::from_secs(u64::try_from(secs).unwrap_or(1)) / 3;
        let mut idle = 0;
        let mut pause = period;
        loop {
            tokio::time::sleep(pause).await;
            pause = period;
            if users.load(Ordering::Acquire) == 0 {
                idle += 1;
            } else {
                idle = 0;
            }
            if idle >= 2 {
                let mut slot = self.inner.waiting.slot.lock().await;
                if users.load(Ordering::Acquire) == 0 {
                    if slot.as_ref().is_some_and(|shared| shared.id == id) {
                        *slot = None;
                    }
                    drop(slot);
                    told.send_replace(Alive::Gone);
                    match self.requests().revoke(id).await {
                        Ok(_) => self.live().remove(id),
                        Err(fail) => {
                            tracing::debug!(error = %LockError::from(fail), "revoking the idle waiting lease failed; it runs out")
                        }
                    }
                    self.inner.waiting.ended(id);
                    return;
                }
            }
            let sent = Instant::now();
            let answered = tokio::time::timeout(period, self.requests().keep_alive(id)).await;
            match answered {
                Ok(Ok(())) => {
                    told.send_replace(Alive::Since(sent));
                }
                Ok(Err(fail)) if fail.is_lease_not_found() => {
                    let mut slot = self.inner.waiting.slot.lock().await;
                    if slot.as_ref().is_some_and(|shared| shared.id == id) {
                        *slot = None;
                    }
                    told.send_replace(Alive::Gone);
                    self.live().remove(id);
                    self.inner.waiting.ended(id);
                    return;
                }
                Ok(Err(fail)) => {
                    tracing::debug!(error = %LockError::from(fail), "keep-alive of the waiting lease failed; retrying");
                    pause = Duration::from_millis(100);
                }
                Err(_) => {
                    tracing::debug!("keep-alive of the waiting lease unanswered; retrying");
                    pause = Duration::from_millis(100);
                }
            }
        }
    }
}
