//! Background clean-ups spawned by drops, and [`settle_cleanups`], which waits for them
//! before a program shuts its runtime down.
//!
//! `Drop` cannot await, so what a drop must still tell the server (a dropped guard's
//! release, the undoing of a grant that reached a dropped acquire late, a dropped
//! waiter leaving a wait queue) runs in a task spawned on the runtime. Shutting a tokio
//! runtime down drops its tasks at their next await instead of running them (a
//! `shutdown_timeout` grace only bounds blocking work), so a clean-up still in flight
//! then never reaches the server, and what it would have freed stays until its lease
//! or queue entry expires on its own: up to the TTL on Redis. Clean-ups spawned through
//! [`spawn_cleanup`] are counted until they finish or are dropped, and
//! [`settle_cleanups`] waits for the count to reach zero.

use std::future::Future;
use std::sync::LazyLock;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::watch;

/// How many clean-ups are in flight, in the whole process.
static IN_FLIGHT: LazyLock<watch::Sender<usize>> = LazyLock::new(|| watch::channel(0).0);

/// Counts one clean-up as in flight until dropped: when its task finishes, or when the
/// runtime drops it unfinished (a spawn on a runtime that has shut down drops it at once).
struct InFlight;

impl InFlight {
    fn new() -> Self {
        IN_FLIGHT.send_modify(|n| *n += 1);
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Spawns `cleanup` on `runtime` as a background clean-up that [`settle_cleanups`]
/// waits for. For backend implementors: every server request a `Drop` must leave
/// behind (a release, the undoing of a late grant, leaving a wait queue) goes through
/// here, so that a program exiting right after the drop can still let it finish.
///
/// Never blocks and never panics; on a runtime that has shut down the clean-up is
/// dropped unrun, as any spawned task.
pub fn spawn_cleanup<F>(runtime: &Handle, cleanup: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let in_flight = InFlight::new();
    runtime.spawn(async move {
        let _in_flight = in_flight;
        cleanup.await;
    });
}

/// Waits until every background clean-up in flight in this process has finished (the
/// releases of dropped guards, and what dropped acquires still had to tell the server),
/// for at most `patience`. Returns `true` when none is left, `false` when `patience`
/// ran out first. Clean-ups spawned meanwhile are waited for too.
///
/// Await it before dropping (or shutting down) a runtime on which locks were used,
/// from a task of a runtime that is still running (the clean-ups run on the runtimes
/// that were current when their locks were acquired): shutting a runtime down drops
/// its tasks unfinished, and a lock whose release is dropped stays held until its
/// lease runs out (a waiter's queue entry, until it expires). Each clean-up is one
/// request bounded by its backend's request timeout, so a `patience` of that timeout
/// is enough. Nothing fails: a clean-up that errs or is cut short leaves the lease to
/// expire, as a crashed process would.
///
/// ```
/// use std::time::Duration;
/// use distlock_api::{LockKey, LockOptions, MemoryLock};
///
/// # async fn demo() -> Result<(), distlock_api::LockError> {
/// let locks = MemoryLock::new().lock();
/// let guard = locks.acquire(&LockKey::new("k")?, &LockOptions::new(Duration::from_secs(10))).await?;
/// drop(guard); // released in the background
/// // Before the runtime shuts down (`main` returning, say):
/// distlock_api::settle_cleanups(Duration::from_secs(2)).await;
/// # Ok(()) }
/// ```
pub async fn settle_cleanups(patience: Duration) -> bool {
    let mut in_flight = IN_FLIGHT.subscribe();
    let settled = tokio::time::timeout(patience, in_flight.wait_for(|n| *n == 0))
        .await
        .is_ok_and(|none_left| none_left.is_ok());
    settled
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn settles_once_the_cleanups_finish_and_gives_up_after_patience() {
        let (finish, finished) = tokio::sync::oneshot::channel::<()>();
        spawn_cleanup(&Handle::current(), async move {
            let _ = finished.await;
        });
        assert!(!settle_cleanups(Duration::from_millis(50)).await);
        let _ = finish.send(());
        assert!(settle_cleanups(Duration::from_secs(10)).await);
    }

    #[test]
    fn a_cleanup_dropped_by_a_shut_down_runtime_is_not_waited_for() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let handle = runtime.handle().clone();
        drop(runtime);
        spawn_cleanup(&handle, std::future::pending());
        let waiter = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        assert!(waiter.block_on(settle_cleanups(Duration::from_secs(10))));
    }
}
