//! The distlock conformance kit: the same named safety, liveness, TTL and bad-input
//! scenarios for every [`distlock_api::DistributedLock`] backend, ours or yours.
//!
//! Implement [`Harness`] for your backend, then either generate one test per scenario
//! with [`conformance_tests!`], or call [`run_all`] for a [`Report`].
//! Scenarios a backend cannot pass by design are skipped with the reason from its
//! [`distlock_api::Capabilities`]. [`self_test`] proves the kit catches the classic
//! mistakes, using the deliberately broken backends in [`broken`].
//!
//! Stability: this is the crate a backend author depends on, and its public API
//! follows semver: a scenario may be added in a minor release (a new test from
//! [`conformance_tests!`]), never renamed or weakened in one. The building blocks in
//! [`support`] are the exception and may change in any release. Fault scenarios are
//! in `distlock-conformance-faults`, throwaway servers in `distlock-test-servers`.

// docs.rs (`--cfg docsrs`, nightly) shows which feature each gated item needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod broken;
mod fenced;
mod harness;
mod macros;
mod memory_harness;
mod report;
mod runner;
mod scenarios;
pub mod support;

pub use fenced::{FencedStore, StaleWrite};
pub use harness::{Client, ClientFaults, Harness, UrlConnector};
pub use memory_harness::MemoryHarness;
pub use report::{Report, ScenarioResult, Verdict};
pub use runner::{run_all, run_scenario, run_scenario_test, self_test, SelfTestReport};
pub use scenarios::{Category, Failure, Requirement, Scenario, SCENARIOS};
