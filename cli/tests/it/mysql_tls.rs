//! The CLI over a MySQL/MariaDB TLS URL (`ssl-mode=verify_identity` with the server's
//! CA): the conformance table passes, `status` reports a lock this test holds, and a
//! wrong CA is a one-line configuration error (exit code 2). The binary has every TLS
//! backend built in, so rustls has two crypto providers and one must be installed
//! before a TLS session opens.
#![cfg(feature = "conformance")]

use std::process::{Command, Output};
use std::time::Duration;

use distlock::{LockKey, LockOptions};
use distlock_test_servers::MariaDbTlsServer;

fn distlock(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_distlock"))
        .args(args)
        .env_remove("DISTLOCK_BACKEND")
        .output()
        .expect("the distlock binary runs")
}

fn verified_url(server: &MariaDbTlsServer, ca: &std::path::Path) -> String {
    server.url(&format!("ssl-mode=verify_identity&ssl-ca={}", ca.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_and_status_work_over_a_mysql_tls_url() {
    let server = MariaDbTlsServer::start().await.unwrap_or_else(|e| {
        panic!("could not start MariaDB with TLS (run scripts/install-deps.sh): {e}")
    });
    let url = verified_url(&server, &server.tls().ca_cert());

    let run = distlock(&["conformance", "--backend", &url]);
    let table = String::from_utf8_lossy(&run.stdout);
    assert_eq!(
        run.status.code(),
        Some(0),
        "{table}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let last = table.lines().last().unwrap_or_default();
    assert!(last.contains(" passed, 0 failed"), "{table}");

    let locks = distlock::connect(&url)
        .await
        .expect("connects over TLS")
        .lock();
    let key = LockKey::new("tls/status").expect("key");
    let guard = locks
        .acquire(&key, &LockOptions::new(Duration::from_secs(60)))
        .await
        .expect("acquires");
    let out = distlock(&["status", "--backend", &url, "tls/status", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let held: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(held["held"], true, "{held}");
    assert_eq!(held["backend"], "mysql", "{held}");
    // verify_ca takes the driver's other verifier, which asks rustls for the process's
    // provider: without one installed, this panicked.
    let chain_only = server.url(&format!(
        "ssl-mode=verify_ca&ssl-ca={}",
        server.tls().ca_cert().display()
    ));
    let out = distlock(&["status", "--backend", &chain_only, "tls/status", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let held: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(held["held"], true, "{held}");
    guard.release().await.expect("releases");
    let out = distlock(&["status", "--backend", &url, "tls/status", "--json"]);
    let free: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(free["held"], false, "{free}");

    let wrong = verified_url(&server, &server.tls().other_ca_cert());
    let out = distlock(&["status", "--backend", &wrong, "tls/status"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("TLS failed") && !stderr.contains("panicked"),
        "{stderr}"
    );
}
