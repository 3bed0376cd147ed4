//! The fault scenarios of the conformance kit against a real PostgreSQL server, every
//! client behind its own proxy and named, so its session can be terminated, with an
//! election, a semaphore and a read-write lock.
//!
//! The claims below are this backend's documented guarantees under faults (the crate
//! docs' "Caveats" and the README's fault table): keep them in step.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use distlock_conformance::UrlConnector;
use distlock_conformance_faults::{Claim, Fault, FaultHarness, ServerHarness};
use distlock_postgres::PostgresLock;
use distlock_test_servers::{terminate_sessions_at, PostgresServerOptions, Provider, ServerError};

/// What Postgres advisory locks promise under each fault.
fn claims(fault: Fault) -> Claim {
    match fault {
        Fault::ServerRestart => Claim::NotClaimed(
            "advisory locks die with the server; a holder learns of it only when its session breaks".into(),
        ),
        _ => Claim::Safe,
    }
}

fn cannot_start(e: ServerError) -> ! {
    panic!("could not start PostgreSQL (run scripts/test.sh): {e}")
}

async fn harness() -> Arc<dyn FaultHarness> {
    let config = common::test_config();
    let ttl = Duration::from_millis(500);
    let crash_bound = ttl.max(config.dead_holder_bound()) + config.heartbeat();
    let connector: UrlConnector = {
        let config = config.clone();
        Arc::new(move |url: String| {
            let config = config.clone();
            Box::pin(async move { Ok(PostgresLock::connect_with(&url, config).await?.client()) })
        })
    };
    // 16 contending clients with a few sessions each, and the waits'.
    let options = PostgresServerOptions::default().with_setting("max_connections", "400");
    let provider = Provider::from_env().unwrap_or_else(|e| cannot_start(e));
    let server = provider
        .postgres(options)
        .await
        .unwrap_or_else(|e| cannot_start(e));
    let port = server.port();
    // Each client names its sessions after its number, so one client's can be ended.
    let template = "postgres://postgres@{hosts}/postgres?application_name=distlock-fault-{client}";
    let harness = ServerHarness::new(vec![server], template, connector)
        .with_claims(claims)
        .with_session_terminator(Arc::new(move |client| {
            Box::pin(async move {
                terminate_sessions_at(port, &format!("distlock-fault-{client}"))
                    .await
                    .map_err(|e| e.to_string())
            })
        }))
        .with_timing(ttl, crash_bound);
    Arc::new(harness)
}

distlock_conformance_faults::fault_conformance_tests!(
    harness(),
    must_pass = [
        partitioned_holder_is_fenced_off,
        paused_holder_wakes_to_a_refused_write,
        paused_permit_holders_free_their_permits,
        paused_writer_frees_the_key_for_readers,
        paused_leader_wakes_to_a_refused_write,
        partitioned_leader_is_fenced_off,
        server_paused_during_acquire,
        server_paused_during_campaign,
        lost_reply_after_applied_acquire,
        lost_reply_after_applied_campaign,
        terminated_session_fires_lost,
        terminated_leader_session_fires_lost,
        contention_under_random_faults,
    ]
);
