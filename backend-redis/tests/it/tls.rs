//! `rediss://` against a real redis-server with TLS (feature `tls`).
#![cfg(feature = "tls")]

use std::process::Command;
use std::time::Duration;

use distlock_api::{LockKey, LockOptions, ReleaseOutcome};
use distlock_redis::RedisLock;
use distlock_test_servers::{RedisServer, RedisServerOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
        ])
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
    let tls_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut config = RedisServerOptions::default();
    for arg in [
        "--tls-port".to_owned(),
        tls_port.to_string(),
        "--tls-auth-clients".into(),
        "no".into(),
    ] {
        config.extra_args.push(arg);
    }
    for (flag, path) in [
        ("--tls-cert-file", &cert),
        ("--tls-key-file", &key),
        ("--tls-ca-cert-file", &cert),
    ] {
        config.extra_args.push(flag.to_owned());
        config.extra_args.push(path.display().to_string());
    }
    let _server = RedisServer::start_with(config)
        .await
        .expect("redis-server with TLS starts");

    let lock = RedisLock::connect(&format!("rediss://127.0.0.1:{tls_port}/#insecure"))
        .await
        .unwrap();
    let other = RedisLock::connect(&format!("rediss://127.0.0.1:{tls_port}/#insecure"))
        .await
        .unwrap();
    let k = LockKey::new("tls/one").unwrap();
    let options = LockOptions::new(Duration::from_secs(5));
    let guard = lock.lock().acquire(&k, &options).await.unwrap();
    assert!(other
        .lock()
        .try_acquire(&k, &options)
        .await
        .unwrap()
        .is_none());
    assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    assert!(other
        .lock()
        .try_acquire(&k, &options)
        .await
        .unwrap()
        .is_some());

    // Plain text to the TLS port fails with an error rather than hanging.
    let plain = tokio::time::timeout(
        Duration::from_secs(10),
        RedisLock::connect(&format!("redis://127.0.0.1:{tls_port}")),
    )
    .await
    .expect("a plain-text connect to a TLS port does not hang");
    assert!(plain.is_err());
}
