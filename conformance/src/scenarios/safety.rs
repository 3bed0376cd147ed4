//! Safety: one holder at a time, owner-checked release and extend, fencing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_api::backend::prelude::*;
use distlock_api::{
    Capability, ExtendOutcome, FencingToken, Lease, LockError, LockGuard, LockKey, LockOptions,
    OwnerToken, ReleaseOutcome,
};
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::{check, no_wait, unique_key, waiting, Failure, LONG_TTL};
use crate::{FencedStore, Harness};

const CLIENTS: usize = 16;
const ROUNDS: usize = 50;

/// The seed story, scaled: each client withdraws 200 or 300 per round from a balance
/// that must end at exactly 500.
pub(super) async fn mutual_exclusion_under_contention(h: &dyn Harness) -> Result<String, Failure> {
    let key = unique_key("mutual-exclusion");
    let withdrawals: i64 = (0..CLIENTS)
        .map(|c| if c % 2 == 0 { 200 } else { 300 } * ROUNDS as i64)
        .sum();
    // Not an atomic: the lock alone must keep read-modify-write exact.
    let balance = Arc::new(Mutex::new(500 + withdrawals));
    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let lock = h.client().await?.lock();
        let (key, balance, inside, max_inside) = (
            key.clone(),
            balance.clone(),
            inside.clone(),
            max_inside.clone(),
        );
        let amount = if c % 2 == 0 { 200 } else { 300 };
        let options = waiting(LONG_TTL, Duration::from_secs(60));
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let guard = lock.acquire(&key, &options).await?;
                let now_inside = inside.fetch_add(1, Ordering::SeqCst) + 1;
                max_inside.fetch_max(now_inside, Ordering::SeqCst);
                let read = *balance.lock().await;
                // The round trip to the database between read and write.
                tokio::time::sleep(Duration::from_micros(200)).await;
                *balance.lock().await = read - amount;
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
        max == 1,
        "{max} holders were inside the critical section at once"
    );
    let end = *balance.lock().await;
    check!(
        end == 500,
        "balance ended at {end}, not 500: updates were lost"
    );
    Ok(format!(
        "{} grants, max 1 holder, balance 500",
        CLIENTS * ROUNDS
    ))
}

pub(super) async fn try_acquire_on_held_key_returns_held(
    h: &dyn Harness,
) -> Result<String, Failure> {
    let key = unique_key("try-held");
    let (a, b) = (h.client().await?.lock(), h.client().await?.lock());
    let guard = a.acquire(&key, &no_wait(LONG_TTL)).await?;
    let started = Instant::now();
    let second = b.try_acquire(&key, &no_wait(LONG_TTL)).await?;
    let took = started.elapsed();
    check!(second.is_none(), "try_acquire granted a key that was held");
    check!(
        took <= h.slack(),
        "try_acquire took {took:?} to report a held key"
    );
    let started = Instant::now();
    match b.acquire(&key, &no_wait(LONG_TTL)).await {
        Err(LockError::Timeout { .. }) => {}
        Err(e) => {
            return Err(Failure::Failed(format!(
                "no-wait acquire gave {e} instead of Timeout"
            )))
        }
        Ok(_) => return Err(Failure::Failed("no-wait acquire granted a held key".into())),
    }
    let no_wait_took = started.elapsed();
    check!(
        no_wait_took <= h.slack(),
        "no-wait acquire took {no_wait_took:?}"
    );
    let released = guard.release().await?;
    check!(
        released == ReleaseOutcome::Released,
        "holder's release gave {released:?}"
    );
    Ok(format!("held reported in {}", super::millis(took)))
}

/// A lease for `key` carrying an owner token nobody holds.
fn forged_lease(key: &LockKey) -> Lease {
    Lease::new(
        key.clone(),
        OwnerToken::random(),
        Some(FencingToken::new(u64::MAX)),
        LONG_TTL,
        Instant::now(),
    )
}

/// Whether a third client finds `key` held.
async fn is_held(h: &dyn Harness, key: &LockKey) -> Result<bool, Failure> {
    let probe = h.client().await?.lock();
    match probe.try_acquire(key, &no_wait(LONG_TTL)).await? {
        None => Ok(true),
        Some(guard) => {
            guard.release().await?;
            Ok(false)
        }
    }
}

pub(super) async fn release_by_non_owner_is_refused(h: &dyn Harness) -> Result<String, Failure> {
    let key = unique_key("non-owner");
    let (a, b) = (h.client().await?.lock(), h.client().await?.lock());
    let guard = a.acquire(&key, &no_wait(LONG_TTL)).await?;
    let forged = forged_lease(&key);
    let released = b.release(&forged).await?;
    check!(
        released == ReleaseOutcome::HeldByOther,
        "non-owner release gave {released:?}, expected HeldByOther"
    );
    if b.info().capabilities.mutex.extend.is_supported() {
        let extended = b.extend(&forged, LONG_TTL).await?;
        check!(
            extended == ExtendOutcome::HeldByOther,
            "non-owner extend gave {extended:?}, expected HeldByOther"
        );
    }
    check!(
        is_held(h, &key).await?,
        "the owner's lock was gone after a non-owner release"
    );
    let released = guard.release().await?;
    check!(
        released == ReleaseOutcome::Released,
        "the owner's release gave {released:?}"
    );
    Ok(String::new())
}

/// Acquires `key` with `ttl` on a new client, then waits for its lease to lapse.
async fn expired_holder(
    h: &dyn Harness,
    key: &LockKey,
    ttl: Duration,
) -> Result<
    (
        Arc<dyn distlock_api::DistributedLock>,
        distlock_api::LockGuard,
    ),
    Failure,
> {
    let lock = h.client().await?.lock();
    let guard = lock.acquire(key, &no_wait(ttl)).await?;
    tokio::time::timeout(ttl + h.slack(), guard.lost())
        .await
        .map_err(|_| Failure::Failed("lost() did not fire after the TTL".into()))?;
    Ok((lock, guard))
}

pub(super) async fn late_release_after_expiry_keeps_new_holder(
    h: &dyn Harness,
) -> Result<String, Failure> {
    let key = unique_key("late-release");
    let ttl = h.ttl();
    let (_a, stale) = expired_holder(h, &key, ttl).await?;
    let b = h.client().await?.lock();
    let fresh = b.acquire(&key, &waiting(LONG_TTL, ttl + h.slack())).await?;
    let late = stale.release().await?;
    check!(
        late != ReleaseOutcome::Released,
        "a late release reported Released while another client held the key"
    );
    check!(
        is_held(h, &key).await?,
        "a late release removed the new holder's lock (late release gave {late:?})"
    );
    let released = fresh.release().await?;
    check!(
        released == ReleaseOutcome::Released,
        "the new holder's release gave {released:?}"
    );
    Ok(format!("late release gave {late:?}"))
}

/// How long before its validity deadline the racing release is sent.
const RACE_LEAD: Duration = Duration::from_millis(40);

pub(super) async fn release_racing_expiry_keeps_new_holder(
    h: &dyn Harness,
) -> Result<String, Failure> {
    let ttl = h.ttl();
    let mut outcomes = Vec::new();
    // A few rounds: the race window is narrow by nature.
    for _ in 0..3 {
        let key = unique_key("release-race");
        let (a, b) = (h.client().await?.lock(), h.client().await?.lock());
        let stale = a.acquire(&key, &no_wait(ttl)).await?;
        let release_at = stale.valid_until() - RACE_LEAD;
        let waiter = {
            let key = key.clone();
            let options = waiting(LONG_TTL, ttl * 2 + h.slack());
            tokio::spawn(async move { b.acquire(&key, &options).await })
        };
        tokio::time::sleep_until(release_at).await;
        let late = stale.release().await?;
        let fresh = waiter
            .await
            .map_err(|e| Failure::Failed(format!("waiter panicked: {e}")))??;
        check!(is_held(h, &key).await?, "a release sent {RACE_LEAD:?} before expiry removed the waiter's lock (release gave {late:?})");
        let released = fresh.release().await?;
        check!(
            released == ReleaseOutcome::Released,
            "the waiter's release gave {released:?}"
        );
        outcomes.push(format!("{late:?}"));
    }
    Ok(format!("racing releases gave {}", outcomes.join(", ")))
}

pub(super) async fn late_extend_after_expiry_fails_as_lost(
    h: &dyn Harness,
) -> Result<String, Failure> {
    let ttl = h.ttl();
    // Nobody took the key.
    let key = unique_key("late-extend-free");
    let (_a, stale) = expired_holder(h, &key, ttl).await?;
    match stale.extend(LONG_TTL).await {
        Ok(ExtendOutcome::Expired | ExtendOutcome::HeldByOther | ExtendOutcome::Lost) => {}
        other => {
            return Err(Failure::Failed(format!(
                "extend after expiry gave {other:?}"
            )))
        }
    }
    check!(
        stale.state() == distlock_api::LeaseState::Lost,
        "state after a failed extend is {:?}",
        stale.state()
    );
    let probe = h.client().await?.lock();
    let after = probe
        .acquire(&key, &waiting(LONG_TTL, h.slack()))
        .await
        .map_err(|e| Failure::Failed(format!("a refused extend left the expired key held: {e}")))?;
    after.release().await?;
    // Another client took the key.
    let key = unique_key("late-extend-taken");
    let (a, stale) = expired_holder(h, &key, ttl).await?;
    let b = h.client().await?.lock();
    let fresh = b.acquire(&key, &waiting(ttl, ttl + h.slack())).await?;
    let fresh_deadline = fresh.valid_until();
    // Straight to the backend: the guard alone would refuse a lost lease without asking.
    let direct = a.extend(stale.lease(), LONG_TTL).await?;
    check!(
        matches!(direct, ExtendOutcome::HeldByOther | ExtendOutcome::Expired),
        "the backend extended a lease over a new holder: {direct:?}"
    );
    match stale.extend(LONG_TTL).await {
        Ok(ExtendOutcome::HeldByOther | ExtendOutcome::Expired | ExtendOutcome::Lost) => {}
        other => {
            return Err(Failure::Failed(format!(
                "extend over a new holder gave {other:?}"
            )))
        }
    }
    // The stale extend must not have lengthened the new holder's lease: it still
    // lapses at its own deadline.
    tokio::time::sleep_until(fresh_deadline).await;
    let c = h.client().await?.lock();
    let after = c
        .acquire(&key, &waiting(ttl, h.slack()))
        .await
        .map_err(|e| {
            Failure::Failed(format!(
                "the new holder's lease outlived its TTL after a stale extend: {e}"
            ))
        })?;
    after.release().await?;
    drop(fresh);
    Ok(String::new())
}

/// The token of a grant on a backend that reports fencing supported, which must have one.
fn token_of(guard: &LockGuard) -> Result<FencingToken, Failure> {
    guard.fencing_token().ok_or_else(|| {
        Failure::Failed(
            "a grant carried no fencing token, although the backend reports fencing supported"
                .into(),
        )
    })
}

pub(super) async fn fencing_token_iff_fencing_supported(
    h: &dyn Harness,
) -> Result<String, Failure> {
    let key = unique_key("token-presence");
    let lock = h.client().await?.lock();
    let fencing = lock.info().capabilities.mutex.fencing;
    let waited = lock.acquire(&key, &waiting(LONG_TTL, h.slack())).await?;
    let by_acquire = waited.fencing_token();
    waited.release().await?;
    let tried = lock
        .try_acquire(&key, &no_wait(LONG_TTL))
        .await?
        .ok_or_else(|| Failure::Failed("try-acquire found a just released key held".into()))?;
    let by_try = tried.fencing_token();
    tried.release().await?;
    for (how, token) in [("acquire", by_acquire), ("try-acquire", by_try)] {
        match (fencing, token) {
            (Capability::Supported, None) => {
                return Err(Failure::Failed(format!(
                    "the backend reports fencing supported, but a grant by {how} carried no token"
                )))
            }
            (Capability::Unsupported(why), Some(token)) => {
                return Err(Failure::Failed(format!(
                    "a grant by {how} carried token {token}, although the backend reports fencing unsupported ({why}): callers would trust a token that is not ordered"
                )))
            }
            _ => {}
        }
    }
    Ok(match (by_acquire, by_try) {
        (Some(a), Some(b)) => format!("fencing supported: tokens {a} and {b}"),
        _ => "fencing unsupported: no token".to_owned(),
    })
}

pub(super) async fn fencing_tokens_strictly_increase(h: &dyn Harness) -> Result<String, Failure> {
    let key = unique_key("fencing");
    let mut last: Option<FencingToken> = None;
    for round in 0..10 {
        let lock = h.client().await?.lock();
        let guard = lock.acquire(&key, &waiting(LONG_TTL, h.slack())).await?;
        let token = token_of(&guard)?;
        if let Some(previous) = last {
            check!(
                token > previous,
                "grant {round} got token {token}, not above {previous}"
            );
        }
        last = Some(token);
        guard.release().await?;
    }
    Ok(format!(
        "10 grants, last token {}",
        last.map_or(0, |t| t.get())
    ))
}

pub(super) async fn fenced_store_rejects_stale_holder(h: &dyn Harness) -> Result<String, Failure> {
    let key = unique_key("fenced-store");
    let ttl = h.ttl();
    let store = FencedStore::new("initial");
    let a = h.client().await?.lock();
    let stale = a.acquire(&key, &no_wait(ttl)).await?;
    let stale_token = token_of(&stale)?;
    // The holder pauses past its lease.
    tokio::time::timeout(ttl + h.slack(), stale.lost())
        .await
        .map_err(|_| Failure::Failed("lost() did not fire after the TTL".into()))?;
    let b = h.client().await?.lock();
    let fresh = b.acquire(&key, &waiting(LONG_TTL, ttl + h.slack())).await?;
    let fresh_token = token_of(&fresh)?;
    check!(
        fresh_token > stale_token,
        "takeover token {fresh_token} is not above the stale {stale_token}"
    );
    store
        .write(fresh_token, "from the new holder")
        .map_err(|e| Failure::Failed(format!("the new holder's write was refused: {e}")))?;
    check!(
        store.write(stale_token, "from the stale holder").is_err(),
        "the fenced store accepted the stale write"
    );
    check!(
        store.read() == "from the new holder",
        "the stale holder's write landed"
    );
    fresh.release().await?;
    drop(stale);
    Ok(format!("stale {stale_token} < fresh {fresh_token}"))
}

pub(super) async fn different_keys_are_independent(h: &dyn Harness) -> Result<String, Failure> {
    let base = unique_key("independent");
    let variants = [
        base.to_string(),
        base.to_string().to_uppercase(),
        format!("{base}2"),
        base.as_str()[..base.as_str().len() - 1].to_owned(),
        format!("{base}/.."),
        format!("{base}/../x"),
        format!("{base} with space"),
        format!("{base}/🔒"),
    ];
    let mut guards = Vec::new();
    for (i, variant) in variants.iter().enumerate() {
        let key = LockKey::new(variant)
            .map_err(|e| Failure::Failed(format!("valid key {variant:?} refused: {e}")))?;
        let lock = h.client().await?.lock();
        match lock.try_acquire(&key, &LockOptions::new(LONG_TTL)).await? {
            Some(guard) => guards.push(guard),
            None => {
                return Err(Failure::Failed(format!(
                    "key #{i} {variant:?} was held by a lock on a different key"
                )))
            }
        }
    }
    for guard in guards {
        let released = guard.release().await?;
        check!(
            released == ReleaseOutcome::Released,
            "release gave {released:?}"
        );
    }
    Ok(format!("{} distinct keys held at once", variants.len()))
}
