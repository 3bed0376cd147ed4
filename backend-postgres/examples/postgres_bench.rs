//! Benchmark of the Postgres backend against a throwaway local server.
//!
//! ```text
//! cargo run --release -p distlock-postgres --example postgres_bench   # 7 rounds; or: -- ROUNDS
//! ```
//!
//! Measures, in one run on one server:
//! - acquire + release cycles per second on distinct keys, at 1 and 16 concurrent
//!   tasks, through one `PostgresLock` with default settings;
//! - the raw bound beside it: bare sqlx connections, one per task, each cycle a
//!   `pg_try_advisory_lock` and a `pg_advisory_unlock` round trip. The two alternate in
//!   one-second slices (all clients connected and warmed up beforehand); the ratio is
//!   taken per round and its median reported, as the machine is noisy;
//! - hand-off latency with 8 waiters (8 clients) on one key: from the start of the
//!   holder's release to the next waiter's acquire returning (p50, p99);
//! - the connections open while one client holds 10,000 locks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_api::{DistributedLock, LockKey, LockOptions, WaitPolicy};
use distlock_conformance::servers::{PostgresConfig as ServerConfig, PostgresServer};
use distlock_postgres::PostgresLock;
use sqlx::{Connection, PgConnection};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

type Error = Box<dyn std::error::Error + Send + Sync>;

const SLICE: Duration = Duration::from_secs(1);
const WARM_UP: Duration = Duration::from_millis(150);

fn options() -> LockOptions {
    LockOptions::new(Duration::from_secs(30))
        .with_wait(WaitPolicy::Timeout(Duration::from_secs(10)))
}

/// Which workers run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    Ours,
    Raw,
    Stop,
}

/// Waits until `phase` is `mine` (true) or `Stop` (false).
async fn turn(phase: &mut watch::Receiver<Phase>, mine: Phase) -> bool {
    match phase.wait_for(|p| *p == mine || *p == Phase::Stop).await {
        Ok(p) => *p == mine,
        Err(_) => false,
    }
}

/// Cycles per second of distlock and of the raw bound, per round.
async fn throughput(url: &str, tasks: usize, rounds: usize) -> Result<Vec<(f64, f64)>, Error> {
    let (phase_tx, phase_rx) = watch::channel(Phase::Idle);
    let count = Arc::new(AtomicU64::new(0));
    let lock = PostgresLock::connect(url).await?;
    let run = rand_prefix();
    let mut set = JoinSet::new();
    for t in 0..tasks {
        // distlock: every task on the one client, its own stream of distinct keys.
        let (lock, counter, mut phase) = (lock.clone(), count.clone(), phase_rx.clone());
        set.spawn(async move {
            let options = options();
            let mut i = 0u64;
            while turn(&mut phase, Phase::Ours).await {
                while *phase.borrow() == Phase::Ours {
                    let key = LockKey::new(format!("bench/{run}/{t}/{i}"))?;
                    let guard = lock.acquire(&key, &options).await?;
                    guard.release().await?;
                    counter.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            }
            Ok::<_, Error>(())
        });
        // Raw: a bare connection per task, try-lock then unlock.
        let mut conn = PgConnection::connect(url).await?;
        let (counter, mut phase) = (count.clone(), phase_rx.clone());
        set.spawn(async move {
            let mut key = (t as i64) << 40 | (rand_prefix() as i64 & 0xff_ffff) << 16;
            while turn(&mut phase, Phase::Raw).await {
                while *phase.borrow() == Phase::Raw {
                    key += 1;
                    let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                        .bind(key)
                        .fetch_one(&mut conn)
                        .await?;
                    assert!(got, "a distinct key was held");
                    let freed: bool = sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
                        .bind(key)
                        .fetch_one(&mut conn)
                        .await?;
                    assert!(freed);
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            }
            conn.close().await?;
            Ok::<_, Error>(())
        });
    }
    let slice = |phase: Phase| {
        let (phase_tx, count) = (&phase_tx, count.clone());
        async move {
            phase_tx.send_replace(phase);
            tokio::time::sleep(WARM_UP).await;
            let (before, started) = (count.load(Ordering::Relaxed), Instant::now());
            tokio::time::sleep(SLICE).await;
            let done = count.load(Ordering::Relaxed) - before;
            let rate = done as f64 / started.elapsed().as_secs_f64();
            phase_tx.send_replace(Phase::Idle);
            rate
        }
    };
    // A first pass of each, unmeasured: sessions open and statements get prepared.
    slice(Phase::Raw).await;
    slice(Phase::Ours).await;
    let mut results = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let raw = slice(Phase::Raw).await;
        let ours = slice(Phase::Ours).await;
        results.push((ours, raw));
    }
    if std::env::var_os("BENCH_VERBOSE").is_some() {
        eprintln!("  {tasks} tasks: sessions {:?}", lock.session_counts());
    }
    phase_tx.send_replace(Phase::Stop);
    while let Some(task) = set.join_next().await {
        task??;
    }
    Ok(results)
}

fn rand_prefix() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(Instant::now())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Hand-off latencies with `waiters` clients taking turns on one key.
async fn handoff(url: &str, waiters: usize, handoffs: usize) -> Result<Vec<Duration>, Error> {
    let key = LockKey::new(format!("bench/handoff/{}", rand_prefix()))?;
    let last_release: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::new(Mutex::new(Vec::new()));
    let mut set = JoinSet::new();
    for _ in 0..waiters {
        let lock = PostgresLock::connect(url).await?;
        let (key, last_release, latencies) = (key.clone(), last_release.clone(), latencies.clone());
        set.spawn(async move {
            loop {
                let guard = lock.acquire(&key, &options()).await?;
                let granted = Instant::now();
                let enough = {
                    let mut l = latencies.lock().unwrap_or_else(|e| e.into_inner());
                    let last = *last_release.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(released) = last {
                        l.push(granted - released);
                    }
                    l.len() >= handoffs
                };
                if enough {
                    guard.release().await?;
                    return Ok::<_, Error>(());
                }
                // A short critical section, during which the others queue up.
                tokio::time::sleep(Duration::from_micros(500)).await;
                *last_release.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
                guard.release().await?;
            }
        });
    }
    while let Some(task) = set.join_next().await {
        task??;
    }
    let mut v = latencies.lock().unwrap_or_else(|e| e.into_inner()).clone();
    v.sort();
    Ok(v)
}

/// Takes 10,000 locks on one client and reports the connections open meanwhile.
async fn hold_many(url: &str, locks: usize) -> Result<(i64, (usize, usize), Duration), Error> {
    let lock = PostgresLock::connect(&format!("{url}?application_name=bench-many")).await?;
    let run = rand_prefix();
    let started = Instant::now();
    let mut set = JoinSet::new();
    for t in 0..64 {
        let lock = lock.clone();
        set.spawn(async move {
            let mut guards = Vec::new();
            for i in (t..locks).step_by(64) {
                let key = LockKey::new(format!("bench/many/{run}/{i}"))?;
                guards.push(lock.acquire(&key, &options()).await?);
            }
            Ok::<_, Error>(guards)
        });
    }
    let mut guards = Vec::new();
    while let Some(task) = set.join_next().await {
        guards.extend(task??);
    }
    let took = started.elapsed();
    let mut raw = PgConnection::connect(url).await?;
    let connections: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'bench-many'",
    )
    .fetch_one(&mut raw)
    .await?;
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = 'bench-many'",
    )
    .fetch_one(&mut raw)
    .await?;
    assert_eq!(held as usize, locks, "pg_locks disagrees");
    let sessions = lock.session_counts();
    for guard in guards {
        guard.release().await?;
    }
    Ok((connections, sessions, took))
}

fn pct(v: &[Duration], p: f64) -> Duration {
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Error> {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(7)
        .max(1);
    let mut config = ServerConfig::default();
    config.settings = vec![
        ("max_connections".into(), "200".into()),
        ("max_locks_per_transaction".into(), "256".into()),
    ];
    let server = PostgresServer::start_with(config).await?;
    let url = server.url();
    println!(
        "PostgreSQL on 127.0.0.1:{} (fsync=off, synchronous_commit=off server-wide; distlock's sessions set it on), {} cores, {rounds} rounds of {SLICE:?} slices",
        server.port(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!();
    println!("| tasks | distlock cycles/s | raw cycles/s | ratio (median) | ratio (min–max) |");
    println!("|---:|---:|---:|---:|---:|");
    for tasks in [1, 16] {
        let rounds = throughput(&url, tasks, rounds).await?;
        if std::env::var_os("BENCH_VERBOSE").is_some() {
            for (ours, raw) in &rounds {
                eprintln!("  {tasks} tasks: distlock {ours:.0}/s, raw {raw:.0}/s");
            }
        }
        let ratios: Vec<f64> = rounds.iter().map(|(ours, raw)| ours / raw).collect();
        let (lo, hi) = ratios
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
        println!(
            "| {tasks} | {:.0} | {:.0} | {:.2} | {lo:.2}–{hi:.2} |",
            median(rounds.iter().map(|r| r.0).collect()),
            median(rounds.iter().map(|r| r.1).collect()),
            median(ratios),
        );
    }
    println!();
    let latencies = handoff(&url, 8, 2000).await?;
    println!(
        "hand-off, 8 waiters (8 clients) on one key, {} hand-offs: p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        latencies.len(),
        pct(&latencies, 0.5).as_secs_f64() * 1e3,
        pct(&latencies, 0.99).as_secs_f64() * 1e3,
        pct(&latencies, 1.0).as_secs_f64() * 1e3,
    );
    let (connections, (shared, waits), took) = hold_many(&url, 10_000).await?;
    println!(
        "10,000 locks held by one client (taken in {:.2} s by 64 tasks): {connections} server connections (pg_stat_activity; {shared} shared + {waits} wait sessions)",
        took.as_secs_f64()
    );
    drop(server);
    Ok(())
}
