//! The throwaway servers, started and controlled for real.
//!
//! One binary for the crate's integration tests (each file a module), so the
//! dependency tree is linked once; `scripts/run-tests.py` runs each module as a job
//! of its own.

mod containers;
mod pgbouncer;
mod servers;
