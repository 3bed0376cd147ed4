//! [`ServerHarness`]: a [`FaultHarness`] over throwaway servers the test started and
//! handed over, with every client behind its own fault proxies. The backend's test
//! says how to reach the servers (a URL template) and what the backend promises
//! under each fault (its claims); the kit knows no backend.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::LockError;
use tokio::sync::Mutex as AsyncMutex;

use super::harness::{Claim, Fault, FaultClient, FaultHarness, NetFaults, ServerAction, Topology};
use distlock_conformance::{Client, Harness, UrlConnector};
use distlock_test_servers::{
    loopback_hosts, EtcdCluster, FaultProxy, ServerControl, ServerError, Started, ZooKeeperEnsemble,
};

/// Ends the server-side sessions of one client: given the client's number, the
/// count of sessions ended, or why not.
pub type SessionTerminator =
    Arc<dyn Fn(usize) -> Pin<Box<dyn Future<Output = Result<usize, String>> + Send>> + Send + Sync>;

enum Servers {
    /// One server, or independent nodes (a client-side quorum).
    Nodes(Vec<Box<dyn ServerControl>>),
    /// A replicated ensemble with an elected leader.
    Ensemble(ZooKeeperEnsemble),
    /// An etcd cluster: raft, with an elected leader.
    Etcd(EtcdCluster),
}

/// Throwaway servers handed over by the test, and clients made by a connector from
/// URLs that point at per-client fault proxies. Every client's crash hook cuts its
/// proxies, so the kit's crash scenarios run too.
pub struct ServerHarness {
    servers: AsyncMutex<Servers>,
    ensemble: bool,
    ports: Vec<u16>,
    url_template: String,
    connector: UrlConnector,
    claims: Arc<dyn Fn(Fault) -> Claim + Send + Sync>,
    terminator: Option<SessionTerminator>,
    proxies: Mutex<Vec<FaultProxy>>,
    next_id: AtomicUsize,
    ttl: Duration,
    slack: Duration,
    /// `None`: the lease, as [`Harness::crash_bound`] has it by default.
    crash_bound: Option<Duration>,
    dead_waiter_bound: Option<Duration>,
}

fn err(e: ServerError) -> String {
    e.to_string()
}

impl ServerHarness {
    /// A harness over `nodes`: one server, or independent nodes a client reaches
    /// as a quorum (Redlock). Client URLs come from `url_template`, in which
    /// `{hosts}` is replaced by `127.0.0.1:PORT` per node (comma-separated; the
    /// ports of the client's proxies) and `{client}` by the client's number, e.g.
    /// `redis+redlock://{hosts}`. The backend claims safety under every fault
    /// until [`with_claims`](Self::with_claims) says otherwise.
    pub fn new(
        nodes: Vec<Box<dyn ServerControl>>,
        url_template: impl Into<String>,
        connector: UrlConnector,
    ) -> Self {
        let ports = nodes.iter().map(|n| n.port()).collect();
        Self::with_servers(Servers::Nodes(nodes), ports, url_template.into(), connector)
    }

    /// A harness over a replicated `ensemble` (leader election and leader loss
    /// apply); `url_template` as in [`new`](Self::new).
    pub fn over_ensemble(
        ensemble: ZooKeeperEnsemble,
        url_template: impl Into<String>,
        connector: UrlConnector,
    ) -> Self {
        let ports = ensemble.nodes().iter().map(|n| n.port()).collect();
        Self::with_servers(
            Servers::Ensemble(ensemble),
            ports,
            url_template.into(),
            connector,
        )
    }

    /// A harness over an etcd `cluster` (leader election and leader loss apply, as
    /// for a ZooKeeper ensemble); `url_template` as in [`new`](Self::new).
    pub fn over_etcd_cluster(
        cluster: EtcdCluster,
        url_template: impl Into<String>,
        connector: UrlConnector,
    ) -> Self {
        let ports = cluster.nodes().iter().map(|n| n.port()).collect();
        Self::with_servers(
            Servers::Etcd(cluster),
            ports,
            url_template.into(),
            connector,
        )
    }

    /// A harness over servers a [`distlock_test_servers::ServerKind`] started: nodes,
    /// an ensemble or a cluster, as [`new`](Self::new),
    /// [`over_ensemble`](Self::over_ensemble) and
    /// [`over_etcd_cluster`](Self::over_etcd_cluster) take them; `url_template` as in
    /// [`new`](Self::new).
    pub fn over_started(
        started: Started,
        url_template: impl Into<String>,
        connector: UrlConnector,
    ) -> Self {
        match started {
            Started::Nodes(nodes) => Self::new(nodes, url_template, connector),
            Started::ZooKeeperEnsemble(ensemble) => {
                Self::over_ensemble(ensemble, url_template, connector)
            }
            Started::EtcdCluster(cluster) => {
                Self::over_etcd_cluster(cluster, url_template, connector)
            }
        }
    }

    fn with_servers(
        servers: Servers,
        ports: Vec<u16>,
        url_template: String,
        connector: UrlConnector,
    ) -> Self {
        ServerHarness {
            ensemble: matches!(servers, Servers::Ensemble(_) | Servers::Etcd(_)),
            servers: AsyncMutex::new(servers),
            ports,
            url_template,
            connector,
            claims: Arc::new(|_| Claim::Safe),
            terminator: None,
            proxies: Mutex::new(Vec::new()),
            next_id: AtomicUsize::new(0),
            ttl: Duration::from_millis(500),
            slack: Duration::from_secs(1),
            crash_bound: None,
            dead_waiter_bound: None,
        }
    }

    /// What the backend claims under each fault ([`FaultHarness::claim`]): its
    /// documented guarantees, stated by the backend's own test.
    pub fn with_claims(mut self, claims: impl Fn(Fault) -> Claim + Send + Sync + 'static) -> Self {
        self.claims = Arc::new(claims);
        self
    }

    /// How to end one client's server-side sessions
    /// ([`FaultHarness::terminate_session`]), for backends that have them.
    pub fn with_session_terminator(mut self, terminator: SessionTerminator) -> Self {
        self.terminator = Some(terminator);
        self
    }

    /// Sets the TTL scenarios use and the longest a cut-off holder's lock survives
    /// (by default 500 ms, and the lease of the scenario at hand).
    pub fn with_timing(mut self, ttl: Duration, crash_bound: Duration) -> Self {
        self.ttl = ttl;
        self.crash_bound = Some(crash_bound);
        self
    }

    /// Sets the longest a crashed waiter holds up the FIFO queue behind it
    /// ([`Harness::dead_waiter_bound`]; by default the crash bound).
    pub fn with_dead_waiter_bound(mut self, bound: Duration) -> Self {
        self.dead_waiter_bound = Some(bound);
        self
    }

    /// The servers' ports, in node order.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// The URL template filled in for the servers at `ports` (the real ones, or a
    /// client's proxies) and client number `id`.
    pub fn url_for(&self, ports: &[u16], id: usize) -> String {
        self.url_template
            .replace("{hosts}", &loopback_hosts(ports))
            .replace("{client}", &id.to_string())
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

    fn crash_bound(&self, ttl: Duration) -> Duration {
        self.crash_bound.unwrap_or(ttl)
    }

    fn dead_waiter_bound(&self) -> Duration {
        self.dead_waiter_bound
            .unwrap_or_else(|| self.crash_bound(self.ttl))
    }

    fn url_connector(&self) -> Option<UrlConnector> {
        Some(self.connector.clone())
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
        let client = (self.connector)(self.url_for(&ports, id)).await?;
        self.proxies
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(proxies.iter().cloned());
        let net = NetFaults::new(proxies);
        Ok(FaultClient {
            id,
            client: Client::new(client).with_faults(Arc::new(net.clone())),
            net: Some(net),
        })
    }

    fn topology(&self) -> Topology {
        match (self.ensemble, self.ports.len()) {
            (true, nodes) => Topology::Ensemble { nodes },
            (false, 1) => Topology::Single,
            (false, nodes) => Topology::Quorum { nodes },
        }
    }

    async fn control(&self, node: usize, action: ServerAction) -> Result<(), String> {
        let mut servers = self.servers.lock().await;
        match &mut *servers {
            Servers::Nodes(all) => {
                let count = all.len();
                let server = all
                    .get_mut(node)
                    .ok_or_else(|| format!("no node {node} of {count}"))?;
                match action {
                    ServerAction::Kill => {
                        server.kill();
                        Ok(())
                    }
                    ServerAction::Restart => server.restart().await.map_err(err),
                    ServerAction::Pause => server.pause().map_err(err),
                    ServerAction::Resume => server.resume().map_err(err),
                }
            }
            Servers::Ensemble(ensemble) => match action {
                ServerAction::Kill => ensemble.kill_node(node).map_err(err),
                ServerAction::Restart => ensemble.restart_node(node).await.map_err(err),
                ServerAction::Pause => ensemble.pause_node(node).map_err(err),
                ServerAction::Resume => ensemble.resume_node(node).map_err(err),
            },
            Servers::Etcd(cluster) => match action {
                ServerAction::Kill => cluster.kill_node(node).map_err(err),
                ServerAction::Restart => cluster.restart_node(node).await.map_err(err),
                ServerAction::Pause => cluster.pause_node(node).map_err(err),
                ServerAction::Resume => cluster.resume_node(node).map_err(err),
            },
        }
    }

    async fn unsupported(&self, action: ServerAction) -> Option<String> {
        match (action, &*self.servers.lock().await) {
            (ServerAction::Pause | ServerAction::Resume, Servers::Nodes(all)) => {
                all.iter().find_map(|n| n.pause_unsupported())
            }
            _ => None,
        }
    }

    async fn leader(&self) -> Option<usize> {
        match &*self.servers.lock().await {
            Servers::Ensemble(ensemble) => ensemble.leader().await,
            Servers::Etcd(cluster) => cluster.leader().await,
            Servers::Nodes(_) => None,
        }
    }

    async fn terminate_session(&self, client: &FaultClient) -> Result<(), String> {
        let terminate = self
            .terminator
            .as_ref()
            .ok_or("this backend has no server sessions to terminate")?;
        match terminate(client.id).await? {
            0 => Err(format!("client {} had no session to terminate", client.id)),
            _ => Ok(()),
        }
    }

    fn claim(&self, fault: Fault) -> Claim {
        (self.claims)(fault)
    }
}
