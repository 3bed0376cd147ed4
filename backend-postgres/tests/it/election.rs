//! Postgres elections beyond the kit: a dead leader's row never reads as leader, and
//! the failover times (resign, killed leader, silent leader) over many trials.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use distlock_api::{Candidate, LeaderElection, Leadership, LockKey, LockOptions, WaitPolicy};
use sha2::{Digest, Sha256};
use sqlx::PgConnection;
use tokio::time::Instant;

use common::{lock_entries, wait_for_entries, PgHarness};

const TTL: Duration = Duration::from_secs(60);

/// The election's advisory key, computed as the backend documents it.
fn election_hash(name: &LockKey) -> i64 {
    let mut hasher = Sha256::new();
    hasher.update(b"distlock-election\0");
    hasher.update(name.as_str().as_bytes());
    let digest = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

fn candidate(label: &str) -> Candidate {
    Candidate::new(label).expect("valid identity")
}

fn no_wait() -> LockOptions {
    LockOptions::new(TTL).with_wait(WaitPolicy::NoWait)
}

fn waiting(limit: Duration) -> LockOptions {
    LockOptions::new(TTL).with_wait(WaitPolicy::Timeout(limit))
}

/// The election's rows in the table, as `(candidate, term, pid)`.
async fn rows(raw: &mut PgConnection, name: &LockKey) -> Vec<(Vec<u8>, i64, i32)> {
    sqlx::query_as("SELECT candidate, term, pid FROM distlock.election WHERE name = $1")
        .bind(name.as_str())
        .fetch_all(raw)
        .await
        .expect("reads the election table")
}

async fn election(h: &PgHarness) -> Arc<dyn LeaderElection> {
    h.client().await.election()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_leaders_row_never_reads_as_leader() {
    let h = common::start().await;
    let mut raw = h.raw().await;
    let observer = election(&h).await;
    let name = LockKey::new("stale-row").expect("valid name");
    let hash = election_hash(&name);

    // A leader cut off silently: its row stays, and reads as leader exactly as long
    // as the server keeps its session (and so its lock).
    let (lock, proxy) = h.proxied_client().await;
    let a = lock.election();
    let leader = a
        .campaign(&name, &candidate("a"), &no_wait())
        .await
        .expect("a leads");
    let term_a = leader.term();
    let read = observer.leader(&name).await.expect("reads");
    assert!(
        read.as_ref()
            .is_some_and(|l| l.candidate.as_bytes() == b"a" && l.term == term_a),
        "{read:?}"
    );
    proxy.refuse_new(true);
    proxy.blackhole();
    let crashed_at = Instant::now();
    let bound = h.config.dead_holder_bound() + Duration::from_secs(5);
    loop {
        let read = observer.leader(&name).await.expect("reads");
        match read {
            Some(l) => {
                assert!(
                    l.candidate.as_bytes() == b"a" && l.term == term_a,
                    "read {l:?} while a's session lives"
                );
            }
            None => {
                // None only once the lock is gone (it never comes back here): never
                // while a's session holds it.
                let still = lock_entries(&mut raw, hash).await;
                assert!(
                    still.is_empty(),
                    "no leader read while pg_locks shows {still:?}"
                );
                break;
            }
        }
        assert!(
            crashed_at.elapsed() < bound,
            "the server kept the silent leader's session past {bound:?}"
        );
        tokio::time::sleep(common::POLL).await;
    }
    drop(leader);
    let stale = rows(&mut raw, &name).await;
    assert_eq!(stale.len(), 1, "the crashed leader's row stays: {stale:?}");
    assert_eq!(stale[0].1, term_a.get() as i64, "{stale:?}");
    for _ in 0..5 {
        let read = observer.leader(&name).await.expect("reads");
        assert!(
            read.is_none(),
            "the dead leader's stale row read as {read:?}"
        );
    }

    // The next leader overwrites the stale row.
    let b = election(&h).await;
    let second = b
        .campaign(&name, &candidate("b"), &no_wait())
        .await
        .expect("b leads the freed election");
    assert!(second.term() > term_a);
    let now = rows(&mut raw, &name).await;
    assert_eq!(now.len(), 1, "{now:?}");
    assert_eq!(
        (now[0].0.as_slice(), now[0].1),
        (&b"b"[..], second.term().get() as i64)
    );

    // A leader whose session the server ends (a killed process, pg_terminate_backend):
    // its row reads as no leader at once.
    let pid = now[0].2;
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&mut raw)
        .await
        .expect("terminates");
    assert!(terminated);
    wait_for_entries(
        &mut raw,
        hash,
        Duration::from_secs(5),
        "the terminated leader's lock ends",
        |e| e.is_empty(),
    )
    .await;
    let read = observer.leader(&name).await.expect("reads");
    assert!(read.is_none(), "a terminated leader read as {read:?}");
    assert_eq!(rows(&mut raw, &name).await.len(), 1);
    tokio::time::timeout(Duration::from_secs(10), second.lost())
        .await
        .expect("the terminated leader learns it lost");

    // A resign deletes the row: nothing stays behind.
    let c = election(&h).await;
    let third = c
        .campaign(&name, &candidate("c"), &no_wait())
        .await
        .expect("c leads");
    third.resign().await.expect("resigns");
    assert!(rows(&mut raw, &name).await.is_empty());
    assert!(observer.leader(&name).await.expect("reads").is_none());
}

/// Waits (bounded) until a candidate waits in the server's queue for `hash`.
async fn until_queued(raw: &mut PgConnection, hash: i64) {
    wait_for_entries(
        raw,
        hash,
        Duration::from_secs(10),
        "the standby waits in the server's queue",
        |e| e.iter().any(|(_, granted)| !granted),
    )
    .await;
}

/// A standby campaigning for `name` in the background: its leadership and when it won.
fn standby(
    election: Arc<dyn LeaderElection>,
    name: &LockKey,
    limit: Duration,
) -> tokio::task::JoinHandle<(Leadership, Instant)> {
    let name = name.clone();
    tokio::spawn(async move {
        let won = election
            .campaign(&name, &candidate("standby"), &waiting(limit))
            .await
            .expect("the standby leads");
        (won, Instant::now())
    })
}

fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort();
    let rank = ((samples.len() as f64 - 1.0) * q).round() as usize;
    samples[rank.min(samples.len() - 1)]
}

fn summary(what: &str, samples: &mut [Duration]) -> (Duration, Duration) {
    let (p50, p99) = (quantile(samples, 0.5), quantile(samples, 0.99));
    let max = samples.iter().max().copied().unwrap_or_default();
    println!(
        "failover {what}: {} trials, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        samples.len(),
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
        max.as_secs_f64() * 1e3
    );
    (p50, p99)
}

const TRIALS: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_after_resign_kill_and_silent_crash() {
    let h = common::start().await;
    let mut raw = h.raw().await;
    let (a, b) = (election(&h).await, election(&h).await);
    let slack = Duration::from_secs(1);

    // (a) Resign: from the call to the standby's campaign returning.
    let mut resign = Vec::new();
    for trial in 0..TRIALS {
        let name = LockKey::new(format!("failover-resign-{trial}")).expect("valid name");
        let leader = a
            .campaign(&name, &candidate("leader"), &no_wait())
            .await
            .expect("leads");
        let waiting = standby(b.clone(), &name, Duration::from_secs(30));
        until_queued(&mut raw, election_hash(&name)).await;
        let resigned_at = Instant::now();
        leader.resign().await.expect("resigns");
        let (won, won_at) = waiting.await.expect("the standby task");
        resign.push(won_at - resigned_at);
        won.resign().await.expect("resigns");
    }
    let (_, p99) = summary("on resign", &mut resign);
    assert!(p99 <= slack, "resign failover p99 {p99:?} above {slack:?}");

    // (b) A killed leader (its connections reset, as by a dead process), and (c) a
    // silent one (its connections go quiet, as by a dead host): from the crash to the
    // standby's campaign returning.
    for silent in [false, true] {
        let mut crash = Vec::new();
        for trial in 0..TRIALS {
            let name =
                LockKey::new(format!("failover-crash-{silent}-{trial}")).expect("valid name");
            let (lock, proxy) = h.proxied_client().await;
            let leader = lock
                .election()
                .campaign(&name, &candidate("leader"), &no_wait())
                .await
                .expect("leads");
            let waiting = standby(b.clone(), &name, Duration::from_secs(60));
            until_queued(&mut raw, election_hash(&name)).await;
            let crashed_at = Instant::now();
            if silent {
                proxy.refuse_new(true);
                proxy.blackhole();
            } else {
                proxy.cut();
            }
            let (won, won_at) = waiting.await.expect("the standby task");
            crash.push(won_at - crashed_at);
            assert!(won.term() > leader.term());
            won.resign().await.expect("resigns");
            drop(leader);
        }
        let (what, bound) = if silent {
            ("on a silent leader", h.config.dead_holder_bound() + slack)
        } else {
            ("on a killed leader", slack)
        };
        let (_, p99) = summary(what, &mut crash);
        assert!(p99 <= bound, "failover {what}: p99 {p99:?} above {bound:?}");
    }
}
