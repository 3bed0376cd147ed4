//! The failover that loses a fresh grant, with and without `min_replicas=1`, on Redis
//! Sentinel and on a Redis Cluster with replicas: the master is killed right after a
//! grant while a waiter waits, each run on a fresh group or Cluster (one failover each).
//!
//! The replica must not have the grant yet when the master dies. On Sentinel it
//! replicates through a fault proxy that delays the stream (and its acknowledgements)
//! by [`LAG`] and drops, at the kill, what it has not delivered, as a master dying with
//! writes still in its buffers does. A Cluster's replication cannot be put behind a
//! proxy (its nodes reach each other at the addresses they announce), and a replica
//! whose link is cut reconnects at once; a paused replica (SIGSTOP) alone loses
//! nothing either, since what the master sent waits in the replica's socket. So the
//! Cluster's replica is paused and the master then writes [`FILLER`] bytes to another
//! key of the slot: they fill both sockets' buffers, and the grant's write stays in the
//! master's own memory, lost when it is killed; the replica resumes [`RESUME_AFTER`]
//! after the holder's acquire began. Without `min_replicas` the grant
//! returns before the replica has it, so the failover loses it and the waiter is
//! granted while the holder's validity still runs: a double grant, SHOWN. With
//! `min_replicas=1` the grant returns only once the replica acknowledged it, so the new
//! master keeps it and the waiter is granted after it expires: must-pass. Runs per side:
//! `DISTLOCK_FAILOVER_RUNS` (default 2; the fault report's figures are of 20).

use std::time::Duration;

use distlock_api::{FencingToken, LockError, LockGuard, LockKey, LockOptions, WaitPolicy};
use distlock_redis::{KeyNames, RedisLock};
use distlock_test_servers::{RedisCluster, RedisSentinelGroup, ServerControl};
use tokio::time::Instant;

use crate::common::raw;

/// How late the replica gets the master's writes (one way, so an acknowledgement
/// comes back after twice this).
const LAG: Duration = Duration::from_millis(200);

/// The holder's lease: it outlasts the failover (about 2 s with the group's
/// `down-after-milliseconds` of 1 s), so a lost grant overlaps the waiter's.
const TTL: Duration = Duration::from_secs(6);

/// Bytes the Cluster's master writes while its replica is paused: far above what the
/// two sockets between them buffer (a few MiB on Linux), and below the replica output
/// buffer's soft limit (64 MiB).
const FILLER: usize = 24 << 20;

/// How long after the holder's acquire began the Cluster's paused replica resumes:
/// without `min_replicas` the grant, the waiter's first attempt and the kill are long
/// done by then.
const RESUME_AFTER: Duration = Duration::from_millis(400);

fn runs() -> usize {
    std::env::var("DISTLOCK_FAILOVER_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2)
}

/// What one run saw.
#[derive(Debug)]
struct Run {
    /// The waiter was granted (its acquire returned) before the holder's validity
    /// ended (the holder never released and did not renew): two holders with
    /// overlapping validity.
    double_grant: bool,
    /// The new master had the holder's grant once it served.
    kept: bool,
    holder_token: Option<FencingToken>,
    waiter_token: Option<FencingToken>,
    /// From the kill until the Sentinels named the new master.
    failover: Duration,
    /// From the holder's grant until the waiter's.
    waiter_after: Duration,
}

/// A grant and release of `k` before, until the slot's fencing counter is on the
/// replica (`replica`), as in a deployment that ran for a while: the replica's counter
/// is then one behind the holder's coming token.
async fn warm_up(holder: &RedisLock, k: &LockKey, replica: u16, cluster: bool) {
    let before = holder
        .lock()
        .acquire(k, &LockOptions::new(TTL).with_wait(WaitPolicy::NoWait))
        .await
        .unwrap();
    let before_token = before.fencing_token().map(|t| t.get());
    before.release().await.unwrap();
    let mut replica = raw(replica).await;
    let names = KeyNames::for_key(k);
    let fence = if cluster {
        // A Cluster replica answers reads of its master's slots once asked to.
        let () = redis::cmd("READONLY")
            .query_async(&mut replica)
            .await
            .unwrap();
        names.cluster_fence()
    } else {
        names.fence().to_owned()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let on_replica: Option<u64> = redis::cmd("GET")
            .arg(&fence)
            .query_async(&mut replica)
            .await
            .unwrap();
        if on_replica.is_some() && on_replica == before_token {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the counter never reached the replica"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A waiter's acquire, once granted: when its call returned, and the guard.
type Waiting = tokio::task::JoinHandle<Result<(Instant, LockGuard), LockError>>;

/// The holder's grant of `k` (a refusal for too few replicas retried for up to 10 s),
/// and a waiter on `waiter` waiting for it once this returns.
async fn grant_while_waited(
    holder: &RedisLock,
    waiter: &RedisLock,
    k: &LockKey,
) -> (LockGuard, Instant, Waiting) {
    let guard = holder
        .lock()
        .acquire(
            k,
            &LockOptions::new(TTL).with_wait(WaitPolicy::Timeout(Duration::from_secs(10))),
        )
        .await
        .unwrap();
    let granted = Instant::now();
    let waiting = {
        let (waiter, k) = (waiter.clone(), k.clone());
        tokio::spawn(async move {
            let options =
                LockOptions::new(TTL).with_wait(WaitPolicy::Timeout(Duration::from_secs(60)));
            let guard = waiter.lock().acquire(&k, &options).await?;
            Ok::<_, LockError>((Instant::now(), guard))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while waiter.waiters_in_line(k) == 0 {
        assert!(Instant::now() < deadline, "the waiter never waited");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    (guard, granted, waiting)
}

/// Whether the new master (`new`) has the holder's grant of `k`.
async fn kept_by(new: u16, k: &LockKey, guard: &LockGuard) -> bool {
    let there: Option<String> = redis::cmd("GET")
        .arg(KeyNames::for_key(k).lock)
        .query_async(&mut raw(new).await)
        .await
        .unwrap();
    there == Some(guard.lease().owner().to_string())
}

/// The run's outcome once the waiter is granted.
async fn outcome(
    label: &str,
    guard: LockGuard,
    granted: Instant,
    waiting: Waiting,
    kept: bool,
    failover: Duration,
) -> Run {
    let (waiter_at, waiter_guard) = waiting
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{label}: the waiter was not granted: {e}"));
    let run = Run {
        // The waiter held (its acquire had returned) before the holder's validity ended.
        double_grant: waiter_at < guard.valid_until(),
        kept,
        holder_token: guard.fencing_token(),
        waiter_token: waiter_guard.fencing_token(),
        failover,
        waiter_after: waiter_at - granted,
    };
    println!("{label}: {run:?}");
    let _ = waiter_guard.release().await;
    drop(guard);
    run
}

/// The URL with `min_replicas=1` when asked for.
fn with_replicas(url: String, min_replicas: bool, timeout_ms: u32) -> String {
    if min_replicas {
        format!("{url}?min_replicas=1&replica_timeout={timeout_ms}")
    } else {
        url
    }
}

/// One Sentinel run: a fresh group, the grant, the waiter, the kill, the failover, the
/// old master back as a replica of the new one (so that `WAIT 1` can be answered
/// again), and the waiter's grant.
async fn sentinel_run(label: &str, min_replicas: bool) -> Run {
    let mut group = RedisSentinelGroup::start_with_replication_proxy()
        .await
        .unwrap_or_else(|e| panic!("could not start a Sentinel group (run scripts/test.sh): {e}"));
    let proxy = group
        .replication_proxy()
        .expect("started with a replication proxy")
        .clone();
    let url = with_replicas(group.url(), min_replicas, 1500);
    let holder = RedisLock::connect(&url).await.unwrap();
    let waiter = RedisLock::connect(&url).await.unwrap();
    let old = group.master_port().await.unwrap();
    let k = LockKey::new(format!("failover/{label}")).unwrap();
    warm_up(&holder, &k, group.servers()[1].port(), false).await;
    proxy.set_latency(LAG);
    let (guard, granted, waiting) = grant_while_waited(&holder, &waiter, &k).await;

    // The master dies with what the replica has not received yet.
    proxy.blackhole();
    group.servers()[0].kill();
    let killed = Instant::now();
    // Every chunk in flight is due by then, and dropped (checked again at delivery).
    tokio::time::sleep(LAG * 2).await;
    proxy.heal();
    let new = loop {
        match group.master_port().await {
            Ok(port) if port != old => break port,
            _ => {}
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "no failover within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let failover = killed.elapsed();
    let kept = kept_by(new, &k, &guard).await;
    // The old master, back empty, replicates from the new one (the Sentinels would
    // tell it to as well, later).
    group.servers()[0].restart().await.unwrap();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(new)
        .query_async(&mut raw(old).await)
        .await
        .unwrap();
    outcome(label, guard, granted, waiting, kept, failover).await
}

/// One Cluster run: a fresh Cluster (three masters, a replica each), the lock's
/// master's replica paused behind [`FILLER`] bytes, the grant, the waiter, the kill,
/// the replica resumed, the failover, the old master back as the new one's replica
/// (so that `WAIT 1` can be answered again), and the waiter's grant.
async fn cluster_run(label: &str, min_replicas: bool) -> Run {
    let mut cluster = RedisCluster::start()
        .await
        .unwrap_or_else(|e| panic!("could not start a Cluster (run scripts/test.sh): {e}"));
    let url = with_replicas(cluster.url(), min_replicas, 1500);
    let holder = RedisLock::connect(&url).await.unwrap();
    let waiter = RedisLock::connect(&url).await.unwrap();
    let k = LockKey::new(format!("failover/{label}")).unwrap();
    let names = KeyNames::for_key(&k);
    let slot = cluster.key_slot(&names.lock).await.unwrap();
    let old = cluster.master_of_slot(slot).await.unwrap();
    let replica = replica_of(old).await;
    let index = |cluster: &mut RedisCluster, port: u16| {
        cluster
            .nodes()
            .iter()
            .position(|n| n.port() == port)
            .expect("a node of the Cluster")
    };
    let (master_at, replica_at) = (index(&mut cluster, old), index(&mut cluster, replica));
    warm_up(&holder, &k, replica, true).await;

    // The replica stops reading; the filler fills the sockets between them.
    cluster.nodes()[replica_at].pause().unwrap();
    let filler = [names.lock.as_str(), ":filler"].concat();
    let mut master = raw(old).await;
    // Sending the filler takes a while on a loaded machine (the driver's default
    // response timeout cut it once).
    master.set_response_timeout(Duration::from_secs(30));
    let () = redis::cmd("SET")
        .arg(&filler)
        .arg(vec![b'x'; FILLER])
        .query_async(&mut master)
        .await
        .unwrap();
    let started = Instant::now();
    let pid = cluster.nodes()[replica_at].pid().expect("the replica runs");
    let resume = tokio::spawn(async move {
        tokio::time::sleep_until(started + RESUME_AFTER).await;
        // SIGCONT by pid: the Cluster's handle stays with the test, which kills the
        // master meanwhile (and resumes the handle's own record of the pause after).
        let status = std::process::Command::new("kill")
            .arg("-CONT")
            .arg(pid.to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "SIGCONT to the replica failed");
        Instant::now()
    });
    let (guard, granted, waiting) = grant_while_waited(&holder, &waiter, &k).await;
    // Without min_replicas this is long before the resume; with it, after (the grant
    // waited for the replica's acknowledgement).
    cluster.nodes()[master_at].kill();
    let killed = Instant::now();
    let resumed_at = resume.await.unwrap();
    cluster.nodes()[replica_at].resume().unwrap();
    let before_resume = killed < resumed_at;
    let new = cluster.wait_slot_moves_from(slot, old).await.unwrap();
    let failover = killed.elapsed();
    let kept = kept_by(new, &k, &guard).await;
    println!(
        "{label}: master killed {} the replica resumed",
        if before_resume { "before" } else { "after" }
    );
    // The old master, back empty with its Cluster configuration, rejoins as the new
    // master's replica.
    cluster.nodes()[master_at].restart().await.unwrap();
    outcome(label, guard, granted, waiting, kept, failover).await
}

/// The port of the replica of the Cluster master on `master`.
async fn replica_of(master: u16) -> u16 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut conn = raw(master).await;
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut conn)
            .await
            .unwrap();
        // slave0:ip=127.0.0.1,port=P,state=online,…
        let port = info
            .lines()
            .find(|line| line.starts_with("slave0:"))
            .and_then(|line| line.split(',').find_map(|f| f.strip_prefix("port=")))
            .and_then(|p| p.parse().ok());
        if let Some(port) = port {
            return port;
        }
        assert!(Instant::now() < deadline, "the master has no replica");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Where the scenario runs.
#[derive(Debug, Clone, Copy)]
enum Topology {
    Sentinel,
    Cluster,
}

/// Runs the scenario `runs()` times on `topology` and prints the counts.
async fn scenario(topology: Topology, min_replicas: bool) -> Vec<Run> {
    let side = if min_replicas {
        "min_replicas=1"
    } else {
        "no min_replicas"
    };
    let name = format!("{topology:?}");
    let mut all = Vec::new();
    for n in 0..runs() {
        let label = format!("{name}, {side} #{n}");
        all.push(match topology {
            Topology::Sentinel => sentinel_run(&label, min_replicas).await,
            Topology::Cluster => cluster_run(&label, min_replicas).await,
        });
    }
    let doubles = all.iter().filter(|r| r.double_grant).count();
    let lost = all.iter().filter(|r| !r.kept).count();
    let not_above = all
        .iter()
        .filter(|r| r.waiter_token <= r.holder_token)
        .count();
    let failovers: Vec<u128> = all.iter().map(|r| r.failover.as_millis()).collect();
    let waits: Vec<u128> = all.iter().map(|r| r.waiter_after.as_millis()).collect();
    println!(
        "{name} failover right after a grant, {side}: {doubles} double grants in {} runs \
         ({lost} grants lost by the failover), {not_above} waiter tokens not above the \
         holder's; failover ms {failovers:?}; waiter granted ms after the holder {waits:?}",
        all.len()
    );
    all
}

/// SHOWN: without `min_replicas`, the failover loses the grant and the waiter is
/// granted while the holder still holds. Fails only if no run shows it (the scenario
/// would then prove nothing about `min_replicas`).
fn shown(all: &[Run]) {
    assert!(
        all.iter().any(|r| r.double_grant),
        "no run lost the grant: the scenario does not provoke the loss"
    );
}

/// Must-pass: with `min_replicas=1` every grant survives the failover, no run grants
/// twice, and the waiter's token is above the holder's.
fn never_twice(all: &[Run]) {
    for run in all {
        assert!(run.kept, "the failover lost an acknowledged grant: {run:?}");
        assert!(!run.double_grant, "granted twice: {run:?}");
        assert!(run.waiter_token > run.holder_token, "{run:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_without_min_replicas_grants_twice() {
    shown(&scenario(Topology::Sentinel, false).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_with_min_replicas_never_grants_twice() {
    never_twice(&scenario(Topology::Sentinel, true).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_without_min_replicas_grants_twice() {
    shown(&scenario(Topology::Cluster, false).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_with_min_replicas_never_grants_twice() {
    never_twice(&scenario(Topology::Cluster, true).await);
}
