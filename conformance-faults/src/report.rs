//! [`FaultReport`]: what the fault scenarios found, as a table, JSON or HTML.

use std::fmt::Write as _;

use serde::Serialize;

use super::checkers::{Findings, Grant};
use super::harness::{Claim, Fault};

/// The result of one fault scenario.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", content = "detail", rename_all = "lowercase")]
#[non_exhaustive]
pub enum FaultVerdict {
    /// No violation; the text holds measurements.
    Pass(String),
    /// A check failed, or violations were found where the backend claims safety.
    Fail(String),
    /// The scenario does not apply; the text says why.
    Skip(String),
    /// Violations found where the backend does not claim safety: shown, not failed.
    Shown(String),
}

impl FaultVerdict {
    /// The word the table shows.
    pub fn label(&self) -> &'static str {
        match self {
            FaultVerdict::Pass(_) => "PASS",
            FaultVerdict::Fail(_) => "FAIL",
            FaultVerdict::Skip(_) => "SKIP",
            FaultVerdict::Shown(_) => "SHOWN",
        }
    }

    /// The detail text.
    pub fn detail(&self) -> &str {
        match self {
            FaultVerdict::Pass(d)
            | FaultVerdict::Fail(d)
            | FaultVerdict::Skip(d)
            | FaultVerdict::Shown(d) => d,
        }
    }
}

/// One row of a [`FaultReport`].
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct FaultResult {
    /// The scenario's name.
    pub name: &'static str,
    /// The fault it injects.
    pub fault: Fault,
    /// What it found.
    pub verdict: FaultVerdict,
    /// How many operations its history recorded.
    pub operations: usize,
    /// How many violations the checkers found (fenced register only with fencing).
    pub violations: usize,
    /// The violations, by checker.
    pub findings: Findings,
    /// What the backend claims under this fault.
    pub claim: Claim,
    /// Every grant's claimed validity window, for the timeline (not in JSON).
    #[serde(skip)]
    pub grants: Vec<Grant>,
    /// How long it ran, in milliseconds.
    pub elapsed_ms: u128,
}

impl FaultResult {
    /// The guarantee claimed, in a few words.
    pub fn claim_text(&self) -> String {
        match &self.claim {
            Claim::Safe => "safe".to_owned(),
            Claim::NotClaimed(why) => format!("not claimed: {why}"),
        }
    }
}

/// Every fault scenario's result for one backend.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct FaultReport {
    /// The harness's name.
    pub backend: String,
    /// One row per scenario, in run order.
    pub results: Vec<FaultResult>,
}

impl FaultReport {
    /// Names of the failed scenarios.
    pub fn failed(&self) -> Vec<&'static str> {
        self.results
            .iter()
            .filter(|r| matches!(r.verdict, FaultVerdict::Fail(_)))
            .map(|r| r.name)
            .collect()
    }

    /// Whether no scenario failed.
    pub fn all_passed(&self) -> bool {
        self.failed().is_empty()
    }

    /// The verdict of scenario `name`, if it ran.
    pub fn verdict(&self, name: &str) -> Option<&FaultVerdict> {
        self.results
            .iter()
            .find(|r| r.name == name)
            .map(|r| &r.verdict)
    }

    /// A plain-text table (scenario, result, operations, violations, claim, detail)
    /// ending in a `N passed, N shown, N failed, N skipped` line.
    pub fn to_table(&self) -> String {
        let width = self.results.iter().map(|r| r.name.len()).max().unwrap_or(8);
        let mut out = format!("fault conformance: {}\n", self.backend);
        let _ = writeln!(
            out,
            "{:<5}  {:<width$}  {:>5}  {:>4}  {:<10}  detail",
            "", "scenario", "ops", "viol", "claim"
        );
        let mut counts = [0usize; 4];
        for r in &self.results {
            counts[match r.verdict {
                FaultVerdict::Pass(_) => 0,
                FaultVerdict::Shown(_) => 1,
                FaultVerdict::Fail(_) => 2,
                FaultVerdict::Skip(_) => 3,
            }] += 1;
            let claim = match r.claim {
                Claim::Safe => "safe",
                Claim::NotClaimed(_) => "not claimed",
            };
            let _ = writeln!(
                out,
                "{:<5}  {:<width$}  {:>5}  {:>4}  {:<10}  {}",
                r.verdict.label(),
                r.name,
                r.operations,
                r.violations,
                claim,
                r.verdict.detail()
            );
        }
        let _ = writeln!(
            out,
            "{} passed, {} shown, {} failed, {} skipped",
            counts[0], counts[1], counts[2], counts[3]
        );
        out
    }
}
