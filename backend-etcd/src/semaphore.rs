//! [`EtcdSemaphore`]: the [`DistributedSemaphore`] on the mutex's recipe, with room for
//! `max` holders.
//!
//! etcd ships no semaphore recipe, so this one is the mutex's key-space discipline
//! with a wider door. Each contender puts `P/+semaphore/<K>/<lease id in hex>` under
//! its lease, holding `distlock:permits=<max>`; contenders are ranked by create
//! revision and the `max` oldest hold a permit. A waiter watches the `max` youngest
//! contenders older than its own: it can hold only once one of those goes (with
//! `k ≥ max` older contenders it holds once `k - max + 1` have gone, and only `k - max`
//! are not watched), so a deletion makes at most `max` waiters look again, never the
//! whole queue. (One watched key is watched alone; several through one watch of the
//! range, whose other deletions the waiter passes over without a request.)
//! Permits pass on in FIFO order of arrival. Leases, keep-alives, the loss watch, the
//! waiting lease, release, extend and clean-up are the mutex's.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::backend::prelude::*;
use distlock_api::backend::{check_permit_request, WaitReport};
use distlock_api::{
    BackendInfo, DistributedLock, DistributedSemaphore, ExtendOutcome, Lease, LeaseMonitor,
    LockError, LockGuard, LockKey, LockOptions, PermitMismatch, ReleaseOutcome,
};
use etcd_client::KeyValue;

use crate::keys::Kind;
use crate::lock::ETCD_CAPABILITIES;
use crate::{EtcdLock, ETCD_BACKEND};

/// What our permit keys hold, before the permit count: `distlock:permits=3`.
pub const PERMITS_VALUE_PREFIX: &str = "distlock:permits=";

/// A semaphore client of the etcd backend, made by [`EtcdLock::semaphore`], sharing
/// the lock client's connection, leases and loss watch.
///
/// **Fencing tokens.** A permit granted at once carries its key's create revision (the
/// put that placed it was the grant). A waiter first marks its grant pending: it puts
/// `P/+semaphore-pending/<K>/<its key's create revision, 20 digits>` under its lease.
/// Once granted, it writes that marker again in a transaction guarded by its key still
/// being its own and by no older contender's marker being left; that write's revision
/// is its token, and it deletes the marker as the acquire returns. So waiters granted
/// by the same deletions (two holders leaving at once), which learn it in no set order,
/// stamp one after the other in queue order, each only after the one before it has
/// returned, and a permit's token is above that of every permit granted before it on
/// the key in the order the grants are learned. (A waiter's create revision would not
/// do: the younger could return first, with the lower token.) It orders and identifies
/// grants; since several permits are valid at once, a resource cannot use it to refuse
/// "everything below the highest token seen".
///
/// **Permit counts.** Every permit key records its count. An acquire reads the `max`
/// oldest contenders in the transaction that puts its key; one recording another count
/// (the oldest always holds, so a key in use is always seen) is a
/// [`LockError::PermitMismatch`], and the acquire withdraws its key. Keys without a
/// recorded count (not ours) count as contenders but cannot be checked.
///
/// Cloning is cheap and shares the connection.
#[derive(Debug, Clone)]
pub struct EtcdSemaphore {
    lock: EtcdLock,
}

impl EtcdLock {
    /// A semaphore client on this client's connection.
    pub fn semaphore(&self) -> EtcdSemaphore {
        EtcdSemaphore { lock: self.clone() }
    }

    /// The range of `key`'s semaphore, `PREFIX/+semaphore/<encoded key>/` (never a
    /// mutex's range: no key encodes to a name with `+`).
    pub fn semaphore_prefix(&self, key: &LockKey) -> String {
        Kind::Permit(1).range(self.prefix(), key)
    }
}

/// The value a `kind` contender's key holds: a permit's count, else nothing.
pub(crate) fn value_of(kind: Kind) -> String {
    match kind {
        Kind::Permit(max) => format!("{PERMITS_VALUE_PREFIX}{max}"),
        _ => String::new(),
    }
}

/// [`LockError::PermitMismatch`] when a permit contender other than `own` among `seen`
/// records a count other than ours.
pub(crate) fn check_count(
    kind: Kind,
    key: &LockKey,
    own: &str,
    seen: &[KeyValue],
) -> Result<(), LockError> {
    let Kind::Permit(max) = kind else {
        return Ok(());
    };
    let in_use = seen
        .iter()
        .filter(|kv| kv.key() != own.as_bytes())
        .find_map(|kv| recorded_count(kv.value()).filter(|count| *count != max));
    match in_use {
        None => Ok(()),
        Some(in_use) => Err(LockError::PermitMismatch {
            backend: ETCD_BACKEND,
            source: PermitMismatch::new(key.clone(), max, in_use),
        }),
    }
}

/// The permit count a key's value records, if it is one of ours.
fn recorded_count(value: &[u8]) -> Option<u32> {
    std::str::from_utf8(value)
        .ok()?
        .strip_prefix(PERMITS_VALUE_PREFIX)?
        .parse()
        .ok()
}

impl EtcdSemaphore {
    fn checked(max_permits: u32, options: &LockOptions) -> Result<(), LockError> {
        check_permit_request(
            ETCD_BACKEND,
            max_permits,
            options,
            ETCD_CAPABILITIES.semaphore.fifo,
        )
    }

    fn guard(&self, lease: Lease, monitor: LeaseMonitor, options: &LockOptions) -> LockGuard {
        let backend: Arc<dyn DistributedSemaphore> = Arc::new(self.clone());
        LockGuard::for_permit(lease, monitor, backend, options.auto_renew())
    }
}

#[async_trait]
impl DistributedSemaphore for EtcdSemaphore {
    fn info(&self) -> BackendInfo {
        DistributedLock::info(&self.lock)
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        max_permits: u32,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        Self::checked(max_permits, options)?;
        let kind = Kind::Permit(max_permits);
        let won = self
            .lock
            .contend(
                kind,
                key,
                value_of(kind).as_bytes(),
                options,
                &WaitReport::new(),
                false,
            )
            .await?;
        Ok(won.map(|(lease, monitor)| self.guard(lease, monitor, options)))
    }

    async fn acquire(
        &self,
        key: &LockKey,
        max_permits: u32,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        Self::checked(max_permits, options)?;
        let kind = Kind::Permit(max_permits);
        self.lock
            .wait_for(
                kind,
                key,
                value_of(kind).as_bytes(),
                options,
                |lease, monitor| Ok(self.guard(lease, monitor, options)),
            )
            .await
    }

    /// Revokes our permit key's lease (deleting the key), as the mutex's release.
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.lock.release_in(Kind::Permit(1), lease).await
    }

    /// Keeps our permit's lease alive (or moves the key to a longer one), as the
    /// mutex's extend.
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        self.lock.extend_in(Kind::Permit(1), lease, ttl).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_values_record_a_count() {
        assert_eq!(recorded_count(b"distlock:permits=3"), Some(3));
        for foreign in [&b""[..], b"distlock:permits=", b"x", b"\xff"] {
            assert_eq!(recorded_count(foreign), None);
        }
        assert_eq!(value_of(Kind::Permit(7)), "distlock:permits=7");
        assert_eq!(value_of(Kind::Mutex), "");
    }
}
