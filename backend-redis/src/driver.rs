//! The driver's connections to one server: the client for a URL and the
//! auto-reconnecting connection, shared by direct nodes and a Sentinel's master. A leaf,
//! so the topologies can open connections without importing `node`.

use std::sync::Arc;
use std::time::Duration;

use distlock_api::LockError;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{IntoConnectionInfo, ProtocolVersion, PushInfo};

use crate::REDIS_BACKEND;

/// Where a connection delivers the server's pushes (pub/sub messages, and a
/// `Disconnection` when it is lost): the node's wake-up router. A callback, not the
/// router itself, so the connection modules need not import `wakeups`, which names
/// their connections.
pub(crate) type PushSink = Arc<dyn Fn(PushInfo) + Send + Sync>;

/// rustls needs one process-wide crypto provider when more than one is compiled in (a
/// build with `zookeeper-tls` also has aws-lc-rs), and the driver panics without one:
/// installs ring unless the program (or another crate) installed a provider first.
pub(crate) fn install_crypto_provider() {
    #[cfg(feature = "tls")]
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another installer is fine: a provider is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The driver's client for `url` (`redis://…`, speaking RESP3 so that pub/sub pushes
/// share the command connection), the server's `host:port` and the database.
///
/// # Errors
/// [`LockError::Config`] for a URL the driver refuses (the message does not repeat
/// the URL: it may carry a password).
pub(crate) fn driver_client(url: &str) -> Result<(redis::Client, String, i64), LockError> {
    // The driver's own error says no more than "did not parse" and its enum's name:
    // the message says what is wrong in words, naming the address (never the URL
    // itself, which may carry a password).
    let info = url
        .into_connection_info()
        .map_err(|_| LockError::config(REDIS_BACKEND, url_problem(url)))?;
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    let db = settings.db();
    let info = info.set_redis_settings(settings);
    let address = info.addr().to_string();
    install_crypto_provider();
    let client = redis::Client::open(info).map_err(|e| {
        LockError::config(
            REDIS_BACKEND,
            format!(
                "{address}: invalid Redis connection settings ({})",
                distlock_api::in_words(&e)
            ),
        )
    })?;
    Ok((client, address, db))
}

/// What is wrong with a Redis `url` the driver refused, in words, after the
/// `host:port` it names (if it names one): never the URL's credentials.
pub(crate) fn url_problem(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let (authority, path) = match rest.find(['/', '?', '#']) {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    // Credentials end at the last '@' of the authority.
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let problem = if host_port.is_empty() {
        "the Redis URL names no host".to_owned()
    } else if let Some(port) = bad_port(host_port) {
        format!("the port {port:?} is not a number from 1 to 65535")
    } else if let Some(db) = path
        .strip_prefix('/')
        .map(|p| p.split(['?', '#']).next().unwrap_or(p))
        .filter(|db| !db.is_empty() && db.parse::<u32>().is_err())
    {
        format!("the database {db:?} (the URL's path) is not a number")
    } else {
        "not a valid Redis URL (redis://[user:password@]host[:port][/db])".to_owned()
    };
    if host_port.is_empty() {
        format!("invalid Redis URL: {problem}")
    } else {
        format!("{host_port}: invalid Redis URL: {problem}")
    }
}

/// The port of `host_port` when it is given and is not a port number.
fn bad_port(host_port: &str) -> Option<&str> {
    // `[::1]:6379`: the port follows the bracket.
    let after_host = match host_port.rsplit_once(']') {
        Some((_, after)) => after,
        None => host_port,
    };
    let (_, port) = after_host.rsplit_once(':')?;
    match port.parse::<u16>() {
        Ok(p) if p > 0 => None,
        _ => Some(port),
    }
}

/// Opens an auto-reconnecting connection with `client` to the server at `address`
/// (database `db`), pushing pub/sub messages to `router`.
///
/// # Errors
/// As [`crate::node::Node::open`].
pub(crate) async fn open_manager(
    client: &redis::Client,
    address: &str,
    db: i64,
    timeout: Duration,
    router: PushSink,
) -> Result<ConnectionManager, LockError> {
    open_manager_with(client, timeout, router)
        .await
        .map_err(|e| crate::error::connect_error(address, db, e))
}

/// [`open_manager`], with the driver's error as it is.
pub(crate) async fn open_manager_with(
    client: &redis::Client,
    timeout: Duration,
    router: PushSink,
) -> Result<ConnectionManager, redis::RedisError> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500))
        .set_automatic_resubscription()
        .set_push_sender(move |push| {
            router(push);
            Ok::<(), ()>(())
        });
    client.get_connection_manager_with_config(config).await
}
