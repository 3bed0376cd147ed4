//! The fault scenarios of the conformance kit against the transaction-pooling design
//! (`?pool_mode=transaction`) through a real PgBouncer in transaction mode, every client
//! behind its own proxy to the pooler and named, so its server connections can be
//! terminated: with the pooler as the node the faults hit (killed while locks are held
//! and waited on, paused), and, for the restart scenarios, with the Postgres behind it.
//!
//! The claims below are this design's documented guarantees under faults (the crate
//! docs' "Poolers" and docs/fault-report.md): keep them in step.

use crate::pooler;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use distlock_conformance::UrlConnector;
use distlock_conformance_faults::{Claim, Fault, FaultHarness, ServerHarness};
use distlock_postgres::PostgresXactLock;
use distlock_test_servers::{
    terminate_sessions_at, PgBouncerServer, PoolMode, PostgresServer, ServerControl, ServerError,
};

/// Which process of the stack the faults hit.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    Pooler,
    Server,
}

/// PgBouncer and the Postgres behind it, as one node: clients reach the pooler, the
/// faults hit `target`.
struct Stack {
    bouncer: PgBouncerServer,
    pg: PostgresServer,
    target: Target,
}

impl Stack {
    fn hit(&mut self) -> &mut dyn ServerControl {
        match self.target {
            Target::Pooler => &mut self.bouncer,
            Target::Server => &mut self.pg,
        }
    }
}

#[async_trait]
impl ServerControl for Stack {
    fn url(&self) -> String {
        self.bouncer.url()
    }

    fn port(&self) -> u16 {
        self.bouncer.port()
    }

    fn kill(&mut self) {
        self.hit().kill();
    }

    async fn restart(&mut self) -> Result<(), ServerError> {
        self.hit().restart().await
    }

    fn pause(&mut self) -> Result<(), ServerError> {
        self.hit().pause()
    }

    fn resume(&mut self) -> Result<(), ServerError> {
        self.hit().resume()
    }

    fn logs(&self) -> String {
        format!(
            "pgbouncer:\n{}\npostgres:\n{}",
            ServerControl::logs(&self.bouncer),
            ServerControl::logs(&self.pg)
        )
    }
}

/// What the transaction-pooling design promises under each fault.
fn claims(fault: Fault) -> Claim {
    match fault {
        Fault::ServerRestart => Claim::NotClaimed(
            "a lock is an open transaction: a restart of the server, or of the pooler (which \
             closes every server connection), ends it at once, and its holder learns of it \
             only at its next round trip (within a heartbeat): fence your writes"
                .into(),
        ),
        _ => Claim::Safe,
    }
}

async fn harness(target: Target) -> Arc<dyn FaultHarness> {
    let config = pooler::test_config();
    let ttl = Duration::from_millis(500);
    let crash_bound = ttl.max(config.dead_holder_bound()) + config.heartbeat();
    macro_rules! connector {
        ($handle:ident) => {{
            let config = config.clone();
            Arc::new(move |url: String| {
                let config = config.clone();
                Box::pin(async move {
                    Ok(PostgresXactLock::connect_with(&url, config)
                        .await?
                        .$handle())
                }) as _
            })
        }};
    }
    let clients: UrlConnector = connector!(client);
    let pg = pooler::postgres().await;
    let bouncer = pooler::bouncer(&pg, PoolMode::Transaction, pooler::SHARED_POOL).await;
    let pg_port = pg.port();
    let stack = Stack {
        bouncer,
        pg,
        target,
    };
    // PgBouncer sets each client's application_name on the server connection it lends
    // it, so one client's open transactions can be ended.
    let template = "postgres://postgres@{hosts}/postgres?pool_mode=transaction\
                    &application_name=distlock-fault-{client}";
    let harness = ServerHarness::new(vec![Box::new(stack)], template, clients)
        .with_claims(claims)
        .with_session_terminator(Arc::new(move |client| {
            Box::pin(async move {
                terminate_sessions_at(pg_port, &format!("distlock-fault-{client}"))
                    .await
                    .map_err(|e| e.to_string())
            })
        }))
        .with_timing(ttl, crash_bound);
    Arc::new(harness)
}

/// The pooler is the node: killed (and restarted) while locks are held and waited on,
/// paused during an acquire.
mod pooler_faults {
    distlock_conformance_faults::fault_conformance_tests!(
        super::harness(super::Target::Pooler),
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
}

/// The Postgres behind the pooler restarted while locks are held and waited on. Not
/// `must_pass`: the design claims no exclusion across a restart, so violations are
/// shown rather than failed (as the session design's).
mod server_faults {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn server_restart_while_held_and_waited() {
        let _one_at_a_time = distlock_conformance_faults::serial().await;
        distlock_conformance_faults::run_fault_scenario_test(
            "server_restart_while_held_and_waited",
            super::harness(super::Target::Server).await,
            false,
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn server_restart_while_leading_and_campaigning() {
        let _one_at_a_time = distlock_conformance_faults::serial().await;
        distlock_conformance_faults::run_fault_scenario_test(
            "server_restart_while_leading_and_campaigning",
            super::harness(super::Target::Server).await,
            false,
        )
        .await;
    }
}
