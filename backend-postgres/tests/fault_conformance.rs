//! The fault scenarios of the conformance kit against a real PostgreSQL server, every
//! client behind its own proxy and named, so its session can be terminated.

mod common;

use std::sync::Arc;
use std::time::Duration;

use distlock_api::DistributedLock;
use distlock_conformance::UrlConnector;
use distlock_conformance_faults::{
    run_faults, FaultHarness, FaultVerdict, ServerHarness, ServerKind,
};
use distlock_postgres::PostgresLock;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_under_faults() {
    let config = common::test_config();
    let ttl = Duration::from_millis(500);
    let crash_bound = ttl.max(config.dead_holder_bound()) + config.heartbeat();
    let connector: UrlConnector = Arc::new(move |url: String| {
        let config = config.clone();
        Box::pin(async move {
            let lock = PostgresLock::connect_with(&url, config).await?;
            Ok(Arc::new(lock) as Arc<dyn DistributedLock>)
        })
    });
    let harness = ServerHarness::start(ServerKind::Postgres, connector)
        .await
        .unwrap_or_else(|e| panic!("could not start PostgreSQL (run scripts/test.sh): {e}"))
        .with_timing(ttl, crash_bound);
    let report = run_faults(Arc::new(harness) as Arc<dyn FaultHarness>).await;
    print!("{}", report.to_table());
    assert!(report.all_passed(), "{}", report.to_table());
    for name in [
        "partitioned_holder_is_fenced_off",
        "paused_holder_wakes_to_a_refused_write",
        "server_paused_during_acquire",
        "lost_reply_after_applied_acquire",
        "terminated_session_fires_lost",
        "contention_under_random_faults",
    ] {
        assert!(
            matches!(report.verdict(name), Some(FaultVerdict::Pass(_))),
            "{name} did not pass:\n{}",
            report.to_table()
        );
    }
}
