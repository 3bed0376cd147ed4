//! [`LeaseBackend`]: what a guard and its renewal watchdog need of the backend.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::{ExtendOutcome, Lease, LockError, ReleaseOutcome};

/// The backend as a [`crate::LockGuard`] and its renewal watchdog see it: the release
/// and extend of their lease, and the backend's name for metrics and spans.
///
/// Every `Arc<dyn DistributedLock>`, `Arc<dyn DistributedSemaphore>` and
/// `Arc<dyn DistributedRwLock>` is one ([`lease_backend_for`], beside each trait).
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

/// Makes every `Arc<dyn PRIMITIVE>` a [`LeaseBackend`], for a primitive trait
/// (`DistributedLock`, `DistributedSemaphore`, `DistributedRwLock`) whose `info`,
/// `release` and `extend` have the mutex's signatures: the guards of all three are the
/// same [`crate::LockGuard`].
macro_rules! lease_backend_for {
    ($primitive:ident) => {
        /// A guard's view of the primitive that granted it.
        #[async_trait::async_trait]
        impl $crate::lease_backend::LeaseBackend for std::sync::Arc<dyn $primitive> {
            fn name(&self) -> &'static str {
                self.info().name
            }

            async fn release(
                &self,
                lease: &$crate::Lease,
            ) -> Result<$crate::ReleaseOutcome, $crate::LockError> {
                $primitive::release(&**self, lease).await
            }

            async fn extend(
                &self,
                lease: &$crate::Lease,
                ttl: std::time::Duration,
            ) -> Result<$crate::ExtendOutcome, $crate::LockError> {
                $primitive::extend(&**self, lease, ttl).await
            }
        }
    };
}
pub(crate) use lease_backend_for;

/// The error of a default `inspect`: `backend` cannot look at a key without taking it.
pub(crate) fn inspect_unsupported(backend: &'static str) -> LockError {
    LockError::Unsupported {
        backend,
        operation: "inspect",
        reason: "this backend cannot look at a key without taking it",
    }
}
