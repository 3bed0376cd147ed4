//! [`Side`]: one thing being measured (distlock, the raw bound, a peer crate), and
//! [`Contender`]: one worker's handle on it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock::{DistributedLock, LockKey, LockOptions, WaitOrder, WaitPolicy};

/// Errors inside a run; turned into a [`crate::BenchError`] at the edge.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Lease of every lock taken by the benchmark: long enough never to expire mid-run.
pub(crate) const TTL: Duration = Duration::from_secs(30);
/// Longest a contender waits for a held key before the run is called failed.
pub(crate) const PATIENCE: Duration = Duration::from_secs(30);

/// One worker's connection to a side. Workers never share a `Contender`.
#[async_trait]
pub(crate) trait Contender: Send {
    /// Acquires `key` (waiting for it if the side can wait), calls `held` right after
    /// the grant and releases right after `held` returns. The callback lets the caller
    /// time the grant and stamp the release without knowing the side's guard type.
    async fn cycle(&mut self, key: &str, held: &mut (dyn FnMut() + Send)) -> Result<(), BoxError>;
}

/// Something measured: distlock, a raw bound or a peer crate, on one server.
#[async_trait]
pub(crate) trait Side: Send + Sync {
    /// Short name in tables and plots.
    fn name(&self) -> &'static str;
    /// Whether its acquire can wait for a held key (the raw bounds cannot), which the
    /// hot-key measurement needs.
    fn waits(&self) -> bool {
        true
    }
    /// A new worker handle; connecting happens here, outside any timed region.
    async fn contender(&self, worker: usize) -> Result<Box<dyn Contender>, BoxError>;
}

/// distlock through its public facade: one client shared by every worker, as an
/// application would use it; in its default waiting order, or asking for FIFO.
pub(crate) struct Ours {
    lock: Arc<dyn DistributedLock>,
    order: WaitOrder,
}

impl Ours {
    pub(crate) async fn connect(url: &str) -> Result<Self, BoxError> {
        Ok(Ours {
            lock: distlock::connect(url).await?.lock(),
            order: WaitOrder::Any,
        })
    }

    /// distlock asking for FIFO waiting (`WaitOrder::Fifo`).
    pub(crate) async fn fifo(url: &str) -> Result<Self, BoxError> {
        Ok(Ours {
            order: WaitOrder::Fifo,
            ..Ours::connect(url).await?
        })
    }
}

/// The FIFO side's name in tables.
pub(crate) const OURS_FIFO: &str = "distlock fifo";

#[async_trait]
impl Side for Ours {
    fn name(&self) -> &'static str {
        match self.order {
            WaitOrder::Fifo => OURS_FIFO,
            _ => "distlock",
        }
    }

    async fn contender(&self, _worker: usize) -> Result<Box<dyn Contender>, BoxError> {
        Ok(Box::new(OursContender {
            lock: self.lock.clone(),
            options: LockOptions::new(TTL)
                .with_wait(WaitPolicy::Timeout(PATIENCE))
                .with_order(self.order),
        }))
    }
}

struct OursContender {
    lock: Arc<dyn DistributedLock>,
    options: LockOptions,
}

#[async_trait]
impl Contender for OursContender {
    async fn cycle(&mut self, key: &str, held: &mut (dyn FnMut() + Send)) -> Result<(), BoxError> {
        let key = LockKey::new(format!("bench/ours/{key}"))?;
        let guard = self.lock.acquire(&key, &self.options).await?;
        held();
        guard.release().await?;
        Ok(())
    }
}
