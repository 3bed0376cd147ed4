//! The Postgres backend's integration tests against a real PostgreSQL.
//!
//! One binary for the crate's integration tests (each file a module), so the
//! dependency tree is linked once; `scripts/run-tests.py` runs each module as a job
//! of its own.

mod common;
mod conformance;
mod connect;
mod election;
mod fault_conformance;
mod faults;
mod hash;
mod pgbouncer;
mod pgbouncer_conformance;
mod pgbouncer_faults;
mod pooler;
mod primitives;
mod scale;
mod tls;
mod xact;
