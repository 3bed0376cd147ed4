//! The file backend's [`Engine`]: each claim goes to its primitive's module, and the
//! guarantees of every primitive are stated once, in [`capabilities`].

use std::time::Duration;

use async_trait::async_trait;
use distlock_api::backend::{unanswered_message, Claim, Engine, Grant, Request};
use distlock_api::{
    BackendInfo, Capabilities, Capability, ExtendOutcome, KeyStatus, Leader, Lease, LockError,
    LockKey, Primitive, ReleaseOutcome, RwStatus, SemaphoreStatus,
};

use crate::{election, mutex, rw, semaphore, FileLock, FILE_BACKEND};

const NO_TTL: &str = "a file lock is held until it is released or its process exits; the TTL only sets the holder's local validity deadline";

/// Why no file lease outlives its client: the lock is the open file.
const DIES_WITH_CLIENT: &str = "a file lock is the client's open file: the kernel frees it when the client closes it or its process exits, whatever the TTL";

/// Why the file semaphore and read-write lock hand out no fencing token.
const UNFENCED: &str =
    "the slot and gate files keep no counter: permits and read-write grants carry no fencing token";

/// Why the file semaphore's and read-write lock's waiters are not woken.
const POLLED: &str = "waiters retry at the options' backoff rather than block in the kernel";

/// Why the file backend reports no FIFO waiting: the kernel, not this crate, picks the
/// next holder among processes.
const NOT_FIFO: &str = "flock(2) promises no order among blocked processes: Linux wakes every waiter of a released file and the first to run takes it";

/// What the file backend promises, per primitive:
/// - every primitive: no TTL expiry and no outliving its client (a lock lives exactly
///   as long as its open file), no FIFO (the kernel picks among blocked processes),
///   extend supported (it pushes the local deadline out, after checking the mutex's
///   and election's file is still the one at its path);
/// - the mutex and election: fencing tokens (terms) from the counter in the lock or
///   election file, and waiters blocked in the kernel, woken on release;
/// - the semaphore and read-write lock: no fencing token (their files keep no
///   counter), and waiters that poll at the options' backoff.
fn capabilities() -> Capabilities {
    let mut capabilities = Capabilities::all_supported().with_every(|g| {
        g.ttl_expiry = Capability::Unsupported(NO_TTL);
        g.outlives_client = Capability::Unsupported(DIES_WITH_CLIENT);
        g.fifo = Capability::Unsupported(NOT_FIFO);
    });
    for polled in [&mut capabilities.semaphore, &mut capabilities.rw_lock] {
        polled.fencing = Capability::Unsupported(UNFENCED);
        polled.wake_on_release = Capability::Unsupported(POLLED);
    }
    capabilities
}

#[async_trait]
impl Engine for FileLock {
    fn info(&self) -> BackendInfo {
        BackendInfo::new(FILE_BACKEND, capabilities()).with_unreleased_lock_ends(
            "it is freed when its process exits (the kernel drops its file lock)",
        )
    }

    async fn acquire(&self, request: &Request<'_>) -> Result<Option<Grant>, LockError> {
        let dir = self.dir();
        match request.claim {
            Claim::Mutex => self.mutexes().acquire(dir, self.waiters(), request).await,
            Claim::Permit { max } => self.semaphores().acquire(dir, request, max).await,
            Claim::Rw(mode) => self.rw_locks().acquire(dir, request, mode).await,
            Claim::Lead(candidate) => {
                let elections = self.elections();
                elections
                    .acquire(dir, self.waiters(), request, candidate)
                    .await
            }
            // A claim newer than this backend: refused, as a primitive not offered is.
            _ => Err(LockError::Unsupported {
                backend: FILE_BACKEND,
                operation: request.claim.primitive().as_str(),
                reason: "this claim is not known to the file backend",
            }),
        }
    }

    async fn release(
        &self,
        primitive: Primitive,
        lease: &Lease,
    ) -> Result<ReleaseOutcome, LockError> {
        let dir = self.dir();
        match primitive {
            Primitive::Mutex => self.mutexes().release(dir, lease),
            Primitive::Semaphore => Ok(self.semaphores().release(lease)),
            Primitive::RwLock => Ok(self.rw_locks().release(lease)),
            Primitive::Election => self.elections().release(dir, lease),
        }
    }

    async fn extend(
        &self,
        primitive: Primitive,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        let dir = self.dir();
        match primitive {
            Primitive::Mutex => self.mutexes().extend(dir, lease, ttl),
            Primitive::Semaphore => self.semaphores().extend(lease, ttl),
            Primitive::RwLock => self.rw_locks().extend(lease, ttl),
            Primitive::Election => self.elections().extend(dir, lease, ttl),
        }
    }

    /// Probes the lock file with a shared lock for a moment, during which an exclusive
    /// try fails.
    async fn inspect(&self, key: &LockKey) -> Result<KeyStatus, LockError> {
        mutex::inspect(self.dir(), key)
    }

    async fn inspect_semaphore(&self, key: &LockKey) -> Result<SemaphoreStatus, LockError> {
        semaphore::inspect(self.dir(), key)
    }

    /// `flock` cannot list readers, so only a writer is counted as a holder.
    async fn inspect_rw(&self, key: &LockKey) -> Result<RwStatus, LockError> {
        rw::inspect(self.dir(), key)
    }

    /// Read from the leader file while its leader holds it locked, so a dead leader's
    /// record never reads as leader. `wait_change` keeps the polling default: `flock`
    /// tells nobody of a change.
    async fn leader(&self, name: &LockKey) -> Result<Option<Leader>, LockError> {
        election::leader(self.dir(), name).await
    }

    /// Names the lock directory: only slow file work (an `fsync` on a loaded disk, a
    /// hung mount) leaves a wait unanswered.
    fn unanswered(&self, wait: Duration) -> LockError {
        let message = unanswered_message(wait);
        LockError::connection(FILE_BACKEND, format!("{}: {message}", self.dir().display()))
    }
}
