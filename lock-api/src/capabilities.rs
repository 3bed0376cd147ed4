//! What a backend can promise, so callers and the conformance kit know what to expect.

/// Whether a backend offers one guarantee.
///
/// Exhaustive by choice (see the crate docs): a guarantee holds or it does not; a
/// partial one is `Unsupported`, with the text saying what remains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    /// The guarantee holds.
    Supported,
    /// The guarantee does not hold; the text says why, for reports and docs.
    Unsupported(&'static str),
}

impl Capability {
    /// Whether the guarantee holds.
    pub fn is_supported(self) -> bool {
        matches!(self, Capability::Supported)
    }
}

/// The guarantees a backend offers. Scenarios in the conformance kit are gated on these.
///
/// Non-exhaustive: start from [`Capabilities::all_supported`] and mark what you lack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// A lease not renewed expires after the TTL given at acquire, and not before.
    /// Session-bound backends (where the lease is the session) do not offer this.
    pub ttl_expiry: Capability,
    /// `extend` pushes a lease's expiry out.
    pub extend: Capability,
    /// Fencing tokens strictly increase per key across every grant, expiry takeovers
    /// included, and can be trusted by a fenced resource. Exactly the backends that
    /// support this hand tokens out: elsewhere `LockGuard::fencing_token` is `None`.
    pub fencing: Capability,
    /// Waiters are woken by the backend when the lock is released, rather than by polling.
    pub wake_on_release: Capability,
    /// Waiters are granted in the order they started waiting, across clients, when an
    /// acquire asks for [`crate::WaitOrder::Fifo`] (backends whose waiting is always
    /// FIFO report it too). Where unsupported, such an acquire is refused with
    /// [`crate::LockError::Unsupported`].
    pub fifo: Capability,
    /// The backend offers [`crate::DistributedSemaphore`].
    pub semaphore: Capability,
    /// The backend offers [`crate::DistributedRwLock`], with writer preference.
    pub rw_lock: Capability,
    /// The backend offers [`crate::LeaderElection`]: one leader at a time with rising
    /// terms, as its mutex promises exclusion.
    pub election: Capability,
}

impl Capabilities {
    /// Every guarantee supported.
    pub const fn all_supported() -> Self {
        Capabilities {
            ttl_expiry: Capability::Supported,
            extend: Capability::Supported,
            fencing: Capability::Supported,
            wake_on_release: Capability::Supported,
            fifo: Capability::Supported,
            semaphore: Capability::Supported,
            rw_lock: Capability::Supported,
            election: Capability::Supported,
        }
    }

    /// These capabilities with [`Capabilities::semaphore`], [`Capabilities::rw_lock`]
    /// and [`Capabilities::election`] unsupported for `reason` (such as [`NOT_YET`]):
    /// for backends offering the mutex only.
    pub const fn mutex_only(mut self, reason: &'static str) -> Self {
        self.semaphore = Capability::Unsupported(reason);
        self.rw_lock = Capability::Unsupported(reason);
        self.election = Capability::Unsupported(reason);
        self
    }

    /// These capabilities with [`Capabilities::election`] unsupported for `reason`.
    pub const fn without_election(mut self, reason: &'static str) -> Self {
        self.election = Capability::Unsupported(reason);
        self
    }
}

/// The reason a backend gives for a primitive (semaphore, read-write lock, election)
/// it does not offer yet.
pub const NOT_YET: &str = "not implemented for this backend yet";

/// A backend's name and guarantees.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackendInfo {
    /// Short name, as used in errors and reports (`memory`, `redis`, …).
    pub name: &'static str,
    /// The guarantees offered.
    pub capabilities: Capabilities,
}

impl BackendInfo {
    /// A backend named `name` (as used in errors and reports) offering `capabilities`.
    pub fn new(name: &'static str, capabilities: Capabilities) -> Self {
        BackendInfo { name, capabilities }
    }
}
