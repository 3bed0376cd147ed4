//! What a backend can promise, per primitive, so that callers, the generic primitive
//! implementations and the conformance kit read every claim from one place.

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

/// The four primitives a backend may offer.
///
/// Exhaustive by choice: a new primitive changes what every backend must answer for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Primitive {
    /// [`crate::DistributedLock`].
    Mutex,
    /// [`crate::DistributedSemaphore`].
    Semaphore,
    /// [`crate::DistributedRwLock`].
    RwLock,
    /// [`crate::LeaderElection`].
    Election,
}

impl Primitive {
    /// Every primitive, in the order reports list them.
    pub const ALL: [Primitive; 4] = [
        Primitive::Mutex,
        Primitive::Semaphore,
        Primitive::RwLock,
        Primitive::Election,
    ];

    /// `"mutex"`, `"semaphore"`, `"read-write lock"` or `"election"`, for errors and
    /// reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Primitive::Mutex => "mutex",
            Primitive::Semaphore => "semaphore",
            Primitive::RwLock => "read-write lock",
            Primitive::Election => "election",
        }
    }
}

/// The guarantees one primitive of a backend offers. The generic primitive
/// implementations refuse what is unsupported here (an acquire of a primitive not
/// offered, a FIFO wait without [`Guarantees::fifo`], an extend without
/// [`Guarantees::extend`]), and the conformance kit gates its scenarios on it and
/// checks each claim against behaviour.
///
/// Non-exhaustive: start from [`Guarantees::all_supported`] and mark what you lack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Guarantees {
    /// The backend offers the primitive at all. When unsupported, every acquire of it
    /// is refused with [`crate::LockError::Unsupported`] giving this reason, and the
    /// other flags say nothing.
    pub offered: Capability,
    /// A lease not renewed expires after the TTL given at acquire, and not before.
    /// Session-bound backends (where the lease is the session) do not offer this.
    pub ttl_expiry: Capability,
    /// `extend` pushes a lease's expiry out.
    pub extend: Capability,
    /// Fencing tokens strictly increase per key across every grant, expiry takeovers
    /// included, and can be trusted by a fenced resource. Exactly the primitives that
    /// support this hand tokens out: elsewhere `LockGuard::fencing_token` is `None`.
    pub fencing: Capability,
    /// Waiters are woken by the backend when the key is released, rather than by
    /// polling.
    pub wake_on_release: Capability,
    /// Waiters are granted in the order they started waiting, across clients, when an
    /// acquire asks for [`crate::WaitOrder::Fifo`] (backends whose waiting is always
    /// FIFO report it too). Where unsupported, such an acquire is refused with
    /// [`crate::LockError::Unsupported`].
    pub fifo: Capability,
    /// A lease left to run out ([`crate::LockGuard::let_expire`]) stays held until its
    /// TTL even once its client closes or its process exits, so it can mark work done
    /// for others to see ([`crate::run_once`]'s done mark). Unsupported where the
    /// server frees a client's locks when its session or process ends.
    pub outlives_client: Capability,
}

impl Guarantees {
    /// Every guarantee supported.
    pub const fn all_supported() -> Self {
        Guarantees {
            offered: Capability::Supported,
            ttl_expiry: Capability::Supported,
            extend: Capability::Supported,
            fencing: Capability::Supported,
            wake_on_release: Capability::Supported,
            fifo: Capability::Supported,
            outlives_client: Capability::Supported,
        }
    }

    /// A primitive the backend does not offer, for `reason` (such as [`NOT_YET`]).
    pub const fn not_offered(reason: &'static str) -> Self {
        let no = Capability::Unsupported(reason);
        Guarantees {
            offered: no,
            ttl_expiry: no,
            extend: no,
            fencing: no,
            wake_on_release: no,
            fifo: no,
            outlives_client: no,
        }
    }
}

/// The guarantees a backend offers, one [`Guarantees`] per primitive.
///
/// Non-exhaustive: start from [`Capabilities::all_supported`] and mark what you lack,
/// per primitive (`capabilities.semaphore.fifo = …`) or on every primitive at once
/// ([`Capabilities::with_every`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// The mutex's ([`crate::DistributedLock`]).
    pub mutex: Guarantees,
    /// The semaphore's ([`crate::DistributedSemaphore`]).
    pub semaphore: Guarantees,
    /// The read-write lock's ([`crate::DistributedRwLock`], with writer preference).
    pub rw_lock: Guarantees,
    /// Leader election's ([`crate::LeaderElection`]: one leader at a time with rising
    /// terms, as the mutex promises exclusion).
    pub election: Guarantees,
}

impl Capabilities {
    /// Every guarantee of every primitive supported.
    pub const fn all_supported() -> Self {
        Capabilities {
            mutex: Guarantees::all_supported(),
            semaphore: Guarantees::all_supported(),
            rw_lock: Guarantees::all_supported(),
            election: Guarantees::all_supported(),
        }
    }

    /// The guarantees of `primitive`.
    pub fn of(&self, primitive: Primitive) -> &Guarantees {
        match primitive {
            Primitive::Mutex => &self.mutex,
            Primitive::Semaphore => &self.semaphore,
            Primitive::RwLock => &self.rw_lock,
            Primitive::Election => &self.election,
        }
    }

    /// These capabilities with `change` applied to the guarantees of every primitive,
    /// for a trait all of a backend's primitives share (no TTL expiry on a
    /// session-bound backend, say).
    pub fn with_every(mut self, change: impl Fn(&mut Guarantees)) -> Self {
        for guarantees in [
            &mut self.mutex,
            &mut self.semaphore,
            &mut self.rw_lock,
            &mut self.election,
        ] {
            change(guarantees);
        }
        self
    }

    /// These capabilities with the semaphore, the read-write lock and election not
    /// offered, for `reason`: for backends offering the mutex only.
    pub const fn mutex_only(mut self, reason: &'static str) -> Self {
        self.semaphore = Guarantees::not_offered(reason);
        self.rw_lock = Guarantees::not_offered(reason);
        self.election = Guarantees::not_offered(reason);
        self
    }

    /// These capabilities with election not offered, for `reason`.
    pub const fn without_election(mut self, reason: &'static str) -> Self {
        self.election = Guarantees::not_offered(reason);
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
    /// The guarantees offered, per primitive.
    pub capabilities: Capabilities,
    /// How a lock ends that its holder could not release (a release that failed, a
    /// process that died): one clause for operators, such as "it is freed when its
    /// lease runs out on the server".
    pub unreleased_lock_ends: &'static str,
    /// Whether [`crate::ReleaseOutcome::Released`] shows that no one else held the lock
    /// since the grant. Not on a quorum of independent nodes, where the lease found on
    /// one node says nothing of the others.
    pub release_shows_continuity: bool,
}

impl BackendInfo {
    /// A backend named `name` (as used in errors and reports) offering `capabilities`,
    /// whose unreleased locks end with their lease, and whose releases show continuity.
    pub fn new(name: &'static str, capabilities: Capabilities) -> Self {
        BackendInfo {
            name,
            capabilities,
            unreleased_lock_ends: "it is freed when the backend ends its lease",
            release_shows_continuity: true,
        }
    }

    /// Says how a lock its holder could not release ends (see
    /// [`BackendInfo::unreleased_lock_ends`]).
    pub fn with_unreleased_lock_ends(mut self, clause: &'static str) -> Self {
        self.unreleased_lock_ends = clause;
        self
    }

    /// Says a found lease does not show continuity (see
    /// [`BackendInfo::release_shows_continuity`]).
    pub fn without_release_continuity(mut self) -> Self {
        self.release_shows_continuity = false;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_primitive_not_offered_claims_nothing_and_every_change_reaches_all() {
        let caps = Capabilities::all_supported()
            .with_every(|g| g.fifo = Capability::Unsupported("no queue"))
            .mutex_only("mutex only");
        assert!(caps.mutex.offered.is_supported());
        assert_eq!(caps.mutex.fifo, Capability::Unsupported("no queue"));
        for primitive in [Primitive::Semaphore, Primitive::RwLock, Primitive::Election] {
            let g = caps.of(primitive);
            assert_eq!(g.offered, Capability::Unsupported("mutex only"));
            assert!(!g.fencing.is_supported());
        }
    }
}
