//! [`FaultHarness`]: what a fault scenario may do to the backend under test.

use std::time::Duration;

use async_trait::async_trait;
use distlock_api::LockError;
use serde::Serialize;

use distlock_conformance::{Client, ClientFaults, Harness};
use distlock_test_servers::FaultProxy;

/// The skip reason of a server fault on a harness that does not own the servers.
pub const NOT_CONTROLLED: &str = "server not controlled by the harness";

/// Network faults on one client's path to the servers: every proxy that client's
/// connections go through (one per server node), acted on together.
#[derive(Clone, Debug)]
pub struct NetFaults(Vec<FaultProxy>);

impl NetFaults {
    /// Faults over `proxies`.
    pub fn new(proxies: Vec<FaultProxy>) -> Self {
        NetFaults(proxies)
    }

    /// The proxies.
    pub fn proxies(&self) -> &[FaultProxy] {
        &self.0
    }

    /// Adds `one_way` latency to every chunk in both directions.
    pub fn latency(&self, one_way: Duration) {
        self.0.iter().for_each(|p| p.set_latency(one_way));
    }

    /// Partitions the client from every server.
    pub fn blackhole(&self) {
        self.0.iter().for_each(FaultProxy::blackhole);
    }

    /// Requests reach the servers; replies are lost.
    pub fn drop_replies(&self) {
        self.0.iter().for_each(FaultProxy::drop_replies);
    }

    /// Resets every open connection.
    pub fn reset(&self) {
        self.0.iter().for_each(FaultProxy::reset_all);
    }

    /// Ends a partition or lost replies the way TCP would: the connections that lost
    /// bytes are reset (a real stream cannot skip bytes), then traffic flows again.
    pub fn heal_with_reset(&self) {
        self.0.iter().for_each(|p| {
            p.reset_all();
            p.heal();
        });
    }

    /// Back to clean forwarding; open connections stay open.
    pub fn heal(&self) {
        self.0.iter().for_each(FaultProxy::heal);
    }
}

/// A client's crash: every proxy of its cut at once, so to the servers its process
/// is gone (connections reset, nothing more arrives) while its lock object lives on.
#[async_trait]
impl ClientFaults for NetFaults {
    async fn crash(&self) -> Result<(), LockError> {
        self.0.iter().for_each(FaultProxy::cut);
        Ok(())
    }
}

/// A client of the backend under test, numbered, with its network faults if the
/// harness can inject them.
#[derive(Clone)]
#[non_exhaustive]
pub struct FaultClient {
    /// The harness's number for this client (unique per harness).
    pub id: usize,
    /// The client.
    pub client: Client,
    /// Its network faults, if it sits behind proxies.
    pub net: Option<NetFaults>,
}

/// How the servers behind the harness are laid out, as far as fault scenarios care.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Topology {
    /// The harness does not own the servers: no server faults.
    Uncontrolled,
    /// One server.
    Single,
    /// Independent nodes with a client-side majority (Redlock).
    Quorum {
        /// How many nodes.
        nodes: usize,
    },
    /// A replicated ensemble with an elected leader (ZooKeeper).
    Ensemble {
        /// How many nodes.
        nodes: usize,
    },
    /// Masters with asynchronous replicas and automatic failover (Redis Sentinel,
    /// Redis Cluster); [`FaultHarness::master_of`] names a key's master.
    Replicated {
        /// How many server nodes, masters and replicas.
        nodes: usize,
    },
}

impl Topology {
    /// How many server nodes the harness can act on.
    pub fn nodes(self) -> usize {
        match self {
            Topology::Uncontrolled => 0,
            Topology::Single => 1,
            Topology::Quorum { nodes }
            | Topology::Ensemble { nodes }
            | Topology::Replicated { nodes } => nodes,
        }
    }
}

/// What the harness can do to one server node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerAction {
    /// SIGKILL.
    Kill,
    /// Start again on the same port and data, waiting until it serves.
    Restart,
    /// SIGSTOP.
    Pause,
    /// SIGCONT.
    Resume,
}

/// The faults the scenarios inject, for [`FaultHarness::claim`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Fault {
    /// A holder cut off from the servers for longer than its lease.
    Partition,
    /// A holder that stops renewing and stalls past its lease, then writes.
    HolderPause,
    /// Every server paused during an acquire.
    ServerPause,
    /// The reply to an applied acquire lost.
    LostReply,
    /// Every server killed and restarted while locks are held and waited on.
    ServerRestart,
    /// A minority, then a majority, of independent nodes lost.
    NodeLoss,
    /// An ensemble's leader killed.
    LeaderLoss,
    /// The master serving a key killed, so that a replica takes over.
    MasterFailover,
    /// A holder's server-side session terminated.
    SessionTerminated,
    /// Random network faults under contention.
    RandomFaults,
    /// Clients killed while queued for a lock (FIFO), or while holding it with a queue
    /// behind them.
    QueueCrash,
}

/// Whether a backend claims safety (no exclusion, fencing or lost-update violation)
/// under a fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "claim", content = "why", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Claim {
    /// It does: any violation fails the scenario.
    Safe,
    /// It does not, for the reason given: violations are shown, not failed.
    NotClaimed(String),
}

/// A [`Harness`] that also lets scenarios inject faults. Every hook is optional; a
/// scenario that needs a missing one is skipped with the reason.
#[async_trait]
pub trait FaultHarness: Harness {
    /// A new client, numbered, with network faults if the harness has proxies. The
    /// default wraps [`Harness::client`] without network faults.
    ///
    /// # Errors
    /// Whatever connecting raised.
    async fn fault_client(&self) -> Result<FaultClient, LockError> {
        Ok(FaultClient {
            id: 0,
            client: self.client().await?,
            net: None,
        })
    }

    /// The server layout the harness can act on. The default owns no servers.
    fn topology(&self) -> Topology {
        Topology::Uncontrolled
    }

    /// Does `action` to server node `node`.
    ///
    /// # Errors
    /// A reason, when the harness cannot (the default: [`NOT_CONTROLLED`]) or the
    /// server failed to obey.
    async fn control(&self, node: usize, action: ServerAction) -> Result<(), String> {
        let _ = (node, action);
        Err(NOT_CONTROLLED.to_owned())
    }

    /// Why this harness cannot do `action` to its servers (its provider lacks it,
    /// as containers lack pausing), or `None` when it can or owns no servers.
    /// Scenarios that need the action skip with this reason.
    async fn unsupported(&self, action: ServerAction) -> Option<String> {
        let _ = action;
        None
    }

    /// The ensemble's current leader, for ensembles.
    async fn leader(&self) -> Option<usize> {
        None
    }

    /// The node that is master for `key` now, for replicated topologies (see
    /// [`Topology::Replicated`]); `None` (the default) when unknown.
    async fn master_of(&self, key: &distlock_api::LockKey) -> Option<usize> {
        let _ = key;
        None
    }

    /// Terminates `client`'s sessions on the server side (Postgres
    /// `pg_terminate_backend`).
    ///
    /// # Errors
    /// A reason when the harness cannot (the default).
    async fn terminate_session(&self, client: &FaultClient) -> Result<(), String> {
        let _ = client;
        Err("the harness cannot terminate a client's server session".to_owned())
    }

    /// Whether the backend claims safety under `fault`. The default claims it
    /// everywhere; say honestly where your backend does not.
    fn claim(&self, fault: Fault) -> Claim {
        let _ = fault;
        Claim::Safe
    }
}

/// The memory backend has no network and no server: only the scenarios that need
/// neither (the holder pause) run; the rest skip with the reason.
#[async_trait]
impl FaultHarness for distlock_conformance::MemoryHarness {}

/// The deliberately broken backends of the kit's self-test, over memory like
/// [`distlock_conformance::MemoryHarness`]: the fault scenarios that need neither network
/// nor server run on them, so that a test can show those scenarios' checkers catch
/// each mistake (a semaphore admitting N+1, a read granted beside a write).
#[async_trait]
impl FaultHarness for distlock_conformance::broken::BrokenHarness {}
