//! Interoperability by name: a raw `GET_LOCK` from the `mariadb` client excludes
//! distlock, and distlock excludes it, both ways; the documented name of a hashed key
//! is what SQL computes.

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use distlock_api::{LockKey, LockOptions, WaitPolicy};
use distlock_mysql::lock_name;
use distlock_test_servers::{mariadb_sql, MARIADB_PASSWORD, MARIADB_USER};

const LONG: Duration = Duration::from_secs(60);

fn key(name: &str) -> LockKey {
    LockKey::new(name).unwrap()
}

/// `SELECT GET_LOCK(name, 0)` as the test user through the `mariadb` client.
async fn raw_try(port: u16, name: &str) -> String {
    mariadb_sql(
        port,
        MARIADB_USER,
        Some(MARIADB_PASSWORD),
        &format!("SELECT GET_LOCK('{name}', 0)"),
    )
    .await
    .unwrap()
    .trim()
    .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_get_lock_excludes_distlock() {
    let h = common::shared();
    let lock = h.client().await.lock();
    let k = key("interop/raw-holds");
    let name = lock_name(&k);
    assert_eq!(name, "dl:interop/raw-holds");
    // A foreign program holds the name: the `mariadb` client, for as long as it runs.
    // It prints its connection id and its grant, then keeps the session open until
    // its stdin closes.
    let mut foreign = tokio::process::Command::new("mariadb")
        .args(["--no-defaults", "-h127.0.0.1", "-N", "-B", "-n"])
        .arg(format!("-P{}", h.port))
        .arg(format!("-u{MARIADB_USER}"))
        .arg(format!("-p{MARIADB_PASSWORD}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the mariadb client runs");
    let mut stdin = foreign.stdin.take().unwrap();
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    stdin
        .write_all(format!("SELECT CONNECTION_ID(), GET_LOCK('{name}', 5);\n").as_bytes())
        .await
        .unwrap();
    stdin.flush().await.unwrap();
    let mut lines = tokio::io::BufReader::new(foreign.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(LONG, lines.next_line())
        .await
        .expect("the client answers")
        .unwrap()
        .expect("a line");
    let (id, granted) = line.split_once('\t').expect("two columns");
    assert_eq!(granted, "1", "the foreign client got the lock");
    // distlock sees it held, and by whom.
    assert!(lock
        .try_acquire(&k, &LockOptions::new(LONG))
        .await
        .unwrap()
        .is_none());
    let status = lock.inspect(&k).await.unwrap();
    assert_eq!(
        status.holder.as_deref(),
        Some(format!("connection {id}").as_str())
    );
    let waited = lock
        .acquire(
            &k,
            &LockOptions::new(LONG).with_wait(WaitPolicy::Timeout(Duration::from_millis(300))),
        )
        .await;
    assert!(
        waited.is_err(),
        "distlock took a name a foreign session holds"
    );
    // A distlock waiter queues in GET_LOCK behind the foreign session; that session
    // ends, its lock goes with it, and the waiter gets it.
    let waiter = lock.clone();
    let waiting_key = k.clone();
    let wait = tokio::spawn(async move {
        let options =
            LockOptions::new(LONG).with_wait(WaitPolicy::Timeout(Duration::from_secs(20)));
        waiter.acquire(&waiting_key, &options).await
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let waiting = common::admin(
            h.port,
            "SELECT COUNT(*) FROM information_schema.processlist WHERE state = 'User lock'",
        )
        .await;
        if waiting.trim() != "0" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "distlock never queued in GET_LOCK"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(stdin);
    let guard = wait
        .await
        .unwrap()
        .expect("distlock gets the name once the foreign session ends");
    let _ = foreign.wait().await;
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distlock_excludes_a_raw_get_lock() {
    let h = common::shared();
    let lock = h.client().await.lock();
    let k = key("interop/distlock-holds");
    let name = lock_name(&k);
    let guard = lock
        .acquire(&k, &LockOptions::new(LONG).with_wait(WaitPolicy::NoWait))
        .await
        .unwrap();
    assert_eq!(
        raw_try(h.port, &name).await,
        "0",
        "a foreign GET_LOCK got a held name"
    );
    guard.release().await.unwrap();
    assert_eq!(
        raw_try(h.port, &name).await,
        "1",
        "the released name stayed held"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hashed_name_is_what_sql_computes() {
    let h = common::shared();
    for text in ["Invoices 2026", "ÄÖ/ünïcode", &"long-".repeat(20)] {
        let k = key(text);
        let sql = format!(
            "SELECT CONCAT('dl#', LEFT(SHA2('{}', 256), 60))",
            text.replace('\'', "''")
        );
        let computed = common::admin(h.port, &sql).await;
        assert_eq!(computed.trim(), lock_name(&k), "{text}");
        // And such a key locks and excludes like any other.
        let lock = h.client().await.lock();
        let guard = lock
            .acquire(&k, &LockOptions::new(LONG).with_wait(WaitPolicy::NoWait))
            .await
            .unwrap();
        assert_eq!(raw_try(h.port, &lock_name(&k)).await, "0");
        guard.release().await.unwrap();
    }
}
