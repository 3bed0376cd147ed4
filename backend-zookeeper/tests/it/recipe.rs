//! The recipe itself, observed on a real server: no herd effect and FIFO hand-off with
//! 200 waiters, and node names that follow Apache Curator's layout (with a lock taken
//! through `zookeeper-client`'s Curator-compatible recipe excluding ours and vice versa).

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock_api::{LockKey, LockOptions, ReleaseOutcome, WaitPolicy};
use distlock_zookeeper::{lock_sequence, owner_guid, owner_of, ZooKeeperLock};
use tokio::time::timeout;
use zookeeper_client as zk;

use common::{direct, raw, shared_port, wait_children, watches_by_path};

const SESSION: Duration = Duration::from_secs(10);

fn key(name: &str) -> LockKey {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    LockKey::new(format!("recipe/{name}/{nanos:08x}")).unwrap()
}

fn waiting(wait: Duration) -> LockOptions {
    LockOptions::new(Duration::from_secs(30)).with_wait(WaitPolicy::Timeout(wait))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn herd_of_200_waiters_is_woken_one_at_a_time_in_arrival_order() {
    const CLIENTS: usize = 10;
    const WAITERS: usize = 200;
    let port = shared_port();
    let holder = direct(port, SESSION).await;
    let k = key("herd");
    let dir = holder.lock_dir(&k);
    let guard = holder
        .lock()
        .acquire(&k, &waiting(Duration::ZERO))
        .await
        .unwrap();
    // Ten clients, twenty waiters each: one session serves many waiters.
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(direct(port, SESSION).await);
    }
    let order = Arc::new(Mutex::new(Vec::with_capacity(WAITERS)));
    let zk_raw = raw(port).await;
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let (lock, k, order) = (clients[i % CLIENTS].clone(), k.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let guard = lock
                .lock()
                .acquire(&k, &waiting(Duration::from_secs(120)))
                .await?;
            order.lock().unwrap().push(i);
            guard.release().await
        }));
        // Waiter i has queued (its node exists) before waiter i + 1 arrives.
        wait_children(&zk_raw, &dir, i + 2, Duration::from_secs(10)).await;
    }
    let woken_before: u64 = clients.iter().map(ZooKeeperLock::wakeups).sum();
    assert_eq!(
        woken_before, 0,
        "waiters were woken while the lock stayed held"
    );

    // Each waiter watches exactly one node, its predecessor; nobody watches the
    // directory (a herd would put 200 watches on one node or on the directory). A
    // waiter sets its watch a round trip after its node appears, and the server has no
    // event for that: look at its watch table until it settles.
    let children = zk_raw.list_children(&dir).await.unwrap();
    let mut ranked: Vec<(i64, String)> = children
        .iter()
        .map(|name| (lock_sequence(name).unwrap(), format!("{dir}/{name}")))
        .collect();
    ranked.sort();
    let last = ranked.len() - 1;
    let expected: Vec<usize> = (0..ranked.len()).map(|i| usize::from(i != last)).collect();
    let settle = tokio::time::Instant::now();
    loop {
        let watches = watches_by_path(port).await;
        assert_eq!(
            watches.get(&dir),
            None,
            "someone watches the lock directory"
        );
        let seen: Vec<usize> = ranked
            .iter()
            .map(|(_, path)| watches.get(path).copied().unwrap_or(0))
            .collect();
        if seen == expected {
            break;
        }
        assert!(
            seen.iter().all(|n| *n <= 1) && settle.elapsed() < Duration::from_secs(10),
            "watches per contender, lowest first: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let started = tokio::time::Instant::now();
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    for task in tasks {
        timeout(Duration::from_secs(60), task)
            .await
            .expect("a waiter hung")
            .expect("waiter task")
            .expect("every waiter acquires and releases");
    }
    let took = started.elapsed();
    let order = order.lock().unwrap().clone();
    assert_eq!(
        order,
        (0..WAITERS).collect::<Vec<_>>(),
        "grants left FIFO order"
    );
    let woken: u64 = clients.iter().map(ZooKeeperLock::wakeups).sum();
    assert_eq!(
        woken, WAITERS as u64,
        "{WAITERS} releases woke waiters {woken} times"
    );
    println!(
        "200 hand-offs in {took:?} ({:?} each)",
        took / WAITERS as u32
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_names_follow_curators_protected_lock_layout() {
    let port = shared_port();
    let lock = direct(port, SESSION).await;
    let k = key("curator-layout/é ../x");
    let guard = lock
        .lock()
        .acquire(&k, &waiting(Duration::ZERO))
        .await
        .unwrap();
    let dir = lock.lock_dir(&k);
    assert_eq!(
        dir,
        format!("/distlock/{}", distlock_zookeeper::encode_key(&k))
    );
    let zk_raw = raw(port).await;
    let children = zk_raw.list_children(&dir).await.unwrap();
    assert_eq!(children.len(), 1);
    let name = &children[0];
    // `_c_` + a canonical UUID + `-` (Curator's ProtectedUtils) + `lock-` + 10 digits.
    let guid = owner_guid(guard.lease().owner());
    assert_eq!(guid.len(), 36);
    assert!(guid
        .char_indices()
        .all(|(i, c)| if [8, 13, 18, 23].contains(&i) {
            c == '-'
        } else {
            c.is_ascii_digit() || ('a'..='f').contains(&c)
        }));
    let expected_prefix = format!("_c_{guid}-lock-");
    assert!(name.starts_with(&expected_prefix), "{name}");
    let digits = &name[expected_prefix.len()..];
    assert_eq!(digits.len(), 10, "{name}");
    assert!(digits.bytes().all(|b| b.is_ascii_digit()), "{name}");
    assert_eq!(owner_of(name), Some(guard.lease().owner()));
    // An ephemeral node of our session, whose czxid is the fencing token.
    let (_, stat) = zk_raw.get_data(&format!("{dir}/{name}")).await.unwrap();
    assert_eq!(stat.ephemeral_owner, lock.session_id().unwrap());
    assert_eq!(stat.czxid as u64, guard.fencing_token().unwrap().get());
    let guard_token = guard.fencing_token().unwrap();
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    // The directory is a container node: once empty, the server deletes it (the
    // shared test server sweeps containers every 500 ms).
    let gone = async {
        loop {
            let (stat, watcher) = zk_raw.check_and_watch_stat(&dir).await.unwrap();
            if stat.is_none() {
                return;
            }
            watcher.changed().await;
        }
    };
    timeout(Duration::from_secs(10), gone)
        .await
        .expect("the empty lock directory was not reaped: not a container node");
    // And a later acquire recreates it.
    let again = lock
        .lock()
        .acquire(&k, &waiting(Duration::ZERO))
        .await
        .unwrap();
    assert!(again.fencing_token().unwrap() > guard_token);
    assert_eq!(again.release().await.unwrap(), ReleaseOutcome::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_compatible_recipe_and_ours_exclude_each_other() {
    let port = shared_port();
    let ours = direct(port, SESSION).await;
    let k = key("curator-interop");
    let dir = ours.lock_dir(&k);
    let foreign = raw(port).await;
    let foreign_lock = |foreign: &zk::Client| {
        let foreign = foreign.clone();
        let dir = dir.clone();
        async move {
            let prefix = zk::LockPrefix::new_curator(&dir, "lock-").expect("Curator prefix");
            let options = zk::LockOptions::new(zk::Acls::anyone_all())
                .with_ancestor_options(zk::CreateMode::Container.with_acls(zk::Acls::anyone_all()))
                .expect("lock options");
            foreign
                .lock(prefix, b"", options)
                .await
                .map(zk::LockClient::into_owned)
        }
    };

    // Ours first: the Curator-compatible contender queues behind it.
    let guard = ours
        .lock()
        .acquire(&k, &waiting(Duration::ZERO))
        .await
        .unwrap();
    let queued = tokio::spawn(foreign_lock(&foreign));
    wait_children(&foreign, &dir, 2, Duration::from_secs(10)).await;
    assert!(
        !queued.is_finished(),
        "the foreign lock was granted over ours"
    );
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    let held = timeout(Duration::from_secs(10), queued)
        .await
        .expect("the foreign contender was not woken by our release")
        .expect("foreign task")
        .expect("the foreign lock is granted");
    assert!(held.lock_path().contains("/_c_"), "{}", held.lock_path());

    // Theirs held: ours is refused, then queues and is woken by their release.
    assert!(ours
        .lock()
        .try_acquire(&k, &waiting(Duration::ZERO))
        .await
        .unwrap()
        .is_none());
    let waiting_ours = {
        let (ours, k) = (ours.clone(), k.clone());
        tokio::spawn(async move {
            ours.lock()
                .acquire(&k, &waiting(Duration::from_secs(10)))
                .await
        })
    };
    wait_children(&foreign, &dir, 2, Duration::from_secs(10)).await;
    assert!(
        !waiting_ours.is_finished(),
        "ours was granted over the foreign lock"
    );
    drop(held); // deletes the foreign node in the background
    let guard = timeout(Duration::from_secs(10), waiting_ours)
        .await
        .expect("ours was not woken by the foreign release")
        .expect("our task")
        .expect("ours is granted");
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directory_that_refuses_writes_falls_back_to_plain_creates() {
    let port = shared_port();
    let lock = direct(port, SESSION).await;
    let k = key("read-only-dir");
    let dir = lock.lock_dir(&k);
    // An operator made the directory: contenders may be created and deleted in it,
    // but its data may not be written, so the multi fast path is refused.
    let zk_raw = raw(port).await;
    let open = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    zk_raw.mkdir("/distlock", &open).await.unwrap();
    let acl = [zk::Acl::new(
        zk::Permission::READ | zk::Permission::CREATE | zk::Permission::DELETE,
        zk::AuthId::anyone(),
    )];
    let no_write = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&acl));
    zk_raw.create(&dir, b"", &no_write).await.unwrap();

    let guard = lock
        .lock()
        .acquire(&k, &waiting(Duration::ZERO))
        .await
        .unwrap();
    let children = zk_raw.list_children(&dir).await.unwrap();
    assert_eq!(children.len(), 1);
    let (_, stat) = zk_raw
        .get_data(&format!("{dir}/{}", children[0]))
        .await
        .unwrap();
    assert_eq!(stat.czxid as u64, guard.fencing_token().unwrap().get());
    let other = direct(port, SESSION).await;
    assert!(other
        .lock()
        .try_acquire(&k, &waiting(Duration::ZERO))
        .await
        .unwrap()
        .is_none());
    let queued = {
        let (other, k) = (other.clone(), k.clone());
        tokio::spawn(async move {
            other
                .lock()
                .acquire(&k, &waiting(Duration::from_secs(10)))
                .await
        })
    };
    wait_children(&zk_raw, &dir, 2, Duration::from_secs(10)).await;
    let first = guard.fencing_token().unwrap();
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    let next = timeout(Duration::from_secs(10), queued)
        .await
        .expect("the waiter was not woken")
        .expect("waiter task")
        .expect("the waiter acquires");
    assert!(next.fencing_token().unwrap() > first);
    assert_eq!(next.release().await.unwrap(), ReleaseOutcome::Released);
    zk_raw.delete(&dir, None).await.unwrap();
}
