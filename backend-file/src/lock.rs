//! [`FileLock`]: the [`DistributedLock`] over OS file locks in one directory.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::backend::prelude::*;
use distlock_api::{
    check_ttl, BackendInfo, Capabilities, Capability, DistributedLock, ExtendOutcome, FencingToken,
    KeyStatus, Lease, LeaseMonitor, LockError, LockGuard, LockKey, LockOptions, OwnerToken,
    ReleaseOutcome,
};
use tokio::time::Instant;

use crate::config;
use crate::error::io_error;
use crate::keys;
use crate::waiter::Waiters;
use crate::{lock_file, FILE_BACKEND};

/// A client of the file backend: locks in one directory.
///
/// Cloning gives another handle on the same client (same held locks). Separate
/// [`FileLock::open`] calls give independent clients, which exclude each other like
/// separate processes do.
#[derive(Debug, Clone)]
pub struct FileLock {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    /// The open, locked file of each lease this client holds.
    held: Mutex<HashMap<OwnerToken, File>>,
    waiters: Arc<Waiters>,
}

/// Whether a lock file is free, held by someone, or absent.
enum Probe {
    Free(Option<lock_file::Record>),
    Held(Option<lock_file::Record>),
}

impl FileLock {
    /// A client for locks in `dir`, created (with parents) if missing.
    ///
    /// # Errors
    /// [`LockError::Config`] when the directory cannot be created or is not a directory.
    pub fn open(dir: impl Into<PathBuf>) -> Result<FileLock, LockError> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|e| {
            LockError::config(
                FILE_BACKEND,
                format!("cannot create lock directory {}: {e}", dir.display()),
            )
        })?;
        Ok(Self::in_dir(dir))
    }

    /// A client for a `file://` URL: `file:///ABSOLUTE/DIR`, or `file://` for
    /// [`default_dir`](crate::default_dir) (created private to the user). See
    /// [`crate::parse_url`] for the URL forms.
    ///
    /// # Errors
    /// [`LockError::Config`] for a malformed URL, a relative path, a host other than
    /// `localhost`, a default directory owned by another user, or a directory that
    /// cannot be created.
    pub async fn connect(url: &str) -> Result<FileLock, LockError> {
        match config::parse_url(url)?.dir {
            Some(dir) => Self::open(dir),
            None => config::private_default_dir().map(Self::in_dir),
        }
    }

    fn in_dir(dir: PathBuf) -> FileLock {
        FileLock {
            inner: Arc::new(Inner {
                dir,
                held: Mutex::new(HashMap::new()),
                waiters: Arc::new(Waiters::default()),
            }),
        }
    }

    /// A semaphore client on the same directory; see [`FileSemaphore`](crate::FileSemaphore).
    pub fn semaphore(&self) -> crate::FileSemaphore {
        crate::FileSemaphore::new(self.clone())
    }

    /// A read-write lock client on the same directory; see [`FileRwLock`](crate::FileRwLock).
    pub fn rw_lock(&self) -> crate::FileRwLock {
        crate::FileRwLock::new(self.clone())
    }

    /// A leader-election client on the same directory; see
    /// [`FileElection`](crate::FileElection).
    pub fn election(&self) -> crate::FileElection {
        crate::FileElection::new(self.clone())
    }

    /// The client's blocked-`flock` waiters, shared by its mutex and elections.
    pub(crate) fn waiters(&self) -> &Arc<Waiters> {
        &self.inner.waiters
    }

    /// The lock directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The lock file of `key`: `k-` and the key with bytes outside `[a-z0-9._-]` as
    /// `%xx`, then `.lock`; or `h-` and the key's SHA-256 for names past 255 bytes.
    pub fn lock_file_path(&self, key: &LockKey) -> PathBuf {
        self.inner.dir.join(keys::file_name(key))
    }

    fn held(&self) -> MutexGuard<'_, HashMap<OwnerToken, File>> {
        // Inserts and removes only: a panic elsewhere cannot leave the map torn.
        self.inner
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// One non-blocking attempt. The file work (open, lock, counter `fsync`) runs on
    /// the blocking pool; if this future is dropped meanwhile, the lock it took is
    /// dropped with the task's result.
    async fn attempt(
        &self,
        key: &LockKey,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        let requested_at = Instant::now();
        let path = self.lock_file_path(key);
        let task_path = path.clone();
        let granted = tokio::task::spawn_blocking(move || {
            let Some(file) = lock_file::open_locked(&task_path, false)? else {
                return Ok(None);
            };
            let token = lock_file::take_next_token(&file)?;
            Ok(Some((file, token)))
        })
        .await
        .map_err(|e| LockError::backend_error(FILE_BACKEND, format!("the file task failed: {e}")))?
        .map_err(|e| io_error(&path, e))?;
        Ok(granted.map(|(file, token)| self.guard(key, options, file, token, requested_at)))
    }

    fn guard(
        &self,
        key: &LockKey,
        options: &LockOptions,
        file: File,
        token: FencingToken,
        requested_at: Instant,
    ) -> LockGuard {
        let owner = OwnerToken::random();
        let lease = Lease::new(key.clone(), owner, Some(token), options.ttl(), requested_at);
        self.held().insert(owner, file);
        LockGuard::new(
            lease,
            LeaseMonitor::new(requested_at + options.ttl()),
            Arc::new(self.clone()),
            options.auto_renew(),
        )
    }

    /// Looks at a key's file without waiting, through a shared lock.
    fn probe(&self, key: &LockKey) -> Result<Probe, LockError> {
        let path = self.lock_file_path(key);
        let file = match std::fs::File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Probe::Free(None)),
            Err(e) => return Err(io_error(&path, e)),
        };
        let free = match file.try_lock_shared() {
            Ok(()) => true,
            Err(std::fs::TryLockError::WouldBlock) => false,
            Err(std::fs::TryLockError::Error(e)) => return Err(io_error(&path, e)),
        };
        // Read after locking: when free the record is stable; when held it is the
        // holder's unless the grant is still being written.
        let record = lock_file::read_record(&file).map_err(|e| io_error(&path, e))?;
        Ok(if free {
            Probe::Free(record)
        } else {
            Probe::Held(record)
        })
    }

    /// What a lease we do not hold finds: someone else's lock, or nothing.
    fn not_ours(&self, key: &LockKey) -> Result<bool, LockError> {
        Ok(matches!(self.probe(key)?, Probe::Held(_)))
    }
}

/// Unlocks `file` before it is closed. Closing alone is not enough: a child process
/// forked meanwhile by any thread of this process shares the open file until it execs,
/// and kept the lock held that long after the release returned. A failed unlock leaves
/// the close to do it.
pub(crate) fn unlock(file: &File) {
    let _ = file.unlock();
}

const NO_TTL: &str = "a file lock is held until it is released or its process exits; the TTL only sets the holder's local validity deadline";

/// Why the file semaphore and read-write lock hand out no fencing token.
const UNFENCED: &str =
    "the slot and gate files keep no counter: permits and read-write grants carry no fencing token";

/// Why the file semaphore's and read-write lock's waiters are not woken.
const POLLED: &str = "waiters retry at the options' backoff rather than block in the kernel";

/// Why the file backend reports no FIFO waiting: the kernel, not this crate, picks the
/// next holder among processes.
pub(crate) const NOT_FIFO: &str = "flock(2) promises no order among blocked processes: Linux wakes every waiter of a released file and the first to run takes it";

#[async_trait]
impl DistributedLock for FileLock {
    fn info(&self) -> BackendInfo {
        let mut capabilities = Capabilities::all_supported().with_every(|g| {
            g.ttl_expiry = Capability::Unsupported(NO_TTL);
            g.fifo = Capability::Unsupported(NOT_FIFO);
        });
        for polled in [&mut capabilities.semaphore, &mut capabilities.rw_lock] {
            polled.fencing = Capability::Unsupported(UNFENCED);
            polled.wake_on_release = Capability::Unsupported(POLLED);
        }
        BackendInfo::new(FILE_BACKEND, capabilities)
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        options.validate_for(FILE_BACKEND)?;
        options.check_order(FILE_BACKEND, Capability::Unsupported(NOT_FIFO))?;
        self.attempt(key, options).await
    }

    async fn acquire(&self, key: &LockKey, options: &LockOptions) -> Result<LockGuard, LockError> {
        options.validate_for(FILE_BACKEND)?;
        options.check_order(FILE_BACKEND, Capability::Unsupported(NOT_FIFO))?;
        let started = Instant::now();
        if let Some(guard) = self.attempt(key, options).await? {
            return Ok(guard);
        }
        let timeout = || LockError::Timeout {
            backend: FILE_BACKEND,
            key: key.clone(),
            waited: started.elapsed(),
        };
        let deadline = options.wait().deadline_from(started);
        if deadline.is_some_and(|d| d <= started) {
            return Err(timeout());
        }
        let path = self.lock_file_path(key);
        let queued = self
            .inner
            .waiters
            .wait(path.clone())
            .map_err(|e| io_error(&path, e))?;
        let received = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, queued)
                .await
                .map_err(|_| timeout())?,
            None => queued.await,
        };
        let granted = received.map_err(|_| {
            LockError::backend_error(FILE_BACKEND, "the waiting thread ended without an answer")
        })?;
        let (file, token) = granted.map_err(|e| io_error(&path, e))?;
        // The wait counts as part of the request: the lease starts at the grant.
        let guard = self.guard(key, options, file, token, Instant::now());
        // Granted after the first attempt found the file locked by another owner.
        Ok(distlock_api::backend::mark_contended(guard, true))
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        let file = self.held().remove(&lease.owner());
        if let Some(file) = file {
            unlock(&file);
            // `Released` says nobody else held the lock meanwhile: only true if our
            // locked file is still the one at the path (it may have been deleted or
            // replaced, and another process may hold the new one).
            let path = self.lock_file_path(lease.key());
            if lock_file::is_current(&file, &path).map_err(|e| io_error(&path, e))? {
                return Ok(ReleaseOutcome::Released);
            }
        }
        Ok(if self.not_ours(lease.key())? {
            ReleaseOutcome::HeldByOther
        } else {
            ReleaseOutcome::Expired
        })
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        check_ttl(ttl).map_err(|e| LockError::invalid_options(FILE_BACKEND, e))?;
        let requested_at = Instant::now();
        let path = self.lock_file_path(lease.key());
        let mut held = self.held();
        if let Some(file) = held.get(&lease.owner()) {
            if !lock_file::is_current(file, &path).map_err(|e| io_error(&path, e))? {
                // The lock file was deleted or replaced: our lock guards nothing now,
                // and another process may already hold the new file.
                held.remove(&lease.owner());
                return Ok(ExtendOutcome::Expired);
            }
            let valid_until = requested_at
                .checked_add(ttl)
                .ok_or_else(|| LockError::config(FILE_BACKEND, "ttl overflows the clock"))?;
            return Ok(ExtendOutcome::Extended { valid_until });
        }
        drop(held);
        Ok(if self.not_ours(lease.key())? {
            ExtendOutcome::HeldByOther
        } else {
            ExtendOutcome::Expired
        })
    }

    async fn inspect(&self, key: &LockKey) -> Result<KeyStatus, LockError> {
        Ok(match self.probe(key)? {
            Probe::Free(record) => KeyStatus::free().with_fencing_token(record.map(|r| r.token)),
            Probe::Held(record) => KeyStatus::held()
                .with_fencing_token(record.map(|r| r.token))
                .with_holder(record.map(|r| format!("process {}", r.pid))),
        })
    }
}
