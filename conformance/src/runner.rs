//! Running scenarios: one, all (a [`Report`]), as a test, or against the broken backends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::report::ScenarioResult;
use crate::scenarios::{Failure, Requirement, Scenario, SCENARIOS};
use crate::{broken, Harness, Report, Verdict};

/// The most any one scenario may take before it counts as hung.
const SCENARIO_LIMIT: Duration = Duration::from_secs(120);

/// Why `scenario` cannot run on this harness, if it cannot.
async fn skip_reason(harness: &dyn Harness, scenario: &Scenario) -> Result<Option<String>, String> {
    let client = harness
        .client()
        .await
        .map_err(|e| format!("could not create a client: {e}"))?;
    let caps = client.info().capabilities;
    for requirement in scenario.requires {
        let missing = match requirement.capability(&caps, scenario.primitive()) {
            Some(capability) => match capability {
                distlock_api::Capability::Supported => None,
                distlock_api::Capability::Unsupported(why) => {
                    Some(format!("needs {requirement:?}: {why}"))
                }
            },
            None if *requirement == Requirement::CrashFault && client.faults.is_none() => {
                Some("needs a crash fault hook, which this harness lacks".to_owned())
            }
            None if *requirement == Requirement::UrlConnector
                && harness.url_connector().is_none() =>
            {
                Some("needs a URL connector, which this harness lacks".to_owned())
            }
            None => None,
        };
        if missing.is_some() {
            return Ok(missing);
        }
    }
    Ok(None)
}

/// Runs one scenario, isolated: a panic or a hang is reported as a failure.
pub async fn run_scenario(harness: Arc<dyn Harness>, scenario: &Scenario) -> ScenarioResult {
    let started = Instant::now();
    let run = scenario.run;
    let verdict = match skip_reason(&*harness, scenario).await {
        Err(e) => Verdict::Failed(e),
        Ok(Some(why)) => Verdict::Skipped(why),
        Ok(None) => {
            let mut task = tokio::spawn(async move { run(&*harness).await });
            match tokio::time::timeout(SCENARIO_LIMIT, &mut task).await {
                Err(_) => {
                    // Stop it, so it holds no locks while the next scenarios run.
                    task.abort();
                    Verdict::Failed(format!("did not finish within {SCENARIO_LIMIT:?}"))
                }
                Ok(Err(join)) => Verdict::Failed(format!("panicked: {join}")),
                Ok(Ok(Ok(detail))) => Verdict::Passed(detail),
                Ok(Ok(Err(Failure::Failed(why)))) => Verdict::Failed(why),
                Ok(Ok(Err(Failure::Skipped(why)))) => Verdict::Skipped(why),
            }
        }
    };
    ScenarioResult {
        name: scenario.name,
        category: scenario.category,
        verdict,
        elapsed_ms: started.elapsed().as_millis(),
    }
}

/// Runs every scenario, one after another, and reports.
pub async fn run_all(harness: Arc<dyn Harness>) -> Report {
    let mut results = Vec::with_capacity(SCENARIOS.len());
    for scenario in SCENARIOS {
        results.push(run_scenario(harness.clone(), scenario).await);
    }
    Report {
        backend: harness.name(),
        results,
    }
}

/// Runs the scenario called `name` as a test: panics with the reason if it fails or
/// does not exist, prints the reason if it is skipped. Used by
/// [`conformance_tests!`](crate::conformance_tests).
pub async fn run_scenario_test(name: &str, harness: Arc<dyn Harness>) {
    let Some(scenario) = SCENARIOS.iter().find(|s| s.name == name) else {
        panic!("no conformance scenario is called {name}");
    };
    let result = run_scenario(harness.clone(), scenario).await;
    match result.verdict {
        Verdict::Passed(detail) => println!("{name} on {}: passed {detail}", harness.name()),
        Verdict::Skipped(why) => println!("{name} on {}: SKIPPED: {why}", harness.name()),
        Verdict::Failed(why) => panic!("{name} on {} failed: {why}", harness.name()),
    }
}

/// One deliberately broken backend and the scenarios that caught it.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct SelfTestRow {
    /// The mistake's name.
    pub mistake: &'static str,
    /// What the broken backend does wrong.
    pub description: &'static str,
    /// The scenarios it failed; empty means the kit missed it.
    pub caught_by: Vec<&'static str>,
}

/// The kit run against the reference backend and every broken backend.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct SelfTestReport {
    /// The correct memory backend's report: it must pass everything.
    pub reference: Report,
    /// One row per broken backend.
    pub rows: Vec<SelfTestRow>,
}

impl SelfTestReport {
    /// How many broken backends failed at least one scenario.
    pub fn caught(&self) -> usize {
        self.rows.iter().filter(|r| !r.caught_by.is_empty()).count()
    }

    /// Whether the reference passed and every mistake was caught.
    pub fn all_good(&self) -> bool {
        self.reference.all_passed() && self.caught() == self.rows.len()
    }

    /// A plain-text table ending in "N/N anti-patterns caught".
    pub fn to_table(&self) -> String {
        let (passed, failed, skipped) = self.reference.counts();
        let mut out = format!(
            "reference memory backend: {passed} passed, {failed} failed, {skipped} skipped\n"
        );
        for row in &self.rows {
            let verdict = if row.caught_by.is_empty() {
                "MISSED".to_owned()
            } else {
                format!("caught by {}", row.caught_by.join(", "))
            };
            out.push_str(&format!("{:<28} {verdict}\n", row.mistake));
        }
        out.push_str(&format!(
            "{}/{} anti-patterns caught\n",
            self.caught(),
            self.rows.len()
        ));
        out
    }
}

/// Runs the kit against the memory backend and against each broken backend in
/// [`broken`], to prove the kit passes what is right and fails what is wrong.
pub async fn self_test() -> SelfTestReport {
    // The reference and the broken backends run side by side: most of their time is
    // spent waiting.
    let reference = tokio::spawn(run_all(Arc::new(crate::MemoryHarness::new())));
    let runs: Vec<_> = broken::Mistake::ALL
        .into_iter()
        .map(|mistake| {
            let run = tokio::spawn(run_all(Arc::new(broken::BrokenHarness::new(mistake))));
            (mistake, run)
        })
        .collect();
    let mut rows = Vec::new();
    for (mistake, run) in runs {
        let caught_by = match run.await {
            Ok(report) => report.failed(),
            Err(_) => vec!["(the run itself panicked)"],
        };
        rows.push(SelfTestRow {
            mistake: mistake.name(),
            description: mistake.description(),
            caught_by,
        });
    }
    let reference = match reference.await {
        Ok(report) => report,
        // As when it ran on the caller's task: its panic is the caller's.
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => panic!("the reference run was cancelled: {e}"),
    };
    SelfTestReport { reference, rows }
}
