//! Deliberately broken backends, one per classic mistake from the seed articles, built
//! on the memory backend's store. [`crate::self_test`] runs the kit against each to
//! prove the kit catches it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::backend::prelude::*;
use distlock_api::memory::MemoryStore;
use distlock_api::{
    check_ttl, BackendInfo, Capabilities, Capability, DistributedLock, ExtendOutcome, FencingToken,
    Lease, LeaseMonitor, LockError, LockGuard, LockKey, LockOptions, MultiGuard, OwnerToken,
    ReleaseOutcome,
};
use tokio::time::Instant;

use crate::{Client, Harness};

mod primitives;

/// The backend name in errors and reports.
const BROKEN_BACKEND: &str = "broken";

/// The pause between the check and the delete of [`Mistake::CheckThenDelete`]: a slow
/// round trip or a GC pause, the window the real bug needs.
pub const CHECK_THEN_DELETE_GAP: Duration = Duration::from_millis(100);

/// The pause before each key of [`Mistake::MultiKeyCallerOrder`]: a round trip, the
/// window in which two callers each take their first key.
const CALLER_ORDER_GAP: Duration = Duration::from_millis(20);

/// One classic mistake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mistake {
    /// `SET NX` without `PX`: a crashed holder's lock is never freed.
    NoTtl,
    /// Release is a plain `DEL`, without an owner check.
    PlainDelete,
    /// Release is `GET`, compare, then `DEL`, as two round trips.
    CheckThenDelete,
    /// Acquire is `SET` without `NX`: it overwrites the holder.
    Overwrite,
    /// Every grant gets fencing token 1.
    ConstantFencingToken,
    /// Reports fencing unsupported, yet hands out a (best-effort) token with every
    /// grant, which callers then trust.
    TokenWithoutFencing,
    /// Extend is a plain `PEXPIRE`, without an owner check.
    ExtendWithoutOwnerCheck,
    /// The semaphore admits one holder more than its count.
    SemaphoreAdmitsOneMore,
    /// The semaphore claims FIFO waiting, yet its waiters queue on a stack: the newest
    /// is served first.
    SemaphoreFifoClaimedLifo,
    /// The read-write lock grants reads without looking at the writer.
    ReadBesideWrite,
    /// The read-write lock's writer polls for a moment with no reader, and readers
    /// never wait for it: a plain `flock` or `pthread_rwlock` with reader preference.
    WriterStarved,
    /// Each client elects itself on a store of its own: a split brain, two leaders.
    TwoLeaders,
    /// Several keys are taken in the order the caller names them, so two callers
    /// naming overlapping sets differently can deadlock.
    MultiKeyCallerOrder,
}

impl Mistake {
    /// Every mistake.
    pub const ALL: [Mistake; 13] = [
        Mistake::NoTtl,
        Mistake::PlainDelete,
        Mistake::CheckThenDelete,
        Mistake::Overwrite,
        Mistake::ConstantFencingToken,
        Mistake::TokenWithoutFencing,
        Mistake::ExtendWithoutOwnerCheck,
        Mistake::SemaphoreAdmitsOneMore,
        Mistake::SemaphoreFifoClaimedLifo,
        Mistake::ReadBesideWrite,
        Mistake::WriterStarved,
        Mistake::TwoLeaders,
        Mistake::MultiKeyCallerOrder,
    ];

    /// A short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            Mistake::NoTtl => "no-ttl",
            Mistake::PlainDelete => "release-plain-del",
            Mistake::CheckThenDelete => "release-check-then-del",
            Mistake::Overwrite => "acquire-overwrites",
            Mistake::ConstantFencingToken => "constant-fencing-token",
            Mistake::TokenWithoutFencing => "token-without-fencing",
            Mistake::ExtendWithoutOwnerCheck => "extend-without-owner-check",
            Mistake::SemaphoreAdmitsOneMore => "semaphore-admits-n-plus-1",
            Mistake::SemaphoreFifoClaimedLifo => "semaphore-fifo-claimed-lifo",
            Mistake::ReadBesideWrite => "read-beside-write",
            Mistake::WriterStarved => "writer-starved-by-readers",
            Mistake::TwoLeaders => "election-two-leaders",
            Mistake::MultiKeyCallerOrder => "multi-key-caller-order",
        }
    }

    /// What the broken backend does.
    pub fn description(self) -> &'static str {
        match self {
            Mistake::NoTtl => "SET NX without PX: the lock never expires",
            Mistake::PlainDelete => "release is DEL without checking the owner",
            Mistake::CheckThenDelete => "release is GET + compare, then DEL in a second round trip",
            Mistake::Overwrite => "acquire is SET without NX",
            Mistake::ConstantFencingToken => "every grant carries fencing token 1",
            Mistake::TokenWithoutFencing => {
                "reports fencing unsupported, yet every grant carries a token"
            }
            Mistake::ExtendWithoutOwnerCheck => "extend is PEXPIRE without checking the owner",
            Mistake::SemaphoreAdmitsOneMore => "the semaphore admits max + 1 holders",
            Mistake::SemaphoreFifoClaimedLifo => {
                "the semaphore claims FIFO waiting, yet serves the newest waiter first"
            }
            Mistake::ReadBesideWrite => "a read lock is granted beside a write lock",
            Mistake::WriterStarved => {
                "readers never wait for a waiting writer, which polls for a gap that never comes"
            }
            Mistake::TwoLeaders => "each client elects itself on a store of its own",
            Mistake::MultiKeyCallerOrder => {
                "several keys are taken in the order the caller names them"
            }
        }
    }
}

/// A memory-store client that makes one [`Mistake`] and is otherwise correct.
#[derive(Debug, Clone)]
pub struct BrokenLock {
    store: Arc<MemoryStore>,
    mistake: Mistake,
    crashed: Arc<AtomicBool>,
}

impl BrokenLock {
    /// A client of `store` making `mistake`.
    pub fn new(store: Arc<MemoryStore>, mistake: Mistake) -> Self {
        BrokenLock {
            store,
            mistake,
            crashed: Arc::new(AtomicBool::new(false)),
        }
    }

    fn check_alive(&self) -> Result<(), LockError> {
        if self.crashed.load(Ordering::SeqCst) {
            return Err(LockError::connection(
                BROKEN_BACKEND,
                "crashed by fault injection",
            ));
        }
        Ok(())
    }

    fn attempt(
        &self,
        key: &LockKey,
        options: &LockOptions,
    ) -> Result<Result<LockGuard, Option<Instant>>, LockError> {
        self.check_alive()?;
        let (owner, ttl, requested_at) = (OwnerToken::random(), options.ttl(), Instant::now());
        let granted = match self.mistake {
            Mistake::NoTtl => self
                .store
                .set_if_absent(key, owner, None)
                .map(|()| self.store.next_fencing_token()),
            Mistake::Overwrite => {
                self.store.overwrite(key, owner, Some(ttl));
                Ok(self.store.next_fencing_token())
            }
            Mistake::ConstantFencingToken => self
                .store
                .set_if_absent(key, owner, Some(ttl))
                .map(|()| FencingToken::new(1)),
            _ => self.store.grant(key, owner, ttl),
        };
        Ok(granted.map(|fence| {
            let lease = Lease::new(key.clone(), owner, Some(fence), ttl, requested_at);
            LockGuard::new(
                lease,
                LeaseMonitor::new(requested_at + ttl),
                Arc::new(self.clone()),
                options.auto_renew(),
            )
        }))
    }
}

#[async_trait]
impl DistributedLock for BrokenLock {
    fn info(&self) -> BackendInfo {
        // Each claims everything, as the real mistakes' authors did, but one; and none
        // claims FIFO: the memory store under them wakes every waiter at once.
        let mut capabilities = Capabilities::all_supported().with_every(|g| {
            g.fifo = Capability::Unsupported(
                "built on the memory store, which wakes every waiter of a released key at once",
            );
        });
        if self.mistake == Mistake::TokenWithoutFencing {
            capabilities.mutex.fencing =
                Capability::Unsupported("the counters are best effort (but handed out anyway)");
        }
        if self.mistake == Mistake::SemaphoreFifoClaimedLifo {
            capabilities.semaphore.fifo = Capability::Supported;
        }
        BackendInfo::new(BROKEN_BACKEND, capabilities)
    }

    async fn acquire_all(
        &self,
        keys: &[LockKey],
        options: &LockOptions,
    ) -> Result<MultiGuard, LockError> {
        if self.mistake != Mistake::MultiKeyCallerOrder {
            return distlock_api::backend::acquire_all(self, keys, options).await;
        }
        // One round trip apart, each with the whole wait: what a hand-written loop does.
        let mut parts = Vec::with_capacity(keys.len());
        for key in keys {
            tokio::time::sleep(CALLER_ORDER_GAP).await;
            parts.push(self.acquire(key, options).await?);
        }
        Ok(distlock_api::backend::multi_guard(parts))
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        options.validate_for(BROKEN_BACKEND)?;
        Ok(self.attempt(key, options)?.ok())
    }

    async fn acquire(&self, key: &LockKey, options: &LockOptions) -> Result<LockGuard, LockError> {
        options.validate_for(BROKEN_BACKEND)?;
        self.store
            .acquire_woken(key, options, BROKEN_BACKEND, || self.attempt(key, options))
            .await
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.check_alive()?;
        let key = lease.key();
        Ok(match self.mistake {
            Mistake::PlainDelete => match self.store.delete(key) {
                true => ReleaseOutcome::Released,
                false => ReleaseOutcome::Expired,
            },
            Mistake::CheckThenDelete => match self.store.get(key) {
                Some(entry) if entry.owner == lease.owner() => {
                    tokio::time::sleep(CHECK_THEN_DELETE_GAP).await;
                    self.store.delete(key);
                    ReleaseOutcome::Released
                }
                Some(_) => ReleaseOutcome::HeldByOther,
                None => ReleaseOutcome::Expired,
            },
            _ => self.store.delete_if_owner(key, lease.owner()),
        })
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        check_ttl(ttl).map_err(|e| LockError::invalid_options(BROKEN_BACKEND, e))?;
        self.check_alive()?;
        let requested_at = Instant::now();
        Ok(match self.mistake {
            Mistake::ExtendWithoutOwnerCheck => match self.store.expire(lease.key(), ttl) {
                true => ExtendOutcome::Extended {
                    valid_until: requested_at + ttl,
                },
                false => ExtendOutcome::Expired,
            },
            _ => self
                .store
                .expire_if_owner(lease.key(), lease.owner(), ttl, requested_at),
        })
    }
}

/// Clients of one store, all making the same mistake, each crashable.
pub struct BrokenHarness {
    store: Arc<MemoryStore>,
    mistake: Mistake,
}

impl BrokenHarness {
    /// A harness over a fresh store.
    pub fn new(mistake: Mistake) -> Self {
        BrokenHarness {
            store: MemoryStore::new(),
            mistake,
        }
    }
}

#[async_trait]
impl Harness for BrokenHarness {
    fn name(&self) -> String {
        format!("broken:{}", self.mistake.name())
    }

    async fn client(&self) -> Result<Client, LockError> {
        let lock = BrokenLock::new(self.store.clone(), self.mistake);
        let crashed = lock.crashed.clone();
        Ok(primitives::client_of(
            Arc::new(lock),
            &self.store,
            self.mistake,
            move || {
                crashed.store(true, Ordering::SeqCst);
            },
        ))
    }
}
