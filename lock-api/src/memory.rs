//! The in-memory reference backend: same semantics as the server backends, in-process.
//!
//! [`MemoryStore`] plays the server: a key-value table with per-key expiry and a few
//! Redis-like commands, each atomic. [`MemoryLock`] is a client of it: the memory
//! backend's [`Engine`](crate::backend::Engine), the reference implementation of that
//! trait, granting every primitive with atomic compound commands, just as the Redis
//! backend does with Lua scripts. Several clients may share one store, like processes
//! sharing a server; each client can be crashed on purpose to test liveness.
//!
//! Fencing tokens come from one counter per store, shared by all keys, so they
//! strictly increase per key and no per-key state outlives a free key.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

mod engine;
mod shared;

pub use engine::MemoryLock;

use crate::backend::WaitReport;
use crate::{ExtendOutcome, FencingToken, LockError, LockKey, OwnerToken, ReleaseOutcome};

/// The backend name in errors and reports.
pub const MEMORY_BACKEND: &str = "memory";

/// Why the memory backend reports no FIFO waiting.
const NOT_FIFO: &str =
    "a release wakes every waiter of the key at once and the first to run takes it";

/// A raw store command [`MemoryLock`] uses: public with the `test-util` feature (for
/// the conformance kit's broken backends), crate-private otherwise.
macro_rules! raw_command {
    ($(#[$meta:meta])* fn $($rest:tt)+) => {
        #[cfg(feature = "test-util")]
        $(#[$meta])* pub fn $($rest)+
        #[cfg(not(feature = "test-util"))]
        $(#[$meta])* pub(crate) fn $($rest)+
    };
    ($(#[$meta:meta])* async fn $($rest:tt)+) => {
        #[cfg(feature = "test-util")]
        $(#[$meta])* pub async fn $($rest)+
        #[cfg(not(feature = "test-util"))]
        $(#[$meta])* pub(crate) async fn $($rest)+
    };
}

#[derive(Debug)]
struct Slot {
    holder: Option<Holder>,
    /// Waiters on this key; `notify_waiters` on every delete.
    wake: Arc<Notify>,
}

#[derive(Debug, Clone, Copy)]
struct Holder {
    owner: OwnerToken,
    /// `None`: never expires (only the broken no-TTL backend does this).
    expires_at: Option<Instant>,
    /// The grant's fencing token; `None` for entries written by raw commands.
    fencing_token: Option<FencingToken>,
}

impl Holder {
    fn is_live(&self, now: Instant) -> bool {
        self.expires_at.is_none_or(|t| t > now)
    }
}

/// What a key holds now, as seen by [`MemoryStore::get`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Entry {
    /// The owner token stored under the key.
    pub owner: OwnerToken,
    /// When the entry expires; `None` for never.
    pub expires_at: Option<Instant>,
    /// The fencing token of the grant that wrote it; `None` for raw writes.
    pub fencing_token: Option<FencingToken>,
}

/// An in-process lock table: the "server" of the memory backend.
///
/// Every method is atomic with respect to every other. Expired entries are treated as
/// absent.
///
/// Applications read it ([`MemoryStore::get`]). Its raw commands (writes that bypass
/// the owner check, grants, waits) exist for [`MemoryLock`] and for the conformance
/// kit's deliberately broken backends: they are public only with the `test-util`
/// feature of `distlock-api`, which applications do not turn on.
#[derive(Debug, Default)]
pub struct MemoryStore {
    slots: Mutex<HashMap<LockKey, Slot>>,
    fence: AtomicU64,
    /// The semaphores' and read-write locks' holders.
    shared: Arc<shared::SharedTable>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Arc<Self> {
        Arc::new(MemoryStore::default())
    }

    /// The process-wide store called `name` (created on first use). `memory://NAME`
    /// URLs use this, so every client connected by the same URL shares locks.
    pub fn named(name: &str) -> Arc<Self> {
        static STORES: OnceLock<Mutex<HashMap<String, Arc<MemoryStore>>>> = OnceLock::new();
        let mut stores = STORES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        stores.entry(name.to_owned()).or_default().clone()
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<LockKey, Slot>> {
        // A panic elsewhere cannot leave a slot half-written: every update is one assignment.
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn live_holder(slots: &HashMap<LockKey, Slot>, key: &LockKey, now: Instant) -> Option<Holder> {
        slots
            .get(key)
            .and_then(|s| s.holder)
            .filter(|h| h.is_live(now))
    }

    /// The live entry under `key`, if any.
    pub fn get(&self, key: &LockKey) -> Option<Entry> {
        Self::live_holder(&self.slots(), key, Instant::now()).map(|h| Entry {
            owner: h.owner,
            expires_at: h.expires_at,
            fencing_token: h.fencing_token,
        })
    }

    /// Stores `owner` under `key` for `ttl` (`None`: forever) unless a live entry is
    /// there (`SET NX PX`). On refusal returns the live entry's expiry.
    #[cfg(feature = "test-util")]
    pub fn set_if_absent(
        &self,
        key: &LockKey,
        owner: OwnerToken,
        ttl: Option<Duration>,
    ) -> Result<(), Option<Instant>> {
        let now = Instant::now();
        let mut slots = self.slots();
        if let Some(holder) = Self::live_holder(&slots, key, now) {
            return Err(holder.expires_at);
        }
        Self::put(&mut slots, key, owner, ttl, None, now);
        Ok(())
    }

    /// Stores `owner` under `key` for `ttl`, replacing any entry (`SET PX`, no `NX`).
    #[cfg(feature = "test-util")]
    pub fn overwrite(&self, key: &LockKey, owner: OwnerToken, ttl: Option<Duration>) {
        Self::put(&mut self.slots(), key, owner, ttl, None, Instant::now());
    }

    fn put(
        slots: &mut HashMap<LockKey, Slot>,
        key: &LockKey,
        owner: OwnerToken,
        ttl: Option<Duration>,
        fencing_token: Option<FencingToken>,
        now: Instant,
    ) {
        let holder = Holder {
            owner,
            expires_at: ttl.and_then(|ttl| now.checked_add(ttl)),
            fencing_token,
        };
        slots
            .entry(key.clone())
            .or_insert_with(|| Slot {
                holder: None,
                wake: Arc::new(Notify::new()),
            })
            .holder = Some(holder);
    }

    raw_command! {
        /// [`MemoryStore::set_if_absent`] and, on success, a fresh fencing token, atomically.
        fn grant(
            &self,
            key: &LockKey,
            owner: OwnerToken,
            ttl: Duration,
        ) -> Result<FencingToken, Option<Instant>> {
            let now = Instant::now();
            let mut slots = self.slots();
            if let Some(holder) = Self::live_holder(&slots, key, now) {
                return Err(holder.expires_at);
            }
            let token = self.next_fencing_token();
            Self::put(&mut slots, key, owner, Some(ttl), Some(token), now);
            Ok(token)
        }
    }

    raw_command! {
        /// A fencing token above every one handed out before by this store (`INCR`).
        fn next_fencing_token(&self) -> FencingToken {
            FencingToken::new(self.fence.fetch_add(1, Ordering::SeqCst) + 1)
        }
    }

    /// Removes any entry under `key` without looking at its owner (`DEL`), waking
    /// waiters. Returns whether a live entry was removed.
    #[cfg(feature = "test-util")]
    pub fn delete(&self, key: &LockKey) -> bool {
        let now = Instant::now();
        let mut slots = self.slots();
        let was_live = Self::live_holder(&slots, key, now).is_some();
        Self::clear(&mut slots, key);
        was_live
    }

    raw_command! {
        /// Removes the entry under `key` only if `owner` holds it, atomically (the Lua
        /// compare-and-delete), waking waiters.
        fn delete_if_owner(&self, key: &LockKey, owner: OwnerToken) -> ReleaseOutcome {
            let now = Instant::now();
            let mut slots = self.slots();
            match Self::live_holder(&slots, key, now) {
                Some(h) if h.owner == owner => {
                    Self::clear(&mut slots, key);
                    ReleaseOutcome::Released
                }
                Some(_) => ReleaseOutcome::HeldByOther,
                None => ReleaseOutcome::Expired,
            }
        }
    }

    fn clear(slots: &mut HashMap<LockKey, Slot>, key: &LockKey) {
        if let Some(slot) = slots.get_mut(key) {
            slot.holder = None;
            slot.wake.notify_waiters();
            // Nobody waits (only the table holds `wake`): forget the key.
            if Arc::strong_count(&slot.wake) == 1 {
                slots.remove(key);
            }
        }
    }

    /// Sets the expiry of the live entry under `key` to `ttl` from now, whoever owns it
    /// (`PEXPIRE`). Returns whether there was a live entry.
    #[cfg(feature = "test-util")]
    pub fn expire(&self, key: &LockKey, ttl: Duration) -> bool {
        let now = Instant::now();
        let mut slots = self.slots();
        match slots.get_mut(key).and_then(|s| s.holder.as_mut()) {
            Some(h) if h.is_live(now) => {
                h.expires_at = now.checked_add(ttl);
                true
            }
            _ => false,
        }
    }

    raw_command! {
        /// Sets the expiry of the entry under `key` to `ttl` from now only if `owner` holds
        /// it, atomically (the Lua compare-and-`PEXPIRE`). `valid_until` in the outcome is
        /// `requested_at + ttl`.
        fn expire_if_owner(
            &self,
            key: &LockKey,
            owner: OwnerToken,
            ttl: Duration,
            requested_at: Instant,
        ) -> ExtendOutcome {
            let now = Instant::now();
            let mut slots = self.slots();
            match slots.get_mut(key).and_then(|s| s.holder.as_mut()) {
                Some(h) if h.is_live(now) && h.owner == owner => {
                    h.expires_at = now.checked_add(ttl);
                    match requested_at.checked_add(ttl) {
                        Some(valid_until) => ExtendOutcome::Extended { valid_until },
                        None => ExtendOutcome::Expired,
                    }
                }
                Some(h) if h.is_live(now) => ExtendOutcome::HeldByOther,
                _ => ExtendOutcome::Expired,
            }
        }
    }

    /// The notifier woken whenever the entry under `key` is deleted. Register interest
    /// (`Notified::enable`) before checking the key, so no wake-up is lost.
    fn wake_handle(&self, key: &LockKey) -> Arc<Notify> {
        self.slots()
            .entry(key.clone())
            .or_insert_with(|| Slot {
                holder: None,
                wake: Arc::new(Notify::new()),
            })
            .wake
            .clone()
    }

    /// The waiting loop of an acquire: calls `attempt` until it grants, waking on every
    /// delete of `key` and at the holder's expiry (no polling), until the wait policy
    /// runs out. `attempt` returns the guard, or the live holder's expiry.
    ///
    /// # Errors
    /// [`LockError::Timeout`] when the wait runs out, or whatever `attempt` returns.
    #[cfg(feature = "test-util")]
    pub async fn acquire_woken<F>(
        &self,
        key: &LockKey,
        options: &crate::LockOptions,
        backend: &'static str,
        attempt: F,
    ) -> Result<crate::LockGuard, LockError>
    where
        F: FnMut() -> Result<Result<crate::LockGuard, Option<Instant>>, LockError>,
    {
        let start = Instant::now();
        let report = WaitReport::new();
        let deadline = options.wait().deadline_from(start);
        match wait_woken(self.wake_handle(key), deadline, &report, attempt).await? {
            Some(guard) => Ok(guard.with_contended(report.held_seen())),
            None => Err(LockError::Timeout {
                backend,
                key: key.clone(),
                waited: start.elapsed(),
            }),
        }
    }

    /// How many keys the table tracks (held, expired-but-not-yet-cleared, or waited on).
    #[cfg(feature = "test-util")]
    pub fn tracked_keys(&self) -> usize {
        self.slots().len()
    }
}

/// The waiting loop behind [`MemoryStore::acquire_woken`] and the memory engine's
/// acquires: calls `attempt` until it grants, waking on every notification of `wake`
/// and at the holder's expiry (no polling), until `deadline` (`None`: forever). Register
/// nothing before calling: the loop enables its wake-up before each attempt, so a
/// release in between is not lost. Returns the grant, or `None` when the key is still
/// held at the deadline; notes in `report` each attempt that met the key held.
pub(crate) async fn wait_woken<T, F>(
    wake: Arc<Notify>,
    deadline: Option<Instant>,
    report: &WaitReport,
    mut attempt: F,
) -> Result<Option<T>, LockError>
where
    F: FnMut() -> Result<Result<T, Option<Instant>>, LockError>,
{
    loop {
        let woken = wake.notified();
        tokio::pin!(woken);
        // Registered before the attempt, so a delete in between still wakes us.
        woken.as_mut().enable();
        let holder_expiry = match attempt()? {
            Ok(granted) => return Ok(Some(granted)),
            Err(expiry) => expiry,
        };
        report.saw_held();
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
        let wake_at = match (holder_expiry, deadline) {
            (Some(e), Some(d)) => Some(e.min(d)),
            (e, d) => e.or(d),
        };
        match wake_at {
            Some(at) => {
                tokio::select! {
                    _ = &mut woken => {}
                    _ = tokio::time::sleep_until(at) => {}
                }
            }
            None => woken.await,
        }
    }
}
