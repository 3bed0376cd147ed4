//! Holders of a semaphore permit or a write lock that stall past their leases (a
//! process pause): the permits and the lock come free for others, and the history's
//! exclusion checker holds them to their primitive's rule (at most N permits at once;
//! no reader beside a writer).

use distlock_api::{DistributedRwLock, DistributedSemaphore, RwMode};
use std::sync::Arc;

use super::*;
use crate::history::Primitive;

/// The semaphore's permit count in the scenario.
const PERMITS: u32 = 2;

/// Skips unless the paused holder can be stopped renewing: TTL expiry, or a network
/// hook that silences its session.
fn check_pausable(client: &FaultClient, primitive: distlock_api::Primitive) -> Result<(), Failure> {
    let caps = client.client.info().capabilities;
    if client.net.is_none() && !caps.of(primitive).ttl_expiry.is_supported() {
        return Err(skip(
            "needs TTL expiry or a network hook to stop the holder's session renewing",
        ));
    }
    Ok(())
}

fn semaphore_of(client: &FaultClient) -> Result<Arc<dyn DistributedSemaphore>, Failure> {
    check_offered(client, distlock_api::Primitive::Semaphore)?;
    Ok(client.client.semaphore())
}

fn rw_lock_of(client: &FaultClient) -> Result<Arc<dyn DistributedRwLock>, Failure> {
    check_offered(client, distlock_api::Primitive::RwLock)?;
    Ok(client.client.rw_lock())
}

/// Blackholes every paused holder's network (where there is one) while `meanwhile`
/// runs, then heals it with resets, as [`pause_holder`] does for one holder.
async fn pause_holders<F: Future>(nets: &[Option<NetFaults>], meanwhile: F) -> F::Output {
    let nets: Vec<&NetFaults> = nets.iter().flatten().collect();
    nets.iter().for_each(|n| n.blackhole());
    let out = meanwhile.await;
    nets.iter().for_each(|n| n.heal_with_reset());
    out
}

pub(super) async fn paused_permit_holders_free_their_permits(
    h: &dyn FaultHarness,
) -> Result<Outcome, Failure> {
    let history = History::new();
    let holders = [h.fault_client().await?, h.fault_client().await?];
    let takers = [h.fault_client().await?, h.fault_client().await?];
    for client in holders.iter().chain(&takers) {
        check_pausable(client, distlock_api::Primitive::Semaphore)?;
        semaphore_of(client)?;
    }
    let key = unique_key("permit-pause");
    let permit = Primitive::Permit { of: PERMITS };
    // Both permits taken, without auto-renew: the paused processes renew nothing.
    let mut held = Vec::new();
    for (n, client) in holders.iter().enumerate() {
        let recorder = recorder(client, n, &history);
        let semaphore = semaphore_of(client)?;
        let options = waiting(h.ttl(), h.slack());
        let guard = recorder
            .acquire_as(&key, permit, semaphore.acquire(&key, PERMITS, &options))
            .await?;
        held.push((recorder, guard));
    }
    let paused = Instant::now();
    // The stall lasts until both other clients hold a permit each: the event it spans.
    let take = |n: usize| {
        let client = &takers[n];
        let recorder = recorder(client, n + 2, &history);
        let (key, options) = (key.clone(), waiting(h.ttl(), takeover(h)));
        async move {
            let semaphore = semaphore_of(client)?;
            let guard = recorder
                .acquire_as(&key, permit, semaphore.acquire(&key, PERMITS, &options))
                .await?;
            Ok::<_, Failure>((recorder, guard))
        }
    };
    let nets: Vec<Option<NetFaults>> = holders.iter().map(|c| c.net.clone()).collect();
    let (first, second) = pause_holders(&nets, async { tokio::join!(take(0), take(1)) }).await;
    let stalled = paused.elapsed();
    let taken = [first?, second?];
    // No check here on when the permits were granted: the history shows it, and the
    // exclusion checker counts the overlapping grants (a stalled holder's window ends
    // at its claimed deadline).
    for (recorder, guard) in &held {
        recorder.lost(guard);
    }
    for (recorder, guard) in taken {
        recorder.release(guard).await?;
    }
    drop(held);
    Ok(Outcome {
        detail: format!("stalled {}, both permits taken over", millis(stalled)),
        history,
    })
}

pub(super) async fn paused_writer_frees_the_key_for_readers(
    h: &dyn FaultHarness,
) -> Result<Outcome, Failure> {
    let history = History::new();
    let writer = h.fault_client().await?;
    let readers = [h.fault_client().await?, h.fault_client().await?];
    for client in std::iter::once(&writer).chain(&readers) {
        check_pausable(client, distlock_api::Primitive::RwLock)?;
        rw_lock_of(client)?;
    }
    let key = unique_key("writer-pause");
    let rw = rw_lock_of(&writer)?;
    let recorded = recorder(&writer, 0, &history);
    let options = waiting(h.ttl(), h.slack());
    let guard = recorded
        .acquire_as(
            &key,
            Primitive::Write,
            rw.acquire(&key, RwMode::Write, &options),
        )
        .await?;
    let paused = Instant::now();
    // The stall lasts until both readers hold the key together.
    let read = |n: usize| {
        let client = &readers[n];
        let recorder = recorder(client, n + 1, &history);
        let (key, options) = (key.clone(), waiting(h.ttl(), takeover(h)));
        async move {
            let rw = rw_lock_of(client)?;
            let guard = recorder
                .acquire_as(
                    &key,
                    Primitive::Read,
                    rw.acquire(&key, RwMode::Read, &options),
                )
                .await?;
            Ok::<_, Failure>((recorder, guard))
        }
    };
    let (first, second) = pause_holder(writer.net.as_ref(), async {
        tokio::join!(read(0), read(1))
    })
    .await;
    let stalled = paused.elapsed();
    let read = [first?, second?];
    // The exclusion checker finds a read granted inside the stalled write's window.
    recorded.lost(&guard);
    for (recorder, guard) in read {
        recorder.release(guard).await?;
    }
    drop(guard);
    Ok(Outcome {
        detail: format!(
            "stalled {}, two readers took over together",
            millis(stalled)
        ),
        history,
    })
}
