//! distlock-api's integration tests on the memory backend (the metrics test keeps a binary of its own: its recorder is process-global).
//!
//! One binary for the crate's integration tests (each file a module), so the
//! dependency tree is linked once; `scripts/run-tests.py` runs each module as a job
//! of its own.

mod acquire_rule;
mod guard;
