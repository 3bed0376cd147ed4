//! Workers that share jobs, each job done under its lock with `with_lock`.
//!
//! Four workers (four clients, as four processes would be) go through the same ten
//! jobs. A worker takes a job's lock without waiting; a job that another worker holds,
//! or that is done already, is skipped. `with_lock` renews the lease while the work
//! runs, stops the work if the lock is lost, and releases it at the end. The work gets
//! the grant's fencing token to send with its writes.
//!
//! ```sh
//! cargo run --example worker                                  # the memory backend
//! cargo run --example worker -- postgres://app@127.0.0.1/app  # any backend URL
//! ```

use std::collections::HashMap;
use std::error::Error;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{LockError, LockKey, LockOptions, WaitPolicy};

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

const JOBS: usize = 10;
const WORKERS: usize = 4;

#[tokio::main]
async fn main() -> Result<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://".into());
    run(&url).await
}

/// Runs the workers on the backend at `url` until every job is done once.
async fn run(url: &str) -> Result<()> {
    // Which worker did each job: the shared "database" of this example.
    let done: Arc<Mutex<HashMap<usize, usize>>> = Arc::default();
    let mut workers = Vec::new();
    for worker in 0..WORKERS {
        let client = distlock::connect(url).await?;
        let done = done.clone();
        workers.push(tokio::spawn(async move {
            let locks = client.lock();
            // A job's lock is held while it runs; NoWait skips jobs another worker holds.
            let options = LockOptions::new(Duration::from_secs(10)).with_wait(WaitPolicy::NoWait);
            for job in 0..JOBS {
                if done.lock().unwrap().contains_key(&job) {
                    continue;
                }
                let key = LockKey::new(format!("example/jobs/{job}"))?;
                let outcome = distlock::with_lock(&*locks, &key, &options, |token| {
                    let done = done.clone();
                    async move {
                        // Checked again under the lock: another worker may have finished it.
                        if done.lock().unwrap().contains_key(&job) {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await; // the work
                        let token = token.map_or("none".into(), |t| t.to_string());
                        println!("worker {worker}: job {job} done (fencing token {token})");
                        done.lock().unwrap().insert(job, worker);
                    }
                })
                .await;
                match outcome {
                    Ok(()) => {}
                    Err(LockError::Timeout { .. }) => {} // another worker holds it: next job
                    Err(other) => return Err(other),
                }
            }
            Ok::<_, LockError>(())
        }));
    }
    for worker in workers {
        worker.await??;
    }
    assert_eq!(done.lock().unwrap().len(), JOBS, "every job done once");
    distlock::settle_cleanups(Duration::from_secs(2)).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[tokio::test(flavor = "multi_thread")]
    async fn runs_on_memory() {
        super::run("memory://example-worker").await.unwrap();
    }
}
