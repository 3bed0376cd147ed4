//! The fault scenarios of the conformance kit against real ZooKeeper: a standalone
//! server (every scenario that applies) and a 3-node ensemble (leader loss), every
//! client behind its own proxies with a 2 s session, with an election, a semaphore
//! and a read-write lock on the standalone server.
//!
//! ZooKeeper claims safety under every fault the kit injects (the crate docs'
//! "Caveats" and the README's fault table), so the harness states no exceptions.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use distlock_conformance::UrlConnector;
use distlock_conformance_faults::{run_selected_faults, FaultHarness, FaultVerdict, ServerHarness};
use distlock_test_servers::{Provider, ZooKeeperEnsemble};
use distlock_zookeeper::ZooKeeperLock;

const URL_TEMPLATE: &str = "zookeeper://{hosts}";

fn connector() -> UrlConnector {
    Arc::new(|url: String| {
        Box::pin(async move {
            let lock =
                ZooKeeperLock::connect_with(&url, common::config(common::SESSION_TIMEOUT)).await?;
            Ok(lock.client())
        })
    })
}

/// A cut-off holder keeps its lock until its session expires: the timeout rounded up
/// to the server's tick, plus a tick for the sweep.
fn timed(harness: ServerHarness) -> Arc<dyn FaultHarness> {
    let crash_bound = common::SESSION_TIMEOUT + 2 * common::TICK;
    Arc::new(harness.with_timing(Duration::from_millis(500), crash_bound))
}

fn cannot_start(e: impl std::fmt::Display) -> ! {
    panic!("could not start ZooKeeper (run scripts/test.sh): {e}")
}

async fn standalone() -> Arc<dyn FaultHarness> {
    let provider = Provider::from_env().unwrap_or_else(|e| cannot_start(e));
    let server = provider
        .zookeeper()
        .await
        .unwrap_or_else(|e| cannot_start(e));
    timed(ServerHarness::new(vec![server], URL_TEMPLATE, connector()))
}

distlock_conformance_faults::fault_conformance_tests!(
    standalone(),
    must_pass = [
        partitioned_holder_is_fenced_off,
        paused_holder_wakes_to_a_refused_write,
        paused_permit_holders_free_their_permits,
        paused_writer_frees_the_key_for_readers,
        server_paused_during_acquire,
        lost_reply_after_applied_acquire,
        server_restart_while_held_and_waited,
        contention_under_random_faults,
        paused_leader_wakes_to_a_refused_write,
        partitioned_leader_is_fenced_off,
        server_paused_during_campaign,
        lost_reply_after_applied_campaign,
        server_restart_while_leading_and_campaigning,
    ]
);

/// The lock and the election through the loss of the ensemble's leader, on one
/// ensemble. Ensembles come from local binaries only (the Docker provider offers none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ensemble_loses_its_leader() {
    let _one_at_a_time = distlock_conformance_faults::serial().await;
    let ensemble = ZooKeeperEnsemble::start(3)
        .await
        .unwrap_or_else(|e| cannot_start(e));
    let h = timed(ServerHarness::over_ensemble(
        ensemble,
        URL_TEMPLATE,
        connector(),
    ));
    // The lock's scenario, then the election's on the same ensemble (the killed node
    // is back by then, and the next leader is killed).
    let scenarios = [
        "ensemble_leader_loss",
        "election_through_ensemble_leader_loss",
    ];
    let report = run_selected_faults(h, |s| scenarios.contains(&s.name)).await;
    print!("{}", report.to_table());
    for name in scenarios {
        assert!(
            matches!(report.verdict(name), Some(FaultVerdict::Pass(_))),
            "{name} did not pass:\n{}",
            report.to_table()
        );
    }
}
