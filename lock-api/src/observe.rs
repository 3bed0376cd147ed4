//! Metrics and tracing for every backend and every primitive.
//!
//! Metrics go through the [`metrics`] facade and tracing through [`tracing`]: both are
//! no-ops until the application installs a recorder or subscriber, so a library user
//! pays nothing for them. Every metric carries one label, [`BACKEND_LABEL`] (`memory`,
//! `redis`, …), and never the key, so cardinality stays at one series per backend.
//!
//! Where each is recorded, once for every backend:
//! - the primitives a [`crate::Client`] hands out (mutex, semaphore, read-write lock and
//!   election) record [`ACQUIRE_SECONDS`], [`WAIT_SECONDS`] and [`CONTENTION_TOTAL`],
//!   in the `acquire` span;
//! - [`crate::LockGuard`] (and so a [`crate::Leadership`]) records [`HOLD_SECONDS`] and
//!   [`LOST_TOTAL`] when it ends (released or dropped), in the `release` and `lost`
//!   spans, and [`RENEWALS_TOTAL`] / [`RENEWAL_FAILURES_TOTAL`] for explicit extends,
//!   in the `extend` span;
//! - the auto-renew watchdog records [`RENEWALS_TOTAL`] / [`RENEWAL_FAILURES_TOTAL`]
//!   in the `renew` span.
//!
//! Contention is what the backend reports: a grant after the key was found held
//! ([`crate::LockGuard::contended`]), a try that found it held, or a
//! [`crate::LockError::Timeout`].

pub use crate::metrics::{
    ACQUIRE_SECONDS, BACKEND_LABEL, CONTENTION_TOTAL, HOLD_SECONDS, LOST_TOTAL, RENEWALS_TOTAL,
    RENEWAL_FAILURES_TOTAL, WAIT_SECONDS,
};
