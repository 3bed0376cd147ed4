//! The `distlock` binary's integration tests, run as a user runs it.
//!
//! One binary for the crate's integration tests (each file a module), so the
//! dependency tree is linked once; `scripts/run-tests.py` runs each module as a job
//! of its own.

mod bench;
mod bench_primitives;
mod cli;
mod cli_servers;
mod elect;
mod escaping;
mod etcd;
mod exec;
mod exec_lease;
mod exec_modes;
mod exec_pgbouncer;
mod exec_servers;
mod exec_ttl;
mod mysql_tls;
mod postgres_tls;
mod redis_topologies;
mod redlock;
mod status;
mod status_primitives;
mod status_redis;
