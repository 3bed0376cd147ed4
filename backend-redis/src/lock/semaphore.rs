//! The semaphore on one Redis node (direct, Sentinel or Cluster), sharing the mutex
//! client's connection, wake-ups and waiter lines.
//!
//! Layout, for a key `K` (every name under the mutex's hash tag `{K}`, see
//! [`crate::KeyNames`]): `{K}:semaphore` is a sorted set of the permit holders' owner
//! tokens scored by the server time (ms) at which each expires; `{K}:semaphore:permits`
//! holds the permit count the holders use. One Lua script drops expired holders and
//! grants a permit when fewer than the count hold one, refusing another count with
//! [`LockError::PermitMismatch`]; both keys expire with the longest-lived holder, and
//! the count goes with the last holder, so the next caller's count becomes the key's.
//! Waiting is the mutex's: `{K}:semaphore:waiting` marks a waited-on key, so a release
//! publishes on `{K}:semaphore:released` only then.
//!
//! Each permit carries a fencing token from the mutex's counter
//! ([`crate::node::Node::fence`], see the crate docs): a permit's token is above every
//! earlier grant's, so it orders and identifies grants; several permits are valid at
//! once, so it cannot fence off an older holder.

use std::time::Duration;

use distlock_api::backend::{Grant, Request};
use distlock_api::{ExtendOutcome, Lease, LockError, PermitMismatch, Primitive, ReleaseOutcome};

use super::primitive::{self, Scripts};
use super::RedisLock;
use crate::keys::{self, KeyNames};
use crate::scripts::semaphore as script;

static SCRIPTS: Scripts = Scripts {
    primitive: Primitive::Semaphore,
    acquire: &script::ACQUIRE,
    release: &script::RELEASE,
    extend: &script::EXTEND,
};

fn names(key: &distlock_api::LockKey) -> KeyNames {
    KeyNames::for_primitive(key, keys::Primitive::Semaphore)
}

/// One permit of `request.key`'s semaphore of `max` permits, waiting as the mutex does.
///
/// # Errors
/// [`LockError::PermitMismatch`] when the key's holders use another count; connection
/// and backend errors.
pub(crate) async fn acquire(
    lock: &RedisLock,
    request: &Request<'_>,
    max: u32,
) -> Result<Option<Grant>, LockError> {
    let (key, options) = (request.key, request.options);
    let names = &names(key);
    lock.contend(request, names, |waiting| async move {
        let answer = primitive::attempt(lock, key, names, options, &SCRIPTS, waiting, |cmd| {
            cmd.arg(max);
        })
        .await?;
        answer.into_attempt(|in_use| LockError::PermitMismatch {
            backend: lock.name(),
            source: PermitMismatch::new(
                key.clone(),
                max,
                u32::try_from(in_use).unwrap_or(u32::MAX),
            ),
        })
    })
    .await
}

/// Owner-checked release of a permit.
///
/// # Errors
/// Connection and backend errors.
pub(crate) async fn release(lock: &RedisLock, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
    primitive::release(lock, &names(lease.key()), &SCRIPTS, lease).await
}

/// Owner-checked extension of a permit to expire `ttl` from now.
///
/// # Errors
/// Connection and backend errors.
pub(crate) async fn extend(
    lock: &RedisLock,
    lease: &Lease,
    ttl: Duration,
) -> Result<ExtendOutcome, LockError> {
    primitive::extend(lock, &names(lease.key()), &SCRIPTS, lease, ttl).await
}
