//! Throughput and hand-off latency of the Redis backend, beside the raw bound measured
//! in the same run: a bare redis-rs multiplexed connection issuing the same two round
//! trips (`SET key token NX PX` + a compare-and-delete `EVAL`).
//!
//! `cargo run --release -p distlock-redis --example redis_bench [ROUNDS]`
//! starts its own throwaway redis-server.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_api::{DistributedLock, LockKey, LockOptions, WaitPolicy};
use distlock_conformance::servers::RedisServer;
use distlock_redis::RedisLock;
use tokio::time::Instant;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const COMPARE_AND_DELETE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

/// Runs `tasks` loops of `cycle(task, n)` for `duration`; returns cycles per second.
async fn cycles_per_second<F, Fut>(
    tasks: usize,
    duration: Duration,
    cycle: F,
) -> Result<f64, BoxError>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), BoxError>> + Send,
{
    let cycle = Arc::new(cycle);
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut handles = Vec::new();
    for task in 0..tasks {
        let (cycle, done) = (cycle.clone(), done.clone());
        handles.push(tokio::spawn(async move {
            let mut n = 0;
            while started.elapsed() < duration {
                cycle(task, n).await?;
                n += 1;
            }
            done.fetch_add(n, Ordering::Relaxed);
            Ok::<_, BoxError>(())
        }));
    }
    for handle in handles {
        handle.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

async fn ours(url: &str, tasks: usize, duration: Duration) -> Result<f64, BoxError> {
    let lock = RedisLock::connect(url).await?;
    let options = LockOptions::new(Duration::from_secs(30)).with_wait(WaitPolicy::NoWait);
    cycles_per_second(tasks, duration, move |task, n| {
        let (lock, options) = (lock.clone(), options.clone());
        async move {
            let key = LockKey::new(format!("bench/ours/{task}/{}", n % 1024))?;
            let guard = lock.acquire(&key, &options).await?;
            guard.release().await?;
            Ok(())
        }
    })
    .await
}

async fn raw(url: &str, tasks: usize, duration: Duration) -> Result<f64, BoxError> {
    let conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let script = redis::Script::new(COMPARE_AND_DELETE);
    cycles_per_second(tasks, duration, move |task, n| {
        let (mut conn, script) = (conn.clone(), script.clone());
        async move {
            let key = format!("bench/raw/{task}/{}", n % 1024);
            let token = format!("{:032x}", rand_token());
            let set: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(30_000)
                .query_async(&mut conn)
                .await?;
            if set.is_none() {
                return Err("raw SET NX found the key held".into());
            }
            let _: i64 = script.key(&key).arg(&token).invoke_async(&mut conn).await?;
            Ok(())
        }
    })
    .await
}

/// The bare client running distlock's own two Lua scripts: isolates client overhead.
async fn raw_same_scripts(url: &str, tasks: usize, duration: Duration) -> Result<f64, BoxError> {
    let conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let acquire = redis::Script::new(
        "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1, redis.call('INCR', KEYS[2])} end return {0, redis.call('PTTL', KEYS[1])}",
    );
    let release = redis::Script::new(
        "local h = redis.call('GET', KEYS[1]) if h == ARGV[1] then redis.call('DEL', KEYS[1]) redis.call('PUBLISH', KEYS[2], '') return 1 elseif h then return 2 end return 0",
    );
    cycles_per_second(tasks, duration, move |task, n| {
        let (mut conn, acquire, release) = (conn.clone(), acquire.clone(), release.clone());
        async move {
            let lock = format!("{{bench/same/{task}/{}}}", n % 1024);
            let token = format!("{:032x}", rand_token());
            let (granted, _): (i64, i64) = acquire
                .key(&lock)
                .key(format!("{lock}:fence"))
                .arg(&token)
                .arg(30_000)
                .invoke_async(&mut conn)
                .await?;
            if granted != 1 {
                return Err("raw acquire found the key held".into());
            }
            let _: i64 = release
                .key(&lock)
                .key(format!("{lock}:released"))
                .arg(&token)
                .invoke_async(&mut conn)
                .await?;
            Ok(())
        }
    })
    .await
}

fn rand_token() -> u128 {
    // Not security-relevant here: a distinct value per cycle is all the raw loop needs.
    static NEXT: AtomicU64 = AtomicU64::new(1);
    u128::from(NEXT.fetch_add(1, Ordering::Relaxed))
}

/// 8 clients contend for one key until `handoffs` grants have followed a release;
/// returns the sorted release-to-next-grant latencies.
async fn handoff(url: &str, handoffs: usize) -> Result<Vec<Duration>, BoxError> {
    let key = LockKey::new("bench/handoff")?;
    let options = LockOptions::new(Duration::from_secs(30))
        .with_wait(WaitPolicy::Timeout(Duration::from_secs(30)));
    // When the last holder released, and the latencies seen so far.
    let shared: Arc<Mutex<(Option<Instant>, Vec<Duration>)>> =
        Arc::new(Mutex::new((None, Vec::new())));
    let mut handles = Vec::new();
    for _ in 0..8 {
        let lock = RedisLock::connect(url).await?;
        let (key, options, shared) = (key.clone(), options.clone(), shared.clone());
        handles.push(tokio::spawn(async move {
            loop {
                let guard = lock.acquire(&key, &options).await?;
                let granted = Instant::now();
                let done = {
                    let mut shared = shared.lock().map_err(|_| "poisoned")?;
                    if let Some(released) = shared.0.take() {
                        shared.1.push(granted - released);
                    }
                    let done = shared.1.len() >= handoffs;
                    // Once done, no latency is measured, so waiters drain one by one.
                    shared.0 = (!done).then(Instant::now);
                    done
                };
                guard.release().await?;
                if done {
                    return Ok::<_, BoxError>(());
                }
            }
        }));
    }
    for handle in handles {
        handle.await??;
    }
    let mut latencies = shared.lock().map_err(|_| "poisoned")?.1.clone();
    latencies.sort();
    Ok(latencies)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(index).copied().unwrap_or_default()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let slice = Duration::from_secs(1);
    let server = RedisServer::start().await?;
    let url = server.url();
    println!("redis-server on {url}; {rounds} rounds of 1 s per side, alternating; distinct keys");
    println!("ratios are the median over rounds of (distlock / reference) within a round\n");
    println!("| tasks | distlock cycles/s | raw SET NX PX + EVAL cycles/s | ratio | raw client running distlock's scripts, cycles/s | ratio |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for tasks in [1, 16] {
        let (mut ours_rates, mut raw_rates, mut same_rates) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            // Side by side within each round, so the machine's drift hits all alike.
            raw_rates.push(raw(&url, tasks, slice).await?);
            same_rates.push(raw_same_scripts(&url, tasks, slice).await?);
            ours_rates.push(ours(&url, tasks, slice).await?);
        }
        let ratio = |reference: &[f64]| {
            median(
                ours_rates
                    .iter()
                    .zip(reference)
                    .map(|(o, r)| o / r)
                    .collect(),
            )
        };
        println!(
            "| {tasks} | {:.0} | {:.0} | {:.2} | {:.0} | {:.2} |",
            median(ours_rates.clone()),
            median(raw_rates.clone()),
            ratio(&raw_rates),
            median(same_rates.clone()),
            ratio(&same_rates),
        );
    }
    let latencies = handoff(&url, 1000).await?;
    println!(
        "\nhand-off, 8 waiting clients on one key, {} hand-offs: p50 {:.3} ms, p99 {:.3} ms",
        latencies.len(),
        percentile(&latencies, 0.50).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
    );
    Ok(())
}
