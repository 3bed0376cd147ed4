//! The transaction-scoped mode: the lock and the work share one transaction.

use crate::common;

use std::time::Duration;

use common::{lock_entries, wait_for_entries};
use distlock_api::{LockError, LockKey, LockOptions, WaitPolicy};
use distlock_postgres::{advisory_key, PostgresXactLock, XactError};
use sqlx::{Connection, PgConnection};
use tokio::time::{timeout, Instant};

const LONG: Duration = Duration::from_secs(60);

fn key(name: &str) -> LockKey {
    LockKey::new(format!("xact/{name}")).unwrap()
}

fn noop<'t>(
    _: &'t mut sqlx::Transaction<'_, sqlx::Postgres>,
    _: distlock_api::FencingToken,
) -> distlock_postgres::XactFuture<'t, (), sqlx::Error> {
    Box::pin(async { Ok(()) })
}

async fn setup(raw: &mut PgConnection) {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS ledger (id int PRIMARY KEY, balance bigint, fence bigint)",
    )
    .execute(&mut *raw)
    .await
    .unwrap();
    sqlx::query("INSERT INTO ledger VALUES (1, 1000, 0) ON CONFLICT (id) DO NOTHING")
        .execute(&mut *raw)
        .await
        .unwrap();
}

async fn balance(raw: &mut PgConnection) -> (i64, i64) {
    sqlx::query_as("SELECT balance, fence FROM ledger WHERE id = 1")
        .fetch_one(raw)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_runs_in_the_locking_transaction_and_commits() {
    let h = common::start().await;
    let mut raw = h.raw().await;
    setup(&mut raw).await;
    let locks = PostgresXactLock::connect(&h.url()).await.unwrap();
    let k = key("commit");
    let hash = advisory_key(&k);
    let (a, b) = common::lock_ids(hash);
    let mut tokens = Vec::new();
    for amount in [200i64, 300] {
        let token = locks
            .with_lock(&k, WaitPolicy::NoWait, |tx, token| {
                Box::pin(async move {
                    // Same transaction, same backend: it holds the xact lock now.
                    let held: bool = sqlx::query_scalar(
                        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' \
                         AND pid = pg_backend_pid() AND granted AND mode = 'ExclusiveLock' \
                         AND classid = $1::int8::oid AND objid = $2::int8::oid)",
                    )
                    .bind(a)
                    .bind(b)
                    .fetch_one(&mut **tx)
                    .await?;
                    assert!(held, "the work does not run where the lock is held");
                    let in_tx: bool = sqlx::query_scalar("SELECT now() <> statement_timestamp()")
                        .fetch_one(&mut **tx)
                        .await?;
                    assert!(in_tx, "the work does not run inside a transaction");
                    sqlx::query(
                        "UPDATE ledger SET balance = balance - $1, fence = $2 WHERE id = 1",
                    )
                    .bind(amount)
                    .bind(token.get() as i64)
                    .execute(&mut **tx)
                    .await?;
                    Ok::<_, sqlx::Error>(token)
                })
            })
            .await
            .unwrap();
        tokens.push(token);
        // Committed, and the lock ended with the transaction.
        assert!(lock_entries(&mut raw, hash).await.is_empty());
    }
    assert!(tokens[1] > tokens[0]);
    assert_eq!(balance(&mut raw).await, (500, tokens[1].get() as i64));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_work_rolls_back_and_releases() {
    let h = common::start().await;
    let mut raw = h.raw().await;
    setup(&mut raw).await;
    let locks = PostgresXactLock::connect(&h.url()).await.unwrap();
    let k = key("rollback");
    let result: Result<(), XactError<sqlx::Error>> = locks
        .with_lock(&k, WaitPolicy::NoWait, |tx, _| {
            Box::pin(async move {
                sqlx::query("UPDATE ledger SET balance = 0 WHERE id = 1")
                    .execute(&mut **tx)
                    .await?;
                sqlx::query("SELECT 1/0").execute(&mut **tx).await?;
                Ok(())
            })
        })
        .await;
    assert!(matches!(result, Err(XactError::Work(_))), "{result:?}");
    assert_eq!(
        balance(&mut raw).await.0,
        1000,
        "the failed work was not rolled back"
    );
    assert!(lock_entries(&mut raw, advisory_key(&k)).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xact_and_session_locks_exclude_each_other_and_share_fencing() {
    let h = common::start().await;
    let session = h.client().await.lock();
    let locks = PostgresXactLock::connect(&h.url()).await.unwrap();
    let k = key("mixed");
    let guard = session
        .acquire(&k, &LockOptions::new(LONG).with_wait(WaitPolicy::NoWait))
        .await
        .unwrap();
    match locks.with_lock(&k, WaitPolicy::NoWait, noop).await {
        Err(XactError::Lock(LockError::Timeout { .. })) => {}
        other => panic!("a session-held key was granted in a transaction: {other:?}"),
    }
    let limit = Duration::from_millis(300);
    let started = Instant::now();
    match locks.with_lock(&k, WaitPolicy::Timeout(limit), noop).await {
        Err(XactError::Lock(LockError::Timeout { .. })) => {}
        other => panic!("expected a timeout: {other:?}"),
    }
    assert!(started.elapsed() >= limit);
    // A transaction waiting in the server's queue gets the key at release.
    let waiter = {
        let (locks, k) = (locks.clone(), k.clone());
        tokio::spawn(async move {
            locks
                .with_lock(
                    &k,
                    WaitPolicy::Timeout(Duration::from_secs(10)),
                    |_, token| Box::pin(async move { Ok::<_, sqlx::Error>(token) }),
                )
                .await
        })
    };
    let mut raw = h.raw().await;
    wait_for_entries(
        &mut raw,
        advisory_key(&k),
        Duration::from_secs(5),
        "queued",
        |e| e.iter().any(|(_, g)| !g),
    )
    .await;
    let session_token = guard.fencing_token().unwrap();
    guard.release().await.unwrap();
    let xact_token = timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(xact_token > session_token);
    // And a session grant after it is higher still.
    let after = session
        .acquire(&k, &LockOptions::new(LONG).with_wait(WaitPolicy::NoWait))
        .await
        .unwrap();
    assert!(after.fencing_token().unwrap() > xact_token);
    after.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_transaction_frees_its_lock_at_once() {
    let h = common::start().await;
    let mut raw = h.raw().await;
    let locks = PostgresXactLock::connect(&h.url()).await.unwrap();
    let session = h.client().await.lock();
    let k = key("dropped");
    let hash = advisory_key(&k);
    // Dropped while the work runs: the connection closes, the transaction ends.
    let work = locks.with_lock(&k, WaitPolicy::NoWait, |_, _| {
        Box::pin(async {
            std::future::pending::<()>().await;
            Ok::<_, sqlx::Error>(())
        })
    });
    assert!(timeout(Duration::from_millis(300), work).await.is_err());
    let taken = session
        .acquire(
            &k,
            &LockOptions::new(LONG).with_wait(WaitPolicy::Timeout(Duration::from_secs(3))),
        )
        .await
        .expect("a dropped transaction's lock is freed without waiting for the pool");
    // Dropped while waiting in the queue: the server drops the wait.
    let wait = locks.with_lock(&k, WaitPolicy::Forever, |_, _| {
        Box::pin(async { Ok::<_, sqlx::Error>(()) })
    });
    assert!(timeout(Duration::from_millis(300), wait).await.is_err());
    wait_for_entries(
        &mut raw,
        hash,
        Duration::from_secs(5),
        "the queue emptied",
        |e| e.iter().all(|(_, granted)| *granted),
    )
    .await;
    taken.release().await.unwrap();
    assert!(lock_entries(&mut raw, hash).await.is_empty());
    // The pool still works.
    locks
        .with_lock(&k, WaitPolicy::NoWait, |_, _| {
            Box::pin(async { Ok::<_, sqlx::Error>(()) })
        })
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_in_a_callers_transaction() {
    let h = common::start().await;
    let locks = PostgresXactLock::connect(&h.url()).await.unwrap();
    let k = key("caller-tx");
    let mut raw = h.raw().await;
    let mut conn = PgConnection::connect(&h.url()).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    let token = locks
        .lock_in(&mut tx, &k, WaitPolicy::NoWait)
        .await
        .unwrap();
    assert!(token.get() > 0);
    assert_eq!(lock_entries(&mut raw, advisory_key(&k)).await.len(), 1);
    tx.commit().await.unwrap();
    assert!(lock_entries(&mut raw, advisory_key(&k)).await.is_empty());
}

/// Two transactions that each hold one key and wait for the other's: the server breaks
/// the deadlock by failing one wait with SQLSTATE 40P01, which is a retryable
/// `LockError::Transient`; once it rolls back, the other wait is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlock_between_transactions_is_transient() {
    let h = common::start().await;
    let locks = PostgresXactLock::connect(&h.url()).await.unwrap();
    let (a, b) = (key("deadlock-a"), key("deadlock-b"));
    let mut first = locks.pool().begin().await.unwrap();
    let mut second = locks.pool().begin().await.unwrap();
    locks
        .lock_in(&mut first, &a, WaitPolicy::NoWait)
        .await
        .unwrap();
    locks
        .lock_in(&mut second, &b, WaitPolicy::NoWait)
        .await
        .unwrap();
    // Each waits for the other's key, then ends its transaction either way.
    let cross = |mut tx: sqlx::Transaction<'static, sqlx::Postgres>, wanted: LockKey| {
        let locks = &locks;
        async move {
            let result = locks
                .lock_in(&mut tx, &wanted, WaitPolicy::Timeout(LONG))
                .await;
            tx.rollback().await.unwrap();
            result
        }
    };
    let (one, two) = timeout(LONG, async {
        tokio::join!(cross(first, b.clone()), cross(second, a.clone()))
    })
    .await
    .expect("the server did not break the deadlock");
    let (victim, winner) = match (one, two) {
        (Err(e), Ok(token)) | (Ok(token), Err(e)) => (e, token),
        other => panic!("expected one deadlock victim and one grant, got {other:?}"),
    };
    assert!(
        matches!(victim, LockError::Transient { .. }) && victim.is_retryable(),
        "a deadlock is not a retryable transient error: {victim:?}"
    );
    assert!(victim.to_string().contains("deadlock"), "{victim}");
    assert!(winner.get() > 0);
}
