//! Proves the kit can fail: every deliberately broken backend fails at least one named
//! scenario, and the correct memory backend passes every scenario.

use distlock_conformance::broken::Mistake;
use distlock_conformance::self_test;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_anti_pattern_is_caught_and_the_reference_passes() {
    let report = self_test().await;
    println!("{}", report.to_table());
    assert!(
        report.reference.all_passed(),
        "the memory backend failed: {:?}",
        report.reference.failed()
    );
    let (_, _, skipped) = report.reference.counts();
    // Only the URL scenario needs a connector the plain memory harness lacks, the FIFO
    // scenario a waiting order the memory store does not promise, and the refusal of
    // unoffered primitives a primitive memory lacks.
    assert_eq!(skipped, 3, "{}", report.reference.to_table());
    assert_eq!(report.rows.len(), Mistake::ALL.len());
    for row in &report.rows {
        assert!(
            !row.caught_by.is_empty(),
            "the kit missed {}: {}",
            row.mistake,
            row.description
        );
    }
    assert_eq!(report.caught(), Mistake::ALL.len());
}

#[test]
fn docs_list_every_scenario() {
    let docs = include_str!("../../../docs/conformance.md");
    for scenario in distlock_conformance::SCENARIOS {
        assert!(
            docs.contains(&format!("`{}`", scenario.name)),
            "docs/conformance.md does not list {}",
            scenario.name
        );
    }
}
