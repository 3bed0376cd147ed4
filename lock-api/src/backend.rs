//! For backend authors: the [`Engine`] trait a backend implements, and what
//! implementing it takes beyond the user's API (applications need none of it).
//!
//! - [`Engine`] is the one trait: one attempt at a grant of a [`Claim`] (waiting
//!   natively up to the [`Request`]'s deadline), owner-checked release and extend,
//!   inspect, and the current leader. [`crate::Client`] implements the four public
//!   primitives over it, with every check, the wait rule and the metrics.
//!
//! - [`bounded_wait`] runs a waiting acquire's attempts until the wait's deadline plus
//!   a grace for an answer on its way, then fails the way every backend does: with
//!   [`LockError::Timeout`] if an answer showed the key held, else with the backend's
//!   connection error, since nobody said who holds it. It also marks the guard when the
//!   acquire met a held key ([`LockGuard::contended`]), which the metrics count as
//!   contention. Backends not yet on [`Engine`] use it; the generic primitives have
//!   their own.
//! - [`WaitReport`] is what the attempts tell it.
//! - [`NewGuard`], [`NewLease`], [`MonitorWriter`] and [`OwnerBits`] make and update
//!   what a grant hands out: a guard, its lease and the monitor the backend reports
//!   suspicion and loss through, and an owner token parsed from the server. Import them
//!   at once with `use distlock_api::backend::prelude::*;`; calls then read
//!   `LockGuard::new(…)`, `monitor.mark_lost()` and so on.
//! - [`spawn_cleanup`] runs a drop-path clean-up (a compensating release, leaving a
//!   queue) so that [`crate::settle_cleanups`] can wait for it before the process exits.
//! - [`check_permit_request`] makes a semaphore acquire's checks of its options and
//!   permit count, the same on every backend.
//! - [`leadership`] wraps an election's grant as a [`Leadership`], and
//!   [`check_campaign_request`] makes a campaign's checks of its options.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{timeout_at, Instant};

pub use crate::cleanup::spawn_cleanup;
pub use crate::engine::{unanswered_message, Claim, Engine, Grant, Request};
pub use crate::multi::{acquire_all, multi_guard};

use crate::{
    check_permits, AutoRenew, Candidate, Capability, DistributedLock, DistributedRwLock,
    DistributedSemaphore, FencingToken, LeaderElection, Leadership, Lease, LeaseMonitor, LockError,
    LockGuard, LockKey, LockOptions, OwnerToken,
};

/// The checks a campaign makes before touching the server: the options
/// ([`LockOptions::validate_for`]) and their wait order against the backend's `fifo`
/// capability ([`LockOptions::check_order`]). The candidate was checked when it was
/// made ([`Candidate::new`]).
///
/// # Errors
/// [`LockError::InvalidOptions`] for bad options, and [`LockError::Unsupported`] for a
/// FIFO wait where `fifo` is unsupported; each names `backend`.
pub fn check_campaign_request(
    backend: &'static str,
    options: &LockOptions,
    fifo: Capability,
) -> Result<(), LockError> {
    options.validate_for(backend)?;
    options.check_order(backend, fifo)
}

/// Wraps an election's grant: `lease` (which must carry the term as its fencing
/// token), its `monitor`, the `backend` that resigns and extends it, and the
/// `candidate` that won. With `auto_renew`, a watchdog task is spawned on the current
/// runtime, as for a [`LockGuard`].
///
/// # Errors
/// [`LockError::Backend`] naming `backend` when the lease carries no term: an election
/// without terms breaks the [`LeaderElection`] contract. Nothing is released then:
/// the caller still owns the grant and releases it.
pub fn leadership(
    lease: Lease,
    monitor: LeaseMonitor,
    backend: Arc<dyn LeaderElection>,
    auto_renew: Option<AutoRenew>,
    candidate: Candidate,
) -> Result<Leadership, LockError> {
    let Some(term) = lease.fencing_token() else {
        return Err(LockError::backend_error(
            backend.info().name,
            "a leadership was granted without a term",
        ));
    };
    let guard = LockGuard::from_grant(lease, monitor, Arc::new(backend), auto_renew);
    Ok(Leadership::from_guard(guard, candidate, term))
}

/// The checks a semaphore acquire makes before touching the server, in this order:
/// the options ([`LockOptions::validate_for`]), the permit count ([`check_permits`]),
/// and the options' wait order against the backend's `fifo` capability
/// ([`LockOptions::check_order`]; [`Capability::Supported`] admits every order).
///
/// # Errors
/// [`LockError::InvalidOptions`] for bad options or a count outside
/// `1..=`[`crate::MAX_PERMITS`], and [`LockError::Unsupported`] for a FIFO wait where
/// `fifo` is unsupported; each names `backend`.
pub fn check_permit_request(
    backend: &'static str,
    max_permits: u32,
    options: &LockOptions,
    fifo: Capability,
) -> Result<(), LockError> {
    options.validate_for(backend)?;
    check_permits(max_permits).map_err(|e| LockError::invalid_options(backend, e))?;
    options.check_order(backend, fifo)
}

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

    /// [`NewGuard::new`] for a semaphore permit: release and extend go through `backend`.
    fn for_permit(
        lease: Lease,
        monitor: LeaseMonitor,
        backend: Arc<dyn DistributedSemaphore>,
        auto_renew: Option<AutoRenew>,
    ) -> Self;

    /// [`NewGuard::new`] for a read or write grant: release and extend go through `backend`.
    fn for_rw(
        lease: Lease,
        monitor: LeaseMonitor,
        backend: Arc<dyn DistributedRwLock>,
        auto_renew: Option<AutoRenew>,
    ) -> Self;
}

impl NewGuard for LockGuard {
    fn for_permit(
        lease: Lease,
        monitor: LeaseMonitor,
        backend: Arc<dyn DistributedSemaphore>,
        auto_renew: Option<AutoRenew>,
    ) -> Self {
        LockGuard::from_grant(lease, monitor, Arc::new(backend), auto_renew)
    }

    fn for_rw(
        lease: Lease,
        monitor: LeaseMonitor,
        backend: Arc<dyn DistributedRwLock>,
        auto_renew: Option<AutoRenew>,
    ) -> Self {
        LockGuard::from_grant(lease, monitor, Arc::new(backend), auto_renew)
    }

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
    /// `fencing_token` is `Some` exactly when the backend reports
    /// [`Guarantees::fencing`](crate::Guarantees::fencing) supported: a backend that
    /// cannot promise ordered tokens passes `None` rather than a best-effort number.
    /// That rule is the mutex's; a semaphore permit or a read or write grant carries a
    /// token only where the backend documents one (see
    /// [`DistributedSemaphore`] and
    /// [`DistributedRwLock`] for what it means there).
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

/// The bounds of one waiting acquire: when it started, when its wait ends, and how long
/// past that an answer on its way is still awaited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct WaitBound {
    /// When the acquire started.
    pub started: Instant,
    /// When the wait ends; `None` waits forever, `Some(started)` does not wait.
    pub deadline: Option<Instant>,
    /// How long past the deadline an answer on its way is still awaited.
    pub grace: Duration,
}

impl WaitBound {
    /// The bound of an acquire starting now with `options`' wait policy.
    pub fn starting_now(options: &LockOptions, grace: Duration) -> Self {
        let started = Instant::now();
        WaitBound {
            started,
            deadline: options.wait().deadline_from(started),
            grace,
        }
    }
}

/// Marks `guard` (a [`LockGuard`] or a [`Leadership`]) as granted after its acquire met
/// the key held (or not): what [`LockGuard::contended`] and [`Leadership::contended`]
/// report. [`bounded_wait`] does this itself.
pub fn mark_contended<G: Granted>(guard: G, contended: bool) -> G {
    guard.marked_contended(contended)
}

/// What a waiting acquire hands out: a [`LockGuard`], or a [`Leadership`] for a
/// campaign. Lets [`bounded_wait`] and [`mark_contended`] serve both.
pub trait Granted: Sized {
    /// This grant, recording whether its acquire met the key held first.
    fn marked_contended(self, contended: bool) -> Self;
}

impl Granted for LockGuard {
    fn marked_contended(self, contended: bool) -> Self {
        self.with_contended(contended)
    }
}

impl Granted for Leadership {
    fn marked_contended(self, contended: bool) -> Self {
        self.with_contended(contended)
    }
}

/// What the attempts of one acquire learned, shared with [`bounded_wait`].
#[derive(Debug, Default)]
pub struct WaitReport {
    held_seen: AtomicBool,
}

impl WaitReport {
    /// A report of nothing seen yet.
    pub fn new() -> Self {
        WaitReport::default()
    }

    /// Notes an answer saying another owner holds the key.
    pub fn saw_held(&self) {
        self.held_seen.store(true, Ordering::Relaxed);
    }

    /// Whether any answer said another owner holds the key.
    pub fn held_seen(&self) -> bool {
        self.held_seen.load(Ordering::Relaxed)
    }
}

/// Runs `attempts` (the backend's acquire loop, which notes in `report` each answer
/// saying the key is held) within `bound`.
///
/// A deadline after the start bounds the whole call, whatever the server does: once
/// the deadline plus the grace passes, `attempts` is dropped (so its drop guards must undo a
/// grant that lands later) and the call fails with [`LockError::Timeout`] naming
/// `backend` and `key` if `report` saw the key held, else with `no_answer(wait)`, the
/// backend's connection error saying the server did not answer within the wait. With
/// no deadline, or one at `started` (no wait), `attempts` bounds itself.
///
/// A guard (or leadership) granted after `report` saw the key held is marked
/// [contended](LockGuard::contended).
///
/// # Errors
/// Whatever `attempts` returns, or the two above when the deadline passes first.
pub async fn bounded_wait<F, G>(
    backend: &'static str,
    key: &LockKey,
    bound: WaitBound,
    report: &WaitReport,
    attempts: F,
    no_answer: impl FnOnce(Duration) -> LockError,
) -> Result<G, LockError>
where
    F: Future<Output = Result<G, LockError>>,
    G: Granted,
{
    let WaitBound {
        started,
        deadline,
        grace,
    } = bound;
    let cut = deadline
        .filter(|d| *d > started)
        .and_then(|d| Some((d - started, d.checked_add(grace)?)));
    let result = match cut {
        None => attempts.await,
        Some((wait, cut)) => match timeout_at(cut, attempts).await {
            Ok(result) => result,
            Err(_) if report.held_seen() => Err(LockError::Timeout {
                backend,
                key: key.clone(),
                waited: started.elapsed(),
            }),
            Err(_) => Err(no_answer(wait)),
        },
    };
    result.map(|guard| guard.marked_contended(report.held_seen()))
}
