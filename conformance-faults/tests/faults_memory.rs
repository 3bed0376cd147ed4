//! The fault scenarios against the in-memory reference backend: those that need no
//! network or server run and pass, the others skip with their reason.

use std::sync::Arc;

use distlock_conformance::MemoryHarness;
use distlock_conformance_faults::{run_faults, FaultHarness, FaultVerdict, FAULT_SCENARIOS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_runs_what_applies_and_skips_the_rest_with_reasons() {
    let report = run_faults(Arc::new(MemoryHarness::new()) as Arc<dyn FaultHarness>).await;
    print!("{}", report.to_table());
    assert_eq!(report.results.len(), FAULT_SCENARIOS.len());
    assert!(report.all_passed(), "{}", report.to_table());
    assert!(
        matches!(
            report.verdict("paused_holder_wakes_to_a_refused_write"),
            Some(FaultVerdict::Pass(_))
        ),
        "{}",
        report.to_table()
    );
    let pause = &report.results[1];
    assert!(pause.operations >= 4, "{}", report.to_table());
    assert!(pause.findings.stale_writes_refused >= 1);
    for r in &report.results {
        if let FaultVerdict::Skip(why) = &r.verdict {
            assert!(!why.is_empty());
        }
    }
    let html = report.to_html();
    assert!(html.contains("<svg") && html.contains("paused_holder_wakes_to_a_refused_write"));
    // Self-contained: no scripts, no external style sheets.
    assert!(!html.contains("<script") && !html.contains("<link"));
    let json = serde_json::to_string(&report).expect("serialises");
    assert!(json.contains("\"status\":\"pass\""), "{json}");
}

#[test]
fn docs_list_every_fault_scenario() {
    let docs = include_str!("../../docs/conformance.md");
    for scenario in FAULT_SCENARIOS {
        assert!(
            docs.contains(&format!("| `{}` |", scenario.name)),
            "docs/conformance.md does not list {}",
            scenario.name
        );
    }
}

/// The macro a backend uses, on the memory backend: one test per fault scenario.
mod generated {
    use std::sync::Arc;

    use distlock_conformance::MemoryHarness;
    use distlock_conformance_faults::FaultHarness;

    distlock_conformance_faults::fault_conformance_tests!(
        async { Arc::new(MemoryHarness::new()) as Arc<dyn FaultHarness> },
        must_pass = [
            paused_holder_wakes_to_a_refused_write,
            paused_permit_holders_free_their_permits,
            paused_writer_frees_the_key_for_readers,
            paused_leader_wakes_to_a_refused_write
        ]
    );
}

/// The fault kit's self-test for the new primitives: the holder-pause scenarios run on
/// the deliberately broken semaphore, read-write lock and election fail, their
/// exclusion checker naming the mistake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primitive_scenarios_catch_the_broken_primitives() {
    use distlock_conformance::broken::{BrokenHarness, Mistake};
    use distlock_conformance_faults::{run_fault_scenario, Violation};

    let cases = [
        (
            Mistake::SemaphoreAdmitsOneMore,
            "paused_permit_holders_free_their_permits",
        ),
        (
            Mistake::ReadBesideWrite,
            "paused_writer_frees_the_key_for_readers",
        ),
        (
            Mistake::TwoLeaders,
            "paused_leader_wakes_to_a_refused_write",
        ),
    ];
    for (mistake, name) in cases {
        let scenario = FAULT_SCENARIOS
            .iter()
            .find(|s| s.name == name)
            .expect("the scenario exists");
        let harness = Arc::new(BrokenHarness::new(mistake)) as Arc<dyn FaultHarness>;
        let result = run_fault_scenario(harness, scenario).await;
        assert!(
            matches!(result.verdict, FaultVerdict::Fail(_)),
            "{name} on {mistake:?}: {:?}",
            result.verdict
        );
        let caught = result.findings.exclusion.iter().any(|v| match mistake {
            Mistake::SemaphoreAdmitsOneMore => matches!(v, Violation::TooManyPermits { .. }),
            Mistake::TwoLeaders => matches!(v, Violation::Overlap { .. }),
            _ => matches!(v, Violation::ReadBesideWrite { .. }),
        }) || matches!(
            // The split brain is caught before the history is complete: the standby
            // led while the stalled leader's validity still ran.
            (&result.verdict, mistake),
            (FaultVerdict::Fail(why), Mistake::TwoLeaders) if why.contains("validity had not run out")
        );
        assert!(caught, "{name} on {mistake:?}: {:?}", result.findings);
    }
}

/// A stand-in for one server whose faults do nothing, over a memory-backed harness:
/// it lets the server-fault election scenarios run without a server, so that the
/// self-test below can show they catch a split brain (and pass a sound election).
struct InertServer<H>(H);

#[async_trait::async_trait]
impl<H: distlock_conformance::Harness> distlock_conformance::Harness for InertServer<H> {
    fn name(&self) -> String {
        format!("{} (inert server)", self.0.name())
    }

    async fn client(&self) -> Result<distlock_conformance::Client, distlock_api::LockError> {
        self.0.client().await
    }
}

#[async_trait::async_trait]
impl<H: distlock_conformance::Harness> FaultHarness for InertServer<H> {
    fn topology(&self) -> distlock_conformance_faults::Topology {
        distlock_conformance_faults::Topology::Single
    }

    async fn control(
        &self,
        _node: usize,
        _action: distlock_conformance_faults::ServerAction,
    ) -> Result<(), String> {
        Ok(())
    }
}

/// The election's server-restart scenario: standbys campaigning while a leader leads
/// must not lead beside it. The broken election (each client elects itself) fails on
/// an overlap; the sound memory election passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_restart_scenario_catches_two_leaders() {
    use distlock_conformance::broken::{BrokenHarness, Mistake};
    use distlock_conformance_faults::{run_fault_scenario, Violation};

    let scenario = FAULT_SCENARIOS
        .iter()
        .find(|s| s.name == "server_restart_while_leading_and_campaigning")
        .expect("the scenario exists");
    let broken = Arc::new(InertServer(BrokenHarness::new(Mistake::TwoLeaders)));
    let result = run_fault_scenario(broken, scenario).await;
    assert!(
        matches!(result.verdict, FaultVerdict::Fail(_)),
        "{:?}",
        result.verdict
    );
    assert!(
        result
            .findings
            .exclusion
            .iter()
            .any(|v| matches!(v, Violation::Overlap { .. })),
        "{:?}",
        result.findings
    );
    let sound = Arc::new(InertServer(MemoryHarness::new()));
    let result = run_fault_scenario(sound, scenario).await;
    assert!(
        matches!(result.verdict, FaultVerdict::Pass(_)),
        "{:?}",
        result.verdict
    );
}
