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

use distlock_api::connect_retry::{retry_connect, Refused};
use distlock_api::{InWords, LockError};
use futures_util::stream::{FuturesUnordered, StreamExt};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{ErrorKind, ProtocolVersion, RedisError, RedisResult};

use crate::driver::PushSink;
use crate::REDIS_BACKEND;

/// Connects to the Cluster through `seeds` (driver URLs with the credentials),
/// pushing pub/sub messages to `router`; the whole connect is bounded by `timeout`.
///
/// Each seed is tried on its own, all at once, and the first that answers for a
/// Cluster serving every slot (`cluster_state:ok`) wins (it tells the client the
/// whole cluster): the driver, given every seed, waits for each of them, so one silent
/// seed would hold up the connect for its whole timeout. What may pass (seeds
/// refusing connections while they restart, loading, or a Cluster not `ok` yet) is
/// retried with backoff until `timeout` (see [`distlock_api::connect_retry`]).
///
/// # Errors
/// At once, [`LockError::Config`] for seeds the driver refuses or a server that
/// refuses the credentials, and the seeds' errors when every seed refused in a way
/// retrying cannot fix; at the timeout, [`LockError::Connection`] with the last
/// reason, naming the seed (or all seeds when none answered).
pub(crate) async fn connect(
    seeds: &[String],
    timeout: Duration,
    router: PushSink,
) -> Result<ClusterConnection, LockError> {
    let addresses = seed_addresses(seeds);
    retry_connect(
        timeout,
        |_| race(seeds, timeout, router.clone()),
        |last| {
            last.unwrap_or_else(|| {
                LockError::connection(
                    REDIS_BACKEND,
                    format!(
                        "no Cluster seed ({addresses}) answered within the connect timeout of {} ms",
                        timeout.as_millis()
                    ),
                )
            })
        },
    )
    .await
}

/// One round: every seed at once, the first to connect wins.
///
/// # Errors
/// A seed's configuration error at once; else [`Refused::Passing`] when some seed's
/// refusal may pass, or the last seed's lasting refusal.
async fn race(
    seeds: &[String],
    timeout: Duration,
    router: PushSink,
) -> Result<ClusterConnection, Refused> {
    let mut attempts: FuturesUnordered<_> = seeds
        .iter()
        .map(|seed| connect_via(seed, timeout, router.clone()))
        .collect();
    let (mut passing, mut lasting) = (Vec::new(), None);
    while let Some(attempt) = attempts.next().await {
        match attempt {
            Ok(conn) => return Ok(conn),
            // A refusal says more than the other seeds' silence.
            Err(Refused::Lasting(error @ LockError::Config { .. })) => {
                return Err(Refused::Lasting(error))
            }
            Err(Refused::Lasting(error)) => lasting = Some(error),
            Err(Refused::Passing(error)) => passing.push(error),
        }
    }
    if passing.len() > 1 {
        // Every seed's reason, each naming its seed.
        let reasons: Vec<String> = passing.iter().map(crate::membership::at_node).collect();
        return Err(Refused::Passing(LockError::connection(
            REDIS_BACKEND,
            format!("no Cluster seed answered: {}", reasons.join("; ")),
        )));
    }
    Err(match (passing.pop(), lasting) {
        (Some(error), _) => Refused::Passing(error),
        (None, Some(error)) => Refused::Lasting(error),
        (None, None) => Refused::Lasting(LockError::config(
            REDIS_BACKEND,
            "a Cluster URL needs at least one seed",
        )),
    })
}

/// Connects to the Cluster through the one seed `seed`, and checks that the Cluster
/// serves every slot.
async fn connect_via(
    seed: &str,
    timeout: Duration,
    router: PushSink,
) -> Result<ClusterConnection, Refused> {
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
        .map_err(|_| {
            Refused::Lasting(LockError::config(
                REDIS_BACKEND,
                format!("{address}: invalid Cluster seed settings"),
            ))
        })?;
    let mut conn = client
        .get_async_connection()
        .await
        .map_err(|e| seed_refused(&address, e))?;
    let info: RedisResult<String> = redis::cmd("CLUSTER")
        .arg("INFO")
        .query_async(&mut conn)
        .await;
    match info {
        Ok(info) if !info.lines().any(|line| line.trim() == "cluster_state:ok") => {
            Err(Refused::Passing(LockError::connection_at(
                REDIS_BACKEND,
                &address,
                "the Cluster does not serve every slot yet (cluster_state is not ok)",
            )))
        }
        // An ACL user without CLUSTER INFO: the first request will tell.
        Ok(_) | Err(_) => Ok(conn),
    }
}

/// The error of connecting through a seed, sorted for
/// [`distlock_api::connect_retry::retry_connect`].
///
/// The driver's cluster connect wraps the seed's own error in a string ("Failed to
/// create initial connections" and the error's text), so its kind is lost: the text
/// tells a refused or silent port, and a server refusing for now or refusing the
/// credentials, apart. No slot map yet (nodes still meeting) may pass too.
fn seed_refused(address: &str, error: RedisError) -> Refused {
    let wrapped = error.kind() == ErrorKind::Io && error.detail().is_some();
    let detail = error.detail().unwrap_or_default().to_owned();
    if error.kind() == ErrorKind::ClusterConnectionNotFound {
        return Refused::Passing(LockError::connection_at(
            REDIS_BACKEND,
            address,
            InWords::with_words("no node of the Cluster answered with its slot map", error),
        ));
    }
    if !wrapped {
        return crate::error::connect_refused(address, 0, error);
    }
    let passing = if detail.contains("Connection refused") {
        Some("connection refused")
    } else if detail.contains("timed out") {
        Some("timed out")
    } else if crate::error::RETRY_CODES
        .iter()
        .any(|code| detail.contains(code))
    {
        Some("the server cannot serve yet (it is loading its dataset, or the Cluster is changing)")
    } else {
        None
    };
    if let Some(words) = passing {
        return Refused::Passing(LockError::connection_at(
            REDIS_BACKEND,
            address,
            InWords::with_words(words, error),
        ));
    }
    if [
        "WRONGPASS",
        "NOAUTH",
        "without any password",
        "invalid username-password",
    ]
    .iter()
    .any(|marker| detail.contains(marker))
    {
        return Refused::Lasting(LockError::Config {
            backend: REDIS_BACKEND,
            message: format!(
                "{address}: authentication failed: the server refused the user name or password"
            ),
            source: Some(Box::new(error)),
        });
    }
    Refused::Lasting(LockError::connection_at(
        REDIS_BACKEND,
        address,
        InWords::with_words(
            "the seed answered, but not as a Cluster node (a TLS-only node needs rediss+cluster://)",
            error,
        ),
    ))
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
