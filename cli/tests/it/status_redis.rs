//! `distlock status` on Redis keys that another library holds, with the odd values a
//! foreign holder may leave: each must read as held, never as free or as an error.

use std::process::{Command, Output};

use distlock_test_servers::RedisServer;

async fn server() -> RedisServer {
    RedisServer::start()
        .await
        .expect("redis-server starts (run scripts/test.sh, which installs it)")
}

/// Runs `redis-cli` against `server` (the foreign library's plain commands).
fn redis_cli(server: &RedisServer, args: &[&str]) {
    let out = Command::new("redis-cli")
        .args(["-p", &server.port().to_string()])
        .args(args)
        .output()
        .expect("redis-cli runs (it comes with redis-server)");
    assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
    let reply = String::from_utf8_lossy(&out.stdout);
    assert!(!reply.contains("ERR"), "redis-cli {args:?}: {reply}");
}

/// Runs `distlock SUBCOMMAND --backend <server> ARGS…`.
fn distlock(server: &RedisServer, subcommand: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_distlock"))
        .arg(subcommand)
        .args(["--backend", &server.url()])
        .args(args)
        .env_remove("DISTLOCK_BACKEND")
        .output()
        .expect("the distlock binary runs")
}

fn status(server: &RedisServer, key: &str) -> serde_json::Value {
    let out = distlock(server, "status", &[key, "--json"]);
    assert!(
        out.status.success(),
        "status {key}: stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("status --json prints JSON")
}

/// Before: a plain `SET {K} '' NX PX 30000` (a foreign holder with an empty value)
/// read as `held: false` while `exec --no-wait` correctly exited 75, and a key of
/// another type made `status` fail with WRONGTYPE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_holders_with_odd_values_read_as_held() {
    let server = server().await;
    let cases: [(&str, &[&str], bool); 5] = [
        (
            "empty",
            &["SET", "{foreign/empty}", "", "NX", "PX", "30000"],
            true,
        ),
        (
            "number",
            &["SET", "{foreign/number}", "42", "NX", "PX", "30000"],
            true,
        ),
        (
            "forever",
            &["SET", "{foreign/forever}", "someone-else"],
            false,
        ),
        ("hash", &["HSET", "{foreign/hash}", "owner", "x"], false),
        ("list", &["RPUSH", "{foreign/list}", "x"], false),
    ];
    for (name, command, expires) in cases {
        redis_cli(&server, command);
        let key = format!("foreign/{name}");
        let seen = status(&server, &key);
        assert_eq!(seen["held"], true, "{name}: {seen}");
        assert!(seen["holder"].is_string(), "{name}: says who holds: {seen}");
        assert_eq!(
            seen["remaining_ms"].is_number(),
            expires,
            "{name}: the remaining lease is shown exactly when the key expires: {seen}"
        );
        // And the lock agrees: it cannot be taken.
        let exec = distlock(&server, "exec", &["--no-wait", &key, "--", "true"]);
        assert_eq!(exec.status.code(), Some(75), "{name}: exec: {exec:?}");
    }
    // A free key still reads free.
    let free = status(&server, "foreign/nobody");
    assert_eq!(free["held"], false, "{free}");
}
