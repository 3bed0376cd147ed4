//! Transfers between two accounts, each under both accounts' locks, taken all or
//! nothing with `acquire_all`.
//!
//! Two tellers (two clients) move money back and forth between the same two accounts
//! at once, naming the accounts in opposite orders. Taken by hand in the order named,
//! that deadlocks; `acquire_all` takes keys in one canonical order, so it cannot. Each
//! account's write carries its own lock's fencing token.
//!
//! ```sh
//! cargo run --example transfer                                 # the memory backend
//! cargo run --features postgres --example transfer -- postgres://app@127.0.0.1/app
//! ```

use std::collections::HashMap;
use std::error::Error;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{LockKey, LockOptions, WaitPolicy};

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

const TRANSFERS: usize = 20;

#[tokio::main]
async fn main() -> Result<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://".into());
    run(&url).await
}

/// Runs two tellers against the backend at `url`; the total is conserved.
async fn run(url: &str) -> Result<()> {
    let prefix = format!("example/accounts-{}", std::process::id());
    let (alice, bob) = (
        LockKey::new(format!("{prefix}/alice"))?,
        LockKey::new(format!("{prefix}/bob"))?,
    );
    // The "database": balances, read and written without transactions, as a plain
    // key-value store would be. Only the locks keep the transfers from interleaving.
    let balances: Arc<Mutex<HashMap<LockKey, i64>>> = Arc::new(Mutex::new(
        [(alice.clone(), 1000), (bob.clone(), 1000)].into(),
    ));
    let mut tellers = Vec::new();
    for (from, to) in [(alice.clone(), bob.clone()), (bob.clone(), alice.clone())] {
        let locks = distlock::connect(url).await?.lock();
        let balances = balances.clone();
        tellers.push(tokio::spawn(async move {
            let options = LockOptions::new(Duration::from_secs(30))
                .with_wait(WaitPolicy::Timeout(Duration::from_secs(10)));
            for _ in 0..TRANSFERS {
                // Named in this teller's order; taken in the canonical one.
                let both = locks
                    .acquire_all(&[from.clone(), to.clone()], &options)
                    .await?;
                let read = |key: &LockKey| balances.lock().unwrap()[key];
                let (a, b) = (read(&from), read(&to));
                tokio::time::sleep(Duration::from_millis(2)).await; // the work in between
                balances.lock().unwrap().insert(from.clone(), a - 10);
                balances.lock().unwrap().insert(to.clone(), b + 10);
                let _tokens = (both.fencing_token(&from), both.fencing_token(&to));
                both.release().await?;
            }
            Ok::<_, distlock::LockError>(())
        }));
    }
    for teller in tellers {
        teller.await??;
    }
    let balances = balances.lock().unwrap().clone();
    println!("after {} transfers each way: {balances:?}", TRANSFERS);
    assert_eq!(
        balances[&alice] + balances[&bob],
        2000,
        "money was made or lost"
    );
    assert_eq!(balances[&alice], 1000, "as many transfers each way");
    distlock::settle_cleanups(Duration::from_secs(2)).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[tokio::test(flavor = "multi_thread")]
    async fn runs_on_memory() {
        super::run("memory://example-transfer").await.unwrap();
    }
}
