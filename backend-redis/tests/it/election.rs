//! Leader election on a real single redis-server, beyond the kit's scenarios (which
//! `tests/conformance.rs` runs, and Sentinel and Cluster through `common::kit_passes`):
//! observers woken by the server, nothing left behind, a namespace of its own, a
//! foreign key refused, Redlock's refusal, a cut-off leader, and failover times.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use distlock_api::{
    AutoRenew, Candidate, LeaderElection, LockError, LockKey, LockOptions, ReleaseOutcome,
    WaitOrder, WaitPolicy,
};
use distlock_redis::RedisLock;
use redis::AsyncCommands;
use tokio::time::Instant;

fn name(label: &str) -> LockKey {
    LockKey::new(label).expect("valid name")
}

fn me(label: &str) -> Candidate {
    Candidate::new(label).expect("valid identity")
}

fn no_wait(ttl: Duration) -> LockOptions {
    LockOptions::new(ttl).with_wait(WaitPolicy::NoWait)
}

fn waiting(ttl: Duration, wait: Duration) -> LockOptions {
    LockOptions::new(ttl).with_wait(WaitPolicy::Timeout(wait))
}

async fn election(url: &str) -> Arc<dyn LeaderElection> {
    RedisLock::connect(url).await.expect("connects").election()
}

/// Polls (every 2 ms, at most 10 s) until the server holds `key`.
async fn until_exists(raw: &mut redis::aio::MultiplexedConnection, key: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !raw.exists::<_, bool>(key).await.expect("EXISTS answers") {
        assert!(Instant::now() < deadline, "{key} never appeared");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// An observer waits for the server's announcement, not for a poll: with a leader
/// whose lease is long, a look every 5 s is all it would otherwise make, so a new
/// leadership and a resign must reach it far sooner. A lease that runs out (announced
/// by nobody) is seen at the leader's expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_are_woken_by_the_server() {
    let h = common::start(1).await;
    let observer_client = RedisLock::connect(&h.url()).await.expect("connects");
    let (a, observer) = (election(&h.url()).await, observer_client.election());
    let election_name = name("observed");
    let soon = Duration::from_secs(1);
    for _ in 0..3 {
        let watch = tokio::spawn({
            let (observer, election_name) = (observer.clone(), election_name.clone());
            async move {
                let seen = observer
                    .wait_change(&election_name, None, Duration::from_secs(60))
                    .await;
                (seen, Instant::now())
            }
        });
        // The observer has looked (and marked the name watched) before A campaigns.
        until_exists(&mut h.raw(0).await, "{observed}:election:watched").await;
        let leader = a
            .try_campaign(&election_name, &me("a"), &no_wait(Duration::from_secs(60)))
            .await
            .expect("campaign answers")
            .expect("a free election is won");
        let won_at = Instant::now();
        let (seen, seen_at) = watch.await.expect("observer task");
        let seen = seen.expect("observer reads").expect("a leader");
        assert_eq!(seen.term, leader.term());
        assert!(
            seen_at - won_at < soon,
            "saw the leader after {:?}",
            seen_at - won_at
        );

        let watch = tokio::spawn({
            let (observer, election_name, term) =
                (observer.clone(), election_name.clone(), leader.term());
            async move {
                let seen = observer
                    .wait_change(&election_name, Some(term), Duration::from_secs(60))
                    .await;
                (seen, Instant::now())
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let resigned_at = Instant::now();
        assert_eq!(leader.resign().await.unwrap(), ReleaseOutcome::Released);
        let (seen, seen_at) = watch.await.expect("observer task");
        assert_eq!(seen.expect("observer reads"), None);
        assert!(
            seen_at - resigned_at < soon,
            "saw the resign after {:?}",
            seen_at - resigned_at
        );
    }
    // A lease running out without renewal: seen at its expiry.
    let ttl = Duration::from_millis(400);
    let leader = a
        .try_campaign(&election_name, &me("a"), &no_wait(ttl))
        .await
        .unwrap()
        .expect("won");
    let term = leader.term();
    std::mem::forget(leader);
    let started = Instant::now();
    let seen = observer
        .wait_change(&election_name, Some(term), Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(seen, None);
    assert!(
        started.elapsed() < ttl + soon,
        "saw the expiry after {:?}",
        started.elapsed()
    );
    // The last observer's unsubscribe runs in the background.
    let deadline = Instant::now() + Duration::from_secs(10);
    while observer_client.tracked_wakeup_channels() != 0 {
        assert!(
            Instant::now() < deadline,
            "the observer's channel stays subscribed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Campaigns, resigns, a waiting candidate handed the leadership, an observer, a
/// campaign given up and a leader left to expire: every key goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_that_ended_leaves_nothing_behind() {
    let h = common::start(1).await;
    let b_client = RedisLock::connect(&h.url()).await.expect("connects");
    let (a, b) = (election(&h.url()).await, b_client.election());
    let ttl = Duration::from_secs(2);
    for i in 0..50 {
        let n = name(&format!("residue/{i}"));
        let won = a.campaign(&n, &me("a"), &no_wait(ttl)).await.unwrap();
        won.resign().await.unwrap();
    }
    let hot = name("residue/hot");
    let leader = a.campaign(&hot, &me("a"), &no_wait(ttl)).await.unwrap();
    let standby = tokio::spawn({
        let (b, hot) = (b.clone(), hot.clone());
        async move {
            b.campaign(&hot, &me("b"), &waiting(ttl, Duration::from_secs(20)))
                .await?
                .resign()
                .await
        }
    });
    let observer = tokio::spawn({
        let (b, hot) = (b.clone(), hot.clone());
        async move { b.wait_change(&hot, None, Duration::from_secs(20)).await }
    });
    until_exists(&mut h.raw(0).await, "{residue/hot}:election:waiting").await;
    until_exists(&mut h.raw(0).await, "{residue/hot}:election:watched").await;
    let gave_up = b
        .campaign(&hot, &me("c"), &waiting(ttl, Duration::from_millis(100)))
        .await;
    assert!(
        matches!(gave_up, Err(LockError::Timeout { .. })),
        "{gave_up:?}"
    );
    leader.resign().await.unwrap();
    standby.await.unwrap().unwrap();
    observer.await.unwrap().unwrap();
    let expiring = a
        .campaign(&name("residue/expiring"), &me("a"), &no_wait(ttl))
        .await
        .unwrap();
    std::mem::forget(expiring);
    common::until_nothing_left(&mut h.raw(0).await, ttl).await;
    assert_eq!(b_client.tracked_waiter_lines(), 0);
    // Unsubscribes run in the background, and are long done.
    assert_eq!(b_client.tracked_wakeup_channels(), 0);
}

/// The election `x` is not the mutex `x`: both are held at once, and each one's
/// release leaves the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elections_are_a_namespace_of_their_own() {
    let h = common::start(1).await;
    let lock = RedisLock::connect(&h.url()).await.unwrap();
    let elections = lock.election();
    let x = name("x");
    let ttl = Duration::from_secs(10);
    let mutex = lock.lock().try_acquire(&x, &no_wait(ttl)).await.unwrap();
    let mutex = mutex.expect("a free mutex");
    let led = elections.try_campaign(&x, &me("a"), &no_wait(ttl)).await;
    let led = led
        .unwrap()
        .expect("the election x is free while the mutex x is held");
    assert!(lock
        .lock()
        .try_acquire(&x, &no_wait(ttl))
        .await
        .unwrap()
        .is_none());
    mutex.release().await.unwrap();
    let read = elections.leader(&x).await.unwrap().expect("still led");
    assert_eq!(read.term, led.term());
    led.resign().await.unwrap();
    assert_eq!(elections.leader(&x).await.unwrap(), None);
}

/// A record another program wrote under the election's name (another type) is a
/// typed error for every operation, never a panic or a leadership.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_key_is_a_typed_error() {
    let h = common::start(1).await;
    let elections = election(&h.url()).await;
    let mut raw = h.raw(0).await;
    let _: () = raw.set("{taken}:election", "not a record").await.unwrap();
    let taken = name("taken");
    let campaign = elections
        .try_campaign(&taken, &me("a"), &no_wait(Duration::from_secs(1)))
        .await;
    assert!(
        matches!(campaign, Err(LockError::Backend { .. })),
        "{campaign:?}"
    );
    let leader = elections.leader(&taken).await;
    assert!(
        matches!(leader, Err(LockError::Backend { .. })),
        "{leader:?}"
    );
    let value: String = raw.get("{taken}:election").await.unwrap();
    assert_eq!(value, "not a record");
}

/// Campaigns keep no queue: asking for arrival order is refused before the server is
/// touched, and nothing is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_campaigns_are_refused() {
    let h = common::start(1).await;
    let elections = election(&h.url()).await;
    let fifo = no_wait(Duration::from_secs(1)).with_order(WaitOrder::Fifo);
    let x = name("fifo");
    let refused = elections.campaign(&x, &me("a"), &fifo).await;
    assert!(
        matches!(refused, Err(LockError::Unsupported { .. })),
        "{refused:?}"
    );
    let refused = elections.try_campaign(&x, &me("a"), &fifo).await;
    assert!(
        matches!(refused, Err(LockError::Unsupported { .. })),
        "{refused:?}"
    );
    assert!(!elections.info().capabilities.election.fifo.is_supported());
    let mut raw = h.raw(0).await;
    let size: usize = redis::cmd("DBSIZE").query_async(&mut raw).await.unwrap();
    assert_eq!(size, 0);
}

/// Redlock refuses elections, saying why, in its capabilities and when asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_refuses_elections() {
    let h = common::start(3).await;
    let lock = RedisLock::connect(&h.url()).await.unwrap();
    let reason = match lock.lock().info().capabilities.election.offered {
        distlock_api::Capability::Unsupported(reason) => reason,
        other => panic!("Redlock reports elections {other:?}"),
    };
    assert!(reason.contains("consensus"), "{reason}");
    let campaign = lock
        .election()
        .try_campaign(&name("x"), &me("a"), &no_wait(Duration::from_secs(10)))
        .await;
    match campaign {
        Err(LockError::Unsupported { reason: why, .. }) => assert_eq!(why, reason),
        other => panic!("{other:?}"),
    }
}

/// A leader cut off from the server stops believing it leads by its validity
/// deadline, though it renews; a standby leads once the record expires, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_leader_is_lost_by_its_deadline_and_replaced() {
    let h = common::start(1).await;
    let (lock, proxies) = h.proxied_client().await;
    let leader_side = lock.election();
    let standby = election(&h.url()).await;
    let x = name("cut");
    let ttl = Duration::from_millis(600);
    let options = no_wait(ttl).with_auto_renew(AutoRenew::new());
    let leader = leader_side.campaign(&x, &me("a"), &options).await.unwrap();
    // Renewed past its first lease.
    tokio::time::sleep(ttl).await;
    assert_eq!(leader.state(), distlock_api::LeaseState::Held);
    proxies.iter().for_each(|p| p.cut());
    let cut_at = Instant::now();
    let valid_until = leader.valid_until();
    let lost = leader.lost();
    let won = tokio::spawn({
        let x = x.clone();
        async move {
            let won = standby
                .campaign(&x, &me("b"), &waiting(ttl, Duration::from_secs(10)))
                .await;
            (won, Instant::now())
        }
    });
    tokio::time::timeout(ttl + Duration::from_secs(1), lost)
        .await
        .expect("lost() fired");
    assert!(Instant::now() + Duration::from_millis(5) >= valid_until);
    let (won, won_at) = won.await.unwrap();
    let won = won.expect("the standby leads");
    assert!(
        won_at >= valid_until,
        "a second leader before the first's deadline"
    );
    assert!(
        won_at - cut_at <= ttl + Duration::from_secs(1),
        "the standby led {:?} after the cut",
        won_at - cut_at
    );
    assert!(won.term() > leader.term());
    won.resign().await.unwrap();
}

/// Percentiles of `samples` (sorted here): p50 and p99, in ms.
fn percentiles(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
        samples[i].as_secs_f64() * 1000.0
    };
    (at(0.50), at(0.99))
}

/// Failover times for docs/benchmarks.md, over `TRIALS` trials each: from a resign to
/// the waiting standby's campaign returning, and from a leader's crash (its
/// connection cut while it renews) to the standby leading. Printed; the bounds
/// asserted are loose (the machine is shared), the targets are in the README.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_times() {
    const TRIALS: usize = 25;
    let h = common::start(1).await;
    let standby = election(&h.url()).await;
    let mut raw = h.raw(0).await;
    let long = Duration::from_secs(30);

    let mut resign = Vec::new();
    let leader_side = election(&h.url()).await;
    for trial in 0..TRIALS {
        let x = name(&format!("resign/{trial}"));
        let leader = leader_side
            .campaign(&x, &me("a"), &no_wait(long))
            .await
            .unwrap();
        let waiter = tokio::spawn({
            let (standby, x) = (standby.clone(), x.clone());
            async move {
                let won = standby.campaign(&x, &me("b"), &waiting(long, long)).await;
                (won, Instant::now())
            }
        });
        until_exists(&mut raw, &format!("{{resign/{trial}}}:election:waiting")).await;
        let resigned_at = Instant::now();
        leader.resign().await.unwrap();
        let (won, won_at) = waiter.await.unwrap();
        resign.push(won_at - resigned_at);
        won.unwrap().resign().await.unwrap();
    }

    let ttl = Duration::from_millis(500);
    let (mut crash, mut past_expiry) = (Vec::new(), Vec::new());
    for trial in 0..TRIALS {
        let (lock, proxies) = h.proxied_client().await;
        let x = name(&format!("crash/{trial}"));
        let options = no_wait(ttl).with_auto_renew(AutoRenew::new());
        let leader = lock.election().campaign(&x, &me("a"), &options).await;
        let leader = leader.unwrap();
        let waiter = tokio::spawn({
            let (standby, x) = (standby.clone(), x.clone());
            async move {
                let won = standby.campaign(&x, &me("b"), &waiting(ttl, long)).await;
                (won, Instant::now())
            }
        });
        until_exists(&mut raw, &format!("{{crash/{trial}}}:election:waiting")).await;
        // Crash at a varying point of the renewal cycle.
        tokio::time::sleep(Duration::from_millis(17 * trial as u64 % 300)).await;
        proxies.iter().for_each(|p| p.cut());
        let crashed_at = Instant::now();
        // When the server drops the crashed leader's record (its last renewal + TTL).
        let left: i64 = raw
            .pttl(format!("{{crash/{trial}}}:election"))
            .await
            .unwrap();
        let expires_at = Instant::now() + Duration::from_millis(left.max(0) as u64);
        let (won, won_at) = waiter.await.unwrap();
        crash.push(won_at - crashed_at);
        past_expiry.push(won_at.saturating_duration_since(expires_at));
        drop(leader);
        won.unwrap().resign().await.unwrap();
    }

    let (resign_p50, resign_p99) = percentiles(&mut resign);
    let (crash_p50, crash_p99) = percentiles(&mut crash);
    let (past_p50, past_p99) = percentiles(&mut past_expiry);
    println!(
        "redis election failover over {TRIALS} trials: resign -> standby leads p50 {resign_p50:.1} ms, p99 {resign_p99:.1} ms; \
         crash (connection cut, TTL {} ms, auto-renew) -> standby leads p50 {crash_p50:.1} ms, p99 {crash_p99:.1} ms \
         (after the record expired: p50 {past_p50:.1} ms, p99 {past_p99:.1} ms)",
        ttl.as_millis()
    );
    assert!(resign_p50 < 200.0, "resign hand-off p50 {resign_p50} ms");
    let crash_bound = (ttl + Duration::from_secs(1)).as_secs_f64() * 1000.0;
    assert!(crash_p99 < crash_bound, "crash failover p99 {crash_p99} ms");
}
