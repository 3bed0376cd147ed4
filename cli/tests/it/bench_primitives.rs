//! `distlock bench` on file:// and memory:// (no server, no comparators, so no
//! `compare` feature): the semaphore and read-write rows beside the mutex's. Checks
//! that the rows and ratios are there, never the figures.
#![cfg(feature = "bench")]

use std::process::Command;

/// On file:// and memory:// the semaphore and read-write rows stand beside the mutex,
/// with their ratios to it, from one run; readers are left out of the hot key with
/// the reason.
#[test]
fn semaphore_and_rw_rows_beside_the_mutex_on_file_and_memory() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = format!("file://{}", dir.path().display());
    for url in [file.as_str(), "memory://"] {
        let out = Command::new(env!("CARGO_BIN_EXE_distlock"))
            .args(["bench", "--backend", url, "--quick", "--json"])
            .args(["--concurrency", "1,4"])
            .output()
            .expect("run distlock bench");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{url}: {stderr}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let sides = report["sides"].to_string();
        for side in [
            "distlock semaphore (2 permits)",
            "distlock rw write",
            "distlock rw read",
        ] {
            assert!(sides.contains(side), "{url}: {sides}");
        }
        for row in report["throughput"].as_array().expect("rows") {
            let ratios = row["ratios"].to_string();
            assert!(
                ratios.contains("distlock semaphore") && ratios.contains("distlock rw read"),
                "{url}: {ratios}"
            );
        }
        let handoff = report["handoff"].to_string();
        assert!(
            handoff.contains("distlock semaphore") && handoff.contains("distlock rw write"),
            "{url}: {handoff}"
        );
        assert!(!handoff.contains("rw read"), "{url}: {handoff}");
        assert!(
            report["notes"].to_string().contains("readers share it"),
            "{url}"
        );
    }
}
