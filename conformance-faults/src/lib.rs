//! Fault-injection conformance for distlock backends: what a backend does when the
//! network or its servers misbehave, checked from a recorded [`History`] by three
//! [`checkers`], with one test per fault scenario from [`fault_conformance_tests!`].
//!
//! Implement [`FaultHarness`] for your backend (or use [`ServerHarness`], over
//! throwaway servers from [`distlock_test_servers`] that your test starts, with your
//! backend's URL template and claims, every client behind its own [`FaultProxy`] with
//! a crash hook; or [`ProxiedHarness`], which puts proxies in front of servers given
//! by URL, for network faults only), then generate the tests, or call [`run_faults`]
//! for a [`FaultReport`]: a table, JSON, or a self-contained HTML page with a timeline
//! of grants. Its public API follows semver, like `distlock-conformance`.

// docs.rs (`--cfg docsrs`, nightly) shows which feature each gated item needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod checkers;
mod harness;
mod history;
mod html;
mod macros;
mod proxied;
mod record;
mod report;
mod runner;
mod scenarios;
mod server_harness;

pub use checkers::{Findings, Grant, Violation};
pub use harness::{
    Claim, Fault, FaultClient, FaultHarness, NetFaults, ServerAction, Topology, NOT_CONTROLLED,
};
pub use history::{Event, History, Op, Phase, Primitive};
pub use html::html_page;
pub use proxied::ProxiedHarness;
pub use record::{pause_holder, FencedSet, Recorder};
pub use report::{FaultReport, FaultResult, FaultVerdict};
pub use runner::{
    run_fault_scenario, run_fault_scenario_test, run_faults, run_selected_faults, serial,
};
pub use scenarios::{FaultScenario, FAULT_SCENARIOS, PROVIDER_LACKS};
pub use server_harness::{ServerHarness, SessionTerminator};

#[cfg(doc)]
use distlock_test_servers::FaultProxy;
