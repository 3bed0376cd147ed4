//! What `exec` holds while the command runs, by mode: the lock (plain exec), a read
//! lock (`--shared`) or one permit of a semaphore (`--permits N`).
//!
//! Plain exec takes KEY's mutex, as it always has, so it still excludes older distlock
//! versions and library users of the mutex; where the backend also offers read-write
//! locks it then takes KEY's write lock too, so that it excludes `--shared` holders
//! (read-write keys are a namespace of their own). Always in that order, so two plain
//! execs never wait on each other crosswise.

use std::time::Duration;

use distlock::{
    Client, LeaseState, LockGuard, LockKey, LockOptions, MultiGuard, RwMode, WaitPolicy,
};
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
/// lock a plain exec takes beside the mutex. Each is a set: one part per key (KEY, and
/// every `--and` key), taken all or nothing.
pub struct Held {
    /// The grants whose first key's token the command gets.
    pub primary: MultiGuard,
    /// The write locks beside a plain exec's mutexes, where the backend has them.
    pub companion: Option<MultiGuard>,
    /// The backend's name and guarantees.
    pub backend: distlock::BackendInfo,
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
        let parts = self.primary.parts().iter();
        let parts = parts.chain(self.companion.iter().flat_map(|c| c.parts()));
        parts.map(|part| part.monitor().renewals()).sum()
    }

    /// The first key's grant: its token is the command's, its lease the hold's.
    pub fn first(&self) -> Option<&LockGuard> {
        self.primary.parts().first()
    }
}

/// Takes what `mode` needs on every key of `keys` through `client`, all or nothing.
/// `fifo` asks the mutex for arrival order (semaphores and read-write locks have their
/// own fairness and are not asked).
///
/// # Errors
/// exec's errors for a failed acquire (see [`super::lock_error`]), and a usage error
/// when the backend offers no semaphore or read-write lock.
pub async fn acquire(
    client: &Client,
    keys: &[LockKey],
    mode: Mode,
    options: &LockOptions,
    fifo: bool,
) -> Result<Held, CliError> {
    let started = Instant::now();
    let failed = |e| super::lock_error(e, mode, &keys[0]);
    let info = client.info();
    match mode {
        Mode::Permits(permits) => {
            let semaphore = client.semaphore();
            let primary = semaphore
                .acquire_all(keys, permits, options)
                .await
                .map_err(failed)?;
            Ok(Held {
                primary,
                companion: None,
                backend: info.clone(),
            })
        }
        Mode::Shared => {
            let primary = client
                .rw_lock()
                .acquire_all(keys, RwMode::Read, options)
                .await
                .map_err(failed)?;
            Ok(Held {
                primary,
                companion: None,
                backend: info.clone(),
            })
        }
        Mode::Exclusive => {
            let mutex_options = match fifo && info.capabilities.mutex.fifo.is_supported() {
                true => options.clone().with_order(distlock::WaitOrder::Fifo),
                false => options.clone(),
            };
            let primary = client
                .lock()
                .acquire_all(keys, &mutex_options)
                .await
                .map_err(failed)?;
            // The write side too, where `--shared` can be used: it excludes readers.
            let companion = if info.capabilities.rw_lock.offered.is_supported() {
                let (rw, left) = (client.rw_lock(), remaining(options, started.elapsed()));
                let writes = rw.acquire_all(keys, RwMode::Write, &left).await;
                Some(writes.map_err(failed)?)
            } else {
                None
            };
            Ok(Held {
                primary,
                companion,
                backend: info.clone(),
            })
        }
    }
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
