//! Redis behind Sentinel (a master, a replica, three Sentinels): the conformance kit,
//! a failover while a lock is held and waited for, an election through a failover,
//! and bad input.

use crate::common;

use std::time::{Duration, Instant};

use distlock_api::{
    Candidate, LeaderWatch, LeaseState, LockError, LockKey, LockOptions, ReleaseOutcome, WaitPolicy,
};
use distlock_redis::{KeyNames, RedisLock};
use distlock_test_servers::RedisSentinelGroup;
use distlock_test_servers::ServerControl;

async fn group() -> RedisSentinelGroup {
    RedisSentinelGroup::start()
        .await
        .unwrap_or_else(|e| panic!("could not start a Sentinel group (run scripts/test.sh): {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_kit_passes_through_sentinel() {
    let group = group().await;
    common::kit_passes(&group.url()).await;
}

/// SHOWN, not proven in general: a lock whose grant reached the replica (`WAIT 1`)
/// is kept across the failover (renewals go to the new master), the waiter is not
/// granted while it is held, and gets it after the release with a larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_is_followed_while_a_lock_is_held_and_waited_for() {
    let mut group = group().await;
    let old = group.master_port().await.unwrap();
    let url = group.url();
    let holder = RedisLock::connect(&url).await.unwrap();
    let waiter = RedisLock::connect(&url).await.unwrap();
    assert_eq!(holder.sentinel_master(), Some(format!("127.0.0.1:{old}")));

    let key = LockKey::new("sentinel/failover").unwrap();
    // No auto-renew: a renewal acknowledged by the master alone can be lost in the
    // failover (the README's caveat), leaving the new master an older expiry than
    // the client's. Only the replicated grant is under test, so it must outlast
    // the whole failover on its own.
    let options = LockOptions::new(Duration::from_secs(120));
    let guard = holder.lock().acquire(&key, &options).await.unwrap();
    let first_token = guard.fencing_token().unwrap();
    // The grant reaches the replica before the master dies.
    let mut master = redis::Client::open(format!("redis://127.0.0.1:{old}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    common::wait_for_replica(&mut master).await;

    let waiting = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.clone());
        async move {
            let options = LockOptions::new(Duration::from_secs(10))
                .with_wait(WaitPolicy::Timeout(Duration::from_secs(60)));
            let guard = waiter.lock().acquire(&key, &options).await;
            (guard, Instant::now())
        }
    });

    let killed = Instant::now();
    let index = group.index_of(old).unwrap();
    group.servers()[index].kill();
    // When the Sentinels name the new master, and when the client follows.
    let (mut switched, mut followed) = (None, None);
    while followed.is_none() {
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "the holder never followed the failover"
        );
        if switched.is_none() && group.master_port().await.is_ok_and(|p| p != old) {
            switched = Some(killed.elapsed());
        }
        if holder
            .sentinel_master()
            .is_some_and(|m| m != format!("127.0.0.1:{old}"))
        {
            followed = Some(killed.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let followed = followed.unwrap_or_default();
    let switched = switched.unwrap_or(followed);
    println!(
        "FIGURE sentinel: the Sentinels named the new master {} ms after the kill, the client followed at {} ms ({} ms later)",
        switched.as_millis(),
        followed.as_millis(),
        followed.saturating_sub(switched).as_millis()
    );

    // The waiter's client subscribed its release channel on the new master.
    let new = holder.sentinel_master().unwrap_or_default();
    let mut new_master = redis::Client::open(format!("redis://{new}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let channel = distlock_redis::KeyNames::for_key(&key).channel();
    let started = Instant::now();
    loop {
        let (_, subscribers): (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query_async(&mut new_master)
            .await
            .unwrap();
        if subscribers >= 1 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "nobody subscribed {channel} on the new master"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A renewal on the new master confirms the lease: it is held, not lost.
    let renewed = holder
        .lock()
        .extend(guard.lease(), Duration::from_secs(10))
        .await
        .unwrap();
    assert!(
        matches!(renewed, distlock_api::ExtendOutcome::Extended { .. }),
        "the replicated lock survives the failover: {renewed:?}"
    );
    assert_ne!(guard.state(), LeaseState::Lost);
    assert!(!waiting.is_finished(), "the waiter was granted a held lock");

    let released_at = Instant::now();
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    let (granted, granted_at) = waiting.await.unwrap();
    let granted = granted.unwrap();
    assert!(granted_at >= released_at);
    assert!(granted.fencing_token().unwrap() > first_token);
    println!(
        "FIGURE sentinel hand-off after the failover: {} ms",
        granted_at.duration_since(released_at).as_millis()
    );
    granted.release().await.unwrap();
}

/// SHOWN, not proven in general: an election through a failover. A leadership whose
/// record reached the replica is kept (its renewal on the new master succeeds); an
/// observer whose look failed during the switch looks again, and the resign after
/// it is announced to it on the new master (its `:changed` channel subscribed there)
/// and hands the leadership to the waiting standby, in a higher term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_follows_a_failover() {
    let mut group = group().await;
    let old = group.master_port().await.unwrap();
    let url = group.url();
    let (leader_client, standby_client) = (
        RedisLock::connect(&url).await.unwrap(),
        RedisLock::connect(&url).await.unwrap(),
    );
    let (leader_side, standby) = (leader_client.election(), standby_client.election());
    let observer = RedisLock::connect(&url).await.unwrap();
    let name = LockKey::new("sentinel/elect").unwrap();
    // No auto-renew: a renewal acknowledged by the master alone can be lost in the
    // failover (the README's caveat), leaving the new master an older expiry than
    // the client's. Only the replicated grant is under test, so it must outlast
    // the whole failover on its own.
    let options = LockOptions::new(Duration::from_secs(120));
    let leader = leader_side
        .campaign(&name, &Candidate::new("a").unwrap(), &options)
        .await
        .unwrap();
    let mut master = redis::Client::open(format!("redis://127.0.0.1:{old}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    common::wait_for_replica(&mut master).await;

    let waiting = tokio::spawn({
        let (standby, name) = (standby.clone(), name.clone());
        async move {
            let options = LockOptions::new(Duration::from_secs(10))
                .with_wait(WaitPolicy::Timeout(Duration::from_secs(60)));
            let won = standby
                .campaign(&name, &Candidate::new("b").unwrap(), &options)
                .await;
            (won, Instant::now())
        }
    });
    // Every state the observer reads, retrying the looks that fail, until the leader
    // changes (to nobody, or to the standby).
    let watching = tokio::spawn({
        let (election, name) = (observer.election(), name.clone());
        async move {
            let mut watch = LeaderWatch::new(election, name);
            let mut seen = Vec::new();
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(60) {
                match watch.next().await {
                    Ok(state) => {
                        seen.push(state.map(|l| l.term));
                        if seen.len() > 1 {
                            return (seen, Instant::now());
                        }
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
            (seen, Instant::now())
        }
    });

    let killed = Instant::now();
    let index = group.index_of(old).unwrap();
    group.servers()[index].kill();
    for client in [&leader_client, &standby_client, &observer] {
        while client
            .sentinel_master()
            .is_none_or(|m| m == format!("127.0.0.1:{old}"))
        {
            assert!(
                killed.elapsed() < Duration::from_secs(30),
                "a client never followed the failover"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let new = observer.sentinel_master().unwrap_or_default();
    let mut new_master = redis::Client::open(format!("redis://{new}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let changed = format!("{}:changed", KeyNames::for_key(&name).lock + ":election");
    let started = Instant::now();
    loop {
        let (_, subscribers): (String, i64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&changed)
            .query_async(&mut new_master)
            .await
            .unwrap();
        if subscribers >= 1 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "nobody subscribed {changed} on the new master"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let renewed = leader.extend(Duration::from_secs(10)).await.unwrap();
    assert!(
        matches!(renewed, distlock_api::ExtendOutcome::Extended { .. }),
        "the replicated leadership survives the failover: {renewed:?}"
    );
    assert!(!waiting.is_finished(), "the standby led beside the leader");
    let term = leader.term();
    let resigned_at = Instant::now();
    assert_eq!(leader.resign().await.unwrap(), ReleaseOutcome::Released);
    let (won, won_at) = waiting.await.unwrap();
    let won = won.unwrap();
    assert!(won_at >= resigned_at && won.term() > term);
    let (seen, changed_at) = watching.await.unwrap();
    assert_eq!(seen.first(), Some(&Some(term)), "{seen:?}");
    assert!(
        seen[1].is_none_or(|t| t == won.term()),
        "the observer read {seen:?}"
    );
    // Announced on the new master; without it the observer looks every 5 s.
    let observed = changed_at.saturating_duration_since(resigned_at);
    println!(
        "FIGURE sentinel election: standby led {} ms after the resign, the observer saw the change {} ms after",
        won_at.duration_since(resigned_at).as_millis(),
        observed.as_millis()
    );
    assert!(
        observed < Duration::from_secs(2),
        "the observer saw the change {observed:?} after the resign"
    );
    won.resign().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_sentinel_urls_are_typed_errors_within_the_request_timeout() {
    let group = group().await;
    let hosts = group
        .sentinel_ports()
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let bound = Duration::from_millis(2500);
    // What may pass (a name the Sentinels may learn yet, a Sentinel refusing
    // connections) is retried until the connect timeout (2 s), then fails.
    let retried = Duration::from_secs(6);

    for url in [
        format!("redis+sentinel://{hosts}"),
        format!("redis+sentinel://{hosts}/"),
    ] {
        let error = RedisLock::connect(&url).await.unwrap_err();
        assert!(matches!(error, LockError::Config { .. }), "{url}: {error}");
        assert!(error.to_string().contains("master's name"), "{error}");
    }

    let started = Instant::now();
    let error = RedisLock::connect(&format!("redis+sentinel://{hosts}/nosuchmaster"))
        .await
        .unwrap_err();
    assert!(started.elapsed() < retried, "took {:?}", started.elapsed());
    assert!(matches!(error, LockError::Config { .. }), "{error}");
    assert!(error.to_string().contains("nosuchmaster"), "{error}");

    let nobody = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let started = Instant::now();
    let error = RedisLock::connect(&format!("redis+sentinel://127.0.0.1:{nobody}/distlock"))
        .await
        .unwrap_err();
    assert!(started.elapsed() < retried, "took {:?}", started.elapsed());
    assert!(matches!(error, LockError::Connection { .. }), "{error}");

    // A Sentinel that never answers (a partition) delays nothing while a majority of
    // the listed ones agree.
    let silent = distlock_test_servers::FaultProxy::start(std::net::SocketAddr::from((
        [127, 0, 0, 1],
        group.sentinel_ports()[0],
    )))
    .await
    .unwrap();
    silent.blackhole();
    let started = Instant::now();
    RedisLock::connect(&format!(
        "redis+sentinel://{},{hosts}/distlock",
        silent.local_addr()
    ))
    .await
    .unwrap();
    assert!(started.elapsed() < bound, "took {:?}", started.elapsed());
    let started = Instant::now();
    let error = RedisLock::connect(&format!(
        "redis+sentinel://{},{hosts}/nosuchmaster",
        silent.local_addr()
    ))
    .await
    .unwrap_err();
    assert!(started.elapsed() < retried, "took {:?}", started.elapsed());
    assert!(matches!(error, LockError::Config { .. }), "{error}");

    // One Sentinel down among answering ones is no obstacle.
    let started = Instant::now();
    let locks = RedisLock::connect(&format!(
        "redis+sentinel://127.0.0.1:{nobody},{hosts}/distlock"
    ))
    .await
    .unwrap();
    assert!(started.elapsed() < bound, "took {:?}", started.elapsed());
    let key = LockKey::new("sentinel/one-down").unwrap();
    let guard = locks
        .lock()
        .acquire(&key, &LockOptions::new(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);

    if cfg!(feature = "tls") {
        let started = Instant::now();
        let error = RedisLock::connect(&format!("rediss+sentinel://{hosts}/distlock#insecure"))
            .await
            .unwrap_err();
        assert!(started.elapsed() < bound, "took {:?}", started.elapsed());
        assert!(matches!(error, LockError::Connection { .. }), "{error}");
    }
}

/// `rediss+sentinel://`: the Sentinels and the master over TLS.
#[cfg(feature = "tls")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_kit_passes_through_sentinel_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let made = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=127.0.0.1"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl runs");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let group = RedisSentinelGroup::start_with_tls(Some((cert, key)))
        .await
        .unwrap_or_else(|e| panic!("could not start a TLS Sentinel group: {e}"));
    let url = group.tls_url().expect("a TLS group");
    common::tls_kit_passes(&url).await;
}
