//! The fault scenarios of the conformance kit against real ZooKeeper: a standalone
//! server (every scenario that applies) and a 3-node ensemble (leader loss), every
//! client behind its own proxies with a 2 s session.

mod common;

use std::sync::Arc;
use std::time::Duration;

use distlock_api::DistributedLock;
use distlock_conformance::UrlConnector;
use distlock_conformance_faults::{
    run_faults, run_selected_faults, FaultHarness, FaultReport, FaultVerdict, ServerHarness,
    ServerKind,
};
use distlock_zookeeper::ZooKeeperLock;

fn connector() -> UrlConnector {
    Arc::new(|url: String| {
        Box::pin(async move {
            let lock =
                ZooKeeperLock::connect_with(&url, common::config(common::SESSION_TIMEOUT)).await?;
            Ok(Arc::new(lock) as Arc<dyn DistributedLock>)
        })
    })
}

async fn harness(kind: ServerKind) -> Arc<dyn FaultHarness> {
    // A cut-off holder keeps its lock until its session expires: the timeout rounded
    // up to the server's tick, plus a tick for the sweep.
    let crash_bound = common::SESSION_TIMEOUT + 2 * common::TICK;
    let harness = ServerHarness::start(kind, connector())
        .await
        .unwrap_or_else(|e| panic!("could not start ZooKeeper (run scripts/test.sh): {e}"))
        .with_timing(Duration::from_millis(500), crash_bound);
    Arc::new(harness)
}

fn passed(report: &FaultReport, name: &str) {
    assert!(
        matches!(report.verdict(name), Some(FaultVerdict::Pass(_))),
        "{name} did not pass:\n{}",
        report.to_table()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_under_faults() {
    let report = run_faults(harness(ServerKind::ZooKeeper).await).await;
    print!("{}", report.to_table());
    assert!(report.all_passed(), "{}", report.to_table());
    for name in [
        "partitioned_holder_is_fenced_off",
        "paused_holder_wakes_to_a_refused_write",
        "server_paused_during_acquire",
        "lost_reply_after_applied_acquire",
        "server_restart_while_held_and_waited",
        "contention_under_random_faults",
    ] {
        passed(&report, name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ensemble_loses_its_leader() {
    let h = harness(ServerKind::ZooKeeperEnsemble { nodes: 3 }).await;
    let report = run_selected_faults(h, |s| s.name == "ensemble_leader_loss").await;
    print!("{}", report.to_table());
    passed(&report, "ensemble_leader_loss");
}
