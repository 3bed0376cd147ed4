//! Scheduled jobs: every firing runs once across replicas whose clocks disagree, and a
//! runner that dies holds its firing no longer than its lease.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use distlock_api::{run_once, OnceOptions, Ran, Schedule};
use tokio::time::Instant;

use super::{check, millis, unique_key, Failure};
use crate::Harness;

/// The schedule's period, and how far the replicas' clocks are off (behind, right,
/// ahead): a skew of 4 s in all, within one period.
const PERIOD: Duration = Duration::from_secs(5);
const SKEW: Duration = Duration::from_secs(2);
/// Firings watched.
const FIRINGS: u64 = 10;

/// `now` on a clock `offset` off (`ahead` or behind).
fn skewed(offset: Duration, ahead: bool) -> SystemTime {
    let now = SystemTime::now();
    if ahead {
        now + offset
    } else {
        now - offset
    }
}

pub(super) async fn scheduled_firings_run_once_under_skew(
    h: &dyn Harness,
) -> Result<String, Failure> {
    let schedule = Schedule::new(unique_key("schedule").as_str(), PERIOD)
        .map_err(|e| Failure::Failed(format!("the schedule was refused: {e}")))?;
    let runs = Arc::new(Mutex::new(HashMap::<u64, usize>::new()));
    // The first boundary every replica reaches after the start, on its own clock.
    let first = SystemTime::now() + SKEW + PERIOD;
    let mut replicas = Vec::new();
    for (offset, ahead) in [(SKEW, false), (Duration::ZERO, false), (SKEW, true)] {
        let lock = h.client().await?.lock();
        let (schedule, runs) = (schedule.clone(), runs.clone());
        replicas.push(tokio::spawn(async move {
            let Ok(mut at) = schedule.firing_at(first) else {
                return Err(Failure::Failed("no first firing".to_owned()));
            };
            for _ in 0..FIRINGS {
                let Some(nominal) = at.unix_seconds() else {
                    return Err(Failure::Failed("a firing without a time".to_owned()));
                };
                let due = SystemTime::UNIX_EPOCH + Duration::from_secs(nominal);
                // Fire when this replica's clock reaches the boundary, as cron would.
                if let Ok(wait) = due.duration_since(skewed(offset, ahead)) {
                    tokio::time::sleep(wait).await;
                }
                let firing = schedule.firing_at(skewed(offset, ahead))?;
                let fired = firing.unix_seconds().unwrap_or_default();
                let runs = runs.clone();
                run_once(&*lock, &firing, &OnceOptions::new(PERIOD), |_| async move {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    *runs
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .entry(fired)
                        .or_insert(0) += 1;
                })
                .await?;
                at = schedule.firing_at(due + PERIOD)?;
            }
            Ok::<_, Failure>(())
        }));
    }
    for replica in replicas {
        replica
            .await
            .map_err(|e| Failure::Failed(format!("a replica panicked: {e}")))??;
    }
    let runs = runs.lock().unwrap_or_else(PoisonError::into_inner).clone();
    check!(
        runs.len() as u64 == FIRINGS,
        "{} of {FIRINGS} firings ran: {runs:?}",
        runs.len()
    );
    check!(
        runs.values().all(|&n| n == 1),
        "a firing ran more than once: {runs:?}"
    );
    Ok(format!(
        "{FIRINGS} firings of a {PERIOD:?} schedule on three replicas {SKEW:?} behind, right and ahead: each ran once"
    ))
}

pub(super) async fn scheduled_firing_of_a_dead_runner_waits_at_most_for(
    h: &dyn Harness,
) -> Result<String, Failure> {
    let schedule = Schedule::new(
        unique_key("schedule-dead").as_str(),
        Duration::from_secs(3600),
    )
    .map_err(|e| Failure::Failed(format!("the schedule was refused: {e}")))?;
    let firing = schedule.firing_at(SystemTime::now())?;
    let at_most_for = h.ttl();
    let options = OnceOptions::new(at_most_for);
    let dying = h.client().await?;
    let Some(faults) = dying.faults.clone() else {
        return Err(Failure::Skipped("the harness cannot crash a client".into()));
    };
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let runner = {
        let (firing, options) = (firing.clone(), options.clone());
        tokio::spawn(async move {
            run_once(&*dying.lock(), &firing, &options, |turn| async move {
                let _ = started_tx.send(turn.lease.valid_until());
                // The process dies mid-job: nothing more reaches the server.
                let _ = faults.crash().await;
                std::future::pending::<()>().await;
            })
            .await
        })
    };
    let held_until = started_rx
        .await
        .map_err(|_| Failure::Failed("the first runner never started".to_owned()))?;
    let started = Instant::now();
    let other = h.client().await?.lock();
    let bound = at_most_for + h.slack();
    let ran = loop {
        match run_once(&*other, &firing, &options, |_| async {}).await? {
            Ran::Here(()) => break Instant::now(),
            Ran::DoneElsewhere => {
                return Err(Failure::Failed(
                    "a firing whose runner died mid-job was marked done".to_owned(),
                ))
            }
            Ran::RunningElsewhere => {}
        }
        check!(
            started.elapsed() < bound,
            "the dead runner held its firing longer than at_most_for ({at_most_for:?}) plus slack"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    runner.abort();
    check!(
        ran >= held_until,
        "the firing ran again before the dead runner's lease ended"
    );
    Ok(format!(
        "run again {} after the runner died (at_most_for {at_most_for:?})",
        millis(ran - started)
    ))
}
