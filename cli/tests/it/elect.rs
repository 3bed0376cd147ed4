//! `distlock elect` and `distlock leader` across real processes on the file backend (a
//! directory shared by every process): one replica runs its command while it leads, a
//! standby takes over when the leader goes, `leader` reads both, and the exit codes.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn distlock() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_distlock"));
    command
        .env_remove("DISTLOCK_BACKEND")
        .env("RUST_BACKTRACE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// `distlock elect --backend URL --id ID [extra…] NAME -- sh -c SCRIPT`.
fn elect_sh(url: &str, id: &str, extra: &[&str], name: &str, script: &str) -> Command {
    let mut command = distlock();
    command
        .args(["elect", "--backend", url, "--id", id])
        .args(extra)
        .args([name, "--", "sh", "-c", script]);
    command
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Waits for `child`, bounded, and returns its output.
fn finish(child: Child) -> Output {
    let pid = child.id();
    let (done, waited) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    waited
        .recv_timeout(Duration::from_secs(90))
        .unwrap_or_else(|_| panic!("distlock {pid} did not finish within 90s"))
        .expect("distlock runs")
}

fn run(mut command: Command) -> Output {
    finish(command.spawn().expect("distlock starts"))
}

/// Waits (polling the file system, which has no event to wait on) until `path` exists.
fn wait_for_file(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Writes the term to `marker`, then runs until killed (bounded: 60 s).
fn lead_and_mark(marker: &Path) -> String {
    format!(
        r#"echo "$DISTLOCK_TERM $DISTLOCK_CANDIDATE" > "{marker}.tmp" && mv "{marker}.tmp" "{marker}"
           i=0; while [ $i -lt 6000 ]; do i=$((i+1)); sleep 0.01; done; exit 3"#,
        marker = marker.display(),
    )
}

/// `distlock leader --json` as parsed JSON.
fn leader_json(url: &str, name: &str) -> serde_json::Value {
    let out = run({
        let mut command = distlock();
        command.args(["leader", "--backend", url, "--json", name]);
        command
    });
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("leader --json prints JSON")
}

fn sigterm(child: &Child) {
    let pid = libc::pid_t::try_from(child.id()).expect("a pid");
    // SAFETY: kill(2) has no memory-safety preconditions; the child is not reaped yet.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
}

#[test]
fn a_standby_leads_once_the_leader_goes_and_leader_reads_both() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("file://{}", dir.path().display());
    let (a_marker, b_marker) = (dir.path().join("a-leads"), dir.path().join("b-leads"));
    let empty = leader_json(&url, "scheduler");
    assert!(empty["leader"].is_null(), "{empty}");

    let a = elect_sh(
        &url,
        "replica-a",
        &[],
        "scheduler",
        &lead_and_mark(&a_marker),
    )
    .spawn()
    .expect("a starts");
    wait_for_file(&a_marker);
    let seen = leader_json(&url, "scheduler");
    assert_eq!(seen["leader"], "replica-a", "{seen}");
    let a_term: u64 = std::fs::read_to_string(&a_marker)
        .expect("marker")
        .split_whitespace()
        .next()
        .and_then(|t| t.parse().ok())
        .expect("the command got DISTLOCK_TERM");
    assert_eq!(seen["term"], a_term, "{seen}");

    let b = elect_sh(
        &url,
        "replica-b",
        &[],
        "scheduler",
        &lead_and_mark(&b_marker),
    )
    .spawn()
    .expect("b starts");
    // B campaigns while A leads: its command must not run. The no-wait campaign of a
    // third replica proves A still leads meanwhile.
    let third = run(elect_sh(
        &url,
        "replica-c",
        &["--no-wait"],
        "scheduler",
        "exit 0",
    ));
    assert_eq!(third.status.code(), Some(75), "{}", text(&third.stderr));
    assert!(!b_marker.exists(), "the standby ran while A led");

    sigterm(&a);
    let a_out = finish(a);
    assert_eq!(a_out.status.code(), Some(143), "{}", text(&a_out.stderr));
    wait_for_file(&b_marker);
    let now = leader_json(&url, "scheduler");
    assert_eq!(now["leader"], "replica-b", "{now}");
    let b_term = now["term"].as_u64().expect("a term");
    assert!(
        b_term > a_term,
        "B's term {b_term} is not above A's {a_term}"
    );

    sigterm(&b);
    let b_out = finish(b);
    assert_eq!(b_out.status.code(), Some(143), "{}", text(&b_out.stderr));
    let after = leader_json(&url, "scheduler");
    assert!(after["leader"].is_null(), "{after}");
}

#[test]
fn the_command_ending_on_its_own_ends_elect_with_its_code() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("file://{}", dir.path().display());
    let out = run(elect_sh(
        &url,
        "a",
        &[],
        "job",
        r#"[ -n "$DISTLOCK_TERM" ] && [ "$DISTLOCK_CANDIDATE" = a ] && [ "$DISTLOCK_ELECTION" = job ] && exit 7"#,
    ));
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    // It resigned: the next replica leads at once.
    let next = run(elect_sh(
        &url,
        "b",
        &["--no-wait", "--once"],
        "job",
        "exit 0",
    ));
    assert_eq!(next.status.code(), Some(0), "{}", text(&next.stderr));
}

#[test]
fn bad_input_is_a_usage_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("file://{}", dir.path().display());
    for extra in [&["--ttl", "10ms"][..], &["--id", ""][..]] {
        let out = run({
            let mut command = distlock();
            command
                .args(["elect", "--backend", &url])
                .args(extra)
                .args(["job", "--", "true"]);
            command
        });
        assert_eq!(
            out.status.code(),
            Some(2),
            "{extra:?}: {}",
            text(&out.stderr)
        );
    }
    let empty_name = run(elect_sh(&url, "a", &[], "", "true"));
    assert_eq!(
        empty_name.status.code(),
        Some(2),
        "{}",
        text(&empty_name.stderr)
    );
    let bad_url = run({
        let mut command = distlock();
        command.args(["leader", "--backend", "nope://x", "job"]);
        command
    });
    assert_eq!(bad_url.status.code(), Some(2), "{}", text(&bad_url.stderr));
}

#[test]
fn leader_watch_prints_each_change() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("file://{}", dir.path().display());
    let mut watch = distlock()
        .args(["leader", "--backend", &url, "--watch", "--json", "svc"])
        .spawn()
        .expect("watch starts");
    let stdout = watch.stdout.take().expect("piped");
    let (lines_tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stdout).lines() {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let next = || -> serde_json::Value {
        let line = lines
            .recv_timeout(Duration::from_secs(30))
            .expect("a line within 30 s")
            .expect("readable");
        serde_json::from_str(&line).expect("JSON")
    };
    assert!(next()["leader"].is_null());
    let release = dir.path().join("release");
    let script = format!(
        r#"i=0; while [ ! -e "{release}" ]; do i=$((i+1)); [ $i -gt 6000 ] && exit 3; sleep 0.01; done"#,
        release = release.display()
    );
    let leader = elect_sh(&url, "first", &["--once"], "svc", &script)
        .spawn()
        .expect("elect starts");
    let seen = next();
    assert_eq!(seen["leader"], "first", "{seen}");
    assert!(seen["term"].as_u64().is_some(), "{seen}");
    std::fs::write(&release, b"").expect("release marker");
    let out = finish(leader);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let after = next();
    assert!(after["leader"].is_null(), "{after}");
    let _ = watch.kill();
    let _ = watch.wait();
}
