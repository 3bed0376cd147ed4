//! The connection behind one [`crate::node::Node`], whatever the deployment: a direct
//! server, the current master of a Sentinel-managed group, or a Redis Cluster.
//!
//! Every kind is a driver `ConnectionLike`, so the scripts and commands of `node.rs`
//! run on any of them unchanged, and each can subscribe to a release channel whose
//! messages reach the node's wake-up router. A leaf of its own (not in `topology`,
//! which connects), so the node and its wake-ups can name it without importing the
//! modules that make it.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

use crate::topology::sentinel::SentinelConn;

/// A node's connection. Clones share the connection.
#[derive(Clone)]
pub(crate) enum NodeConn {
    /// One server (single node or a Redlock node): reconnects on its own.
    Direct(ConnectionManager),
    /// The master the Sentinels name; follows a failover (see [`crate::topology::sentinel`]).
    Sentinel(SentinelConn),
    /// A Redis Cluster: routes each command to its key's slot, follows `MOVED`/`ASK`
    /// redirections and refreshes its slot map after a failover or migration.
    Cluster(ClusterConnection),
}

impl NodeConn {
    /// Subscribes to `channel`; the messages reach the node's wake-up router. The
    /// subscription is renewed after a reconnect (and, for Sentinel, on the new master).
    pub(crate) async fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            NodeConn::Direct(conn) => conn.subscribe(channel).await,
            NodeConn::Sentinel(conn) => conn.subscribe(channel).await,
            NodeConn::Cluster(conn) => conn.subscribe(channel).await,
        }
    }

    /// Unsubscribes from `channel`.
    pub(crate) async fn unsubscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            NodeConn::Direct(conn) => conn.unsubscribe(channel).await,
            NodeConn::Sentinel(conn) => conn.unsubscribe(channel).await,
            NodeConn::Cluster(conn) => conn.unsubscribe(channel).await,
        }
    }
}

impl ConnectionLike for NodeConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            NodeConn::Direct(conn) => conn.req_packed_command(cmd),
            NodeConn::Sentinel(conn) => conn.req_packed_command(cmd),
            NodeConn::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            NodeConn::Direct(conn) => conn.req_packed_commands(pipeline, offset, count),
            NodeConn::Sentinel(conn) => conn.req_packed_commands(pipeline, offset, count),
            NodeConn::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            NodeConn::Direct(conn) => conn.get_db(),
            NodeConn::Sentinel(conn) => conn.get_db(),
            NodeConn::Cluster(conn) => conn.get_db(),
        }
    }
}
