//! Clients killed while queued for a FIFO lock or while holding it with a queue
//! behind them.

use super::*;

/// A FIFO waiter recorded by `r`, in the background: when granted, the grant's time and
/// guard.
fn fifo_waiter(
    r: Recorder,
    key: LockKey,
    options: LockOptions,
) -> tokio::task::JoinHandle<Result<(Instant, LockGuard), LockError>> {
    tokio::spawn(async move {
        let guard = r.acquire(&key, &options).await?;
        Ok((Instant::now(), guard))
    })
}

/// Waits for a [`fifo_waiter`] within `limit`.
async fn granted(
    waiter: tokio::task::JoinHandle<Result<(Instant, LockGuard), LockError>>,
    limit: Duration,
    who: &str,
) -> Result<(Instant, LockGuard), Failure> {
    match timeout(limit, waiter).await {
        Err(_) => Err(Failure::Failed(format!(
            "{who} was not granted within {}",
            millis(limit)
        ))),
        Ok(Err(e)) => Err(Failure::Failed(format!("{who} panicked: {e}"))),
        Ok(Ok(result)) => Ok(result?),
    }
}

pub(super) async fn crashed_clients_do_not_stall_the_fifo_queue(
    h: &dyn FaultHarness,
) -> Result<Outcome, Failure> {
    let history = History::new();
    let observer = h.fault_client().await?;
    if let distlock_api::Capability::Unsupported(why) =
        observer.client.info().capabilities.mutex.fifo
    {
        return Err(skip(format!("needs FIFO waiting: {why}")));
    }
    let observer = observer.client.lock();
    let wait = takeover(h) + h.dead_waiter_bound() + HANG;

    // A waiter dies in the queue; the one behind it must not wait for it for long.
    let key = unique_key("fifo-dead-waiter");
    let holder = h.fault_client().await?;
    let rh = recorder(&holder, 0, &history);
    let held = rh.acquire(&key, &fifo_with_ttl(LONG_TTL, wait)).await?;
    let arrival = Arrival::for_backend(h, &*observer, &key).await;
    let (doomed, doomed_net) = net_client(h).await?;
    let doomed_wait = fifo_waiter(
        recorder(&doomed, 1, &history),
        key.clone(),
        fifo_with_ttl(LONG_TTL, wait),
    );
    until_queued(&*observer, &key, 1, &arrival, h.slack() * 10).await?;
    let next = h.fault_client().await?;
    let next_wait = fifo_waiter(
        recorder(&next, 2, &history),
        key.clone(),
        fifo_with_ttl(LONG_TTL, wait),
    );
    until_queued(&*observer, &key, 2, &arrival, h.slack() * 10).await?;
    kill(&doomed_net);
    let killed_at = Instant::now();
    rh.release(held).await?;
    let bound = h.dead_waiter_bound() + 2 * h.slack();
    let (granted_at, guard) =
        granted(next_wait, bound + HANG, "the waiter behind a dead one").await?;
    let dead_waiter_cost = granted_at.saturating_duration_since(killed_at);
    doomed_wait.abort();
    check!(
        dead_waiter_cost <= bound,
        "the waiter behind a killed one was granted {} after the kill; the bound is {} (dead-waiter bound + 2 x slack)",
        millis(dead_waiter_cost),
        millis(bound)
    );
    recorder(&next, 2, &history).release(guard).await?;

    // A holder dies with two waiters queued: they follow it, in order, within the
    // crash bound.
    let key = unique_key("fifo-dead-holder");
    let (dying, dying_net) = net_client(h).await?;
    let rd = recorder(&dying, 3, &history);
    let held = rd.acquire(&key, &fifo_with_ttl(h.ttl(), wait)).await?;
    let arrival = Arrival::for_backend(h, &*observer, &key).await;
    let mut queued = Vec::new();
    for (n, who) in [(4, "the first waiter"), (5, "the second waiter")] {
        let client = h.fault_client().await?;
        queued.push((
            who,
            recorder(&client, n, &history),
            fifo_waiter(
                recorder(&client, n, &history),
                key.clone(),
                fifo_with_ttl(LONG_TTL, wait),
            ),
        ));
        until_queued(&*observer, &key, queued.len(), &arrival, h.slack() * 10).await?;
    }
    kill(&dying_net);
    let killed_at = Instant::now();
    rd.lost(&held);
    drop(held);
    let bound = takeover(h);
    let mut grants = Vec::new();
    for (who, r, waiter) in queued {
        let (granted_at, guard) = granted(waiter, bound + HANG, who).await?;
        grants.push((who, granted_at.saturating_duration_since(killed_at)));
        r.release(guard).await?;
    }
    let first = grants[0].1;
    check!(
        first <= bound,
        "the first waiter behind a killed holder was granted {} after the kill; the bound is {} (crash bound + 3 x slack)",
        millis(first),
        millis(bound)
    );
    check!(
        grants[0].1 <= grants[1].1,
        "the waiters behind a killed holder were granted out of order: {grants:?}"
    );
    Ok(Outcome {
        detail: format!(
            "a killed waiter held up the next for {}, a killed holder for {}; its two waiters followed in order",
            millis(dead_waiter_cost),
            millis(first)
        ),
        history,
    })
}
