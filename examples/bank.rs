//! The bank story: why a lock, and why a fencing token.
//!
//! Account 42 holds 1000. A withdrawal of 200 and a transfer of 300 arrive at once;
//! each reads the balance, waits for the database, and writes the balance back.
//! 1. Without a lock both read 1000 and the later write wins: 700, a lost update.
//! 2. With the lock they take turns: 500.
//! 3. Holder A pauses past its lease, B takes over and writes to a fenced store, and
//!    A's late write with its stale fencing token is refused.
//!
//! ```sh
//! cargo run --example bank                              # the memory backend
//! cargo run --example bank -- redis://127.0.0.1:6379    # any backend URL
//! ```
//!
//! `distlock demo` tells the same story.

use std::error::Error;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{Capability, DistributedLock, FencingToken, LockKey, LockOptions, WaitPolicy};
use tokio::sync::Barrier;

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

const START: i64 = 1000;
const WITHDRAW: i64 = 200;
const TRANSFER: i64 = 300;
/// The pretend database round trip between reading and writing the balance.
const ROUND_TRIP: Duration = Duration::from_millis(20);

#[tokio::main]
async fn main() -> Result<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://".into());
    run(&url).await
}

/// Tells the story on the backend at `url`.
async fn run(url: &str) -> Result<()> {
    // Two clients, as if the two requests ran in two processes.
    let first = distlock::connect(url).await?.lock();
    let second = distlock::connect(url).await?.lock();
    let key = LockKey::new("example/account-42")?;

    let balance = without_lock().await;
    println!("without a lock: {balance} (a lost update: the withdrawal vanished)");
    assert_eq!(balance, START - TRANSFER);

    let balance = with_lock(&*first, &*second, &key).await?;
    println!("with the lock: {balance} (correct)");
    assert_eq!(balance, START - WITHDRAW - TRANSFER);

    fencing(first, second, &key).await?;
    // Guards dropped along the way are released in the background: let that finish.
    distlock::settle_cleanups(Duration::from_secs(2)).await;
    Ok(())
}

/// The balance of account 42, standing for a row in a database.
struct Account(AtomicI64);

impl Account {
    async fn read(&self) -> i64 {
        tokio::time::sleep(ROUND_TRIP).await;
        self.0.load(Ordering::SeqCst)
    }

    async fn write(&self, value: i64) {
        tokio::time::sleep(ROUND_TRIP).await;
        self.0.store(value, Ordering::SeqCst);
    }
}

/// Act 1: both requests read, then the withdrawal writes, then the transfer writes.
/// The barriers make the bad interleaving certain rather than likely.
async fn without_lock() -> i64 {
    let account = Account(AtomicI64::new(START));
    let (both_read, withdrawn) = (Barrier::new(2), Barrier::new(2));
    let withdraw = async {
        let seen = account.read().await;
        both_read.wait().await;
        account.write(seen - WITHDRAW).await;
        withdrawn.wait().await;
    };
    let transfer = async {
        let seen = account.read().await;
        both_read.wait().await;
        withdrawn.wait().await;
        account.write(seen - TRANSFER).await;
    };
    tokio::join!(withdraw, transfer);
    account.0.load(Ordering::SeqCst)
}

/// Act 2: the same two requests, each inside `with_lock` on its own client.
async fn with_lock(
    first: &dyn DistributedLock,
    second: &dyn DistributedLock,
    key: &LockKey,
) -> Result<i64> {
    let account = Account(AtomicI64::new(START));
    let options = LockOptions::new(Duration::from_secs(30))
        .with_wait(WaitPolicy::Timeout(Duration::from_secs(15)));
    let request = |lock, amount| {
        let (account, options) = (&account, &options);
        distlock::with_lock(lock, key, options, move |_token| async move {
            let seen = account.read().await;
            account.write(seen - amount).await;
        })
    };
    let (withdrawal, transfer) = tokio::join!(request(first, WITHDRAW), request(second, TRANSFER));
    withdrawal?;
    transfer?;
    Ok(account.0.load(Ordering::SeqCst))
}

/// A resource that refuses writes carrying a token lower than the highest it has seen:
/// what a database row with a token column, compared in the `UPDATE`, does.
struct FencedStore {
    /// The balance and the highest token seen.
    state: Mutex<(i64, Option<FencingToken>)>,
}

impl FencedStore {
    fn write(&self, token: FencingToken, value: i64) -> std::result::Result<(), String> {
        let mut state = self.state.lock().unwrap();
        match state.1 {
            Some(highest) if token < highest => {
                Err(format!("token {token} is below {highest}, refused"))
            }
            _ => {
                *state = (value, Some(token));
                Ok(())
            }
        }
    }
}

/// Act 3: A takes the lock with a short lease and pauses past it; B takes over and
/// writes; A wakes and writes with its stale token. Skipped on a backend without
/// fencing tokens or without leases that expire by TTL.
async fn fencing(
    first: Arc<dyn DistributedLock>,
    second: Arc<dyn DistributedLock>,
    key: &LockKey,
) -> Result<()> {
    let info = first.info();
    for capability in [
        info.capabilities.mutex.fencing,
        info.capabilities.mutex.ttl_expiry,
    ] {
        if let Capability::Unsupported(why) = capability {
            println!("fencing: skipped on {}: {why}", info.name);
            return Ok(());
        }
    }
    let store = FencedStore {
        state: Mutex::new((START, None)),
    };
    let wait = WaitPolicy::Timeout(Duration::from_secs(15));

    let a = first
        .acquire(
            key,
            &LockOptions::new(Duration::from_millis(300)).with_wait(wait),
        )
        .await?;
    let token_a = a.fencing_token().expect("fencing is supported");
    println!("fencing: A holds token {token_a} with a 300 ms lease, and pauses");

    // B waits while A is paused, and gets the lock once A's lease runs out.
    let b = second
        .acquire(
            key,
            &LockOptions::new(Duration::from_secs(30)).with_wait(wait),
        )
        .await?;
    let token_b = b.fencing_token().expect("fencing is supported");
    store.write(token_b, START - WITHDRAW)?;
    println!("fencing: A's lease ran out; B holds token {token_b} and wrote");

    // A wakes up, unaware: its guard says the lease is lost, but suppose it writes anyway.
    a.lost().await;
    let refused = store.write(token_a, START - TRANSFER).unwrap_err();
    println!("fencing: A wrote with its stale token {token_a}: {refused}");
    assert_eq!(store.state.lock().unwrap().0, START - WITHDRAW);

    // A's late release finds B holding the lock, and leaves it alone.
    println!("fencing: A's late release: {:?}", a.release().await?);
    b.release().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[tokio::test(flavor = "multi_thread")]
    async fn runs_on_memory() {
        super::run("memory://example-bank").await.unwrap();
    }
}
