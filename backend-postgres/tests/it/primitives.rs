//! The Postgres semaphore and read-write lock beyond the kit's scenarios: what they
//! leave in `pg_locks` (nothing, once their guards end), the count id other holders
//! see, writer preference from the server's queue, fencing tokens, and bad input.

use crate::common;

use std::time::Duration;

use distlock_api::{LockError, LockKey, LockOptions, RwMode, WaitOrder, WaitPolicy, MAX_PERMITS};
use sqlx::PgConnection;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(30);
/// Generous: two cores are shared by several test servers.
const SETTLE: Duration = Duration::from_secs(20);

fn key(name: &str) -> LockKey {
    LockKey::new(name).expect("valid key")
}

fn no_wait() -> LockOptions {
    LockOptions::new(TTL).with_wait(WaitPolicy::NoWait)
}

fn waiting(limit: Duration) -> LockOptions {
    LockOptions::new(TTL).with_wait(WaitPolicy::Timeout(limit))
}

/// Every advisory lock in `pg_locks` (granted or waited for), as `(objsubid, granted)`.
async fn advisory_entries(raw: &mut PgConnection) -> Vec<(i16, bool)> {
    sqlx::query_as("SELECT objsubid::int2, granted FROM pg_locks WHERE locktype = 'advisory'")
        .fetch_all(raw)
        .await
        .expect("pg_locks query")
}

/// Waits (bounded) until `pg_locks` holds no advisory lock at all; panics with what
/// is left after [`SETTLE`].
async fn wait_until_no_advisory_locks(raw: &mut PgConnection, after: &str) {
    let deadline = Instant::now() + SETTLE;
    loop {
        let left = advisory_entries(raw).await;
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "after {after}, pg_locks still shows advisory locks {left:?} after {SETTLE:?}"
        );
        tokio::time::sleep(common::POLL).await;
    }
}

#[tokio::test]
async fn guards_leave_nothing_in_pg_locks() {
    let h = common::start().await;
    let (a, b) = (h.client().await, h.client().await);
    let (sem_a, sem_b) = (a.semaphore(), b.semaphore());
    let (rw_a, rw_b) = (a.rw_lock(), b.rw_lock());
    let mut raw = h.raw().await;
    let k = key("residue");

    // Permits: released, dropped, refused for a mismatch, and cut off while waiting.
    let first = sem_a.try_acquire(&k, 2, &no_wait()).await.expect("try");
    let second = sem_b
        .acquire(&k, 2, &waiting(SETTLE))
        .await
        .expect("acquire");
    let first = first.expect("a permit of a free key");
    assert!(sem_b
        .try_acquire(&k, 2, &no_wait())
        .await
        .expect("try")
        .is_none());
    let mismatch = sem_b.try_acquire(&k, 5, &no_wait()).await;
    assert!(
        matches!(mismatch, Err(LockError::PermitMismatch { .. })),
        "{mismatch:?}"
    );
    let cut = tokio::time::timeout(
        Duration::from_millis(50),
        sem_b.acquire(&k, 2, &LockOptions::new(TTL)),
    )
    .await;
    assert!(cut.is_err(), "a third permit of 2 was granted");
    first.release().await.expect("release");
    drop(second);

    // Reads and writes: overlapping readers, a released writer, a writer cut off while
    // waiting behind a reader, a dropped reader.
    let r1 = rw_a
        .acquire(&k, RwMode::Read, &waiting(SETTLE))
        .await
        .expect("read");
    let r2 = rw_b
        .acquire(&k, RwMode::Read, &waiting(SETTLE))
        .await
        .expect("read");
    let cut = tokio::time::timeout(
        Duration::from_millis(50),
        rw_b.acquire(&k, RwMode::Write, &LockOptions::new(TTL)),
    )
    .await;
    assert!(cut.is_err(), "a writer was granted beside two readers");
    r1.release().await.expect("release");
    drop(r2);
    let w = rw_a
        .acquire(&k, RwMode::Write, &waiting(SETTLE))
        .await
        .expect("write");
    w.release().await.expect("release");

    wait_until_no_advisory_locks(&mut raw, "every guard ended").await;
}

#[tokio::test]
async fn permit_holders_show_their_count_and_a_new_count_follows_them() {
    let h = common::start().await;
    let (a, b) = (h.client().await.semaphore(), h.client().await.semaphore());
    let mut raw = h.raw().await;
    let k = key("counted");
    let held = a
        .try_acquire(&k, 3, &no_wait())
        .await
        .expect("try")
        .expect("a permit of a free key");
    // One slot (a bigint key) and the count id (a two-int4 key whose objid is 3).
    let counts: Vec<(i64,)> = sqlx::query_as(
        "SELECT objid::int8 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND granted",
    )
    .fetch_all(&mut raw)
    .await
    .expect("pg_locks");
    assert_eq!(counts, vec![(3,)]);
    let entries = advisory_entries(&mut raw).await;
    assert_eq!(entries.len(), 2, "{entries:?}");

    for other in [1, 2, 4, MAX_PERMITS] {
        match b
            .acquire(&k, other, &waiting(Duration::from_millis(300)))
            .await
        {
            Err(LockError::PermitMismatch { source, .. }) => {
                assert_eq!((source.asked, source.in_use), (other, 3));
            }
            other => panic!("a count other than the holders' gave {other:?}"),
        }
    }
    held.release().await.expect("release");
    let renewed = b
        .acquire(&k, 4, &waiting(SETTLE))
        .await
        .expect("a new count once the holders left");
    renewed.release().await.expect("release");
    wait_until_no_advisory_locks(&mut raw, "the permits ended").await;
}

#[tokio::test]
async fn a_queued_writer_holds_new_readers_back() {
    let h = common::start().await;
    let (a, b, c) = (
        h.client().await.rw_lock(),
        h.client().await.rw_lock(),
        h.client().await.rw_lock(),
    );
    let mut raw = h.raw().await;
    let k = key("writer-first");
    let reader = a
        .acquire(&k, RwMode::Read, &waiting(SETTLE))
        .await
        .expect("read");
    let writer = tokio::spawn({
        let (b, k) = (b.clone(), k.clone());
        async move { b.acquire(&k, RwMode::Write, &waiting(SETTLE)).await }
    });
    // Poll until the writer waits in the server's queue (an ungranted entry).
    let deadline = Instant::now() + SETTLE;
    while !advisory_entries(&mut raw)
        .await
        .iter()
        .any(|(_, granted)| !granted)
    {
        assert!(Instant::now() < deadline, "the writer never queued");
        tokio::time::sleep(common::POLL).await;
    }
    assert!(
        c.try_acquire(&k, RwMode::Read, &no_wait())
            .await
            .expect("try")
            .is_none(),
        "a new reader was granted while a writer waited"
    );
    let late_reader = tokio::spawn({
        let (c, k) = (c.clone(), k.clone());
        async move { c.acquire(&k, RwMode::Read, &waiting(SETTLE)).await }
    });
    reader.release().await.expect("release");
    let write = writer.await.expect("writer task").expect("writer granted");
    assert!(
        !late_reader.is_finished(),
        "the reader queued behind the writer finished while the writer held"
    );
    let write_token = write.fencing_token();
    write.release().await.expect("release");
    let read = late_reader
        .await
        .expect("reader task")
        .expect("the reader behind the writer is granted after it");
    assert!(
        read.fencing_token() > write_token && write_token.is_some(),
        "grants' tokens increase: write {write_token:?}, then read {:?}",
        read.fencing_token()
    );
    read.release().await.expect("release");
    wait_until_no_advisory_locks(&mut raw, "the grants ended").await;
}

/// A writer's acquire dropped while it waits in the server's queue stops holding new
/// readers back at once, not at the server's next check of its closed connection
/// (`client_connection_check_interval`, 1 s).
#[tokio::test]
async fn a_dropped_waiting_writer_stops_holding_readers_back() {
    let h = common::start().await;
    let (a, b, c) = (
        h.client().await.rw_lock(),
        h.client().await.rw_lock(),
        h.client().await.rw_lock(),
    );
    let mut raw = h.raw().await;
    let k = key("dropped-writer");
    let reader = a
        .acquire(&k, RwMode::Read, &waiting(SETTLE))
        .await
        .expect("read");
    let writer = tokio::spawn({
        let (b, k) = (b.clone(), k.clone());
        async move { b.acquire(&k, RwMode::Write, &LockOptions::new(TTL)).await }
    });
    let deadline = Instant::now() + SETTLE;
    while !advisory_entries(&mut raw)
        .await
        .iter()
        .any(|(_, granted)| !granted)
    {
        assert!(Instant::now() < deadline, "the writer never queued");
        tokio::time::sleep(common::POLL).await;
    }
    writer.abort();
    let _ = writer.await;
    let dropped_at = Instant::now();
    let late = c
        .acquire(&k, RwMode::Read, &waiting(SETTLE))
        .await
        .expect("a reader after the writer gave up");
    let waited = dropped_at.elapsed();
    assert!(
        waited < Duration::from_millis(700),
        "a new reader waited {waited:?} behind a writer that had given up"
    );
    late.release().await.expect("release");
    reader.release().await.expect("release");
    wait_until_no_advisory_locks(&mut raw, "the grants ended").await;
}

#[tokio::test]
async fn bad_input_is_refused_before_the_server() {
    let h = common::start().await;
    let client = h.client().await;
    let (sem, rw) = (client.semaphore(), client.rw_lock());
    let k = key("bad");
    for bad in [0, MAX_PERMITS + 1] {
        assert!(matches!(
            sem.try_acquire(&k, bad, &no_wait()).await,
            Err(LockError::InvalidOptions { .. })
        ));
    }
    let fifo = LockOptions::new(TTL).with_order(WaitOrder::Fifo);
    assert!(matches!(
        sem.acquire(&k, 2, &fifo).await,
        Err(LockError::Unsupported { .. })
    ));
    let zero_ttl = LockOptions::new(Duration::ZERO);
    assert!(matches!(
        rw.acquire(&k, RwMode::Read, &zero_ttl).await,
        Err(LockError::InvalidOptions { .. })
    ));
    let info = sem.info();
    assert!(info.capabilities.semaphore.offered.is_supported());
    assert!(rw.info().capabilities.rw_lock.offered.is_supported());
    let mut raw = h.raw().await;
    assert!(advisory_entries(&mut raw).await.is_empty());
}
