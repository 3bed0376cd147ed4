//! The PgBouncer test server: starts in front of a test Postgres in each pooling mode,
//! forwards queries (psql through it sees the server), survives kill + restart on the
//! same port, and keeps working across a restart of the Postgres behind it.

use std::time::Duration;

use distlock_test_servers::{
    PgBouncerOptions, PgBouncerServer, PoolMode, PostgresServer, ServerControl,
};

const NORMAL: Duration = Duration::from_secs(5);

macro_rules! start_or_skip {
    ($test:expr, $start:expr) => {
        match $start {
            Ok(server) => server,
            Err(err) => {
                distlock_test_servers::skip_or_panic($test, &err);
                return;
            }
        }
    };
}

/// `psql URL -c SQL` through the pooler, retried for a few seconds (a restarted
/// server is logged into again after `server_login_retry`).
async fn psql(url: &str, sql: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let out = tokio::process::Command::new("psql")
            .args([url, "-XtAc", sql])
            .output()
            .await
            .expect("psql runs (the postgresql package ships it)");
        if out.status.success() {
            return String::from_utf8_lossy(&out.stdout).trim().to_owned();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "psql through PgBouncer failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_forwards_in_both_modes_and_restarts() {
    let test = "pgbouncer_forwards_in_both_modes_and_restarts";
    let mut pg = start_or_skip!(test, PostgresServer::start().await);
    for mode in [PoolMode::Transaction, PoolMode::Session] {
        let mut bouncer = start_or_skip!(
            test,
            PgBouncerServer::start(pg.port(), PgBouncerOptions::new(mode).with_pool_size(3)).await
        );
        assert_ne!(bouncer.port(), pg.port());
        assert_eq!(psql(&bouncer.url(), "SELECT 41 + 1").await, "42");
        let port = bouncer.port();
        bouncer.kill();
        bouncer.restart().await.expect("pgbouncer restarts");
        assert_eq!(bouncer.port(), port);
        assert_eq!(psql(&bouncer.url(), "SELECT 1").await, "1");
        pg.restart().await.expect("postgres restarts");
        assert_eq!(psql(&bouncer.url(), "SELECT 2").await, "2");
        let ini = std::fs::read_to_string(bouncer.dir().join("pgbouncer.ini")).expect("ini");
        assert!(
            ini.contains(&format!("pool_mode = {}", mode.as_str())),
            "{ini}"
        );
        tokio::time::timeout(NORMAL, async { drop(bouncer) })
            .await
            .expect("drop is quick");
    }
}
