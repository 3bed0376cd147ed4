//! The distlock API: one object-safe async trait, [`DistributedLock`], for every lock
//! backend, with the types its operations share, and the in-memory reference backend.
//!
//! ```
//! # async fn demo() -> Result<(), distlock_api::LockError> {
//! use std::time::Duration;
//! use distlock_api::{DistributedLock, LockKey, LockOptions, MemoryLock, WaitPolicy};
//!
//! let locks = MemoryLock::new();
//! let key = LockKey::new("invoices/2026-11")?;
//! let options = LockOptions::new(Duration::from_secs(10))
//!     .with_wait(WaitPolicy::Timeout(Duration::from_secs(5)));
//! let guard = locks.acquire(&key, &options).await?;
//! // Send guard.fencing_token() with every write the lock protects (`None` where the
//! // backend has no fencing: then make the writes idempotent or conditional).
//! guard.release().await?;
//! # Ok(()) }
//! ```

mod backoff;
mod capabilities;
mod cleanup;
mod error;
mod guard;
mod key;
mod lease;
mod lock;
pub mod memory;
pub mod observe;
mod options;
mod renew;
mod scoped;
mod status;

pub use backoff::{Backoff, BackoffDelays, MIN_BACKOFF};
pub use capabilities::{BackendInfo, Capabilities, Capability};
pub use cleanup::{settle_cleanups, spawn_cleanup};
pub use error::{AtAddress, BoxError, LockError, NotHeldReason, API_BACKEND_NAME};
pub use guard::LockGuard;
pub use key::{KeyError, LockKey, MAX_KEY_LEN};
pub use lease::{FencingToken, Lease, LeaseMonitor, LeaseState, OwnerToken};
pub use lock::{DistributedLock, ExtendOutcome, ReleaseOutcome};
pub use memory::MemoryLock;
pub use options::{
    check_ttl, AutoRenew, LockOptions, OptionsError, WaitOrder, WaitPolicy, FIFO_OPERATION,
    MAX_TTL, MIN_RENEW_INTERVAL, MIN_TTL,
};
pub use scoped::with_lock;
pub use status::KeyStatus;

/// Re-exported so backends and users name the same `async_trait`.
pub use async_trait::async_trait;
