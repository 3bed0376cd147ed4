//! Several keys at once: all or nothing, in an order that cannot deadlock, and as
//! valid as the weakest part.

use std::time::Duration;

use distlock_api::{LockError, LockKey, LockOptions};
use tokio::time::Instant;

use super::{check, millis, no_wait, unique_key, waiting, Failure, LONG_TTL};
use crate::Harness;

/// Rounds of the deadlock check.
const ROUNDS: usize = 10;

fn three_keys(label: &str) -> Vec<LockKey> {
    let base = unique_key(label);
    ["a", "b", "c"]
        .iter()
        .filter_map(|part| LockKey::new(format!("{base}/{part}")).ok())
        .collect()
}

pub(super) async fn multi_key_overlapping_sets_never_deadlock(
    h: &dyn Harness,
) -> Result<String, Failure> {
    let (a, b) = (h.client().await?.lock(), h.client().await?.lock());
    let limit = h.slack() * 5;
    let started = Instant::now();
    for round in 0..ROUNDS {
        let forward = three_keys("multi-deadlock");
        let backward: Vec<LockKey> = forward.iter().rev().cloned().collect();
        let take = |lock: std::sync::Arc<dyn distlock_api::DistributedLock>, keys: Vec<LockKey>| async move {
            let held = lock.acquire_all(&keys, &waiting(LONG_TTL, limit)).await?;
            tokio::time::sleep(Duration::from_millis(10)).await;
            held.release().await?;
            Ok::<_, LockError>(())
        };
        let (x, y) = tokio::join!(take(a.clone(), forward), take(b.clone(), backward));
        for (who, result) in [("forward", x), ("backward", y)] {
            check!(
                result.is_ok(),
                "round {round}: the set named {who} was not taken within {limit:?} while another client took the same keys named the other way: {result:?}"
            );
        }
    }
    Ok(format!(
        "{ROUNDS} rounds of two clients taking three keys named in opposite orders, in {}",
        millis(started.elapsed())
    ))
}

pub(super) async fn multi_key_timeout_leaves_nothing_held(
    h: &dyn Harness,
) -> Result<String, Failure> {
    let keys = three_keys("multi-timeout");
    let (taker, blocker, observer) = (
        h.client().await?.lock(),
        h.client().await?.lock(),
        h.client().await?.lock(),
    );
    let blocked = blocker.acquire(&keys[1], &no_wait(LONG_TTL)).await?;
    let wait = Duration::from_millis(300);
    match taker.acquire_all(&keys, &waiting(LONG_TTL, wait)).await {
        Err(LockError::Timeout { .. }) => {}
        other => {
            return Err(Failure::Failed(format!(
                "a set with one key held elsewhere gave {other:?}, not a timeout"
            )))
        }
    }
    let tried = taker.try_acquire_all(&keys, &no_wait(LONG_TTL)).await?;
    check!(
        tried.is_none(),
        "a try of a set with one key held elsewhere was granted"
    );
    for free in [&keys[0], &keys[2]] {
        let taken = observer.try_acquire(free, &no_wait(LONG_TTL)).await?;
        check!(
            taken.is_some(),
            "{free} was left held after the set's acquire gave up"
        );
        if let Some(guard) = taken {
            guard.release().await?;
        }
    }
    let still = observer.try_acquire(&keys[1], &no_wait(LONG_TTL)).await?;
    check!(
        still.is_none(),
        "the blocker's key was freed by the set's clean-up"
    );
    blocked.release().await?;
    Ok("a timed-out and a refused set left its other keys free".to_owned())
}

pub(super) async fn multi_key_lost_part_fires_lost(h: &dyn Harness) -> Result<String, Failure> {
    let keys = three_keys("multi-lost");
    let (taker, observer) = (h.client().await?.lock(), h.client().await?.lock());
    let ttl = h.ttl();
    let held = taker
        .acquire_all(&keys[..2], &LockOptions::new(ttl))
        .await?;
    check!(
        keys[..2]
            .iter()
            .all(|k| held.fencing_token(k) == held.get(k).and_then(|g| g.fencing_token())),
        "a part's token is not readable by its key"
    );
    let kept = held
        .get(&keys[0])
        .ok_or_else(|| Failure::Failed("the set lacks its first key".to_owned()))?;
    kept.extend(LONG_TTL).await?;
    let deadline = held
        .get(&keys[1])
        .map(|g| g.valid_until())
        .ok_or_else(|| Failure::Failed("the set lacks its second key".to_owned()))?;
    let bound = ttl + h.slack();
    let fired = tokio::time::timeout(bound, held.lost()).await;
    check!(
        fired.is_ok(),
        "lost() did not fire within {bound:?} of a part running out"
    );
    check!(
        Instant::now() >= deadline,
        "lost() fired before the unrenewed part's validity deadline"
    );
    let kept_held = observer.try_acquire(&keys[0], &no_wait(LONG_TTL)).await?;
    check!(
        kept_held.is_none(),
        "the renewed part was freed with the lost one"
    );
    drop(held);
    Ok(format!(
        "lost() fired once the unrenewed part of {ttl:?} ran out"
    ))
}
