//! End-to-end tests of the `distlock` binary.

use std::process::{Command, Output};

fn distlock(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_distlock"))
        .args(args)
        .env_remove("DISTLOCK_BACKEND")
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("the distlock binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Asserts a failed run printed exactly one `error: ` line and no panic.
fn assert_one_line_error(out: &Output, code: i32) -> String {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("backtrace"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line expected: {stderr:?}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    stderr
}

#[test]
fn demo_shows_lost_update_lock_and_fencing() {
    let out = distlock(&["demo"]);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "stdout: {stdout}\nstderr: {}",
        text(&out.stderr)
    );
    assert!(stdout.contains("balance 700"), "{stdout}");
    assert!(stdout.contains("lost update"), "{stdout}");
    assert!(stdout.contains("balance 500"), "{stdout}");
    assert!(stdout.contains("stale token"), "{stdout}");
    assert!(stdout.contains("rejected"), "{stdout}");
    assert!(stdout.contains("demo passed"), "{stdout}");
    assert!(stdout.lines().count() <= 12, "{stdout}");
}

#[test]
fn demo_takes_a_named_memory_backend_from_the_environment() {
    let out = Command::new(env!("CARGO_BIN_EXE_distlock"))
        .arg("demo")
        .env("DISTLOCK_BACKEND", "memory://cli-test-env")
        .output()
        .expect("the distlock binary runs");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("balance 500"));
}

#[cfg(feature = "conformance")]
#[test]
fn conformance_on_memory_passes() {
    let out = distlock(&["conformance", "--backend", "memory://"]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {stdout}\nstderr: {}",
        text(&out.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    let words: Vec<&str> = last.split(' ').collect();
    assert!(
        matches!(
            words.as_slice(),
            [n, "passed,", "0", "failed,", m, "skipped"]
                if n.parse::<u32>().is_ok_and(|n| n > 0) && m.parse::<u32>().is_ok()
        ),
        "last line: {last:?}"
    );
}

#[cfg(feature = "conformance")]
#[test]
fn conformance_json_parses() {
    let out = distlock(&[
        "conformance",
        "--backend",
        "memory://cli-test-json",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("the report is JSON");
    let results = report["results"].as_array().expect("results is an array");
    assert!(!results.is_empty());
    assert!(results.iter().all(|r| r["verdict"]["status"] != "failed"));
}

#[test]
fn invalid_backend_urls_are_one_line_usage_errors() {
    for url in [
        "",
        "nonsense",
        "mongodb://user:secret@db",
        "memory://a b",
        "memory://x?y",
    ] {
        let commands: &[&str] = if cfg!(feature = "conformance") {
            &["demo", "conformance"]
        } else {
            &["demo"]
        };
        for &command in commands {
            let out = distlock(&[command, "--backend", url]);
            let stderr = assert_one_line_error(&out, 2);
            assert!(!stderr.contains("secret"), "{stderr}");
            assert!(out.stdout.is_empty(), "{url}: {}", text(&out.stdout));
        }
    }
}

#[test]
fn invalid_backend_from_the_environment_is_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_distlock"))
        .arg("demo")
        .env("DISTLOCK_BACKEND", "bogus")
        .output()
        .expect("the distlock binary runs");
    assert_one_line_error(&out, 2);
}

#[test]
fn usage_errors_exit_with_2() {
    let out = distlock(&["demo", "--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).starts_with("error: "));
    let out = distlock(&[]);
    assert_eq!(out.status.code(), Some(2));
}

/// The `Debug` forms of Rust errors that an operator must never read in an `error:` line.
const DEBUG_MARKERS: [&str; 4] = ["{ ", "Os {", "tonic::", "Error("];

/// A loopback port nothing listens on: bound, then freed.
fn refused_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
        .port()
}

/// Every server URL this build takes, against a port nothing listens on, through each
/// subcommand that connects, and malformed URLs: each run ends with an `error:` line
/// that names the address and gives the cause in words (a malformed URL: what is
/// wrong), never a `Debug` dump. The runs
/// go in parallel (each waits out its backend's connect timeout: Redis 2 s, Postgres and
/// etcd 5 s, ZooKeeper the URL's 1 s session).
#[test]
fn refusals_are_sentences_naming_the_address() {
    let port = refused_port();
    let address = format!("127.0.0.1:{port}");
    let mut urls = vec![
        (format!("redis://{address}"), "connection refused"),
        (
            format!("postgres://distlock@{address}/db"),
            "connection refused",
        ),
        (
            format!("zookeeper://{address}?session_timeout_ms=1000"),
            "connection refused",
        ),
    ];
    if cfg!(feature = "etcd") {
        urls.push((format!("etcd://{address}"), "connection refused"));
    }
    let commands: [&[&str]; 4] = [
        &["exec", "k", "--", "true"],
        &["status", "k"],
        &["leader", "e"],
        &["demo"],
    ];
    let mut runs = Vec::new();
    for (url, cause) in &urls {
        for command in commands {
            let child = Command::new(env!("CARGO_BIN_EXE_distlock"))
                .arg(command[0])
                .args(["--backend", url])
                .args(&command[1..])
                .env_remove("DISTLOCK_BACKEND")
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("the distlock binary runs");
            runs.push((
                format!("{} {url}", command[0]),
                child,
                address.as_str(),
                *cause,
            ));
        }
    }
    // Malformed URLs: a configuration error that says what is wrong (naming the
    // address where the backend's message does).
    let mut malformed = vec![
        ("redis://127.0.0.1:99999", "invalid Redis URL"),
        (
            "postgres://distlock@127.0.0.1:99999/db",
            "invalid port number",
        ),
        ("zookeeper://127.0.0.1:99999", "127.0.0.1:99999"),
    ];
    if cfg!(feature = "etcd") {
        malformed.push(("etcd://127.0.0.1:99999", "127.0.0.1:99999"));
    }
    for (url, names) in &malformed {
        let child = Command::new(env!("CARGO_BIN_EXE_distlock"))
            .args(["status", "--backend", url, "k"])
            .env_remove("DISTLOCK_BACKEND")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the distlock binary runs");
        runs.push((format!("status {url}"), child, names, "configuration error"));
    }
    for (what, child, address, cause) in runs {
        let out = child.wait_with_output().expect("distlock ends");
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{what}: {stderr}");
        let line = stderr
            .lines()
            .find(|line| line.starts_with("error: "))
            .unwrap_or_else(|| panic!("{what}: no error line in {stderr:?}"));
        for marker in DEBUG_MARKERS {
            assert!(!line.contains(marker), "{what}: {marker:?} in {line}");
        }
        assert!(line.contains(address), "{what}: no {address} in {line}");
        assert!(line.contains(cause), "{what}: no {cause:?} in {line}");
    }
}
