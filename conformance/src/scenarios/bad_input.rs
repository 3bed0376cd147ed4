//! Bad input: typed errors, no panic, nothing left held.

use std::time::Duration;

use distlock_api::{
    Backoff, KeyError, LockError, LockKey, LockOptions, ReleaseOutcome, WaitPolicy, MAX_KEY_LEN,
};
use tokio::time::Instant;

use super::{check, no_wait, unique_key, Failure, LONG_TTL};
use crate::Harness;

pub(super) async fn bad_keys_are_typed_errors(h: &dyn Harness) -> Result<String, Failure> {
    type IsExpected = fn(&KeyError) -> bool;
    let cases: [(&str, String, IsExpected); 3] = [
        ("empty", String::new(), |e| matches!(e, KeyError::Empty)),
        ("NUL", "a\0b".to_owned(), |e| {
            matches!(e, KeyError::ContainsNul { .. })
        }),
        ("1 MB", "k".repeat(1 << 20), |e| {
            matches!(e, KeyError::TooLong { .. })
        }),
    ];
    for (label, key, expected) in cases {
        match LockKey::new(&key) {
            Err(e) if expected(&e) => {
                let as_lock_error = LockError::from(e);
                check!(
                    matches!(as_lock_error, LockError::InvalidKey { .. }),
                    "{label} key: wrong LockError variant"
                );
            }
            other => return Err(Failure::Failed(format!("{label} key gave {other:?}"))),
        }
    }
    // The longest valid key, path-like and unicode keys all work end to end.
    let lock = h.client().await?.lock();
    let base = unique_key("bad-keys");
    let longest = format!(
        "{base}/{}",
        "é".repeat((MAX_KEY_LEN - base.as_str().len() - 1) / 2)
    );
    for raw in [
        longest,
        format!("{base}/../.."),
        format!("{base}/ünï cødé ✓"),
    ] {
        let key =
            LockKey::new(&raw).map_err(|e| Failure::Failed(format!("valid key refused: {e}")))?;
        let guard = lock
            .try_acquire(&key, &no_wait(LONG_TTL))
            .await?
            .ok_or_else(|| Failure::Failed(format!("fresh key {raw:?} was held")))?;
        check!(
            guard.release().await? == ReleaseOutcome::Released,
            "release of {raw:?} failed"
        );
    }
    Ok(String::new())
}

pub(super) async fn bad_options_are_typed_errors(h: &dyn Harness) -> Result<String, Failure> {
    let key = unique_key("bad-options");
    let lock = h.client().await?.lock();
    let bad = [
        ("zero ttl", LockOptions::new(Duration::ZERO)),
        (
            "sub-minimum ttl",
            LockOptions::new(Duration::from_micros(500)),
        ),
        ("huge ttl", LockOptions::new(Duration::from_secs(u64::MAX))),
        (
            "zero backoff",
            LockOptions::new(LONG_TTL).with_backoff(Backoff::new(Duration::ZERO, Duration::ZERO)),
        ),
    ];
    for (label, options) in &bad {
        match lock.acquire(&key, options).await {
            Err(LockError::InvalidOptions { .. }) => {}
            other => {
                return Err(Failure::Failed(format!(
                    "acquire with {label} gave {other:?}"
                )))
            }
        }
        match lock.try_acquire(&key, options).await {
            Err(LockError::InvalidOptions { .. }) => {}
            other => {
                return Err(Failure::Failed(format!(
                    "try_acquire with {label} gave {other:?}"
                )))
            }
        }
    }
    let guard = lock
        .try_acquire(&key, &no_wait(LONG_TTL))
        .await?
        .ok_or_else(|| Failure::Failed("refused options left the key held".into()))?;
    for ttl in [Duration::ZERO, Duration::from_secs(u64::MAX)] {
        match lock.extend(guard.lease(), ttl).await {
            Err(LockError::InvalidOptions { .. } | LockError::Unsupported { .. }) => {}
            other => return Err(Failure::Failed(format!("extend by {ttl:?} gave {other:?}"))),
        }
    }
    guard.release().await?;
    Ok(String::new())
}

pub(super) async fn zero_and_enormous_waits(h: &dyn Harness) -> Result<String, Failure> {
    let key = unique_key("waits");
    let (a, b) = (h.client().await?.lock(), h.client().await?.lock());
    let holder = a.acquire(&key, &no_wait(LONG_TTL)).await?;
    let started = Instant::now();
    let zero = LockOptions::new(LONG_TTL).with_wait(WaitPolicy::Timeout(Duration::ZERO));
    match b.acquire(&key, &zero).await {
        Err(LockError::Timeout { .. }) => {}
        other => {
            return Err(Failure::Failed(format!(
                "zero wait on a held key gave {other:?}"
            )))
        }
    }
    check!(
        started.elapsed() <= h.slack(),
        "zero wait took {:?}",
        started.elapsed()
    );
    holder.release().await?;
    let enormous = LockOptions::new(LONG_TTL).with_wait(WaitPolicy::Timeout(Duration::MAX));
    let guard = tokio::time::timeout(h.slack(), b.acquire(&key, &enormous))
        .await
        .map_err(|_| Failure::Failed("an enormous wait on a free key hung".into()))??;
    guard.release().await?;
    Ok(String::new())
}

pub(super) async fn release_twice_is_a_typed_outcome(h: &dyn Harness) -> Result<String, Failure> {
    let key = unique_key("release-twice");
    let lock = h.client().await?.lock();
    let guard = lock.acquire(&key, &no_wait(LONG_TTL)).await?;
    let lease = guard.lease().clone();
    let first = guard.release().await?;
    check!(
        first == ReleaseOutcome::Released,
        "first release gave {first:?}"
    );
    let second = lock.release(&lease).await?;
    check!(
        second == ReleaseOutcome::Expired,
        "second release gave {second:?}, expected Expired"
    );
    if lock.info().capabilities.mutex.extend.is_supported() {
        let extended = lock.extend(&lease, LONG_TTL).await?;
        check!(
            extended == distlock_api::ExtendOutcome::Expired,
            "extend after release gave {extended:?}"
        );
    }
    let again = lock
        .try_acquire(&key, &no_wait(LONG_TTL))
        .await?
        .ok_or_else(|| Failure::Failed("the key was held after a double release".into()))?;
    again.release().await?;
    Ok(String::new())
}

pub(super) async fn invalid_urls_are_config_errors(h: &dyn Harness) -> Result<String, Failure> {
    let Some(connect) = h.url_connector() else {
        return Err(Failure::Skipped("the harness has no URL connector".into()));
    };
    let urls = [
        "",
        "   ",
        "not a url",
        "://nothing",
        "nosuchscheme://host:1",
        "memory",
    ];
    for url in urls {
        match connect(url.to_owned()).await {
            Err(LockError::Config { .. }) => {}
            Err(e) => {
                return Err(Failure::Failed(format!(
                    "{url:?} gave {e}, not a configuration error"
                )))
            }
            Ok(_) => return Err(Failure::Failed(format!("{url:?} connected"))),
        }
    }
    Ok(format!("{} malformed URLs refused", urls.len()))
}
