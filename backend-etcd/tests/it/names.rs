//! Contender key names (key layout 2): a client reuses them, so a lock's range holds
//! few dead names however often it is taken, and a name's former key's deletion is
//! never taken for the end of its next one (by the loss watch, or by a waiter counting
//! down the contenders ahead of it).

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{direct, eventually, keys_under, shared_port};
use distlock_api::{LeaseState, LockKey, LockOptions, ReleaseOutcome, WaitPolicy};
use distlock_etcd::etcd_client;

fn key(name: &str) -> LockKey {
    LockKey::new(format!("names-{name}-{:08x}", rand::random::<u32>())).unwrap()
}

fn waiting(ttl: Duration, wait: Duration) -> LockOptions {
    LockOptions::new(ttl).with_wait(WaitPolicy::Timeout(wait))
}

/// A key's last segment, `<client id>-<slot>` in hex.
fn name_of(key: &str) -> &str {
    key.rsplit('/').next().unwrap()
}

/// Acquired again and again, a lock's key has one name, as a Go `concurrency.Mutex` on
/// one session does (etcd keeps every name ever written in its index until a
/// compaction, and a read of the range walks them all). Two contenders at once have two
/// names; a name has layout 2's shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reacquired_lock_reuses_its_key_name() {
    let port = shared_port();
    let lock = direct(port).await;
    let key = key("reuse");
    let range = lock.lock_prefix(&key);
    let options = waiting(Duration::from_secs(30), Duration::from_secs(10));
    let mut names = BTreeSet::new();
    let mut tokens = Vec::new();
    for _ in 0..5 {
        let guard = lock.lock().acquire(&key, &options).await.unwrap();
        tokens.push(guard.fencing_token().unwrap());
        names.extend(keys_under(port, &range));
        assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    }
    assert_eq!(names.len(), 1, "one name for every cycle: {names:?}");
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    let name = names.first().unwrap().clone();
    let (client, slot) = name_of(&name).split_once('-').expect("layout 2's name");
    assert!(!client.is_empty() && client.chars().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(slot, "0");
    let first = lock.lock().acquire(&key, &options).await.unwrap();
    let waiter = {
        let (lock, key, options) = (lock.clone(), key.clone(), options.clone());
        tokio::spawn(async move { lock.lock().acquire(&key, &options).await })
    };
    assert!(
        eventually(Duration::from_secs(10), || keys_under(port, &range).len()
            == 2)
        .await,
        "the waiter's key is there beside the holder's"
    );
    let both = keys_under(port, &range);
    assert_ne!(both[0], both[1]);
    assert!(both.contains(&name), "{both:?}");
    first.release().await.unwrap();
    let granted = waiter.await.unwrap().unwrap();
    granted.release().await.unwrap();
    assert!(keys_under(port, &range).is_empty());
}

/// Deletes `key` from outside and waits for `guard` (whose key it is) to read lost:
/// then the client's watch has passed on every deletion up to that one.
async fn barrier(raw: &mut etcd_client::Client, guard: &distlock_api::LockGuard, key: &str) {
    raw.delete(key, None).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the sentinel lock reads lost once its key is deleted");
}

/// A lock released and at once acquired again puts a key of the same name: the release's
/// deletion, which the client's watch may pass on after the new key was put, is not
/// taken for the new key's (`lost()` stays quiet), while a deletion from outside of the
/// new key is (`lost()` fires). (Whether the watch passes the release's deletion on
/// before or after the new grant is etcd's timing: this test catches a loss watch that
/// matched by name alone only in the rounds where it comes after; the next one catches
/// a waiter's count-down that did.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_former_keys_deletion_does_not_end_the_next() {
    let port = shared_port();
    let lock = direct(port).await;
    let mut raw = etcd_client::Client::connect([format!("http://127.0.0.1:{port}")], None)
        .await
        .unwrap();
    let key = key("incarnations");
    let range = lock.lock_prefix(&key);
    let options = waiting(Duration::from_secs(30), Duration::from_secs(10));
    for round in 0..20 {
        let first = lock.lock().acquire(&key, &options).await.unwrap();
        let name = keys_under(port, &range);
        first.release().await.unwrap();
        let again = lock.lock().acquire(&key, &options).await.unwrap();
        assert_eq!(keys_under(port, &range), name, "round {round}: one name");
        // Another lock of the client, deleted from outside: once it reads lost, the
        // watch has passed on the release's deletion too.
        let sentinel_key = self::key("sentinel");
        let sentinel = lock.lock().acquire(&sentinel_key, &options).await.unwrap();
        let sentinel_name = keys_under(port, &lock.lock_prefix(&sentinel_key));
        barrier(&mut raw, &sentinel, &sentinel_name[0]).await;
        assert_eq!(
            again.state(),
            LeaseState::Held,
            "round {round}: the former key's deletion ended the new one"
        );
        drop(sentinel);
        if round == 19 {
            // The new key deleted from outside: lost at once.
            barrier(&mut raw, &again, &name[0]).await;
            assert_eq!(again.release().await.unwrap(), ReleaseOutcome::Expired);
        } else {
            assert_eq!(again.release().await.unwrap(), ReleaseOutcome::Released);
        }
    }
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &range)
            .is_empty())
        .await,
        "nothing left"
    );
}

/// Contenders of two clients on one key, each client reusing its names: a waiter
/// counting down the contenders ahead of it matches each deletion to the key it ends
/// (the former key of a reused name was deleted before the read that found the next
/// one), so no two hold at once, and the tokens rise with every grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reused_names_never_let_two_hold_at_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let port = shared_port();
    let (a, b) = (direct(port).await, direct(port).await);
    let key = key("exclusion");
    let range = a.lock_prefix(&key);
    let holders = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for worker in 0..6 {
        let lock = if worker % 2 == 0 {
            a.clone()
        } else {
            b.clone()
        };
        let (key, holders, tokens) = (key.clone(), holders.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            let options = waiting(Duration::from_secs(30), Duration::from_secs(60));
            for _ in 0..40 {
                let guard = lock.lock().acquire(&key, &options).await.unwrap();
                assert_eq!(holders.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                tokens.lock().unwrap().push(guard.fencing_token().unwrap());
                tokio::task::yield_now().await;
                holders.fetch_sub(1, Ordering::SeqCst);
                guard.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let tokens = tokens.lock().unwrap();
    assert_eq!(tokens.len(), 240);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens rise grant by grant"
    );
    assert!(keys_under(port, &range).is_empty());
}
