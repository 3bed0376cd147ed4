//! Uncontended lock cycles/s on one MySQL/MariaDB server: distlock's mutex (one client
//! shared by the workers), `distributed-lock-mysql` (one provider, its sqlx pool,
//! shared by the workers) and raw `GET_LOCK(n, 0)` + `RELEASE_LOCK(n)` (a connection
//! per worker), in alternating rounds of one second, each worker cycling on a key of
//! its own. Prints, per concurrency, the median cycles/s of each side and the per-round
//! ratios distlock/peer and distlock/raw as median (min–max).
//!
//! Usage: `peers-mysql URL [ROUNDS] [CONCURRENCY,...]`, URL `mysql://user:pw@host:port/db`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use distlock_api::{LockKey, LockOptions, WaitPolicy};
use distributed_lock_core::traits::{DistributedLock as _, LockHandle as _, LockProvider as _};
use sqlx::Connection as _;

const ROUND: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, PartialEq)]
enum Side {
    Distlock,
    Peer,
    Raw,
}

const SIDES: [Side; 3] = [Side::Distlock, Side::Peer, Side::Raw];

type Error = Box<dyn std::error::Error + Send + Sync>;

/// One side's round: `workers` cycling for [`ROUND`]; cycles/s.
async fn round(
    side: Side,
    workers: usize,
    url: &str,
    distlock: &Arc<dyn distlock_api::DistributedLock>,
    peer: &Arc<distributed_lock_mysql::MySqlLockProvider>,
    tag: u64,
) -> Result<f64, Error> {
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    // Raw connections are opened before the clock starts.
    let mut raws = Vec::new();
    if side == Side::Raw {
        for _ in 0..workers {
            raws.push(sqlx::MySqlConnection::connect(url).await?);
        }
    }
    let started = Instant::now();
    for w in 0..workers {
        let (stop, count) = (stop.clone(), count.clone());
        let key = format!("peers/{tag}/{w}");
        let task: tokio::task::JoinHandle<Result<(), Error>> = match side {
            Side::Distlock => {
                let lock = distlock.clone();
                tokio::spawn(async move {
                    let key = LockKey::new(key)?;
                    let options =
                        LockOptions::new(Duration::from_secs(30)).with_wait(WaitPolicy::NoWait);
                    while !stop.load(Ordering::Relaxed) {
                        let guard = lock.acquire(&key, &options).await?;
                        guard.release().await?;
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(())
                })
            }
            Side::Peer => {
                let lock = peer.create_lock(&key);
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let handle = lock.try_acquire().await?.ok_or("peer: key held")?;
                        handle.release().await?;
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(())
                })
            }
            Side::Raw => {
                let mut conn = raws.pop().ok_or("no connection")?;
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
                            .bind(&key)
                            .fetch_one(&mut conn)
                            .await?;
                        if got != Some(1) {
                            return Err("raw: key held".into());
                        }
                        let _: Option<i64> = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
                            .bind(&key)
                            .fetch_one(&mut conn)
                            .await?;
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                    conn.close().await?;
                    Ok(())
                })
            }
        };
        tasks.push(task);
    }
    tokio::time::sleep(ROUND).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let done = count.load(Ordering::Relaxed);
    for task in tasks {
        task.await??;
    }
    Ok(done as f64 / elapsed.as_secs_f64())
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let url = args.get(1).ok_or("usage: peers-mysql URL [ROUNDS] [CONCURRENCY,...]")?;
    let rounds: usize = args.get(2).map_or(Ok(5), |r| r.parse())?;
    let levels: Vec<usize> = args
        .get(3)
        .map_or("1,16", String::as_str)
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let distlock = distlock_mysql::MySqlLock::connect(url).await?.lock();
    let peer = Arc::new(distributed_lock_mysql::MySqlLockProvider::new(url.clone()).await?);
    let mut tag = 0;
    println!("| concurrency | distlock | distributed-lock-mysql | raw | distlock/peer | distlock/raw |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for &workers in &levels {
        // One warm-up round per side, not counted (sessions and pools open).
        for side in SIDES {
            tag += 1;
            round(side, workers, url, &distlock, &peer, tag).await?;
        }
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); SIDES.len()];
        for r in 0..rounds {
            // Alternate the order, so no side always runs first.
            let order: Vec<usize> = if r % 2 == 0 { vec![0, 1, 2] } else { vec![2, 1, 0] };
            for i in order {
                tag += 1;
                rates[i].push(round(SIDES[i], workers, url, &distlock, &peer, tag).await?);
            }
        }
        let ratios = |other: usize| {
            let mut per: Vec<f64> = (0..rounds).map(|r| rates[0][r] / rates[other][r]).collect();
            let (lo, hi) = per
                .iter()
                .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
            format!("{:.2} ({lo:.2}–{hi:.2})", median(&mut per))
        };
        let (peer_ratio, raw_ratio) = (ratios(1), ratios(2));
        let meds: Vec<f64> = rates.iter_mut().map(|r| median(r)).collect();
        println!(
            "| {workers} | {:.0} | {:.0} | {:.0} | {peer_ratio} | {raw_ratio} |",
            meds[0], meds[1], meds[2]
        );
    }
    Ok(())
}
