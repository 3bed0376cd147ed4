//! The metric names every backend reports under, and the functions that record them
//! (see [`crate::observe`] for where each is recorded).

use std::time::Duration;

use crate::LockKey;

/// Histogram, seconds: how long each successful `acquire`/`try_acquire` call took,
/// waiting included.
pub const ACQUIRE_SECONDS: &str = "distlock_acquire_seconds";
/// Histogram, seconds: how long an `acquire` that found the key held waited, whether it
/// got the lock in the end or timed out.
pub const WAIT_SECONDS: &str = "distlock_wait_seconds";
/// Histogram, seconds: how long a lock was held, from the grant request until the
/// guard was released or dropped.
pub const HOLD_SECONDS: &str = "distlock_hold_seconds";
/// Counter: acquire attempts that found the key held by another owner.
pub const CONTENTION_TOTAL: &str = "distlock_contention_total";
/// Counter: successful lease renewals (watchdog or [`crate::LockGuard::extend`]).
pub const RENEWALS_TOTAL: &str = "distlock_renewals_total";
/// Counter: renewals that failed (an error, or the backend refused).
pub const RENEWAL_FAILURES_TOTAL: &str = "distlock_renewal_failures_total";
/// Counter: guards that ended with their lease lost (counted once, when the guard is
/// released or dropped).
pub const LOST_TOTAL: &str = "distlock_lost_total";
/// The one label on every metric: the backend's name from [`BackendInfo::name`](crate::BackendInfo::name).
pub const BACKEND_LABEL: &str = "backend";

/// A successful acquire that took `took`.
pub(crate) fn acquired(backend: &'static str, took: Duration) {
    metrics::histogram!(ACQUIRE_SECONDS, BACKEND_LABEL => backend).record(took);
    tracing::debug!(took = ?took, "acquired");
}

/// An acquire attempt that found the key held.
pub(crate) fn contended(backend: &'static str) {
    metrics::counter!(CONTENTION_TOTAL, BACKEND_LABEL => backend).increment(1);
    tracing::debug!("key held by another owner");
}

/// A renewal (watchdog or explicit extend) succeeded or failed.
pub(crate) fn renewal(backend: &'static str, ok: bool) {
    if ok {
        metrics::counter!(RENEWALS_TOTAL, BACKEND_LABEL => backend).increment(1);
    } else {
        metrics::counter!(RENEWAL_FAILURES_TOTAL, BACKEND_LABEL => backend).increment(1);
    }
}

/// A guard ended (release or drop) after holding for `held`; `lost` if its lease was.
pub(crate) fn guard_ended(backend: &'static str, key: &LockKey, held: Duration, lost: bool) {
    metrics::histogram!(HOLD_SECONDS, BACKEND_LABEL => backend).record(held);
    if lost {
        metrics::counter!(LOST_TOTAL, BACKEND_LABEL => backend).increment(1);
        tracing::warn_span!("lost", backend, key = %key).in_scope(
            || tracing::warn!(held = ?held, "the lease was lost while the lock was held"),
        );
    }
}
