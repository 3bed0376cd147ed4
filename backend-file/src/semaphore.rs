//! [`FileSemaphore`]: the [`DistributedSemaphore`] over slot files in one directory.
//!
//! Protocol, per key: a count file `….permits` holds the permit count as text, and
//! permit `i` is an exclusive `flock(2)` on the slot file `….permit-i`. A holder keeps
//! a shared lock on the count file beside its slot's exclusive lock; the count is only
//! written under the count file's exclusive lock, which exists only while nobody holds
//! a permit. So every holder has checked the same count, a different one is refused
//! with [`LockError::PermitMismatch`], and once the last holder leaves the next caller
//! may set a new count.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::backend::check_permit_request;
use distlock_api::backend::prelude::*;
use distlock_api::{
    BackendInfo, Capability, DistributedLock, DistributedSemaphore, ExtendOutcome, HolderStatus,
    Lease, LockError, LockGuard, LockKey, LockOptions, PermitMismatch, ReleaseOutcome,
    SemaphoreStatus, MAX_PERMITS,
};
use tokio::time::Instant;

use crate::error::io_error;
use crate::held::{poll_until, try_lock_shared, HeldFiles};
use crate::{keys, lock_file, FileLock, FILE_BACKEND};

/// How often one attempt re-reads a count file that changed under it before giving
/// up for this poll.
const COUNT_PASSES: usize = 3;

/// A semaphore client of the file backend, made by [`FileLock::semaphore`]: permits as
/// slot files beside the mutex lock files. Permits carry no fencing token.
///
/// Waiting polls at the options' backoff. Like the mutex, a permit is held until it is
/// released or its process exits (no TTL expiry). Cloning gives another handle on the
/// same client.
#[derive(Debug, Clone)]
pub struct FileSemaphore {
    locks: FileLock,
    held: Arc<HeldFiles>,
}

/// One attempt's answer.
enum Attempt {
    Granted(Vec<File>),
    Busy,
    Mismatch(u32),
}

impl FileSemaphore {
    pub(crate) fn new(locks: FileLock) -> Self {
        FileSemaphore {
            locks,
            held: Arc::default(),
        }
    }

    fn path(&self, key: &LockKey, suffix: &str) -> PathBuf {
        self.locks.dir().join(keys::derived_name(key, suffix))
    }

    /// One non-blocking attempt at a permit of `key` out of `max`.
    fn attempt(&self, key: &LockKey, max: u32) -> Result<Attempt, LockError> {
        let count_path = self.path(key, ".permits");
        let count_file = lock_file::open(&count_path).map_err(|e| io_error(&count_path, e))?;
        let io = |e| io_error(&count_path, e);
        for _ in 0..COUNT_PASSES {
            if !try_lock_shared(&count_file).map_err(io)? {
                // Another caller is writing the count: try again at the next poll.
                return Ok(Attempt::Busy);
            }
            let in_use = read_count(&count_file).map_err(io)?;
            if in_use == Some(max) {
                return self.take_slot(key, max, count_file);
            }
            // Another count (or none yet): ours may be set only if nobody holds a permit.
            count_file.unlock().map_err(io)?;
            if lock_file::try_lock(&count_file).map_err(io)? {
                write_count(&count_file, max).map_err(io)?;
                count_file.unlock().map_err(io)?;
                continue;
            }
            if let Some(in_use) = in_use {
                return Ok(Attempt::Mismatch(in_use));
            }
        }
        Ok(Attempt::Busy)
    }

    /// Takes the first free slot, keeping `count_file`'s shared lock beside it.
    fn take_slot(&self, key: &LockKey, max: u32, count_file: File) -> Result<Attempt, LockError> {
        for slot in 0..max {
            let path = self.path(key, &format!(".permit-{slot}"));
            if let Some(file) =
                lock_file::open_locked(&path, false).map_err(|e| io_error(&path, e))?
            {
                return Ok(Attempt::Granted(vec![count_file, file]));
            }
        }
        Ok(Attempt::Busy)
    }

    /// Which slots of `key` are held now, each probed with a shared lock for a moment
    /// (as the mutex's `inspect` does: an attempt at that very slot meanwhile finds it
    /// busy and tries the next), and the count the holders use.
    fn probe(&self, key: &LockKey) -> Result<SemaphoreStatus, LockError> {
        let count_path = self.path(key, ".permits");
        let count = match File::open(&count_path) {
            Ok(file) => read_count(&file).map_err(|e| io_error(&count_path, e))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_error(&count_path, e)),
        };
        let mut holders = Vec::new();
        for slot in 0..count.unwrap_or(0).min(MAX_PERMITS) {
            let path = self.path(key, &format!(".permit-{slot}"));
            let file = match File::open(&path) {
                Ok(file) => file,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_error(&path, e)),
            };
            // The probe's lock, if taken, goes with `file` at the end of the iteration.
            if !try_lock_shared(&file).map_err(|e| io_error(&path, e))? {
                holders.push(HolderStatus::new().with_holder(Some(format!("permit slot {slot}"))));
            }
        }
        let permits = count.filter(|_| !holders.is_empty());
        Ok(SemaphoreStatus::new(permits, holders))
    }

    fn checked(max_permits: u32, options: &LockOptions) -> Result<(), LockError> {
        check_permit_request(
            FILE_BACKEND,
            max_permits,
            options,
            Capability::Unsupported(crate::lock::NOT_FIFO),
        )
    }

    /// Turns an attempt's answer into a guard, a refusal or the mismatch error.
    fn grant(
        &self,
        key: &LockKey,
        max: u32,
        options: &LockOptions,
        requested_at: Instant,
    ) -> Result<Option<LockGuard>, LockError> {
        match self.attempt(key, max)? {
            Attempt::Busy => Ok(None),
            Attempt::Mismatch(in_use) => Err(LockError::PermitMismatch {
                backend: FILE_BACKEND,
                source: PermitMismatch::new(key.clone(), max, in_use),
            }),
            Attempt::Granted(files) => {
                let (lease, monitor) = self.held.grant(key, files, options, requested_at);
                let backend: Arc<dyn DistributedSemaphore> = Arc::new(self.clone());
                Ok(Some(LockGuard::for_permit(
                    lease,
                    monitor,
                    backend,
                    options.auto_renew(),
                )))
            }
        }
    }
}

fn read_count(file: &File) -> io::Result<Option<u32>> {
    let mut buf = [0u8; 16];
    let len = file.read_at(&mut buf, 0)?;
    Ok(std::str::from_utf8(&buf[..len])
        .ok()
        .and_then(|text| text.trim().parse().ok()))
}

fn write_count(file: &File, max: u32) -> io::Result<()> {
    file.set_len(0)?;
    file.write_all_at(format!("{max}\n").as_bytes(), 0)
}

#[async_trait]
impl DistributedSemaphore for FileSemaphore {
    fn info(&self) -> BackendInfo {
        DistributedLock::info(&self.locks)
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        max_permits: u32,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        Self::checked(max_permits, options)?;
        self.grant(key, max_permits, options, Instant::now())
    }

    async fn acquire(
        &self,
        key: &LockKey,
        max_permits: u32,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        Self::checked(max_permits, options)?;
        let (guard, contended) = poll_until(key, options, || {
            self.grant(key, max_permits, options, Instant::now())
        })
        .await?;
        Ok(distlock_api::backend::mark_contended(guard, contended))
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        Ok(self.held.release(lease.owner()))
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        self.held.extend(lease.owner(), ttl)
    }

    async fn inspect(&self, key: &LockKey) -> Result<SemaphoreStatus, LockError> {
        self.probe(key)
    }
}
