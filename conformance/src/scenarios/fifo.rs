//! FIFO: waiters of different clients are granted in the order they started waiting.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use distlock_api::{DistributedLock, LockError, LockKey, LockOptions, WaitOrder, WaitPolicy};
use tokio::time::Instant;

use super::{check, unique_key, Failure, LONG_TTL};
use crate::Harness;

/// Waiters queued behind the holder.
const FIFO_WAITERS: usize = 5;

/// Options asking for FIFO, waiting up to `wait`.
fn fifo(wait: Duration) -> LockOptions {
    fifo_with_ttl(LONG_TTL, wait)
}

/// Options asking for FIFO with a lease of `ttl`, waiting up to `wait`.
pub fn fifo_with_ttl(ttl: Duration, wait: Duration) -> LockOptions {
    LockOptions::new(ttl)
        .with_wait(WaitPolicy::Timeout(wait))
        .with_order(WaitOrder::Fifo)
}

/// How the scenario knows a waiter is queued before it starts the next one.
pub enum Arrival {
    /// The backend counts its queue (`KeyStatus::waiters`): poll it.
    Observed,
    /// It cannot tell: space the arrivals by this much.
    Spaced(Duration),
}

impl Arrival {
    /// Observed where `observer` counts `key`'s queue (`KeyStatus::waiters`); else
    /// arrivals half the slack apart, at least 300 ms, which is far apart for a client
    /// to join a queue.
    pub async fn for_backend(
        h: &dyn Harness,
        observer: &dyn DistributedLock,
        key: &LockKey,
    ) -> Self {
        match observer.inspect(key).await {
            Ok(status) if status.waiters.is_some() => Arrival::Observed,
            _ => Arrival::Spaced((h.slack() / 2).max(Duration::from_millis(300))),
        }
    }
}

/// Waits until waiter number `queued` (1-based) is in the queue, by the backend's own
/// count where it has one, else by spacing the arrivals generously.
pub async fn until_queued(
    observer: &dyn DistributedLock,
    key: &LockKey,
    queued: usize,
    arrival: &Arrival,
    limit: Duration,
) -> Result<(), Failure> {
    let spacing = match arrival {
        Arrival::Spaced(spacing) => *spacing,
        Arrival::Observed => {
            let deadline = Instant::now() + limit;
            loop {
                let waiters = observer.inspect(key).await?.waiters;
                if waiters == Some(queued) {
                    return Ok(());
                }
                check!(
                    Instant::now() < deadline,
                    "waiter {queued} was not seen queued within {limit:?} (the backend counts {waiters:?})"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    tokio::time::sleep(spacing).await;
    Ok(())
}

pub(super) async fn waiters_are_granted_in_arrival_order(
    h: &dyn Harness,
) -> Result<String, Failure> {
    let key = unique_key("fifo-order");
    let (holder, observer) = (h.client().await?.lock(), h.client().await?.lock());
    let held = holder.acquire(&key, &fifo(h.slack())).await?;
    let arrival = Arrival::for_backend(h, &*observer, &key).await;
    let wait = h.slack() * 30;
    let granted = Arc::new(Mutex::new(Vec::with_capacity(FIFO_WAITERS)));
    let mut waiters = Vec::with_capacity(FIFO_WAITERS);
    for arrived in 0..FIFO_WAITERS {
        let lock = h.client().await?.lock();
        let (waited_key, granted, options) = (key.clone(), granted.clone(), fifo(wait));
        waiters.push(tokio::spawn(async move {
            let guard = lock.acquire(&waited_key, &options).await?;
            granted
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(arrived);
            // Hold a moment, so a waiter woken out of turn would find the key held
            // and get in line instead of overtaking.
            tokio::time::sleep(Duration::from_millis(20)).await;
            guard.release().await?;
            Ok::<_, LockError>(())
        }));
        until_queued(&*observer, &key, arrived + 1, &arrival, h.slack() * 10).await?;
    }
    held.release().await?;
    for waiter in waiters {
        waiter
            .await
            .map_err(|e| Failure::Failed(format!("a waiter panicked: {e}")))??;
    }
    let order = granted
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    check!(
        order == (0..FIFO_WAITERS).collect::<Vec<_>>(),
        "waiters arrived in order 0..{FIFO_WAITERS} but were granted in order {order:?}"
    );
    Ok(match arrival {
        Arrival::Observed => format!("{FIFO_WAITERS} waiters, each seen queued before the next"),
        Arrival::Spaced(spacing) => {
            format!("{FIFO_WAITERS} waiters arriving {spacing:?} apart")
        }
    })
}
