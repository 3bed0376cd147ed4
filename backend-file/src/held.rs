//! What the semaphore and read-write lock share: the files each lease keeps locked,
//! and the polling wait.
//!
//! Both take several locks per grant (a permit and the count file; a gate and the
//! main file), so they cannot hand a blocked `flock(2)` to a waiting thread as the
//! mutex does: they poll with non-blocking locks instead, at the options' backoff.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use distlock_api::backend::prelude::*;
use distlock_api::backend::{Grant, Request};
use distlock_api::{
    ExtendOutcome, Lease, LeaseMonitor, LockError, LockKey, OwnerToken, ReleaseOutcome,
};
use tokio::time::Instant;

use crate::{lock_file, FILE_BACKEND};

/// The locked files of each lease a client holds; closing them unlocks.
#[derive(Debug, Default)]
pub(crate) struct HeldFiles {
    files: Mutex<HashMap<OwnerToken, Vec<File>>>,
}

impl HeldFiles {
    fn files(&self) -> MutexGuard<'_, HashMap<OwnerToken, Vec<File>>> {
        // Inserts and removes only: a panic elsewhere cannot leave the map torn.
        self.files.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `files` locked for a new owner until release, and describes the grant: a
    /// lease of `key` for `ttl` from `requested_at` (no fencing token: the file backend
    /// gives none for these primitives) and its monitor.
    pub(crate) fn grant(
        &self,
        key: &LockKey,
        files: Vec<File>,
        ttl: Duration,
        requested_at: Instant,
    ) -> Grant {
        let owner = OwnerToken::random();
        self.files().insert(owner, files);
        let lease = Lease::new(key.clone(), owner, None, ttl, requested_at);
        Grant::new(lease, LeaseMonitor::new(requested_at + ttl))
    }

    /// Closes `owner`'s files: `Released` if it held them, else `Expired` (released
    /// before, or never granted by this client).
    pub(crate) fn release(&self, owner: OwnerToken) -> ReleaseOutcome {
        match self.files().remove(&owner) {
            Some(files) => {
                files.iter().for_each(lock_file::unlock);
                ReleaseOutcome::Released
            }
            None => ReleaseOutcome::Expired,
        }
    }

    /// A held lease lasts `ttl` from now (file locks have no server-side expiry).
    ///
    /// # Errors
    /// [`LockError::Config`] for a TTL past the clock's range.
    pub(crate) fn extend(
        &self,
        owner: OwnerToken,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        let requested_at = Instant::now();
        if !self.files().contains_key(&owner) {
            return Ok(ExtendOutcome::Expired);
        }
        let valid_until = requested_at
            .checked_add(ttl)
            .ok_or_else(|| LockError::config(FILE_BACKEND, "ttl overflows the clock"))?;
        Ok(ExtendOutcome::Extended { valid_until })
    }
}

/// Takes `file`'s shared lock without waiting: whether it was free of exclusive holders.
pub(crate) fn try_lock_shared(file: &File) -> io::Result<bool> {
    match file.try_lock_shared() {
        Ok(()) => Ok(true),
        Err(std::fs::TryLockError::WouldBlock) => Ok(false),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

/// Calls `attempt` until it grants, pausing at the options' backoff, while `request`'s
/// deadline allows: the grant, or `None` when the last attempt, at the deadline (at
/// once for a try), found the key held. Notes each refusal on `request`. Cancel-safe
/// as long as `attempt` keeps what it locked in values it owns.
///
/// # Errors
/// Whatever `attempt` returns.
pub(crate) async fn poll<T>(
    request: &Request<'_>,
    mut attempt: impl FnMut() -> Result<Option<T>, LockError>,
) -> Result<Option<T>, LockError> {
    let mut delays = request.options.backoff().delays();
    loop {
        if let Some(granted) = attempt()? {
            return Ok(Some(granted));
        }
        request.saw_held();
        if !request.waits() || request.deadline_passed() {
            return Ok(None);
        }
        let wake_at = Instant::now() + delays.next_delay();
        tokio::time::sleep_until(request.deadline.map_or(wake_at, |d| d.min(wake_at))).await;
    }
}
