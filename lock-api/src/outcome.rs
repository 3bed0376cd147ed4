//! The typed outcomes of release and extend.

use tokio::time::Instant;

/// What an owner-checked release found.
///
/// Exhaustive by choice (see the crate docs): these are the cases a caller handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// Our lease was removed; the key is free.
    Released,
    /// The key no longer carried our lease (it expired or was already released) and
    /// nobody else holds it. Nothing was changed.
    Expired,
    /// Another owner holds the key. Their lock was left untouched.
    HeldByOther,
}

/// What an owner-checked extend found.
///
/// Exhaustive by choice (see the crate docs): these are the cases a caller handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtendOutcome {
    /// Our lease now lasts until `valid_until` (client monotonic clock, conservative).
    Extended {
        /// The new validity deadline.
        valid_until: Instant,
    },
    /// The key no longer carries our lease and nobody else holds it.
    Expired,
    /// Another owner holds the key. Their lock was left untouched.
    HeldByOther,
    /// The guard's lease was already lost (reported lost, or its validity deadline
    /// passed, possibly while this extend was in flight), so it was not extended: lost
    /// is final. Only [`crate::LockGuard::extend`] reports it; backends answer `Expired` or
    /// `HeldByOther` instead.
    Lost,
}
