//! A throwaway Redis Cluster: three masters, each with one replica, on 127.0.0.1.

use crate::ServerControl;
use std::net::{Ipv4Addr, TcpListener};
use std::time::{Duration, Instant};

use rand::Rng;

use std::path::PathBuf;

use super::free_port;
use super::redis::{redis_cli, replica_in_sync};
use super::redis_shared::TlsFiles;
use super::{RedisServer, RedisServerOptions, ServerError};

const SERVER: &str = "redis-cluster";
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The cluster bus of a node listens on its port + 10000.
const BUS_OFFSET: u16 = 10000;

/// Six `redis-server --cluster-enabled yes` nodes joined by `redis-cli --cluster
/// create … --cluster-replicas 1` (`cluster-node-timeout` 1000 ms, so a replica takes
/// over a killed master within a few seconds). Dropping the handle kills every node.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// Each node's TLS port, for a cluster started with TLS.
    tls_ports: Vec<Option<u16>>,
}

impl RedisCluster {
    /// Starts six nodes on ports whose bus port (+10000) is free too, creates the
    /// cluster and waits (at most 30 s) until every node reports `cluster_state:ok`.
    ///
    /// # Errors
    /// As [`RedisServer::start_with`]; [`ServerError::Setup`] when `redis-cli --cluster
    /// create` fails; [`ServerError::StartTimeout`] when the cluster does not settle.
    pub async fn start() -> Result<RedisCluster, ServerError> {
        RedisCluster::start_with_tls(None).await
    }

    /// As [`RedisCluster::start`], and with `tls` (a certificate and its key, PEM
    /// files; the certificate is its own CA) every node also listens for TLS on a
    /// second port (clients need not show a certificate) and the cluster bus and
    /// replication use TLS: see [`RedisCluster::tls_url`].
    ///
    /// # Errors
    /// As [`RedisCluster::start`].
    pub async fn start_with_tls(
        tls: Option<(PathBuf, PathBuf)>,
    ) -> Result<RedisCluster, ServerError> {
        let tls = tls.map(|(cert, key)| TlsFiles { cert, key });
        let (mut nodes, mut tls_ports) = (Vec::new(), Vec::new());
        for _ in 0..6 {
            let tls_port = tls.as_ref().map(|_| free_port()).transpose()?;
            nodes.push(start_node(tls.as_ref().zip(tls_port)).await?);
            tls_ports.push(tls_port);
        }
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addresses.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "1", "--cluster-yes"]);
        redis_cli(nodes[0].port(), &args)
            .await
            .map_err(|e| ServerError::Setup {
                server: SERVER,
                step: "redis-cli --cluster create".into(),
                detail: e.to_string(),
            })?;
        let cluster = RedisCluster { nodes, tls_ports };
        cluster.wait_settled().await?;
        Ok(cluster)
    }

    /// Polls until every live node says `cluster_state:ok` and knows all six nodes,
    /// and every replica has synchronised with its master (a replica that never did
    /// refuses to take over).
    async fn wait_settled(&self) -> Result<(), ServerError> {
        let started = Instant::now();
        let mut last = String::new();
        while started.elapsed() < READY_TIMEOUT {
            let mut ok = true;
            for node in &self.nodes {
                let info = redis_cli(node.port(), &["CLUSTER", "INFO"])
                    .await
                    .unwrap_or_default();
                if !info.contains("cluster_state:ok") || !info.contains("cluster_known_nodes:6") {
                    ok = false;
                    last = format!("node {}: {}", node.port(), info.trim());
                }
                if !replica_in_sync(node.port()).await {
                    ok = false;
                    last = format!("node {}: replica not in sync yet", node.port());
                }
            }
            if ok {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(ServerError::StartTimeout {
            server: SERVER,
            waited: READY_TIMEOUT,
            last_probe: last,
            log: self.nodes[0].log_path(),
            log_tail: self.nodes[0].logs(),
        })
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3` (three of the nodes
    /// as seeds).
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self
            .nodes
            .iter()
            .take(3)
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}", seeds.join(","))
    }

    /// `rediss+cluster://…#insecure` over three nodes' TLS ports, for a cluster
    /// started with TLS; `None` otherwise.
    pub fn tls_url(&self) -> Option<String> {
        let seeds: Option<Vec<String>> = self
            .tls_ports
            .iter()
            .take(3)
            .map(|p| p.map(|p| format!("127.0.0.1:{p}")))
            .collect();
        Some(format!("rediss+cluster://{}#insecure", seeds?.join(",")))
    }

    /// The nodes, in start order.
    pub fn nodes(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }

    /// The port of the master serving `slot` now, as the first answering node's
    /// `CLUSTER SHARDS`-free `CLUSTER SLOTS` view names it.
    ///
    /// # Errors
    /// [`ServerError::Probe`] when no node answers or none serves the slot.
    pub async fn master_of_slot(&mut self, slot: u16) -> Result<u16, ServerError> {
        let mut last = String::new();
        for node in &mut self.nodes {
            if !node.is_running() {
                continue;
            }
            match redis_cli(node.port(), &["CLUSTER", "SLOTS"]).await {
                Ok(slots) => {
                    // Each range: start, end, then master ip, port, id, …
                    let lines: Vec<&str> = slots.lines().collect();
                    for window in lines.windows(4) {
                        if let (Ok(start), Ok(end), Ok(port)) = (
                            window[0].parse::<u16>(),
                            window[1].parse::<u16>(),
                            window[3].parse::<u16>(),
                        ) {
                            if window[2] == "127.0.0.1" && (start..=end).contains(&slot) {
                                return Ok(port);
                            }
                        }
                    }
                    last = slots;
                }
                Err(e) => last = e.to_string(),
            }
        }
        Err(ServerError::Probe {
            server: SERVER,
            detail: format!("no node names the master of slot {slot}: {last}"),
        })
    }

    /// Runs `CLUSTER KEYSLOT key` on a live node.
    ///
    /// # Errors
    /// [`ServerError::Probe`] when no node answers.
    pub async fn key_slot(&mut self, key: &str) -> Result<u16, ServerError> {
        let port = self
            .nodes
            .iter_mut()
            .find_map(|n| n.is_running().then(|| n.port()))
            .ok_or(ServerError::NotRunning { server: SERVER })?;
        let reply = redis_cli(port, &["CLUSTER", "KEYSLOT", key]).await?;
        reply.trim().parse().map_err(|_| ServerError::Probe {
            server: SERVER,
            detail: format!("CLUSTER KEYSLOT answered {reply:?}"),
        })
    }

    /// Waits (at most 30 s) until a live node other than `old` serves `slot` and the
    /// cluster is ok again: a replica took over after a master was killed.
    ///
    /// # Errors
    /// [`ServerError::StartTimeout`] when no replica takes over in time.
    pub async fn wait_slot_moves_from(&mut self, slot: u16, old: u16) -> Result<u16, ServerError> {
        let started = Instant::now();
        while started.elapsed() < READY_TIMEOUT {
            if let Ok(port) = self.master_of_slot(slot).await {
                if port != old {
                    let info = redis_cli(port, &["CLUSTER", "INFO"])
                        .await
                        .unwrap_or_default();
                    if info.contains("cluster_state:ok") {
                        return Ok(port);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(ServerError::StartTimeout {
            server: SERVER,
            waited: READY_TIMEOUT,
            last_probe: format!("slot {slot} still on {old}"),
            log: self.nodes[0].log_path(),
            log_tail: self.nodes[0].logs(),
        })
    }
}

/// Starts one cluster node on a port below 55536 whose bus port is free as well,
/// retrying on another pair when either is taken.
async fn start_node(tls: Option<(&TlsFiles, u16)>) -> Result<RedisServer, ServerError> {
    let mut last = None;
    for _ in 0..10 {
        let port = cluster_port()?;
        let mut extra_args: Vec<String> = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "1000",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        if let Some((files, tls_port)) = tls {
            for (name, value) in files.directives(tls_port) {
                extra_args.extend([format!("--{name}"), value]);
            }
            extra_args.extend(["--tls-cluster".into(), "yes".into()]);
        }
        let options = RedisServerOptions {
            port: Some(port),
            extra_args,
            ..RedisServerOptions::default()
        };
        match RedisServer::start_with(options).await {
            Ok(node) => return Ok(node),
            Err(e) if e.is_port_conflict() => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or(ServerError::InvalidArgument(
        "no free port pair for a cluster node".into(),
    )))
}

/// A port in 20000..45000 that is free, with its bus port (+10000) free too.
fn cluster_port() -> Result<u16, ServerError> {
    let mut rng = rand::rng();
    for _ in 0..200 {
        let port: u16 = rng.random_range(20000..45000);
        let free = |p: u16| TcpListener::bind((Ipv4Addr::LOCALHOST, p)).is_ok();
        if free(port) && free(port + BUS_OFFSET) {
            return Ok(port);
        }
    }
    Err(ServerError::InvalidArgument(
        "no free port pair (port and port + 10000) found".into(),
    ))
}
