//! `distlock exec --permits N` and `--shared` across real processes on the file backend
//! (a directory shared by every process): at most N commands at once, readers side by
//! side but never beside a plain (exclusive) exec, and the modes' exit codes.

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

/// `distlock exec --backend URL [extra…] KEY -- sh -c SCRIPT`.
fn exec_sh(url: &str, extra: &[&str], key: &str, script: &str) -> Command {
    let mut command = distlock();
    command
        .args(["exec", "--backend", url])
        .args(extra)
        .args([key, "--", "sh", "-c", script]);
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

/// A script that marks `started`, then holds until `release` exists (bounded: 60s).
fn hold_until(started: &Path, release: &Path) -> String {
    format!(
        r#"touch "{started}"
           i=0; while [ ! -e "{release}" ]; do i=$((i+1)); [ $i -gt 6000 ] && exit 3; sleep 0.01; done"#,
        started = started.display(),
        release = release.display(),
    )
}

/// The most commands of `log` (lines `start|end NANOS`, appended by the commands
/// themselves while they held their grant) that ran at once.
fn most_at_once(log: &str) -> usize {
    let mut events: Vec<(u128, i32)> = log
        .lines()
        .map(|line| {
            let (kind, at) = line.split_once(' ').expect("`kind nanos` lines");
            let at: u128 = at.trim().parse().expect("nanoseconds");
            // At equal instants, count an end before a start: touching is no overlap.
            match kind {
                "start" => (at, 1),
                "end" => (at, -1),
                other => panic!("unexpected line {other:?} in {log}"),
            }
        })
        .collect();
    events.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in events {
        now += step;
        most = most.max(now);
    }
    usize::try_from(most).expect("never negative")
}

#[test]
fn n_plus_one_execs_with_n_permits_never_run_more_than_n_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().join("locks").display());
    let log = dir.path().join("log");
    // Each command waits (bounded) until two have started, so that two holding at once
    // is shown even on a slow host, then holds a moment longer.
    let script = format!(
        r#"echo "start $(date +%s%N)" >> "{log}"
           i=0; while [ "$(grep -c start "{log}")" -lt 2 ] && [ $i -lt 2000 ]; do i=$((i+1)); sleep 0.01; done
           sleep 0.2; echo "end $(date +%s%N)" >> "{log}""#,
        log = log.display()
    );
    const PERMITS: usize = 2;
    let runs: Vec<Child> = (0..=PERMITS + 1)
        .map(|_| {
            exec_sh(
                &url,
                &["--permits", "2", "--wait", "60s"],
                "backups",
                &script,
            )
            .spawn()
            .expect("distlock starts")
        })
        .collect();
    for run in runs {
        let out = finish(run);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    }
    let log = std::fs::read_to_string(&log).unwrap();
    assert_eq!(log.lines().count(), 2 * (PERMITS + 2), "{log}");
    // Never more than N; and N at once did happen, so the permits are really shared
    // rather than taken one at a time.
    assert_eq!(most_at_once(&log), PERMITS, "{log}");
}

#[test]
fn shared_execs_overlap_and_exclude_a_plain_exec() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().join("locks").display());
    let path = |name: &str| dir.path().join(name);
    let key = "catalog";

    // Two readers hold at once.
    let readers: Vec<Child> = ["r1", "r2"]
        .iter()
        .map(|name| {
            exec_sh(
                &url,
                &["--shared", "--wait", "30s"],
                key,
                &hold_until(&path(name), &path("readers-go")),
            )
            .spawn()
            .expect("distlock starts")
        })
        .collect();
    wait_for_file(&path("r1"));
    wait_for_file(&path("r2"));
    // A third reader gets in at once beside them; a plain exec does not.
    let third = run(exec_sh(&url, &["--shared", "--no-wait"], key, "exit 0"));
    assert_eq!(third.status.code(), Some(0), "{}", text(&third.stderr));
    let writer = run(exec_sh(&url, &["--no-wait"], key, "exit 0"));
    assert_eq!(writer.status.code(), Some(75), "{}", text(&writer.stderr));
    assert!(
        text(&writer.stderr).contains("held"),
        "{}",
        text(&writer.stderr)
    );

    std::fs::write(path("readers-go"), "").unwrap();
    for reader in readers {
        let out = finish(reader);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    }

    // A plain exec holds: no reader gets in beside it.
    let writer = exec_sh(
        &url,
        &["--wait", "30s"],
        key,
        &hold_until(&path("w"), &path("writer-go")),
    )
    .spawn()
    .expect("distlock starts");
    wait_for_file(&path("w"));
    let reader = run(exec_sh(&url, &["--shared", "--no-wait"], key, "exit 0"));
    assert_eq!(reader.status.code(), Some(75), "{}", text(&reader.stderr));
    assert!(
        text(&reader.stderr).contains("writer"),
        "{}",
        text(&reader.stderr)
    );
    std::fs::write(path("writer-go"), "").unwrap();
    let out = finish(writer);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // Freed by the writer: a reader gets in again.
    let reader = run(exec_sh(&url, &["--shared", "--no-wait"], key, "exit 4"));
    assert_eq!(reader.status.code(), Some(4), "{}", text(&reader.stderr));
}

#[test]
fn permit_modes_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().join("locks").display());
    let path = |name: &str| dir.path().join(name);

    // Usage errors (2): --permits with --shared, counts out of bounds.
    for extra in [
        &["--permits", "2", "--shared"][..],
        &["--permits", "0"],
        &["--permits", "1025"],
        &["--permits", "x"],
    ] {
        let out = run(exec_sh(&url, extra, "jobs", "exit 0"));
        assert_eq!(
            out.status.code(),
            Some(2),
            "{extra:?}: {}",
            text(&out.stderr)
        );
        assert!(!text(&out.stderr).contains("panicked"));
    }

    // The command's own code is passed on; it gets the key in its environment.
    let out = run(exec_sh(
        &url,
        &["--permits", "3"],
        "jobs",
        r#"test "$DISTLOCK_KEY" = jobs || exit 9; exit 7"#,
    ));
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));

    // One permit of one held: 75, saying so.
    let holder = exec_sh(
        &url,
        &["--permits", "1"],
        "jobs",
        &hold_until(&path("held"), &path("go")),
    )
    .spawn()
    .expect("distlock starts");
    wait_for_file(&path("held"));
    let busy = run(exec_sh(
        &url,
        &["--permits", "1", "--no-wait"],
        "jobs",
        "exit 0",
    ));
    assert_eq!(busy.status.code(), Some(75), "{}", text(&busy.stderr));
    assert!(
        text(&busy.stderr).contains("all 1 permits of semaphore \"jobs\" are held"),
        "{}",
        text(&busy.stderr)
    );
    // Another count while the key is in use: 78, naming both counts; nothing ran.
    let mismatch = run(exec_sh(
        &url,
        &["--permits", "3", "--no-wait"],
        "jobs",
        "exit 0",
    ));
    let stderr = text(&mismatch.stderr);
    assert_eq!(mismatch.status.code(), Some(78), "{stderr}");
    assert!(stderr.starts_with("error: ") && stderr.contains('1') && stderr.contains('3'));
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    // Semaphore keys are their own namespace: a plain exec of "jobs" is not held back.
    let plain = run(exec_sh(&url, &["--no-wait"], "jobs", "exit 0"));
    assert_eq!(plain.status.code(), Some(0), "{}", text(&plain.stderr));

    std::fs::write(path("go"), "").unwrap();
    let out = finish(holder);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// `exec K1 --and K2` takes both keys all or nothing: two execs naming the same two
/// keys in opposite orders, started together again and again, never deadlock (each
/// would wait out its --wait holding one key if keys were taken as named).
#[test]
fn and_keys_in_opposite_orders_never_deadlock() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    for round in 0..5 {
        let a = exec_sh(&url, &["--wait", "20s", "--and", "b"], "a", "sleep 0.05")
            .spawn()
            .unwrap();
        let b = exec_sh(&url, &["--wait", "20s", "--and", "a"], "b", "sleep 0.05")
            .spawn()
            .unwrap();
        let started = Instant::now();
        for out in [finish(a), finish(b)] {
            assert!(out.status.success(), "round {round}: {}", text(&out.stderr));
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "round {round} waited"
        );
    }
}
