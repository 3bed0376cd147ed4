//! What the semaphore and read-write lock clients share: the files each lease keeps
//! locked, and the polling wait.
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
use distlock_api::{
    check_ttl, ExtendOutcome, Lease, LeaseMonitor, LockError, LockKey, LockOptions, OwnerToken,
    ReleaseOutcome,
};
use tokio::time::Instant;

use crate::FILE_BACKEND;

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
    /// lease of `key` for the options' TTL from `requested_at` (no fencing token: the
    /// file backend gives none for these primitives) and its monitor.
    pub(crate) fn grant(
        &self,
        key: &LockKey,
        files: Vec<File>,
        options: &LockOptions,
        requested_at: Instant,
    ) -> (Lease, LeaseMonitor) {
        let owner = OwnerToken::random();
        self.files().insert(owner, files);
        let lease = Lease::new(key.clone(), owner, None, options.ttl(), requested_at);
        (lease, LeaseMonitor::new(requested_at + options.ttl()))
    }

    /// Closes `owner`'s files: `Released` if it held them, else `Expired` (released
    /// before, or never granted by this client).
    pub(crate) fn release(&self, owner: OwnerToken) -> ReleaseOutcome {
        match self.files().remove(&owner) {
            Some(files) => {
                files.iter().for_each(crate::lock::unlock);
                ReleaseOutcome::Released
            }
            None => ReleaseOutcome::Expired,
        }
    }

    /// A held lease lasts `ttl` from now (file locks have no server-side expiry).
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] for a TTL out of bounds.
    pub(crate) fn extend(
        &self,
        owner: OwnerToken,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError> {
        check_ttl(ttl).map_err(|e| LockError::invalid_options(FILE_BACKEND, e))?;
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

/// Calls `attempt` until it grants, pausing at the options' backoff, until the wait
/// policy runs out. Returns the grant and whether an attempt found the key held.
/// Cancel-safe as long as `attempt` keeps what it locked in values it owns.
///
/// # Errors
/// [`LockError::Timeout`] when the wait runs out, or whatever `attempt` returns.
pub(crate) async fn poll_until<T>(
    key: &LockKey,
    options: &LockOptions,
    mut attempt: impl FnMut() -> Result<Option<T>, LockError>,
) -> Result<(T, bool), LockError> {
    let started = Instant::now();
    let deadline = options.wait().deadline_from(started);
    let mut delays = options.backoff().delays();
    let mut contended = false;
    loop {
        if let Some(granted) = attempt()? {
            return Ok((granted, contended));
        }
        contended = true;
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Err(LockError::Timeout {
                backend: FILE_BACKEND,
                key: key.clone(),
                waited: started.elapsed(),
            });
        }
        let wake_at = now + delays.next_delay();
        tokio::time::sleep_until(deadline.map_or(wake_at, |d| d.min(wake_at))).await;
    }
}
