//! For backend authors: the [`Engine`] trait a backend implements, and what
//! implementing it takes beyond the user's API (applications need none of it).
//!
//! - [`Engine`] is the one trait: one attempt at a grant of a [`Claim`] (waiting
//!   natively up to the [`Request`]'s deadline), owner-checked release and extend,
//!   inspect, and the current leader. [`crate::Client`] implements the four public
//!   primitives over it, with every check, the wait rule and the metrics.
//! - [`WaitReport`] is where an engine notes the answers that showed the key held.
//! - [`NewLease`], [`MonitorWriter`] and [`OwnerBits`] make and update what a grant
//!   hands out: its lease and the monitor the backend reports suspicion and loss
//!   through, and an owner token parsed from the server; [`NewGuard`] wraps a grant as
//!   a guard for the rare implementor of a public trait itself (a test double). Import
//!   them at once with `use distlock_api::backend::prelude::*;`; calls then read
//!   `Lease::new(…)`, `monitor.mark_lost()` and so on.
//! - [`acquire_all`] and [`multi_guard`] serve implementors that override a public
//!   trait's `acquire_all`.
//! - [`address`] names a server in messages without its URL (which may carry a
//!   password) and refuses a URL of another scheme.
//! - [`sessions`] is for backends that multiplex many held locks over a few database
//!   sessions: the session pool, a session's held leases and their timers, the
//!   mailbox to a session task.
//! - [`spawn_cleanup`] runs a drop-path clean-up (a compensating release, leaving a
//!   queue) so that [`crate::settle_cleanups`] can wait for it before the process exits.

pub mod address;
pub mod sessions;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

pub use crate::cleanup::spawn_cleanup;
pub use crate::engine::{unanswered_message, Claim, Engine, Grant, Request, WaitReport};
pub use crate::multi::{acquire_all, multi_guard};

use crate::{
    AutoRenew, DistributedLock, FencingToken, Lease, LeaseMonitor, LockGuard, LockKey, OwnerToken,
};

/// The implementor traits, imported anonymously: `use distlock_api::backend::prelude::*;`.
pub mod prelude {
    pub use super::{MonitorWriter as _, NewGuard as _, NewLease as _, OwnerBits as _};
}

/// Building the guard a grant hands out.
pub trait NewGuard {
    /// Wraps a grant. `backend` is the handle release and extend go through; `monitor`
    /// tracks the lease (the backend may keep a clone to report loss). With
    /// `auto_renew`, a watchdog task is spawned on the current runtime.
    fn new(
        lease: Lease,
        monitor: LeaseMonitor,
        backend: Arc<dyn DistributedLock>,
        auto_renew: Option<AutoRenew>,
    ) -> Self;
}

impl NewGuard for LockGuard {
    fn new(
        lease: Lease,
        monitor: LeaseMonitor,
        backend: Arc<dyn DistributedLock>,
        auto_renew: Option<AutoRenew>,
    ) -> Self {
        LockGuard::from_grant(lease, monitor, Arc::new(backend), auto_renew)
    }
}

/// Describing a grant.
pub trait NewLease {
    /// Describes a grant. `acquired_at` is when the acquire request was sent, so
    /// deadlines computed from it are conservative.
    ///
    /// `fencing_token` is `Some` exactly when the grant's primitive reports
    /// [`Guarantees::fencing`](crate::Guarantees::fencing) supported: a backend that
    /// cannot promise ordered tokens passes `None` rather than a best-effort number (the
    /// kit checks both ways). See [`crate::DistributedSemaphore`] and
    /// [`crate::DistributedRwLock`] for what a token means for a permit or a read.
    fn new(
        key: LockKey,
        owner: OwnerToken,
        fencing_token: Option<FencingToken>,
        ttl: Duration,
        acquired_at: Instant,
    ) -> Self;
}

impl NewLease for Lease {
    fn new(
        key: LockKey,
        owner: OwnerToken,
        fencing_token: Option<FencingToken>,
        ttl: Duration,
        acquired_at: Instant,
    ) -> Self {
        Lease::describe(key, owner, fencing_token, ttl, acquired_at)
    }
}

/// Making a lease monitor and reporting what the backend learns about the lease; the
/// guard's holder only reads it.
pub trait MonitorWriter {
    /// A held lease valid until `valid_until` (on the monotonic clock).
    fn new(valid_until: Instant) -> Self;

    /// A renewal succeeded: held until `valid_until`. Ignored once lost.
    ///
    /// A lease whose deadline has already passed is lost, even if nobody said so yet: a
    /// renewal that lands late cannot revive it. Returns whether the lease is held now.
    fn renewed(&self, valid_until: Instant) -> bool;

    /// The lease may be lost (connection trouble). Ignored once lost.
    fn suspect(&self);

    /// The lease is known lost. Wakes every [`LeaseMonitor::lost`] future.
    fn mark_lost(&self);
}

impl MonitorWriter for LeaseMonitor {
    fn new(valid_until: Instant) -> Self {
        LeaseMonitor::held_until(valid_until)
    }

    fn renewed(&self, valid_until: Instant) -> bool {
        self.apply_renewal(valid_until)
    }

    fn suspect(&self) {
        self.mark_suspect();
    }

    fn mark_lost(&self) {
        self.set_lost();
    }
}

/// Owner tokens from their raw bits.
pub trait OwnerBits {
    /// Wraps raw bits, for backends that parse a stored token.
    fn from_u128(bits: u128) -> Self;
}

impl OwnerBits for OwnerToken {
    fn from_u128(bits: u128) -> Self {
        OwnerToken::from_bits(bits)
    }
}
