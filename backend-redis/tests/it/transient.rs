//! The server's own "try again" replies are retryable: a server busy running a script
//! answers `BUSY`, which is a `LockError::Transient`, and an acquire that may wait
//! keeps retrying it instead of failing at once.

use std::time::Duration;

use distlock_api::{LockError, LockKey, LockOptions, WaitPolicy};
use distlock_redis::RedisLock;
use distlock_test_servers::RedisServer;
use tokio::time::{sleep, Instant};

const PATIENCE: Duration = Duration::from_secs(20);

/// Runs `command` on a fresh connection; the server's error if it refuses.
async fn run(url: &str, command: &mut redis::Cmd) -> Result<redis::Value, redis::RedisError> {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await?;
    command.query_async(&mut conn).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_server_is_transient_and_a_waiting_acquire_retries_it() {
    let server = RedisServer::start()
        .await
        .unwrap_or_else(|e| panic!("could not start redis-server (run scripts/test.sh): {e}"));
    let url = server.url();
    let lock = RedisLock::connect(&url).await.unwrap();
    let key = LockKey::new("transient/busy").unwrap();
    let ttl = Duration::from_secs(10);
    // Warm up: the lock's scripts are loaded before the server turns busy.
    lock.lock()
        .acquire(&key, &LockOptions::new(ttl))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    // A script that never ends makes the server answer BUSY after 50 ms.
    run(
        &url,
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("busy-reply-threshold")
            .arg(50),
    )
    .await
    .unwrap();
    let looping = url.clone();
    let script = tokio::spawn(async move {
        run(&looping, redis::cmd("EVAL").arg("while true do end").arg(0)).await
    });
    let deadline = Instant::now() + PATIENCE;
    loop {
        match run(&url, &mut redis::cmd("PING")).await {
            Err(e) if e.code() == Some("BUSY") => break,
            _ => {
                assert!(Instant::now() < deadline, "the server never turned busy");
                sleep(Duration::from_millis(20)).await;
            }
        }
    }

    // One try: the refusal is typed as temporary.
    let refused = lock
        .lock()
        .try_acquire(&key, &LockOptions::new(ttl))
        .await
        .expect_err("a busy server granted a lock");
    assert!(
        matches!(refused, LockError::Transient { .. }) && refused.is_retryable(),
        "BUSY is not a retryable transient error: {refused:?}"
    );
    assert!(refused.to_string().contains("BUSY"), "{refused}");

    // A wait keeps retrying until it runs out, rather than failing on the first BUSY.
    let wait = Duration::from_secs(1);
    let started = Instant::now();
    let gave_up = lock
        .lock()
        .acquire(
            &key,
            &LockOptions::new(ttl).with_wait(WaitPolicy::Timeout(wait)),
        )
        .await
        .expect_err("a busy server granted a lock");
    assert!(
        started.elapsed() >= wait,
        "the acquire gave up after {:?}, before its wait of {wait:?}: {gave_up:?}",
        started.elapsed()
    );
    assert!(gave_up.is_retryable(), "{gave_up:?}");

    // Once the script is killed, the server serves again and the key is free.
    run(&url, redis::cmd("SCRIPT").arg("KILL")).await.unwrap();
    assert!(
        script.await.unwrap().is_err(),
        "the killed script reported success"
    );
    let guard = lock
        .lock()
        .acquire(
            &key,
            &LockOptions::new(ttl).with_wait(WaitPolicy::Timeout(PATIENCE)),
        )
        .await
        .expect("the key is free once the server is no longer busy");
    guard.release().await.unwrap();
}
