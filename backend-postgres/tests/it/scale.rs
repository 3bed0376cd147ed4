//! Scale: 10,000 locks held at once over a bounded number of connections, checked in
//! `pg_locks` and `pg_stat_activity`; and a full server lock table as a clear error.

use crate::common;

use std::error::Error as _;
use std::time::Duration;

use distlock_api::{LeaseState, LockError, LockGuard, LockKey, LockOptions, WaitPolicy};
use distlock_postgres::LockTableFull;
use sqlx::PgConnection;
use tokio::task::JoinSet;
use tokio::time::Instant;

const LONG: Duration = Duration::from_secs(120);
const TASKS: usize = 64;

fn no_wait() -> LockOptions {
    LockOptions::new(LONG).with_wait(WaitPolicy::NoWait)
}

async fn count(raw: &mut PgConnection, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(raw).await.expect(sql)
}

const HELD_BY_SCALE: &str =
    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
     WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = 'scale'";
const ADVISORY: &str = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'";
const SCALE_SESSIONS: &str =
    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'scale'";

/// Releases every guard, from `TASKS` tasks.
async fn release_all(guards: Vec<LockGuard>) {
    let mut chunks: Vec<Vec<LockGuard>> = (0..TASKS).map(|_| Vec::new()).collect();
    for (i, guard) in guards.into_iter().enumerate() {
        chunks[i % TASKS].push(guard);
    }
    let mut set = JoinSet::new();
    for chunk in chunks {
        set.spawn(async move {
            for guard in chunk {
                assert_eq!(
                    guard.release().await.expect("release"),
                    distlock_api::ReleaseOutcome::Released
                );
            }
        });
    }
    while let Some(done) = set.join_next().await {
        done.expect("a release task panicked");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_locks_held_over_ten_connections() {
    const LOCKS: usize = 10_000;
    let h = common::start_with(&[("max_locks_per_transaction", "256")]).await;
    let lock = h.named_client("scale").await;
    assert_eq!(lock.config().shared_sessions, 10);
    let started = Instant::now();
    let mut set = JoinSet::new();
    for t in 0..TASKS {
        let lock = lock.lock();
        set.spawn(async move {
            let mut guards = Vec::new();
            for i in (t..LOCKS).step_by(TASKS) {
                let key = LockKey::new(format!("scale/{i}")).unwrap();
                match lock.try_acquire(&key, &no_wait()).await {
                    Ok(Some(guard)) => guards.push(guard),
                    other => panic!("key {i}: {other:?}"),
                }
            }
            guards
        });
    }
    let mut guards = Vec::with_capacity(LOCKS);
    while let Some(chunk) = set.join_next().await {
        guards.extend(chunk.expect("an acquire task panicked"));
    }
    let took = started.elapsed();
    assert_eq!(guards.len(), LOCKS);
    assert!(guards.iter().all(|g| g.state() == LeaseState::Held));

    let mut raw = h.raw().await;
    assert_eq!(count(&mut raw, HELD_BY_SCALE).await, LOCKS as i64);
    let connections = count(&mut raw, SCALE_SESSIONS).await;
    let (shared, waits) = lock.session_counts();
    assert!(
        (1..=10).contains(&connections),
        "{connections} connections hold {LOCKS} locks"
    );
    assert_eq!(connections as usize, shared + waits);
    eprintln!("{LOCKS} locks held in {took:?} over {connections} connections");

    // Held, they stay held: a second client cannot take any of a sample.
    let other = h.client().await.lock();
    for i in (0..LOCKS).step_by(997) {
        let key = LockKey::new(format!("scale/{i}")).unwrap();
        assert!(other.try_acquire(&key, &no_wait()).await.unwrap().is_none());
    }

    let started = Instant::now();
    release_all(guards).await;
    eprintln!("{LOCKS} locks released in {:?}", started.elapsed());
    assert_eq!(count(&mut raw, ADVISORY).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_lock_table_is_a_clear_error_and_nothing_leaks() {
    let h = common::start_with(&[
        ("max_locks_per_transaction", "10"),
        ("max_connections", "20"),
    ])
    .await;
    let lock = h.named_client("scale").await.lock();
    // Opened first: a full lock table also refuses new connections.
    let mut raw = h.raw().await;
    let mut set = JoinSet::new();
    for t in 0..16 {
        let lock = lock.clone();
        set.spawn(async move {
            let mut guards = Vec::new();
            for i in 0..50_000 {
                let key = LockKey::new(format!("fill/{t}/{i}")).unwrap();
                match lock.try_acquire(&key, &no_wait()).await {
                    Ok(Some(guard)) => guards.push(guard),
                    Ok(None) => panic!("a fresh key was held"),
                    Err(error) => return (guards, Some(error)),
                }
            }
            (guards, None)
        });
    }
    let mut guards = Vec::new();
    let mut errors = Vec::new();
    while let Some(done) = set.join_next().await {
        let (chunk, error) = done.expect("a task panicked");
        guards.extend(chunk);
        errors.extend(error);
    }
    assert!(!errors.is_empty(), "the lock table never filled");
    for error in &errors {
        let full = match error {
            LockError::Backend { .. } => error
                .source()
                .and_then(|s| s.downcast_ref::<LockTableFull>()),
            _ => None,
        };
        let full = full.unwrap_or_else(|| panic!("not a lock-table-full error: {error:?}"));
        assert!(
            full.to_string().contains("max_locks_per_transaction"),
            "{full}"
        );
        assert!(!error.is_retryable());
    }
    eprintln!(
        "the lock table filled at {} locks: {}",
        guards.len(),
        errors[0]
    );
    // Room again after some releases (a query of pg_locks needs lock slots too).
    let some: Vec<LockGuard> = guards.drain(..guards.len().min(100)).collect();
    release_all(some).await;
    // Every lock the server holds is one a guard owns: failed grants left nothing.
    assert_eq!(count(&mut raw, HELD_BY_SCALE).await, guards.len() as i64);
    let key = LockKey::new("fill/after").unwrap();
    let again = lock
        .try_acquire(&key, &no_wait())
        .await
        .expect("room again after releases")
        .expect("a fresh key is free");
    guards.push(again);
    release_all(guards).await;
    assert_eq!(count(&mut raw, ADVISORY).await, 0);
}
