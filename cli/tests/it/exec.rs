//! `distlock exec` end to end on the memory backend (one process, so no contention
//! across processes here; see `exec_servers.rs` for that): exit codes, the command's
//! environment, signal forwarding, usage errors and the `--verbose` summary.
// The tests signal the processes they start (libc::kill).
#![allow(unsafe_code)]

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn distlock() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_distlock"));
    command
        .env_remove("DISTLOCK_BACKEND")
        .env("RUST_BACKTRACE", "1");
    command
}

/// `distlock exec --backend memory:// [extra…] KEY -- sh -c SCRIPT`.
fn exec_sh(extra: &[&str], key: &str, script: &str) -> Output {
    distlock()
        .args(["exec", "--backend", "memory://"])
        .args(extra)
        .args([key, "--", "sh", "-c", script])
        .output()
        .expect("the distlock binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Asserts exactly one `error: ` line on stderr, no panic, and the exit code.
fn assert_one_line_error(out: &Output, code: i32) -> String {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line expected: {stderr:?}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    stderr
}

/// Waits (polling the file system, which has no event to wait on) until `path` exists.
fn wait_for_file(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_command_gets_its_environment_and_its_exit_code_is_passed_on() {
    let out = exec_sh(
        &[],
        "jobs/nightly",
        r#"test "$DISTLOCK_KEY" = jobs/nightly || exit 90
           test "$DISTLOCK_FENCING_TOKEN" -ge 1 || exit 91
           test "$DISTLOCK_BACKEND" = memory:// || exit 92
           echo hello; exit 3"#,
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hello\n");
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));

    let out = exec_sh(&[], "jobs/ok", "exit 0");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn a_command_killed_by_a_signal_exits_128_plus_the_signal() {
    let out = exec_sh(&[], "jobs/killed", "kill -KILL $$");
    assert_eq!(out.status.code(), Some(128 + 9), "{}", text(&out.stderr));
}

#[test]
fn commands_that_cannot_run_exit_126_or_127() {
    let out = distlock()
        .args(["exec", "--backend", "memory://", "k", "--"])
        .arg("/nonexistent/distlock-test-command")
        .output()
        .unwrap();
    let stderr = assert_one_line_error(&out, 127);
    assert!(stderr.contains("cannot run"), "{stderr}");

    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    let out = distlock()
        .args(["exec", "--backend", "memory://", "k", "--"])
        .arg(&script)
        .output()
        .unwrap();
    assert_one_line_error(&out, 126);
}

#[test]
fn usage_errors_exit_2_and_the_command_never_runs() {
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let script = format!("touch {}", ran.display());
    for (extra, key) in [
        (&["--ttl", "30"][..], "k"),
        (&["--ttl", "1x"][..], "k"),
        (&["--wait", "-1s"][..], "k"),
        (&["--wait", "1s", "--no-wait"][..], "k"),
        (&["--ttl", "1ms"][..], "k"),
        (&["--backend", "mongodb://user:secret@db"][..], "k"),
        (&[][..], ""),
    ] {
        let out = exec_sh(extra, key, &script);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.starts_with("error: "), "{extra:?}: {stderr}");
        assert!(
            !stderr.contains("panicked") && !stderr.contains("secret"),
            "{stderr}"
        );
    }
    // Our own errors (not clap's) are one line.
    assert_one_line_error(&exec_sh(&["--ttl", "1ms"], "k", &script), 2);
    assert_one_line_error(&exec_sh(&[], "", &script), 2);
    let out = distlock()
        .args(["exec", "--backend", "memory://", "k"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a command is required");
    assert!(!ran.exists(), "the command ran despite a usage error");
}

#[test]
fn an_unreachable_backend_exits_69() {
    // Nothing listens on a port just freed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = distlock()
        .args(["exec", "--backend", &format!("redis://127.0.0.1:{port}")])
        .args(["k", "--", "true"])
        .output()
        .unwrap();
    assert_one_line_error(&out, 69);
}

#[test]
fn verbose_prints_a_summary() {
    let out = exec_sh(
        &["--verbose", "--ttl", "300ms"],
        "jobs/verbose",
        "sleep 0.5",
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let summary = stderr.lines().last().unwrap_or_default();
    for field in [
        "backend=memory",
        "key=\"jobs/verbose\"",
        "fencing_token=",
        "waited=",
        "held=",
        "exit=0",
    ] {
        assert!(summary.contains(field), "{field} missing: {summary}");
    }
    // A 300 ms lease held for 500 ms was renewed (every 100 ms).
    let renewals: u64 = summary
        .split_whitespace()
        .find_map(|f| f.strip_prefix("renewals="))
        .and_then(|n| n.parse().ok())
        .expect("renewals=N");
    assert!(renewals >= 1, "{summary}");
}

#[test]
fn sigterm_and_sigint_to_distlock_reach_the_command() {
    for (signo, name) in [(libc::SIGTERM, "TERM"), (libc::SIGINT, "INT")] {
        let dir = tempfile::tempdir().unwrap();
        let ready = dir.path().join("ready");
        let got = dir.path().join("got");
        let script = format!(
            r#"trap 'echo {name} > "{got}"; kill $!; exit 7' {name}
               sleep 60 & touch "{ready}"; wait"#,
            got = got.display(),
            ready = ready.display(),
        );
        // `sh` starts background jobs with SIGINT ignored, hence the `kill $!`.
        let child = distlock()
            .args(["exec", "--backend", "memory://", "jobs/signals", "--"])
            .args(["sh", "-c", &script])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for_file(&ready);
        let pid = libc::pid_t::try_from(child.id()).unwrap();
        // SAFETY: kill(2) on the child we spawned and have not reaped.
        assert_eq!(unsafe { libc::kill(pid, signo) }, 0);
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(7), "{name}: {}", text(&out.stderr));
        assert_eq!(std::fs::read_to_string(&got).unwrap().trim(), name);
    }
}

#[cfg(target_os = "linux")]
#[test]
fn a_command_whose_distlock_is_killed_with_9_gets_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let got = dir.path().join("got");
    let script = format!(
        r#"trap 'touch "{got}"; kill $!; exit 0' TERM
           sleep 60 & touch "{ready}"; wait"#,
        got = got.display(),
        ready = ready.display(),
    );
    let mut child = distlock()
        .args(["exec", "--backend", "memory://", "jobs/orphan", "--"])
        .args(["sh", "-c", &script])
        .spawn()
        .unwrap();
    wait_for_file(&ready);
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    wait_for_file(&got);
}

/// The state letter of process `pid` (`T` when stopped), from `/proc`.
#[cfg(target_os = "linux")]
fn process_state(pid: i32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The state follows the command name, which is in parentheses.
    let after = &stat[stat.rfind(')').unwrap() + 1..];
    after.trim_start().chars().next().unwrap()
}

/// Waits (polling `/proc`, which has no event to wait on) until `pid`'s state is or is
/// not `T`.
#[cfg(target_os = "linux")]
fn wait_for_stopped(pid: i32, stopped: bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while (process_state(pid) == 'T') != stopped {
        assert!(
            Instant::now() < deadline,
            "pid {pid} never became stopped={stopped}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(target_os = "linux")]
#[test]
fn ctrl_z_stops_the_command_with_distlock_and_fg_continues_both() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    let script = format!(
        r#"echo $$ > "{}.tmp"; mv "{0}.tmp" "{0}"; exec sleep 60"#,
        pid_file.display()
    );
    let mut child = distlock()
        .args(["exec", "--backend", "memory://", "jobs/ctrl-z", "--"])
        .args(["sh", "-c", &script])
        .spawn()
        .unwrap();
    wait_for_file(&pid_file);
    let command: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let distlock_pid = libc::pid_t::try_from(child.id()).unwrap();
    // SAFETY: kill(2) on processes this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(distlock_pid, libc::SIGTSTP) }, 0);
    wait_for_stopped(command, true);
    wait_for_stopped(distlock_pid, true);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(distlock_pid, libc::SIGCONT) }, 0);
    wait_for_stopped(distlock_pid, false);
    wait_for_stopped(command, false);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(distlock_pid, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(128 + libc::SIGTERM),
        "the command's own death by SIGTERM"
    );
}
