//! The Redis backend's integration tests against real redis-servers, Sentinels and Clusters.
//!
//! One binary for the crate's integration tests (each file a module), so the
//! dependency tree is linked once; `scripts/run-tests.py` runs each module as a job
//! of its own.

mod cluster;
mod common;
mod conformance;
mod connect;
mod connect_topologies;
mod election;
mod failover_replicas;
mod fault_conformance;
mod faults;
mod fencing;
mod fifo;
mod handoff;
mod native;
mod primitives;
mod replicas;
mod residue;
mod sentinel;
mod settle;
mod tls;
mod topology_faults;
mod transient;
