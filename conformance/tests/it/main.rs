//! The conformance kit on the memory backend, and its self-test on the broken backends.
//!
//! One binary for the crate's integration tests (each file a module), so the
//! dependency tree is linked once; `scripts/run-tests.py` runs each module as a job
//! of its own.

mod memory;
mod self_test;
