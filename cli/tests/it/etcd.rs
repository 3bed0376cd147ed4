//! The CLI on etcd URLs (feature `etcd`; scripts/test.sh builds with `--all-features`):
//! `exec` runs a command under the lock, `status` reads a key `etcdctl lock` holds,
//! `elect` leads and `leader` reads the leader an `etcdctl elect` proposed,
//! `bench --spawn etcd --compare --quick` prints the etcd rows (the figures are not
//! checked), and `conformance --faults --spawn` runs the fault scenarios on a throwaway
//! 3-member cluster.
#![cfg(all(feature = "etcd", feature = "conformance", feature = "bench"))]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use distlock_test_servers::EtcdServer;

fn distlock(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_distlock"))
        .args(args)
        .output()
        .expect("run distlock")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_and_status_work_on_etcd_urls() {
    let server = EtcdServer::start()
        .await
        .unwrap_or_else(|e| panic!("could not start etcd (run scripts/install-deps.sh): {e}"));
    let url = server.url();
    let out = distlock(&["exec", "--backend", &url, "cli-etcd", "--", "echo", "ran"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ran"));

    let free = distlock(&["status", "--backend", &url, "cli-etcd", "--json"]);
    let text = String::from_utf8_lossy(&free.stdout);
    assert!(
        text.contains("\"held\": false") || text.contains("\"held\":false"),
        "{text}"
    );

    // etcdctl holds the lock (the same range distlock uses for key `cli-etcd`).
    let mut holder = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", server.endpoint()))
        .args(["lock", "distlock/cli-etcd"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run etcdctl lock");
    let deadline = Instant::now() + Duration::from_secs(10);
    let held = loop {
        let out = distlock(&["status", "--backend", &url, "cli-etcd", "--json"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.contains("\"held\": true") || text.contains("\"held\":true") {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "status never saw etcdctl's lock: {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(held.contains("distlock/cli-etcd/"), "{held}");
    let _ = holder.kill();
    let _ = holder.wait();
}

/// `elect` leads on an etcd URL and `leader` reads the leader of an `etcdctl elect` on
/// the same election (`distlock/+election/<name>`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elect_and_leader_work_on_etcd_urls() {
    let server = EtcdServer::start()
        .await
        .unwrap_or_else(|e| panic!("could not start etcd (run scripts/install-deps.sh): {e}"));
    let url = server.url();
    let out = distlock(&[
        "elect",
        "--backend",
        &url,
        "--id",
        "cli-a",
        "--once",
        "cli-elect",
        "--",
        "echo",
        "led",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("led"));
    let none = distlock(&["leader", "--backend", &url, "cli-elect", "--json"]);
    let text = String::from_utf8_lossy(&none.stdout);
    assert!(text.contains("\"leader\":null"), "{text}");

    let mut foreign = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", server.endpoint()))
        .args(["elect", "distlock/+election/cli-elect", "etcdctl-proposal"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run etcdctl elect");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = distlock(&["leader", "--backend", &url, "cli-elect", "--json"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if text.contains("\"leader\":\"etcdctl-proposal\"") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "leader never read etcdctl's proposal: {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // etcdctl leads: a campaign that may not wait is refused (exit 75).
    let refused = distlock(&[
        "elect",
        "--backend",
        &url,
        "--id",
        "cli-b",
        "--once",
        "--no-wait",
        "cli-elect",
        "--",
        "echo",
        "led",
    ]);
    assert_eq!(
        refused.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let _ = foreign.kill();
    let _ = foreign.wait();
}

#[test]
fn bench_spawns_etcd_and_prints_the_etcd_rows() {
    let out = distlock(&[
        "bench",
        "--spawn",
        "etcd",
        "--compare",
        "--quick",
        "--hot-workers",
        "9",
    ]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let header = table
        .lines()
        .find(|l| l.starts_with("| concurrency | distlock |"))
        .unwrap_or_else(|| panic!("no throughput table in:\n{table}"));
    for column in ["raw", "etcd-client lock", "distlock/etcd-client lock"] {
        assert!(header.contains(&format!(" {column} |")), "{header}");
    }
    assert!(table.contains("| etcd-client lock | "), "{table}");
    // The hand-off with 8 waiters behind the holder.
    assert!(table.contains("Hot key (9 workers on one key"), "{table}");
}

#[test]
fn bench_hot_workers_below_two_is_a_usage_error() {
    let out = distlock(&[
        "bench",
        "--backend",
        "etcd://127.0.0.1:1",
        "--hot-workers",
        "1",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--hot-workers"), "{stderr}");
}

/// `conformance --faults --spawn` on a 3-member etcd URL starts a throwaway cluster
/// (the URL's hosts are not used) and runs every fault scenario that applies, server
/// faults included: none fails, and the ones that need the cluster run.
#[test]
fn faults_spawn_an_etcd_cluster_and_pass() {
    let out = distlock(&[
        "conformance",
        "--faults",
        "--spawn",
        "--json",
        "--backend",
        "etcd://a:1,b:2,c:3",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let results = json["results"].as_array().unwrap();
    for name in [
        "partitioned_holder_is_fenced_off",
        "server_restart_while_held_and_waited",
        "ensemble_leader_loss",
        "crashed_clients_do_not_stall_the_fifo_queue",
    ] {
        let result = results
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("no {name} in {text}"));
        assert_eq!(result["verdict"]["status"], "pass", "{result}");
        assert_eq!(result["claim"]["claim"], "safe", "{result}");
    }
}
