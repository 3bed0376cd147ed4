//! The semaphore and read-write lock of the broken clients: correct memory ones, except
//! for the mistakes about them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::memory::MemoryStore;
use distlock_api::{
    BackendInfo, DistributedLock, DistributedRwLock, DistributedSemaphore, ExtendOutcome, Lease,
    LockError, LockGuard, LockKey, LockOptions, MemoryLock, ReleaseOutcome, RwMode, WaitOrder,
};
use tokio::time::Instant;

use super::Mistake;
use crate::{Client, ClientFaults};

/// How often the starved writer of [`Mistake::WriterStarved`] looks for a gap.
const STARVED_WRITER_POLL: Duration = Duration::from_millis(5);

/// A client of `lock` with a semaphore, a read-write lock and an election on `store`
/// (broken as `mistake` says), and a crash hook that runs `crash_lock` and crashes them
/// too.
pub(super) fn client_of(
    lock: Arc<dyn DistributedLock>,
    store: &Arc<MemoryStore>,
    mistake: Mistake,
    crash_lock: impl Fn() + Send + Sync + 'static,
) -> Client {
    let memory = MemoryLock::with_store(store.clone());
    let semaphore = BrokenSemaphore {
        inner: memory.semaphore(),
        extra: u32::from(mistake == Mistake::SemaphoreAdmitsOneMore),
        stacked: mistake == Mistake::SemaphoreFifoClaimedLifo,
    };
    let rw_lock = BrokenRwLock {
        inner: memory.rw_lock(),
        mistake,
    };
    // The split brain: a private store elects every client.
    let election = match mistake {
        Mistake::TwoLeaders => MemoryLock::new().election(),
        _ => memory.election(),
    };
    let faults = CrashBoth {
        memory,
        crash_lock: Box::new(crash_lock),
    };
    let client =
        distlock_api::Client::from_handles(lock, Arc::new(semaphore), Arc::new(rw_lock), election);
    Client::new(client).with_faults(Arc::new(faults))
}

struct CrashBoth {
    memory: MemoryLock,
    crash_lock: Box<dyn Fn() + Send + Sync>,
}

#[async_trait]
impl ClientFaults for CrashBoth {
    async fn crash(&self) -> Result<(), LockError> {
        (self.crash_lock)();
        self.memory.simulate_crash();
        Ok(())
    }
}

/// Admits `extra` more holders than asked for; when `stacked`, claims FIFO waiting but
/// serves waiters newest first.
#[derive(Debug)]
struct BrokenSemaphore {
    inner: Arc<dyn DistributedSemaphore>,
    extra: u32,
    stacked: bool,
}

/// The waiters of [`Mistake::SemaphoreFifoClaimedLifo`], per key, newest last: shared
/// by every client in the process, as a server's queue would be.
static STACKS: Mutex<Vec<(LockKey, u64)>> = Mutex::new(Vec::new());

/// How often a stacked waiter looks whether it is the newest.
const STACK_POLL: Duration = Duration::from_millis(5);

/// A waiter's place on [`STACKS`], left when dropped.
struct Stacked(LockKey, u64);

impl Stacked {
    fn push(key: &LockKey) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        stacks().push((key.clone(), id));
        Stacked(key.clone(), id)
    }

    fn is_newest(&self) -> bool {
        let newest = stacks()
            .iter()
            .rev()
            .find(|(k, _)| *k == self.0)
            .map(|&(_, id)| id);
        newest == Some(self.1)
    }
}

impl Drop for Stacked {
    fn drop(&mut self) {
        stacks().retain(|(k, id)| !(*k == self.0 && *id == self.1));
    }
}

fn stacks() -> std::sync::MutexGuard<'static, Vec<(LockKey, u64)>> {
    STACKS.lock().unwrap_or_else(PoisonError::into_inner)
}

impl BrokenSemaphore {
    /// The stacked mistake's wait: only the newest waiter tries, every few ms.
    async fn acquire_stacked(
        &self,
        key: &LockKey,
        max: u32,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        let started = Instant::now();
        let deadline = options.wait().deadline_from(started);
        let mut place = None;
        loop {
            if place.as_ref().is_none_or(Stacked::is_newest) {
                if let Some(guard) = self.inner.try_acquire(key, max, options).await? {
                    return Ok(guard);
                }
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(LockError::Timeout {
                    backend: "broken",
                    key: key.clone(),
                    waited: started.elapsed(),
                });
            }
            place.get_or_insert_with(|| Stacked::push(key));
            tokio::time::sleep(STACK_POLL).await;
        }
    }
}

#[async_trait]
impl DistributedSemaphore for BrokenSemaphore {
    fn info(&self) -> BackendInfo {
        let mut info = self.inner.info();
        if self.stacked {
            info.capabilities.semaphore.fifo = distlock_api::Capability::Supported;
        }
        info
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        max_permits: u32,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        let max = max_permits.saturating_add(self.extra);
        // A FIFO request reaches the memory semaphore, which has no FIFO, as a plain one.
        let options = options.clone().with_order(WaitOrder::Any);
        self.inner.try_acquire(key, max, &options).await
    }

    async fn acquire(
        &self,
        key: &LockKey,
        max_permits: u32,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        let max = max_permits.saturating_add(self.extra);
        let options = options.clone().with_order(WaitOrder::Any);
        if self.stacked {
            return self.acquire_stacked(key, max, &options).await;
        }
        self.inner.acquire(key, max, &options).await
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.inner.release(lease).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        self.inner.extend(lease, ttl).await
    }
}

#[derive(Debug)]
struct BrokenRwLock {
    inner: Arc<dyn DistributedRwLock>,
    mistake: Mistake,
}

impl BrokenRwLock {
    /// Reads of [`Mistake::ReadBesideWrite`] go to a key of their own, which writers
    /// never touch.
    fn read_key(&self, key: &LockKey, mode: RwMode) -> Result<LockKey, LockError> {
        if self.mistake == Mistake::ReadBesideWrite && mode == RwMode::Read {
            return Ok(LockKey::new(format!("{key}#reads"))?);
        }
        Ok(key.clone())
    }
}

#[async_trait]
impl DistributedRwLock for BrokenRwLock {
    fn info(&self) -> BackendInfo {
        self.inner.info()
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        mode: RwMode,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        let key = self.read_key(key, mode)?;
        self.inner.try_acquire(&key, mode, options).await
    }

    async fn acquire(
        &self,
        key: &LockKey,
        mode: RwMode,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        if self.mistake == Mistake::WriterStarved && mode == RwMode::Write {
            // No intent: readers keep coming in, and the writer only ever tries.
            let started = Instant::now();
            let deadline = options.wait().deadline_from(started);
            loop {
                if let Some(guard) = self.inner.try_acquire(key, mode, options).await? {
                    return Ok(guard);
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(LockError::Timeout {
                        backend: "broken",
                        key: key.clone(),
                        waited: started.elapsed(),
                    });
                }
                tokio::time::sleep(STARVED_WRITER_POLL).await;
            }
        }
        let key = self.read_key(key, mode)?;
        self.inner.acquire(&key, mode, options).await
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.inner.release(lease).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        self.inner.extend(lease, ttl).await
    }
}
