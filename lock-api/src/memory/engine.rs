//! [`MemoryLock`]: the memory backend's [`Engine`], the reference implementation of
//! that trait.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::shared::{self, Kind, Want};
use super::{wait_woken, MemoryStore, MEMORY_BACKEND, NOT_FIFO};
use crate::engine::{Claim, Engine, Grant, Request};
use crate::{
    BackendInfo, Capabilities, Capability, Client, DistributedLock, DistributedRwLock,
    DistributedSemaphore, ExtendOutcome, FencingToken, HolderStatus, KeyStatus, Leader,
    LeaderElection, Lease, LeaseMonitor, LockError, LockKey, OwnerToken, Primitive, ReleaseOutcome,
    RwMode, RwStatus, SemaphoreStatus,
};

/// A client of a [`MemoryStore`]: every primitive in memory, as the server backends
/// offer them.
///
/// Waiting is woken by releases, by waiting writers giving up, and at the holder's
/// expiry; there is no polling. Every grant of every primitive carries a fencing token
/// from the store's one counter. A waiting writer holds new readers back until it is
/// granted or gives up (writer preference). Cloning gives another handle on the same
/// client; use it through [`Client`] ([`MemoryLock::client`]).
#[derive(Debug, Clone)]
pub struct MemoryLock {
    store: Arc<MemoryStore>,
    crashed: Arc<AtomicBool>,
}

impl Default for MemoryLock {
    fn default() -> Self {
        MemoryLock::new()
    }
}

impl MemoryLock {
    /// A client of a fresh, private store.
    pub fn new() -> Self {
        MemoryLock::with_store(MemoryStore::new())
    }

    /// A client of `store`.
    pub fn with_store(store: Arc<MemoryStore>) -> Self {
        MemoryLock {
            store,
            crashed: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Another independent client of the same store, as if from another process.
    pub fn new_client(&self) -> Self {
        MemoryLock::with_store(self.store.clone())
    }

    /// The store this client talks to.
    pub fn store(&self) -> &Arc<MemoryStore> {
        &self.store
    }

    /// Fault injection: this client behaves from now on like a process that died.
    /// Every call fails with [`LockError::Connection`], so drops and renewals do not
    /// reach the store and its locks are freed only by their TTL.
    pub fn simulate_crash(&self) {
        self.crashed.store(true, Ordering::SeqCst);
    }

    /// This client, for every primitive.
    pub fn client(&self) -> Client {
        Client::new(self.clone())
    }

    /// The mutex of this client (`self.client().lock()`).
    pub fn lock(&self) -> Arc<dyn DistributedLock> {
        self.client().lock()
    }

    /// The semaphore of this client, crashed together with it.
    pub fn semaphore(&self) -> Arc<dyn DistributedSemaphore> {
        self.client().semaphore()
    }

    /// The read-write lock of this client, crashed together with it.
    pub fn rw_lock(&self) -> Arc<dyn DistributedRwLock> {
        self.client().rw_lock()
    }

    /// Leader election on this client, crashed together with it.
    pub fn election(&self) -> Arc<dyn LeaderElection> {
        self.client().election()
    }

    pub(super) fn check_alive(&self) -> Result<(), LockError> {
        if self.crashed.load(Ordering::SeqCst) {
            return Err(LockError::connection(
                MEMORY_BACKEND,
                "this memory client was crashed by fault injection",
            ));
        }
        Ok(())
    }

    /// One mutex attempt: the lease, or the holder's expiry.
    fn attempt_mutex(
        &self,
        request: &Request<'_>,
    ) -> Result<Result<Lease, Option<Instant>>, LockError> {
        self.check_alive()?;
        let ttl = request.options.ttl();
        let requested_at = Instant::now();
        if requested_at.checked_add(ttl).is_none() {
            return Err(LockError::config(MEMORY_BACKEND, "ttl overflows the clock"));
        }
        let owner = OwnerToken::random();
        let key = request.key;
        Ok(self
            .store
            .grant(key, owner, ttl)
            .map(|fence| Lease::describe(key.clone(), owner, Some(fence), ttl, requested_at)))
    }

    /// Waits on `kind`'s table for `want`, as [`wait_woken`] does.
    async fn acquire_shared(
        &self,
        request: &Request<'_>,
        kind: Kind,
        want: Want,
    ) -> Result<Option<Lease>, LockError> {
        let table = &self.store.shared;
        let wake = table.wake_handle(kind, request.key);
        wait_woken(wake, request.deadline, request.report, || {
            shared::attempt(self, kind, request.key, want.clone(), request.options)
        })
        .await
    }

    /// A writer: one try, then, if it must wait, an intent that holds new readers back
    /// until it is granted or this future is dropped.
    async fn acquire_write(&self, request: &Request<'_>) -> Result<Option<Lease>, LockError> {
        let key = request.key;
        match shared::attempt(self, Kind::Rw, key, Want::Write, request.options)? {
            Ok(lease) => return Ok(Some(lease)),
            Err(_) if !request.waits() => {
                request.saw_held();
                return Ok(None);
            }
            Err(_) => {}
        }
        let _intent = self.store.shared.writer_waits(key);
        self.acquire_shared(request, Kind::Rw, Want::Write).await
    }
}

/// The shared table's namespace of a primitive other than the mutex.
fn kind_of(primitive: Primitive) -> Option<Kind> {
    match primitive {
        Primitive::Mutex => None,
        Primitive::Semaphore => Some(Kind::Semaphore),
        Primitive::RwLock => Some(Kind::Rw),
        Primitive::Election => Some(Kind::Election),
    }
}

#[async_trait]
impl Engine for MemoryLock {
    fn info(&self) -> BackendInfo {
        let capabilities = Capabilities::all_supported()
            .with_every(|g| g.fifo = Capability::Unsupported(NOT_FIFO));
        BackendInfo::new(MEMORY_BACKEND, capabilities).with_unreleased_lock_ends(
            "it is freed when its process exits (the lock lives in its memory) or its lease \
             runs out",
        )
    }

    async fn acquire(&self, request: &Request<'_>) -> Result<Option<Grant>, LockError> {
        let lease = match request.claim {
            Claim::Mutex => {
                let wake = self.store.wake_handle(request.key);
                wait_woken(wake, request.deadline, request.report, || {
                    self.attempt_mutex(request)
                })
                .await?
            }
            Claim::Permit { max } => {
                self.acquire_shared(request, Kind::Semaphore, Want::Permit(max))
                    .await?
            }
            Claim::Rw(RwMode::Read) => self.acquire_shared(request, Kind::Rw, Want::Read).await?,
            Claim::Rw(RwMode::Write) => self.acquire_write(request).await?,
            Claim::Lead(candidate) => {
                let want = Want::Lead(candidate.clone());
                self.acquire_shared(request, Kind::Election, want).await?
            }
        };
        Ok(lease.map(|lease| {
            let monitor = LeaseMonitor::held_until(lease.acquired_at() + lease.ttl());
            Grant::new(lease, monitor)
        }))
    }

    async fn release(
        &self,
        primitive: Primitive,
        lease: &Lease,
    ) -> Result<ReleaseOutcome, LockError> {
        self.check_alive()?;
        let (key, owner) = (lease.key(), lease.owner());
        Ok(match kind_of(primitive) {
            None => self.store.delete_if_owner(key, owner),
            Some(kind) => self.store.shared.release(kind, key, owner),
        })
    }

    async fn extend(
        &self,
        primitive: Primitive,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        self.check_alive()?;
        let (key, owner, now) = (lease.key(), lease.owner(), Instant::now());
        Ok(match kind_of(primitive) {
            None => self.store.expire_if_owner(key, owner, ttl, now),
            Some(kind) => self.store.shared.extend(kind, key, owner, ttl, now),
        })
    }

    async fn inspect(&self, key: &LockKey) -> Result<KeyStatus, LockError> {
        self.check_alive()?;
        let Some(entry) = self.store.get(key) else {
            return Ok(KeyStatus::free());
        };
        let remaining = entry
            .expires_at
            .map(|at| at.saturating_duration_since(Instant::now()));
        Ok(KeyStatus::held()
            .with_fencing_token(entry.fencing_token)
            .with_remaining(remaining))
    }

    async fn inspect_semaphore(&self, key: &LockKey) -> Result<SemaphoreStatus, LockError> {
        self.check_alive()?;
        let seen = self.store.shared.snapshot(Kind::Semaphore, key);
        let holders = seen
            .holders
            .iter()
            .map(|&(_, left)| HolderStatus::new().with_remaining(Some(left)))
            .collect();
        Ok(SemaphoreStatus::new(seen.permits, holders))
    }

    async fn inspect_rw(&self, key: &LockKey) -> Result<RwStatus, LockError> {
        self.check_alive()?;
        let seen = self.store.shared.snapshot(Kind::Rw, key);
        let mode = match seen.holders.first() {
            None => None,
            Some(&(true, _)) => Some(RwMode::Write),
            Some(&(false, _)) => Some(RwMode::Read),
        };
        let holders = seen
            .holders
            .iter()
            .map(|&(_, left)| HolderStatus::new().with_remaining(Some(left)))
            .collect();
        Ok(RwStatus::new(mode, Some(holders)).with_writer_waiting(Some(seen.writer_waiting)))
    }

    async fn leader(&self, name: &LockKey) -> Result<Option<Leader>, LockError> {
        self.check_alive()?;
        Ok(self.store.shared.leader(name))
    }

    /// Woken by every new leadership and resignation, and at the leader's expiry; no
    /// polling.
    async fn wait_change(
        &self,
        name: &LockKey,
        seen: Option<FencingToken>,
        patience: Duration,
    ) -> Result<Option<Leader>, LockError> {
        let deadline = Instant::now() + patience;
        let wake = self.store.shared.wake_handle(Kind::Election, name);
        loop {
            let woken = wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let now = self.leader(name).await?;
            if now.as_ref().map(|l| l.term) != seen || Instant::now() >= deadline {
                return Ok(now);
            }
            // A leader's lease running out wakes nobody: look again at its expiry.
            let expiry = now
                .and_then(|l| l.remaining)
                .map(|left| Instant::now() + left);
            let at = expiry.map_or(deadline, |e| e.min(deadline));
            tokio::select! {
                _ = &mut woken => {}
                _ = tokio::time::sleep_until(at) => {}
            }
        }
    }
}
