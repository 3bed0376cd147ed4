//! `distlock status --semaphore` and `--rw` against real `exec --permits` and
//! `exec --shared` processes on the file backend: the holders they show, as text and
//! JSON, and their usage errors.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn distlock() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_distlock"));
    command
        .env_remove("DISTLOCK_BACKEND")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// An `exec` holding KEY in the mode `extra` gives until `release` exists; returns once
/// its command has started (polling the file system, which has no event to wait on).
fn holder(url: &str, extra: &[&str], key: &str, dir: &Path, name: &str) -> Child {
    let started = dir.join(name);
    let script = format!(
        r#"touch "{started}"
           i=0; while [ ! -e "{release}" ]; do i=$((i+1)); [ $i -gt 6000 ] && exit 3; sleep 0.01; done"#,
        started = started.display(),
        release = dir.join("release").display(),
    );
    let child = distlock()
        .args(["exec", "--backend", url])
        .args(extra)
        .args([key, "--", "sh", "-c", &script])
        .spawn()
        .expect("distlock starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !started.exists() {
        assert!(Instant::now() < deadline, "{name} never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

fn status(url: &str, extra: &[&str], key: &str) -> Output {
    distlock()
        .args(["status", "--backend", url])
        .args(extra)
        .arg(key)
        .output()
        .expect("distlock runs")
}

fn json(out: &Output) -> serde_json::Value {
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("valid JSON")
}

#[test]
fn status_shows_semaphore_and_rw_holders() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().join("locks").display());

    // Nothing held yet.
    let free = json(&status(&url, &["--semaphore", "--json"], "backups"));
    assert_eq!(free["held"], 0, "{free}");
    assert!(free["permits"].is_null(), "{free}");
    let free = json(&status(&url, &["--rw", "--json"], "catalog"));
    assert_eq!(free["state"], "free", "{free}");

    let holders = [
        holder(&url, &["--permits", "3"], "backups", dir.path(), "p1"),
        holder(&url, &["--permits", "3"], "backups", dir.path(), "p2"),
        holder(&url, &["--shared"], "catalog", dir.path(), "r1"),
    ];
    let sem = json(&status(&url, &["--semaphore", "--json"], "backups"));
    assert_eq!(sem["permits"], 3, "{sem}");
    assert_eq!(sem["held"], 2, "{sem}");
    assert_eq!(sem["holders"].as_array().map(Vec::len), Some(2), "{sem}");
    let table = status(&url, &["--semaphore"], "backups");
    let table = text(&table.stdout);
    assert!(
        table.contains("permits:        3") && table.contains("held:           2"),
        "{table}"
    );

    let rw = json(&status(&url, &["--rw", "--json"], "catalog"));
    assert_eq!(rw["state"], "read", "{rw}");
    assert_eq!(rw["writer_waiting"], false, "{rw}");
    // The mutex of the same name is another lock: free.
    let mutex = json(&status(&url, &["--json"], "catalog"));
    assert_eq!(mutex["held"], false, "{mutex}");

    std::fs::write(dir.path().join("release"), "").unwrap();
    for child in holders {
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    }
    // A plain exec holds the write side.
    std::fs::remove_file(dir.path().join("release")).unwrap();
    let writer = holder(&url, &[], "catalog", dir.path(), "w1");
    let rw = json(&status(&url, &["--rw", "--json"], "catalog"));
    assert_eq!(rw["state"], "write", "{rw}");
    let table = text(&status(&url, &["--rw"], "catalog").stdout);
    assert!(table.contains("state:          write"), "{table}");
    std::fs::write(dir.path().join("release"), "").unwrap();
    let out = writer.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let free = json(&status(&url, &["--semaphore", "--json"], "backups"));
    assert_eq!(free["held"], 0, "{free}");
}

#[test]
fn status_of_primitives_usage_errors() {
    let out = status("file:///tmp", &["--semaphore", "--rw"], "k");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let out = status("file:///tmp", &["--semaphore"], "");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).starts_with("error: "),
        "{}",
        text(&out.stderr)
    );
}
