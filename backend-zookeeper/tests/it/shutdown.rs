//! A runtime that shuts down closes the ZooKeeper sessions opened on it: the locks held
//! there are freed at once, and guards that outlive the runtime read lost.

use crate::common;

use std::time::{Duration, Instant};

use distlock_api::{LeaseState, LockKey, LockOptions, WaitPolicy};
use distlock_zookeeper::ZooKeeperLock;

use common::{shared_port, url_for};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// A lock taken on a runtime that then shuts down (with its guard kept alive beyond
/// it): the guard reads lost, and another client takes the lock at once, not after
/// the 10 s session timeout.
#[test]
fn a_runtime_shutting_down_frees_its_locks_and_their_guards_read_lost() {
    let url = url_for(shared_port());
    let key = LockKey::new("shutdown/held").unwrap();
    let options = LockOptions::new(Duration::from_secs(30)).with_wait(WaitPolicy::NoWait);

    let process = runtime();
    let (lock, guard) = process.block_on(async {
        let lock = ZooKeeperLock::connect(&format!("{url}?session_timeout_ms=10000"))
            .await
            .expect("connects");
        let guard = lock.lock().acquire(&key, &options).await.expect("acquires");
        (lock, guard)
    });
    assert_eq!(guard.state(), LeaseState::Held);
    process.shutdown_timeout(Duration::from_secs(2));
    assert_eq!(guard.state(), LeaseState::Lost);
    assert_eq!(lock.session_id(), None, "the closed session is not reused");

    let next = runtime();
    next.block_on(async {
        let other = ZooKeeperLock::connect(&url).await.expect("connects");
        let started = Instant::now();
        let waiting = options
            .clone()
            .with_wait(WaitPolicy::Timeout(Duration::from_secs(20)));
        let taken = other
            .lock()
            .acquire(&key, &waiting)
            .await
            .expect("acquires");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "the lock was freed only after {:?}",
            started.elapsed()
        );
        taken.release().await.expect("releases");
    });
    drop(guard);
}

/// An acquire future dropped where no runtime runs (polled on one, dropped on a plain
/// thread) still has its contender node removed, on the session's runtime: the next
/// waiter gets the lock as soon as the holder releases it.
#[test]
fn a_waiter_dropped_outside_any_runtime_leaves_no_node_behind() {
    let port = shared_port();
    let url = url_for(port);
    let key = LockKey::new("shutdown/dropped-outside").unwrap();
    let no_wait = LockOptions::new(Duration::from_secs(30)).with_wait(WaitPolicy::NoWait);
    let waiting = no_wait
        .clone()
        .with_wait(WaitPolicy::Timeout(Duration::from_secs(20)));

    let runtime = runtime();
    let (holder, waiter, next, guard) = runtime.block_on(async {
        let connect = || ZooKeeperLock::connect(&url);
        let (holder, waiter, next) = (connect().await, connect().await, connect().await);
        let (holder, waiter, next) = (holder.unwrap(), waiter.unwrap(), next.unwrap());
        let guard = holder
            .lock()
            .acquire(&key, &no_wait)
            .await
            .expect("acquires");
        (holder, waiter, next, guard)
    });
    let waiter = waiter.lock();
    let mut queued = Box::pin(waiter.acquire(&key, &waiting));
    let dir = holder.lock_dir(&key);
    runtime.block_on(async {
        let raw = common::raw(port).await;
        tokio::select! {
            _ = &mut queued => panic!("the waiter got a held lock"),
            _ = common::wait_children(&raw, &dir, 2, Duration::from_secs(10)) => {}
        }
    });
    // Outside the runtime: no `Handle::try_current` here.
    drop(queued);
    runtime.block_on(async {
        let released_at = Instant::now();
        guard.release().await.expect("releases");
        let taken = next
            .lock()
            .acquire(&key, &waiting)
            .await
            .expect("the next waiter gets the lock");
        assert!(
            released_at.elapsed() < Duration::from_secs(3),
            "granted {:?} after the release",
            released_at.elapsed()
        );
        taken.release().await.expect("releases");
    });
    drop((holder, waiter, next));
}
