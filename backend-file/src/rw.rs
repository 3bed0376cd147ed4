//! [`FileRwLock`]: the [`DistributedRwLock`] over `flock(2)` shared and exclusive locks,
//! with a writer gate so readers cannot starve a writer.
//!
//! Protocol, per key: the main file `….rw` is locked shared by readers and exclusive by
//! the writer; the gate file `….rw-gate` orders them. A reader takes the gate shared,
//! then the main file shared, then lets the gate go. A writer takes the gate exclusive
//! and keeps it while it waits for the main file and while it holds it. A plain `flock`
//! read-write lock lets a stream of overlapping readers keep the main file shared
//! forever; with the gate, new readers stop at it as soon as a writer waits, and the
//! writer is granted once the readers already inside leave.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::backend::prelude::*;
use distlock_api::{
    BackendInfo, Capability, DistributedLock, DistributedRwLock, ExtendOutcome, HolderStatus,
    Lease, LockError, LockGuard, LockKey, LockOptions, ReleaseOutcome, RwMode, RwStatus,
};
use tokio::time::Instant;

use crate::error::io_error;
use crate::held::{poll_until, try_lock_shared, HeldFiles};
use crate::{keys, lock_file, FileLock, FILE_BACKEND};

/// A read-write lock client of the file backend, made by [`FileLock::rw_lock`], with
/// writer preference. Grants carry no fencing token.
///
/// Waiting polls at the options' backoff; a waiting writer holds the gate, so readers
/// that come after it wait. Like the mutex, a grant is held until it is released or its
/// process exits (no TTL expiry). Cloning gives another handle on the same client.
#[derive(Debug, Clone)]
pub struct FileRwLock {
    locks: FileLock,
    held: Arc<HeldFiles>,
}

impl FileRwLock {
    pub(crate) fn new(locks: FileLock) -> Self {
        FileRwLock {
            locks,
            held: Arc::default(),
        }
    }

    fn path(&self, key: &LockKey, suffix: &str) -> PathBuf {
        self.locks.dir().join(keys::derived_name(key, suffix))
    }

    /// One non-blocking read attempt: the main file locked shared.
    fn try_read(&self, key: &LockKey) -> Result<Option<Vec<File>>, LockError> {
        let gate_path = self.path(key, ".rw-gate");
        let gate = lock_file::open(&gate_path).map_err(|e| io_error(&gate_path, e))?;
        if !try_lock_shared(&gate).map_err(|e| io_error(&gate_path, e))? {
            return Ok(None);
        }
        let main_path = self.path(key, ".rw");
        let main = lock_file::open(&main_path).map_err(|e| io_error(&main_path, e))?;
        let granted = try_lock_shared(&main).map_err(|e| io_error(&main_path, e))?;
        // The gate closes with `gate` here: a reader holds only the main file.
        Ok(granted.then(|| vec![main]))
    }

    /// One non-blocking write attempt. `gate` keeps the gate locked between attempts
    /// of one acquire (the writer's intent); dropping it, as a dropped acquire future
    /// does, lets readers in again.
    fn try_write(
        &self,
        key: &LockKey,
        gate: &mut Option<File>,
    ) -> Result<Option<Vec<File>>, LockError> {
        if gate.is_none() {
            let gate_path = self.path(key, ".rw-gate");
            *gate =
                lock_file::open_locked(&gate_path, false).map_err(|e| io_error(&gate_path, e))?;
        }
        if gate.is_none() {
            return Ok(None);
        }
        let main_path = self.path(key, ".rw");
        let Some(main) =
            lock_file::open_locked(&main_path, false).map_err(|e| io_error(&main_path, e))?
        else {
            return Ok(None);
        };
        Ok(gate.take().map(|gate| vec![gate, main]))
    }

    fn guard(
        &self,
        key: &LockKey,
        options: &LockOptions,
        files: Vec<File>,
        requested_at: Instant,
    ) -> LockGuard {
        let (lease, monitor) = self.held.grant(key, files, options, requested_at);
        let backend: Arc<dyn DistributedRwLock> = Arc::new(self.clone());
        LockGuard::for_rw(lease, monitor, backend, options.auto_renew())
    }

    fn checked(options: &LockOptions) -> Result<(), LockError> {
        options.validate_for(FILE_BACKEND)?;
        options.check_order(FILE_BACKEND, Capability::Unsupported(crate::lock::NOT_FIFO))
    }
}

#[async_trait]
impl DistributedRwLock for FileRwLock {
    fn info(&self) -> BackendInfo {
        DistributedLock::info(&self.locks)
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        mode: RwMode,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        Self::checked(options)?;
        let requested_at = Instant::now();
        let files = match mode {
            RwMode::Read => self.try_read(key)?,
            RwMode::Write => self.try_write(key, &mut None)?,
        };
        Ok(files.map(|files| self.guard(key, options, files, requested_at)))
    }

    async fn acquire(
        &self,
        key: &LockKey,
        mode: RwMode,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        Self::checked(options)?;
        let mut gate = None;
        let (guard, contended) = poll_until(key, options, || {
            let requested_at = Instant::now();
            let files = match mode {
                RwMode::Read => self.try_read(key)?,
                RwMode::Write => self.try_write(key, &mut gate)?,
            };
            Ok(files.map(|files| self.guard(key, options, files, requested_at)))
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

    /// Probes the main file (shared, then exclusive, each for a moment: a reader
    /// attempting meanwhile finds the key busy and retries at its backoff) and the
    /// gate (shared). `flock` cannot list readers, so only a writer is named.
    async fn inspect(&self, key: &LockKey) -> Result<RwStatus, LockError> {
        let main_path = self.path(key, ".rw");
        let io = |e| io_error(&main_path, e);
        let main = match File::open(&main_path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(RwStatus::new(None, Some(Vec::new())).with_writer_waiting(Some(false)))
            }
            Err(e) => return Err(io(e)),
        };
        if !try_lock_shared(&main).map_err(io)? {
            return Ok(RwStatus::new(
                Some(RwMode::Write),
                Some(vec![HolderStatus::new()]),
            ));
        }
        main.unlock().map_err(io)?;
        let free = lock_file::try_lock(&main).map_err(io)?;
        drop(main);
        let gate_path = self.path(key, ".rw-gate");
        let writer_waiting = match File::open(&gate_path) {
            Ok(gate) => !try_lock_shared(&gate).map_err(|e| io_error(&gate_path, e))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(io_error(&gate_path, e)),
        };
        let status = match free {
            true => RwStatus::new(None, Some(Vec::new())),
            false => RwStatus::new(Some(RwMode::Read), None),
        };
        Ok(status.with_writer_waiting(Some(writer_waiting)))
    }
}
