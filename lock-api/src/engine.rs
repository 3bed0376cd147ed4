//! [`Engine`]: the one trait a backend implements. The four public primitives
//! ([`crate::DistributedLock`], [`crate::DistributedSemaphore`],
//! [`crate::DistributedRwLock`], [`crate::LeaderElection`]) are implemented once, over
//! it, by [`crate::Client`]'s handles.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::lease_backend::inspect_unsupported;
use crate::{
    BackendInfo, Candidate, ExtendOutcome, FencingToken, KeyStatus, Leader, Lease, LeaseMonitor,
    LockError, LockKey, LockOptions, Primitive, ReleaseOutcome, RwMode, RwStatus, SemaphoreStatus,
    OBSERVE_POLL,
};

/// What one acquire asks a backend for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Claim<'a> {
    /// The mutex of the key.
    Mutex,
    /// One permit of the key's semaphore, which has `max` permits (checked: `1..=`
    /// [`crate::MAX_PERMITS`]).
    Permit {
        /// The semaphore's permit count.
        max: u32,
    },
    /// One side of the key's read-write lock.
    Rw(RwMode),
    /// The leadership of the election named by the key, for this candidate. The lease
    /// granted must carry the term as its fencing token.
    Lead(&'a Candidate),
}

impl Claim<'_> {
    /// The primitive this claim belongs to.
    pub fn primitive(&self) -> Primitive {
        match self {
            Claim::Mutex => Primitive::Mutex,
            Claim::Permit { .. } => Primitive::Semaphore,
            Claim::Rw(_) => Primitive::RwLock,
            Claim::Lead(_) => Primitive::Election,
        }
    }
}

/// One acquire, as [`Engine::acquire`] receives it: already checked against the
/// options' bounds and the backend's [`crate::Capabilities`].
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Request<'a> {
    /// The key (or election name).
    pub key: &'a LockKey,
    /// What is asked for.
    pub claim: Claim<'a>,
    /// The caller's options: the TTL, the wait order and the backoff for polled waits.
    pub options: &'a LockOptions,
    /// When the acquire started.
    pub started: Instant,
    /// Until when to wait natively for the key: `Some(started)` for a single try,
    /// `None` to wait until granted.
    pub deadline: Option<Instant>,
    /// Where the engine notes each answer that showed the key held.
    pub report: &'a WaitReport,
}

impl Request<'_> {
    /// Whether the request may wait: `false` for a try.
    pub fn waits(&self) -> bool {
        self.deadline != Some(self.started)
    }

    /// Whether the deadline has passed.
    pub fn deadline_passed(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// Notes an answer that showed the key held (what [`crate::LockGuard::contended`]
    /// and the timeout-versus-no-answer rule read).
    pub fn saw_held(&self) {
        self.report.saw_held();
    }
}

/// A grant, as the engine made it: the lease and the monitor through which the engine
/// reports suspicion and loss.
#[derive(Debug)]
#[non_exhaustive]
pub struct Grant {
    /// The lease. For a [`Claim::Lead`], its fencing token is the term.
    pub lease: Lease,
    /// The lease's monitor (the engine may keep a clone to report loss).
    pub monitor: LeaseMonitor,
}

impl Grant {
    /// A grant of `lease`, tracked by `monitor`.
    pub fn new(lease: Lease, monitor: LeaseMonitor) -> Self {
        Grant { lease, monitor }
    }
}

/// A backend: one client of one lock service (a connection, a pool or a session), for
/// every primitive and key. The only trait a backend implements.
///
/// Object-safe; [`crate::Client`] holds it as `Arc<dyn Engine>` and implements the four
/// public primitive traits over it once: the option, TTL, permit-count and capability
/// checks, the bounded wait with one error-patience rule and one grace, guard and
/// leadership wrapping, metrics and tracing. An engine does none of that; it keeps the
/// promises the checks cannot:
/// - at most one unexpired lease per key for the mutex, a writer and a leadership
///   (at most `max` for permits, writers beside no reader), each grant with a fresh
///   random owner token and, where its [`crate::Guarantees::fencing`] says so, a
///   fencing token above every earlier grant's of the key;
/// - owner-checked release and extend, atomic with the check, with typed outcomes;
/// - dropping an [`Engine::acquire`] future at any await point leaves nothing held,
///   queued or intended (a grant that lands later is released);
/// - what its [`crate::Capabilities`] claim, per primitive (the conformance kit checks
///   each claim against behaviour).
///
/// Methods for what a backend cannot do default to [`LockError::Unsupported`].
#[async_trait]
pub trait Engine: Send + Sync + fmt::Debug {
    /// The backend's name and guarantees, per primitive. Called on every acquire, so
    /// keep it cheap.
    fn info(&self) -> BackendInfo;

    /// One attempt at `request`'s grant, waiting natively (a watch, the server's lock
    /// queue, a wake-up channel, a poll at the options' backoff) while the key is held
    /// and `request.deadline` allows.
    ///
    /// Returns the grant, or `None` when the key is still held at the deadline (at once
    /// for a try). Note each answer that showed the key held with
    /// [`Request::saw_held`]. Return early only with a grant or an error: the caller
    /// cuts the call at the deadline plus a short grace whatever the server does, and
    /// retries a [retryable](LockError::is_retryable) error under the options' error
    /// patience.
    ///
    /// # Errors
    /// Connection and backend errors; [`LockError::PermitMismatch`] for a permit whose
    /// count differs from the key's.
    async fn acquire(&self, request: &Request<'_>) -> Result<Option<Grant>, LockError>;

    /// Owner-checked release of `lease`, a grant of `primitive`.
    ///
    /// # Errors
    /// Connection and backend errors only; "not ours" is a [`ReleaseOutcome`].
    async fn release(
        &self,
        primitive: Primitive,
        lease: &Lease,
    ) -> Result<ReleaseOutcome, LockError>;

    /// Owner-checked extension of `lease`, a grant of `primitive`, to expire `ttl`
    /// (checked: within [`crate::MIN_TTL`]..=[`crate::MAX_TTL`]) from now.
    ///
    /// # Errors
    /// Connection and backend errors only; "not ours" is an [`ExtendOutcome`].
    async fn extend(
        &self,
        primitive: Primitive,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<ExtendOutcome, LockError>;

    /// The mutex `key` as it is now; see [`crate::DistributedLock::inspect`].
    ///
    /// # Errors
    /// [`LockError::Unsupported`] (the default), and connection and backend errors.
    async fn inspect(&self, key: &LockKey) -> Result<KeyStatus, LockError> {
        let _ = key;
        Err(inspect_unsupported(self.info().name))
    }

    /// The semaphore `key` as it is now; see [`crate::DistributedSemaphore::inspect`].
    ///
    /// # Errors
    /// [`LockError::Unsupported`] (the default), and connection and backend errors.
    async fn inspect_semaphore(&self, key: &LockKey) -> Result<SemaphoreStatus, LockError> {
        let _ = key;
        Err(inspect_unsupported(self.info().name))
    }

    /// The read-write lock `key` as it is now; see [`crate::DistributedRwLock::inspect`].
    ///
    /// # Errors
    /// [`LockError::Unsupported`] (the default), and connection and backend errors.
    async fn inspect_rw(&self, key: &LockKey) -> Result<RwStatus, LockError> {
        let _ = key;
        Err(inspect_unsupported(self.info().name))
    }

    /// The current leader of the election `name`; see [`crate::LeaderElection::leader`].
    ///
    /// # Errors
    /// [`LockError::Unsupported`] (the default, for backends without election), and
    /// connection and backend errors.
    async fn leader(&self, name: &LockKey) -> Result<Option<Leader>, LockError> {
        let _ = name;
        Err(LockError::Unsupported {
            backend: self.info().name,
            operation: "reading the leader",
            reason: crate::NOT_YET,
        })
    }

    /// Waits until the leadership of `name` differs from `seen`, or `patience` has
    /// passed; see [`crate::LeaderElection::wait_change`]. The default polls
    /// [`Engine::leader`] every [`OBSERVE_POLL`].
    ///
    /// # Errors
    /// Connection and backend errors.
    async fn wait_change(
        &self,
        name: &LockKey,
        seen: Option<FencingToken>,
        patience: Duration,
    ) -> Result<Option<Leader>, LockError> {
        let deadline = Instant::now() + patience;
        loop {
            let now = self.leader(name).await?;
            if now.as_ref().map(|l| l.term) != seen || Instant::now() >= deadline {
                return Ok(now);
            }
            tokio::time::sleep_until(deadline.min(Instant::now() + OBSERVE_POLL)).await;
        }
    }

    /// The error of a wait cut at its deadline (plus the grace) before any answer said
    /// the key was held: the server did not answer, so whether the key was granted is
    /// unknown (the engine's drop guards release a grant that lands later). The default
    /// is a [`LockError::Connection`] naming the backend; override it to name the
    /// server's address.
    fn unanswered(&self, wait: Duration) -> LockError {
        LockError::connection(self.info().name, unanswered_message(wait))
    }
}

/// The text of [`Engine::unanswered`]'s default, for engines that add an address.
pub fn unanswered_message(wait: Duration) -> String {
    format!(
        "the server did not answer within the wait of {wait:?}; whether the lock was \
         granted is unknown (a late grant is released)"
    )
}

/// What the attempts of one acquire learned: whether an answer showed the key held.
/// The generic acquire reads it when a wait runs out (a timeout, not a lack of answer)
/// and to mark a grant contended.
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
