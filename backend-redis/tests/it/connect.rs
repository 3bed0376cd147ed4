//! Connecting: what each failure says (the address, the server's actual refusal, no
//! password), Redlock with a minority down at start-up, and one server listed twice.

use crate::common;

use std::time::Duration;

use distlock_api::{LockError, LockKey, LockOptions, WaitPolicy};
use distlock_redis::{KeyNames, RedisLock};
use distlock_test_servers::FaultProxy;
use distlock_test_servers::ServerControl;
use distlock_test_servers::{RedisServer, RedisServerOptions};
use redis::AsyncCommands;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::time::Instant;

const PASSWORD: &str = "correct-horse-4411";
const WRONG: &str = "not-the-password-9073";

fn key(name: &str) -> LockKey {
    LockKey::new(format!("connect/{name}")).unwrap()
}

fn options() -> LockOptions {
    LockOptions::new(Duration::from_secs(10)).with_wait(WaitPolicy::Timeout(Duration::from_secs(5)))
}

async fn server_with(config: RedisServerOptions) -> RedisServer {
    RedisServer::start_with(config)
        .await
        .unwrap_or_else(|e| panic!("could not start redis-server (run scripts/test.sh): {e}"))
}

async fn server() -> RedisServer {
    server_with(RedisServerOptions::default()).await
}

/// The error of connecting to `url`, which must fail.
async fn refusal(url: &str) -> LockError {
    match RedisLock::connect(url).await {
        Ok(_) => panic!("connecting to {url} succeeded"),
        Err(error) => error,
    }
}

/// Asserts `error` is a configuration error whose message names `address` and says
/// `what`, and never shows `secret`.
fn assert_config(error: &LockError, address: &str, what: &str, secret: &str) {
    let message = error.to_string();
    assert!(
        matches!(error, LockError::Config { .. }),
        "not a configuration error: {error:?}"
    );
    assert!(message.contains(address), "no address in: {message}");
    assert!(message.contains(what), "no {what:?} in: {message}");
    assert!(!message.contains(secret), "password leaked: {message}");
    assert!(!message.contains("RESP3"), "blames the version: {message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_say_authentication_failed() {
    let mut config = RedisServerOptions::default();
    config.password = Some(PASSWORD.to_owned());
    config.extra_args = [
        "--user",
        "alice",
        "on",
        &format!(">{PASSWORD}"),
        "~*",
        "&*",
        "+@all",
    ]
    .map(String::from)
    .to_vec();
    let s = server_with(config).await;
    let address = format!("127.0.0.1:{}", s.port());
    for url in [
        format!("redis://:{WRONG}@{address}"),
        format!("redis://{address}"),
        format!("redis://bob:{WRONG}@{address}"),
        format!("redis://alice:{WRONG}@{address}"),
    ] {
        let error = refusal(&url).await;
        assert_config(&error, &address, "authentication failed", WRONG);
    }
    // Right credentials, default user and ACL user, work; a wrong one never shows.
    for url in [
        format!("redis://:{PASSWORD}@{address}"),
        format!("redis://alice:{PASSWORD}@{address}"),
    ] {
        let lock = RedisLock::connect(&url)
            .await
            .expect("right password connects");
        let guard = lock.lock().acquire(&key("auth"), &options()).await.unwrap();
        guard.release().await.unwrap();
    }
    // Redlock: the refusal of one node fails the connect, naming that node.
    let redlock = format!(
        "redis+redlock://:{WRONG}@{address},127.0.0.1:{},127.0.0.1:{}",
        s.port() + 1,
        s.port() + 2
    );
    let error = refusal(&redlock).await;
    assert_config(&error, &address, "authentication failed", WRONG);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_database_says_so() {
    let s = server().await;
    let address = format!("127.0.0.1:{}", s.port());
    let error = refusal(&format!("redis://{address}/999")).await;
    assert_config(&error, &address, "no such database", "\0");
    assert!(error.to_string().contains("999"), "{error}");
}

/// A loopback listener that answers every connection with `reply` and closes it.
async fn impostor(reply: &'static [u8]) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let _ = stream.write_all(reply).await;
            let _ = stream.shutdown().await;
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_that_is_not_redis_says_so() {
    for reply in [
        &b"SSH-2.0-OpenSSH_9.2\r\n\x00\x01garbage"[..],
        &b"HTTP/1.1 400 Bad Request\r\n\r\n"[..],
        &b""[..],
    ] {
        let port = impostor(reply).await;
        let address = format!("127.0.0.1:{port}");
        let error = refusal(&format!("redis://:{WRONG}@{address}")).await;
        let message = error.to_string();
        assert!(message.contains(&address), "no address in: {message}");
        assert!(message.contains("not a Redis server"), "{message}");
        assert!(!message.contains(WRONG), "password leaked: {message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_errors_name_the_address() {
    // A port with nothing listening: single node, and Redlock with a majority down.
    let closed = RedisServer::start().await.unwrap();
    let port = closed.port();
    drop(closed);
    let address = format!("127.0.0.1:{port}");
    let error = refusal(&format!("redis://:{WRONG}@{address}")).await;
    assert!(matches!(error, LockError::Connection { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains(&address), "{message}");
    assert!(!message.contains(WRONG), "{message}");

    let up = server().await;
    let redlock = format!(
        "redis+redlock://:{WRONG}@127.0.0.1:{},{address},127.0.0.1:{}",
        up.port(),
        port + 1
    );
    let error = refusal(&redlock).await;
    assert!(matches!(error, LockError::Connection { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("1 of 3"), "{message}");
    assert!(message.contains(&address), "{message}");
    assert!(
        message.contains(&format!("127.0.0.1:{}", port + 1)),
        "{message}"
    );
    assert!(!message.contains(WRONG), "{message}");
}

/// Whether every server in `ports` stores `key`'s lock.
async fn on_every_node(ports: &[u16], key: &LockKey) -> bool {
    let names = KeyNames::for_key(key);
    for port in ports {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
        let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
            return false;
        };
        let exists: bool = conn.exists(&names.lock).await.unwrap_or(false);
        if !exists {
            return false;
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_starts_with_a_minority_down_and_the_node_joins_when_back() {
    let h = common::start(3).await;
    h.servers.lock().await[2].kill();
    let started = Instant::now();
    let lock = RedisLock::connect(&h.url())
        .await
        .expect("a majority answers, so the connect succeeds");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // Acquires work, and do not spend a connect timeout on the missing node each time.
    for round in 0..5 {
        let began = Instant::now();
        let guard = lock
            .lock()
            .acquire(&key("minority"), &options())
            .await
            .unwrap();
        assert!(
            began.elapsed() < Duration::from_millis(1500),
            "acquire {round} took {:?}",
            began.elapsed()
        );
        guard.release().await.unwrap();
    }
    // A waiter is handed the lock when the holder releases, and leaves nothing behind.
    let holder = lock
        .lock()
        .acquire(&key("handoff"), &options())
        .await
        .unwrap();
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.lock().acquire(&key("handoff"), &options()).await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while lock.tracked_wakeup_channels() == 0 {
        assert!(Instant::now() < deadline, "the waiter never waited");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    holder.release().await.unwrap();
    let granted = waiter.await.unwrap().expect("the waiter is granted");
    granted.release().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while lock.tracked_wakeup_channels() != 0 {
        assert!(Instant::now() < deadline, "wake-up channels left behind");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Back: the node joins, and new locks are on all three.
    h.servers.lock().await[2].restart().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let guard = lock
            .lock()
            .acquire(&key("joined"), &options())
            .await
            .unwrap();
        let everywhere = on_every_node(&h.ports, &key("joined")).await;
        guard.release().await.unwrap();
        if everywhere {
            break;
        }
        assert!(Instant::now() < deadline, "the restarted node never joined");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_under_two_names_is_refused() {
    let h = common::start(2).await;
    let (p, q) = (h.ports[0], h.ports[1]);
    // The same socket address after resolution.
    for url in [
        format!("redis+redlock://127.0.0.1:{p},localhost:{p},127.0.0.1:{q}"),
        format!("redis+redlock://localhost:{p},127.0.0.1:{q},127.0.0.1:{p}"),
    ] {
        let error = refusal(&url).await;
        assert!(
            matches!(error, LockError::Config { .. }),
            "{url}: {error:?}"
        );
        assert!(error.to_string().contains("same server"), "{error}");
    }
    // Different addresses, one server: told apart by its run_id.
    let alias = FaultProxy::start(([127, 0, 0, 1], p).into()).await.unwrap();
    let a = alias.local_addr().port();
    let error = refusal(&format!(
        "redis+redlock://127.0.0.1:{p},127.0.0.1:{q},127.0.0.1:{a}"
    ))
    .await;
    assert!(matches!(error, LockError::Config { .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("same server") && message.contains("run_id"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_node_that_is_another_nodes_server_never_counts() {
    let h = common::start(2).await;
    let (p, q) = (h.ports[0], h.ports[1]);
    // The third node is the first server again, behind a proxy that is down at start-up.
    let alias = FaultProxy::start(([127, 0, 0, 1], p).into()).await.unwrap();
    alias.refuse_new(true);
    let a = alias.local_addr().port();
    let lock = RedisLock::connect(&format!(
        "redis+redlock://127.0.0.1:{p},127.0.0.1:{q},127.0.0.1:{a}"
    ))
    .await
    .expect("two distinct servers answer");
    alias.refuse_new(false);
    // With the second server gone, only the first is left, however it is spelled: no
    // majority. Poll until the late node's join attempt has been refused.
    h.servers.lock().await[1].kill();
    let once = LockOptions::new(Duration::from_secs(10));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match lock.lock().try_acquire(&key("twin"), &once).await {
            Ok(Some(guard)) => panic!("granted by one server counted twice: {guard:?}"),
            Ok(None) => panic!("held, though nobody else locks it"),
            Err(error) if error.to_string().contains("same server") => break,
            Err(error) => {
                assert!(Instant::now() < deadline, "no duplicate found: {error}");
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
