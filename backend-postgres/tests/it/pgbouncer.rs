//! Postgres behind a real PgBouncer: the session design refuses a transaction pooler
//! with an error naming the URL form that works there, that form (`pool_mode=transaction`)
//! works through it, and in a small session pool the session design stays within its
//! documented connection budget.

use crate::pooler;

use std::time::Duration;

use std::net::SocketAddr;

use distlock_api::{with_lock, LockError, LockKey, LockOptions, WaitPolicy};
use distlock_postgres::{PostgresConfig, PostgresLock, PostgresXactLock};
use distlock_test_servers::{FaultProxy, PoolMode};
use sqlx::{Connection, PgConnection};
use tokio::time::Instant;

fn key(name: &str) -> LockKey {
    LockKey::new(format!("pgbouncer/{name}")).unwrap()
}

/// Advisory locks held on the server, by anyone.
async fn advisory_locks(pg_port: u16) -> i64 {
    let mut raw = PgConnection::connect(&pooler::url_for(pg_port))
        .await
        .expect("a direct connection");
    sqlx::query_scalar("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
        .fetch_one(&mut raw)
        .await
        .expect("pg_locks")
}

fn assert_names_the_cure(error: &LockError) {
    let LockError::Config { message, .. } = error else {
        panic!("expected a Config error, got {error:?}");
    };
    for words in ["PgBouncer", "transaction", "pool_mode=transaction"] {
        assert!(message.contains(words), "{words:?} missing from: {message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_design_refuses_a_transaction_pooler() {
    let pg = pooler::postgres().await;
    let bouncer = pooler::bouncer(&pg, PoolMode::Transaction, 4).await;
    let url = bouncer.url();
    // One client at a time, and several at once.
    for _ in 0..3 {
        let refused = PostgresLock::connect(&url).await.expect_err("refused");
        assert_names_the_cure(&refused);
    }
    let at_once: Vec<_> = (0..6)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { PostgresLock::connect(&url).await })
        })
        .collect();
    for attempt in at_once {
        let refused = attempt.await.expect("joined").expect_err("refused");
        assert_names_the_cure(&refused);
    }
    // Never a grant: nothing was locked on the server.
    assert_eq!(advisory_locks(pg.port()).await, 0);
    // The URL form the error names works through the same pooler.
    let client = distlock_postgres::connect(&format!("{url}?pool_mode=transaction"))
        .await
        .expect("pool_mode=transaction connects through a transaction pooler");
    let guard = client
        .lock()
        .try_acquire(&key("refusal"), &LockOptions::new(Duration::from_secs(10)))
        .await
        .expect("try")
        .expect("granted");
    assert_eq!(advisory_locks(pg.port()).await, 1);
    guard.release().await.expect("released");
    assert_eq!(advisory_locks(pg.port()).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_design_runs_straight_to_the_server_and_through_a_session_pool() {
    let pg = pooler::postgres().await;
    let bouncer = pooler::bouncer(&pg, PoolMode::Session, 4).await;
    for url in [pooler::url_for(pg.port()), bouncer.url()] {
        let client = PostgresLock::connect(&url).await.expect("connects");
        let guard = client
            .lock()
            .try_acquire(&key("session"), &LockOptions::new(Duration::from_secs(10)))
            .await
            .expect("try")
            .expect("granted");
        guard.release().await.expect("released");
    }
}

/// The transaction-pooling design holds one server connection per held lock and per
/// waiter for their lives, one more for one round trip per grant (its fencing token),
/// and none when idle: a holder and a waiter on a pool of 4 leave a third client room
/// to take and release locks, many times over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_design_takes_one_server_connection_per_lock_and_waiter() {
    let pg = pooler::postgres().await;
    let bouncer = pooler::bouncer(&pg, PoolMode::Transaction, 4).await;
    let url = pooler::transaction_url(bouncer.port());
    let options = LockOptions::new(Duration::from_secs(30));
    let a = PostgresXactLock::connect(&url).await.expect("connects");
    let b = PostgresXactLock::connect(&url).await.expect("connects");
    let held = a
        .lock()
        .try_acquire(&key("one"), &options)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.held_count(), 1);
    let waiter = {
        let lock = b.lock();
        let options = options
            .clone()
            .with_wait(WaitPolicy::Timeout(Duration::from_secs(20)));
        tokio::spawn(async move { lock.acquire(&key("one"), &options).await })
    };
    let c = PostgresXactLock::connect(&url).await.expect("connects");
    let started = Instant::now();
    for i in 0..20 {
        let token = with_lock(
            c.lock().as_ref(),
            &key(&format!("c{i}")),
            &options,
            |token| async move { token },
        )
        .await
        .expect("the third client's lock");
        assert!(token.is_some());
    }
    // Without queueing at the pooler, 20 grants and releases take well under a second.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    held.release().await.expect("released");
    let handed = waiter
        .await
        .expect("joined")
        .expect("the waiter is granted");
    handed.release().await.expect("released");
    assert_eq!(advisory_locks(pg.port()).await, 0);
}

/// With a session pool of 4 and three clients each holding a 1 s critical section on
/// one key, all three finish within 4 s of the first start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_clients_share_a_session_pool_of_four() {
    let pg = pooler::postgres().await;
    let bouncer = pooler::bouncer(&pg, PoolMode::Session, 4).await;
    let url = bouncer.url();
    let started = Instant::now();
    let runs: Vec<_> = (0..3)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let client = PostgresLock::connect(&url).await?;
                let options = LockOptions::new(Duration::from_secs(30))
                    .with_wait(WaitPolicy::Timeout(Duration::from_secs(10)));
                let guard = client.lock().acquire(&key("pool4"), &options).await?;
                // The critical section itself.
                tokio::time::sleep(Duration::from_secs(1)).await;
                guard.release().await?;
                drop(client);
                Ok::<_, LockError>(started.elapsed())
            })
        })
        .collect();
    let mut finished = Vec::new();
    for run in runs {
        finished.push(run.await.expect("joined").expect("each client finishes"));
    }
    finished.sort();
    eprintln!("finished after {finished:?}");
    assert!(
        finished[2] < Duration::from_secs(4),
        "three 1 s critical sections through a pool of 4 took {finished:?}"
    );
}

/// A wait's bound covers the time queued for a server connection, and the error says
/// that is what it waited for: with a session pool of 2, one client holding the key
/// and another's shared session in it, the other's wait finds no connection to wait in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_queued_for_a_connection_ends_at_its_bound_saying_so() {
    let pg = pooler::postgres().await;
    let bouncer = pooler::bouncer(&pg, PoolMode::Session, 2).await;
    let url = bouncer.url();
    let options = LockOptions::new(Duration::from_secs(30));
    let a = PostgresLock::connect(&url).await.expect("connects");
    let held = a
        .lock()
        .try_acquire(&key("queued"), &options)
        .await
        .unwrap()
        .unwrap();
    let b = PostgresLock::connect(&url).await.expect("connects");
    let wait = Duration::from_millis(1500);
    let started = Instant::now();
    let error = b
        .lock()
        .acquire(
            &key("queued"),
            &options.clone().with_wait(WaitPolicy::Timeout(wait)),
        )
        .await
        .expect_err("no connection to wait in");
    let took = started.elapsed();
    assert!(
        took < wait + Duration::from_secs(1),
        "gave up after {took:?}"
    );
    let text = error.to_string();
    assert!(
        text.contains("waited") && text.contains("session"),
        "the error does not say what it waited for: {text}"
    );
    held.release().await.expect("released");
}

/// Behind a session pooler (which drops the start-up settings), the sessions still run
/// with their idle timeout: a holder cut off silently loses its lock on the server
/// within the session timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_holder_behind_a_session_pool_is_freed_within_the_session_timeout() {
    let pg = pooler::postgres().await;
    let bouncer = pooler::bouncer(&pg, PoolMode::Session, 4).await;
    let proxy = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], bouncer.port())))
        .await
        .expect("proxy");
    let mut config = PostgresConfig::default();
    config.session_timeout = Duration::from_secs(1);
    let client = PostgresLock::connect_with(&pooler::url_for(proxy.local_addr().port()), config)
        .await
        .expect("connects");
    let _held = client
        .lock()
        .try_acquire(&key("silent"), &LockOptions::new(Duration::from_secs(60)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(advisory_locks(pg.port()).await, 1);
    proxy.refuse_new(true);
    proxy.blackhole();
    let cut = Instant::now();
    // pg_locks changes only through other sessions: poll it.
    while advisory_locks(pg.port()).await != 0 {
        assert!(
            cut.elapsed() < Duration::from_secs(8),
            "the lock outlived its silent holder's session timeout by far"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
