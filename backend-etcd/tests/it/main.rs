//! The etcd backend's integration tests against real etcd servers and clusters.
//!
//! One binary for the crate's integration tests (each file a module), so the
//! dependency tree is linked once; `scripts/run-tests.py` runs each module as a job
//! of its own.

mod common;
mod conformance;
mod election;
mod fault_conformance;
mod names;
mod primitives;
mod recipe;
mod session_lease;
mod tls;
