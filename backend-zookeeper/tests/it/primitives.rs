//! The ZooKeeper semaphore and read-write lock beyond the kit: their fencing tokens are
//! their nodes' `czxid`s in grant order, and the session's beat watches their nodes as
//! it watches the mutex's.

use crate::common;

use std::time::Duration;

use distlock_api::{LockGuard, LockKey, LockOptions, RwMode, WaitPolicy};
use distlock_zookeeper::{owner_guid, ZooKeeperLock};
use zookeeper_client as zk;

fn key(name: &str) -> LockKey {
    LockKey::new(name).unwrap()
}

fn waiting() -> LockOptions {
    LockOptions::new(Duration::from_secs(30))
        .with_wait(WaitPolicy::Timeout(Duration::from_secs(30)))
}

async fn client(port: u16) -> ZooKeeperLock {
    ZooKeeperLock::connect_with(
        &common::url_for(port),
        common::config(common::SESSION_TIMEOUT),
    )
    .await
    .expect("connects")
}

/// The guard's node in `dir` (found by its GUID) and that node's `czxid`.
async fn node_of(raw: &zk::Client, dir: &str, guard: &LockGuard) -> (String, u64) {
    let guid = owner_guid(guard.lease().owner());
    let children = raw.list_children(dir).await.expect("lists");
    let name = children
        .into_iter()
        .find(|name| name.contains(&guid))
        .unwrap_or_else(|| panic!("no node of {guid} in {dir}"));
    let path = format!("{dir}/{name}");
    let stat = raw
        .check_stat(&path)
        .await
        .unwrap()
        .expect("the node exists");
    (path, u64::try_from(stat.czxid).unwrap())
}

fn token(guard: &LockGuard) -> u64 {
    guard
        .fencing_token()
        .expect("ZooKeeper grants carry tokens")
        .get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_tokens_are_lease_czxids_in_grant_order() {
    let port = common::shared_port();
    let locks = client(port).await;
    let semaphore = locks.semaphore();
    let raw = common::raw(port).await;
    let k = key("tokens/permits");
    let leases = format!("{}/leases", locks.semaphore_path(&k));
    let first = semaphore.acquire(&k, 2, &waiting()).await.unwrap();
    let second = semaphore.acquire(&k, 2, &waiting()).await.unwrap();
    assert_eq!(token(&first), node_of(&raw, &leases, &first).await.1);
    assert_eq!(token(&second), node_of(&raw, &leases, &second).await.1);
    assert!(token(&second) > token(&first));
    first.release().await.unwrap();
    let third = semaphore.acquire(&k, 2, &waiting()).await.unwrap();
    assert!(token(&third) > token(&second));
    second.release().await.unwrap();
    third.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_token_is_above_the_readers_before_it_and_below_those_after() {
    let port = common::shared_port();
    let locks = client(port).await;
    let rw = locks.rw_lock();
    let raw = common::raw(port).await;
    let k = key("tokens/rw");
    let dir = locks.rw_path(&k);
    let reader = rw.acquire(&k, RwMode::Read, &waiting()).await.unwrap();
    assert_eq!(token(&reader), node_of(&raw, &dir, &reader).await.1);
    let writer = {
        let (rw, k) = (rw.clone(), k.clone());
        tokio::spawn(async move { rw.acquire(&k, RwMode::Write, &waiting()).await })
    };
    common::wait_children(&raw, &dir, 2, Duration::from_secs(10)).await;
    let later_reader = {
        let (rw, k) = (rw.clone(), k.clone());
        tokio::spawn(async move { rw.acquire(&k, RwMode::Read, &waiting()).await })
    };
    common::wait_children(&raw, &dir, 3, Duration::from_secs(10)).await;
    assert!(!writer.is_finished() && !later_reader.is_finished());
    let read_token = token(&reader);
    reader.release().await.unwrap();
    let writer = writer.await.unwrap().expect("the writer is granted");
    assert!(
        !later_reader.is_finished(),
        "the later reader waits for the writer"
    );
    assert_eq!(token(&writer), node_of(&raw, &dir, &writer).await.1);
    let write_token = token(&writer);
    writer.release().await.unwrap();
    let later_reader = later_reader
        .await
        .unwrap()
        .expect("granted after the writer");
    assert!(read_token < write_token && write_token < token(&later_reader));
    later_reader.release().await.unwrap();
}

/// A permit or read node deleted behind our back (an operator) is found at the
/// session's next beat, and the guard reports it lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_permit_or_read_node_is_reported_lost() {
    let port = common::shared_port();
    let locks = client(port).await;
    let raw = common::raw(port).await;
    let k = key("deleted-behind-our-back");
    let permit = locks.semaphore().acquire(&k, 1, &waiting()).await.unwrap();
    let reader = locks
        .rw_lock()
        .acquire(&k, RwMode::Read, &waiting())
        .await
        .unwrap();
    let leases = format!("{}/leases", locks.semaphore_path(&k));
    for (dir, guard) in [(leases.as_str(), &permit), (&locks.rw_path(&k), &reader)] {
        let (path, _) = node_of(&raw, dir, guard).await;
        raw.delete(&path, None).await.expect("deletes");
        tokio::time::timeout(Duration::from_secs(10), guard.lost())
            .await
            .unwrap_or_else(|_| panic!("the loss of {path} was not noticed"));
    }
}
