//! Benchmark of the ZooKeeper backend against a bare `zookeeper-client`, on a throwaway
//! standalone server started for the run.
//!
//! ```text
//! cargo run --release -p distlock-zookeeper --example zookeeper_bench [-- SECONDS_PER_RUN]
//! ```
//!
//! 1. Acquire + release cycles per second across distinct keys (one key per task, no
//!    contention) at 1 and 16 concurrent tasks, through one `ZooKeeperLock` (one
//!    session); beside it, in the same run, a bare `zookeeper-client` session doing the
//!    same create (ephemeral-sequential) + delete round trips with the same number of
//!    tasks. Six rounds of 1.5 s per side (by default) alternate which side runs first,
//!    so drift in the machine's load hits both alike; the ratio ours / bare is reported
//!    over the sums and as the median of the rounds (target ≥ 0.7), with the client
//!    process's CPU time per cycle (the server JVM shares the machine's cores).
//! 2. Hand-off latency with 8 waiters: 8 clients (8 sessions) loop on one key; the time
//!    from a holder calling `release` to the next holder's `acquire` returning, p50 and
//!    p99 over 500 hand-offs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_api::{DistributedLock, LockKey, LockOptions, WaitPolicy};
use distlock_conformance::servers::ZooKeeperServer;
use distlock_zookeeper::{ZooKeeperConfig, ZooKeeperLock};
use tokio::time::Instant;
use zookeeper_client as zk;

const HANDOFFS: usize = 500;
/// Alternating runs per side and concurrency.
const ROUNDS: usize = 6;
const WAITERS: usize = 8;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let seconds: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.5);
    let run = Duration::from_secs_f64(seconds);
    let server = ZooKeeperServer::start()
        .await
        .unwrap_or_else(|e| panic!("could not start ZooKeeper (apt-get install zookeeper): {e}"));
    let url = server.url();
    let hosts = server.connect_string();
    println!(
        "ZooKeeper standalone on {hosts}; {ROUNDS} rounds of {seconds} s per side and concurrency\n"
    );

    let config = ZooKeeperConfig::default().with_session_timeout(Duration::from_secs(10));
    let ours = ZooKeeperLock::connect_with(&url, config.clone())
        .await
        .expect("connect");
    let bare = zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(&hosts)
        .await
        .expect("bare connect");
    let dir = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    for task in 0..16 {
        bare.mkdir(&format!("/bench/bare/{task}"), &dir)
            .await
            .expect("bare directories");
    }
    // Warm up both paths (the server's JIT, directories, connections).
    for tasks in [1, 16, 1, 16] {
        cycles_ours(&ours, tasks, Duration::from_secs(1)).await;
        cycles_bare(&bare, tasks, Duration::from_secs(1)).await;
    }

    println!("| tasks | distlock-zookeeper cycles/s | bare zookeeper-client cycles/s | ratio (sum) | ratio (median of rounds) | client CPU/cycle ours / bare |");
    println!("|---|---|---|---|---|---|");
    for tasks in [1, 16] {
        let (mut ours_n, mut bare_n) = (0, 0);
        let (mut ours_cpu, mut bare_cpu) = (0.0, 0.0);
        let mut ratios = Vec::with_capacity(ROUNDS);
        for round in 0..ROUNDS {
            // Alternate which side goes first, so drift hits both alike.
            let (o, b, oc, bc) = if round % 2 == 0 {
                let (b, bc) = timed(cycles_bare(&bare, tasks, run)).await;
                let (o, oc) = timed(cycles_ours(&ours, tasks, run)).await;
                (o, b, oc, bc)
            } else {
                let (o, oc) = timed(cycles_ours(&ours, tasks, run)).await;
                let (b, bc) = timed(cycles_bare(&bare, tasks, run)).await;
                (o, b, oc, bc)
            };
            ours_n += o;
            bare_n += b;
            ours_cpu += oc;
            bare_cpu += bc;
            ratios.push(o as f64 / b.max(1) as f64);
        }
        ratios.sort_by(f64::total_cmp);
        let total = run.as_secs_f64() * ROUNDS as f64;
        let (ours_rate, bare_rate) = (ours_n as f64 / total, bare_n as f64 / total);
        println!(
            "| {tasks} | {ours_rate:.0} | {bare_rate:.0} | {:.2} | {:.2} | {:.0} µs / {:.0} µs |",
            ours_rate / bare_rate,
            ratios[ROUNDS / 2],
            ours_cpu / ours_n.max(1) as f64 * 1e6,
            bare_cpu / bare_n.max(1) as f64 * 1e6,
        );
    }

    let (p50, p99) = handoff(&url, &config).await;
    println!(
        "\nhand-off latency, {WAITERS} waiters, {HANDOFFS} hand-offs: p50 {:.2} ms, p99 {:.2} ms",
        ms(p50),
        ms(p99)
    );
}

/// Runs `work`, returning its result and the CPU seconds this process spent meanwhile.
async fn timed(work: impl std::future::Future<Output = u64>) -> (u64, f64) {
    let before = own_cpu_seconds();
    let n = work.await;
    (n, own_cpu_seconds() - before)
}

/// CPU time (user + system) this process (not the server JVM) has used, in seconds.
fn own_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // utime and stime are fields 14 and 15 of stat(5), in clock ticks of 1/100 s.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Acquire + release cycles completed by `tasks` tasks in `run`, one key per task.
async fn cycles_ours(lock: &ZooKeeperLock, tasks: usize, run: Duration) -> u64 {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Instant::now() + run;
    let mut handles = Vec::new();
    for task in 0..tasks {
        let (lock, done) = (lock.clone(), done.clone());
        let key = LockKey::new(format!("bench/ours/{task}")).expect("key");
        handles.push(tokio::spawn(async move {
            let options = LockOptions::new(Duration::from_secs(30));
            while Instant::now() < stop {
                let guard = lock.acquire(&key, &options).await.expect("acquire");
                guard.release().await.expect("release");
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for handle in handles {
        handle.await.expect("bench task");
    }
    done.load(Ordering::Relaxed)
}

/// The same number of create (ephemeral-sequential) + delete round trips on a bare
/// `zookeeper-client` session.
async fn cycles_bare(client: &zk::Client, tasks: usize, run: Duration) -> u64 {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Instant::now() + run;
    let mut handles = Vec::new();
    for task in 0..tasks {
        let (client, done) = (client.clone(), done.clone());
        handles.push(tokio::spawn(async move {
            let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
            let prefix = format!("/bench/bare/{task}/lock-");
            while Instant::now() < stop {
                let (_, sequence) = client.create(&prefix, b"", &options).await.expect("create");
                client
                    .delete(&format!("{prefix}{sequence}"), None)
                    .await
                    .expect("delete");
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for handle in handles {
        handle.await.expect("bench task");
    }
    done.load(Ordering::Relaxed)
}

/// p50 and p99 of release-to-next-grant with `WAITERS` clients looping on one key.
async fn handoff(url: &str, config: &ZooKeeperConfig) -> (Duration, Duration) {
    let key = LockKey::new("bench/handoff").expect("key");
    let released_at: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let samples = Arc::new(Mutex::new(Vec::with_capacity(HANDOFFS)));
    let finished = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for _ in 0..WAITERS {
        let lock = ZooKeeperLock::connect_with(url, config.clone())
            .await
            .expect("connect");
        let (key, released_at, samples, finished) = (
            key.clone(),
            released_at.clone(),
            samples.clone(),
            finished.clone(),
        );
        handles.push(tokio::spawn(async move {
            let options = LockOptions::new(Duration::from_secs(30))
                .with_wait(WaitPolicy::Timeout(Duration::from_secs(30)));
            while !finished.load(Ordering::SeqCst) {
                let guard = lock.acquire(&key, &options).await.expect("acquire");
                let granted = Instant::now();
                if let Some(released) = released_at.lock().expect("slot").take() {
                    let mut samples = samples.lock().expect("samples");
                    samples.push(granted - released);
                    if samples.len() >= HANDOFFS {
                        finished.store(true, Ordering::SeqCst);
                    }
                }
                // A short critical section, so that every waiter is queued again.
                tokio::time::sleep(Duration::from_millis(1)).await;
                *released_at.lock().expect("slot") = Some(Instant::now());
                guard.release().await.expect("release");
            }
        }));
    }
    for handle in handles {
        handle.await.expect("hand-off task");
    }
    let mut samples = samples.lock().expect("samples").clone();
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    (at(0.50), at(0.99))
}
