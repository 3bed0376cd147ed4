//! distlock's MySQL/MariaDB mutex beside the Rust peer `distributed-lock-mysql` and raw
//! `GET_LOCK`/`RELEASE_LOCK`, on one server, in the same run, with the rows of
//! `distlock bench` measured the same way:
//!
//! - **uncontended cycles/s** at each concurrency, each worker reusing a key of its
//!   own, and a fresh key per cycle: distlock (one client shared by the workers), the
//!   peer (one provider and its sqlx pool, shared) and raw `GET_LOCK(n, 0)` +
//!   `RELEASE_LOCK(n)` (a connection per worker), in alternating rounds of one second
//!   after a warm-up round per side; with the server's statements and pings per cycle
//!   (`SHOW GLOBAL STATUS` deltas);
//! - **hot key**: 9 workers on one key, each its own client (provider, connection),
//!   waiting in the server (`GET_LOCK(n, t)`), pausing 1 ms after each release;
//!   hand-off = the holder's release starting → another worker granted, both stamped
//!   in this process (as `distlock bench`'s hot key); p50 per round; beside a raw
//!   side waiting with distlock's own wait statement (its token and server-timed wait
//!   in the same `SELECT`), which tells the statement's cost from the client's;
//! - **holding**: the server's `Threads_connected` before and while one fresh client
//!   of each side holds N locks at once (64 acquires in flight while filling up, as
//!   `distlock bench`'s holding row). The peer holds a pooled connection per lock, so
//!   its pool is made large enough (sqlx's default of 10 would stall it at 10).
//!
//! Ratios are per round, distlock against the other side measured in the same round,
//! as median (min–max): cycles distlock/other, hand-off p50 other/distlock (so above 1
//! means distlock is faster on every row).
//!
//! Usage: `peers-mysql URL [ROUNDS] [CONCURRENCY,...] [HELD]`, URL
//! `mysql://user:pw@host:port/db` (defaults 5 rounds, `1,16`, 1000 held; the server
//! needs `max_connections` above HELD + 20 for the peer's holding row). CONCURRENCY
//! `-` skips the uncontended rows and HELD `0` the holding row (the hot key alone).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use distlock_api::{LockKey, LockOptions, WaitPolicy};
use distributed_lock_core::traits::{DistributedLock as _, LockHandle as _, LockProvider as _};
use distributed_lock_mysql::MySqlLockProvider;
use sqlx::Connection as _;
use tokio::task::JoinSet;

const ROUND: Duration = Duration::from_secs(1);
const TTL: Duration = Duration::from_secs(30);
/// Hot-key workers (8 waiters behind the holder) and their pause after a release.
const HOT_WORKERS: usize = 9;
const THINK: Duration = Duration::from_millis(1);
/// Hand-offs per side and round, and the longest a hot-key turn may take.
const HANDOFFS: usize = 300;
const HOT_LIMIT: Duration = Duration::from_secs(20);
/// The longest one hot-key acquire waits (8 waiters ahead take milliseconds); short,
/// so a raw waiter abandoned at the end leaves the server soon.
const HOT_WAIT: Duration = Duration::from_secs(5);
/// Acquires in flight while filling up the holding row.
const PARALLEL: usize = 64;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Side {
    Distlock,
    Peer,
    Raw,
    /// Raw, waiting with distlock's own wait statement (`GET_LOCK`, the server-timed
    /// wait and the fencing token in one `SELECT`): the hot key only, to tell the
    /// statement's cost from the client's.
    RawWithToken,
}

const SIDES: [Side; 3] = [Side::Distlock, Side::Peer, Side::Raw];
const HOT_SIDES: [Side; 4] = [Side::Distlock, Side::Peer, Side::Raw, Side::RawWithToken];

/// distlock's wait statement (`WAIT_LOCK` in backend-mysql/src/sql.rs), for
/// [`Side::RawWithToken`]: a grant's answer holds a space.
const WAIT_LOCK: &str = "SELECT ELT(GET_LOCK(?, ?) + 1, '0', \
     CONCAT(CAST(TIMESTAMPDIFF(MICROSECOND, NOW(6), SYSDATE(6)) AS SIGNED), ' ', \
     COALESCE((SELECT IF(IS_USED_LOCK(?) = CONNECTION_ID(), \
     CAST(r.epoch * 18446744073709551616 + (UUID_SHORT() - r.base) AS CHAR), NULL) \
     FROM distlock_run r WHERE r.id = 1), '-')))";

/// The statement [`Side::RawWithToken`] waits with: [`WAIT_LOCK`], or a candidate
/// in `PEERS_WAIT_SQL` (binding the name, the seconds and the name, answering one
/// column, holding a space when granted), to measure another wait statement's cost.
fn wait_sql() -> &'static str {
    static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SQL.get_or_init(|| std::env::var("PEERS_WAIT_SQL").unwrap_or_else(|_| WAIT_LOCK.to_owned()))
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Distlock => "distlock",
            Side::Peer => "distributed-lock-mysql",
            Side::Raw => "raw",
            Side::RawWithToken => "raw, distlock's wait statement",
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Keys {
    Reused,
    Fresh,
}

type Error = Box<dyn std::error::Error + Send + Sync>;

/// One lock taker of one side: a cycle takes `key` (waiting in the server when
/// `wait`), calls `held`, and releases it.
enum Taker {
    Distlock(Arc<dyn distlock_api::DistributedLock>),
    Peer(Arc<MySqlLockProvider>),
    /// A connection, and whether it waits with [`WAIT_LOCK`].
    Raw(sqlx::MySqlConnection, bool),
}

impl Taker {
    async fn new(
        side: Side,
        url: &str,
        shared_distlock: &Arc<dyn distlock_api::DistributedLock>,
        shared_peer: &Arc<MySqlLockProvider>,
        own_client: bool,
    ) -> Result<Taker, Error> {
        Ok(match side {
            Side::Distlock if own_client => {
                Taker::Distlock(distlock_mysql::MySqlLock::connect(url).await?.lock())
            }
            Side::Distlock => Taker::Distlock(shared_distlock.clone()),
            Side::Peer if own_client => Taker::Peer(Arc::new(MySqlLockProvider::new(url).await?)),
            Side::Peer => Taker::Peer(shared_peer.clone()),
            Side::Raw | Side::RawWithToken => Taker::Raw(
                sqlx::MySqlConnection::connect(url).await?,
                side == Side::RawWithToken,
            ),
        })
    }

    async fn cycle(
        &mut self,
        key: &str,
        wait: bool,
        held: &mut (dyn FnMut() + Send),
    ) -> Result<(), Error> {
        match self {
            Taker::Distlock(lock) => {
                let key = LockKey::new(key)?;
                let policy = if wait {
                    WaitPolicy::Timeout(HOT_WAIT)
                } else {
                    WaitPolicy::NoWait
                };
                let guard = lock
                    .acquire(&key, &LockOptions::new(TTL).with_wait(policy))
                    .await?;
                held();
                guard.release().await?;
            }
            Taker::Peer(provider) => {
                let lock = provider.create_lock(key);
                let handle = if wait {
                    lock.acquire(Some(HOT_WAIT)).await?
                } else {
                    lock.try_acquire().await?.ok_or("peer: key held")?
                };
                held();
                handle.release().await?;
            }
            Taker::Raw(conn, with_token) => {
                let timeout = if wait { HOT_WAIT.as_secs() } else { 0 };
                let got: Option<i64> = if *with_token {
                    let answer: Option<String> = sqlx::query_scalar(wait_sql())
                        .bind(key)
                        .bind(timeout)
                        .bind(key)
                        .fetch_one(&mut *conn)
                        .await?;
                    answer.map(|answer| i64::from(answer.contains(' ')))
                } else {
                    sqlx::query_scalar("SELECT GET_LOCK(?, ?)")
                        .bind(key)
                        .bind(timeout)
                        .fetch_one(&mut *conn)
                        .await?
                };
                if got != Some(1) {
                    return Err(format!("raw: {key} not granted").into());
                }
                held();
                let _: Option<i64> = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
                    .bind(key)
                    .fetch_one(&mut *conn)
                    .await?;
            }
        }
        Ok(())
    }

    async fn close(self) -> Result<(), Error> {
        if let Taker::Raw(conn, _) = self {
            conn.close().await?;
        }
        Ok(())
    }
}

/// The server counters a round's statements are counted with.
/// The server counters a round's statements are counted with: statements, prepared
/// statements executed, and pings and other administrative commands (`COM_PING`: sqlx's
/// pool pings each connection it hands out).
const COUNTERS: [&str; 3] = ["Questions", "Com_stmt_execute", "Com_admin_commands"];

/// `SHOW GLOBAL STATUS` values of [`COUNTERS`].
async fn status(url: &str) -> Result<Vec<f64>, Error> {
    let mut conn = sqlx::MySqlConnection::connect(url).await?;
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT CAST(variable_name AS CHAR), CAST(variable_value AS CHAR) \
         FROM information_schema.global_status",
    )
    .fetch_all(&mut conn)
    .await?;
    conn.close().await?;
    COUNTERS
        .iter()
        .map(|name| {
            rows.iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .and_then(|(_, v)| v.parse().ok())
                .ok_or_else(|| format!("no {name} in global_status").into())
        })
        .collect()
}

/// `Threads_connected`, this probe included.
async fn threads_connected(url: &str) -> Result<u64, Error> {
    let mut conn = sqlx::MySqlConnection::connect(url).await?;
    let (_, value): (String, String) =
        sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Threads_connected'")
            .fetch_one(&mut conn)
            .await?;
    conn.close().await?;
    Ok(value.parse()?)
}

/// One side's uncontended round: `workers` cycling for [`ROUND`]; cycles/s and the
/// server's statements and pings per cycle (per [`COUNTERS`]).
async fn round(
    side: Side,
    workers: usize,
    keys: Keys,
    url: &str,
    distlock: &Arc<dyn distlock_api::DistributedLock>,
    peer: &Arc<MySqlLockProvider>,
    tag: u64,
) -> Result<(f64, Vec<f64>), Error> {
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    // Raw connections are opened before the clock starts.
    let mut takers = Vec::new();
    for _ in 0..workers {
        takers.push(Taker::new(side, url, distlock, peer, false).await?);
    }
    let before = status(url).await?;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (w, mut taker) in takers.into_iter().enumerate() {
        let (stop, count) = (stop.clone(), count.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = match keys {
                    Keys::Reused => format!("peers/{tag}/u/{w}"),
                    Keys::Fresh => format!("peers/{tag}/f/{w}/{n}"),
                };
                taker.cycle(&key, false, &mut || {}).await?;
                count.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
            taker.close().await
        }));
    }
    tokio::time::sleep(ROUND).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let done = count.load(Ordering::Relaxed);
    for task in tasks {
        task.await??;
    }
    let after = status(url).await?;
    let cycles = done.max(1) as f64;
    let per_cycle = after
        .iter()
        .zip(&before)
        .map(|(a, b)| (a - b) / cycles)
        .collect();
    Ok((done as f64 / elapsed.as_secs_f64(), per_cycle))
}

/// Shared by the hot-key workers: who released last and when, and the hand-offs.
struct Baton {
    released: Option<(usize, Instant)>,
    handoffs: Vec<Duration>,
}

/// One side's hot-key turn: [`HOT_WORKERS`] workers, each its own client, on one key
/// until [`HANDOFFS`] hand-offs; their p50 in ms.
async fn hot_key(
    side: Side,
    url: &str,
    distlock: &Arc<dyn distlock_api::DistributedLock>,
    peer: &Arc<MySqlLockProvider>,
    tag: u64,
) -> Result<f64, Error> {
    let key = format!("peers/{tag}/hot");
    let baton = Arc::new(Mutex::new(Baton {
        released: None,
        handoffs: Vec::with_capacity(HANDOFFS),
    }));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop_tx = Arc::new(stop_tx);
    let mut set = JoinSet::new();
    for worker in 0..HOT_WORKERS {
        let mut taker = Taker::new(side, url, distlock, peer, true).await?;
        let (baton, stop_tx, mut stop_rx) = (baton.clone(), stop_tx.clone(), stop_rx.clone());
        let key = key.clone();
        set.spawn(async move {
            while !*stop_rx.borrow() {
                let mut on_grant = || {
                    let granted = Instant::now();
                    let Ok(mut baton) = baton.lock() else { return };
                    if let Some((by, at)) = baton.released.take() {
                        if by != worker {
                            baton.handoffs.push(granted - at);
                        }
                    }
                    if baton.handoffs.len() >= HANDOFFS {
                        stop_tx.send_replace(true);
                    }
                    // Stamped last, just before the release starts.
                    baton.released = Some((worker, Instant::now()));
                };
                tokio::select! {
                    outcome = taker.cycle(&key, true, &mut on_grant) => outcome?,
                    _ = stop_rx.wait_for(|stop| *stop) => break,
                }
                tokio::select! {
                    () = tokio::time::sleep(THINK) => {}
                    _ = stop_rx.wait_for(|stop| *stop) => break,
                }
            }
            // An abandoned wait may leave a raw connection mid-statement: drop it.
            drop(taker);
            Ok::<_, Error>(())
        });
    }
    let timer = tokio::spawn({
        let stop_tx = stop_tx.clone();
        async move {
            tokio::time::sleep(HOT_LIMIT).await;
            stop_tx.send_replace(true);
        }
    });
    while let Some(joined) = set.join_next().await {
        joined??;
    }
    timer.abort();
    let mut handoffs = baton.lock().map_err(|_| "poisoned")?.handoffs.clone();
    if handoffs.is_empty() {
        return Err(format!("{}: no hand-off within {HOT_LIMIT:?}", side.name()).into());
    }
    handoffs.sort();
    Ok(handoffs[handoffs.len() / 2].as_secs_f64() * 1000.0)
}

/// `Threads_connected` once it stopped changing: sessions closed by earlier turns
/// take a moment to go (a raw waiter abandoned in `GET_LOCK` stays until its wait
/// ends). Gives up after 30 s and returns the last count.
async fn settled_threads(url: &str) -> Result<u64, Error> {
    let mut last = threads_connected(url).await?;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = threads_connected(url).await?;
        if now == last {
            break;
        }
        last = now;
    }
    Ok(last)
}

/// Fills `held` locks on distinct keys under `tag`, [`PARALLEL`] acquires in flight,
/// each through `take(key)`; returns what each gave.
async fn fill<T, F, Fut>(held: usize, tag: u64, take: F) -> Result<Vec<T>, Error>
where
    T: Send + 'static,
    F: Fn(String) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<T, Error>> + Send + 'static,
{
    let mut set = JoinSet::new();
    for part in 0..PARALLEL.min(held) {
        let take = take.clone();
        set.spawn(async move {
            let mut got = Vec::new();
            for i in (part..held).step_by(PARALLEL) {
                got.push(take(format!("peers/{tag}/hold/{i}")).await?);
            }
            Ok::<_, Error>(got)
        });
    }
    let mut all = Vec::with_capacity(held);
    while let Some(joined) = set.join_next().await {
        all.extend(joined??);
    }
    Ok(all)
}

/// The server's connections (settled) before one fresh client of `side` connects,
/// and while it holds `held` locks on distinct keys.
async fn holding(side: Side, url: &str, held: usize, tag: u64) -> Result<(u64, u64), Error> {
    let before = settled_threads(url).await?;
    let during = match side {
        Side::Distlock => {
            let lock = distlock_mysql::MySqlLock::connect(url).await?.lock();
            let options =
                LockOptions::new(TTL).with_wait(WaitPolicy::Timeout(Duration::from_secs(30)));
            let guards = fill(held, tag, move |key| {
                let (lock, options) = (lock.clone(), options.clone());
                async move { Ok(lock.acquire(&LockKey::new(key)?, &options).await?) }
            })
            .await?;
            let during = threads_connected(url).await?;
            for guard in guards {
                guard.release().await?;
            }
            during
        }
        Side::Peer => {
            // sqlx's default pool (10) would stall the filling at 10 held locks.
            let pool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(u32::try_from(held + 8)?)
                .acquire_timeout(Duration::from_secs(60))
                .connect(url)
                .await?;
            let provider = Arc::new(MySqlLockProvider::builder().pool(pool).build().await?);
            let handles = fill(held, tag, move |key| {
                let provider = provider.clone();
                async move {
                    let lock = provider.create_lock(&key);
                    Ok(lock.acquire(Some(Duration::from_secs(30))).await?)
                }
            })
            .await?;
            let during = threads_connected(url).await?;
            for handle in handles {
                handle.release().await?;
            }
            during
        }
        Side::Raw | Side::RawWithToken => {
            // One connection holds any number of user locks.
            let mut conn = sqlx::MySqlConnection::connect(url).await?;
            for i in 0..held {
                let _: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
                    .bind(format!("peers/{tag}/hold/{i}"))
                    .fetch_one(&mut conn)
                    .await?;
            }
            let during = threads_connected(url).await?;
            sqlx::query("DO RELEASE_ALL_LOCKS()")
                .execute(&mut conn)
                .await?;
            conn.close().await?;
            during
        }
    };
    Ok((before, during))
}

fn median(values: &[f64]) -> f64 {
    let mut values = values.to_vec();
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// `median (min–max)` of `values`.
fn spread(values: &[f64]) -> String {
    let (lo, hi) = values
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
    format!("{:.2} ({lo:.2}–{hi:.2})", median(values))
}

/// Thousands with a narrow space, as docs/benchmarks.md writes them.
fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "n/a".into())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: peers-mysql URL [ROUNDS] [CONCURRENCY,...] [HELD]";
    let url = args.get(1).ok_or(usage)?;
    let rounds: usize = args.get(2).map_or(Ok(5), |r| r.parse())?;
    let levels: Vec<usize> = args
        .get(3)
        .map_or("1,16", String::as_str)
        .split(',')
        .filter(|level| *level != "-")
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let held: usize = args.get(4).map_or(Ok(1000), |r| r.parse())?;
    let distlock = distlock_mysql::MySqlLock::connect(url).await?.lock();
    let peer = Arc::new(MySqlLockProvider::new(url.clone()).await?);
    let mut tag = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as u64
        * 1000;
    eprintln!("load average at start: {}", load_average());
    println!("Uncontended cycles/s (median of {rounds} alternating rounds of 1 s; ratio distlock/other: median (min–max) of per-round ratios; round trips per cycle: the server's Questions (statements) and Com_admin_commands (pings) deltas / cycles)\n");
    println!("| keys | concurrency | distlock | distributed-lock-mysql | raw | distlock/peer | distlock/raw | statements, pings per cycle (distlock / peer / raw) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---|");
    for keys in [Keys::Reused, Keys::Fresh] {
        for &workers in &levels {
            // One warm-up round per side, not counted (sessions and pools open).
            for side in SIDES {
                tag += 1;
                round(side, workers, keys, url, &distlock, &peer, tag).await?;
            }
            let mut rates: Vec<Vec<f64>> = vec![Vec::new(); SIDES.len()];
            let mut statements: Vec<Vec<Vec<f64>>> = vec![Vec::new(); SIDES.len()];
            for r in 0..rounds {
                // Alternate the order, so no side always runs first.
                let order: [usize; 3] = if r % 2 == 0 { [0, 1, 2] } else { [2, 1, 0] };
                for i in order {
                    tag += 1;
                    let (rate, per_cycle) =
                        round(SIDES[i], workers, keys, url, &distlock, &peer, tag).await?;
                    rates[i].push(rate);
                    statements[i].push(per_cycle);
                }
            }
            let ratio = |other: usize| {
                let per: Vec<f64> = (0..rounds).map(|r| rates[0][r] / rates[other][r]).collect();
                spread(&per)
            };
            let stmts: Vec<String> = statements
                .iter()
                .map(|s| {
                    let of = |i: usize| median(&s.iter().map(|c| c[i]).collect::<Vec<_>>());
                    format!("{:.2}, {:.2}", of(0), of(2))
                })
                .collect();
            println!(
                "| {} | {workers} | {} | {} | {} | {} | {} | {} |",
                if keys == Keys::Reused {
                    "reused"
                } else {
                    "fresh"
                },
                thousands(median(&rates[0])),
                thousands(median(&rates[1])),
                thousands(median(&rates[2])),
                ratio(1),
                ratio(2),
                stmts.join(" / ")
            );
            eprintln!("load average: {}", load_average());
        }
    }
    println!("\nHot key: {HOT_WORKERS} workers ({} waiters), each its own client, pausing {THINK:?} after each release; hand-off p50 in ms over {HANDOFFS} hand-offs per round (median of {rounds} rounds; ratio other/distlock per round, above 1 = distlock faster)\n", HOT_WORKERS - 1);
    println!("| side | hand-off p50 | other/distlock |");
    println!("|---|---:|---:|");
    let mut p50s: Vec<Vec<f64>> = vec![Vec::new(); HOT_SIDES.len()];
    for r in 0..rounds {
        let order: [usize; 4] = if r % 2 == 0 {
            [0, 1, 2, 3]
        } else {
            [3, 2, 1, 0]
        };
        for i in order {
            tag += 1;
            p50s[i].push(hot_key(HOT_SIDES[i], url, &distlock, &peer, tag).await?);
        }
    }
    for (i, side) in HOT_SIDES.iter().enumerate() {
        let ratio = if i == 0 {
            "1.00".to_owned()
        } else {
            spread(
                &(0..rounds)
                    .map(|r| p50s[i][r] / p50s[0][r])
                    .collect::<Vec<_>>(),
            )
        };
        println!("| {} | {:.3} | {ratio} |", side.name(), median(&p50s[i]));
    }
    eprintln!("load average: {}", load_average());
    println!("\nHolding {held} locks at once (one fresh client of each side; the server's Threads_connected, this probe included)\n");
    println!("| side | before → while held | per 1,000 held |");
    println!("|---|---:|---:|");
    for side in SIDES {
        if held == 0 {
            break;
        }
        tag += 1;
        let (before, during) = holding(side, url, held, tag).await?;
        let extra = during.saturating_sub(before) as f64;
        println!(
            "| {} | {before} → {during} | {:.0} |",
            side.name(),
            extra * 1000.0 / held as f64
        );
    }
    eprintln!("load average at end: {}", load_average());
    Ok(())
}
