//! Scheduled jobs that run once per firing across replicas: [`Schedule`], [`Firing`]
//! and [`run_once`].
//!
//! Every replica fires the same schedule on its own clock. Each firing is keyed by its
//! nominal time (`name@1764405900`), not by the job's name, and a firing that ran
//! leaves a "done" mark that expires after a retention: a replica whose clock is
//! behind, firing after the job already finished elsewhere, finds the mark and skips.
//! That closes the hole of a lock keyed by name only (ShedLock's most reported bug: a
//! short job runs twice when the clocks differ by more than the job takes), for any
//! skew smaller than the retention (by default one period).
//!
//! | ShedLock | here |
//! |---|---|
//! | `lockAtMostFor` | [`OnceOptions::at_most_for`]: the lease; how long a dead runner blocks its firing |
//! | `lockAtLeastFor` | [`OnceOptions::with_at_least_for`]: the lock kept after a short job, for a [`Firing::by_name`] |
//! | "use the database's clock" | not needed: firings are keyed by nominal time, so replicas agree without agreeing on the time |

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::{
    Capability, DistributedLock, FencingToken, LeaseMonitor, LockError, LockKey, LockOptions,
    OptionsError, WaitPolicy,
};

/// The shortest period a [`Schedule`] accepts: firings are keyed by whole seconds.
pub const MIN_PERIOD: Duration = Duration::from_secs(1);

/// A job's schedule: a name and a period; firings fall on the period's boundaries
/// since the Unix epoch (every 15 minutes: :00, :15, :30, :45), as cron's do, so every
/// replica computes the same firing for the same boundary whatever its clock says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    name: String,
    period: Duration,
}

impl Schedule {
    /// A schedule named `name` firing every `period` (whole seconds, at least
    /// [`MIN_PERIOD`]).
    ///
    /// # Errors
    /// [`OptionsError::Period`] for a period below a second or not whole seconds.
    pub fn new(name: impl Into<String>, period: Duration) -> Result<Self, OptionsError> {
        if period < MIN_PERIOD || period.subsec_nanos() != 0 {
            return Err(OptionsError::Period { period });
        }
        Ok(Schedule {
            name: name.into(),
            period,
        })
    }

    /// The period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// The firing due at `now` on this replica's clock: the last boundary at or before
    /// `now`. Pass the clock's time (`SystemTime::now()`); a clock before 1970 reads as
    /// the epoch.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] when the name makes no valid key.
    pub fn firing_at(&self, now: SystemTime) -> Result<Firing, LockError> {
        let since_epoch = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let period = self.period.as_secs();
        let at = since_epoch - since_epoch % period;
        Ok(Firing {
            key: LockKey::new(format!("{}@{at}", self.name))?,
            done: Some(LockKey::new(format!("{}@{at}/done", self.name))?),
            at: Some(at),
            period: Some(self.period),
        })
    }
}

/// One firing of a job: the key its run holds, and the key of its "done" mark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Firing {
    key: LockKey,
    done: Option<LockKey>,
    at: Option<u64>,
    period: Option<Duration>,
}

impl Firing {
    /// A "firing" keyed by the job's name only, with no done mark: the plain lock of
    /// ShedLock and of `distlock exec --no-wait`. A replica that fires after the job
    /// finished elsewhere runs it again; [`OnceOptions::with_at_least_for`] narrows
    /// that window, a [`Schedule`]'s firings close it.
    pub fn by_name(key: LockKey) -> Self {
        Firing {
            key,
            done: None,
            at: None,
            period: None,
        }
    }

    /// The key the run holds (`name@SECONDS`, or the name).
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The key of the done mark (`name@SECONDS/done`), if the firing has one.
    pub fn done_key(&self) -> Option<&LockKey> {
        self.done.as_ref()
    }

    /// The schedule's period, for a scheduled firing.
    pub fn period(&self) -> Option<Duration> {
        self.period
    }

    /// The nominal time of the firing, in seconds since the Unix epoch.
    pub fn unix_seconds(&self) -> Option<u64> {
        self.at
    }
}

/// How a firing runs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OnceOptions {
    /// The run's lease: a runner that dies holds its firing at most this long.
    pub at_most_for: Duration,
    /// Keep the run's lock this long after the job started, even if it finished
    /// sooner (ShedLock's `lockAtLeastFor`); `None` releases it at once.
    pub at_least_for: Option<Duration>,
    /// How long the done mark lasts; `None` is one period (for a [`Schedule`]'s
    /// firing).
    pub keep_done_for: Option<Duration>,
}

impl OnceOptions {
    /// Runs that hold their firing at most `at_most_for`.
    pub fn new(at_most_for: Duration) -> Self {
        OnceOptions {
            at_most_for,
            at_least_for: None,
            keep_done_for: None,
        }
    }

    /// Keeps the run's lock `at_least_for` after the job started.
    pub fn with_at_least_for(mut self, at_least_for: Duration) -> Self {
        self.at_least_for = Some(at_least_for);
        self
    }

    /// Keeps the done mark `keep_done_for` instead of one period.
    pub fn with_keep_done_for(mut self, keep_done_for: Duration) -> Self {
        self.keep_done_for = Some(keep_done_for);
        self
    }
}

/// What [`run_once`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ran<T> {
    /// The job ran here, and returned this.
    Here(T),
    /// Another replica is running this firing now.
    RunningElsewhere,
    /// Another replica already ran this firing.
    DoneElsewhere,
}

/// What the job gets: its fencing token, and the run's lease to stop on.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Turn {
    /// The run's fencing token (where the backend hands them out): send it with the
    /// job's writes.
    pub fencing_token: Option<FencingToken>,
    /// The run's lease: stop when [`LeaseMonitor::lost`] fires (at `at_most_for`).
    pub lease: LeaseMonitor,
}

/// Runs `job` for `firing` unless another replica runs or ran it: never waits, at
/// most once per firing across replicas.
///
/// The run holds `firing`'s key for [`OnceOptions::at_most_for`] (not renewed: a
/// longer job loses its lock, and [`Turn::lease`] says so). Holding it, it looks for
/// the firing's done mark; finding none, it runs the job, then sets the mark (a lock
/// of its own, left to expire after the retention) and releases the run's key (or
/// keeps it until `at_least_for` after the start). The mark is set whatever the job
/// returned: the firing ran.
///
/// # Errors
/// [`LockError::Unsupported`] on a backend whose mutex has no TTL expiry, or whose
/// leases do not outlive their client (`at_most_for` could not expire there, or the
/// mark would vanish with this process: [`crate::Guarantees::outlives_client`]); [`LockError::InvalidOptions`] for a
/// duration out of TTL bounds; connection and backend errors. A job that ran keeps
/// its result only in [`Ran::Here`]: if setting the mark then fails, the error is
/// returned and the firing may run again elsewhere.
pub async fn run_once<F, Fut, T>(
    lock: &dyn DistributedLock,
    firing: &Firing,
    options: &OnceOptions,
    job: F,
) -> Result<Ran<T>, LockError>
where
    F: FnOnce(Turn) -> Fut,
    Fut: Future<Output = T>,
{
    let info = lock.info();
    let mutex = info.capabilities.mutex;
    // The run's lease must end at `at_most_for`, and a mark (done, or at least for)
    // must outlive this process.
    for needed in [mutex.ttl_expiry, mutex.outlives_client] {
        if let Capability::Unsupported(reason) = needed {
            return Err(LockError::Unsupported {
                backend: info.name,
                operation: "running once per firing",
                reason,
            });
        }
    }
    let no_wait = |ttl| LockOptions::new(ttl).with_wait(WaitPolicy::NoWait);
    let Some(run) = lock
        .try_acquire(&firing.key, &no_wait(options.at_most_for))
        .await?
    else {
        return Ok(Ran::RunningElsewhere);
    };
    let keep_done = options
        .keep_done_for
        .or(firing.period)
        .unwrap_or(options.at_most_for);
    if let Some(done) = &firing.done {
        match lock.try_acquire(done, &no_wait(keep_done)).await? {
            None => {
                run.release().await?;
                return Ok(Ran::DoneElsewhere);
            }
            Some(free) => {
                free.release().await?;
            }
        }
    }
    let turn = Turn {
        fencing_token: run.fencing_token(),
        lease: run.monitor(),
    };
    let output = job(turn).await;
    if let Some(done) = &firing.done {
        match lock.try_acquire(done, &no_wait(keep_done)).await? {
            Some(mark) => mark.let_expire(),
            // Marked by another replica meanwhile: it ran too, after our run's lease
            // ran out (at_most_for shorter than the job).
            None => {
                tracing::warn!(key = %firing.key, "the firing was marked done elsewhere while it ran here")
            }
        }
    }
    let left = options
        .at_least_for
        .and_then(|least| least.checked_sub(run.lease().acquired_at().elapsed()))
        .filter(|left| !left.is_zero());
    match left {
        Some(left) if left >= crate::MIN_TTL => {
            run.extend(left).await?;
            run.let_expire();
        }
        _ => {
            run.release().await?;
        }
    }
    Ok(Ran::Here(output))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    use tokio::time::Instant;

    use super::*;
    use crate::MemoryLock;

    /// Three replicas of a 5 s schedule whose clocks read 2 s behind, right and 2 s
    /// ahead, each firing at its own boundaries, with a 10 ms job; with `by_name`, a
    /// lock keyed by the job's name instead of each firing's. Returns how many times
    /// each firing ran.
    async fn replicas(firings: u64, by_name: bool) -> HashMap<u64, usize> {
        let store = MemoryLock::new();
        let base = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let start = Instant::now();
        let schedule = Schedule::new("report", Duration::from_secs(5)).unwrap();
        let runs = Arc::new(Mutex::new(HashMap::new()));
        let mut replicas = Vec::new();
        for offset in [-2i64, 0, 2] {
            let (lock, schedule, runs) =
                (store.new_client().lock(), schedule.clone(), runs.clone());
            replicas.push(tokio::spawn(async move {
                let clock = move || {
                    let now = base + start.elapsed();
                    match offset {
                        o if o < 0 => now - Duration::from_secs(o.unsigned_abs()),
                        o => now + Duration::from_secs(o.unsigned_abs()),
                    }
                };
                for n in 1..=firings {
                    // Sleep to this replica's next boundary, as cron would.
                    let due = base + Duration::from_secs(5 * n);
                    if let Ok(wait) = due.duration_since(clock()) {
                        tokio::time::sleep(wait).await;
                    }
                    let firing = schedule.firing_at(clock()).unwrap();
                    let at = firing.unix_seconds().unwrap();
                    let firing = if by_name {
                        Firing::by_name(LockKey::new("report").unwrap())
                    } else {
                        firing
                    };
                    let options = OnceOptions::new(Duration::from_secs(60));
                    let runs = runs.clone();
                    run_once(&*lock, &firing, &options, |_| async move {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        *runs.lock().unwrap().entry(at).or_insert(0) += 1;
                    })
                    .await
                    .unwrap();
                }
            }));
        }
        for replica in replicas {
            replica.await.unwrap();
        }
        let runs = runs.lock().unwrap().clone();
        runs
    }

    #[tokio::test(start_paused = true)]
    async fn every_firing_runs_exactly_once_under_two_seconds_of_skew() {
        let runs = replicas(10, false).await;
        assert_eq!(runs.len(), 10, "firings missed: {runs:?}");
        assert!(
            runs.values().all(|&n| n == 1),
            "a firing ran twice: {runs:?}"
        );
    }

    /// The same replicas with a lock keyed by name only (`exec --no-wait`): the job is
    /// short, so replicas whose clocks are behind run it again.
    #[tokio::test(start_paused = true)]
    async fn a_lock_by_name_runs_firings_twice_under_the_same_skew() {
        let runs = replicas(10, true).await;
        let total: usize = runs.values().sum();
        println!("keyed by name: {total} runs of 10 firings: {runs:?}");
        assert!(total > 10, "no double run seen: {runs:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_or_done_firing_is_skipped_and_says_which() {
        let memory = MemoryLock::new();
        let (a, b) = (memory.lock(), memory.new_client().lock());
        let schedule = Schedule::new("job", Duration::from_secs(60)).unwrap();
        let firing = schedule.firing_at(SystemTime::now()).unwrap();
        let options = OnceOptions::new(Duration::from_secs(30));
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
        let running = {
            let (firing, options) = (firing.clone(), options.clone());
            tokio::spawn(async move {
                run_once(&*a, &firing, &options, |turn| async move {
                    started_tx.send(turn.fencing_token).unwrap();
                    finish_rx.await.unwrap();
                })
                .await
            })
        };
        let token = started_rx.await.unwrap();
        assert!(token.is_some(), "the job gets its fencing token");
        let elsewhere = run_once(&*b, &firing, &options, |_| async {})
            .await
            .unwrap();
        assert_eq!(elsewhere, Ran::RunningElsewhere);
        finish_tx.send(()).unwrap();
        assert_eq!(running.await.unwrap().unwrap(), Ran::Here(()));
        let done = run_once(&*b, &firing, &options, |_| async {})
            .await
            .unwrap();
        assert_eq!(done, Ran::DoneElsewhere);
        // The mark expires after a period: nothing is left behind.
        tokio::time::sleep(Duration::from_secs(61)).await;
        assert!(memory.store().get(firing.done_key().unwrap()).is_none());
        assert!(memory.store().get(firing.key()).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn at_least_for_keeps_a_short_job_locked() {
        let memory = MemoryLock::new();
        let lock = memory.lock();
        let firing = Firing::by_name(LockKey::new("nightly").unwrap());
        let options =
            OnceOptions::new(Duration::from_secs(30)).with_at_least_for(Duration::from_secs(10));
        let ran = run_once(&*lock, &firing, &options, |_| async {})
            .await
            .unwrap();
        assert_eq!(ran, Ran::Here(()));
        tokio::time::sleep(Duration::from_secs(9)).await;
        let again = run_once(&*lock, &firing, &options, |_| async {})
            .await
            .unwrap();
        assert_eq!(again, Ran::RunningElsewhere, "released before at_least_for");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let later = run_once(&*lock, &firing, &options, |_| async {})
            .await
            .unwrap();
        assert_eq!(later, Ran::Here(()));
    }

    #[test]
    fn periods_are_whole_seconds_and_firings_fall_on_boundaries() {
        assert!(Schedule::new("x", Duration::from_millis(1500)).is_err());
        assert!(Schedule::new("x", Duration::ZERO).is_err());
        let every_15_min = Schedule::new("x", Duration::from_secs(900)).unwrap();
        let now = UNIX_EPOCH + Duration::from_secs(1_764_405_999);
        let firing = every_15_min.firing_at(now).unwrap();
        assert_eq!(firing.unix_seconds(), Some(1_764_405_900));
        assert_eq!(firing.key().as_str(), "x@1764405900");
        assert_eq!(firing.done_key().unwrap().as_str(), "x@1764405900/done");
    }
}
