//! Building blocks the scenarios are written with, for kits built on this one (such as
//! `distlock-conformance-faults`) and for a backend's own extra scenarios.
//!
//! Unlike the scenarios, the runner and [`crate::Harness`], these helpers are not
//! covered by the crate's stability promise: they change when the scenarios need it.

pub use crate::scenarios::fifo::{fifo_with_ttl, until_queued, Arrival};
pub use crate::scenarios::{millis, no_wait, unique_key, waiting, LONG_TTL};
