//! `distlock exec` and `status` on Redlock, which has no fencing: the command gets no
//! `DISTLOCK_FENCING_TOKEN` (not even one inherited from an enclosing exec), the
//! `--verbose` summary says `fencing_token=none`, and `status` says there is none.

use std::process::{Output, Stdio};
use std::time::Duration;

use distlock_conformance::servers::{skip_or_panic, RedisServer};
use tokio::process::Command;

fn distlock() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_distlock"));
    command
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
async fn exec_on_redlock_exports_no_fencing_token() {
    let mut servers = Vec::new();
    for _ in 0..3 {
        match RedisServer::start().await {
            Ok(server) => servers.push(server),
            Err(e) => return skip_or_panic("exec_on_redlock_exports_no_fencing_token", &e),
        }
    }
    let nodes: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let url = format!("redis+redlock://{}", nodes.join(","));
    let script = r#"echo "key=$DISTLOCK_KEY"
        if [ -n "${DISTLOCK_FENCING_TOKEN+set}" ]; then echo "token=$DISTLOCK_FENCING_TOKEN"; else echo "no token"; fi"#;
    let mut exec = distlock();
    exec
        // As if run inside an exec on a backend with fencing: that token is not ours.
        .env("DISTLOCK_FENCING_TOKEN", "41")
        .args(["exec", "--verbose", "--backend", &url, "jobs/nightly"])
        .args(["--", "sh", "-c", script]);
    let out = output(exec).await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(stdout, "key=jobs/nightly\nno token\n", "{stderr}");
    assert!(stderr.contains("fencing_token=none"), "{stderr}");

    let mut status = distlock();
    status.args(["status", "--backend", &url, "jobs/nightly"]);
    let out = output(status).await;
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        stdout.contains("none (this backend has no fencing tokens)"),
        "{stdout}"
    );
}
