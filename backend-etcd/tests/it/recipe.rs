//! The recipe against real etcd: `etcdctl lock` and distlock exclude each other on one
//! name, nothing is left in etcd once locks end, and bad input and misconfiguration
//! (unreachable endpoints, a wrong password, TLS against a plaintext server, a TTL
//! below etcd's minimum, foreign keys in a lock's range) get typed errors in time.

use crate::common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{direct, etcdctl, eventually, keys_under, lease_of, shared_port};
use distlock_api::{LockError, LockKey, LockOptions, ReleaseOutcome, WaitPolicy};
use distlock_etcd::{EtcdConfig, EtcdLock};
use distlock_test_servers::EtcdServer;

fn key(label: &str) -> LockKey {
    LockKey::new(format!("recipe-{label}-{:08x}", rand::random::<u32>())).unwrap()
}

fn no_wait(ttl: Duration) -> LockOptions {
    LockOptions::new(ttl).with_wait(WaitPolicy::NoWait)
}

fn waiting(ttl: Duration, wait: Duration) -> LockOptions {
    LockOptions::new(ttl).with_wait(WaitPolicy::Timeout(wait))
}

/// `etcdctl lock NAME [command…]` against 127.0.0.1:`port`, its stdout piped.
fn etcdctl_lock(port: u16, name: &str, command: &[&str]) -> Child {
    Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints=127.0.0.1:{port}"))
        .args(["lock", "--ttl=5", name])
        .args(command)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run etcdctl lock (Debian package etcd-client)")
}

/// The lock name `etcdctl lock` takes for `key`: the range without its trailing `/`.
fn etcdctl_name(lock: &EtcdLock, key: &LockKey) -> String {
    lock.lock_prefix(key).trim_end_matches('/').to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_waits_for_a_distlock_holder() {
    let port = shared_port();
    let lock = direct(port).await;
    let key = key("etcdctl-waits");
    let guard = lock
        .lock()
        .acquire(&key, &no_wait(Duration::from_secs(10)))
        .await
        .unwrap();
    let mut waiter = etcdctl_lock(port, &etcdctl_name(&lock, &key), &["echo", "etcdctl-ran"]);
    // etcdctl queues behind us: its key appears in the range, and it does not run.
    let prefix = lock.lock_prefix(&key);
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &prefix).len()
            == 2)
        .await,
        "etcdctl's contender key did not appear: {:?}",
        keys_under(port, &prefix)
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        waiter.try_wait().unwrap().is_none(),
        "etcdctl lock got the lock while distlock held it"
    );
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    let released = Instant::now();
    assert!(
        eventually(Duration::from_secs(10), || waiter
            .try_wait()
            .unwrap()
            .is_some())
        .await,
        "etcdctl lock did not get the lock after the release"
    );
    let out = waiter.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("etcdctl-ran"));
    eprintln!("etcdctl ran {:?} after the release", released.elapsed());
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &prefix)
            .is_empty())
        .await,
        "keys left behind: {:?}",
        keys_under(port, &prefix)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distlock_waits_for_an_etcdctl_holder() {
    let port = shared_port();
    let lock = direct(port).await;
    let key = key("distlock-waits");
    let prefix = lock.lock_prefix(&key);
    let mut holder = etcdctl_lock(port, &etcdctl_name(&lock, &key), &[]);
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &prefix).len()
            == 1)
        .await,
        "etcdctl did not take the lock"
    );
    assert!(lock
        .lock()
        .try_acquire(&key, &no_wait(Duration::from_secs(5)))
        .await
        .unwrap()
        .is_none());
    let status = lock.lock().inspect(&key).await.unwrap();
    assert!(status.held, "{status:?}");
    let waiter = {
        let (lock, key) = (lock.clone(), key.clone());
        tokio::spawn(async move {
            let guard = lock
                .lock()
                .acquire(
                    &key,
                    &waiting(Duration::from_secs(5), Duration::from_secs(20)),
                )
                .await?;
            Ok::<_, LockError>((Instant::now(), guard))
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiter.is_finished(), "distlock got the lock etcdctl held");
    // etcdctl releases (revokes its session) on SIGTERM.
    let stopped = Instant::now();
    let pid = i32::try_from(holder.id()).unwrap();
    #[allow(unsafe_code)]
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    let _ = holder.wait();
    let (granted_at, guard) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("distlock was granted after etcdctl released")
        .unwrap()
        .unwrap();
    eprintln!(
        "distlock granted {:?} after etcdctl was stopped",
        granted_at - stopped
    );
    assert!(guard.contended());
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    assert!(keys_under(port, &prefix).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_left_once_locks_end() {
    let port = shared_port();
    let (a, b) = (direct(port).await, direct(port).await);
    let key = key("leftovers");
    let prefix = a.lock_prefix(&key);
    let options = waiting(Duration::from_secs(5), Duration::from_secs(10));
    let held = a.lock().acquire(&key, &options).await.unwrap();
    let lease = (held.lease().owner().as_u128() >> 64) as u64;
    // A waiter that gives up, one that is dropped, and one that is granted.
    let gave_up = b
        .lock()
        .acquire(
            &key,
            &waiting(Duration::from_secs(5), Duration::from_millis(200)),
        )
        .await;
    assert!(
        matches!(gave_up, Err(LockError::Timeout { .. })),
        "{gave_up:?}"
    );
    let dropped = {
        let (b, key, options) = (b.clone(), key.clone(), options.clone());
        tokio::spawn(async move { b.lock().acquire(&key, &options).await.map(drop) })
    };
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &prefix).len()
            == 2)
        .await,
        "the waiter did not queue"
    );
    dropped.abort();
    let _ = dropped.await;
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &prefix).len()
            == 1)
        .await,
        "a dropped waiter left its key: {:?}",
        keys_under(port, &prefix)
    );
    let next = {
        let (b, key, options) = (b.clone(), key.clone(), options.clone());
        tokio::spawn(async move { b.lock().acquire(&key, &options).await })
    };
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &prefix).len()
            == 2)
        .await
    );
    held.release().await.unwrap();
    let next = next.await.unwrap().unwrap();
    drop(next);
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &prefix)
            .is_empty())
        .await,
        "keys left: {:?}",
        keys_under(port, &prefix)
    );
    let ttl = etcdctl(port, &["lease", "timetolive", &format!("{lease:x}")]);
    assert!(
        ttl.contains("already expired"),
        "the released lease lives on: {ttl}"
    );
}

/// `etcdctl lease grant SECS`: the new lease's id in hex.
fn grant_lease(port: u16, secs: u32) -> String {
    let granted = etcdctl(port, &["lease", "grant", &secs.to_string()]);
    // "lease 694d7a1b2c3d4e5f granted with TTL(30s)"
    granted
        .split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("unexpected `etcdctl lease grant` output: {granted}"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_contenders_of_the_recipes_shape_count() {
    let port = shared_port();
    let lock = direct(port).await;
    let key = key("foreign");
    // What a Go `concurrency.Mutex` puts: a key named by its lease id, under that lease.
    let lease = grant_lease(port, 30);
    let foreign = format!("{}{lease}", lock.lock_prefix(&key));
    etcdctl(port, &["put", "--lease", &lease, &foreign, ""]);
    assert!(lock
        .lock()
        .try_acquire(&key, &no_wait(Duration::from_secs(5)))
        .await
        .unwrap()
        .is_none());
    let started = Instant::now();
    let err = lock
        .lock()
        .acquire(
            &key,
            &waiting(Duration::from_secs(5), Duration::from_millis(300)),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3));
    let status = lock.lock().inspect(&key).await.unwrap();
    assert_eq!(status.holder.as_deref(), Some(foreign.as_str()));
    etcdctl(port, &["lease", "revoke", &lease]);
    let guard = lock
        .lock()
        .acquire(&key, &no_wait(Duration::from_secs(5)))
        .await
        .unwrap();
    guard.release().await.unwrap();
    assert!(keys_under(port, &lock.lock_prefix(&key)).is_empty());
}

/// Keys in a lock's range that are not contenders of the recipe (another name, a
/// deeper path, no lease) are another tool's data: an acquire that would wait behind
/// one fails with a configuration error at once (not at its wait's end, and not never
/// for a key without a lease), and leaves nothing of its own behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_keys_of_another_shape_are_config_errors() {
    let port = shared_port();
    let lock = direct(port).await;
    let lease = grant_lease(port, 60);
    for (name, leased) in [
        ("not-a-lease-id", false),
        ("abc", false),
        ("not-a-lease-id", true),
        ("1f/deeper", true),
    ] {
        let key = key("shape");
        let range = lock.lock_prefix(&key);
        let foreign = format!("{range}{name}");
        let mut put = vec!["put", &foreign, "some other tool"];
        if leased {
            put.extend(["--lease", &lease]);
        }
        etcdctl(port, &put);
        for options in [
            no_wait(Duration::from_secs(5)),
            waiting(Duration::from_secs(5), Duration::from_secs(30)),
        ] {
            let started = Instant::now();
            let err = lock
                .lock()
                .acquire(&key, &options)
                .await
                .map(drop)
                .unwrap_err();
            assert!(
                matches!(err, LockError::Config { .. }),
                "{name} (lease {leased}): {err}"
            );
            assert!(err.to_string().contains(&foreign), "{err}");
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{name}: {:?}",
                started.elapsed()
            );
            let err = lock
                .lock()
                .try_acquire(&key, &options)
                .await
                .map(drop)
                .unwrap_err();
            assert!(matches!(err, LockError::Config { .. }), "{err}");
            // Our contender's lease is revoked in the background as the acquire ends.
            assert!(
                eventually(Duration::from_secs(5), || keys_under(port, &range)
                    == vec![foreign.clone()])
                .await,
                "{name}: left behind: {:?}",
                keys_under(port, &range)
            );
        }
        // Behind a holder of ours, the foreign key is met while waiting (the key just
        // before the waiter's own), not when placing.
        etcdctl(port, &["del", &foreign]);
        let holder = lock
            .lock()
            .acquire(&key, &no_wait(Duration::from_secs(5)))
            .await
            .unwrap();
        etcdctl(port, &put);
        let started = Instant::now();
        let err = lock
            .lock()
            .acquire(
                &key,
                &waiting(Duration::from_secs(5), Duration::from_secs(30)),
            )
            .await
            .map(drop)
            .unwrap_err();
        assert!(matches!(err, LockError::Config { .. }), "{name}: {err}");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(holder.release().await.unwrap(), ReleaseOutcome::Released);
        etcdctl(port, &["del", &foreign]);
        assert!(
            eventually(Duration::from_secs(5), || keys_under(port, &range)
                .is_empty())
            .await,
            "{name}: left behind: {:?}",
            keys_under(port, &range)
        );
    }
    etcdctl(port, &["lease", "revoke", &lease]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_below_the_servers_minimum_is_invalid_options() {
    let port = shared_port();
    let lock = direct(port).await;
    let key = key("short-ttl");
    for ttl in [Duration::from_millis(500), Duration::from_secs(1)] {
        let err = lock.lock().acquire(&key, &no_wait(ttl)).await.unwrap_err();
        assert!(
            matches!(err, LockError::InvalidOptions { .. }),
            "{ttl:?}: {err}"
        );
        assert!(err.to_string().contains("minimum"), "{err}");
    }
    assert!(keys_under(port, &lock.lock_prefix(&key)).is_empty());
    let guard = lock
        .lock()
        .acquire(&key, &no_wait(Duration::from_secs(2)))
        .await
        .unwrap();
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_the_lease_from_outside_fires_lost() {
    let port = shared_port();
    let lock = direct(port).await;
    let key = key("revoked");
    let guard = lock
        .lock()
        .acquire(&key, &no_wait(Duration::from_secs(30)))
        .await
        .unwrap();
    // The lease the key is on (the client's shared lease of that TTL).
    let own = keys_under(port, &lock.lock_prefix(&key));
    assert_eq!(own.len(), 1, "{own:?}");
    let lease = lease_of(port, &own[0]);
    let revoked = Instant::now();
    etcdctl(port, &["lease", "revoke", &format!("{lease:x}")]);
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("lost() fires promptly after `etcdctl lease revoke`");
    eprintln!("lost() fired {:?} after the revoke", revoked.elapsed());
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Expired);
    // And a key deleted from outside.
    let guard = lock
        .lock()
        .acquire(&key, &no_wait(Duration::from_secs(30)))
        .await
        .unwrap();
    etcdctl(port, &["del", "--prefix", &lock.lock_prefix(&key)]);
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("lost() fires promptly after the key is deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_endpoints_are_connection_errors_in_time() {
    let config = EtcdConfig::default().with_connect_timeout(Duration::from_secs(1));
    let started = Instant::now();
    let err = EtcdLock::connect_with("etcd://127.0.0.1:1,127.0.0.1:2", config)
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Connection { .. }), "{err}");
    assert!(err.to_string().contains("127.0.0.1:1,127.0.0.1:2"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(7),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_against_a_plaintext_server_is_a_typed_error() {
    let port = shared_port();
    let ca = std::env::temp_dir().join(format!("distlock-etcd-no-ca-{}.pem", std::process::id()));
    std::fs::write(&ca, "not a certificate").unwrap();
    let url = format!("etcd+tls://127.0.0.1:{port}?ca={}", ca.display());
    let config = EtcdConfig::default()
        .with_connect_timeout(Duration::from_secs(2))
        .with_request_timeout(Duration::from_secs(2));
    let started = Instant::now();
    let err = EtcdLock::connect_with(&url, config).await.unwrap_err();
    let _ = std::fs::remove_file(&ca);
    assert!(
        matches!(err, LockError::Config { .. } | LockError::Connection { .. }),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_a_config_error() {
    // A server of its own: turning authentication on changes it for everyone.
    let server = EtcdServer::start().await.expect("etcd starts");
    let port = server.port();
    etcdctl(port, &["user", "add", "root:rootpw"]);
    etcdctl(port, &["auth", "enable"]);
    let base = format!("127.0.0.1:{port}");
    let started = Instant::now();
    let err = EtcdLock::connect(&format!("etcd://root:wrong@{base}"))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err}");
    // Within the connect timeout (5 s by default).
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(
        !err.to_string().contains("wrong"),
        "the password leaked: {err}"
    );
    let err = EtcdLock::connect(&format!("etcd://{base}"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, LockError::Config { .. }),
        "no credentials on a server that needs them: {err}"
    );
    let lock = EtcdLock::connect(&format!("etcd://root:rootpw@{base}"))
        .await
        .expect("the right password connects");
    let key = key("auth");
    let guard = lock
        .lock()
        .acquire(&key, &no_wait(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
}

/// Refused acquires (a TTL below etcd's minimum, a foreign key of another shape ahead)
/// leave no lease of theirs in etcd, not only no key: checked on a server of its own,
/// where every lease is ours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_acquires_leave_no_lease_behind() {
    let server = common::start_server().await;
    let port = server.port();
    let lock = direct(port).await;
    let key = key("no-lease-left");
    let leases = || etcdctl(port, &["lease", "list"]);
    for ttl in [Duration::from_millis(500), Duration::from_secs(1)] {
        let err = lock
            .lock()
            .acquire(&key, &no_wait(ttl))
            .await
            .map(drop)
            .unwrap_err();
        assert!(matches!(err, LockError::InvalidOptions { .. }), "{err}");
    }
    assert!(leases().contains("found 0 leases"), "{}", leases());
    let foreign = format!("{}not-a-lease-id", lock.lock_prefix(&key));
    etcdctl(port, &["put", &foreign, "some other tool"]);
    let err = lock
        .lock()
        .acquire(
            &key,
            &waiting(Duration::from_secs(5), Duration::from_secs(30)),
        )
        .await
        .map(drop)
        .unwrap_err();
    assert!(matches!(err, LockError::Config { .. }), "{err}");
    assert!(
        eventually(Duration::from_secs(5), || leases()
            .contains("found 0 leases"))
        .await,
        "{}",
        leases()
    );
    assert_eq!(keys_under(port, &lock.lock_prefix(&key)), vec![foreign]);
}

/// `etcdctl lease timetolive` of the lease `key` is attached to.
fn lease_ttl_of(port: u16, key: &str) -> String {
    let lease = lease_of(port, key);
    etcdctl(port, &["lease", "timetolive", &format!("{lease:x}")])
}

/// Waits (up to 5 s) until etcd lists no lease at all (a server of the test's own).
async fn until_no_lease(port: u16) {
    assert!(
        eventually(Duration::from_secs(5), || etcdctl(port, &["lease", "list"])
            .contains("found 0 leases"))
        .await,
        "{}",
        etcdctl(port, &["lease", "list"])
    );
}

/// A waiter whose lock has a TTL above the 3 s waiting lease is granted while its key
/// is still on the waiting lease, and the key moves to a lease of the lock's TTL
/// behind the grant. A release or an extend made at once, while that move may be under
/// way, still does what it says, and no lease is left: checked on a server of its own,
/// where every lease is ours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_granted_on_its_waiting_lease_releases_and_extends_at_once() {
    let server = common::start_server().await;
    let port = server.port();
    let (a, b) = (direct(port).await, direct(port).await);
    let key = key("parked");
    let prefix = a.lock_prefix(&key);
    let options = waiting(Duration::from_secs(30), Duration::from_secs(30));
    let hand_over = |holder: distlock_api::LockGuard| {
        let (b, key, options, prefix) = (b.clone(), key.clone(), options.clone(), prefix.clone());
        async move {
            let waiter = tokio::spawn(async move { b.lock().acquire(&key, &options).await });
            assert!(
                eventually(Duration::from_secs(5), || keys_under(port, &prefix).len()
                    == 2)
                .await,
                "the waiter did not queue"
            );
            holder.release().await.unwrap();
            waiter.await.unwrap().unwrap()
        }
    };
    // Released at once: the lock is free for the next, and the waiter's leases go.
    let granted = hand_over(a.lock().acquire(&key, &options).await.unwrap()).await;
    assert_eq!(granted.release().await.unwrap(), ReleaseOutcome::Released);
    assert!(keys_under(port, &prefix).is_empty());
    let next = a
        .lock()
        .acquire(&key, &no_wait(Duration::from_secs(30)))
        .await;
    assert!(next.is_ok(), "{next:?}");
    // Extended at once, beyond the lock's TTL: the key ends on a lease of that TTL.
    let granted = hand_over(next.unwrap()).await;
    let valid = granted.extend(Duration::from_secs(60)).await.unwrap();
    assert!(
        matches!(valid, distlock_api::ExtendOutcome::Extended { .. }),
        "{valid:?}"
    );
    let own = &keys_under(port, &prefix)[0];
    let lease = lease_of(port, own);
    let ttl = etcdctl(port, &["lease", "timetolive", &format!("{lease:x}")]);
    assert!(ttl.contains("granted with TTL(60s)"), "{own}: {ttl}");
    // Held past the waiting lease's 3 s without a renewal in between.
    assert_eq!(granted.release().await.unwrap(), ReleaseOutcome::Released);
    let granted = hand_over(a.lock().acquire(&key, &options).await.unwrap()).await;
    assert!(
        eventually(Duration::from_secs(5), || {
            lease_ttl_of(port, &keys_under(port, &prefix)[0]).contains("granted with TTL(30s)")
        })
        .await,
        "the granted key did not move to a lease of the lock's TTL"
    );
    // Waiting for a point in time is the event here: the waiting lease's TTL passing.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(granted.state(), distlock_api::LeaseState::Held);
    assert!(a
        .lock()
        .try_acquire(&key, &no_wait(Duration::from_secs(5)))
        .await
        .unwrap()
        .is_none());
    assert_eq!(granted.release().await.unwrap(), ReleaseOutcome::Released);
    until_no_lease(port).await;
}

/// An acquire of a key this client last had to wait for places its contender straight
/// on the 3 s waiting lease. Found free, it is granted at once all the same, as a
/// parked grant: valid for that lease's TTL until its key moves to a lease of the
/// lock's TTL a second later. The next acquire, finding the key free again, goes the
/// usual way. Nothing is left: checked on a server of its own, where every lease is ours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_key_this_client_last_waited_for_is_granted_on_the_waiting_lease() {
    let server = common::start_server().await;
    let port = server.port();
    let (a, b) = (direct(port).await, direct(port).await);
    let key = key("straight");
    let prefix = a.lock_prefix(&key);
    let ttl = Duration::from_secs(30);
    let options = waiting(ttl, Duration::from_secs(30));
    let held = a.lock().acquire(&key, &options).await.unwrap();
    let waiter = {
        let (b, key, options) = (b.clone(), key.clone(), options.clone());
        tokio::spawn(async move { b.lock().acquire(&key, &options).await })
    };
    until_queued(port, &prefix, 2).await;
    held.release().await.unwrap();
    let waited = waiter.await.unwrap().unwrap();
    assert_eq!(waited.release().await.unwrap(), ReleaseOutcome::Released);

    let asked = tokio::time::Instant::now();
    let granted = b.lock().acquire(&key, &options).await.unwrap();
    let first = lease_ttl_of(port, &keys_under(port, &prefix)[0]);
    assert!(first.contains("granted with TTL(3s)"), "{first}");
    assert!(
        granted.valid_until() < asked + Duration::from_secs(4),
        "a grant on the waiting lease claims more than that lease's TTL"
    );
    assert!(
        eventually(Duration::from_secs(5), || {
            lease_ttl_of(port, &keys_under(port, &prefix)[0]).contains("granted with TTL(30s)")
        })
        .await,
        "the granted key did not move to a lease of the lock's TTL"
    );
    assert!(
        eventually(Duration::from_secs(5), || granted.valid_until()
            > tokio::time::Instant::now() + Duration::from_secs(20))
        .await,
        "the validity did not follow the key to the lock's lease"
    );
    assert_eq!(granted.release().await.unwrap(), ReleaseOutcome::Released);

    // Found free last time: the usual way, on a lease of the lock's TTL at once.
    let again = b.lock().acquire(&key, &options).await.unwrap();
    let usual = lease_ttl_of(port, &keys_under(port, &prefix)[0]);
    assert!(usual.contains("granted with TTL(30s)"), "{usual}");
    assert_eq!(again.release().await.unwrap(), ReleaseOutcome::Released);
    assert!(keys_under(port, &prefix).is_empty());
    until_no_lease(port).await;
}

/// Waits (up to 5 s) until `count` contenders are in `range`.
async fn until_queued(port: u16, range: &str, count: usize) {
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, range).len()
            == count)
        .await,
        "the waiter did not queue: {:?}",
        keys_under(port, range)
    );
}

/// A parked grant released through another client, which knows only its lease, loses
/// its key alone: the waiting lease it is on, which carries the owner's other waiters,
/// is not revoked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_a_parked_grant_from_another_client_spares_the_waiting_lease() {
    let port = shared_port();
    let (a, b, c) = (direct(port).await, direct(port).await, direct(port).await);
    let (first, second) = (key("spare-first"), key("spare-second"));
    let (first_range, second_range) = (a.lock_prefix(&first), a.lock_prefix(&second));
    let options = waiting(Duration::from_secs(30), Duration::from_secs(30));
    let queue = |key: &LockKey| {
        let (b, key, options) = (b.clone(), key.clone(), options.clone());
        tokio::spawn(async move { b.lock().acquire(&key, &options).await })
    };
    let holder = a.lock().acquire(&second, &options).await.unwrap();
    let queued = queue(&second);
    until_queued(port, &second_range, 2).await;
    let held = a.lock().acquire(&first, &options).await.unwrap();
    let waiter = queue(&first);
    until_queued(port, &first_range, 2).await;
    held.release().await.unwrap();
    let parked = waiter.await.unwrap().unwrap();
    // The key named by the holder's name id (its owner token's high 64 bits): the
    // client id and the slot (its low 24 bits) in hex.
    let named = (holder.lease().owner().as_u128() >> 64) as u64;
    let holders_key = format!("{second_range}{:x}-{:x}", named >> 24, named & 0xff_ffff);
    let waiters_key = keys_under(port, &second_range)
        .into_iter()
        .find(|k| *k != holders_key)
        .expect("the waiter's key");
    let waiting_lease = lease_of(port, &waiters_key);
    assert_eq!(
        lease_of(port, &keys_under(port, &first_range)[0]),
        waiting_lease,
        "the grant and the waiter are not on one waiting lease"
    );
    assert_eq!(
        c.lock().release(parked.lease()).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert!(keys_under(port, &first_range).is_empty());
    let ttl = etcdctl(
        port,
        &["lease", "timetolive", &format!("{waiting_lease:x}")],
    );
    assert!(ttl.contains("granted with TTL(3s)"), "{ttl}");
    assert_eq!(keys_under(port, &second_range).len(), 2);
    holder.release().await.unwrap();
    let granted = queued.await.unwrap().unwrap();
    assert_eq!(granted.release().await.unwrap(), ReleaseOutcome::Released);
    drop(parked);
}

/// A queue longer than a waiter counts down (64 ahead) is waited out the recipe's way,
/// and in order: the waiter is granted only once the last contender ahead is gone,
/// whichever order they leave in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_a_long_queue_is_granted_after_the_last_one_ahead() {
    let port = shared_port();
    let lock = direct(port).await;
    let key = key("long-queue");
    let prefix = lock.lock_prefix(&key);
    let mut raw = etcd_client::Client::connect([format!("http://127.0.0.1:{port}")], None)
        .await
        .unwrap();
    let mut ahead = Vec::new();
    for _ in 0..70 {
        let lease = raw.lease_grant(30, None).await.unwrap().id();
        let foreign = format!("{prefix}{lease:x}");
        let put = etcd_client::PutOptions::new().with_lease(lease);
        raw.put(foreign, "", Some(put)).await.unwrap();
        ahead.push(lease);
    }
    let mut waiter = {
        let (lock, key) = (lock.clone(), key.clone());
        tokio::spawn(async move {
            lock.lock()
                .acquire(
                    &key,
                    &waiting(Duration::from_secs(30), Duration::from_secs(30)),
                )
                .await
        })
    };
    assert!(
        eventually(Duration::from_secs(5), || keys_under(port, &prefix).len()
            == 71)
        .await,
        "the waiter did not queue"
    );
    // The youngest first, each the one just ahead of the waiter, down to 60 ahead
    // (within what a waiter counts down); then the others, one by one, but for the
    // oldest, left for last (a waiter that counted only the 64 youngest would go
    // before it).
    let oldest = ahead.remove(0);
    let youngest: Vec<i64> = ahead.drain(59..).rev().collect();
    for lease in youngest.into_iter().chain(ahead) {
        raw.lease_revoke(lease).await.unwrap();
    }
    assert_eq!(keys_under(port, &prefix).len(), 2);
    let early = tokio::time::timeout(Duration::from_millis(500), &mut waiter).await;
    assert!(early.is_err(), "granted with a contender ahead: {early:?}");
    raw.lease_revoke(oldest).await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("granted once the queue ahead is gone")
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
    assert!(keys_under(port, &prefix).is_empty());
}

/// A lease left to run out does not outlive its process here, as the capabilities say
/// (`outlives_client`): the client revokes it as its runtime shuts down.
#[test]
fn a_lease_left_to_run_out_is_revoked_when_its_process_exits() {
    let port = shared_port();
    let key = key("let-expire");
    let process = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (range, claimed) = process.block_on(async {
        let lock = direct(port).await;
        let guard = lock
            .lock()
            .try_acquire(&key, &no_wait(Duration::from_secs(30)))
            .await
            .unwrap()
            .expect("free");
        guard.let_expire();
        let claimed = lock.client().info().capabilities.mutex.outlives_client;
        (lock.lock_prefix(&key), claimed)
    });
    assert!(!claimed.is_supported(), "{claimed:?}");
    assert_eq!(keys_under(port, &range).len(), 1, "left to run out");
    // The shutdown waits for the revoke (up to a second).
    drop(process);
    assert!(keys_under(port, &range).is_empty(), "revoked at the exit");
}
