//! `distlock demo`: the bank story of the design notes, told in three acts.
//!
//! Account 42 holds 1000. A withdrawal of 200 and a transfer of 300 arrive at once;
//! each reads the balance, waits for the database, and writes the balance back.
//! 1. Without a lock both read 1000 and the later write wins: 700, a lost update.
//! 2. With the lock they take turns: 500.
//! 3. Holder A pauses past its lease, B takes over and writes to a fenced store, and
//!    A's late write with its stale fencing token is rejected.
//!
//! Every act checks its own result, so the demo never reports a wrong success.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::{
    Capability, DistributedLock, FencingToken, LockError, LockGuard, LockKey, LockOptions,
    ReleaseOutcome, WaitPolicy,
};
use tokio::sync::Barrier;
use tokio::time::timeout;

use crate::error::CliError;
use crate::print_out;

const START: i64 = 1000;
const WITHDRAW: i64 = 200;
const TRANSFER: i64 = 300;
/// The pretend database round trip between reading and writing the balance.
const ROUND_TRIP: Duration = Duration::from_millis(20);
/// The lock key of account 42.
const KEY: &str = "demo/account-42";
/// The lease of holder A, who pauses past it.
const SHORT_TTL: Duration = Duration::from_millis(300);
/// The lease of everyone else: far longer than the demo.
const LONG_TTL: Duration = Duration::from_secs(30);
/// The most any acquire may wait (someone else may hold the key on a shared server).
const MAX_WAIT: Duration = Duration::from_secs(15);

/// The balance of account 42, standing for a row in a database.
struct Account {
    balance: AtomicI64,
}

impl Account {
    fn new(balance: i64) -> Self {
        Account {
            balance: AtomicI64::new(balance),
        }
    }

    /// `SELECT balance`, one round trip.
    async fn read(&self) -> i64 {
        tokio::time::sleep(ROUND_TRIP).await;
        self.balance.load(Ordering::SeqCst)
    }

    /// `UPDATE … SET balance = value`, one round trip.
    async fn write(&self, value: i64) {
        tokio::time::sleep(ROUND_TRIP).await;
        self.balance.store(value, Ordering::SeqCst);
    }

    fn balance(&self) -> i64 {
        self.balance.load(Ordering::SeqCst)
    }
}

/// A balance guarded by fencing tokens, like a database row whose `UPDATE` compares a
/// token column: a write whose token is below the highest accepted so far is refused
/// (equal tokens are accepted: the same holder writing twice).
struct FencedStore {
    /// The highest token accepted, and the balance.
    state: std::sync::Mutex<(Option<FencingToken>, i64)>,
}

impl FencedStore {
    fn new(balance: i64) -> Self {
        FencedStore {
            state: std::sync::Mutex::new((None, balance)),
        }
    }

    /// Writes `balance` unless `token` is below the highest seen; the refusal says why.
    fn write(&self, token: FencingToken, balance: i64) -> Result<(), String> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(highest) = state.0.filter(|highest| token < *highest) {
            return Err(format!(
                "stale write refused: token {token} is below the highest seen, {highest}"
            ));
        }
        *state = (Some(token), balance);
        Ok(())
    }

    fn read(&self) -> i64 {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .1
    }
}

/// Runs the demo against the backend at `url`, printing about ten lines.
///
/// # Errors
/// A usage error when `url` is refused; a failure when the backend cannot be reached,
/// an acquire times out, or any act's result is not the expected one.
pub async fn run(url: &str) -> Result<(), CliError> {
    // Two clients, as if the two requests ran in two processes.
    let first = distlock::connect(url).await?.lock();
    let second = distlock::connect(url).await?.lock();
    let key = LockKey::new(KEY).map_err(LockError::from)?;
    say(format!(
        "account 42 holds {START}; a withdrawal of {WITHDRAW} and a transfer of {TRANSFER} arrive at once (backend: {})",
        first.info().name
    ))?;

    let lost = without_lock().await;
    if lost != START - TRANSFER {
        return Err(CliError::failed(format!(
            "without a lock the balance ended at {lost}, not at the expected lost update {}",
            START - TRANSFER
        )));
    }
    say(format!(
        "without a lock: both read {START}, the withdrawal wrote {}, then the transfer wrote {lost} -> balance {lost} (lost update: the withdrawal vanished)",
        START - WITHDRAW
    ))?;

    let (balance, mut tokens) = with_lock(&*first, &*second, &key).await?;
    if balance != START - WITHDRAW - TRANSFER {
        return Err(CliError::failed(format!(
            "with the lock the balance ended at {balance}, not {}",
            START - WITHDRAW - TRANSFER
        )));
    }
    tokens.sort();
    let tokens = match tokens {
        [Some(first), Some(second)] => format!("fencing tokens {first} and {second}"),
        _ => "no fencing tokens on this backend".to_owned(),
    };
    say(format!(
        "with the lock {KEY}: the requests took turns ({tokens}) -> balance {balance} (correct)"
    ))?;

    let fenced = fencing(first, second, &key).await?;
    say(format!(
        "demo passed: {} without a lock, {} with it, {}",
        START - TRANSFER,
        START - WITHDRAW - TRANSFER,
        if fenced {
            "stale write rejected"
        } else {
            "fencing act skipped"
        }
    ))
}

/// Act 1: both requests read, then the withdrawal writes, then the transfer writes.
/// The barriers make the bad interleaving certain rather than likely.
async fn without_lock() -> i64 {
    let account = Account::new(START);
    let both_read = Barrier::new(2);
    let withdrawal_written = Barrier::new(2);
    let withdraw = async {
        let seen = account.read().await;
        both_read.wait().await;
        account.write(seen - WITHDRAW).await;
        withdrawal_written.wait().await;
    };
    let transfer = async {
        let seen = account.read().await;
        both_read.wait().await;
        withdrawal_written.wait().await;
        account.write(seen - TRANSFER).await;
    };
    tokio::join!(withdraw, transfer);
    account.balance()
}

/// Act 2: the same two requests, each inside `with_lock` on its own client. Returns
/// the final balance and the two grants' fencing tokens (none where the backend has no
/// fencing).
async fn with_lock(
    first: &dyn DistributedLock,
    second: &dyn DistributedLock,
    key: &LockKey,
) -> Result<(i64, [Option<FencingToken>; 2]), CliError> {
    let account = Account::new(START);
    let options = LockOptions::new(LONG_TTL).with_wait(WaitPolicy::Timeout(MAX_WAIT));
    let request = |lock, amount| {
        let account = &account;
        let options = &options;
        distlock::with_lock(lock, key, options, move |token| async move {
            let seen = account.read().await;
            account.write(seen - amount).await;
            token
        })
    };
    let (withdrawal, transfer) = tokio::join!(request(first, WITHDRAW), request(second, TRANSFER));
    Ok((account.balance(), [withdrawal?, transfer?]))
}

/// The token of `holder`'s grant, on a backend that reports fencing supported.
fn token_of(guard: &LockGuard, holder: &str) -> Result<FencingToken, CliError> {
    guard.fencing_token().ok_or_else(|| {
        CliError::failed(format!(
            "{holder}'s grant carried no fencing token, although the backend reports fencing supported"
        ))
    })
}

/// Act 3: fencing. A takes the lock with a short lease and pauses; B waits, takes over
/// when A's lease runs out, and writes; A wakes and writes with its stale token.
/// Returns whether the act ran: backends without TTL leases or fencing skip it.
async fn fencing(
    first: Arc<dyn DistributedLock>,
    second: Arc<dyn DistributedLock>,
    key: &LockKey,
) -> Result<bool, CliError> {
    let info = first.info();
    for (capability, what) in [
        (info.capabilities.mutex.fencing, "fencing tokens"),
        (
            info.capabilities.mutex.ttl_expiry,
            "leases that expire by TTL",
        ),
    ] {
        if let Capability::Unsupported(why) = capability {
            say(format!(
                "fencing: skipped, the {} backend does not offer {what}: {why}",
                info.name
            ))?;
            return Ok(false);
        }
    }

    let store = Arc::new(FencedStore::new(START));
    let options_a = LockOptions::new(SHORT_TTL).with_wait(WaitPolicy::Timeout(MAX_WAIT));
    let guard_a = first.acquire(key, &options_a).await?;
    let token_a = token_of(&guard_a, "A")?;
    say(format!(
        "fencing: A took the lock with token {token_a} and a {} ms lease, then paused (a GC pause, a stalled VM)",
        SHORT_TTL.as_millis()
    ))?;

    // B asks for the lock while A is paused, and writes once it has it.
    let holder_b = tokio::spawn({
        let store = store.clone();
        let key = key.clone();
        async move {
            let options = LockOptions::new(LONG_TTL).with_wait(WaitPolicy::Timeout(MAX_WAIT));
            let guard = second.acquire(&key, &options).await?;
            store
                .write(token_of(&guard, "B")?, START - WITHDRAW)
                .map_err(|e| CliError::failed(format!("B's write was refused: {e}")))?;
            Ok::<_, CliError>(guard)
        }
    });

    // A's pause outlasts its lease: A sleeps until `lost()` fires.
    timeout(SHORT_TTL + MAX_WAIT, guard_a.lost())
        .await
        .map_err(|_| CliError::failed("A's lease never ran out"))?;
    let guard_b = timeout(MAX_WAIT + MAX_WAIT, holder_b)
        .await
        .map_err(|_| CliError::failed("B never got the lock"))?
        .map_err(|e| CliError::failed(format!("holder B stopped: {e}")))??;
    let token_b = token_of(&guard_b, "B")?;
    if token_b <= token_a {
        return Err(CliError::failed(format!(
            "B's fencing token {token_b} is not above A's {token_a}"
        )));
    }
    say(format!(
        "fencing: A's lease ran out during the pause; B took the lock with token {token_b} and wrote to the fenced store"
    ))?;

    // A wakes up, unaware, and writes with its old token.
    match store.write(token_a, START - TRANSFER) {
        Ok(()) => {
            return Err(CliError::failed(format!(
                "the fenced store accepted A's stale write with token {token_a}"
            )))
        }
        Err(stale) => say(format!(
            "fencing: A woke up and wrote with its stale token {token_a} -> rejected ({stale})"
        ))?,
    }
    if store.read() != START - WITHDRAW {
        return Err(CliError::failed("the fenced store lost B's write"));
    }

    match guard_a.release().await? {
        ReleaseOutcome::HeldByOther => say(
            "fencing: A's late release found B holding the lock and left B's lock alone".into(),
        )?,
        other => {
            return Err(CliError::failed(format!(
                "A's late release found {} while B held the lock",
                release_words(other)
            )))
        }
    }
    match guard_b.release().await? {
        ReleaseOutcome::Released => Ok(true),
        other => Err(CliError::failed(format!(
            "B's release found {} instead of releasing its lock",
            release_words(other)
        ))),
    }
}

/// What a release found, in words.
fn release_words(outcome: ReleaseOutcome) -> &'static str {
    match outcome {
        ReleaseOutcome::Released => "its lock and released it",
        ReleaseOutcome::Expired => "its lease expired and the key free",
        ReleaseOutcome::HeldByOther => "the key held by another owner",
    }
}

/// Prints one line of the story.
fn say(line: String) -> Result<(), CliError> {
    print_out(&format!("{line}\n"))
}
