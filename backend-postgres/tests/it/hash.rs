//! The advisory key of a lock key: fixed values, the same number in SQL, and locks
//! taken by hand in SQL under that number exclude ours.

use crate::common;

use std::time::Duration;

use distlock_api::{LockKey, LockOptions, WaitPolicy};
use distlock_postgres::advisory_key;
use sqlx::Connection;

/// Fixed: these must never change between releases, or two versions of distlock
/// would lock the same key under different numbers.
const KNOWN: &[(&str, i64)] = &[
    ("hello", 0x2cf2_4dba_5fb0_a30e),
    ("a", -0x3568_7eed_35e4_4236),
    ("invoices/2026-11", 0x0c67_7272_c3a4_46d7),
    ("🔒 lock", -0x5289_ffb8_5613_4213),
];

#[test]
fn known_keys_map_to_fixed_values() {
    for (key, expected) in KNOWN {
        assert_eq!(
            advisory_key(&LockKey::new(*key).unwrap()),
            *expected,
            "{key}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_computes_the_same_key_and_hand_taken_locks_exclude_ours() {
    let h = common::start().await;
    let mut raw = h.raw().await;
    let sql =
        "SELECT ('x' || left(encode(sha256(convert_to($1, 'UTF8')), 'hex'), 16))::bit(64)::bigint";
    let long = "é".repeat(500);
    for key in KNOWN
        .iter()
        .map(|(k, _)| *k)
        .chain(["A", "a/../b", long.as_str()])
    {
        let in_sql: i64 = sqlx::query_scalar(sql)
            .bind(key)
            .fetch_one(&mut raw)
            .await
            .unwrap();
        assert_eq!(in_sql, advisory_key(&LockKey::new(key).unwrap()), "{key:?}");
    }
    // Another program takes the lock by hand under the same number: ours is excluded.
    let key = LockKey::new("invoices/2026-11").unwrap();
    let mut other = sqlx::PgConnection::connect(&h.url()).await.unwrap();
    let taken: bool = sqlx::query_scalar(&format!("SELECT pg_try_advisory_lock(({sql}))"))
        .bind(key.as_str())
        .fetch_one(&mut other)
        .await
        .unwrap();
    assert!(taken);
    let lock = h.client().await.lock();
    let options = LockOptions::new(Duration::from_secs(30)).with_wait(WaitPolicy::NoWait);
    assert!(lock.try_acquire(&key, &options).await.unwrap().is_none());
    let unlocked: bool = sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
        .bind(advisory_key(&key))
        .fetch_one(&mut other)
        .await
        .unwrap();
    assert!(unlocked);
    let guard = lock
        .try_acquire(&key, &options)
        .await
        .unwrap()
        .expect("free after the manual unlock");
    guard.release().await.unwrap();
}
