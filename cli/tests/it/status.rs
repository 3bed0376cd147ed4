//! `distlock status` against the file backend, with the lock held by this test process.

use std::process::{Command, Output};
use std::time::Duration;

use distlock::{LockKey, LockOptions};

fn status(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_distlock"))
        .arg("status")
        .args(["--backend", url])
        .args(args)
        .env_remove("DISTLOCK_BACKEND")
        .output()
        .expect("the distlock binary runs")
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("status --json prints JSON")
}

#[tokio::test]
async fn status_reports_a_held_key_then_a_free_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("file://{}", dir.path().display());
    let locks = distlock::connect(&url).await.expect("connects").lock();
    let key = LockKey::new("reports/Nightly").expect("valid key");
    let guard = locks
        .acquire(&key, &LockOptions::new(Duration::from_secs(60)))
        .await
        .expect("acquires");
    let token = guard.fencing_token().unwrap().get();

    let held = json(&status(&url, &["reports/Nightly", "--json"]));
    assert_eq!(held["held"], true, "{held}");
    assert_eq!(held["backend"], "file", "{held}");
    assert_eq!(held["fencing_token"], token, "{held}");
    let holder = format!("process {}", std::process::id());
    assert_eq!(held["holder"], holder.as_str(), "{held}");

    let table = status(&url, &["reports/Nightly"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("state:          held"), "{text}");
    assert!(text.contains(&format!("fencing token:  {token}")), "{text}");

    guard.release().await.expect("releases");
    let free = json(&status(&url, &["reports/Nightly", "--json"]));
    assert_eq!(free["held"], false, "{free}");
    assert_eq!(
        free["fencing_token"], token,
        "the last token is kept: {free}"
    );
    assert!(free["remaining_ms"].is_null(), "{free}");
}

#[test]
fn bad_keys_and_urls_are_one_line_usage_errors() {
    for (url, key) in [("file://", ""), ("file://relative", "k"), ("nope://x", "k")] {
        let out = status(url, &[key]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{url} {key:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with("error: "), "{stderr}");
    }
}
