//! At most three jobs at once, across every process: a semaphore of three permits.
//!
//! Eight jobs start together, each on its own client (as eight processes would). Each
//! takes one of the three permits of the key `example/exports`, waiting while all three
//! are held; the example checks that no more than three ever run at once.
//!
//! ```sh
//! cargo run --example semaphore                             # the memory backend
//! cargo run --example semaphore -- redis://127.0.0.1:6379   # any backend URL
//! ```
//!
//! Every holder of a semaphore key must ask for the same number of permits. Without
//! code: `distlock exec --permits 3 example/exports -- COMMAND`.

use std::error::Error;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::{LockKey, LockOptions, WaitPolicy};

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

const PERMITS: u32 = 3;
const JOBS: usize = 8;

#[tokio::main]
async fn main() -> Result<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://".into());
    run(&url).await
}

/// Runs the jobs on the backend at `url`.
async fn run(url: &str) -> Result<()> {
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut jobs = Vec::new();
    for job in 0..JOBS {
        let client = distlock::connect(url).await?;
        let (running, most) = (running.clone(), most.clone());
        jobs.push(tokio::spawn(async move {
            let key = LockKey::new("example/exports")?;
            let options = LockOptions::new(Duration::from_secs(30))
                .with_wait(WaitPolicy::Timeout(Duration::from_secs(30)));
            let permit = client.semaphore().acquire(&key, PERMITS, &options).await?;
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            println!("job {job}: running ({now} at once)");
            tokio::time::sleep(Duration::from_millis(100)).await; // the export
            running.fetch_sub(1, Ordering::SeqCst);
            permit.release().await?;
            Ok::<_, distlock::LockError>(())
        }));
    }
    for job in jobs {
        job.await??;
    }
    let most = most.load(Ordering::SeqCst);
    println!("at most {most} jobs ran at once");
    assert!(most <= PERMITS as usize);
    distlock::settle_cleanups(Duration::from_secs(2)).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[tokio::test(flavor = "multi_thread")]
    async fn runs_on_memory() {
        super::run("memory://example-semaphore").await.unwrap();
    }
}
