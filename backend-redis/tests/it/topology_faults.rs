//! The fault kit's master failover against Redis Sentinel and Redis Cluster: the
//! master serving a lock is killed while it is held and waited on, then the master
//! serving an election's name while a leader leads and a standby campaigns.

use std::sync::Arc;

use async_trait::async_trait;
use distlock_api::{LockError, LockKey};
use distlock_conformance::{Client, Harness};
use distlock_conformance_faults::{
    run_selected_faults, Claim, Fault, FaultHarness, FaultVerdict, ServerAction, Topology,
};
use distlock_redis::{KeyNames, RedisLock};
use distlock_test_servers::ServerControl;
use distlock_test_servers::{RedisCluster, RedisSentinelGroup};
use tokio::sync::Mutex;
use tokio::time::{Duration, Instant};

enum Servers {
    Sentinel(RedisSentinelGroup),
    Cluster(RedisCluster),
}

/// Clients connect straight to the topology's URL (no proxies: the servers they reach
/// are the ones the topology names); the harness kills and restarts server nodes.
struct ReplicatedHarness {
    url: String,
    nodes: usize,
    servers: Mutex<Servers>,
}

#[async_trait]
impl Harness for ReplicatedHarness {
    fn name(&self) -> String {
        self.url.clone()
    }

    async fn client(&self) -> Result<Client, LockError> {
        let lock = RedisLock::connect(&self.url).await?;
        Ok(Client::new(lock.client()))
    }
}

#[async_trait]
impl FaultHarness for ReplicatedHarness {
    fn topology(&self) -> Topology {
        Topology::Replicated { nodes: self.nodes }
    }

    async fn control(&self, node: usize, action: ServerAction) -> Result<(), String> {
        let mut servers = self.servers.lock().await;
        let server = match &mut *servers {
            Servers::Sentinel(group) => group.servers().get_mut(node),
            Servers::Cluster(cluster) => cluster.nodes().get_mut(node),
        }
        .ok_or_else(|| format!("no node {node}"))?;
        match action {
            ServerAction::Kill => {
                server.kill();
                Ok(())
            }
            ServerAction::Restart => {
                server.restart().await.map_err(|e| e.to_string())?;
                // Best effort: a node that is slow to sync fails nothing here; the next
                // failover on these servers reports whether a replica took over.
                if let Err(why) = replica_in_sync(server.port()).await {
                    println!("{why}");
                }
                Ok(())
            }
            ServerAction::Pause => server.pause().map_err(|e| e.to_string()),
            ServerAction::Resume => server.resume().map_err(|e| e.to_string()),
            other => Err(format!("{other:?} is not supported")),
        }
    }

    async fn master_of(&self, key: &LockKey) -> Option<usize> {
        let mut servers = self.servers.lock().await;
        match &mut *servers {
            Servers::Sentinel(group) => {
                let port = group.master_port().await.ok()?;
                group.index_of(port)
            }
            Servers::Cluster(cluster) => {
                let slot = cluster.key_slot(&KeyNames::for_key(key).lock).await.ok()?;
                let port = cluster.master_of_slot(slot).await.ok()?;
                cluster.nodes().iter().position(|n| n.port() == port)
            }
        }
    }

    fn claim(&self, fault: Fault) -> Claim {
        match fault {
            Fault::MasterFailover => Claim::NotClaimed(
                "replication is asynchronous: a grant not yet on the replica when the master dies is lost, and another client can be granted while the holder still holds".into(),
            ),
            _ => Claim::Safe,
        }
    }
}

/// Waits (at most 20 s) until the restarted node on `port` serves as a replica in sync
/// with its master: a replica that never synchronised may not take over, so the next
/// failover on the same servers might not happen. The error says what it last saw.
async fn replica_in_sync(port: u16) -> Result<(), String> {
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < Duration::from_secs(20) {
        let info = async {
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
            let mut conn = client.get_multiplexed_async_connection().await?;
            redis::cmd("INFO")
                .arg("replication")
                .query_async::<String>(&mut conn)
                .await
        };
        match info.await {
            Ok(info) if info.contains("role:slave") && info.contains("master_link_status:up") => {
                return Ok(())
            }
            Ok(info) => last = info,
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!(
        "node {port} was not a replica in sync 20 s after its restart: {last}"
    ))
}

async fn failover(servers: Servers, url: String, nodes: usize) {
    let harness = ReplicatedHarness {
        url,
        nodes,
        servers: Mutex::new(servers),
    };
    // The lock's scenario, then the election's on the same servers (the killed
    // master is back as a replica by then, and the name's new master is killed).
    let scenarios = [
        "master_failover_while_held_and_waited",
        "election_through_master_failover",
    ];
    let report = run_selected_faults(Arc::new(harness), |s| scenarios.contains(&s.name)).await;
    print!("{}", report.to_table());
    for name in scenarios {
        assert!(
            matches!(
                report.verdict(name),
                Some(FaultVerdict::Pass(_) | FaultVerdict::Shown(_))
            ),
            "{name}:\n{}",
            report.to_table()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_master_failover_while_held_and_waited() {
    let group = RedisSentinelGroup::start()
        .await
        .unwrap_or_else(|e| panic!("could not start a Sentinel group (run scripts/test.sh): {e}"));
    let url = group.url();
    failover(Servers::Sentinel(group), url, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_master_failover_while_held_and_waited() {
    let cluster = RedisCluster::start()
        .await
        .unwrap_or_else(|e| panic!("could not start a Redis Cluster (run scripts/test.sh): {e}"));
    let url = cluster.url();
    failover(Servers::Cluster(cluster), url, 6).await;
}
