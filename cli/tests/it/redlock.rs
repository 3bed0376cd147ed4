//! The CLI on Redlock, which has no fencing: `exec` gives the command no
//! `DISTLOCK_FENCING_TOKEN` (not even one inherited from an enclosing exec) and its
//! `--verbose` summary says `fencing_token=none`; `status` says there is no token; the
//! demo passes without tokens and skips its fencing act.

use std::process::{Output, Stdio};
use std::time::Duration;

use distlock_test_servers::{skip_or_panic, RedisServer};
use tokio::process::Command;

fn distlock(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_distlock"));
    command
        .args(args)
        .env_remove("DISTLOCK_BACKEND")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn output(mut command: Command) -> Output {
    tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("distlock finishes within a minute")
        .expect("the distlock binary runs")
}

/// Before: exec exported Redlock's best-effort number (…408, 409, 259, 427… with no
/// faults), and a ledger fenced by it refused legitimate writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_hands_out_no_fencing_token() {
    let mut servers = Vec::new();
    for _ in 0..3 {
        match RedisServer::start().await {
            Ok(server) => servers.push(server),
            Err(e) => return skip_or_panic("redlock_hands_out_no_fencing_token", &e),
        }
    }
    let nodes: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let url = format!("redis+redlock://{}", nodes.join(","));

    let script = r#"echo "key=$DISTLOCK_KEY"
        if [ -n "${DISTLOCK_FENCING_TOKEN+set}" ]; then echo "token=$DISTLOCK_FENCING_TOKEN"; else echo "no token"; fi"#;
    let mut exec = distlock(&["exec", "--verbose", "--backend", &url, "jobs/nightly"]);
    exec.args(["--", "sh", "-c", script])
        // As if run inside an exec on a backend with fencing: that token is not ours.
        .env("DISTLOCK_FENCING_TOKEN", "41");
    let out = output(exec).await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(stdout, "key=jobs/nightly\nno token\n", "{stderr}");
    assert!(stderr.contains("fencing_token=none"), "{stderr}");

    let out = output(distlock(&["status", "--backend", &url, "jobs/nightly"])).await;
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        stdout.contains("none (this backend has no fencing tokens)"),
        "{stdout}"
    );

    let out = output(distlock(&["demo", "--backend", &url])).await;
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("took turns (no fencing tokens on this backend)"),
        "{stdout}"
    );
    assert!(stdout.contains("fencing act skipped"), "{stdout}");
}
