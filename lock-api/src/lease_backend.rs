//! [`LeaseBackend`]: what a guard and its renewal watchdog need of the backend.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::{ExtendOutcome, Lease, LockError, ReleaseOutcome};

/// The backend as a [`crate::LockGuard`] and its renewal watchdog see it: the release
/// and extend of their lease, and the backend's name for metrics and spans.
///
/// Every `Arc<dyn DistributedLock>` is one (the impl is beside the trait, in `lock.rs`).
/// The guard holds this narrow view, not the trait whose `acquire` returns guards, so
/// the guard, the watchdog and the trait do not import each other in a cycle.
#[async_trait]
pub(crate) trait LeaseBackend: Send + Sync + fmt::Debug {
    /// The backend's name ([`crate::BackendInfo::name`]).
    fn name(&self) -> &'static str;

    /// [`crate::DistributedLock::release`].
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError>;

    /// [`crate::DistributedLock::extend`].
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError>;
}
