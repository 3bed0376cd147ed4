//! Which servers a client's nodes are: connecting them at start-up, refusing one server
//! counted twice, and letting a Redlock node that was down at start-up join later.
//!
//! - A single node must answer at connect.
//! - Redlock needs a majority at connect, as it does for every acquire later. A node
//!   that does not answer (a connection error) is retried in the background, and its
//!   share of every operation fails at once, without spending a connect timeout, until
//!   it joins. A node that answers with a refusal (credentials, database, not a Redis
//!   server) fails the connect whatever the others do: that is configuration, not an
//!   outage.
//! - Two nodes are one server when their host names resolve to a common socket address
//!   (checked before connecting), or when the servers report the same `run_id`
//!   (`INFO server`, checked once connected). Either is a configuration error at
//!   connect. A node that joins later is compared with the other joined nodes' current
//!   `run_id`s; a duplicate never joins, so it never counts towards a majority.

use std::net::SocketAddr;
use std::time::Duration;

use distlock_api::{AtAddress, LockError};
use futures_util::future::join_all;

use crate::conn::NodeConn;
use crate::node::{Node, WeakNode};
use crate::REDLOCK_BACKEND;

/// The first pause of a background joiner between attempts; it doubles up to
/// [`JOIN_RETRY_MAX`].
const JOIN_RETRY_FIRST: Duration = Duration::from_millis(100);

/// The longest pause of a background joiner between attempts: a node that comes back
/// joins within this (plus a connect) of answering.
pub(crate) const JOIN_RETRY_MAX: Duration = Duration::from_secs(1);

/// Connects the nodes of `urls` (one, or Redlock's), as the module docs say.
///
/// # Errors
/// [`LockError::Config`] for a bad URL, a refusal from any node, or one server listed
/// twice; [`LockError::Connection`] when the single node, or a majority of Redlock
/// nodes, cannot be reached. Every message names the addresses concerned.
pub(crate) async fn connect_nodes(
    urls: &[String],
    connect_timeout: Duration,
) -> Result<Vec<Node>, LockError> {
    let nodes = urls
        .iter()
        .map(|url| Node::new(url, connect_timeout))
        .collect::<Result<Vec<_>, _>>()?;
    if let [node] = nodes.as_slice() {
        node.join(node.open_retrying().await?);
        return Ok(nodes);
    }
    refuse_shared_addresses(&nodes, connect_timeout).await?;
    let opened = join_all(nodes.iter().map(|node| async move {
        let conn = node.open().await?;
        let id = node.server_id(&conn).await?;
        Ok::<_, LockError>((conn, id))
    }))
    .await;
    let (mut up, mut down) = (Vec::new(), Vec::new());
    for (node, result) in nodes.iter().zip(opened) {
        match result {
            Ok((conn, id)) => up.push((node, conn, id)),
            Err(error @ LockError::Config { .. }) => return Err(error),
            Err(error) => down.push((node, error)),
        }
    }
    refuse_shared_identities(&up)?;
    let quorum = nodes.len() / 2 + 1;
    if up.len() < quorum {
        let reasons: Vec<String> = down.iter().map(|(_, error)| at_node(error)).collect();
        return Err(LockError::connection(
            REDLOCK_BACKEND,
            format!(
                "only {} of {} Redlock nodes answered, and a majority of {quorum} is needed: {}",
                up.len(),
                nodes.len(),
                reasons.join("; ")
            ),
        ));
    }
    for (node, conn, _) in up {
        node.join(conn);
    }
    let everyone: Vec<WeakNode> = nodes.iter().map(Node::downgrade).collect();
    for (node, error) in down {
        tracing::warn!(node = node.address(), %error, "Redlock node down at start-up; it joins when it answers");
        node.set_absent(format!(
            "down since start-up ({}); retrying in the background",
            cause(&error)
        ));
        tokio::spawn(join_later(node.downgrade(), everyone.clone()));
    }
    Ok(nodes)
}

/// A node's error as `address: what happened`, without the backend's prefix.
pub(crate) fn at_node(error: &LockError) -> String {
    match error {
        LockError::Connection { source, .. }
        | LockError::Transient { source, .. }
        | LockError::Backend { source, .. } => source.to_string(),
        LockError::Config { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

/// What happened at a node, without the backend's prefix or the node's address.
fn cause(error: &LockError) -> String {
    match error {
        LockError::Connection { source, .. }
        | LockError::Transient { source, .. }
        | LockError::Backend { source, .. } => source
            .downcast_ref::<AtAddress>()
            .map_or_else(|| source.to_string(), |at| at.source.to_string()),
        other => at_node(other),
    }
}

/// Refuses two nodes whose host names resolve to a common socket address. A name that
/// does not resolve (in the connect timeout) is left to the connect to report.
async fn refuse_shared_addresses(nodes: &[Node], limit: Duration) -> Result<(), LockError> {
    let resolved: Vec<Vec<SocketAddr>> = join_all(nodes.iter().map(|node| async move {
        let Some(endpoint) = node.endpoint() else {
            return Vec::new();
        };
        match tokio::time::timeout(limit, tokio::net::lookup_host(endpoint)).await {
            Ok(Ok(addresses)) => addresses.collect(),
            _ => Vec::new(),
        }
    }))
    .await;
    for (i, first) in resolved.iter().enumerate() {
        for (j, second) in resolved.iter().enumerate().skip(i + 1) {
            if let Some(shared) = first.iter().find(|a| second.contains(a)) {
                return Err(LockError::config(
                    REDLOCK_BACKEND,
                    format!(
                        "Redlock nodes {} and {} are the same server (both resolve to {shared}); \
                         each node must be an independent server",
                        nodes[i].address(),
                        nodes[j].address()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Refuses two connected nodes that report the same server identity.
fn refuse_shared_identities(up: &[(&Node, NodeConn, Option<String>)]) -> Result<(), LockError> {
    for (i, (first, _, first_id)) in up.iter().enumerate() {
        for (second, _, second_id) in up.iter().skip(i + 1) {
            if let (Some(id), true) = (first_id, first_id == second_id) {
                return Err(same_server(first, second, id));
            }
        }
    }
    Ok(())
}

/// The configuration error for two nodes that are one server with run id `id`.
fn same_server(first: &Node, second: &Node, id: &str) -> LockError {
    LockError::config(
        REDLOCK_BACKEND,
        format!(
            "Redlock nodes {} and {} are the same server (run_id {id}); \
             each node must be an independent server",
            first.address(),
            second.address()
        ),
    )
}

/// Retries a node that was down at start-up until it answers, then joins it unless it
/// is another node's server. Ends when the client is dropped.
async fn join_later(node: WeakNode, everyone: Vec<WeakNode>) {
    let mut pause = JOIN_RETRY_FIRST;
    loop {
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(JOIN_RETRY_MAX);
        let Some(node) = node.upgrade() else {
            return;
        };
        let attempt = async {
            let conn = node.open().await?;
            let id = node.server_id(&conn).await?;
            Ok::<_, LockError>((conn, id))
        };
        let (conn, id) = match attempt.await {
            Ok(opened) => opened,
            Err(error) => {
                node.set_absent(format!(
                    "down since start-up ({}); retrying in the background",
                    cause(&error)
                ));
                continue;
            }
        };
        if let Some(id) = id {
            if let Some(twin) = joined_twin(&id, &everyone).await {
                let error = same_server(&twin, &node, &id);
                tracing::error!(node = node.address(), %error, "Redlock node not joined: it never counts");
                node.set_absent(format!("never joins: {}", cause(&error)));
                return;
            }
        }
        tracing::info!(node = node.address(), "Redlock node joined");
        node.join(conn);
        return;
    }
}

/// A joined node (the joiner itself is not one yet) whose server reports `id` now.
async fn joined_twin(id: &str, everyone: &[WeakNode]) -> Option<Node> {
    for other in everyone.iter().filter_map(WeakNode::upgrade) {
        let Some(conn) = other.connection() else {
            continue;
        };
        if let Ok(Some(other_id)) = other.server_id(&conn).await {
            if other_id == id {
                return Some(other);
            }
        }
    }
    None
}
