//! The cost of holding many locks at once: server connections and client memory.

use std::future::Future;
use std::time::{Duration, Instant};

use distlock::{LockKey, LockOptions, WaitPolicy};
use tokio::task::JoinSet;

use crate::report::HoldingRow;
use crate::side::{BoxError, TTL};

/// Acquires in flight at once while filling up.
const PARALLEL: usize = 64;

/// Resident set size of this process in KiB (`VmRSS` of /proc/self/status).
fn rss_kib() -> Result<i64, BoxError> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| "no VmRSS in /proc/self/status".into())
}

/// The connection count once it stopped changing: clients closed by earlier
/// measurements take a moment to disappear on the server. Gives up after 3 s and
/// returns the last count.
async fn settled<F, Fut>(url: &str, connections: &F) -> Result<u64, BoxError>
where
    F: Fn(&str) -> Fut,
    Fut: Future<Output = Result<u64, BoxError>>,
{
    let mut last = connections(url).await?;
    for _ in 0..15 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = connections(url).await?;
        if now == last {
            break;
        }
        last = now;
    }
    Ok(last)
}

/// Connects a fresh distlock client, acquires `count` distinct keys under `prefix`, counts the
/// server's client connections with `connections` and the process's memory growth
/// while all are held, then releases them.
pub(crate) async fn measure<F, Fut>(
    url: &str,
    prefix: &str,
    count: usize,
    connections: F,
) -> Result<HoldingRow, BoxError>
where
    F: Fn(&str) -> Fut,
    Fut: Future<Output = Result<u64, BoxError>>,
{
    let connections_before = settled(url, &connections).await?;
    let rss_before = rss_kib()?;
    let lock = distlock::connect(url).await?.lock();
    let options = LockOptions::new(TTL).with_wait(WaitPolicy::Timeout(Duration::from_secs(30)));
    let started = Instant::now();
    let mut set = JoinSet::new();
    for part in 0..PARALLEL.min(count.max(1)) {
        let (lock, options, prefix) = (lock.clone(), options.clone(), prefix.to_owned());
        set.spawn(async move {
            let mut guards = Vec::new();
            for i in (part..count).step_by(PARALLEL) {
                let key = LockKey::new(format!("bench/{prefix}/{i}"))?;
                guards.push(lock.acquire(&key, &options).await?);
            }
            Ok::<_, BoxError>(guards)
        });
    }
    let mut guards = Vec::with_capacity(count);
    while let Some(joined) = set.join_next().await {
        guards.extend(joined??);
    }
    let acquire_s = started.elapsed().as_secs_f64();
    let rss_held = rss_kib()?;
    let connections_held = connections(url).await?;
    let per_task = count.div_ceil(PARALLEL).max(1);
    let mut set = JoinSet::new();
    while !guards.is_empty() {
        let part: Vec<_> = guards.drain(..per_task.min(guards.len())).collect();
        set.spawn(async move {
            for guard in part {
                guard.release().await?;
            }
            Ok::<_, BoxError>(())
        });
    }
    while let Some(joined) = set.join_next().await {
        joined??;
    }
    Ok(HoldingRow {
        locks: count,
        connections_before,
        connections_held,
        rss_delta_kib: rss_held - rss_before,
        acquire_s,
    })
}
