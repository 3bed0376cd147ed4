//! The ZooKeeper backend's integration tests against real ZooKeeper servers and ensembles.
//!
//! One binary for the crate's integration tests (each file a module), so the
//! dependency tree is linked once; `scripts/run-tests.py` runs each module as a job
//! of its own.

mod common;
mod conformance;
mod curator;
mod election;
mod failover;
mod fault_conformance;
mod faults;
mod primitives;
mod recipe;
mod secure_conformance;
mod security;
mod session_config;
mod shutdown;
