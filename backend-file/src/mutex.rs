//! The mutex: per key, one lock file locked exclusive by its holder, whose record
//! counts the fencing tokens (see the crate's protocol notes).

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use distlock_api::backend::prelude::*;
use distlock_api::backend::{Grant, Request};
use distlock_api::{
    ExtendOutcome, FencingToken, KeyStatus, Lease, LeaseMonitor, LockError, LockKey, OwnerToken,
    ReleaseOutcome,
};
use tokio::time::Instant;

use crate::error::{blocking, io_error};
use crate::waiter::Waiters;
use crate::{keys, lock_file, FILE_BACKEND};

/// The lock file of `key` in `dir`.
pub(crate) fn lock_path(dir: &Path, key: &LockKey) -> PathBuf {
    dir.join(keys::file_name(key))
}

/// The open, locked file of each mutex lease one client holds.
#[derive(Debug, Default)]
pub(crate) struct Mutexes {
    held: Mutex<HashMap<OwnerToken, File>>,
}

/// Whether a lock file is free or held by someone, with its record.
enum Probe {
    Free(Option<lock_file::Record>),
    Held(Option<lock_file::Record>),
}

impl Mutexes {
    fn held(&self) -> MutexGuard<'_, HashMap<OwnerToken, File>> {
        // Inserts and removes only: a panic elsewhere cannot leave the map torn.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The mutex of `request.key` in `dir`: a non-blocking try, then, if the request
    /// waits, a place in `waiters`' thread blocked in `flock` until the deadline.
    /// `None` when the key is still held then. A dropped future leaves nothing locked:
    /// a lock taken meanwhile closes with the task's result or the waiter's channel.
    pub(crate) async fn acquire(
        &self,
        dir: &Path,
        waiters: &Arc<Waiters>,
        request: &Request<'_>,
    ) -> Result<Option<Grant>, LockError> {
        let requested_at = Instant::now();
        let path = lock_path(dir, request.key);
        if let Some((file, token)) = try_take(path.clone()).await? {
            return Ok(Some(self.grant(request, file, token, requested_at)));
        }
        request.saw_held();
        if !request.waits() || request.deadline_passed() {
            return Ok(None);
        }
        let Some((file, token)) = waiters.take(&path, request.deadline).await? else {
            return Ok(None);
        };
        // The wait counts as part of the request: the lease starts at the grant.
        Ok(Some(self.grant(request, file, token, Instant::now())))
    }

    fn grant(
        &self,
        request: &Request<'_>,
        file: File,
        token: FencingToken,
        requested_at: Instant,
    ) -> Grant {
        let (owner, ttl) = (OwnerToken::random(), request.options.ttl());
        let lease = Lease::new(request.key.clone(), owner, Some(token), ttl, requested_at);
        self.held().insert(owner, file);
        Grant::new(lease, LeaseMonitor::new(requested_at + ttl))
    }

    /// Unlocks `lease`'s file: `Released` only if it is still the file at its path.
    pub(crate) fn release(&self, dir: &Path, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        let path = lock_path(dir, lease.key());
        let file = self.held().remove(&lease.owner());
        if let Some(file) = file {
            lock_file::unlock(&file);
            // `Released` says nobody else held the lock meanwhile: only true if our
            // locked file is still the one at the path (it may have been deleted or
            // replaced, and another process may hold the new one).
            if lock_file::is_current(&file, &path).map_err(|e| io_error(&path, e))? {
                return Ok(ReleaseOutcome::Released);
            }
        }
        Ok(if held_by_other(&path)? {
            ReleaseOutcome::HeldByOther
        } else {
            ReleaseOutcome::Expired
        })
    }

    /// Pushes a held lease's local deadline to `ttl` from now, once its file is checked
    /// to be still the one at its path.
    pub(crate) fn extend(
        &self,
        dir: &Path,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        let requested_at = Instant::now();
        let path = lock_path(dir, lease.key());
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
        Ok(if held_by_other(&path)? {
            ExtendOutcome::HeldByOther
        } else {
            ExtendOutcome::Expired
        })
    }
}

/// One non-blocking attempt at `path`'s lock and its next token. The file work (open,
/// lock, counter `fsync`) runs on the blocking pool.
async fn try_take(path: PathBuf) -> Result<Option<(File, FencingToken)>, LockError> {
    blocking(move || {
        let taken = || {
            let Some(file) = lock_file::open_locked(&path, false)? else {
                return Ok(None);
            };
            let token = lock_file::take_next_token(&file)?;
            Ok(Some((file, token)))
        };
        taken().map_err(|e| io_error(&path, e))
    })
    .await
}

/// The mutex `key` in `dir` as it is now: held or free, its last token, and the
/// holding process.
pub(crate) fn inspect(dir: &Path, key: &LockKey) -> Result<KeyStatus, LockError> {
    Ok(match probe(&lock_path(dir, key))? {
        Probe::Free(record) => KeyStatus::free().with_fencing_token(record.map(|r| r.token)),
        Probe::Held(record) => KeyStatus::held()
            .with_fencing_token(record.map(|r| r.token))
            .with_holder(record.map(|r| format!("process {}", r.pid))),
    })
}

/// Looks at a lock file without waiting, through a shared lock.
fn probe(path: &Path) -> Result<Probe, LockError> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Probe::Free(None)),
        Err(e) => return Err(io_error(path, e)),
    };
    let free = match file.try_lock_shared() {
        Ok(()) => true,
        Err(std::fs::TryLockError::WouldBlock) => false,
        Err(std::fs::TryLockError::Error(e)) => return Err(io_error(path, e)),
    };
    // Read after locking: when free the record is stable; when held it is the
    // holder's unless the grant is still being written.
    let record = lock_file::read_record(&file).map_err(|e| io_error(path, e))?;
    Ok(if free {
        Probe::Free(record)
    } else {
        Probe::Held(record)
    })
}

/// What a lease we do not hold finds: someone else's lock, or nothing.
fn held_by_other(path: &Path) -> Result<bool, LockError> {
    Ok(matches!(probe(path)?, Probe::Held(_)))
}
