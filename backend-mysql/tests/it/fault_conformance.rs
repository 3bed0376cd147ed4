//! The fault scenarios of the conformance kit against a real MariaDB server, every
//! client behind its own proxy and logged in as a user of its own, so its sessions can
//! be killed (`KILL CONNECTION`), with an election and a semaphore.
//!
//! The claims below are this backend's documented guarantees under faults (the crate
//! docs' "Caveats" and the README's fault table): keep them in step.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use distlock_conformance::UrlConnector;
use distlock_conformance_faults::{Claim, Fault, FaultHarness, ServerHarness};
use distlock_mysql::MySqlLock;
use distlock_test_servers::{
    add_fault_users, kill_connections_of, MariaDbServer, ServerControl, MARIADB_FAULT_URL_TEMPLATE,
};

/// What MySQL user locks promise under each fault.
fn claims(fault: Fault) -> Claim {
    match fault {
        Fault::ServerRestart => Claim::NotClaimed(
            "GET_LOCK user locks die with the server; a holder learns of it only when its session breaks"
                .into(),
        ),
        _ => Claim::Safe,
    }
}

async fn harness() -> Arc<dyn FaultHarness> {
    let config = common::test_config();
    let ttl = Duration::from_millis(500);
    let crash_bound = ttl.max(config.dead_holder_bound()) + config.heartbeat();
    let connector: UrlConnector = {
        let config = config.clone();
        Arc::new(move |url: String| {
            let config = config.clone();
            Box::pin(async move { Ok(MySqlLock::connect_with(&url, config).await?.client()) })
        })
    };
    let server = MariaDbServer::start()
        .await
        .unwrap_or_else(|e| common::cannot_start(e));
    let port = server.port();
    add_fault_users(port)
        .await
        .unwrap_or_else(|e| common::cannot_start(e));
    let server: Box<dyn ServerControl> = Box::new(server);
    let harness = ServerHarness::new(vec![server], MARIADB_FAULT_URL_TEMPLATE, connector)
        .with_claims(claims)
        .with_session_terminator(Arc::new(move |client| {
            Box::pin(async move {
                kill_connections_of(port, &format!("fault{client}"))
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
