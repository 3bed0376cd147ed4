//! Readers share a key, a writer has it alone: a read-write lock.
//!
//! Four readers read a price list again and again while a writer updates it twice.
//! Readers hold `RwMode::Read` together; the writer's `RwMode::Write` waits for the
//! readers to leave and holds new readers back meanwhile (writers are preferred, so a
//! stream of readers cannot starve it). The example checks that no reader ever runs
//! beside the writer.
//!
//! ```sh
//! cargo run --example rwlock                              # the memory backend
//! cargo run --example rwlock -- etcd://127.0.0.1:2379     # any backend URL
//! ```

use std::error::Error;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::{LockKey, LockOptions, RwMode, WaitPolicy};

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

#[tokio::main]
async fn main() -> Result<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://".into());
    run(&url).await
}

/// What the lock protects, and who is inside.
#[derive(Default)]
struct PriceList {
    version: AtomicUsize,
    readers: AtomicUsize,
    writing: AtomicBool,
}

/// Runs the readers and the writer on the backend at `url`.
async fn run(url: &str) -> Result<()> {
    let prices = Arc::new(PriceList::default());
    let key = LockKey::new("example/prices")?;
    let options = LockOptions::new(Duration::from_secs(30))
        .with_wait(WaitPolicy::Timeout(Duration::from_secs(30)));
    let mut tasks = Vec::new();
    for reader in 0..4 {
        let client = distlock::connect(url).await?;
        let (prices, key, options) = (prices.clone(), key.clone(), options.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                let guard = client
                    .rw_lock()
                    .acquire(&key, RwMode::Read, &options)
                    .await?;
                let together = prices.readers.fetch_add(1, Ordering::SeqCst) + 1;
                assert!(
                    !prices.writing.load(Ordering::SeqCst),
                    "a reader beside the writer"
                );
                let version = prices.version.load(Ordering::SeqCst);
                println!("reader {reader}: price list v{version} ({together} reading)");
                tokio::time::sleep(Duration::from_millis(30)).await;
                prices.readers.fetch_sub(1, Ordering::SeqCst);
                guard.release().await?;
            }
            Ok::<_, distlock::LockError>(())
        }));
    }
    let client = distlock::connect(url).await?;
    let writer = {
        let prices = prices.clone();
        tokio::spawn(async move {
            for _ in 0..2 {
                tokio::time::sleep(Duration::from_millis(40)).await;
                let guard = client
                    .rw_lock()
                    .acquire(&key, RwMode::Write, &options)
                    .await?;
                prices.writing.store(true, Ordering::SeqCst);
                assert_eq!(
                    prices.readers.load(Ordering::SeqCst),
                    0,
                    "the writer beside readers"
                );
                let version = prices.version.fetch_add(1, Ordering::SeqCst) + 1;
                println!("writer: price list v{version} written, alone");
                tokio::time::sleep(Duration::from_millis(30)).await;
                prices.writing.store(false, Ordering::SeqCst);
                guard.release().await?;
            }
            Ok::<_, distlock::LockError>(())
        })
    };
    tasks.push(writer);
    for task in tasks {
        task.await??;
    }
    distlock::settle_cleanups(Duration::from_secs(2)).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[tokio::test(flavor = "multi_thread")]
    async fn runs_on_memory() {
        super::run("memory://example-rwlock").await.unwrap();
    }
}
