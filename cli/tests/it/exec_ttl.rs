//! `distlock exec --ttl`: the documented minimum, 250ms, works on real backends and one
//! below it is refused naming it (issue 18, item 5); `--help` says, backend by backend, how
//! long a killed or frozen distlock keeps the lock (issue 20, item 2).

use std::process::{Command, Output};

use distlock_test_servers::{skip_or_panic, RedisServer};

/// `exec --verbose --ttl TTL` of a command that outlasts a 250 ms lease.
fn exec(url: &str, ttl: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_distlock"))
        .env_remove("DISTLOCK_BACKEND")
        .args(["exec", "--verbose", "--backend", url, "--ttl", ttl])
        .args(["exec-ttl/minimum", "--", "sleep", "0.4"])
        .output()
        .expect("the distlock binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `--ttl 250ms`, exec's minimum, holds the lock through renewals while the command
/// runs and exits with its code; `--ttl 249ms` (and the library's own minimum, 10ms,
/// which exec used to name and then refuse) is a one-line usage error naming 250ms.
fn the_minimum_ttl_works_and_one_below_is_refused(url: &str) {
    let out = exec(url, "250ms");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let renewals: u64 = stderr
        .split_whitespace()
        .find_map(|field| field.strip_prefix("renewals="))
        .and_then(|n| n.parse().ok())
        .expect("the summary's renewals=N");
    assert!(renewals >= 1, "the lease was renewed: {stderr}");

    for below in ["249ms", "10ms", "9ms"] {
        let out = exec(url, below);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{below}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with("error: "), "{stderr}");
        assert!(stderr.contains("minimum of 250ms"), "{below}: {stderr}");
    }
}

#[test]
fn minimum_ttl_on_the_file_backend() {
    let dir = tempfile::tempdir().unwrap();
    the_minimum_ttl_works_and_one_below_is_refused(&format!("file://{}", dir.path().display()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minimum_ttl_on_redis() {
    let server = match RedisServer::start().await {
        Ok(server) => server,
        Err(e) => return skip_or_panic("minimum_ttl_on_redis", &e),
    };
    let url = server.url();
    tokio::task::spawn_blocking(move || the_minimum_ttl_works_and_one_below_is_refused(&url))
        .await
        .unwrap();
}

#[test]
fn ttl_help_says_what_it_bounds_on_each_backend() {
    let out = Command::new(env!("CARGO_BIN_EXE_distlock"))
        .args(["exec", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    // Clap wraps help text to the terminal: compare with whitespace collapsed.
    let help = text(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        !help.contains("a crashed distlock frees the lock after at most this long"),
        "the old claim, wrong for ZooKeeper and Postgres: {help}"
    );
    for said in [
        "at least 250ms",
        "Redis, Redlock: at most this long",
        "Postgres: a killed distlock frees it at once, a frozen or cut-off one keeps it until the server's idle_session_timeout",
        "ZooKeeper: until its session expires (the session timeout, whatever --ttl is)",
        "File: a killed distlock frees it at once, a frozen one keeps it",
    ] {
        assert!(help.contains(said), "--help lacks {said:?}: {help}");
    }
}
