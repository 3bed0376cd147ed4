//! [`Report`]: what a conformance run found, as a table or JSON.

use std::fmt::Write as _;

use serde::Serialize;

use crate::Category;

/// The result of one scenario.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", content = "detail", rename_all = "lowercase")]
#[non_exhaustive]
pub enum Verdict {
    /// The scenario's checks held; the text holds measurements, if any.
    Passed(String),
    /// A check failed; the text says which and what was seen.
    Failed(String),
    /// The scenario does not apply; the text says why (usually a capability).
    Skipped(String),
}

impl Verdict {
    /// Whether this is [`Verdict::Failed`].
    pub fn is_failed(&self) -> bool {
        matches!(self, Verdict::Failed(_))
    }
}

/// One row of a [`Report`].
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct ScenarioResult {
    /// The scenario's name.
    pub name: &'static str,
    /// Its category.
    pub category: Category,
    /// What it found.
    pub verdict: Verdict,
    /// How long it ran, in milliseconds.
    pub elapsed_ms: u128,
}

/// Every scenario's result for one backend.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Report {
    /// The harness's name.
    pub backend: String,
    /// One row per scenario, in run order.
    pub results: Vec<ScenarioResult>,
}

impl Report {
    /// How many scenarios passed, failed and were skipped.
    pub fn counts(&self) -> (usize, usize, usize) {
        let mut counts = (0, 0, 0);
        for r in &self.results {
            match r.verdict {
                Verdict::Passed(_) => counts.0 += 1,
                Verdict::Failed(_) => counts.1 += 1,
                Verdict::Skipped(_) => counts.2 += 1,
            }
        }
        counts
    }

    /// Whether no scenario failed.
    pub fn all_passed(&self) -> bool {
        !self.results.iter().any(|r| r.verdict.is_failed())
    }

    /// Names of the failed scenarios.
    pub fn failed(&self) -> Vec<&'static str> {
        self.results
            .iter()
            .filter(|r| r.verdict.is_failed())
            .map(|r| r.name)
            .collect()
    }

    /// The report as a plain-text table with a closing `N passed, N failed, N skipped` line.
    pub fn to_table(&self) -> String {
        let width = self.results.iter().map(|r| r.name.len()).max().unwrap_or(8);
        let mut out = format!("conformance: {}\n", self.backend);
        for r in &self.results {
            let (status, detail) = match &r.verdict {
                Verdict::Passed(d) => ("PASS", d),
                Verdict::Failed(d) => ("FAIL", d),
                Verdict::Skipped(d) => ("SKIP", d),
            };
            let _ = writeln!(
                out,
                "{status}  {:<9} {:<width$}  {:>6} ms  {detail}",
                r.category.as_str(),
                r.name,
                r.elapsed_ms,
            );
        }
        let (passed, failed, skipped) = self.counts();
        let _ = writeln!(out, "{passed} passed, {failed} failed, {skipped} skipped");
        out
    }
}
