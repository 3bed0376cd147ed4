//! Connecting a URL's nodes, whatever the deployment: direct servers, the current
//! master of a Sentinel-managed group, or a Redis Cluster (each kind's connection is a
//! [`NodeConn`]).

pub(crate) mod cluster;
pub(crate) mod sentinel;

use std::time::Duration;

use distlock_api::LockError;

use crate::config::{RedisUrl, Topology};
use crate::conn::NodeConn;
use crate::node::Node;

/// Connects the node(s) of `url`: direct servers (one, or Redlock's, see
/// `membership`), or one node for a Sentinel-managed master or a Cluster.
///
/// # Errors
/// As `RedisLock::connect`: [`LockError::Config`] for refusals and unknown masters,
/// [`LockError::Connection`] when nothing answers within `timeout` (Sentinel and
/// Cluster bound their whole connect by it).
pub(crate) async fn connect(url: RedisUrl, timeout: Duration) -> Result<Vec<Node>, LockError> {
    // Sentinel and Cluster connections open TLS outside `driver_client` too.
    crate::driver::install_crypto_provider();
    match url.topology {
        Topology::Direct => crate::membership::connect_nodes(&url.nodes, timeout).await,
        Topology::Sentinel(sentinel) => {
            let node = Node::for_topology(
                format!(
                    "master {:?} of Sentinels {}",
                    sentinel.master_name,
                    sentinel.sentinels.join(",")
                ),
                timeout,
            );
            let conn = sentinel::connect(sentinel, timeout, node.push_sink()).await?;
            node.join(NodeConn::Sentinel(conn));
            Ok(vec![node])
        }
        Topology::Cluster => {
            let node = Node::for_topology(
                format!("Cluster {}", cluster::seed_addresses(&url.nodes)),
                timeout,
            );
            let conn = cluster::connect(&url.nodes, timeout, node.push_sink()).await?;
            node.join(NodeConn::Cluster(conn));
            Ok(vec![node])
        }
    }
}
