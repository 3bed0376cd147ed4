//! A scheduled job that runs once per firing, across replicas whose clocks disagree.
//!
//! Three replicas (three clients, as three processes would be) run the same 2 s
//! schedule, their clocks 500 ms behind, right and 500 ms ahead, each firing at its
//! own boundaries. `run_once` keys every firing by its nominal time and leaves a done
//! mark behind, so each firing runs on exactly one replica; the others say whether it
//! is running or done elsewhere.
//!
//! ```sh
//! cargo run --example scheduled                                     # the memory backend
//! cargo run --features redis --example scheduled -- redis://127.0.0.1:6379
//! ```

use std::collections::HashMap;
use std::error::Error;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use distlock::{run_once, OnceOptions, Ran, Schedule};

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

const FIRINGS: u64 = 3;

#[tokio::main]
async fn main() -> Result<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://".into());
    run(&url).await
}

/// Runs three skewed replicas of the schedule on the backend at `url`.
async fn run(url: &str) -> Result<()> {
    let name = format!("example/report-{}", std::process::id());
    let schedule = Schedule::new(name, Duration::from_secs(2))?;
    let ran: Arc<Mutex<HashMap<u64, usize>>> = Arc::default();
    // The first firing every replica reaches, whatever its clock says.
    let first = schedule.firing_at(SystemTime::now() + Duration::from_secs(3))?;
    let mut replicas = Vec::new();
    for (replica, skew_ms) in [(0, -500i64), (1, 0), (2, 500)] {
        let client = distlock::connect(url).await?;
        let (schedule, ran, mut next) = (schedule.clone(), ran.clone(), first.clone());
        replicas.push(tokio::spawn(async move {
            // This replica's clock.
            let clock = move || match skew_ms {
                ms if ms < 0 => SystemTime::now() - Duration::from_millis(ms.unsigned_abs()),
                ms => SystemTime::now() + Duration::from_millis(ms.unsigned_abs()),
            };
            let options = OnceOptions::new(Duration::from_secs(10));
            for _ in 0..FIRINGS {
                let at = next.unix_seconds().unwrap_or_default();
                // Sleep until this replica's clock reaches the boundary, as cron would.
                let due = UNIX_EPOCH + Duration::from_secs(at);
                if let Ok(wait) = due.duration_since(clock()) {
                    tokio::time::sleep(wait).await;
                }
                let firing = schedule.firing_at(clock())?;
                let ran = ran.clone();
                let outcome = run_once(&*client.lock(), &firing, &options, |turn| async move {
                    tokio::time::sleep(Duration::from_millis(50)).await; // the job
                    *ran.lock().unwrap().entry(at).or_insert(0) += 1;
                    turn.fencing_token
                })
                .await?;
                match outcome {
                    Ran::Here(token) => {
                        println!("replica {replica}: firing {at} ran here (token {token:?})")
                    }
                    Ran::RunningElsewhere => {
                        println!("replica {replica}: firing {at} is running elsewhere")
                    }
                    Ran::DoneElsewhere => println!("replica {replica}: firing {at} ran elsewhere"),
                }
                next = schedule.firing_at(due + schedule.period())?;
            }
            Ok::<_, distlock::LockError>(())
        }));
    }
    for replica in replicas {
        replica.await??;
    }
    let ran = ran.lock().unwrap().clone();
    assert_eq!(ran.len() as u64, FIRINGS, "every firing ran: {ran:?}");
    assert!(
        ran.values().all(|&n| n == 1),
        "each firing ran once: {ran:?}"
    );
    distlock::settle_cleanups(Duration::from_secs(2)).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[tokio::test(flavor = "multi_thread")]
    async fn runs_on_memory() {
        super::run("memory://example-scheduled").await.unwrap();
    }
}
