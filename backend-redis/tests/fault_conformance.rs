//! The fault scenarios of the conformance kit against real redis-servers: a single
//! node (no persistence) and a 3-node Redlock, every client behind its own proxies.

use std::sync::Arc;
use std::time::Duration;

use distlock_api::DistributedLock;
use distlock_conformance::UrlConnector;
use distlock_conformance_faults::{
    run_faults, FaultHarness, FaultReport, FaultVerdict, ServerHarness, ServerKind,
};
use distlock_redis::{RedisConfig, RedisLock};

fn connector() -> UrlConnector {
    Arc::new(|url: String| {
        Box::pin(async move {
            let lock = RedisLock::connect(&url).await?;
            Ok(Arc::new(lock) as Arc<dyn DistributedLock>)
        })
    })
}

async fn run(nodes: usize) -> FaultReport {
    let ttl = Duration::from_millis(500);
    let harness = ServerHarness::start(ServerKind::Redis { nodes }, connector())
        .await
        .unwrap_or_else(|e| panic!("could not start redis-server (run scripts/test.sh): {e}"))
        .with_timing(ttl, ttl)
        // A killed FIFO waiter's queue entry lives until its entry TTL runs out.
        .with_dead_waiter_bound(RedisConfig::default().fifo_entry_ttl);
    let report = run_faults(Arc::new(harness) as Arc<dyn FaultHarness>).await;
    print!("{}", report.to_table());
    report
}

fn passed(report: &FaultReport, name: &str) {
    assert!(
        matches!(report.verdict(name), Some(FaultVerdict::Pass(_))),
        "{name} did not pass:\n{}",
        report.to_table()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_node_under_faults() {
    let report = run(1).await;
    assert!(report.all_passed(), "{}", report.to_table());
    for name in [
        "partitioned_holder_is_fenced_off",
        "paused_holder_wakes_to_a_refused_write",
        "server_paused_during_acquire",
        "lost_reply_after_applied_acquire",
        "crashed_clients_do_not_stall_the_fifo_queue",
        "contention_under_random_faults",
    ] {
        passed(&report, name);
    }
    // Without persistence a restart forgets the lock and the fencing counter: the
    // report must show it (or pass, if nothing overlapped), never fail, and when it
    // shows violations the fenced store must have refused the lower-token accesses.
    let restart = report
        .results
        .iter()
        .find(|r| r.name == "server_restart_while_held_and_waited")
        .expect("the restart scenario ran");
    match &restart.verdict {
        FaultVerdict::Shown(_) => assert!(
            restart.findings.stale_writes_refused >= 1,
            "violations without fencing catching them:\n{}",
            report.to_table()
        ),
        FaultVerdict::Pass(_) => {}
        _ => panic!("{}", report.to_table()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_under_faults() {
    let report = run(3).await;
    assert!(report.all_passed(), "{}", report.to_table());
    for name in [
        "partitioned_holder_is_fenced_off",
        "lost_reply_after_applied_acquire",
        "server_paused_during_acquire",
        "redlock_minority_then_majority_loss",
        "contention_under_random_faults",
    ] {
        passed(&report, name);
    }
}
