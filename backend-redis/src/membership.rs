//! Which servers a client's nodes are: connecting them at start-up, refusing one server
//! counted twice, and letting a Redlock node that was down at start-up join later.
//!
//! - A single node must answer at connect.
//! - Redlock needs a majority at connect, as it does for every acquire later. Nodes
//!   refusing for now (a closed port while a server restarts, `LOADING`) are tried
//!   again with backoff until a majority is up or the connect timeout has passed. A
//!   node still not answering then is retried in the background, and its
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

use distlock_api::connect_retry::{Refused, CONNECT_BACKOFF};
use distlock_api::{AtAddress, LockError};
use futures_util::future::join_all;
use tokio::time::{sleep_until, timeout_at, Instant};

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
    let opened = open_majority(&nodes, connect_timeout).await?;
    let (mut up, mut down) = (Vec::new(), Vec::new());
    for (node, state) in nodes.iter().zip(opened) {
        match state {
            Opened::Up(conn, id) => up.push((node, conn, id)),
            Opened::Trying(error) => down.push((
                node,
                error.unwrap_or_else(|| node.no_connection(connect_timeout)),
            )),
            Opened::Down(error) => down.push((node, error)),
        }
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

/// Where one Redlock node stands while the connect opens them.
enum Opened {
    /// Connected, with its server's `run_id` (if it tells).
    Up(NodeConn, Option<String>),
    /// Refused for now (a closed port, `LOADING`), with the last reason (`None` while
    /// no attempt has ended): tried again until the connect timeout.
    Trying(Option<LockError>),
    /// Refused in a way retrying at connect cannot fix, short of a configuration error
    /// (something other than Redis listens there): left to the background joiner.
    Down(LockError),
}

/// Opens Redlock's nodes all at once, then again those that refused for now (with
/// [`CONNECT_BACKOFF`] between rounds) until a majority is up or `limit` has passed;
/// whatever is up by then is the answer. Each round waits for every node it tries,
/// but never past the connect deadline.
///
/// # Errors
/// [`LockError::Config`] at once for a node's refusal that is configuration
/// (credentials, database) or for two nodes reporting one `run_id`;
/// [`LockError::Connection`] when no majority is up at the deadline, naming every
/// node that is not and why.
async fn open_majority(nodes: &[Node], limit: Duration) -> Result<Vec<Opened>, LockError> {
    let deadline = Instant::now() + limit;
    let mut delays = CONNECT_BACKOFF.delays();
    let mut state: Vec<Opened> = nodes.iter().map(|_| Opened::Trying(None)).collect();
    let quorum = nodes.len() / 2 + 1;
    loop {
        let trying: Vec<usize> = (0..nodes.len())
            .filter(|&i| matches!(state[i], Opened::Trying(_)))
            .collect();
        let answers = join_all(trying.iter().map(|&i| async move {
            let node = &nodes[i];
            let attempt = async {
                let conn = node.open_once().await?;
                let id = node.server_id(&conn).await.map_err(Refused::by_kind)?;
                Ok::<_, Refused>((conn, id))
            };
            // `None`: cut at the deadline, which says less than an earlier reason.
            timeout_at(deadline, attempt).await.ok()
        }))
        .await;
        for (i, answer) in trying.into_iter().zip(answers) {
            match answer {
                Some(Ok((conn, id))) => state[i] = Opened::Up(conn, id),
                Some(Err(Refused::Lasting(error @ LockError::Config { .. }))) => return Err(error),
                Some(Err(Refused::Lasting(error))) => state[i] = Opened::Down(error),
                Some(Err(Refused::Passing(error))) => state[i] = Opened::Trying(Some(error)),
                None => {}
            }
        }
        let up: Vec<(&Node, NodeConn, Option<String>)> = nodes
            .iter()
            .zip(&state)
            .filter_map(|(node, state)| match state {
                Opened::Up(conn, id) => Some((node, conn.clone(), id.clone())),
                _ => None,
            })
            .collect();
        refuse_shared_identities(&up)?;
        let still_trying = state.iter().any(|s| matches!(s, Opened::Trying(_)));
        let next = Instant::now() + delays.next_delay();
        if up.len() >= quorum {
            return Ok(state);
        }
        if !still_trying {
            return Err(no_majority(nodes, &state, up.len(), quorum, limit));
        }
        if next >= deadline {
            // As `retry_connect`: a connect gives up at its timeout, not before.
            sleep_until(deadline).await;
            return Err(no_majority(nodes, &state, up.len(), quorum, limit));
        }
        sleep_until(next).await;
    }
}

/// The error of a Redlock connect that found only `up` of its nodes answering.
fn no_majority(
    nodes: &[Node],
    state: &[Opened],
    up: usize,
    quorum: usize,
    limit: Duration,
) -> LockError {
    let reasons: Vec<String> = nodes
        .iter()
        .zip(state)
        .filter_map(|(node, state)| match state {
            Opened::Up(..) => None,
            Opened::Trying(Some(error)) | Opened::Down(error) => Some(at_node(error)),
            Opened::Trying(None) => Some(at_node(&node.no_connection(limit))),
        })
        .collect();
    LockError::connection(
        REDLOCK_BACKEND,
        format!(
            "only {up} of {} Redlock nodes answered within the connect timeout of {} ms, \
             and a majority of {quorum} is needed: {}",
            nodes.len(),
            limit.as_millis(),
            reasons.join("; ")
        ),
    )
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
