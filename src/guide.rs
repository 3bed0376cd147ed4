//! The guide: one page per subject, from `docs/guide/` in the repository.
//!
//! Each page is a module with no items, so that its Rust snippets are compiled and run
//! as doc tests (as clap's tutorial is).

#![doc = include_str!("../docs/guide/README.md")]

#[doc = include_str!("../docs/guide/semantics.md")]
pub mod semantics {}

#[doc = include_str!("../docs/guide/primitives.md")]
pub mod primitives {}

#[doc = include_str!("../docs/guide/backend-memory.md")]
pub mod backend_memory {}

#[doc = include_str!("../docs/guide/backend-file.md")]
pub mod backend_file {}

#[doc = include_str!("../docs/guide/backend-redis.md")]
pub mod backend_redis {}

#[doc = include_str!("../docs/guide/backend-postgres.md")]
pub mod backend_postgres {}

#[doc = include_str!("../docs/guide/backend-mysql.md")]
pub mod backend_mysql {}

#[doc = include_str!("../docs/guide/backend-zookeeper.md")]
pub mod backend_zookeeper {}

#[doc = include_str!("../docs/guide/backend-etcd.md")]
pub mod backend_etcd {}

#[doc = include_str!("../docs/guide/topologies-and-security.md")]
pub mod topologies_and_security {}

#[doc = include_str!("../docs/guide/faults.md")]
pub mod faults {}

#[doc = include_str!("../docs/guide/observability.md")]
pub mod observability {}

#[doc = include_str!("../docs/guide/conformance-kit.md")]
pub mod conformance_kit {}

#[doc = include_str!("../docs/guide/cli.md")]
pub mod cli {}

#[doc = include_str!("../docs/guide/scheduled-jobs.md")]
pub mod scheduled_jobs {}
