//! Running fault scenarios: one isolated and checked, a selection into a report, or
//! one as a test.

use std::sync::Arc;
use std::time::Duration;

use distlock_conformance::Failure;
use tokio::time::timeout;

use crate::checkers::Findings;
use crate::harness::{Claim, FaultHarness};
use crate::report::{FaultReport, FaultResult, FaultVerdict};
use crate::scenarios::{FaultScenario, Outcome, FAULT_SCENARIOS, PROVIDER_LACKS};

/// The most any one fault scenario may take.
const LIMIT: Duration = Duration::from_secs(300);

/// Runs one fault scenario, isolated (a panic or a hang is a failure), then checks its
/// history. The fenced-register checker counts only on backends with fencing.
pub async fn run_fault_scenario(h: Arc<dyn FaultHarness>, scenario: &FaultScenario) -> FaultResult {
    let started = std::time::Instant::now();
    let claim = h.claim(scenario.fault);
    let fencing = match h.client().await {
        Ok(c) => c.info().capabilities.mutex.fencing.is_supported(),
        Err(_) => false,
    };
    let run = scenario.run;
    let harness = h.clone();
    let mut task = tokio::spawn(async move { run(&*harness).await });
    let outcome = match timeout(LIMIT, &mut task).await {
        Err(_) => {
            task.abort();
            Err(Failure::Failed(format!("did not finish within {LIMIT:?}")))
        }
        Ok(Err(join)) => Err(Failure::Failed(format!("panicked: {join}"))),
        Ok(Ok(outcome)) => outcome,
    };
    let (verdict, operations, findings, grants) = match outcome {
        Err(Failure::Skipped(why)) => (FaultVerdict::Skip(why), 0, Findings::default(), Vec::new()),
        Err(Failure::Failed(why)) => (FaultVerdict::Fail(why), 0, Findings::default(), Vec::new()),
        Err(other) => (
            FaultVerdict::Fail(format!("{other:?}")),
            0,
            Findings::default(),
            Vec::new(),
        ),
        Ok(Outcome { detail, history }) => {
            let events = history.events();
            let mut findings = Findings::of(&events);
            if !fencing {
                findings.fenced_register.clear();
            }
            let verdict = match (&claim, findings.total()) {
                (_, 0) => FaultVerdict::Pass(detail),
                (Claim::Safe, n) => FaultVerdict::Fail(format!(
                    "{n} violation(s): {}; {detail}",
                    findings
                        .all()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ")
                )),
                (Claim::NotClaimed(_), n) => FaultVerdict::Shown(format!(
                    "{n} violation(s) shown ({} refused by fencing): {}; {detail}",
                    findings.stale_writes_refused,
                    findings
                        .all()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ")
                )),
            };
            (
                verdict,
                history.operations(),
                findings,
                super::checkers::grants(&events),
            )
        }
    };
    FaultResult {
        name: scenario.name,
        fault: scenario.fault,
        verdict,
        operations,
        violations: findings.total(),
        findings,
        claim,
        grants,
        elapsed_ms: started.elapsed().as_millis(),
    }
}

/// Runs every fault scenario against `h`, one after another.
pub async fn run_faults(h: Arc<dyn FaultHarness>) -> FaultReport {
    run_selected_faults(h, |_| true).await
}

/// Runs the fault scenarios `select` picks against `h`, one after another.
pub async fn run_selected_faults(
    h: Arc<dyn FaultHarness>,
    select: impl Fn(&FaultScenario) -> bool,
) -> FaultReport {
    let mut results = Vec::new();
    for scenario in FAULT_SCENARIOS.iter().filter(|s| select(s)) {
        results.push(run_fault_scenario(h.clone(), scenario).await);
    }
    FaultReport {
        backend: h.name(),
        results,
    }
}

/// Runs the fault scenario called `name` as a test and prints its result. Used by
/// [`fault_conformance_tests!`](crate::fault_conformance_tests).
///
/// # Panics
/// When no scenario has that name, when it fails, or, with `must_pass`, when it
/// only shows violations or skips for a reason other than [`PROVIDER_LACKS`].
pub async fn run_fault_scenario_test(name: &str, harness: Arc<dyn FaultHarness>, must_pass: bool) {
    let Some(scenario) = FAULT_SCENARIOS.iter().find(|s| s.name == name) else {
        panic!("no fault scenario is called {name}");
    };
    let report = FaultReport {
        backend: harness.name(),
        results: vec![run_fault_scenario(harness, scenario).await],
    };
    print!("{}", report.to_table());
    match &report.results[0].verdict {
        FaultVerdict::Pass(_) => {}
        FaultVerdict::Fail(why) => panic!("{name} on {} failed: {why}", report.backend),
        FaultVerdict::Skip(why) if must_pass && !why.starts_with(PROVIDER_LACKS) => {
            panic!("{name} on {} must pass, but skipped: {why}", report.backend)
        }
        other @ FaultVerdict::Shown(_) if must_pass => {
            panic!("{name} on {} must pass, but: {other:?}", report.backend)
        }
        FaultVerdict::Skip(why) => println!("{name} on {}: SKIPPED: {why}", report.backend),
        FaultVerdict::Shown(why) => println!(
            "{name} on {}: violations shown, not claimed: {why}",
            report.backend
        ),
    }
}

/// A guard held by each test [`fault_conformance_tests!`](crate::fault_conformance_tests)
/// generates, so the fault scenarios of one test binary run one at a time.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    ONE_AT_A_TIME.lock().await
}
