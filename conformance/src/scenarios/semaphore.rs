//! Semaphore scenarios: never more than `max` permits out, permits come back from
//! dropped, crashed and cancelled holders, and bad counts are typed errors.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_api::{LockError, LockGuard, LockOptions, WaitPolicy, MAX_PERMITS};
use tokio::time::Instant;

use super::{check, millis, no_wait, unique_key, waiting, Failure, LONG_TTL};
use crate::Harness;

const PERMITS: u32 = 3;

pub(super) async fn semaphore_grants_exactly_max(h: &dyn Harness) -> Result<String, Failure> {
    let key = unique_key("semaphore-max");
    let mut held: Vec<LockGuard> = Vec::new();
    for n in 0..PERMITS {
        let semaphore = h.client().await?.semaphore();
        let guard = semaphore
            .try_acquire(&key, PERMITS, &no_wait(LONG_TTL))
            .await?;
        let Some(guard) = guard else {
            return Err(Failure::Failed(format!(
                "permit {} of {PERMITS} was refused with only {n} held",
                n + 1
            )));
        };
        held.push(guard);
    }
    let extra = h.client().await?.semaphore();
    let refused = extra.try_acquire(&key, PERMITS, &no_wait(LONG_TTL)).await?;
    check!(
        refused.is_none(),
        "a try-acquire got permit {} of {PERMITS}",
        PERMITS + 1
    );
    match extra.acquire(&key, PERMITS, &no_wait(LONG_TTL)).await {
        Err(LockError::Timeout { .. }) => {}
        Ok(_) => {
            return Err(Failure::Failed(format!(
                "a no-wait acquire got permit {} of {PERMITS}",
                PERMITS + 1
            )))
        }
        Err(e) => return Err(e.into()),
    }
    let first = held.remove(0);
    first.release().await?;
    let taken = extra.try_acquire(&key, PERMITS, &no_wait(LONG_TTL)).await?;
    check!(
        taken.is_some(),
        "after a release the freed permit was refused"
    );
    for guard in held.into_iter().chain(taken) {
        guard.release().await?;
    }
    Ok(format!(
        "{PERMITS} granted, the next refused, one more after a release"
    ))
}

const CLIENTS: usize = 8;
const ROUNDS: usize = 10;

pub(super) async fn semaphore_never_admits_more_than_max(
    h: &dyn Harness,
) -> Result<String, Failure> {
    let key = unique_key("semaphore-contention");
    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let semaphore = h.client().await?.semaphore();
        let (key, inside, max_inside) = (key.clone(), inside.clone(), max_inside.clone());
        let options = waiting(LONG_TTL, Duration::from_secs(60));
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = semaphore.acquire(&key, PERMITS, &options).await?;
                let now_inside = inside.fetch_add(1, Ordering::SeqCst) + 1;
                max_inside.fetch_max(now_inside, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().await?;
            }
            Ok::<_, LockError>(())
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| Failure::Failed(format!("client task panicked: {e}")))??;
    }
    let max = max_inside.load(Ordering::SeqCst);
    check!(
        max <= PERMITS as usize,
        "{max} holders of a {PERMITS}-permit semaphore were inside at once"
    );
    Ok(format!(
        "{} grants, at most {max} of {PERMITS} inside at once",
        CLIENTS * ROUNDS
    ))
}

pub(super) async fn semaphore_dropped_permit_is_freed(h: &dyn Harness) -> Result<String, Failure> {
    let key = unique_key("semaphore-drop");
    let (a, b) = (h.client().await?.semaphore(), h.client().await?.semaphore());
    let first = a.try_acquire(&key, 2, &no_wait(LONG_TTL)).await?;
    let second = a.try_acquire(&key, 2, &no_wait(LONG_TTL)).await?;
    let (Some(first), Some(second)) = (first, second) else {
        return Err(Failure::Failed(
            "2 permits of 2 were not both granted".into(),
        ));
    };
    let dropped_at = Instant::now();
    drop(second);
    let taken = b
        .acquire(&key, 2, &waiting(LONG_TTL, h.slack()))
        .await
        .map_err(|e| {
            Failure::Failed(format!(
                "a dropped permit was not freed within {:?}: {e}",
                h.slack()
            ))
        })?;
    let took = dropped_at.elapsed();
    taken.release().await?;
    first.release().await?;
    Ok(format!("freed {} after drop", millis(took)))
}

pub(super) async fn semaphore_crashed_holder_is_freed(h: &dyn Harness) -> Result<String, Failure> {
    let key = unique_key("semaphore-crash");
    let ttl = h.ttl();
    let a = h.client().await?;
    let Some(faults) = a.faults.clone() else {
        return Err(Failure::Skipped("the harness cannot crash a client".into()));
    };
    let crashing = a.semaphore();
    let Some(guard) = crashing.try_acquire(&key, 1, &no_wait(ttl)).await? else {
        return Err(Failure::Failed(
            "the only permit of a free key was refused".into(),
        ));
    };
    let (granted, valid_until) = (guard.lease().acquired_at(), guard.valid_until());
    faults.crash().await?;
    drop(guard);
    let bound = h.crash_bound(ttl) + h.slack();
    let b = h.client().await?.semaphore();
    let taken = b
        .acquire(&key, 1, &waiting(LONG_TTL, bound))
        .await
        .map_err(|e| {
            Failure::Failed(format!(
                "the crashed holder's permit was not freed within {bound:?}: {e}"
            ))
        })?;
    let taken_at = Instant::now();
    check!(
        taken_at >= valid_until,
        "another client got the permit {:?} before the crashed holder's validity ended",
        valid_until - taken_at
    );
    taken.release().await?;
    Ok(format!(
        "freed {} after the grant",
        millis(taken_at - granted)
    ))
}

pub(super) async fn semaphore_cancelled_acquire_leaks_nothing(
    h: &dyn Harness,
) -> Result<String, Failure> {
    let key = unique_key("semaphore-cancel");
    let (a, b, c) = (
        h.client().await?.semaphore(),
        h.client().await?.semaphore(),
        h.client().await?.semaphore(),
    );
    let forever = LockOptions::new(LONG_TTL).with_wait(WaitPolicy::Forever);
    // Uncontended: with one of 2 permits held, cut the acquire of the other short after
    // 0, 0.1 ms, 0.2 ms, … of progress.
    let Some(holder) = a.try_acquire(&key, 2, &no_wait(LONG_TTL)).await? else {
        return Err(Failure::Failed("a permit of a free key was refused".into()));
    };
    for step in 0..25u32 {
        let cut = Duration::from_micros(100) * step;
        let _ = tokio::time::timeout(cut, b.acquire(&key, 2, &forever)).await;
        // A grant that arrived as the future was dropped is released in the background.
        let probe = c
            .acquire(&key, 2, &waiting(LONG_TTL, h.slack()))
            .await
            .map_err(|e| {
                Failure::Failed(format!(
                    "after an acquire cut at {cut:?} the free permit stayed taken: {e}"
                ))
            })?;
        probe.release().await?;
    }
    // Contended: waiters dropped while every permit is held must not take one later.
    // The wait covers the last cut acquire: a permit it won as it was dropped is
    // released in the background, within the slack.
    let other = c
        .acquire(&key, 2, &waiting(LONG_TTL, h.slack()))
        .await
        .map_err(|e| Failure::Failed(format!("the second permit was refused: {e}")))?;
    for _ in 0..5 {
        match tokio::time::timeout(Duration::from_millis(20), b.acquire(&key, 2, &forever)).await {
            Err(_elapsed) => {}
            Ok(Ok(_)) => return Err(Failure::Failed("a waiter got a third permit of 2".into())),
            Ok(Err(e)) => return Err(e.into()),
        }
    }
    holder.release().await?;
    other.release().await?;
    let both = (
        c.acquire(&key, 2, &waiting(LONG_TTL, h.slack())).await,
        a.acquire(&key, 2, &waiting(LONG_TTL, h.slack())).await,
    );
    let (Ok(first), Ok(second)) = both else {
        return Err(Failure::Failed(
            "after cancelled waits both permits could not be taken again: one leaked".into(),
        ));
    };
    first.release().await?;
    second.release().await?;
    Ok("25 uncontended and 5 queued permit acquires cancelled".into())
}

pub(super) async fn semaphore_bad_counts_are_typed_errors(
    h: &dyn Harness,
) -> Result<String, Failure> {
    let key = unique_key("semaphore-bad");
    let (a, b) = (h.client().await?.semaphore(), h.client().await?.semaphore());
    for bad in [0, MAX_PERMITS + 1, u32::MAX] {
        let tried = a.try_acquire(&key, bad, &no_wait(LONG_TTL)).await;
        check!(
            matches!(tried, Err(LockError::InvalidOptions { .. })),
            "try-acquire with {bad} permits gave {tried:?}, not InvalidOptions"
        );
        let waited = a.acquire(&key, bad, &no_wait(LONG_TTL)).await;
        check!(
            matches!(waited, Err(LockError::InvalidOptions { .. })),
            "acquire with {bad} permits gave {waited:?}, not InvalidOptions"
        );
    }
    let Some(holder) = a.try_acquire(&key, 3, &no_wait(LONG_TTL)).await? else {
        return Err(Failure::Failed("a permit of a free key was refused".into()));
    };
    for other in [2, 4] {
        let tried = b.try_acquire(&key, other, &no_wait(LONG_TTL)).await;
        check!(
            matches!(tried, Err(LockError::PermitMismatch { .. })),
            "try-acquire with {other} permits on a key held with 3 gave {tried:?}, not PermitMismatch"
        );
        let waited = b
            .acquire(&key, other, &waiting(LONG_TTL, Duration::from_millis(200)))
            .await;
        check!(
            matches!(waited, Err(LockError::PermitMismatch { .. })),
            "acquire with {other} permits on a key held with 3 gave {waited:?}, not PermitMismatch"
        );
    }
    // Nothing was taken by the refused calls: the other two permits of 3 are free.
    let second = b.try_acquire(&key, 3, &no_wait(LONG_TTL)).await?;
    let third = b.try_acquire(&key, 3, &no_wait(LONG_TTL)).await?;
    check!(
        second.is_some() && third.is_some(),
        "after refused mismatched acquires the key's free permits were not free"
    );
    holder.release().await?;
    for guard in second.into_iter().chain(third) {
        guard.release().await?;
    }
    // Unused now: a new count is the key's.
    let renewed = b
        .acquire(&key, 4, &waiting(LONG_TTL, h.slack()))
        .await
        .map_err(|e| Failure::Failed(format!("a new count on an unused key was refused: {e}")))?;
    renewed.release().await?;
    Ok(
        "0, MAX_PERMITS + 1 and u32::MAX refused; 2 and 4 on a 3-permit key refused as a mismatch"
            .into(),
    )
}
