//! What `exec` holds while the command runs, by mode: the lock (plain exec), a read
//! lock (`--shared`) or one permit of a semaphore (`--permits N`).
//!
//! Plain exec takes KEY's mutex, as it always has, so it still excludes older distlock
//! versions and library users of the mutex; where the backend also offers read-write
//! locks it then takes KEY's write lock too, so that it excludes `--shared` holders
//! (read-write keys are a namespace of their own). Always in that order, so two plain
//! execs never wait on each other crosswise.

use std::time::Duration;

use distlock::{LeaseState, LockError, LockGuard, LockKey, LockOptions, RwMode, WaitPolicy};
use tokio::time::Instant;

use crate::error::CliError;

/// Which primitive exec takes on KEY.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The lock, and the read-write lock's write side where the backend has one.
    Exclusive,
    /// The read-write lock's read side (`--shared`).
    Shared,
    /// One of this many permits of the semaphore (`--permits N`).
    Permits(u32),
}

impl Mode {
    /// What a holder of this mode is called in messages, e.g. when the wait runs out.
    pub fn describe(self, key: &str) -> String {
        match self {
            Mode::Exclusive => format!("lock {key} is held by another owner"),
            Mode::Shared => format!("lock {key} is held by a writer (or a writer waits)"),
            Mode::Permits(n) => format!("all {n} permits of semaphore {key} are held"),
        }
    }
}

/// The grants exec holds: `primary` gives the fencing token; `companion` is the write
/// lock a plain exec takes beside the mutex.
pub struct Held {
    /// The grant whose token the command gets.
    pub primary: LockGuard,
    /// The write lock beside a plain exec's mutex, where the backend has one.
    pub companion: Option<LockGuard>,
    /// The backend's name ([`distlock::BackendInfo::name`]).
    pub backend: &'static str,
}

impl Held {
    /// Lost as soon as any of the grants is.
    pub fn state(&self) -> LeaseState {
        match &self.companion {
            Some(companion) if companion.state() == LeaseState::Lost => LeaseState::Lost,
            _ => self.primary.state(),
        }
    }

    /// Resolves when any of the grants is lost.
    pub async fn lost(&self) {
        match &self.companion {
            Some(companion) => {
                tokio::select! {
                    () = self.primary.lost() => {}
                    () = companion.lost() => {}
                }
            }
            None => self.primary.lost().await,
        }
    }

    /// Renewals of every grant.
    pub fn renewals(&self) -> u64 {
        let companion = self
            .companion
            .as_ref()
            .map_or(0, |c| c.monitor().renewals());
        self.primary.monitor().renewals() + companion
    }
}

/// Takes what `mode` needs on `key` at `url`. `fifo` asks the mutex for arrival order
/// (semaphores and read-write locks have their own fairness and are not asked).
///
/// # Errors
/// exec's errors for a failed connect or acquire (see [`super::lock_error`]), and a
/// usage error when the backend offers no semaphore or read-write lock.
pub async fn acquire(
    url: &str,
    key: &LockKey,
    mode: Mode,
    options: &LockOptions,
    fifo: bool,
) -> Result<Held, CliError> {
    let started = Instant::now();
    let failed = |e| super::lock_error(e, mode, key);
    match mode {
        Mode::Permits(permits) => {
            let semaphore = distlock::connect_semaphore(url).await.map_err(failed)?;
            let backend = semaphore.info().name;
            let primary = semaphore
                .acquire(key, permits, options)
                .await
                .map_err(failed)?;
            Ok(Held {
                primary,
                companion: None,
                backend,
            })
        }
        Mode::Shared => {
            let rw = distlock::connect_rw(url).await.map_err(failed)?;
            let backend = rw.info().name;
            let primary = rw
                .acquire(key, RwMode::Read, options)
                .await
                .map_err(failed)?;
            Ok(Held {
                primary,
                companion: None,
                backend,
            })
        }
        Mode::Exclusive => {
            let locks = distlock::connect(url).await.map_err(failed)?.lock();
            let info = locks.info();
            let mutex_options = match fifo && info.capabilities.mutex.fifo.is_supported() {
                true => options.clone().with_order(distlock::WaitOrder::Fifo),
                false => options.clone(),
            };
            let primary = locks.acquire(key, &mutex_options).await.map_err(failed)?;
            let companion = if info.capabilities.rw_lock.offered.is_supported() {
                write_side(url, key, &remaining(options, started.elapsed()))
                    .await
                    .map_err(failed)?
            } else {
                None
            };
            Ok(Held {
                primary,
                companion,
                backend: info.name,
            })
        }
    }
}

/// KEY's write lock, or `None` where `--shared` cannot be used either (the facade
/// offers no read-write lock on this URL), so there are no readers to exclude.
async fn write_side(
    url: &str,
    key: &LockKey,
    options: &LockOptions,
) -> Result<Option<LockGuard>, LockError> {
    let rw = match distlock::connect_rw(url).await {
        Ok(rw) => rw,
        Err(LockError::Unsupported { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    rw.acquire(key, RwMode::Write, options).await.map(Some)
}

/// `options` with what is left of its wait after `spent`, so that `--wait` bounds the
/// whole acquire, not each of its steps.
fn remaining(options: &LockOptions, spent: Duration) -> LockOptions {
    match options.wait() {
        WaitPolicy::Timeout(total) => match total.checked_sub(spent) {
            Some(left) if !left.is_zero() => options.clone().with_wait(WaitPolicy::Timeout(left)),
            _ => options.clone().with_wait(WaitPolicy::NoWait),
        },
        _ => options.clone(),
    }
}
