//! The fault scenarios of the conformance kit against real etcd: a single node (every
//! scenario that applies) and a 3-member cluster (the leader killed while a lock is
//! held and waited for; a minority member killed), every client behind its own proxies.
//!
//! etcd claims safety under every fault the kit injects (the crate docs and the
//! README's fault table), so the harness states no exceptions: a restarted etcd keeps
//! its keys and leases (it refreshes every lease's TTL when a leader takes over), and a
//! holder's validity deadline always ends before etcd can expire its lease.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_api::{
    DistributedLock, DistributedRwLock, DistributedSemaphore, LeaseState, LockOptions,
    ReleaseOutcome, WaitPolicy,
};
use distlock_conformance::UrlConnector;
use distlock_conformance_faults::{
    run_selected_faults, FaultHarness, FaultVerdict, RwConnector, SemaphoreConnector, ServerHarness,
};
use distlock_etcd::EtcdLock;
use distlock_test_servers::{EtcdCluster, EtcdServer, ServerControl};

const URL_TEMPLATE: &str = "etcd://{hosts}";

fn connector() -> UrlConnector {
    Arc::new(|url: String| {
        Box::pin(async move {
            let lock = EtcdLock::connect(&url).await?;
            Ok(Arc::new(lock) as Arc<dyn DistributedLock>)
        })
    })
}

fn semaphore_connector() -> SemaphoreConnector {
    Arc::new(|url: String| {
        Box::pin(async move {
            let lock = EtcdLock::connect(&url).await?;
            Ok(Arc::new(lock.semaphore()) as Arc<dyn DistributedSemaphore>)
        })
    })
}

fn rw_connector() -> RwConnector {
    Arc::new(|url: String| {
        Box::pin(async move {
            let lock = EtcdLock::connect(&url).await?;
            Ok(Arc::new(lock.rw_lock()) as Arc<dyn DistributedRwLock>)
        })
    })
}

/// A cut-off holder keeps its lock until etcd expires its lease: the TTL (whole
/// seconds), plus the leader's 500 ms expiry sweep and the revoke's raft round.
fn timed(harness: ServerHarness) -> Arc<dyn FaultHarness> {
    let sweep = Duration::from_millis(600);
    Arc::new(
        harness
            .with_timing(common::TTL, common::TTL + sweep)
            // A dead waiter holds its place until its 3 s waiting lease runs out.
            .with_dead_waiter_bound(common::WAITER_TTL + sweep),
    )
}

fn cannot_start(e: impl std::fmt::Display) -> ! {
    panic!("could not start etcd (run scripts/install-deps.sh): {e}")
}

async fn single_node() -> Arc<dyn FaultHarness> {
    let server = EtcdServer::start()
        .await
        .unwrap_or_else(|e| cannot_start(e));
    let servers: Vec<Box<dyn ServerControl>> = vec![Box::new(server)];
    timed(
        ServerHarness::new(servers, URL_TEMPLATE, connector())
            .with_primitives(semaphore_connector(), rw_connector()),
    )
}

distlock_conformance_faults::fault_conformance_tests!(
    single_node(),
    must_pass = [
        partitioned_holder_is_fenced_off,
        paused_holder_wakes_to_a_refused_write,
        server_paused_during_acquire,
        lost_reply_after_applied_acquire,
        server_restart_while_held_and_waited,
        crashed_clients_do_not_stall_the_fifo_queue,
        contention_under_random_faults,
        paused_permit_holders_free_their_permits,
        paused_writer_frees_the_key_for_readers,
    ]
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_loses_its_leader() {
    let _one_at_a_time = distlock_conformance_faults::serial().await;
    let cluster = EtcdCluster::start(3)
        .await
        .unwrap_or_else(|e| cannot_start(e));
    let h = timed(ServerHarness::over_etcd_cluster(
        cluster,
        URL_TEMPLATE,
        connector(),
    ));
    let report = run_selected_faults(h, |s| s.name == "ensemble_leader_loss").await;
    print!("{}", report.to_table());
    assert!(
        matches!(
            report.verdict("ensemble_leader_loss"),
            Some(FaultVerdict::Pass(_))
        ),
        "ensemble_leader_loss did not pass:\n{}",
        report.to_table()
    );
}

/// A follower killed while a lock is held and waited for: the holder keeps it (its
/// renewals go to the members that remain), the waiter is granted after the release,
/// with a higher token, and the killed member rejoins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_loses_a_minority_member() {
    let _one_at_a_time = distlock_conformance_faults::serial().await;
    let mut cluster = EtcdCluster::start(3)
        .await
        .unwrap_or_else(|e| cannot_start(e));
    let url = cluster.url();
    let (a, b) = (
        EtcdLock::connect(&url).await.unwrap(),
        EtcdLock::connect(&url).await.unwrap(),
    );
    let key = distlock_api::LockKey::new("fault-minority").unwrap();
    let options = LockOptions::new(common::TTL)
        .with_auto_renew(distlock_api::AutoRenew::new())
        .with_wait(WaitPolicy::Timeout(Duration::from_secs(30)));
    let guard = a.acquire(&key, &options).await.unwrap();
    let first = guard.fencing_token().unwrap();
    let mut waiter = {
        let (b, key, options) = (b.clone(), key.clone(), options.clone());
        tokio::spawn(async move { b.acquire(&key, &options).await })
    };
    let leader = cluster
        .wait_for_leader(Duration::from_secs(10))
        .await
        .unwrap();
    let follower = (leader + 1) % 3;
    cluster.kill_node(follower).unwrap();
    // Hold through several renewals with one member down.
    let killed = Instant::now();
    while killed.elapsed() < common::TTL * 2 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        // A renewal sent to the killed member fails and is retried on another (the
        // lease is suspect meanwhile); lost is not allowed.
        assert_ne!(
            guard.state(),
            LeaseState::Lost,
            "{:?} after the kill",
            killed.elapsed()
        );
        if waiter.is_finished() {
            let result = (&mut waiter).await.unwrap().map(drop);
            panic!("the waiter ended while the lock was held: {result:?}");
        }
    }
    assert_eq!(
        guard.state(),
        LeaseState::Held,
        "renewals go on without the member"
    );
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter is granted after the release")
        .unwrap()
        .unwrap();
    assert!(next.fencing_token().unwrap() > first);
    next.release().await.unwrap();
    cluster.restart_node(follower).await.unwrap();
    cluster
        .wait_for_leader(Duration::from_secs(10))
        .await
        .unwrap();
}
