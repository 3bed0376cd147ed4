//! The measurements: timed slices of uncontended cycles (rate and acquire latency) and
//! the hot-key hand-off run.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use tokio::task::JoinSet;

use crate::side::{BoxError, Contender, Side, PATIENCE};

/// One timed slice of one side: cycles per second and every acquire's latency.
pub(crate) struct Slice {
    pub(crate) rate: f64,
    pub(crate) latencies: Vec<Duration>,
    /// Cycles including the warm-up.
    pub(crate) all_cycles: u64,
    /// This process's CPU time (user + system) over warm-up and measurement.
    pub(crate) client_cpu: Duration,
}

/// CPU time (user + system) this process has used so far.
#[allow(unsafe_code)] // FFI: see the SAFETY notes
pub(crate) fn process_cpu() -> Duration {
    // SAFETY: getrusage only writes the struct we pass, which is plain data.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage struct; RUSAGE_SELF is always valid.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let time = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// How long one cycle may take before it fails: past the acquire's own patience, so
/// that only a cycle stuck somewhere unbounded (a peer's release or connect, which take
/// no deadline) reaches it, and the run reports that side failed instead of hanging.
const CYCLE_LIMIT: Duration = Duration::from_secs(2 * PATIENCE.as_secs());

/// One `cycle` of `contender` on `key`, failing once it passes [`CYCLE_LIMIT`].
async fn bounded_cycle(
    contender: &mut dyn Contender,
    key: &str,
    held: &mut (dyn FnMut() + Send),
) -> Result<(), BoxError> {
    tokio::time::timeout(CYCLE_LIMIT, contender.cycle(key, held))
        .await
        .map_err(|_| format!("a cycle did not finish within {CYCLE_LIMIT:?}"))?
}

/// The keys of a slice's workers.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Keys {
    /// Each worker cycles through this many keys of its own.
    PerWorker(u64),
    /// Each cycle takes a key of its own.
    Fresh,
}

/// Slices run so far in this process.
static TURNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Runs `workers` contenders of `side` on their own keys (see [`Keys`]) for
/// `warm_up` unmeasured, then `length` measured.
pub(crate) async fn slice(
    side: &dyn Side,
    workers: usize,
    run_id: &str,
    keys: Keys,
    warm_up: Duration,
    length: Duration,
) -> Result<Slice, BoxError> {
    let mut contenders = Vec::with_capacity(workers);
    for worker in 0..workers {
        contenders.push(side.contender(worker).await?);
    }
    let cpu_before = process_cpu();
    // A name for this turn, so that fresh keys never repeat across turns and rounds.
    let turn = TURNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let warm_end = Instant::now() + warm_up;
    let end = warm_end + length;
    let mut set = JoinSet::new();
    for (worker, mut contender) in contenders.into_iter().enumerate() {
        let run_id = run_id.to_owned();
        set.spawn(async move {
            let turn = turn;
            let mut latencies = Vec::new();
            let mut n = 0u64;
            loop {
                let started = Instant::now();
                if started >= end {
                    break;
                }
                let mut granted = None;
                let key = match keys {
                    Keys::PerWorker(keys) => format!("{run_id}/u/{worker}/{}", n % keys.max(1)),
                    // Unique across turns too: the turn's start is in the name.
                    Keys::Fresh => format!("{run_id}/f/{turn}/{worker}/{n}"),
                };
                bounded_cycle(&mut *contender, &key, &mut || {
                    granted = Some(Instant::now())
                })
                .await?;
                if started >= warm_end {
                    if let Some(granted) = granted {
                        latencies.push(granted - started);
                    }
                }
                n += 1;
            }
            Ok::<_, BoxError>((latencies, n))
        });
    }
    let mut latencies = Vec::new();
    let mut all_cycles = 0;
    while let Some(joined) = set.join_next().await {
        let (worker_latencies, cycles) = joined??;
        latencies.extend(worker_latencies);
        all_cycles += cycles;
    }
    Ok(Slice {
        rate: latencies.len() as f64 / length.as_secs_f64(),
        latencies,
        all_cycles,
        client_cpu: process_cpu().saturating_sub(cpu_before),
    })
}

/// What the hot-key run saw.
pub(crate) struct HotKey {
    /// Release-to-next-grant times where the next holder was another worker.
    pub(crate) handoffs: Vec<Duration>,
    /// Grants that went straight back to the worker that had just released.
    pub(crate) regrants: u64,
    /// Each grant's wait: from calling acquire to being granted.
    pub(crate) waits: Vec<Duration>,
    /// Grants per worker.
    pub(crate) per_worker: Vec<u64>,
    /// From the first grant to the last.
    pub(crate) elapsed: Duration,
}

/// Shared between hot-key workers: who released last and when, and what was seen.
struct Baton {
    released: Option<(usize, Instant)>,
    first_grant: Option<Instant>,
    last_grant: Option<Instant>,
    handoffs: Vec<Duration>,
    regrants: u64,
    waits: Vec<Duration>,
}

/// `contenders` (each on its own client) loop on one key, pausing `think` between a
/// release and their next acquire, until `handoffs` hand-offs
/// were seen or `limit` passed; then every worker stops, a waiting one by dropping its
/// acquire. The holder stamps the time just before it releases; the next holder takes
/// the difference right after its grant. Both stamps are taken in this process, so no
/// clocks need agreeing. A grant to the worker that just released is no hand-off and
/// is counted apart.
pub(crate) async fn hot_key(
    contenders: Vec<Box<dyn Contender>>,
    key: &str,
    handoffs: usize,
    limit: Duration,
    think: Duration,
) -> Result<HotKey, BoxError> {
    let workers = contenders.len();
    let baton = Arc::new(Mutex::new(Baton {
        released: None,
        first_grant: None,
        last_grant: None,
        handoffs: Vec::with_capacity(handoffs),
        regrants: 0,
        waits: Vec::new(),
    }));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop_tx = Arc::new(stop_tx);
    let mut set = JoinSet::new();
    for (worker, mut contender) in contenders.into_iter().enumerate() {
        let (baton, stop_tx, mut stop_rx) = (baton.clone(), stop_tx.clone(), stop_rx.clone());
        let key = key.to_owned();
        set.spawn(async move {
            let mut grants = 0u64;
            let mut failure = None;
            while !*stop_rx.borrow() {
                let started = Instant::now();
                let mut on_grant = || {
                    let granted = Instant::now();
                    let Ok(mut baton) = baton.lock() else {
                        failure = Some("hot-key state poisoned");
                        return;
                    };
                    match baton.released.take() {
                        Some((by, at)) if by != worker => {
                            let handoff = granted - at;
                            baton.handoffs.push(handoff);
                        }
                        Some(_) => baton.regrants += 1,
                        None => {}
                    }
                    baton.waits.push(granted - started);
                    baton.first_grant.get_or_insert(granted);
                    baton.last_grant = Some(granted);
                    grants += 1;
                    if baton.handoffs.len() >= handoffs {
                        stop_tx.send_replace(true);
                    }
                    // Stamped last, just before the release starts.
                    baton.released = Some((worker, Instant::now()));
                };
                let cycle = bounded_cycle(&mut *contender, &key, &mut on_grant);
                tokio::select! {
                    outcome = cycle => outcome?,
                    _ = stop_rx.wait_for(|stop| *stop) => break,
                }
                // Work outside the lock before wanting it again, as a real worker
                // would; without it a polling lock goes straight back to its releaser
                // and few hand-offs happen at all.
                tokio::select! {
                    () = tokio::time::sleep(think) => {}
                    _ = stop_rx.wait_for(|stop| *stop) => break,
                }
                if let Some(failure) = failure.take() {
                    return Err(failure.into());
                }
            }
            Ok::<_, BoxError>((worker, grants))
        });
    }
    let timer = tokio::spawn({
        let stop_tx = stop_tx.clone();
        async move {
            tokio::time::sleep(limit).await;
            stop_tx.send_replace(true);
        }
    });
    let mut per_worker = vec![0; workers];
    let mut first_error = None;
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(Ok((worker, grants))) => {
                if let Some(slot) = per_worker.get_mut(worker) {
                    *slot = grants;
                }
            }
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
                stop_tx.send_replace(true);
            }
            Err(e) => {
                first_error.get_or_insert(e.into());
                stop_tx.send_replace(true);
            }
        }
    }
    timer.abort();
    if let Some(e) = first_error {
        return Err(e);
    }
    let baton = baton.lock().map_err(|_| "hot-key state poisoned")?;
    let elapsed = match (baton.first_grant, baton.last_grant) {
        (Some(first), Some(last)) => last - first,
        _ => Duration::ZERO,
    };
    Ok(HotKey {
        handoffs: baton.handoffs.clone(),
        regrants: baton.regrants,
        waits: baton.waits.clone(),
        per_worker,
        elapsed,
    })
}

/// The order in which `sides` sides take their turns in `round`: a permutation of
/// `0..sides` drawn afresh each round, seeded by the round so that runs repeat. No side
/// always goes first, and none always follows the same side: what a side leaves behind
/// (a client's background tasks, the server's lazy work) weighs on every other alike.
/// A fixed cyclic order, even rotated, gave each side one predecessor for the whole run.
pub(crate) fn turn_order(round: usize, sides: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..sides).collect();
    order.shuffle(&mut StdRng::seed_from_u64(round as u64));
    order
}

/// The `p` quantile (0..=1) of sorted samples, nearest rank; zero when empty.
pub(crate) fn quantile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64) * p).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The median of `values` (upper median for an even count); NaN when empty.
pub(crate) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Minimum and maximum of `values`; NaNs when empty.
pub(crate) fn spread(values: &[f64]) -> (f64, f64) {
    values
        .iter()
        .fold((f64::NAN, f64::NAN), |(lo, hi), &v| (lo.min(v), hi.max(v)))
}

/// Coefficient of variation (standard deviation / mean) of per-worker counts.
pub(crate) fn coefficient_of_variation(counts: &[u64]) -> f64 {
    if counts.is_empty() {
        return f64::NAN;
    }
    let n = counts.len() as f64;
    let mean = counts.iter().sum::<u64>() as f64 / n;
    if mean == 0.0 {
        return f64::NAN;
    }
    let variance = counts
        .iter()
        .map(|&c| (c as f64 - mean).powi(2))
        .sum::<f64>()
        / n;
    variance.sqrt() / mean
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_use_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(quantile(&samples, 0.5), Duration::from_millis(50));
        assert_eq!(quantile(&samples, 0.99), Duration::from_millis(99));
        assert_eq!(quantile(&samples, 0.999), Duration::from_millis(100));
        assert_eq!(quantile(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn turn_orders_are_permutations_that_vary_who_goes_first_and_before_whom() {
        let orders: Vec<Vec<usize>> = (0..9).map(|round| turn_order(round, 8)).collect();
        for order in &orders {
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..8).collect::<Vec<_>>());
        }
        assert_eq!(turn_order(3, 8), orders[3], "seeded by the round");
        let firsts: std::collections::HashSet<usize> = orders.iter().map(|o| o[0]).collect();
        assert!(firsts.len() >= 4, "first sides {firsts:?}");
        // What runs just before side 0 (none when it goes first).
        let before_zero: std::collections::HashSet<Option<usize>> = orders
            .iter()
            .map(|o| {
                let at = o.iter().position(|&s| s == 0).unwrap_or(0);
                at.checked_sub(1).map(|i| o[i])
            })
            .collect();
        assert!(before_zero.len() >= 4, "predecessors {before_zero:?}");
        assert_eq!(turn_order(0, 1), vec![0]);
        assert!(turn_order(0, 0).is_empty());
    }

    #[test]
    fn summaries() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(spread(&[3.0, 1.0, 2.0]), (1.0, 3.0));
        assert_eq!(coefficient_of_variation(&[5, 5, 5]), 0.0);
        assert!((coefficient_of_variation(&[0, 10]) - 1.0).abs() < 1e-9);
    }
}
