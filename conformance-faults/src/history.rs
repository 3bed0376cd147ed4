//! [`History`]: every operation of every client, stamped on one harness clock.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

/// What an operation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Op {
    /// Take the lock.
    Acquire,
    /// Give it back.
    Release,
    /// Push the lease out.
    Extend,
    /// The holder learned its lease is gone (`lost()` fired, or a call said so).
    Lost,
    /// A write to the fenced resource (an add to the set, for the lost-update check).
    Write,
    /// A read of the fenced resource.
    Read,
}

/// Where an operation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Phase {
    /// It started.
    Invoke,
    /// It succeeded.
    Ok,
    /// It failed and had no effect (a timeout, a refusal, a stale write).
    Fail,
    /// It failed in a way that may or may not have had an effect (a broken connection).
    Unknown,
}

/// Which primitive a grant is of, for the exclusion checker. Each is a namespace of
/// its own, as in `distlock-api`: a mutex key and a semaphore key of the same name are
/// different locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Primitive {
    /// A mutex grant: no other grant of the key beside it.
    #[default]
    Mutex,
    /// One permit of a semaphore of `of` permits: at most `of` grants of the key at once.
    Permit {
        /// The semaphore's permit count.
        of: u32,
    },
    /// A read-write lock's read grant: beside other reads, never beside a write.
    Read,
    /// A read-write lock's write grant: beside no other grant of the key.
    Write,
}

/// One entry of a [`History`]. Times are microseconds since the history began.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Event {
    /// When it was recorded, on the harness's monotonic clock.
    pub at_us: u64,
    /// The client, numbered by the scenario.
    pub client: usize,
    /// The lock key (or resource name).
    pub key: String,
    /// The operation.
    pub op: Op,
    /// Its phase.
    pub phase: Phase,
    /// The lease's owner token, when there is a lease.
    pub owner: Option<String>,
    /// The fencing token the lease carries, or the write was made with.
    pub token: Option<u64>,
    /// The validity deadline the holder claims at this point, on the same clock.
    pub valid_until_us: Option<u64>,
    /// The element a write adds.
    pub value: Option<u64>,
    /// The whole set a read returned.
    pub seen: Option<Vec<u64>>,
    /// What the lease is of (a mutex unless set), on acquire events.
    pub primitive: Primitive,
}

impl Event {
    /// An event without a lease, token or value; `at_us` is set when recorded.
    pub fn new(client: usize, key: impl Into<String>, op: Op, phase: Phase) -> Self {
        Event {
            at_us: 0,
            client,
            key: key.into(),
            op,
            phase,
            owner: None,
            token: None,
            valid_until_us: None,
            value: None,
            seen: None,
            primitive: Primitive::Mutex,
        }
    }

    /// Sets the primitive the lease is of (a mutex unless set).
    pub fn primitive(mut self, primitive: Primitive) -> Self {
        self.primitive = primitive;
        self
    }

    /// Sets the owner token.
    pub fn owner(mut self, owner: impl ToString) -> Self {
        self.owner = Some(owner.to_string());
        self
    }

    /// Sets the fencing token; `None` (a grant or access without one) leaves it unset.
    pub fn token(mut self, token: impl Into<Option<u64>>) -> Self {
        self.token = token.into();
        self
    }

    /// Sets the claimed validity deadline, in microseconds on the history's clock.
    pub fn valid_until_us(mut self, at_us: u64) -> Self {
        self.valid_until_us = Some(at_us);
        self
    }

    /// Sets the element a write adds.
    pub fn value(mut self, value: u64) -> Self {
        self.value = Some(value);
        self
    }

    /// Sets the set a read saw.
    pub fn seen(mut self, seen: Vec<u64>) -> Self {
        self.seen = Some(seen);
        self
    }
}

/// A cheap, cloneable, thread-safe log of [`Event`]s from every client of a scenario,
/// all timed on one monotonic clock (the harness's), so that windows from different
/// clients compare.
#[derive(Debug, Clone)]
pub struct History {
    origin: Instant,
    events: Arc<Mutex<Vec<Event>>>,
}

impl Default for History {
    fn default() -> Self {
        History::new()
    }
}

impl History {
    /// An empty history whose clock starts now.
    pub fn new() -> Self {
        History {
            origin: Instant::now(),
            events: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// `instant` in microseconds on this history's clock (0 if before it began).
    pub fn micros(&self, instant: Instant) -> u64 {
        u64::try_from(instant.saturating_duration_since(self.origin).as_micros())
            .unwrap_or(u64::MAX)
    }

    /// Now, in microseconds on this history's clock.
    pub fn now_us(&self) -> u64 {
        self.micros(Instant::now())
    }

    /// Records `event`, stamped now.
    pub fn record(&self, mut event: Event) {
        event.at_us = self.now_us();
        self.push(event);
    }

    /// Records `event` with the time it already carries (for planted histories).
    pub fn push(&self, event: Event) {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(event);
    }

    /// Every event so far, in recording order.
    pub fn events(&self) -> Vec<Event> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many operations were invoked.
    pub fn operations(&self) -> usize {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|e| e.phase == Phase::Invoke)
            .count()
    }

    /// How long the history has run.
    pub fn elapsed(&self) -> Duration {
        self.origin.elapsed()
    }
}
