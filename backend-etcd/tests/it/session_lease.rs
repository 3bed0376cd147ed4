//! The client's shared leases (one per TTL, as a Go `concurrency.Session` holds one):
//! an uncontended cycle is two raft writes, locks on one lease keep their own TTLs,
//! every lock on a lease revoked from outside is lost, a client that stops frees its
//! locks within the TTL, and nothing is left once the client is done. Each test on a
//! server of its own, where every lease and raft entry is ours.

use crate::common;

use std::time::Duration;

use common::{direct, etcdctl, eventually, keys_under, lease_of, leases, start_server};
use distlock_api::{ExtendOutcome, LeaseState, LockKey, LockOptions, ReleaseOutcome, WaitPolicy};
use distlock_etcd::etcd_client::{self, LockOptions as EtcdLockOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

fn key(name: &str) -> LockKey {
    LockKey::new(format!("session-{name}")).unwrap()
}

fn no_wait(ttl: Duration) -> LockOptions {
    LockOptions::new(ttl).with_wait(WaitPolicy::NoWait)
}

fn waiting(ttl: Duration, wait: Duration) -> LockOptions {
    LockOptions::new(ttl).with_wait(WaitPolicy::Timeout(wait))
}

/// `etcd_server_proposals_committed_total` from the server's metrics endpoint: every
/// raft entry (a put, a delete, a lease grant or revoke) counts one.
async fn proposals(port: u16) -> u64 {
    metric(port, "etcd_server_proposals_committed_total ").await
}

/// The KV requests of `method` (`Txn`, `DeleteRange`) the server answered.
async fn handled(port: u16, method: &str) -> u64 {
    let name = format!(
        "grpc_server_handled_total{{grpc_code=\"OK\",grpc_method=\"{method}\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"}} "
    );
    metric(port, &name).await
}

/// The value of the metric whose line starts with `name` (0 when it is not there yet:
/// a method never called has no line).
async fn metric(port: u16, name: &str) -> u64 {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connects to etcd's metrics endpoint");
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).await.unwrap();
    assert!(
        body.lines()
            .next()
            .is_some_and(|status| status.contains(" 200 ")),
        "the metrics endpoint answers: {}",
        body.lines().next().unwrap_or_default()
    );
    body.lines()
        .find_map(|line| line.strip_prefix(name))
        .map_or(0, |n| {
            n.trim().parse::<f64>().expect("a metric's value") as u64
        })
}

const CYCLES: u64 = 40;

/// Raft entries per uncontended acquire and release: two (the put, the delete), as
/// etcd-client's `lock()` on one lease kept for the run; beside it, the same `lock()`
/// on a lease granted and revoked per cycle takes four. And the requests are those of
/// etcd's own recipe: one transaction (the put) and one plain delete (the release: a
/// delete in a transaction costs etcd 3.4 far more under load).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_cycle_is_two_raft_writes() {
    let server = start_server().await;
    let port = server.port();
    let lock = direct(port).await.lock();
    let key = key("cycle");
    let options = waiting(Duration::from_secs(30), Duration::from_secs(5));
    // The first acquire grants the shared lease.
    lock.acquire(&key, &options)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let before = proposals(port).await;
    let (txns, deletes) = (
        handled(port, "Txn").await,
        handled(port, "DeleteRange").await,
    );
    for _ in 0..CYCLES {
        let guard = lock.acquire(&key, &options).await.unwrap();
        assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    }
    let ours = (proposals(port).await - before) as f64 / CYCLES as f64;
    let txns = handled(port, "Txn").await - txns;
    let deletes = handled(port, "DeleteRange").await - deletes;
    assert_eq!(
        (txns, deletes),
        (CYCLES, CYCLES),
        "a transaction (the put) and a plain delete (the release) per cycle"
    );

    let mut client = etcd_client::Client::connect([format!("http://127.0.0.1:{port}")], None)
        .await
        .unwrap();
    let lease = client.lease_grant(30, None).await.unwrap().id();
    let before = proposals(port).await;
    for _ in 0..CYCLES {
        let locked = client
            .lock(
                "peer/one-lease",
                Some(EtcdLockOptions::new().with_lease(lease)),
            )
            .await
            .unwrap();
        client.unlock(locked.key()).await.unwrap();
    }
    let one_lease = (proposals(port).await - before) as f64 / CYCLES as f64;
    let before = proposals(port).await;
    for _ in 0..CYCLES {
        let lease = client.lease_grant(30, None).await.unwrap().id();
        let locked = client
            .lock(
                "peer/per-cycle",
                Some(EtcdLockOptions::new().with_lease(lease)),
            )
            .await
            .unwrap();
        client.unlock(locked.key()).await.unwrap();
        client.lease_revoke(lease).await.unwrap();
    }
    let per_cycle = (proposals(port).await - before) as f64 / CYCLES as f64;
    eprintln!(
        "raft entries per uncontended cycle: distlock {ours:.2}, etcd-client lock() on one lease {one_lease:.2}, on a lease per cycle {per_cycle:.2}"
    );
    assert!(ours <= 2.05, "distlock: {ours:.2} raft entries per cycle");
    assert!(ours <= one_lease + 0.05, "{ours:.2} > {one_lease:.2}");
}

/// Two locks of one client on one shared lease: the one left unrenewed is free for
/// another client at its own deadline (its client deletes it), not when the lease
/// ends, while the other, auto-renewed, stays held; each keeps the validity its TTL
/// gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_on_one_lease_keep_their_own_ttls() {
    let server = start_server().await;
    let port = server.port();
    let (a, b) = (direct(port).await.lock(), direct(port).await.lock());
    let ttl = Duration::from_secs(4);
    let (short, long) = (key("unrenewed"), key("renewed"));
    let kept = a
        .acquire(
            &long,
            &no_wait(ttl).with_auto_renew(distlock_api::AutoRenew::new()),
        )
        .await
        .unwrap();
    let left = a.acquire(&short, &no_wait(ttl)).await.unwrap();
    let granted = left.lease().acquired_at();
    assert!(left.valid_until() <= granted + ttl);
    assert!(
        left.valid_until() + Duration::from_millis(1500) >= granted + ttl,
        "a fresh grant's validity is its TTL, give or take the lease's last keep-alive"
    );
    assert_eq!(
        lease_of(
            port,
            &keys_under(port, &format!("distlock/{}/", short.as_str()))[0]
        ),
        lease_of(
            port,
            &keys_under(port, &format!("distlock/{}/", long.as_str()))[0]
        ),
        "both keys are on the client's one lease of that TTL"
    );
    let taken = b
        .acquire(&short, &waiting(ttl, ttl * 3))
        .await
        .expect("the unrenewed lock is free by its deadline");
    let taken_at = Instant::now();
    assert!(taken_at >= left.valid_until());
    assert!(
        taken_at < granted + ttl + Duration::from_millis(1500),
        "taken {:?} after the grant",
        taken_at - granted
    );
    assert_eq!(left.state(), LeaseState::Lost);
    assert_ne!(kept.state(), LeaseState::Lost);
    assert!(b.try_acquire(&long, &no_wait(ttl)).await.unwrap().is_none());
    taken.release().await.unwrap();
    assert_eq!(kept.release().await.unwrap(), ReleaseOutcome::Released);
}

/// `etcdctl lease revoke` of the shared lease deletes every key on it: every lock on
/// it is lost at once, and the client's next acquire works on a fresh lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lock_on_a_revoked_lease_is_lost() {
    let server = start_server().await;
    let port = server.port();
    let lock = direct(port).await.lock();
    let ttl = Duration::from_secs(10);
    let guards = [
        lock.acquire(&key("revoked-1"), &no_wait(ttl))
            .await
            .unwrap(),
        lock.acquire(&key("revoked-2"), &no_wait(ttl))
            .await
            .unwrap(),
    ];
    let ids = leases(port);
    assert_eq!(ids.len(), 1, "one lease carries both: {ids:?}");
    etcdctl(port, &["lease", "revoke", &ids[0]]);
    for guard in &guards {
        tokio::time::timeout(Duration::from_secs(5), guard.lost())
            .await
            .expect("lost() fires once the shared lease is revoked");
    }
    for guard in guards {
        assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Expired);
    }
    let again = lock
        .acquire(&key("revoked-1"), &no_wait(ttl))
        .await
        .unwrap();
    assert_eq!(again.release().await.unwrap(), ReleaseOutcome::Released);
}

/// A client cut off (here: its process stopped with SIGSTOP, so neither its
/// keep-alives nor a deletion reach etcd) frees its locks once etcd expires the
/// shared lease: within the TTL (rounded up, plus the leader's 500 ms sweep) of its
/// last keep-alive, so within that of stopping. Played by etcdctl's own
/// `concurrency.Session` would need a Go program; a child `distlock exec`-like process
/// is what the fault kit does, so here the holder is a client whose keep-alives are
/// stopped by revoking nothing and dropping its runtime without clean-up: an
/// abandoned runtime, as a killed process leaves it.
#[test]
fn a_stopped_client_frees_its_locks_within_the_ttl() {
    let server = std::thread::spawn(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(start_server())
    })
    .join()
    .unwrap();
    let port = server.port();
    let ttl = Duration::from_secs(3);
    let key = key("stopped");
    // The holder's runtime is leaked (never shut down, so nothing revokes) and its
    // thread parked: its tasks stop, as a frozen or killed process's do.
    let (stopped_tx, stopped_rx) = std::sync::mpsc::channel();
    let holder_key = key.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let guard = runtime.block_on(async {
            let lock = direct(port).await.lock();
            let guard = lock.acquire(&holder_key, &no_wait(ttl)).await.unwrap();
            // A second on the lease: its keep-alive task has run at least once.
            tokio::time::sleep(Duration::from_millis(1200)).await;
            guard
        });
        stopped_tx.send(Instant::now()).unwrap();
        std::mem::forget(guard);
        std::mem::forget(runtime);
        loop {
            std::thread::park();
        }
    });
    let stopped = stopped_rx.recv().unwrap();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let other = direct(port).await.lock();
            let taken = other
                .acquire(&key, &waiting(ttl, Duration::from_secs(15)))
                .await
                .expect("the stopped client's lock is freed");
            let after = stopped.elapsed();
            eprintln!("taken {after:?} after the holder stopped (ttl {ttl:?})");
            assert!(
                after <= ttl + Duration::from_millis(1500),
                "taken {after:?} after the holder stopped"
            );
            taken.release().await.unwrap();
        });
    drop(server);
}

/// Once a client's locks end and the client is dropped, its shared leases are
/// revoked (after two idle seconds): no lease and no key is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_left_once_the_client_is_done() {
    let server = start_server().await;
    let port = server.port();
    let lock = direct(port).await;
    for (name, ttl) in [("a", 5), ("b", 7), ("c", 5)] {
        let guard = lock
            .lock()
            .acquire(&key(name), &no_wait(Duration::from_secs(ttl)))
            .await
            .unwrap();
        match guard.extend(Duration::from_secs(9)).await.unwrap() {
            ExtendOutcome::Extended { .. } => {}
            other => panic!("{other:?}"),
        }
        guard.release().await.unwrap();
    }
    drop(lock);
    assert!(
        eventually(Duration::from_secs(6), || leases(port).is_empty()).await,
        "leases left: {:?}",
        leases(port)
    );
    assert!(keys_under(port, "distlock/").is_empty());
}
