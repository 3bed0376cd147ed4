//! A smoke run of `distlock bench`: tiny counts against a throwaway redis-server, so the
//! tool cannot rot. It checks that every row and ratio is there, never the figures.
//! The rows include the peer crates, so it needs the `compare` feature (scripts/test.sh
//! builds with `--all-features`).
#![cfg(feature = "compare")]

use std::process::Command;

use distlock_test_servers::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_compare_run_prints_every_row_and_ratio_and_plots() {
    let server = RedisServer::start()
        .await
        .unwrap_or_else(|e| panic!("could not start redis-server (run scripts/test.sh): {e}"));
    let dir = tempfile::tempdir().expect("temp dir");
    let plot = dir.path().join("bench.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_distlock"))
        .args(["bench", "--backend", &server.url(), "--compare", "--quick"])
        .arg("--plot")
        .arg(&plot)
        .output()
        .expect("run distlock bench");
    let table = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{table}{stderr}");

    let line = |prefix: &str| {
        table
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no row starting {prefix:?} in:\n{table}"))
    };
    let header = line("| concurrency | distlock |");
    for column in [
        "distlock fifo",
        "distlock/distlock fifo",
        "raw",
        "rslock",
        "distributed-lock",
        "distlock/raw",
        "distlock/rslock",
        "distlock/distributed-lock",
        "distlock semaphore (2 permits)",
        "distlock rw write",
        "distlock rw read",
    ] {
        assert!(header.contains(&format!(" {column} |")), "{header}");
    }
    for concurrency in [1, 16, 64] {
        let row = line(&format!("| {concurrency} | "));
        // Seven rates beside ours (FIFO mode, three comparators, the semaphore and
        // the two sides of the read-write lock) and seven ratios, each a number.
        let cells: Vec<&str> = row
            .split('|')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        assert_eq!(cells.len(), 16, "{row}");
        assert!(cells.iter().all(|c| *c != "–"), "a side is missing: {row}");
    }
    for side in [
        "distlock",
        "distlock fifo",
        "raw",
        "rslock",
        "distributed-lock",
    ] {
        line(&format!("| 1 | {side} | "));
        line(&format!("| 16 | {side} | "));
    }
    // The hot key: distlock and rslock wait for a held key (distributed-lock 0.2 does not).
    line("| distlock | ");
    line("| distlock fifo | ");
    line("| distlock, one client | ");
    line("| rslock | ");
    assert!(table.contains("### Cost of holding"), "{table}");
    line("| 100 | ");

    let svg = std::fs::read_to_string(&plot).expect("the plot was written");
    assert!(
        svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
        "{svg}"
    );
    assert!(
        svg.matches("<polyline").count() >= 6,
        "too few curves: {svg}"
    );
}

#[test]
fn an_unsupported_backend_is_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_distlock"))
        .args(["bench", "--backend", "mongodb://db", "--quick"])
        .output()
        .expect("run distlock bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("error: ") && stderr.contains("redis://"),
        "{stderr}"
    );
}
