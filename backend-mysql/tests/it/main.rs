//! The MySQL backend's integration tests against a real MariaDB (Debian's
//! `mariadb-server`).
//!
//! One binary for the crate's integration tests (each file a module), so the
//! dependency tree is linked once; `scripts/run-tests.py` runs each module as a job
//! of its own.

mod common;
mod conformance;
mod connect;
mod fault_conformance;
mod faults;
mod interop;
mod tls;
