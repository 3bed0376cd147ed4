//! The distlock API: the four primitives ([`DistributedLock`],
//! [`DistributedSemaphore`], [`DistributedRwLock`], [`LeaderElection`]) as object-safe
//! async traits, the [`Client`] that hands them out over any backend, the types their
//! operations share, the in-memory reference backend, and in [`backend`] the one trait
//! a backend implements ([`backend::Engine`]).
//!
//! ```
//! # async fn demo() -> Result<(), distlock_api::LockError> {
//! use std::time::Duration;
//! use distlock_api::{LockKey, LockOptions, MemoryLock, WaitPolicy};
//!
//! let client = MemoryLock::new().client();
//! let locks = client.lock();
//! let key = LockKey::new("invoices/2026-11")?;
//! let options = LockOptions::new(Duration::from_secs(10))
//!     .with_wait(WaitPolicy::Timeout(Duration::from_secs(5)));
//! let guard = locks.acquire(&key, &options).await?;
//! // Send guard.fencing_token() with every write the lock protects (`None` where the
//! // backend has no fencing: then make the writes idempotent or conditional).
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Stability: which types may grow
//!
//! The API can grow in a minor release only where a type says so. The rule, applied
//! to every public type of the workspace's published crates:
//! - **Errors and reasons** ([`LockError`], [`KeyError`], [`OptionsError`],
//!   [`NotHeldReason`], and each backend's error types) are `#[non_exhaustive]`:
//!   match them with a wildcard arm, since new failure modes get new variants.
//! - **Data and options types with public fields** ([`BackendInfo`], [`Capabilities`],
//!   [`KeyStatus`], [`AtAddress`], [`AutoRenew`], [`WaitPolicy`], the memory store's
//!   [`memory::Entry`], each backend's `Config`) are `#[non_exhaustive]`, as redis-rs
//!   marks its data types: read their fields freely, but build them through their
//!   constructors and `with_…` methods, so a new field is not a breaking change.
//! - **Types with private fields** ([`LockKey`], [`LockOptions`], [`Lease`],
//!   [`LockGuard`], the lock clients, …) need no marker: they grow through methods.
//! - **Outcomes are exhaustive by choice**: [`ReleaseOutcome`], [`ExtendOutcome`],
//!   [`LeaseState`] and [`Capability`] list every case a caller must handle, so a
//!   `match` without a wildcard is the point: a new case would change what the lock
//!   promises, and then it should not compile silently. Changing one of them is a
//!   major version.
//!
//! "Not ours" reads the same from release and extend: both report it as an outcome
//! ([`ReleaseOutcome::Expired`] / [`ReleaseOutcome::HeldByOther`],
//! [`ExtendOutcome::Expired`] / [`ExtendOutcome::HeldByOther`]), never as an error;
//! errors are for calls that could not find out.

// docs.rs (`--cfg docsrs`, nightly) shows which feature each gated item needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

pub mod backend;
mod backoff;
mod capabilities;
mod cleanup;
mod client;
pub mod connect_retry;
mod election;
mod engine;
mod error;
mod guard;
mod key;
mod lease;
mod lease_backend;
mod lock;
pub mod memory;
mod metrics;
mod multi;
pub mod observe;
mod options;
mod outcome;
mod primitives;
mod renew;
mod rw;
mod schedule;
mod scoped;
mod semaphore;
mod status;

pub use backoff::{Backoff, BackoffDelays, MIN_BACKOFF};
pub use capabilities::{BackendInfo, Capabilities, Capability, Guarantees, Primitive, NOT_YET};
pub use cleanup::settle_cleanups;
pub use client::Client;
pub use election::{
    Candidate, Leader, LeaderElection, LeaderWatch, Leadership, MAX_CANDIDATE_LEN, OBSERVE_POLL,
};
pub use error::{
    in_words, looks_like_debug, AtAddress, BoxError, InWords, LockError, NotHeldReason,
    OptionsError, PermitMismatch, API_BACKEND_NAME,
};
pub use guard::LockGuard;
pub use key::{KeyError, LockKey, MAX_KEY_LEN};
pub use lease::{FencingToken, Lease, LeaseMonitor, LeaseState, OwnerToken};
pub use lock::DistributedLock;
pub use memory::MemoryLock;
pub use multi::MultiGuard;
pub use options::{
    check_ttl, AutoRenew, LockOptions, WaitOrder, WaitPolicy, DEFAULT_ERROR_PATIENCE,
    FIFO_OPERATION, MAX_TTL, MIN_RENEW_INTERVAL, MIN_TTL,
};
pub use outcome::{ExtendOutcome, ReleaseOutcome};
pub use rw::{DistributedRwLock, RwMode};
pub use schedule::{run_once, Firing, OnceOptions, Ran, Schedule, Turn, MIN_PERIOD};
pub use scoped::with_lock;
pub use semaphore::{check_permits, DistributedSemaphore, MAX_PERMITS};
pub use status::{HolderStatus, KeyStatus, RwStatus, SemaphoreStatus};

/// Re-exported so backends and users name the same `async_trait`.
pub use async_trait::async_trait;
