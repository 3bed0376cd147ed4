//! The read-write lock: `flock(2)` shared and exclusive locks, with a writer gate so
//! readers cannot starve a writer. Grants carry no fencing token; waiting polls at the
//! options' backoff; like the mutex, a grant is held until it is released or its
//! process exits (no TTL expiry).
//!
//! Protocol, per key: the main file `….rw` is locked shared by readers and exclusive by
//! the writer; the gate file `….rw-gate` orders them. A reader takes the gate shared,
//! then the main file shared, then lets the gate go. A writer takes the gate exclusive
//! and keeps it while it waits for the main file and while it holds it. A plain `flock`
//! read-write lock lets a stream of overlapping readers keep the main file shared
//! forever; with the gate, new readers stop at it as soon as a writer waits, and the
//! writer is granted once the readers already inside leave.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

use distlock_api::backend::{Grant, Request};
use distlock_api::{
    ExtendOutcome, HolderStatus, Lease, LockError, LockKey, ReleaseOutcome, RwMode, RwStatus,
};
use tokio::time::Instant;

use crate::error::io_error;
use crate::held::{poll, try_lock_shared, HeldFiles};
use crate::{keys, lock_file};

/// The read and write grants one client holds, across keys.
#[derive(Debug, Default)]
pub(crate) struct RwLocks {
    held: HeldFiles,
}

fn path(dir: &Path, key: &LockKey, suffix: &str) -> PathBuf {
    dir.join(keys::derived_name(key, suffix))
}

impl RwLocks {
    /// `mode` on `request.key`, polling while the request's deadline allows; `None`
    /// when it is still refused then. A waiting writer keeps the gate locked between
    /// polls (its intent, which holds new readers back); a dropped future drops it.
    ///
    /// # Errors
    /// [`LockError::Backend`] for file-system errors.
    pub(crate) async fn acquire(
        &self,
        dir: &Path,
        request: &Request<'_>,
        mode: RwMode,
    ) -> Result<Option<Grant>, LockError> {
        let (key, ttl) = (request.key, request.options.ttl());
        let mut gate = None;
        poll(request, || {
            let requested_at = Instant::now();
            let files = match mode {
                RwMode::Read => try_read(dir, key)?,
                RwMode::Write => try_write(dir, key, &mut gate)?,
            };
            Ok(files.map(|files| self.held.grant(key, files, ttl, requested_at)))
        })
        .await
    }

    /// Closes `lease`'s files.
    pub(crate) fn release(&self, lease: &Lease) -> ReleaseOutcome {
        self.held.release(lease.owner())
    }

    /// Pushes a held grant's local deadline to `ttl` from now.
    pub(crate) fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        self.held.extend(lease.owner(), ttl)
    }
}

/// One non-blocking read attempt: the main file locked shared.
fn try_read(dir: &Path, key: &LockKey) -> Result<Option<Vec<File>>, LockError> {
    let gate_path = path(dir, key, ".rw-gate");
    let gate = lock_file::open(&gate_path).map_err(|e| io_error(&gate_path, e))?;
    if !try_lock_shared(&gate).map_err(|e| io_error(&gate_path, e))? {
        return Ok(None);
    }
    let main_path = path(dir, key, ".rw");
    let main = lock_file::open(&main_path).map_err(|e| io_error(&main_path, e))?;
    let granted = try_lock_shared(&main).map_err(|e| io_error(&main_path, e))?;
    // The gate closes with `gate` here: a reader holds only the main file.
    Ok(granted.then(|| vec![main]))
}

/// One non-blocking write attempt. `gate` keeps the gate locked between attempts of
/// one acquire (the writer's intent); dropping it, as a dropped acquire future does,
/// lets readers in again.
fn try_write(
    dir: &Path,
    key: &LockKey,
    gate: &mut Option<File>,
) -> Result<Option<Vec<File>>, LockError> {
    if gate.is_none() {
        let gate_path = path(dir, key, ".rw-gate");
        *gate = lock_file::open_locked(&gate_path, false).map_err(|e| io_error(&gate_path, e))?;
    }
    if gate.is_none() {
        return Ok(None);
    }
    let main_path = path(dir, key, ".rw");
    let Some(main) =
        lock_file::open_locked(&main_path, false).map_err(|e| io_error(&main_path, e))?
    else {
        return Ok(None);
    };
    Ok(gate.take().map(|gate| vec![gate, main]))
}

/// The read-write lock `key` in `dir` as it is now. Probes the main file (shared,
/// then exclusive, each for a moment: a reader attempting meanwhile finds the key
/// busy and retries at its backoff) and the gate (shared). `flock` cannot list
/// readers, so only a writer is named.
pub(crate) fn inspect(dir: &Path, key: &LockKey) -> Result<RwStatus, LockError> {
    let main_path = path(dir, key, ".rw");
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
    let gate_path = path(dir, key, ".rw-gate");
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
