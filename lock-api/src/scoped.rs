//! [`with_lock`]: run a piece of work while holding a lock.

use std::future::Future;

use crate::{
    AutoRenew, DistributedLock, FencingToken, LockError, LockKey, LockOptions, NotHeldReason,
    ReleaseOutcome,
};

/// Takes `key`, runs `work` with the grant's fencing token while the lease is renewed,
/// and releases the lock when `work` finishes.
///
/// The token is `None` on backends that cannot promise ordered tokens
/// ([`Guarantees::fencing`](crate::Guarantees::fencing) unsupported, as on Redlock);
/// [`Lease::fencing_token`](crate::Lease::fencing_token) says what to do instead.
///
/// If `options` has no auto-renew, the default watchdog (every TTL/3) is turned on. If
/// the lock is lost while `work` runs, `work` is dropped (stopped at its next await
/// point) and the call fails.
///
/// # Errors
/// Whatever `acquire` returns; [`LockError::NotHeld`] with [`NotHeldReason::Lost`] when
/// the lock was lost during the work, or with the release's finding when the lease was
/// gone by the time the work ended.
pub async fn with_lock<F, Fut, T>(
    lock: &dyn DistributedLock,
    key: &LockKey,
    options: &LockOptions,
    work: F,
) -> Result<T, LockError>
where
    F: FnOnce(Option<FencingToken>) -> Fut,
    Fut: Future<Output = T>,
{
    let renewing;
    let options = if options.auto_renew().is_some() {
        options
    } else {
        renewing = options.clone().with_auto_renew(AutoRenew::new());
        &renewing
    };
    let guard = lock.acquire(key, options).await?;
    let backend = lock.info().name;
    let not_held = |reason| LockError::NotHeld {
        backend,
        key: key.clone(),
        reason,
    };
    let output = tokio::select! {
        biased;
        _ = guard.lost() => return Err(not_held(NotHeldReason::Lost)),
        output = work(guard.fencing_token()) => output,
    };
    match guard.release().await? {
        ReleaseOutcome::Released => Ok(output),
        ReleaseOutcome::Expired => Err(not_held(NotHeldReason::Expired)),
        ReleaseOutcome::HeldByOther => Err(not_held(NotHeldReason::HeldByOther)),
    }
}
