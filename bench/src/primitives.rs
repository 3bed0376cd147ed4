//! distlock's semaphore and read-write lock as sides beside its mutex: the same
//! uncontended cycles and hot key, so that their rows and ratios to the mutex come from
//! one run. A backend without them (its capabilities say so) gets a note instead.

use std::sync::Arc;

use async_trait::async_trait;
use distlock::{
    Capability, DistributedRwLock, DistributedSemaphore, LockKey, LockOptions, RwMode, WaitPolicy,
};

use crate::side::{BoxError, Contender, Side, PATIENCE, TTL};

/// Permits of the benchmark's semaphore: fewer than the hot key's workers, so the hot
/// key runs it at saturation (every permit held, the other workers waiting).
pub(crate) const PERMITS: u32 = 2;

/// The semaphore side's name in tables.
pub(crate) const OURS_SEMAPHORE: &str = "distlock semaphore (2 permits)";
/// The read-write lock's write side's name in tables.
pub(crate) const OURS_WRITE: &str = "distlock rw write";
/// The read-write lock's read side's name in tables.
pub(crate) const OURS_READ: &str = "distlock rw read";

fn options() -> LockOptions {
    LockOptions::new(TTL).with_wait(WaitPolicy::Timeout(PATIENCE))
}

/// Adds the semaphore and read-write sides that the backend at `url` offers, and a note
/// for each it does not.
pub(crate) async fn add_sides(url: &str, sides: &mut Vec<Box<dyn Side>>, notes: &mut Vec<String>) {
    let client = match distlock::connect(url).await {
        Ok(client) => client,
        Err(e) => {
            notes.push(format!("semaphore and read-write rows left out: {e}"));
            return;
        }
    };
    let offers = client.info().capabilities;
    match offers.semaphore.offered {
        Capability::Supported => sides.push(Box::new(Permits {
            semaphore: client.semaphore(),
        })),
        refused => notes.push(format!("semaphore rows left out: {refused:?}")),
    }
    match offers.rw_lock.offered {
        Capability::Supported => {
            let rw = client.rw_lock();
            for mode in [RwMode::Write, RwMode::Read] {
                sides.push(Box::new(ReadWrite {
                    rw: rw.clone(),
                    mode,
                }));
            }
        }
        refused => notes.push(format!("read-write rows left out: {refused:?}")),
    }
}

/// One permit of [`PERMITS`] per cycle, through one shared client.
struct Permits {
    semaphore: Arc<dyn DistributedSemaphore>,
}

#[async_trait]
impl Side for Permits {
    fn name(&self) -> &'static str {
        OURS_SEMAPHORE
    }

    async fn contender(&self, _worker: usize) -> Result<Box<dyn Contender>, BoxError> {
        Ok(Box::new(PermitContender {
            semaphore: self.semaphore.clone(),
            options: options(),
        }))
    }
}

struct PermitContender {
    semaphore: Arc<dyn DistributedSemaphore>,
    options: LockOptions,
}

#[async_trait]
impl Contender for PermitContender {
    async fn cycle(&mut self, key: &str, held: &mut (dyn FnMut() + Send)) -> Result<(), BoxError> {
        let key = LockKey::new(format!("bench/semaphore/{key}"))?;
        let guard = self.semaphore.acquire(&key, PERMITS, &self.options).await?;
        held();
        guard.release().await?;
        Ok(())
    }
}

/// A read or a write grant per cycle, through one shared client.
struct ReadWrite {
    rw: Arc<dyn DistributedRwLock>,
    mode: RwMode,
}

#[async_trait]
impl Side for ReadWrite {
    fn name(&self) -> &'static str {
        match self.mode {
            RwMode::Write => OURS_WRITE,
            RwMode::Read => OURS_READ,
        }
    }

    /// Readers share the hot key rather than wait for each other: no hand-off to time.
    fn waits(&self) -> bool {
        self.mode == RwMode::Write
    }

    async fn contender(&self, _worker: usize) -> Result<Box<dyn Contender>, BoxError> {
        Ok(Box::new(ReadWriteContender {
            rw: self.rw.clone(),
            mode: self.mode,
            options: options(),
        }))
    }
}

struct ReadWriteContender {
    rw: Arc<dyn DistributedRwLock>,
    mode: RwMode,
    options: LockOptions,
}

#[async_trait]
impl Contender for ReadWriteContender {
    async fn cycle(&mut self, key: &str, held: &mut (dyn FnMut() + Send)) -> Result<(), BoxError> {
        let key = LockKey::new(format!("bench/rw/{key}"))?;
        let guard = self.rw.acquire(&key, self.mode, &self.options).await?;
        held();
        guard.release().await?;
        Ok(())
    }
}
