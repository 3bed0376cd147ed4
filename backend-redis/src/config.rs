//! Parsing `redis://`, `rediss://` and `redis+redlock://` URLs into node URLs.

mod topology_url;
mod url_options;

use std::time::Duration;

use distlock_api::LockError;

use crate::REDIS_BACKEND;

pub use topology_url::{SentinelUrl, Topology};
use url_options::take_options;

/// Settings of a Redis lock client.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RedisConfig {
    /// Limit on connecting and on each reply (default 2 s). On a single node, a
    /// request without a reply in this time fails with a connection error (and any
    /// grant it may have made is released).
    pub request_timeout: Duration,
    /// Redlock only: each node's acquire must answer within this, else the node counts
    /// as failed. `None` (the default) means TTL/10, clamped to 200 ms ..= 1 s.
    pub redlock_node_timeout: Option<Duration>,
    /// Clock drift allowance as a fraction of the TTL (default 0.01); 2 ms is added.
    pub clock_drift_factor: f64,
    /// Grant every acquire of this client in FIFO order, as if it asked for
    /// `WaitOrder::Fifo` (default false; the URL parameter `?fifo=true` sets it).
    /// Single node only: Redlock refuses it (see `RedisLock::connect_with`).
    pub fifo: bool,
    /// How long a FIFO waiter's queue entry lives unless the waiter refreshes it
    /// (default 3 s; at least 100 ms). Waiters refresh every third of it, so a waiter
    /// that died or hangs leaves the queue at most this long after its last refresh.
    pub fifo_entry_ttl: Duration,
    /// Replicas that must acknowledge every grant, extend and leadership renewal
    /// (Redis `WAIT`) before it counts (default 0: none asked; the URL parameter
    /// `min_replicas=N` sets it). Fewer within [`RedisConfig::replica_timeout`]: a grant
    /// is released and the acquire fails with [`distlock_api::LockError::Transient`]
    /// whose source is a [`crate::TooFewReplicas`]; an extend fails the same way (the
    /// lease turns suspect, and lost at its deadline unless a later extend is
    /// acknowledged). Single node, Sentinel and Cluster; Redlock refuses it. It makes a
    /// failover to an acknowledging replica keep the grant; it is not consensus (see
    /// the Redis guide's "Replica acknowledgement").
    pub min_replicas: u32,
    /// How long a `WAIT` for [`RedisConfig::min_replicas`] waits (default 500 ms; the
    /// URL parameter `replica_timeout=MS`, or `…ms`, `…s`). Above zero and below the
    /// request timeout. The client's connection carries nothing else while it waits.
    pub replica_timeout: Duration,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            request_timeout: Duration::from_secs(2),
            redlock_node_timeout: None,
            clock_drift_factor: 0.01,
            fifo: false,
            fifo_entry_ttl: Duration::from_secs(3),
            min_replicas: 0,
            replica_timeout: Duration::from_millis(500),
        }
    }
}

impl RedisConfig {
    /// Checks the settings.
    ///
    /// # Errors
    /// [`LockError::Config`] for a zero timeout, a drift factor outside `0.0..=0.5`, a
    /// FIFO entry TTL below 100 ms, or a replica timeout not below the request timeout.
    pub fn validate(&self) -> Result<(), LockError> {
        if self.fifo_entry_ttl < Duration::from_millis(100) {
            return Err(LockError::config(
                REDIS_BACKEND,
                "fifo_entry_ttl must be at least 100ms",
            ));
        }
        if !(0.0..=0.5).contains(&self.clock_drift_factor) {
            return Err(LockError::config(
                REDIS_BACKEND,
                "clock_drift_factor must be within 0.0..=0.5",
            ));
        }
        if self.request_timeout.is_zero() || self.redlock_node_timeout.is_some_and(|t| t.is_zero())
        {
            return Err(LockError::config(
                REDIS_BACKEND,
                "timeouts must be above zero",
            ));
        }
        if self.replica_timeout.is_zero() || self.replica_timeout >= self.request_timeout {
            // The WAIT's answer must come within the connection's response timeout.
            return Err(LockError::config(
                REDIS_BACKEND,
                format!(
                    "replica_timeout must be above zero and below the request timeout ({} ms), got {} ms",
                    self.request_timeout.as_millis(),
                    self.replica_timeout.as_millis()
                ),
            ));
        }
        Ok(())
    }

    /// The validity lost to clock drift for a lease of `ttl`.
    pub(crate) fn drift(&self, ttl: Duration) -> Duration {
        // `validate` keeps the factor finite and small, so this cannot panic.
        ttl.mul_f64(self.clock_drift_factor) + Duration::from_millis(2)
    }
}

/// A parsed `redis://`, `rediss://` or `redis+redlock://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisUrl {
    /// One `redis://` (or `rediss://`) URL per node: one for a single node, 3 or more
    /// (an odd number) for Redlock, the seeds of a Cluster; none for Sentinel (see
    /// [`RedisUrl::topology`]). They carry the URL's credentials.
    pub nodes: Vec<String>,
    /// The deployment: direct node(s), a Sentinel-managed master, or a Cluster.
    pub topology: Topology,
    /// The `fifo=true|false` parameter of the query string, if given (taken out of the
    /// node URLs, as the driver does not know it).
    pub fifo: Option<bool>,
    /// The `min_replicas=N` parameter, if given ([`RedisConfig::min_replicas`]).
    pub min_replicas: Option<u32>,
    /// The `replica_timeout=MS` parameter, if given ([`RedisConfig::replica_timeout`]).
    pub replica_timeout: Option<Duration>,
}

/// Parses a Redis URL into its node URLs and lock options.
///
/// - `redis://[user:pass@]host[:port][/db]` is a single node; so is
///   `rediss://…` (TLS) with the `tls` feature, where a `#insecure` fragment skips
///   certificate verification;
/// - `redis+redlock://[user:pass@]host:port,host:port,host:port[/db]` lists Redlock's
///   independent nodes, which share the credentials and database. There must be an
///   odd number of them, at least 3, none listed twice. (Connecting also refuses two
///   spellings of one server: names resolving to a common address, or one `run_id`.)
///
/// - `redis+sentinel://[user:pass@]host:port[,host:port…]/MASTER_NAME[?db=N]` finds the
///   master named `MASTER_NAME` through the listed Sentinels (port 26379 by default);
///   the credentials and database are the master's, the Sentinels are asked without
///   credentials; `rediss+sentinel://` (with the `tls` feature) uses TLS for both;
/// - `redis+cluster://[user:pass@]host:port[,host:port…]` reaches a Redis Cluster
///   through the listed seed nodes (port 6379 by default); `rediss+cluster://` is the
///   TLS form.
///
/// - a `fifo=true|false` query parameter asks for FIFO waiting ([`RedisConfig::fifo`]),
///   `min_replicas=N` and `replica_timeout=MS` (or `…ms`, `…s`) for replica
///   acknowledgement ([`RedisConfig::min_replicas`]); other query parameters and a
///   `#fragment` are passed to the driver.
///
/// # Errors
/// [`LockError::Config`] for any other scheme, `rediss://` without the `tls` feature,
/// an empty, even or duplicated Redlock node list, a Sentinel URL without a master
/// name, a Cluster URL with a database, a lock option given twice, a `fifo` that is not
/// `true` or `false`, a `min_replicas` that is not a whole number, or a
/// `replica_timeout` that is not a whole number of milliseconds above zero.
pub fn parse_url(url: &str) -> Result<RedisUrl, LockError> {
    let (url, options) = take_options(url)?;
    let (scheme, rest) = url.split_once("://").unwrap_or(("", ""));
    let (nodes, topology) = match scheme.to_ascii_lowercase().as_str() {
        tls @ ("redis+sentinel" | "rediss+sentinel") => {
            let sentinel = topology_url::parse_sentinel(rest, tls.starts_with("rediss"))?;
            (Vec::new(), Topology::Sentinel(sentinel))
        }
        tls @ ("redis+cluster" | "rediss+cluster") => (
            topology_url::parse_cluster(rest, tls.starts_with("rediss"))?,
            Topology::Cluster,
        ),
        _ => (node_urls(&url)?, Topology::Direct),
    };
    Ok(RedisUrl {
        nodes,
        topology,
        fifo: options.fifo,
        min_replicas: options.min_replicas,
        replica_timeout: options.replica_timeout,
    })
}

/// Splits a URL (without lock options) into one `redis://` URL per node.
fn node_urls(url: &str) -> Result<Vec<String>, LockError> {
    let config_error = |message: String| LockError::config(REDIS_BACKEND, message);
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| config_error("the Redis URL has no scheme:// prefix".to_owned()))?;
    let scheme = scheme.to_ascii_lowercase();
    match scheme.as_str() {
        "redis" | "rediss" if scheme == "redis" || cfg!(feature = "tls") => {
            Ok(vec![format!("{scheme}://{rest}")])
        }
        "rediss" => Err(config_error(
            "rediss:// (TLS) needs the `tls` feature of distlock-redis".to_owned(),
        )),
        "redis+redlock" => {
            let (userinfo, hosts_and_path) = match rest.rsplit_once('@') {
                Some((userinfo, after)) => (format!("{userinfo}@"), after),
                None => (String::new(), rest),
            };
            let (hosts, path) = match hosts_and_path.find(['/', '?']) {
                Some(at) => hosts_and_path.split_at(at),
                None => (hosts_and_path, ""),
            };
            let nodes: Vec<&str> = hosts.split(',').map(str::trim).collect();
            if nodes.iter().all(|n| n.is_empty()) {
                return Err(config_error(
                    "a Redlock URL needs at least 3 nodes; it lists none".into(),
                ));
            }
            if let Some(empty) = nodes.iter().position(|n| n.is_empty()) {
                return Err(config_error(format!(
                    "node #{} of the Redlock URL is empty",
                    empty + 1
                )));
            }
            if nodes.len().is_multiple_of(2) || nodes.len() < 3 {
                return Err(config_error(format!(
                    "Redlock needs an odd number of nodes, at least 3, for a majority; got {}",
                    nodes.len()
                )));
            }
            let mut seen = std::collections::HashSet::new();
            for node in &nodes {
                let normalised = if node.contains(':') {
                    node.to_string()
                } else {
                    format!("{node}:6379")
                };
                if !seen.insert(normalised.to_ascii_lowercase()) {
                    return Err(config_error(format!("Redlock node {node} is listed twice")));
                }
            }
            Ok(nodes
                .iter()
                .map(|n| format!("redis://{userinfo}{n}{path}"))
                .collect())
        }
        other => Err(config_error(format!(
            "{other}:// is not a Redis URL scheme (use redis://, redis+redlock://, redis+sentinel:// or redis+cluster://)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_and_redlock_urls() {
        assert_eq!(node_urls("redis://h:1/2").unwrap(), ["redis://h:1/2"]);
        assert_eq!(
            parse_url("redis://h:1/2?fifo=true").unwrap(),
            RedisUrl {
                nodes: vec!["redis://h:1/2".into()],
                topology: Topology::Direct,
                fifo: Some(true),
                min_replicas: None,
                replica_timeout: None,
            }
        );
        assert_eq!(node_urls("REDIS://h:1").unwrap(), ["redis://h:1"]);
        assert_eq!(
            node_urls("redis+redlock://:pw@a:1,b:2,c:3/4").unwrap(),
            [
                "redis://:pw@a:1/4",
                "redis://:pw@b:2/4",
                "redis://:pw@c:3/4"
            ]
        );
    }

    #[test]
    fn config_is_checked() {
        for factor in [f64::NAN, -0.1, 0.6, f64::INFINITY] {
            let config = RedisConfig {
                clock_drift_factor: factor,
                ..RedisConfig::default()
            };
            assert!(config.validate().is_err(), "{factor}");
        }
        assert!(RedisConfig::default().validate().is_ok());
        for replica_timeout in [
            Duration::ZERO,
            Duration::from_secs(2),
            Duration::from_secs(3),
        ] {
            let config = RedisConfig {
                replica_timeout,
                ..RedisConfig::default()
            };
            assert!(config.validate().is_err(), "{replica_timeout:?}");
        }
    }

    #[test]
    fn tls_needs_its_feature() {
        assert_eq!(node_urls("rediss://a:1").is_ok(), cfg!(feature = "tls"));
    }

    #[test]
    fn bad_redlock_node_lists() {
        for url in [
            "redis+redlock://",
            "redis+redlock://a:1,b:2",
            "redis+redlock://a:1,b:2,,c:3",
            "redis+redlock://a:1,b:2,A:1",
            "redis+redlock://a,b:2,a:6379",
            "redis+redlock://a:1",
            "http://a",
            "nothing",
        ] {
            assert!(
                matches!(node_urls(url), Err(LockError::Config { .. })),
                "{url}"
            );
        }
    }
}
