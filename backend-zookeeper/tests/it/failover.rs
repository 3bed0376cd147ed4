//! Election failover on a real standalone ZooKeeper, measured for docs/benchmarks.md:
//! (a) a leader resigns → the waiting standby's campaign returns; (b) the leader's
//! client is cut off (a crashed process) → the standby leads, once the server expired
//! the leader's session: on the shared server (200 ms tick, as every test) and on one
//! with a 50 ms tick, since the server checks expiry once a tick. Prints p50/p99 (run
//! with `--nocapture`) and checks the bounds.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use distlock_api::{Candidate, LeaderElection, LockKey, LockOptions, WaitPolicy};
use tokio::time::{timeout, Instant};

use common::{direct, proxied, raw, shared_port, wait_children, SESSION_TIMEOUT, TICK};
use distlock_test_servers::ZooKeeperServer;

const RESIGN_TRIALS: usize = 50;
const CRASH_TRIALS: usize = 20;

fn key(name: &str, trial: usize) -> LockKey {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    LockKey::new(format!("failover/{name}/{nanos:08x}/{trial}")).unwrap()
}

fn options(wait: WaitPolicy) -> LockOptions {
    LockOptions::new(Duration::from_secs(30)).with_wait(wait)
}

/// The `q`-quantile of `samples` (nearest rank).
fn quantile(samples: &[Duration], q: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn report(what: &str, samples: &[Duration]) -> String {
    format!(
        "{what}: n={} p50={:.1} ms p99={:.1} ms max={:.1} ms",
        samples.len(),
        quantile(samples, 0.5).as_secs_f64() * 1e3,
        quantile(samples, 0.99).as_secs_f64() * 1e3,
        quantile(samples, 1.0).as_secs_f64() * 1e3,
    )
}

/// A standby waiting to lead `k` through `b`: its campaign's outcome and when it came.
fn standby(
    b: &Arc<dyn LeaderElection>,
    k: &LockKey,
) -> tokio::task::JoinHandle<(
    Result<distlock_api::Leadership, distlock_api::LockError>,
    Instant,
)> {
    let (b, k) = (b.clone(), k.clone());
    tokio::spawn(async move {
        let me = Candidate::new("b").unwrap();
        let won = b
            .campaign(
                &k,
                &me,
                &options(WaitPolicy::Timeout(Duration::from_secs(30))),
            )
            .await;
        (won, Instant::now())
    })
}

/// `CRASH_TRIALS` crashes of a leader on the server at `port` (whose tick is `tick`):
/// how long after the cut the standby led, and how long past the crashed leader's
/// validity deadline.
async fn crash_trials(port: u16, tick: Duration) -> (Vec<Duration>, Vec<Duration>) {
    let zk_raw = raw(port).await;
    let b = direct(port, SESSION_TIMEOUT).await.election();
    let me_a = Candidate::new("a").unwrap();
    let mut crashes = Vec::new();
    let mut past_validity = Vec::new();
    for trial in 0..CRASH_TRIALS {
        let k = key("crash", trial);
        let (crashing, proxy) = proxied(port, SESSION_TIMEOUT, |c| c).await;
        let dir = crashing.election_path(&k);
        let leader = crashing
            .election()
            .campaign(&k, &me_a, &options(WaitPolicy::NoWait))
            .await
            .unwrap();
        let waiting = standby(&b, &k);
        wait_children(&zk_raw, &dir, 2, Duration::from_secs(10)).await;
        let cut_at = Instant::now();
        proxy.cut();
        let (won, won_at) = timeout(Duration::from_secs(30), waiting)
            .await
            .expect("the standby leads after the crash")
            .unwrap();
        let won = won.unwrap();
        // The crashed leader's own deadline, as it stood when it was cut off.
        let valid_until = leader.valid_until();
        assert!(
            won_at >= valid_until,
            "the standby led {:?} before the crashed leader's validity ended",
            valid_until - won_at
        );
        let failover = won_at - cut_at;
        assert!(
            failover <= SESSION_TIMEOUT + 2 * tick + Duration::from_secs(1),
            "failover {failover:?} beyond the session timeout bound"
        );
        crashes.push(failover);
        past_validity.push(won_at - valid_until);
        assert!(won.term() > leader.term());
        won.resign().await.unwrap();
        drop(leader);
        drop(crashing);
    }
    (crashes, past_validity)
}

fn report_crashes(tick: Duration, (crashes, past_validity): &(Vec<Duration>, Vec<Duration>)) {
    println!(
        "{}\n{}",
        report(
            &format!(
                "crash (connection cut, session {SESSION_TIMEOUT:?}, tick {tick:?}) -> standby leads"
            ),
            crashes
        ),
        report(
            &format!("crash (tick {tick:?}): standby leads, past the leader's validity deadline"),
            past_validity
        ),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_failover_after_resign_and_after_a_crash() {
    let port = shared_port();
    let zk_raw = raw(port).await;
    let a_lock = direct(port, SESSION_TIMEOUT).await;
    let a = a_lock.election();
    let b = direct(port, SESSION_TIMEOUT).await.election();
    let me_a = Candidate::new("a").unwrap();

    // (a) Resign → the standby, already waiting on its predecessor, leads.
    let mut resigns = Vec::new();
    for trial in 0..RESIGN_TRIALS {
        let k = key("resign", trial);
        let dir = a_lock.election_path(&k);
        let leader = a
            .campaign(&k, &me_a, &options(WaitPolicy::NoWait))
            .await
            .unwrap();
        let waiting = standby(&b, &k);
        wait_children(&zk_raw, &dir, 2, Duration::from_secs(10)).await;
        let resigned_at = Instant::now();
        leader.resign().await.unwrap();
        let (won, won_at) = timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the standby leads after the resign")
            .unwrap();
        resigns.push(won_at - resigned_at);
        won.unwrap().resign().await.unwrap();
    }
    println!("{}", report("resign -> standby leads", &resigns));
    // Generous for a noisy two-core machine; the figures printed are what counts.
    let resign_p50 = quantile(&resigns, 0.5);
    assert!(
        resign_p50 <= Duration::from_millis(100),
        "resign hand-off p50 {resign_p50:?}"
    );

    // (b) The leader's connection is cut → its session expires → the standby leads.
    report_crashes(TICK, &crash_trials(port, TICK).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_failover_after_a_crash_with_a_50ms_tick() {
    let tick = Duration::from_millis(50);
    let mut server_options = common::server_config();
    server_options.tick_time_ms = 50;
    let server = ZooKeeperServer::start_with(server_options)
        .await
        .unwrap_or_else(|e| panic!("could not start ZooKeeper: {e}"));
    report_crashes(tick, &crash_trials(server.port(), tick).await);
}
