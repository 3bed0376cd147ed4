//! Connecting to a Redis Cluster.
//!
//! The driver's cluster connection learns the slot map from the seeds, sends each
//! command to the master of its key's slot, follows `MOVED` and `ASK` (slot
//! migration) and refreshes the map when a master fails over. All keys one script
//! touches share the lock key's hash tag (see [`crate::KeyNames`]), so every script
//! runs on one node.
//!
//! Wake-ups: the release scripts `PUBLISH` on the lock's channel. In a Cluster a
//! `PUBLISH` reaches every node over the cluster bus, so the client's subscription,
//! on whichever node the driver placed it, sees it; the driver renews the
//! subscription when that node fails.

use std::time::Duration;

use distlock_api::LockError;
use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::ProtocolVersion;

use crate::driver::PushSink;
use crate::REDIS_BACKEND;

/// Connects to the Cluster through `seeds` (driver URLs with the credentials),
/// pushing pub/sub messages to `router`; the whole connect is bounded by `timeout`.
///
/// Each seed is tried on its own, all at once, and the first that answers wins (it
/// tells the client the whole cluster): the driver, given every seed, waits for each
/// of them, so one silent seed would hold up the connect for its whole timeout.
///
/// # Errors
/// [`LockError::Config`] for seeds the driver refuses or a server that refuses the
/// credentials (when no seed connects); [`LockError::Connection`] when no seed
/// answers within `timeout`, naming the seeds.
pub(crate) async fn connect(
    seeds: &[String],
    timeout: Duration,
    router: PushSink,
) -> Result<ClusterConnection, LockError> {
    let addresses = seed_addresses(seeds);
    let racing = async {
        let mut attempts: FuturesUnordered<_> = seeds
            .iter()
            .map(|seed| connect_via(seed, timeout, router.clone()))
            .collect();
        let mut errors = Vec::new();
        while let Some(attempt) = attempts.next().await {
            match attempt {
                Ok(conn) => return Ok(conn),
                Err(error) => errors.push(error),
            }
        }
        // A refusal says more than the other seeds' silence.
        let refusal = errors
            .iter()
            .position(|e| matches!(e, LockError::Config { .. }));
        Err(match refusal {
            Some(at) => errors.swap_remove(at),
            None => errors.pop().unwrap_or_else(|| {
                LockError::config(REDIS_BACKEND, "a Cluster URL needs at least one seed")
            }),
        })
    };
    match tokio::time::timeout(timeout, racing).await {
        Ok(result) => result,
        Err(_) => Err(LockError::connection(
            REDIS_BACKEND,
            format!("no Cluster seed ({addresses}) answered within {timeout:?}"),
        )),
    }
}

/// Connects to the Cluster through the one seed `seed`.
async fn connect_via(
    seed: &str,
    timeout: Duration,
    router: PushSink,
) -> Result<ClusterConnection, LockError> {
    let address = format!("Cluster seed {}", seed_addresses(&[seed.to_owned()]));
    let client = ClusterClientBuilder::new([seed])
        .use_protocol(ProtocolVersion::RESP3)
        .connection_timeout(timeout)
        .response_timeout(timeout)
        // A failover takes a node-timeout or so: retrying inside one request would
        // only hide it; the acquire loop retries with its own patience.
        .retries(2)
        .max_retry_wait(200)
        .push_sender(move |push| {
            router(push);
            Ok::<(), ()>(())
        })
        .build()
        .map_err(|e| LockError::Config {
            backend: REDIS_BACKEND,
            message: format!("{address}: invalid settings"),
            source: Some(Box::new(e)),
        })?;
    client
        .get_async_connection()
        .await
        .map_err(|e| crate::error::connect_error(&address, 0, e))
}

/// `host:port,host:port` of the seeds, without credentials.
pub(crate) fn seed_addresses(seeds: &[String]) -> String {
    seeds
        .iter()
        .map(|url| {
            let rest = url.split_once("://").map_or(url.as_str(), |(_, r)| r);
            let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
            rest.split(['/', '#']).next().unwrap_or(rest)
        })
        .collect::<Vec<_>>()
        .join(",")
}
