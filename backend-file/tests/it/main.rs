//! The file backend's integration tests.
//!
//! One binary for the crate's integration tests (each file a module), so the
//! dependency tree is linked once; `scripts/run-tests.py` runs each module as a job
//! of its own.

mod conformance;
mod election;
mod processes;
