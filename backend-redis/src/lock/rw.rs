//! The read-write lock on one Redis node (direct, Sentinel or Cluster), with writer
//! preference, sharing the mutex client's connection, wake-ups and waiter lines.
//!
//! Layout, for a key `K` (every name under the mutex's hash tag `{K}`, see
//! [`crate::KeyNames`]): `{K}:rw` is a sorted set of the readers' owner tokens scored
//! by the server time (ms) at which each expires, `{K}:rw:writer` the writer's owner
//! token with a `PX` expiry, and `{K}:rw:intent` the waiting writers, scored by when
//! each intent lapses. Every key expires with its longest-lived entry.
//!
//! **Writer preference.** A writer that finds the key held records its intent, and
//! refreshes it at each retry (it lapses `2 × the backoff cap + 1 s` after the last);
//! while an intent lives, new readers are refused, so the writer is granted once the
//! readers inside leave. A writer that gives up withdraws its intent before its call
//! returns (a dropped acquire future, in the background) and wakes the readers it held
//! back. Waiting is the mutex's: `{K}:rw:waiting` marks a waited-on key, so a release
//! publishes on `{K}:rw:released` only then.
//!
//! Every grant, read or write, carries a fencing token from the mutex's counter
//! ([`crate::node::Node::fence`], see the crate docs), above every earlier grant's: a
//! resource recording the highest token seen can refuse a writer whose lease ran out
//! before a later grant.

use std::time::Duration;

use distlock_api::backend::{Grant, Request};
use distlock_api::{
    ExtendOutcome, Lease, LockError, LockKey, OwnerToken, Primitive, ReleaseOutcome, RwMode,
};

use super::primitive::{self, Scripts};
use super::RedisLock;
use crate::keys::{self, KeyNames};
use crate::node::{evalsha, hex, ttl_millis};
use crate::scripts::rw as script;

static SCRIPTS: Scripts = Scripts {
    primitive: Primitive::RwLock,
    acquire: &script::ACQUIRE,
    release: &script::RELEASE,
    extend: &script::EXTEND,
};

fn names(key: &LockKey) -> KeyNames {
    KeyNames::for_primitive(key, keys::Primitive::Rw)
}

/// One side (`mode`) of `request.key`'s read-write lock, waiting as the mutex does; a
/// waiting writer records its intent while it waits (see the module docs).
///
/// # Errors
/// Connection and backend errors.
pub(crate) async fn acquire(
    lock: &RedisLock,
    request: &Request<'_>,
    mode: RwMode,
) -> Result<Option<Grant>, LockError> {
    let (key, options) = (request.key, request.options);
    let names = &names(key);
    // Only a writer that may wait records an intent.
    let intent = (mode == RwMode::Write && request.waits()).then(|| Intent {
        lock: lock.clone(),
        names: names.clone(),
        writer: String::from_utf8_lossy(&hex(OwnerToken::random())).into_owned(),
        armed: true,
    });
    let writer = intent.as_ref().map(|intent| intent.writer.as_str());
    let intent_ttl = RedisLock::waiting_marker(options);
    let granted = lock
        .contend(request, names, |waiting| async move {
            let answer = primitive::attempt(lock, key, names, options, &SCRIPTS, waiting, |cmd| {
                cmd.arg(match mode {
                    RwMode::Read => "r",
                    RwMode::Write => "w",
                })
                .arg(writer.unwrap_or(""))
                .arg(ttl_millis(intent_ttl));
            })
            .await?;
            answer.into_attempt(|detail| {
                LockError::backend_error(
                    lock.name(),
                    format!("unexpected refusal {detail} from the read-write acquire script"),
                )
            })
        })
        .await;
    if let Some(intent) = intent {
        match &granted {
            // The grant removed the intent.
            Ok(Some(_)) => intent.disarm(),
            // Giving up: withdraw it before returning, so readers go on at once.
            Ok(None) | Err(_) => intent.withdraw().await,
        }
    }
    granted
}

/// Owner-checked release of a read or write grant.
///
/// # Errors
/// Connection and backend errors.
pub(crate) async fn release(lock: &RedisLock, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
    primitive::release(lock, &names(lease.key()), &SCRIPTS, lease).await
}

/// Owner-checked extension of a read or write grant to expire `ttl` from now.
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

/// A waiting writer's intent: withdrawn when it gives up, or in the background when
/// its acquire future is dropped. It lapses by itself besides (see the module docs).
struct Intent {
    lock: RedisLock,
    names: KeyNames,
    writer: String,
    armed: bool,
}

impl Intent {
    fn disarm(mut self) {
        self.armed = false;
    }

    /// Withdraws the intent now. A failure leaves it to lapse by itself.
    async fn withdraw(mut self) {
        self.armed = false;
        let _ = withdraw(&self.lock, &self.names, &self.writer).await;
    }
}

impl Drop for Intent {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (lock, names, writer) = (
                self.lock.clone(),
                self.names.clone(),
                std::mem::take(&mut self.writer),
            );
            distlock_api::backend::spawn_cleanup(&runtime, async move {
                let _ = withdraw(&lock, &names, &writer).await;
            });
        }
    }
}

/// Removes `writer`'s intent, waking the readers it held back.
async fn withdraw(lock: &RedisLock, names: &KeyNames, writer: &str) -> Result<(), LockError> {
    let node = lock.primitive_node(Primitive::RwLock)?;
    let script = &*script::WITHDRAW;
    let mut cmd = evalsha(script, &[&names.lock]);
    cmd.arg(writer);
    let _: i64 = node.run(script, &cmd).await?;
    Ok(())
}
