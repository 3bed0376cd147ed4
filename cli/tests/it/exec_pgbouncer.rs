//! `distlock exec` against Postgres behind a real PgBouncer: through transaction
//! pooling with `?pool_mode=transaction` it runs the command under the lock; without
//! it, it refuses with an error naming PgBouncer and that URL form (never running the
//! command); through a session pool of 4, three `exec --wait 10s`s of a 1 s command on
//! one key all run, each as the one before it lets go: none waits for a connection.

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use distlock_test_servers::{
    skip_or_panic, PgBouncerOptions, PgBouncerServer, PoolMode, PostgresServer,
    PostgresServerOptions,
};
use tokio::process::Command;

fn exec(url: &str, extra: &[&str], key: &str, script: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_distlock"));
    command
        .env_remove("DISTLOCK_BACKEND")
        .args(["exec", "--backend", url])
        .args(extra)
        .args([key, "--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

async fn output(mut command: Command) -> Output {
    tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("distlock exec finishes within a minute")
        .expect("the distlock binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Postgres and a PgBouncer in `mode` with `pool` server connections in front of it.
async fn stack(test: &str, mode: PoolMode, pool: u32) -> Option<(PgBouncerServer, PostgresServer)> {
    let options = PostgresServerOptions::default().with_setting("max_connections", "100");
    let pg = match PostgresServer::start_with(options).await {
        Ok(pg) => pg,
        Err(e) => {
            skip_or_panic(test, &e);
            return None;
        }
    };
    match PgBouncerServer::start(pg.port(), PgBouncerOptions::new(mode).with_pool_size(pool)).await
    {
        Ok(bouncer) => Some((bouncer, pg)),
        Err(e) => {
            skip_or_panic(test, &e);
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_through_a_transaction_pooler() {
    let test = "exec_through_a_transaction_pooler";
    let Some((bouncer, _pg)) = stack(test, PoolMode::Transaction, 4).await else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let marker = dir.path().join("ran");
    let script = format!("touch {}", marker.display());
    let refused = output(exec(&bouncer.url(), &[], "pgb/k", &script)).await;
    let stderr = text(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    for words in ["PgBouncer", "transaction", "pool_mode=transaction"] {
        assert!(stderr.contains(words), "{words:?} missing from: {stderr}");
    }
    assert!(!marker.exists(), "the command ran without the lock");
    let url = format!("{}?pool_mode=transaction", bouncer.url());
    let ran = output(exec(&url, &[], "pgb/k", &script)).await;
    assert!(ran.status.success(), "{}", text(&ran.stderr));
    assert!(marker.exists(), "the command did not run");
    // Two at once never overlap: each appends its start and end.
    let log = dir.path().join("log");
    let script = format!(
        "echo start >> {log}; sleep 0.3; echo end >> {log}",
        log = log.display()
    );
    let runs: Vec<_> = (0..2)
        .map(|_| tokio::spawn(output(exec(&url, &["--wait", "20s"], "pgb/both", &script))))
        .collect();
    for run in runs {
        let out = run.await.expect("joined");
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let lines = std::fs::read_to_string(&log).expect("log");
    assert_eq!(lines, "start\nend\nstart\nend\n", "the commands overlapped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_execs_share_a_session_pool_of_four() {
    let test = "three_execs_share_a_session_pool_of_four";
    let Some((bouncer, _pg)) = stack(test, PoolMode::Session, 4).await else {
        return;
    };
    let started = Instant::now();
    let runs: Vec<_> = (0..3)
        .map(|_| {
            let command = exec(&bouncer.url(), &["--wait", "10s"], "pgb/pool4", "sleep 1");
            tokio::spawn(async move {
                let out = output(command).await;
                (out, started.elapsed())
            })
        })
        .collect();
    let mut finished = Vec::new();
    for run in runs {
        let (out, at) = run.await.expect("joined");
        assert!(out.status.success(), "{}", text(&out.stderr));
        finished.push(at);
    }
    finished.sort();
    eprintln!("finished after {finished:?}");
    // Each takes its turn as the one before it lets go: one command's second apart,
    // plus process start-up on a loaded machine. A process that has to queue at the
    // pooler for one more server connection waits until a session elsewhere closes
    // when idle (5 s): the gap this bounds.
    let turn = Duration::from_millis(2500);
    assert!(
        finished[0] < Duration::from_secs(4)
            && finished[1] - finished[0] < turn
            && finished[2] - finished[1] < turn,
        "three 1 s commands through a session pool of 4 finished after {finished:?}: \
         one waited for a connection, not its turn"
    );
}
