//! The fault scenarios of the conformance kit against real redis-servers: a single
//! node (no persistence) and a 3-node Redlock, every client behind its own proxies
//! with an election, a semaphore and a read-write lock (Redlock offers none of the
//! three, so their scenarios skip there).
//!
//! The claims below are this backend's documented guarantees under faults (the crate
//! docs' "Guarantees and caveats" and the README's fault table): keep them in step.

use std::sync::Arc;
use std::time::Duration;

use distlock_conformance::UrlConnector;
use distlock_conformance_faults::{
    run_selected_faults, Claim, Fault, FaultHarness, FaultVerdict, ServerHarness,
};
use distlock_redis::{RedisConfig, RedisLock};
use distlock_test_servers::{Provider, ServerControl, ServerError};

fn connector() -> UrlConnector {
    Arc::new(|url: String| Box::pin(async move { Ok(RedisLock::connect(&url).await?.client()) }))
}

/// What Redis promises under each fault, with `nodes` servers without persistence.
fn claims(nodes: usize) -> impl Fn(Fault) -> Claim + Send + Sync {
    move |fault| {
        match fault {
        Fault::ServerRestart if nodes == 1 => Claim::NotClaimed(
            "redis-server without persistence forgets held locks when restarted (tokens keep rising: the server clock seeds a new counter)".into(),
        ),
        Fault::ServerRestart => Claim::NotClaimed(
            "Redlock nodes without persistence forget held locks when all restart at once".into(),
        ),
        _ => Claim::Safe,
    }
    }
}

fn cannot_start(e: ServerError) -> ! {
    panic!("could not start redis-server (run scripts/test.sh): {e}")
}

/// `nodes` fresh servers from the provider `DISTLOCK_TEST_SERVERS` names: one is a
/// single node, more is Redlock.
async fn harness(nodes: usize) -> Arc<dyn FaultHarness> {
    let provider = Provider::from_env().unwrap_or_else(|e| cannot_start(e));
    let mut servers: Vec<Box<dyn ServerControl>> = Vec::new();
    for _ in 0..nodes {
        servers.push(provider.redis().await.unwrap_or_else(|e| cannot_start(e)));
    }
    let template = if nodes == 1 {
        "redis://{hosts}"
    } else {
        "redis+redlock://{hosts}"
    };
    let ttl = Duration::from_millis(500);
    let harness = ServerHarness::new(servers, template, connector())
        .with_claims(claims(nodes))
        .with_timing(ttl, ttl)
        // A killed FIFO waiter's queue entry lives until its entry TTL runs out.
        .with_dead_waiter_bound(RedisConfig::default().fifo_entry_ttl);
    Arc::new(harness)
}

mod single_node {
    distlock_conformance_faults::fault_conformance_tests!(
        super::harness(1),
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
            crashed_clients_do_not_stall_the_fifo_queue,
            contention_under_random_faults,
        ]
    );
}

mod redlock {
    distlock_conformance_faults::fault_conformance_tests!(
        super::harness(3),
        must_pass = [
            partitioned_holder_is_fenced_off,
            lost_reply_after_applied_acquire,
            server_paused_during_acquire,
            redlock_minority_then_majority_loss,
            contention_under_random_faults,
        ]
    );
}

/// Without persistence a restart forgets the lock: the report must show an overlap (or
/// pass, if nothing overlapped), never fail; tokens must not go backwards, and when it
/// shows violations the fenced store must have refused the lower-token accesses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_node_restart_violations_are_refused_by_fencing() {
    let _one_at_a_time = distlock_conformance_faults::serial().await;
    let report = run_selected_faults(harness(1).await, |s| {
        s.name == "server_restart_while_held_and_waited"
    })
    .await;
    print!("{}", report.to_table());
    let restart = report.results.first().expect("the restart scenario ran");
    // The tokens keep rising across the restart (the server's clock seeds the new
    // counter), so the fenced store sees no token going backwards and refuses the
    // stale holder's accesses instead.
    assert!(
        restart.findings.fenced_register.is_empty(),
        "tokens went backwards across the restart:\n{}",
        report.to_table()
    );
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
