//! The memory store's table of semaphore and read-write lock holders: several holders
//! per key, each with its own owner token, expiry and fencing token.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::MEMORY_BACKEND;
use crate::{
    Candidate, ExtendOutcome, FencingToken, Leader, Lease, LockError, LockKey, LockOptions,
    OwnerToken, PermitMismatch, ReleaseOutcome,
};

/// Which primitive a key belongs to: each is a namespace of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Kind {
    Semaphore,
    Rw,
    Election,
}

/// What one grant asks for.
#[derive(Debug, Clone)]
pub(super) enum Want {
    /// One permit of a semaphore with this many.
    Permit(u32),
    /// A shared hold.
    Read,
    /// An exclusive hold.
    Write,
    /// Leadership: an exclusive hold that records who leads.
    Lead(Candidate),
}

#[derive(Debug, Clone)]
struct Holder {
    exclusive: bool,
    expires_at: Instant,
    token: FencingToken,
    /// Who leads (elections only).
    candidate: Option<Candidate>,
}

#[derive(Debug)]
struct SharedKey {
    holders: HashMap<OwnerToken, Holder>,
    /// The permit count the holders use (semaphores only).
    permits: Option<u32>,
    /// Writers waiting for the key: while any do, readers are refused.
    writers_waiting: usize,
    /// Woken on every release and whenever a waiting writer gives up or is granted.
    wake: Arc<Notify>,
}

impl SharedKey {
    fn new() -> Self {
        SharedKey {
            holders: HashMap::new(),
            permits: None,
            writers_waiting: 0,
            wake: Arc::new(Notify::new()),
        }
    }

    fn prune(&mut self, now: Instant) {
        self.holders.retain(|_, h| h.expires_at > now);
        if self.holders.is_empty() {
            self.permits = None;
        }
    }

    fn earliest_expiry(&self) -> Option<Instant> {
        self.holders.values().map(|h| h.expires_at).min()
    }

    /// Nothing held, waited on or counted: the entry can go.
    fn is_idle(&self) -> bool {
        self.holders.is_empty() && self.writers_waiting == 0 && Arc::strong_count(&self.wake) == 1
    }
}

/// A key as [`SharedTable::snapshot`] saw it.
#[derive(Debug, Default)]
pub(super) struct Snapshot {
    /// The permit count the holders use (semaphores with holders only).
    pub(super) permits: Option<u32>,
    /// Each live holder: whether it holds exclusively, and its remaining lease.
    pub(super) holders: Vec<(bool, Duration)>,
    /// Whether a writer waits.
    pub(super) writer_waiting: bool,
}

/// One grant attempt's answer: granted with this fencing token, or refused with the
/// earliest holder expiry (when a retry may succeed by itself).
pub(super) type Attempt = Result<FencingToken, Option<Instant>>;

#[derive(Debug, Default)]
pub(super) struct SharedTable {
    keys: Mutex<HashMap<(Kind, LockKey), SharedKey>>,
}

impl SharedTable {
    fn keys(&self) -> MutexGuard<'_, HashMap<(Kind, LockKey), SharedKey>> {
        // Every update is a few assignments: a panic elsewhere cannot tear an entry.
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Grants `want` on `key` to `owner` until `expires_at` if it fits, atomically,
    /// with a fencing token from `next_token` taken under the table's lock (so tokens
    /// follow the order of grants).
    ///
    /// # Errors
    /// [`PermitMismatch`] when a permit asks for another count than the holders use.
    pub(super) fn grant(
        &self,
        kind: Kind,
        key: &LockKey,
        owner: OwnerToken,
        want: Want,
        expires_at: Instant,
        next_token: impl FnOnce() -> FencingToken,
    ) -> Result<Attempt, PermitMismatch> {
        let now = Instant::now();
        let mut keys = self.keys();
        let entry = keys
            .entry((kind, key.clone()))
            .or_insert_with(SharedKey::new);
        entry.prune(now);
        let fits = match &want {
            &Want::Permit(max) => {
                let in_use = *entry.permits.get_or_insert(max);
                if in_use != max {
                    return Err(PermitMismatch::new(key.clone(), max, in_use));
                }
                entry.holders.len() < max as usize
            }
            Want::Read => {
                entry.writers_waiting == 0 && entry.holders.values().all(|h| !h.exclusive)
            }
            Want::Write | Want::Lead(_) => entry.holders.is_empty(),
        };
        if !fits {
            return Ok(Err(entry.earliest_expiry()));
        }
        let token = next_token();
        let (exclusive, candidate) = match want {
            Want::Permit(_) | Want::Read => (false, None),
            Want::Write => (true, None),
            Want::Lead(candidate) => {
                // Observers of the election wait on the same notifier.
                entry.wake.notify_waiters();
                (true, Some(candidate))
            }
        };
        entry.holders.insert(
            owner,
            Holder {
                exclusive,
                expires_at,
                token,
                candidate,
            },
        );
        Ok(Ok(token))
    }

    /// Who leads the election `key` now, if anyone.
    pub(super) fn leader(&self, key: &LockKey) -> Option<Leader> {
        let now = Instant::now();
        let keys = self.keys();
        let entry = keys.get(&(Kind::Election, key.clone()))?;
        let holder = entry.holders.values().find(|h| h.expires_at > now)?;
        let candidate = holder.candidate.clone()?;
        Some(
            Leader::new(candidate, holder.token)
                .with_remaining(Some(holder.expires_at.saturating_duration_since(now))),
        )
    }

    /// Removes `owner`'s hold on `key`, waking waiters.
    pub(super) fn release(&self, kind: Kind, key: &LockKey, owner: OwnerToken) -> ReleaseOutcome {
        let now = Instant::now();
        let mut keys = self.keys();
        let map_key = (kind, key.clone());
        let Some(entry) = keys.get_mut(&map_key) else {
            return ReleaseOutcome::Expired;
        };
        entry.prune(now);
        let outcome = if entry.holders.remove(&owner).is_some() {
            entry.wake.notify_waiters();
            ReleaseOutcome::Released
        } else if entry.holders.is_empty() {
            ReleaseOutcome::Expired
        } else {
            ReleaseOutcome::HeldByOther
        };
        if entry.holders.is_empty() {
            entry.permits = None;
        }
        if entry.is_idle() {
            keys.remove(&map_key);
        }
        outcome
    }

    /// Sets `owner`'s hold on `key` to expire `ttl` from now; `valid_until` in the
    /// outcome is `requested_at + ttl`.
    pub(super) fn extend(
        &self,
        kind: Kind,
        key: &LockKey,
        owner: OwnerToken,
        ttl: Duration,
        requested_at: Instant,
    ) -> ExtendOutcome {
        let now = Instant::now();
        let mut keys = self.keys();
        let Some(entry) = keys.get_mut(&(kind, key.clone())) else {
            return ExtendOutcome::Expired;
        };
        entry.prune(now);
        let others_hold = entry.holders.keys().any(|o| *o != owner);
        match (entry.holders.get_mut(&owner), now.checked_add(ttl)) {
            (Some(holder), Some(expires_at)) => match requested_at.checked_add(ttl) {
                Some(valid_until) => {
                    holder.expires_at = expires_at;
                    ExtendOutcome::Extended { valid_until }
                }
                None => ExtendOutcome::Expired,
            },
            (Some(_), None) => ExtendOutcome::Expired,
            (None, _) if others_hold => ExtendOutcome::HeldByOther,
            (None, _) => ExtendOutcome::Expired,
        }
    }

    /// What `key` looks like now, for `inspect`: the permit count in use, each live
    /// holder's exclusivity and remaining lease, and whether a writer waits.
    pub(super) fn snapshot(&self, kind: Kind, key: &LockKey) -> Snapshot {
        let now = Instant::now();
        let keys = self.keys();
        let Some(entry) = keys.get(&(kind, key.clone())) else {
            return Snapshot::default();
        };
        let holders: Vec<(bool, Duration)> = entry
            .holders
            .values()
            .filter(|h| h.expires_at > now)
            .map(|h| (h.exclusive, h.expires_at.saturating_duration_since(now)))
            .collect();
        Snapshot {
            permits: entry.permits.filter(|_| !holders.is_empty()),
            writer_waiting: entry.writers_waiting > 0,
            holders,
        }
    }

    /// The notifier of `key`, for a waiter to register with before each attempt.
    pub(super) fn wake_handle(&self, kind: Kind, key: &LockKey) -> Arc<Notify> {
        self.keys()
            .entry((kind, key.clone()))
            .or_insert_with(SharedKey::new)
            .wake
            .clone()
    }

    /// Counts a waiting writer on `key` until the returned mark is dropped.
    pub(super) fn writer_waits(self: &Arc<Self>, key: &LockKey) -> WriterWaiting {
        self.keys()
            .entry((Kind::Rw, key.clone()))
            .or_insert_with(SharedKey::new)
            .writers_waiting += 1;
        WriterWaiting {
            table: self.clone(),
            key: key.clone(),
        }
    }

    fn writer_done(&self, key: &LockKey) {
        let mut keys = self.keys();
        let map_key = (Kind::Rw, key.clone());
        if let Some(entry) = keys.get_mut(&map_key) {
            entry.writers_waiting = entry.writers_waiting.saturating_sub(1);
            // Readers held back by this writer may go now (or wait for its hold).
            entry.wake.notify_waiters();
            if entry.is_idle() {
                keys.remove(&map_key);
            }
        }
    }
}

/// A writer's intent on a key: readers are refused while it lives. Dropped when the
/// writer is granted or gives up (a timeout or a dropped acquire future), so a
/// cancelled writer never holds readers back.
#[derive(Debug)]
pub(super) struct WriterWaiting {
    table: Arc<SharedTable>,
    key: LockKey,
}

impl Drop for WriterWaiting {
    fn drop(&mut self) {
        self.table.writer_done(&self.key);
    }
}

/// One attempt by `client` to take `want` on `key`: the lease granted, or the earliest
/// holder expiry.
///
/// # Errors
/// The crashed client's connection error, a TTL that overflows the clock, or
/// [`LockError::PermitMismatch`].
pub(super) fn attempt(
    client: &super::MemoryLock,
    kind: Kind,
    key: &LockKey,
    want: Want,
    options: &LockOptions,
) -> Result<Result<Lease, Option<Instant>>, LockError> {
    client.check_alive()?;
    let requested_at = Instant::now();
    let Some(expires_at) = requested_at.checked_add(options.ttl()) else {
        return Err(LockError::config(MEMORY_BACKEND, "ttl overflows the clock"));
    };
    let owner = OwnerToken::random();
    let store = client.store();
    let next_token = || store.next_fencing_token();
    match store
        .shared
        .grant(kind, key, owner, want, expires_at, next_token)
    {
        Err(source) => Err(LockError::PermitMismatch {
            backend: MEMORY_BACKEND,
            source,
        }),
        Ok(Err(expiry)) => Ok(Err(expiry)),
        Ok(Ok(token)) => Ok(Ok(Lease::describe(
            key.clone(),
            owner,
            Some(token),
            options.ttl(),
            requested_at,
        ))),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{DistributedSemaphore, LockError, LockKey, LockOptions};
    use crate::{MemoryLock, RwMode, WaitPolicy};

    #[tokio::test(start_paused = true)]
    async fn an_expired_permit_frees_and_resets_the_count() {
        let semaphore = MemoryLock::new().semaphore();
        let key = LockKey::new("k").unwrap();
        let short = LockOptions::new(Duration::from_secs(1)).with_wait(WaitPolicy::NoWait);
        let held = semaphore.try_acquire(&key, 1, &short).await.unwrap();
        assert!(held.is_some());
        assert!(semaphore
            .try_acquire(&key, 1, &short)
            .await
            .unwrap()
            .is_none());
        assert!(matches!(
            semaphore.try_acquire(&key, 2, &short).await,
            Err(LockError::PermitMismatch { .. })
        ));
        // Neither released nor renewed: the permit expires, and with it the count.
        std::mem::forget(held);
        tokio::time::sleep(Duration::from_millis(1001)).await;
        let again = semaphore.try_acquire(&key, 2, &short).await.unwrap();
        assert!(again.is_some(), "the expired permit was not freed");
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_writer_holds_new_readers_back_until_it_gives_up() {
        let rw = MemoryLock::new().rw_lock();
        let key = LockKey::new("k").unwrap();
        let options = LockOptions::new(Duration::from_secs(60));
        let reader = rw.acquire(&key, RwMode::Read, &options).await.unwrap();
        let waiting = options
            .clone()
            .with_wait(WaitPolicy::Timeout(Duration::from_secs(5)));
        let writer = {
            let (rw, key) = (rw.clone(), key.clone());
            tokio::spawn(async move { rw.acquire(&key, RwMode::Write, &waiting).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        let no_wait = options.clone().with_wait(WaitPolicy::NoWait);
        assert!(
            rw.try_acquire(&key, RwMode::Read, &no_wait)
                .await
                .unwrap()
                .is_none(),
            "a reader got in ahead of a waiting writer"
        );
        assert!(matches!(
            writer.await.unwrap(),
            Err(LockError::Timeout { .. })
        ));
        let late = rw.try_acquire(&key, RwMode::Read, &no_wait).await.unwrap();
        assert!(
            late.is_some(),
            "a writer that gave up still holds readers back"
        );
        drop(reader);
    }

    #[tokio::test(start_paused = true)]
    async fn permits_renew_release_and_extend_like_mutex_guards() {
        use crate::{AutoRenew, ExtendOutcome, LeaseState, ReleaseOutcome};
        let semaphore = MemoryLock::new().semaphore();
        let key = LockKey::new("k").unwrap();
        let ttl = Duration::from_millis(300);
        let renewed = LockOptions::new(ttl).with_auto_renew(AutoRenew::new());
        let guard = semaphore.acquire(&key, 1, &renewed).await.unwrap();
        tokio::time::sleep(ttl * 5).await;
        assert_eq!(guard.state(), LeaseState::Held);
        let no_wait = LockOptions::new(ttl).with_wait(WaitPolicy::NoWait);
        assert!(semaphore
            .try_acquire(&key, 1, &no_wait)
            .await
            .unwrap()
            .is_none());
        let lease = guard.lease().clone();
        assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
        assert_eq!(
            DistributedSemaphore::release(&*semaphore, &lease)
                .await
                .unwrap(),
            ReleaseOutcome::Expired
        );
        let other = semaphore.try_acquire(&key, 1, &no_wait).await.unwrap();
        assert!(other.is_some());
        assert_eq!(
            DistributedSemaphore::extend(&*semaphore, &lease, ttl)
                .await
                .unwrap(),
            ExtendOutcome::HeldByOther,
            "another holder's permit is not ours to extend"
        );
    }

    #[tokio::test]
    async fn inspect_shows_permits_modes_and_a_waiting_writer() {
        let client = MemoryLock::new();
        let (semaphore, rw) = (client.semaphore(), client.rw_lock());
        let key = LockKey::new("k").unwrap();
        let options = LockOptions::new(Duration::from_secs(30));
        let free = semaphore.inspect(&key).await.unwrap();
        assert_eq!((free.permits, free.holders.len()), (None, 0));
        let first = semaphore.acquire(&key, 3, &options).await.unwrap();
        let _second = semaphore.acquire(&key, 3, &options).await.unwrap();
        let seen = semaphore.inspect(&key).await.unwrap();
        assert_eq!((seen.permits, seen.holders.len()), (Some(3), 2));
        assert!(seen.holders[0].remaining.is_some());
        first.release().await.unwrap();
        assert_eq!(semaphore.inspect(&key).await.unwrap().holders.len(), 1);

        assert_eq!(rw.inspect(&key).await.unwrap().mode, None);
        let reader = rw.acquire(&key, RwMode::Read, &options).await.unwrap();
        let seen = rw.inspect(&key).await.unwrap();
        assert_eq!(seen.mode, Some(RwMode::Read));
        assert_eq!(seen.writer_waiting, Some(false));
        let writer = {
            let rw = rw.clone();
            let (key, options) = (key.clone(), options.clone());
            tokio::spawn(async move { rw.acquire(&key, RwMode::Write, &options).await })
        };
        // Polled: the waiting writer registers on the spawned task.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while rw.inspect(&key).await.unwrap().writer_waiting != Some(true) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the writer never waited"
            );
            tokio::task::yield_now().await;
        }
        reader.release().await.unwrap();
        let writer = writer.await.unwrap().unwrap();
        let seen = rw.inspect(&key).await.unwrap();
        assert_eq!(seen.mode, Some(RwMode::Write));
        assert_eq!(seen.holders.map(|h| h.len()), Some(1));
        writer.release().await.unwrap();
    }
}
