//! Liveness: free locks are taken at once, waiters are woken, crashed holders expire.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use distlock_api::{DistributedLock, LockError, LockKey, LockOptions, ReleaseOutcome, WaitPolicy};
use tokio::runtime::{Handle, Runtime};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::millis;
use super::{check, no_wait, unique_key, waiting, Failure, LONG_TTL};
use crate::Harness;

pub(super) async fn release_frees_key_at_once(h: &dyn Harness) -> Result<String, Failure> {
    let key = unique_key("release-frees");
    let (a, b) = (h.client().await?.lock(), h.client().await?.lock());
    for round in 0..5 {
        let guard = a.acquire(&key, &no_wait(LONG_TTL)).await?;
        let released = guard.release().await?;
        check!(
            released == ReleaseOutcome::Released,
            "round {round}: release gave {released:?}"
        );
        let Some(guard) = b.try_acquire(&key, &no_wait(LONG_TTL)).await? else {
            return Err(Failure::Failed(format!(
                "round {round}: the key was still held right after release"
            )));
        };
        guard.release().await?;
    }
    Ok(String::new())
}

pub(super) async fn inspect_reports_held_then_free(h: &dyn Harness) -> Result<String, Failure> {
    let key = unique_key("inspect");
    let (a, observer) = (h.client().await?.lock(), h.client().await?.lock());
    let before = match observer.inspect(&key).await {
        Err(LockError::Unsupported { reason, .. }) => {
            return Err(Failure::Skipped(format!(
                "inspect is unsupported: {reason}"
            )))
        }
        other => other?,
    };
    check!(!before.held, "a never-used key reads held: {before:?}");
    let guard = a.acquire(&key, &no_wait(LONG_TTL)).await?;
    let during = observer.inspect(&key).await?;
    check!(during.held, "a held key reads free: {during:?}");
    if let Some(token) = during.fencing_token {
        check!(
            Some(token) == guard.fencing_token(),
            "inspect gave token {token}, the holder has {}",
            known(guard.fencing_token())
        );
    }
    if let Some(remaining) = during.remaining {
        check!(
            remaining <= LONG_TTL && !remaining.is_zero(),
            "remaining lease {remaining:?} is outside (0, {LONG_TTL:?}]"
        );
    }
    guard.release().await?;
    let after = observer.inspect(&key).await?;
    check!(!after.held, "a released key reads held: {after:?}");
    check!(
        after.remaining.is_none(),
        "a free key reports a remaining lease: {after:?}"
    );
    Ok(format!(
        "token {}, remaining {}, holder {}",
        known(during.fencing_token),
        known(during.remaining.map(|r| format!("{r:?}"))),
        known(during.holder)
    ))
}

fn known(value: Option<impl std::fmt::Display>) -> String {
    value.map_or_else(|| "unknown".to_owned(), |v| v.to_string())
}

const HANDOFFS: usize = 10;

pub(super) async fn waiter_acquires_promptly_after_release(
    h: &dyn Harness,
) -> Result<String, Failure> {
    let key = unique_key("handoff");
    let (a, b) = (h.client().await?.lock(), h.client().await?.lock());
    let mut latencies = Vec::with_capacity(HANDOFFS);
    for _ in 0..HANDOFFS {
        let holder = a.acquire(&key, &no_wait(LONG_TTL)).await?;
        let waiter = {
            let (b, key) = (b.clone(), key.clone());
            let options = waiting(LONG_TTL, Duration::from_secs(30));
            tokio::spawn(async move {
                let guard = b.acquire(&key, &options).await?;
                Ok::<_, LockError>((Instant::now(), guard))
            })
        };
        // The holder's work; the waiter is queued meanwhile.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let released_at = Instant::now();
        holder.release().await?;
        let (granted_at, guard) = waiter
            .await
            .map_err(|e| Failure::Failed(format!("waiter panicked: {e}")))??;
        latencies.push(granted_at.saturating_duration_since(released_at));
        guard.release().await?;
    }
    latencies.sort();
    let (median, worst) = (latencies[HANDOFFS / 2], latencies[HANDOFFS - 1]);
    check!(
        median <= h.slack() / 4,
        "median hand-off took {median:?}; a woken waiter should take about a round trip"
    );
    check!(worst <= h.slack(), "slowest hand-off took {worst:?}");
    Ok(format!(
        "hand-off p50 {} max {}",
        millis(median),
        millis(worst)
    ))
}

pub(super) async fn wait_timeout_is_honoured(h: &dyn Harness) -> Result<String, Failure> {
    let key = unique_key("wait-timeout");
    let (a, b) = (h.client().await?.lock(), h.client().await?.lock());
    let guard = a.acquire(&key, &no_wait(LONG_TTL)).await?;
    let limit = Duration::from_millis(300);
    let started = Instant::now();
    let result = b.acquire(&key, &waiting(LONG_TTL, limit)).await;
    let waited = started.elapsed();
    match result {
        Err(LockError::Timeout { .. }) => {}
        Err(e) => return Err(Failure::Failed(format!("gave {e} instead of Timeout"))),
        Ok(_) => return Err(Failure::Failed("granted a key that was held".into())),
    }
    check!(
        waited >= limit,
        "gave up after {waited:?}, before the {limit:?} timeout"
    );
    check!(
        waited <= limit + h.slack(),
        "gave up after {waited:?}, long after the {limit:?} timeout"
    );
    guard.release().await?;
    Ok(format!("timed out after {}", millis(waited)))
}

pub(super) async fn crashed_holder_frees_within_lease(h: &dyn Harness) -> Result<String, Failure> {
    let key = unique_key("crash");
    let ttl = h.ttl();
    let a = h.client().await?;
    let Some(faults) = a.faults.clone() else {
        return Err(Failure::Skipped("the harness cannot crash a client".into()));
    };
    let guard = a.lock().acquire(&key, &no_wait(ttl)).await?;
    let (granted, valid_until) = (guard.lease().acquired_at(), guard.valid_until());
    faults.crash().await?;
    // The crashed process's guard goes away without a release reaching the server.
    drop(guard);
    let bound = h.crash_bound(ttl) + h.slack();
    let b = h.client().await?.lock();
    let taken = b
        .acquire(&key, &waiting(LONG_TTL, bound))
        .await
        .map_err(|e| {
            Failure::Failed(format!(
                "the crashed holder's lock was not freed within {bound:?}: {e}"
            ))
        })?;
    let taken_at = Instant::now();
    check!(
        taken_at >= valid_until,
        "another client got the lock {:?} before the crashed holder's validity ended",
        valid_until - taken_at
    );
    taken.release().await?;
    Ok(format!(
        "freed {} after the grant",
        millis(taken_at - granted)
    ))
}

pub(super) async fn cancelled_acquire_leaks_nothing(h: &dyn Harness) -> Result<String, Failure> {
    let key = unique_key("cancel");
    let (a, b, c) = (
        h.client().await?.lock(),
        h.client().await?.lock(),
        h.client().await?.lock(),
    );
    let options = LockOptions::new(LONG_TTL).with_wait(WaitPolicy::Forever);
    // Uncontended: cut the acquire short after 0, 0.1 ms, 0.2 ms, … of progress.
    for step in 0..25u32 {
        let cut = Duration::from_micros(100) * step;
        let _ = tokio::time::timeout(cut, b.acquire(&key, &options)).await;
        // A grant that arrived as the future was dropped is released in the background.
        let probe = c
            .acquire(&key, &waiting(LONG_TTL, h.slack()))
            .await
            .map_err(|e| {
                Failure::Failed(format!(
                    "after an acquire cut at {cut:?} the key stayed held: {e}"
                ))
            })?;
        probe.release().await?;
    }
    // Contended: waiters dropped while queued must not take the lock later. The last
    // cut acquire may still reach the server after the probe's release, and its grant
    // is then released in the background: wait for that, as the probes do.
    let holder = a.acquire(&key, &waiting(LONG_TTL, h.slack())).await?;
    for _ in 0..5 {
        match tokio::time::timeout(Duration::from_millis(20), b.acquire(&key, &options)).await {
            Err(_elapsed) => {}
            Ok(Ok(_)) => return Err(Failure::Failed("a waiter got a key that was held".into())),
            Ok(Err(e)) => return Err(e.into()),
        }
    }
    holder.release().await?;
    let probe = c
        .acquire(&key, &waiting(LONG_TTL, h.slack()))
        .await
        .map_err(|e| Failure::Failed(format!("after cancelled waits the key stayed held: {e}")))?;
    probe.release().await?;
    Ok("25 uncontended and 5 queued acquires cancelled".into())
}

pub(super) async fn dropped_guard_frees_quickly(h: &dyn Harness) -> Result<String, Failure> {
    let key = unique_key("drop");
    let (a, b) = (h.client().await?.lock(), h.client().await?.lock());
    let guard = a.acquire(&key, &no_wait(LONG_TTL)).await?;
    let dropped_at = Instant::now();
    drop(guard);
    let taken = b
        .acquire(&key, &waiting(LONG_TTL, h.slack()))
        .await
        .map_err(|e| {
            Failure::Failed(format!(
                "a dropped guard's lock was not freed within {:?}: {e}",
                h.slack()
            ))
        })?;
    let took = dropped_at.elapsed();
    taken.release().await?;
    Ok(format!("freed {} after drop", millis(took)))
}

/// How far apart the waiters of [`abandoned_waiter_does_not_delay_the_next`] arrive, so
/// that the one that gives up queues first. (The kit cannot see a backend's queue; with
/// no gap the check would be weaker, not wrong.)
const ARRIVAL_GAP: Duration = Duration::from_millis(100);

/// How long the "process" of [`abandoned_waiter_does_not_delay_the_next`] is given to
/// exit: what its backend does as its runtime's tasks are dropped.
const EXIT_GRACE: Duration = Duration::from_secs(2);

pub(super) async fn abandoned_waiter_does_not_delay_the_next(
    h: &dyn Harness,
) -> Result<String, Failure> {
    let key = unique_key("abandoned-waiter");
    let (a, c) = (h.client().await?.lock(), h.client().await?.lock());

    // Given up by its wait running out, after the next waiter queued behind it.
    let b = h.client().await?.lock();
    let timed_out = hand_off_past(h, &key, &a, &c, |key, _| {
        let options = waiting(LONG_TTL, 3 * ARRIVAL_GAP);
        let waiting = tokio::spawn(async move { b.acquire(&key, &options).await.map(drop) });
        async move {
            match waiting.await {
                Ok(Err(LockError::Timeout { .. })) => Ok(()),
                Ok(Err(e)) => Err(format!("the waiter failed with {e} instead of timing out")),
                Ok(Ok(())) => Err("the waiter got the key while it was held".into()),
                Err(e) => Err(format!("the waiter panicked: {e}")),
            }
        }
    })
    .await
    .map_err(|why| Failure::Failed(format!("a wait that ran out: {why}")))?;

    // Given up by dropping the acquire future; the client lives on.
    let b = h.client().await?.lock();
    let dropped = hand_off_past(h, &key, &a, &c, |key, options| {
        let waiting = tokio::spawn(async move { b.acquire(&key, &options).await.map(drop) });
        async move {
            waiting.abort();
            let _ = waiting.await;
            Ok(())
        }
    })
    .await
    .map_err(|why| Failure::Failed(format!("a dropped acquire: {why}")))?;

    // Given up by its process exiting: a client made on a runtime of its own, which shuts
    // down (as when `main` returns) while the acquire waits.
    let process = Process::start()?;
    let b = OnRuntime::new(process.handle(), h.client()).await?.lock();
    let exited = hand_off_past(h, &key, &a, &c, |key, options| {
        let waiting = process
            .handle()
            .spawn(async move { b.acquire(&key, &options).await.map(drop) });
        async move {
            drop(waiting);
            process.exit().await
        }
    })
    .await
    .map_err(|why| Failure::Failed(format!("a process exiting while it waited: {why}")))?;

    Ok(format!(
        "hand-off past a timed-out wait {}, a dropped acquire {}, an exited process {}",
        millis(timed_out),
        millis(dropped),
        millis(exited)
    ))
}

/// `a` takes `key`; a waiter started by `start_waiter` queues, then `c`; the waiter gives
/// up (the future `start_waiter` returned); `a` releases. `c` must be granted within the
/// slack of the release. Returns that hand-off time.
async fn hand_off_past<Start, GiveUp>(
    h: &dyn Harness,
    key: &LockKey,
    a: &Arc<dyn DistributedLock>,
    c: &Arc<dyn DistributedLock>,
    start_waiter: Start,
) -> Result<Duration, String>
where
    Start: FnOnce(LockKey, LockOptions) -> GiveUp,
    GiveUp: Future<Output = Result<(), String>>,
{
    let error = |e: LockError| e.to_string();
    let holder = a.acquire(key, &no_wait(LONG_TTL)).await.map_err(error)?;
    let give_up = start_waiter(key.clone(), waiting(LONG_TTL, Duration::from_secs(60)));
    tokio::time::sleep(ARRIVAL_GAP).await;
    let next: JoinHandle<Result<_, LockError>> = {
        let (c, key) = (c.clone(), key.clone());
        tokio::spawn(async move {
            let guard = c
                .acquire(&key, &waiting(LONG_TTL, Duration::from_secs(60)))
                .await?;
            Ok((Instant::now(), guard))
        })
    };
    tokio::time::sleep(ARRIVAL_GAP).await;
    give_up.await?;
    if next.is_finished() {
        return Err(match next.await {
            Ok(Ok(_)) => "the next waiter got the key while it was held".into(),
            Ok(Err(e)) => format!("the next waiter failed while the key was held: {e}"),
            Err(e) => format!("the next waiter panicked: {e}"),
        });
    }
    let released_at = Instant::now();
    holder.release().await.map_err(error)?;
    let bound = h.slack();
    let (granted_at, guard) = match tokio::time::timeout(bound, next).await {
        Err(_) => {
            return Err(format!(
                "the next waiter was not granted within {bound:?} of the holder's release"
            ))
        }
        Ok(joined) => joined
            .map_err(|e| format!("the next waiter panicked: {e}"))?
            .map_err(error)?,
    };
    guard.release().await.map_err(error)?;
    Ok(granted_at.saturating_duration_since(released_at))
}

/// A runtime standing for a client's process.
struct Process {
    handle: Handle,
    /// Taken by `exit` (or at drop).
    runtime: Option<Runtime>,
}

impl Process {
    fn start() -> Result<Self, Failure> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| Failure::Failed(format!("cannot start a runtime: {e}")))?;
        Ok(Process {
            handle: runtime.handle().clone(),
            runtime: Some(runtime),
        })
    }

    fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Shuts the runtime down as a process's `main` returning would: its tasks are
    /// dropped, and the shutdown waits at most [`EXIT_GRACE`].
    async fn exit(mut self) -> Result<(), String> {
        let Some(runtime) = self.runtime.take() else {
            return Ok(());
        };
        tokio::task::spawn_blocking(move || runtime.shutdown_timeout(EXIT_GRACE))
            .await
            .map_err(|e| format!("the process's shutdown panicked: {e}"))
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // On an early return: an async context cannot wait for a runtime to stop.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Polls a future with a runtime entered: what it spawns, and the timers and sockets it
/// sets up, belong to that runtime (a client made this way lives on it, as if in a
/// process of its own).
struct OnRuntime<F> {
    runtime: Handle,
    future: Pin<Box<F>>,
}

impl<F> OnRuntime<F> {
    fn new(runtime: &Handle, future: F) -> Self {
        OnRuntime {
            runtime: runtime.clone(),
            future: Box::pin(future),
        }
    }
}

impl<F: Future> Future for OnRuntime<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let _entered = this.runtime.enter();
        this.future.as_mut().poll(cx)
    }
}
