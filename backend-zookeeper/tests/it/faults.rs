//! ZooKeeper under faults: an injected session expiry, a lost create reply, a release
//! cut off by a lost connection, a server restart (within and past the session
//! timeout), and a 3-node ensemble losing its leader while locks are held and waited on.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_api::{
    ExtendOutcome, FencingToken, LeaseState, LockError, LockKey, LockOptions, ReleaseOutcome,
    WaitPolicy,
};
use distlock_conformance::FencedStore;
use distlock_test_servers::ServerControl;
use distlock_test_servers::ZooKeeperEnsemble;
use distlock_zookeeper::{owner_of, ZooKeeperLock};
use tokio::time::{timeout, Instant};
use zookeeper_client as zk;

use common::{direct, proxied, raw, shared_port, wait_children};

fn key(name: &str) -> LockKey {
    LockKey::new(format!("faults/{name}/{:08x}", rand_u32())).unwrap()
}

fn rand_u32() -> u32 {
    // Distinct keys per run without another dependency: the clock's nanoseconds.
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
}

fn waiting(wait: Duration) -> LockOptions {
    LockOptions::new(Duration::from_secs(30)).with_wait(WaitPolicy::Timeout(wait))
}

fn no_wait() -> LockOptions {
    LockOptions::new(Duration::from_secs(30)).with_wait(WaitPolicy::NoWait)
}

/// Polls a condition that has no event of its own (a lease turning suspect or held
/// again is only visible through `state()`), every 20 ms, for at most `limit`.
async fn eventually(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let started = Instant::now();
    while !cond() {
        assert!(
            started.elapsed() < limit,
            "{what} did not happen within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_session_expiry_fires_lost_and_hands_the_lock_over() {
    let port = shared_port();
    // A long session: only the injected expiry can free the lock quickly.
    let session_timeout = Duration::from_secs(8);
    let (holder, proxy) = proxied(port, session_timeout, |c| c).await;
    let waiter = direct(port, session_timeout).await;
    let k = key("session-expiry");
    let guard = holder.lock().acquire(&k, &no_wait()).await.unwrap();
    let stale_token = guard.fencing_token().unwrap();
    let old_session = holder.session_id().expect("a session");
    let dir = holder.lock_dir(&k);
    let queued = {
        let (waiter, k) = (waiter.clone(), k.clone());
        tokio::spawn(async move {
            waiter
                .lock()
                .acquire(&k, &waiting(Duration::from_secs(30)))
                .await
        })
    };
    let zk_raw = raw(port).await;
    wait_children(&zk_raw, &dir, 2, Duration::from_secs(10)).await;

    // The holder's host is cut off (so it cannot move the session back), and a second
    // client resumes its session with the same id and password, then closes it.
    proxy.cut();
    eventually(
        "the holder's lease turning suspect",
        Duration::from_secs(10),
        || guard.state() == LeaseState::Suspect,
    )
    .await;
    let info = holder.session_info().expect("session id and password");
    let injected_at = Instant::now();
    let intruder = zk::Client::connector()
        .with_session(info)
        .connect(&format!("127.0.0.1:{port}"))
        .await
        .expect("a second client resumes the holder's session");
    assert_eq!(intruder.session_id().0, old_session);
    drop(intruder); // closes the session: its ephemeral nodes go

    let fresh = timeout(Duration::from_secs(10), queued)
        .await
        .expect("the waiter was not handed the lock")
        .expect("waiter task")
        .expect("the waiter acquires once the holder's session is closed");
    let handed_over = injected_at.elapsed();
    assert!(
        handed_over < session_timeout,
        "the hand-over took {handed_over:?}: the session expired by itself, not by injection"
    );
    assert!(fresh.fencing_token().unwrap() > stale_token);

    // The holder reconnects, learns that its session expired, and loses the lease.
    proxy.heal();
    timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("lost() fires once the holder learns of the expiry");
    assert_eq!(guard.state(), LeaseState::Lost);

    // The stale holder can no longer hurt the new one.
    match guard.extend(Duration::from_secs(30)).await {
        Ok(ExtendOutcome::Lost) => {}
        other => panic!("extend after expiry gave {other:?}"),
    }
    let store = FencedStore::new("initial");
    store.write(fresh.fencing_token().unwrap(), "new").unwrap();
    assert!(store.write(stale_token, "stale").is_err());
    let late = holder.lock().release(guard.lease()).await.unwrap();
    assert_eq!(late, ReleaseOutcome::HeldByOther);
    assert!(waiter
        .lock()
        .try_acquire(&k, &no_wait())
        .await
        .unwrap()
        .is_none());
    drop(guard);

    // Later acquires use a new session; the expired one is never revived.
    let other = key("after-expiry");
    let again = holder
        .lock()
        .acquire(&other, &waiting(Duration::from_secs(10)))
        .await
        .expect("the holder acquires again on a new session");
    let new_session = holder.session_id().expect("a new session");
    assert_ne!(new_session, old_session);
    assert_eq!(again.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(fresh.release().await.unwrap(), ReleaseOutcome::Released);
}

/// A persistent non-contender child: it keeps the key's lock directory from being
/// swept as an empty container while replies are lost (a create into a missing
/// directory would fail, unseen).
const KEEP: &str = "keep";

async fn keep_dir(zk_raw: &zk::Client, lock: &ZooKeeperLock, k: &LockKey) {
    let dir = lock.lock_dir(k);
    let container = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
    zk_raw
        .mkdir(&dir, &container)
        .await
        .expect("lock directory");
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    zk_raw
        .create(&format!("{dir}/{KEEP}"), b"", &persistent)
        .await
        .expect("placeholder child");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_create_reply_is_found_by_guid_not_created_twice() {
    let port = shared_port();
    let (lock, proxy) = proxied(port, Duration::from_secs(8), |c| c).await;
    let zk_raw = raw(port).await;
    let k = key("lost-create-reply");
    let dir = lock.lock_dir(&k);
    keep_dir(&zk_raw, &lock, &k).await;
    // Requests reach the server, replies are lost: the create is applied unseen.
    proxy.drop_replies();
    let acquiring = {
        let (lock, k) = (lock.clone(), k.clone());
        tokio::spawn(async move {
            lock.lock()
                .acquire(&k, &waiting(Duration::from_secs(30)))
                .await
        })
    };
    let mut created = wait_children(&zk_raw, &dir, 2, Duration::from_secs(10)).await;
    created.sort();
    // Then the connection drops: the create fails with ConnectionLoss.
    proxy.heal();
    proxy.reset_all();
    let guard = timeout(Duration::from_secs(20), acquiring)
        .await
        .expect("acquire hung after the connection loss")
        .expect("acquire task")
        .expect("the lock is granted on the node created before the loss");
    let mut children = zk_raw.list_children(&dir).await.unwrap();
    children.sort();
    assert_eq!(children, created, "a second contender node was created");
    let ours: Vec<&String> = children.iter().filter(|n| n.as_str() != KEEP).collect();
    assert_eq!(ours.len(), 1);
    assert_eq!(owner_of(ours[0]), Some(guard.lease().owner()));
    let (_, stat) = zk_raw
        .get_data(&format!("{dir}/{}", ours[0]))
        .await
        .unwrap();
    assert_eq!(
        guard.fencing_token().unwrap(),
        FencingToken::new(stat.czxid as u64)
    );
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    wait_children(&zk_raw, &dir, 1, Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_create_is_removed_long_before_the_session_ends() {
    let port = shared_port();
    let session_timeout = Duration::from_secs(10);
    let (lock, proxy) = proxied(port, session_timeout, |c| {
        c.with_request_timeout(Duration::from_millis(300))
    })
    .await;
    let zk_raw = raw(port).await;
    let k = key("abandoned-create");
    let dir = lock.lock_dir(&k);
    keep_dir(&zk_raw, &lock, &k).await;
    proxy.drop_replies();
    let gave_up = lock.lock().try_acquire(&k, &no_wait()).await;
    assert!(
        matches!(gave_up, Err(LockError::Connection { .. })),
        "{gave_up:?}"
    );
    // The create landed although its reply was lost: an orphan, for now.
    wait_children(&zk_raw, &dir, 2, Duration::from_secs(5)).await;
    let healed_at = Instant::now();
    proxy.heal();
    proxy.reset_all();
    // The background clean-up finds it by GUID and deletes it.
    wait_children(&zk_raw, &dir, 1, Duration::from_secs(8)).await;
    assert!(healed_at.elapsed() < session_timeout);
    let other = direct(port, session_timeout).await;
    let guard = other.lock().try_acquire(&k, &no_wait()).await.unwrap();
    assert!(guard.is_some(), "an orphaned contender blocked the key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_whose_reply_is_lost_to_a_reset_reports_released() {
    let port = shared_port();
    let (lock, proxy) = proxied(port, Duration::from_secs(8), |c| c).await;
    let zk_raw = raw(port).await;
    let k = key("lost-release-reply");
    let dir = lock.lock_dir(&k);
    keep_dir(&zk_raw, &lock, &k).await;
    let guard = lock
        .lock()
        .acquire(&k, &no_wait())
        .await
        .expect("uncontended");
    // The delete is applied, its reply lost; then the connection drops under it.
    proxy.drop_replies();
    let releasing = tokio::spawn(guard.release());
    wait_children(&zk_raw, &dir, 1, Duration::from_secs(5)).await;
    proxy.heal();
    proxy.reset_all();
    let outcome = timeout(Duration::from_secs(20), releasing)
        .await
        .expect("release hung after the connection loss")
        .expect("release task");
    assert_eq!(
        outcome.expect("retried after the reconnect"),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_release_leaves_no_lock_behind() {
    let port = shared_port();
    let session_timeout = Duration::from_secs(10);
    let (lock, proxy) = proxied(port, session_timeout, |c| {
        c.with_request_timeout(Duration::from_millis(300))
    })
    .await;
    let zk_raw = raw(port).await;
    let k = key("failed-release");
    let dir = lock.lock_dir(&k);
    keep_dir(&zk_raw, &lock, &k).await;
    let guard = lock
        .lock()
        .acquire(&k, &no_wait())
        .await
        .expect("uncontended");
    // The delete never reaches the server, and the client does not resend it after
    // the reconnect; the session lives on.
    proxy.blackhole();
    let started = Instant::now();
    let released = guard.release().await;
    assert!(
        matches!(released, Err(LockError::Connection { .. })),
        "{released:?}"
    );
    assert!(started.elapsed() < Duration::from_millis(300) + RETURN_SLACK);
    assert_eq!(zk_raw.list_children(&dir).await.unwrap().len(), 2);
    let healed_at = Instant::now();
    proxy.heal();
    proxy.reset_all();
    // Removed in the background once the server answers again, not at session end.
    wait_children(&zk_raw, &dir, 1, Duration::from_secs(8)).await;
    assert!(healed_at.elapsed() < session_timeout);
    assert!(lock.session_id().is_some(), "the session was to survive");
    let other = direct(port, session_timeout).await;
    let taken = other.lock().try_acquire(&k, &no_wait()).await.unwrap();
    assert!(taken.is_some(), "the failed release left the lock held");
}

/// The slack on "returns within its wait" checks: two busy cores, not the server.
const RETURN_SLACK: Duration = Duration::from_secs(1);

/// Whether the server on `port` has a watch on a node inside `dir`, per the
/// four-letter command `wchp` (the test servers allow every one).
fn watches_inside(port: u16, dir: &str) -> bool {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("4lw connect");
    stream.write_all(b"wchp").expect("4lw write");
    let mut out = String::new();
    stream.read_to_string(&mut out).expect("4lw read");
    out.lines()
        .any(|line| line.trim().starts_with(&format!("{dir}/")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_bounds_acquire_against_a_paused_server() {
    let mut server = common::start_server().await;
    let port = server.port();
    // Long enough that the pauses below end no session.
    let session_timeout = Duration::from_secs(10);
    let lock = direct(port, session_timeout).await;
    let other = direct(port, session_timeout).await;
    let zk_raw = raw(port).await;
    let wait = Duration::from_secs(1);

    // A free key: the create is in flight when the wait runs out.
    let k = key("paused-acquire");
    let dir = lock.lock_dir(&k);
    keep_dir(&zk_raw, &lock, &k).await;
    server.pause().expect("pause");
    let started = Instant::now();
    let result = lock.lock().acquire(&k, &waiting(wait)).await;
    let took = started.elapsed();
    server.resume().expect("resume");
    eprintln!("acquire against a paused server returned after {took:?}: {result:?}");
    // Nothing said the key is held: the state is unknown, a connection error.
    assert!(
        matches!(result, Err(LockError::Connection { .. })),
        "{result:?}"
    );
    assert!(took < wait + RETURN_SLACK, "took {took:?}");
    // The node the resumed server creates is removed: another client gets the key
    // long before the first client's session could end.
    let started = Instant::now();
    let taken = other
        .lock()
        .acquire(&k, &waiting(Duration::from_secs(8)))
        .await
        .expect("the key is free after the resume");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(taken.release().await.unwrap(), ReleaseOutcome::Released);
    wait_children(&zk_raw, &dir, 1, Duration::from_secs(5)).await;
    let again = lock
        .lock()
        .acquire(&k, &waiting(Duration::from_secs(5)))
        .await
        .expect("the client works again after the resume");
    assert_eq!(again.release().await.unwrap(), ReleaseOutcome::Released);

    // A held key: the waiter's last look is in flight when the wait runs out.
    let k = key("paused-queue");
    let dir = lock.lock_dir(&k);
    keep_dir(&zk_raw, &lock, &k).await;
    let guard = other.lock().acquire(&k, &no_wait()).await.unwrap();
    let started = Instant::now();
    let task = {
        let (lock, k) = (lock.clone(), k.clone());
        tokio::spawn(async move { lock.lock().acquire(&k, &waiting(wait)).await })
    };
    wait_children(&zk_raw, &dir, 3, Duration::from_secs(5)).await;
    // Its node exists; once it watches its predecessor, its listing said "held".
    eventually(
        "the waiter watching its predecessor",
        Duration::from_secs(5),
        || watches_inside(port, &dir),
    )
    .await;
    server.pause().expect("pause");
    let result = task.await.expect("the acquire panicked");
    let took = started.elapsed();
    server.resume().expect("resume");
    eprintln!("queued acquire against a paused server returned after {took:?}: {result:?}");
    // The server had shown the key held: a timeout.
    assert!(
        matches!(result, Err(LockError::Timeout { .. })),
        "{result:?}"
    );
    assert!(took < wait + RETURN_SLACK, "took {took:?}");
    // The waiter's node is removed after the resume: only the holder's and ours left.
    wait_children(&zk_raw, &dir, 2, Duration::from_secs(5)).await;
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    wait_children(&zk_raw, &dir, 1, Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_within_the_session_timeout_keeps_the_lock() {
    let mut server = common::start_server().await;
    let port = server.port();
    let session_timeout = Duration::from_secs(15);
    let holder = direct(port, session_timeout).await;
    let k = key("restart-keeps");
    let guard = holder.lock().acquire(&k, &no_wait()).await.unwrap();
    let inside = Arc::new(AtomicUsize::new(1)); // the holder is inside
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let lock = direct(port, session_timeout).await;
        let (k, inside) = (k.clone(), inside.clone());
        waiters.push(tokio::spawn(async move {
            let guard = lock
                .lock()
                .acquire(&k, &waiting(Duration::from_secs(60)))
                .await?;
            assert_eq!(
                inside.fetch_add(1, Ordering::SeqCst),
                0,
                "two holders at once"
            );
            let token = guard.fencing_token().unwrap();
            inside.fetch_sub(1, Ordering::SeqCst);
            guard.release().await?;
            Ok::<_, LockError>(token)
        }));
    }
    let zk_raw = raw(port).await;
    wait_children(&zk_raw, &holder.lock_dir(&k), 4, Duration::from_secs(10)).await;
    drop(zk_raw);

    server.kill();
    eventually("the lease turning suspect", Duration::from_secs(10), || {
        guard.state() == LeaseState::Suspect
    })
    .await;
    server.restart().await.expect("ZooKeeper restarts");
    // Sessions are durable: the holder reconnects to its session and holds again.
    eventually("the lease being held again", session_timeout, || {
        guard.state() == LeaseState::Held
    })
    .await;
    let probe = direct(port, session_timeout).await;
    assert!(
        probe
            .lock()
            .try_acquire(&k, &no_wait())
            .await
            .unwrap()
            .is_none(),
        "the lock was free after a restart within the session timeout"
    );
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "a waiter got a held lock"
    );
    let holder_token = guard.fencing_token().unwrap();
    inside.fetch_sub(1, Ordering::SeqCst);
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    let mut last = holder_token;
    for waiter in waiters {
        let token = timeout(Duration::from_secs(30), waiter)
            .await
            .expect("a waiter hung")
            .expect("waiter task")
            .expect("every waiter acquires after the release");
        assert!(
            token > last,
            "tokens out of grant order: {token} after {last}"
        );
        last = token;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_down_past_the_session_timeout_loses_the_lock_and_a_waiter_gets_it() {
    let mut server = common::start_server().await;
    let port = server.port();
    let session_timeout = Duration::from_secs(2);
    let holder = direct(port, session_timeout).await;
    let waiter = direct(port, session_timeout).await;
    let k = key("restart-loses");
    let guard = holder.lock().acquire(&k, &no_wait()).await.unwrap();
    let holder_token = guard.fencing_token().unwrap();
    let old_session = holder.session_id().expect("a session");
    let queued = {
        let (waiter, k) = (waiter.clone(), k.clone());
        tokio::spawn(async move {
            waiter
                .lock()
                .acquire(&k, &waiting(Duration::from_secs(60)))
                .await
        })
    };
    let zk_raw = raw(port).await;
    wait_children(&zk_raw, &holder.lock_dir(&k), 2, Duration::from_secs(10)).await;
    drop(zk_raw);

    let killed_at = Instant::now();
    server.kill();
    // No server: the lease is lost by the client's own clock within the session timeout.
    timeout(session_timeout + Duration::from_secs(1), guard.lost())
        .await
        .expect("lost() fires within the session timeout of the outage");
    assert!(killed_at.elapsed() <= session_timeout + Duration::from_secs(1));
    // The client gives its session up (it is never revived)…
    eventually(
        "the holder abandoning its session",
        Duration::from_secs(10),
        || holder.session_id() != Some(old_session),
    )
    .await;
    drop(guard);
    // …so once the server is back, the session expires there too and the waiter,
    // on a new session of its own, gets the lock.
    server.restart().await.expect("ZooKeeper restarts");
    let fresh = timeout(Duration::from_secs(30), queued)
        .await
        .expect("the waiter hung")
        .expect("waiter task")
        .expect("the waiter acquires after the restart");
    assert!(fresh.fencing_token().unwrap() > holder_token);
    assert!(waiter
        .lock()
        .try_acquire(&k, &no_wait())
        .await
        .unwrap()
        .is_none());
    assert_eq!(fresh.release().await.unwrap(), ReleaseOutcome::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ensemble_leader_kill_keeps_surviving_locks_and_exclusion() {
    let mut ensemble = ZooKeeperEnsemble::start_with(3, common::server_config())
        .await
        .unwrap_or_else(|e| panic!("could not start a 3-node ZooKeeper ensemble: {e}"));
    let url = ensemble.url();
    // Sessions outlive an election of a few seconds.
    let session_timeout = Duration::from_secs(8);
    let connect = || async {
        ZooKeeperLock::connect_with(&url, common::config(session_timeout))
            .await
            .expect("connects to the ensemble")
    };
    const KEYS: usize = 3;
    const WAITERS: usize = 3;
    let keys: Vec<LockKey> = (0..KEYS).map(|i| key(&format!("ensemble-{i}"))).collect();
    let inside: Vec<Arc<AtomicUsize>> = (0..KEYS).map(|_| Arc::new(AtomicUsize::new(0))).collect();
    // Each holder counts as inside its critical section until it releases or its
    // lease is lost (by then, by its own clock, it must have stopped working).
    let mut holders = Vec::new();
    for (k, inside) in keys.iter().zip(&inside) {
        let lock = connect().await;
        let guard = lock.lock().acquire(k, &no_wait()).await.unwrap();
        inside.fetch_add(1, Ordering::SeqCst);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (lost, inside) = (guard.lost(), inside.clone());
        let working = tokio::spawn(async move {
            tokio::select! {
                _ = lost => {}
                _ = stopped => {}
            }
            inside.fetch_sub(1, Ordering::SeqCst);
        });
        holders.push((lock, guard, stop, working));
    }
    let mut waiters = Vec::new();
    for (k, inside) in keys.iter().zip(&inside) {
        for _ in 0..WAITERS {
            let lock = connect().await;
            let (k, inside) = (k.clone(), inside.clone());
            waiters.push(tokio::spawn(async move {
                let guard = lock
                    .lock()
                    .acquire(&k, &waiting(Duration::from_secs(90)))
                    .await?;
                assert_eq!(
                    inside.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two holders at once"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().await
            }));
        }
    }
    let zk_raw = zk::Client::connect(&ensemble.connect_string())
        .await
        .unwrap();
    for ((lock, ..), k) in holders.iter().zip(&keys) {
        wait_children(
            &zk_raw,
            &lock.lock_dir(k),
            1 + WAITERS,
            Duration::from_secs(20),
        )
        .await;
    }
    drop(zk_raw);

    let leader = ensemble
        .wait_for_leader(Duration::from_secs(30))
        .await
        .expect("a leader");
    let on_leader = match ensemble.node(leader) {
        Some(node) => node
            .four_letter("cons", Duration::from_secs(2))
            .await
            .map(|cons| cons.matches("sid=").count())
            .unwrap_or(0),
        None => 0,
    };
    let killed_at = Instant::now();
    ensemble.kill_node(leader).expect("kill the leader");
    let new_leader = ensemble
        .wait_for_leader(Duration::from_secs(60))
        .await
        .expect("the survivors elect a new leader");
    assert_ne!(new_leader, leader);
    let elected_after = killed_at.elapsed();

    // Holders whose sessions survived still hold; nobody else got their keys.
    let probe = connect().await;
    let mut surviving = 0;
    for ((_, guard, ..), k) in holders.iter().zip(&keys) {
        eventually("the lease settling", session_timeout * 2, || {
            guard.state() != LeaseState::Suspect
        })
        .await;
        if guard.state() == LeaseState::Held {
            surviving += 1;
            let taken = probe
                .lock()
                .try_acquire(k, &no_wait())
                .await
                .expect("the ensemble serves again");
            assert!(taken.is_none(), "a surviving holder's lock was free");
        }
    }
    assert!(
        surviving > 0,
        "no holder's session survived a leader election"
    );
    println!(
        "leader {leader} killed with {on_leader} client connections on it; node {new_leader} \
         elected after {elected_after:?}; {surviving} of {KEYS} holders kept their sessions and locks"
    );
    for (_, guard, stop, working) in holders {
        let _ = stop.send(());
        working.await.expect("holder task");
        let _ = guard.release().await;
    }
    for waiter in waiters {
        timeout(Duration::from_secs(60), waiter)
            .await
            .expect("a waiter hung")
            .expect("waiter task")
            .expect("every waiter eventually acquires");
    }
    for inside in &inside {
        assert_eq!(inside.load(Ordering::SeqCst), 0);
    }
}
