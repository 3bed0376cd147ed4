//! [`KeyStatus`]: what a backend can tell about a key without taking it.

use std::time::Duration;

use crate::FencingToken;

/// A key as an operator sees it (`distlock status`): read without taking or changing it.
///
/// Each field a backend cannot tell is `None`, so a caller never mistakes "unknown"
/// for "free" or "no expiry".
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct KeyStatus {
    /// Whether some owner holds the key now.
    pub held: bool,
    /// The holder's fencing token while held; when free, the last token handed out for
    /// the key, if the backend keeps it. `None` when the backend cannot tell.
    pub fencing_token: Option<FencingToken>,
    /// How long the holder's lease lasts unless renewed, on backends whose server
    /// expires leases. `None` when free, or when the lease is a session or a process.
    pub remaining: Option<Duration>,
    /// Who holds it, in the backend's own words (a session, a process id), if known.
    pub holder: Option<String>,
    /// How many waiters are queued for the key, on backends that keep a queue they
    /// can count (Redis in FIFO mode); `None` when the backend cannot tell.
    pub waiters: Option<usize>,
}

impl KeyStatus {
    /// A key nobody holds.
    pub fn free() -> Self {
        KeyStatus::default()
    }

    /// A held key; add what the backend knows with the `with_` methods.
    pub fn held() -> Self {
        KeyStatus {
            held: true,
            ..KeyStatus::default()
        }
    }

    /// Sets the fencing token.
    pub fn with_fencing_token(mut self, token: Option<FencingToken>) -> Self {
        self.fencing_token = token;
        self
    }

    /// Sets the remaining lease.
    pub fn with_remaining(mut self, remaining: Option<Duration>) -> Self {
        self.remaining = remaining;
        self
    }

    /// Sets the count of queued waiters.
    pub fn with_waiters(mut self, waiters: Option<usize>) -> Self {
        self.waiters = waiters;
        self
    }

    /// Sets the holder description.
    pub fn with_holder(mut self, holder: Option<String>) -> Self {
        self.holder = holder;
        self
    }
}
