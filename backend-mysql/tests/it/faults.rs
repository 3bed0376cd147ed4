//! MariaDB under faults, beyond the kit's fault scenarios (`fault_conformance.rs`,
//! which restart and pause the server, kill sessions and cut the network): abandoned
//! waits, a silent holder freed by the server's `wait_timeout`, a killed holder's
//! connection, and one client asking twice for one key.

use crate::common;

use std::time::Duration;

use distlock_api::{LockKey, LockOptions, WaitPolicy};
use distlock_mysql::lock_name;
use tokio::time::timeout;

const LONG: Duration = Duration::from_secs(60);

fn key(name: &str) -> LockKey {
    LockKey::new(format!("faults/{name}")).unwrap()
}

fn no_wait(ttl: Duration) -> LockOptions {
    LockOptions::new(ttl).with_wait(WaitPolicy::NoWait)
}

fn waiting(ttl: Duration, wait: Duration) -> LockOptions {
    LockOptions::new(ttl).with_wait(WaitPolicy::Timeout(wait))
}

/// The number of sessions waiting in `GET_LOCK` on the server (state "User lock").
async fn user_lock_waiters(port: u16) -> usize {
    let text = common::admin(
        port,
        "SELECT COUNT(*) FROM information_schema.processlist WHERE state = 'User lock'",
    )
    .await;
    text.trim().parse().unwrap_or(usize::MAX)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_wait_leaves_the_queue_and_holds_nothing() {
    let h = common::shared();
    let holder = h.client().await.lock();
    let waiter = h.client().await.lock();
    let k = key("abandoned");
    let name = lock_name(&k);
    let guard = holder.acquire(&k, &no_wait(LONG)).await.unwrap();
    let held_by =
        common::wait_for_holder(h.port, &name, LONG, "the holder", |id| id.is_some()).await;
    let forever = LockOptions::new(LONG).with_wait(WaitPolicy::Forever);
    for _ in 0..3 {
        let cut = timeout(Duration::from_millis(300), waiter.acquire(&k, &forever)).await;
        assert!(cut.is_err(), "a held key was granted");
    }
    // A server blocked in GET_LOCK does not notice its client leave: the abandoned
    // waits' sessions are killed from another connection, so the queue empties now,
    // not at the end of each wait statement.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while user_lock_waiters(h.port).await > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "abandoned waits still queued in GET_LOCK after 5 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    guard.release().await.unwrap();
    common::wait_for_holder(h.port, &name, LONG, "the key freed", |id| id.is_none()).await;
    assert!(held_by.is_some());
    // And the waiter's client still works.
    let taken = waiter.acquire(&k, &no_wait(LONG)).await.unwrap();
    taken.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_holder_is_freed_by_the_server_within_the_bound() {
    let h = common::shared();
    let (client, proxy) = h.proxied_client().await;
    let lock = client.lock();
    let k = key("silent");
    let name = lock_name(&k);
    let guard = lock.acquire(&k, &no_wait(LONG)).await.unwrap();
    common::wait_for_holder(h.port, &name, LONG, "the holder", |id| id.is_some()).await;
    // Cut off like a crashed host: nothing reaches the server any more, not even a reset.
    proxy.refuse_new(true);
    proxy.blackhole();
    let bound = h.config.dead_holder_bound() + h.config.heartbeat() + Duration::from_secs(2);
    common::wait_for_holder(h.port, &name, bound, "the server freed the lock", |id| {
        id.is_none()
    })
    .await;
    // The holder learns of it by its validity deadline.
    timeout(
        h.config.session_timeout + Duration::from_secs(2),
        guard.lost(),
    )
    .await
    .expect("lost() fired by the validity deadline");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_fires_lost_and_the_client_recovers() {
    let h = common::shared();
    let lock = h.client().await.lock();
    let other = h.client().await.lock();
    let k = key("killed");
    let guard = lock.acquire(&k, &no_wait(LONG)).await.unwrap();
    // `distlock status` shows the holder's connection id: kill it, as an operator would.
    let status = other.inspect(&k).await.unwrap();
    let holder = status.holder.expect("the holder's connection id");
    let id = holder.trim_start_matches("connection ");
    common::admin(h.port, &format!("KILL CONNECTION {id}")).await;
    let taken = other
        .acquire(&k, &waiting(LONG, Duration::from_secs(5)))
        .await
        .expect("the killed session's lock is freed at once");
    let bound = h.config.heartbeat() + h.config.request_timeout + Duration::from_secs(2);
    timeout(bound, guard.lost())
        .await
        .unwrap_or_else(|_| panic!("lost() did not fire within {bound:?} of the kill"));
    taken.release().await.unwrap();
    let again = lock
        .acquire(&k, &waiting(LONG, Duration::from_secs(5)))
        .await
        .expect("the client opens new sessions after a kill");
    again.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_never_grants_a_key_twice() {
    let h = common::shared();
    let lock = h.client().await.lock();
    let k = key("reentrant");
    let first = lock.acquire(&k, &no_wait(LONG)).await.unwrap();
    // GET_LOCK on the session that holds the name would succeed: the client must say
    // "held" to a try, and make a waiting acquire wait.
    assert!(lock
        .try_acquire(&k, &LockOptions::new(LONG))
        .await
        .unwrap()
        .is_none());
    let waited = lock
        .acquire(&k, &waiting(LONG, Duration::from_millis(300)))
        .await;
    assert!(
        matches!(waited, Err(distlock_api::LockError::Timeout { .. })),
        "a second local acquire of a held key gave {waited:?}"
    );
    let release = first.release();
    let (released, second) = tokio::join!(release, async {
        lock.acquire(&k, &waiting(LONG, Duration::from_secs(10)))
            .await
    });
    released.unwrap();
    second
        .expect("the waiting local acquire gets the key")
        .release()
        .await
        .unwrap();
}

/// Tokens of a server run are above those of the run before, after a crash
/// (SIGKILL): the epoch is the one durable write, and a new run raises it before any
/// token. Also after the in-memory run row is emptied under live sessions: a grant
/// without a token is refused (retried on a fresh session), never handed a lower one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_across_a_crash_and_a_lost_run_row() {
    use distlock_test_servers::{MariaDbServer, ServerControl, MARIADB_DATABASE};
    let mut server = MariaDbServer::start()
        .await
        .unwrap_or_else(|e| common::cannot_start(e));
    let config = common::test_config();
    let lock = distlock_mysql::MySqlLock::connect_with(&server.url(), config.clone())
        .await
        .unwrap()
        .lock();
    let mut last = 0;
    for n in 0..50 {
        let guard = lock
            .acquire(&key(&format!("crash/{}", n % 3)), &no_wait(LONG))
            .await
            .unwrap();
        let token = guard.fencing_token().unwrap().get();
        assert!(token > last, "token {token} after {last}");
        last = token;
        guard.release().await.unwrap();
    }
    // The run row gone under live sessions (as a restart would leave it): refused or
    // retried, never lower.
    server
        .sql(&format!("TRUNCATE TABLE {MARIADB_DATABASE}.distlock_run"))
        .await
        .expect("truncate");
    let guard = lock
        .acquire(&key("crash/0"), &waiting(LONG, Duration::from_secs(10)))
        .await
        .expect("a fresh session starts a new run");
    let token = guard.fencing_token().unwrap().get();
    assert!(
        token > last,
        "token {token} after {last} once the run row was lost"
    );
    last = token;
    guard.release().await.unwrap();
    drop(lock);
    server.kill();
    server.restart().await.expect("restart after the crash");
    let lock = distlock_mysql::MySqlLock::connect_with(&server.url(), config)
        .await
        .unwrap()
        .lock();
    for n in 0..3 {
        let guard = lock
            .acquire(&key(&format!("crash/{n}")), &no_wait(LONG))
            .await
            .unwrap();
        let token = guard.fencing_token().unwrap().get();
        assert!(token > last, "token {token} after {last}, across the crash");
        last = token;
        guard.release().await.unwrap();
    }
}
