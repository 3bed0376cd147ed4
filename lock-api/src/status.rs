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

/// One holder of a semaphore permit or a read-write lock, as an inspection sees it.
/// Each field a backend cannot tell is `None`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct HolderStatus {
    /// Who holds it, in the backend's own words (a slot, a session), if known.
    pub holder: Option<String>,
    /// How long its lease lasts unless renewed, on backends whose leases expire.
    pub remaining: Option<Duration>,
    /// Its grant's fencing token, where the backend gives one.
    pub fencing_token: Option<FencingToken>,
}

impl HolderStatus {
    /// A holder the backend can say nothing more about; add with the `with_` methods.
    pub fn new() -> Self {
        HolderStatus::default()
    }

    /// Sets the holder description.
    pub fn with_holder(mut self, holder: Option<String>) -> Self {
        self.holder = holder;
        self
    }

    /// Sets the remaining lease.
    pub fn with_remaining(mut self, remaining: Option<Duration>) -> Self {
        self.remaining = remaining;
        self
    }

    /// Sets the fencing token.
    pub fn with_fencing_token(mut self, token: Option<FencingToken>) -> Self {
        self.fencing_token = token;
        self
    }
}

/// A semaphore key as an operator sees it (`distlock status --semaphore`), read without
/// taking a permit: a snapshot, stale by the time it returns.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct SemaphoreStatus {
    /// The permit count the holders use; `None` when nobody holds a permit (the next
    /// caller's count becomes the key's) or the backend cannot tell.
    pub permits: Option<u32>,
    /// The permits held now, one entry each.
    pub holders: Vec<HolderStatus>,
}

impl SemaphoreStatus {
    /// `holders` hold permits of a semaphore of `permits`.
    pub fn new(permits: Option<u32>, holders: Vec<HolderStatus>) -> Self {
        SemaphoreStatus { permits, holders }
    }
}

/// A read-write key as an operator sees it (`distlock status --rw`), read without
/// taking it: a snapshot, stale by the time it returns.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct RwStatus {
    /// How the key is held now: `None` when free.
    pub mode: Option<crate::RwMode>,
    /// Its holders (one writer, or the readers); `None` when the backend can tell the
    /// mode but not who holds it.
    pub holders: Option<Vec<HolderStatus>>,
    /// Whether a writer waits (holding new readers back); `None` when unknown.
    pub writer_waiting: Option<bool>,
}

impl RwStatus {
    /// A key held in `mode` (`None`: free) by `holders`, if known.
    pub fn new(mode: Option<crate::RwMode>, holders: Option<Vec<HolderStatus>>) -> Self {
        RwStatus {
            mode,
            holders,
            writer_waiting: None,
        }
    }

    /// Sets whether a writer waits.
    pub fn with_writer_waiting(mut self, waiting: Option<bool>) -> Self {
        self.writer_waiting = waiting;
        self
    }
}
