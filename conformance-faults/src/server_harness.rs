//! [`ServerHarness`]: a [`FaultHarness`] over throwaway servers it starts and owns,
//! with every client behind its own fault proxies.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::LockError;
use tokio::sync::Mutex as AsyncMutex;

use super::harness::{Claim, Fault, FaultClient, FaultHarness, NetFaults, ServerAction, Topology};
use distlock_conformance::{Client, Harness, UrlConnector};
use distlock_test_servers::FaultProxy;
use distlock_test_servers::{
    PostgresServer, PostgresServerOptions, RedisServer, ServerError, ZooKeeperEnsemble,
    ZooKeeperServer,
};

/// Which servers a [`ServerHarness`] starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerKind {
    /// `nodes` redis-servers without persistence: one is a single node, more is Redlock.
    Redis {
        /// How many.
        nodes: usize,
    },
    /// One PostgreSQL server.
    Postgres,
    /// One standalone ZooKeeper server.
    ZooKeeper,
    /// A ZooKeeper ensemble of `nodes`.
    ZooKeeperEnsemble {
        /// How many.
        nodes: usize,
    },
}

impl ServerKind {
    /// The kind a backend URL's scheme names, with the node count of its host list.
    pub fn for_url(url: &str) -> Option<ServerKind> {
        let (scheme, rest) = url.split_once("://")?;
        let hosts = rest
            .split(['/', '?'])
            .next()
            .map_or(1, |h| h.split(',').count().max(1));
        match scheme {
            "redis" => Some(ServerKind::Redis { nodes: 1 }),
            "redis+redlock" => Some(ServerKind::Redis { nodes: hosts }),
            "postgres" | "postgresql" => Some(ServerKind::Postgres),
            "zk" | "zookeeper" if hosts > 1 => Some(ServerKind::ZooKeeperEnsemble { nodes: hosts }),
            "zk" | "zookeeper" => Some(ServerKind::ZooKeeper),
            _ => None,
        }
    }

    /// What the backend claims under `fault` with these servers, from its documented
    /// semantics.
    pub fn claim(self, fault: Fault) -> Claim {
        let not = |why: &str| Claim::NotClaimed(why.to_owned());
        match (self, fault) {
            (ServerKind::Redis { nodes: 1 }, Fault::ServerRestart) => not(
                "redis-server without persistence forgets held locks and the fencing counter when restarted",
            ),
            (ServerKind::Redis { .. }, Fault::ServerRestart) => not(
                "Redlock nodes without persistence forget held locks when all restart at once",
            ),
            (ServerKind::Postgres, Fault::ServerRestart) => not(
                "advisory locks die with the server; a holder learns of it only when its session breaks",
            ),
            _ => Claim::Safe,
        }
    }
}

enum Servers {
    Redis(Vec<RedisServer>),
    Postgres(PostgresServer),
    ZooKeeper(ZooKeeperServer),
    Ensemble(ZooKeeperEnsemble),
}

/// Throwaway servers of one [`ServerKind`], started by the harness, and clients made
/// by a connector from URLs that point at per-client fault proxies. Postgres clients
/// are named `distlock-fault-N` (`application_name`) so one client's sessions can be
/// terminated.
pub struct ServerHarness {
    kind: ServerKind,
    servers: AsyncMutex<Servers>,
    ports: Vec<u16>,
    connector: UrlConnector,
    proxies: Mutex<Vec<FaultProxy>>,
    next_id: AtomicUsize,
    ttl: Duration,
    slack: Duration,
    crash_bound: Duration,
    dead_waiter_bound: Option<Duration>,
}

fn err(e: ServerError) -> String {
    e.to_string()
}

impl ServerHarness {
    /// Starts the servers of `kind`; clients come from `connector`.
    ///
    /// # Errors
    /// A server that cannot start.
    pub async fn start(kind: ServerKind, connector: UrlConnector) -> Result<Self, ServerError> {
        let servers = match kind {
            ServerKind::Redis { nodes } => {
                let mut all = Vec::new();
                for _ in 0..nodes.max(1) {
                    all.push(RedisServer::start().await?);
                }
                Servers::Redis(all)
            }
            ServerKind::Postgres => {
                // 16 contending clients with a few sessions each, and the waits'.
                let config =
                    PostgresServerOptions::default().with_setting("max_connections", "400");
                Servers::Postgres(PostgresServer::start_with(config).await?)
            }
            ServerKind::ZooKeeper => Servers::ZooKeeper(ZooKeeperServer::start().await?),
            ServerKind::ZooKeeperEnsemble { nodes } => {
                Servers::Ensemble(ZooKeeperEnsemble::start(nodes).await?)
            }
        };
        let ports = match &servers {
            Servers::Redis(all) => all.iter().map(RedisServer::port).collect(),
            Servers::Postgres(s) => vec![s.port()],
            Servers::ZooKeeper(s) => vec![s.port()],
            Servers::Ensemble(e) => e.nodes().iter().map(ZooKeeperServer::port).collect(),
        };
        Ok(ServerHarness {
            kind,
            servers: AsyncMutex::new(servers),
            ports,
            connector,
            proxies: Mutex::new(Vec::new()),
            next_id: AtomicUsize::new(0),
            ttl: Duration::from_millis(500),
            slack: Duration::from_secs(1),
            crash_bound: Duration::from_millis(500),
            dead_waiter_bound: None,
        })
    }

    /// Sets the TTL scenarios use and the longest a cut-off holder's lock survives.
    pub fn with_timing(mut self, ttl: Duration, crash_bound: Duration) -> Self {
        self.ttl = ttl;
        self.crash_bound = crash_bound;
        self
    }

    /// Sets the longest a crashed waiter holds up the FIFO queue behind it
    /// ([`Harness::dead_waiter_bound`]; by default the crash bound).
    pub fn with_dead_waiter_bound(mut self, bound: Duration) -> Self {
        self.dead_waiter_bound = Some(bound);
        self
    }

    /// The kind of servers.
    pub fn kind(&self) -> ServerKind {
        self.kind
    }

    /// The servers' ports, in node order.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// The URL to the servers at `ports` (the real ones, or a client's proxies), for
    /// client number `id`.
    pub fn url_for(&self, ports: &[u16], id: usize) -> String {
        let hosts = ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        match self.kind {
            ServerKind::Redis { nodes: 1 } => format!("redis://{hosts}"),
            ServerKind::Redis { .. } => format!("redis+redlock://{hosts}"),
            ServerKind::Postgres => {
                format!("postgres://postgres@{hosts}/postgres?application_name=distlock-fault-{id}")
            }
            ServerKind::ZooKeeper | ServerKind::ZooKeeperEnsemble { .. } => {
                format!("zookeeper://{hosts}")
            }
        }
    }

    /// The direct URL (no proxies).
    pub fn url(&self) -> String {
        self.url_for(&self.ports, usize::MAX)
    }
}

#[async_trait]
impl Harness for ServerHarness {
    fn name(&self) -> String {
        self.url_for(&self.ports, 0)
            .split('?')
            .next()
            .unwrap_or_default()
            .to_owned()
    }

    async fn client(&self) -> Result<Client, LockError> {
        Ok(self.fault_client().await?.client)
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    fn slack(&self) -> Duration {
        self.slack
    }

    fn crash_bound(&self, _ttl: Duration) -> Duration {
        self.crash_bound
    }

    fn dead_waiter_bound(&self) -> Duration {
        self.dead_waiter_bound.unwrap_or(self.crash_bound)
    }
}

#[async_trait]
impl FaultHarness for ServerHarness {
    async fn fault_client(&self) -> Result<FaultClient, LockError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut proxies = Vec::new();
        for port in &self.ports {
            let upstream = SocketAddr::from(([127, 0, 0, 1], *port));
            let proxy = FaultProxy::start(upstream)
                .await
                .map_err(|e| LockError::connection("conformance", e))?;
            proxies.push(proxy);
        }
        let ports: Vec<u16> = proxies.iter().map(|p| p.local_addr().port()).collect();
        let lock = (self.connector)(self.url_for(&ports, id)).await?;
        self.proxies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(proxies.iter().cloned());
        Ok(FaultClient {
            id,
            client: Client::new(lock),
            net: Some(NetFaults::new(proxies)),
        })
    }

    fn topology(&self) -> Topology {
        match self.kind {
            ServerKind::Redis { nodes: 1 } | ServerKind::Postgres | ServerKind::ZooKeeper => {
                Topology::Single
            }
            ServerKind::Redis { nodes } => Topology::Quorum { nodes },
            ServerKind::ZooKeeperEnsemble { nodes } => Topology::Ensemble { nodes },
        }
    }

    async fn control(&self, node: usize, action: ServerAction) -> Result<(), String> {
        let mut servers = self.servers.lock().await;
        let single = |node: usize| {
            if node == 0 {
                Ok(())
            } else {
                Err(format!("no node {node}: one server"))
            }
        };
        // The server types share these methods but no trait.
        macro_rules! act_on {
            ($server:expr) => {
                match action {
                    ServerAction::Kill => {
                        $server.kill();
                        Ok(())
                    }
                    ServerAction::Restart => $server.restart().await.map_err(err),
                    ServerAction::Pause => $server.pause().map_err(err),
                    ServerAction::Resume => $server.resume().map_err(err),
                }
            };
        }
        match &mut *servers {
            Servers::Redis(all) => {
                let count = all.len();
                let server = all
                    .get_mut(node)
                    .ok_or_else(|| format!("no node {node} of {count}"))?;
                act_on!(server)
            }
            Servers::Postgres(server) => {
                single(node)?;
                act_on!(server)
            }
            Servers::ZooKeeper(server) => {
                single(node)?;
                act_on!(server)
            }
            Servers::Ensemble(ensemble) => match action {
                ServerAction::Kill => ensemble.kill_node(node).map_err(err),
                ServerAction::Restart => ensemble.restart_node(node).await.map_err(err),
                ServerAction::Pause => ensemble.pause_node(node).map_err(err),
                ServerAction::Resume => ensemble.resume_node(node).map_err(err),
            },
        }
    }

    async fn leader(&self) -> Option<usize> {
        match &*self.servers.lock().await {
            Servers::Ensemble(ensemble) => ensemble.leader().await,
            _ => None,
        }
    }

    async fn terminate_session(&self, client: &FaultClient) -> Result<(), String> {
        match &*self.servers.lock().await {
            Servers::Postgres(server) => {
                let name = format!("distlock-fault-{}", client.id);
                match server.terminate_sessions(&name).await.map_err(err)? {
                    0 => Err(format!("no session is named {name}")),
                    _ => Ok(()),
                }
            }
            _ => Err("only Postgres has server sessions to terminate".to_owned()),
        }
    }

    fn claim(&self, fault: Fault) -> Claim {
        self.kind.claim(fault)
    }
}
