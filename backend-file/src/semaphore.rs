//! The semaphore: permits as slot files in the lock directory. Permits carry no
//! fencing token; waiting polls at the options' backoff; like the mutex, a permit is
//! held until it is released or its process exits (no TTL expiry).
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
use std::path::{Path, PathBuf};
use std::time::Duration;

use distlock_api::backend::{Grant, Request};
use distlock_api::{
    ExtendOutcome, HolderStatus, Lease, LockError, LockKey, PermitMismatch, ReleaseOutcome,
    SemaphoreStatus, MAX_PERMITS,
};
use tokio::time::Instant;

use crate::error::io_error;
use crate::held::{poll, try_lock_shared, HeldFiles};
use crate::{keys, lock_file, FILE_BACKEND};

/// How often one attempt re-reads a count file that changed under it before giving
/// up for this poll.
const COUNT_PASSES: usize = 3;

/// The permits one client holds, across keys.
#[derive(Debug, Default)]
pub(crate) struct Semaphores {
    held: HeldFiles,
}

/// One attempt's answer.
enum Attempt {
    Granted(Vec<File>),
    Busy,
    Mismatch(u32),
}

fn path(dir: &Path, key: &LockKey, suffix: &str) -> PathBuf {
    dir.join(keys::derived_name(key, suffix))
}

impl Semaphores {
    /// A permit of `request.key` out of `max`, polling while the request's deadline
    /// allows; `None` when none is free then.
    ///
    /// # Errors
    /// [`LockError::PermitMismatch`] when the holders use another count, and
    /// [`LockError::Backend`] for file-system errors.
    pub(crate) async fn acquire(
        &self,
        dir: &Path,
        request: &Request<'_>,
        max: u32,
    ) -> Result<Option<Grant>, LockError> {
        let key = request.key;
        poll(request, || {
            let requested_at = Instant::now();
            match attempt(dir, key, max)? {
                Attempt::Busy => Ok(None),
                Attempt::Mismatch(in_use) => Err(LockError::PermitMismatch {
                    backend: FILE_BACKEND,
                    source: PermitMismatch::new(key.clone(), max, in_use),
                }),
                Attempt::Granted(files) => {
                    let ttl = request.options.ttl();
                    Ok(Some(self.held.grant(key, files, ttl, requested_at)))
                }
            }
        })
        .await
    }

    /// Closes `lease`'s slot and count files.
    pub(crate) fn release(&self, lease: &Lease) -> ReleaseOutcome {
        self.held.release(lease.owner())
    }

    /// Pushes a held permit's local deadline to `ttl` from now.
    pub(crate) fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        self.held.extend(lease.owner(), ttl)
    }
}

/// One non-blocking attempt at a permit of `key` out of `max`.
fn attempt(dir: &Path, key: &LockKey, max: u32) -> Result<Attempt, LockError> {
    let count_path = path(dir, key, ".permits");
    let count_file = lock_file::open(&count_path).map_err(|e| io_error(&count_path, e))?;
    let io = |e| io_error(&count_path, e);
    for _ in 0..COUNT_PASSES {
        if !try_lock_shared(&count_file).map_err(io)? {
            // Another caller is writing the count: try again at the next poll.
            return Ok(Attempt::Busy);
        }
        let in_use = read_count(&count_file).map_err(io)?;
        if in_use == Some(max) {
            return take_slot(dir, key, max, count_file);
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
fn take_slot(dir: &Path, key: &LockKey, max: u32, count_file: File) -> Result<Attempt, LockError> {
    for slot in 0..max {
        let path = path(dir, key, &format!(".permit-{slot}"));
        if let Some(file) = lock_file::open_locked(&path, false).map_err(|e| io_error(&path, e))? {
            return Ok(Attempt::Granted(vec![count_file, file]));
        }
    }
    Ok(Attempt::Busy)
}

/// The semaphore `key` in `dir` as it is now: which slots are held, each probed with
/// a shared lock for a moment (as the mutex's `inspect` does: an attempt at that very
/// slot meanwhile finds it busy and tries the next), and the count the holders use.
pub(crate) fn inspect(dir: &Path, key: &LockKey) -> Result<SemaphoreStatus, LockError> {
    let count_path = path(dir, key, ".permits");
    let count = match File::open(&count_path) {
        Ok(file) => read_count(&file).map_err(|e| io_error(&count_path, e))?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_error(&count_path, e)),
    };
    let mut holders = Vec::new();
    for slot in 0..count.unwrap_or(0).min(MAX_PERMITS) {
        let path = path(dir, key, &format!(".permit-{slot}"));
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
