//! Parsing the topology URLs: `redis+sentinel://` and `redis+cluster://` (and their
//! `rediss+…` TLS forms).

use distlock_api::LockError;

use crate::REDIS_BACKEND;

/// Sentinel's default port, for a Sentinel address without one.
const SENTINEL_PORT: u16 = 26379;

/// A Redis node's default port, for a Cluster seed without one.
const REDIS_PORT: u16 = 6379;

/// The deployment a Redis URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Topology {
    /// One server (`redis://`, `rediss://`) or Redlock's independent servers
    /// (`redis+redlock://`): the servers are [`crate::RedisUrl::nodes`].
    Direct,
    /// A master found through Sentinels (`redis+sentinel://`, `rediss+sentinel://`).
    Sentinel(SentinelUrl),
    /// A Redis Cluster reached through seed nodes (`redis+cluster://`,
    /// `rediss+cluster://`); the seeds are [`crate::RedisUrl::nodes`].
    Cluster,
}

/// The parts of a `redis+sentinel://` URL.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SentinelUrl {
    /// `host:port` of each Sentinel (port 26379 when the URL gives none).
    pub sentinels: Vec<String>,
    /// The name the Sentinels monitor the master under (the URL's path).
    pub master_name: String,
    /// The master's database (`?db=N`, default 0).
    pub db: i64,
    /// Whether the master and Sentinels are reached over TLS (`rediss+sentinel://`).
    pub tls: bool,
    /// `user:pass@` for the master (empty without credentials).
    userinfo: String,
    /// `#insecure` (or empty): the TLS fragment the driver knows.
    fragment: String,
}

impl std::fmt::Debug for SentinelUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the credentials.
        f.debug_struct("SentinelUrl")
            .field("sentinels", &self.sentinels)
            .field("master_name", &self.master_name)
            .field("db", &self.db)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl SentinelUrl {
    /// The driver URL of the master at `address` (`host:port`): the URL's credentials,
    /// database and TLS settings.
    pub(crate) fn master_url(&self, address: &str) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!(
            "{scheme}://{}{address}/{}{}",
            self.userinfo, self.db, self.fragment
        )
    }

    /// The driver URL of the Sentinel at `address`. Sentinels are asked without the
    /// master's credentials (a Sentinel usually has none, and refuses `AUTH` then).
    pub(crate) fn sentinel_url(&self, address: &str) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}://{address}{}", self.fragment)
    }
}

fn config_error(message: impl Into<String>) -> LockError {
    LockError::config(REDIS_BACKEND, message.into())
}

/// The pieces of `scheme://[userinfo@]hosts[/path][?query][#fragment]` after the scheme.
struct Pieces<'a> {
    userinfo: String,
    hosts: Vec<&'a str>,
    path: &'a str,
    query: &'a str,
    fragment: &'a str,
}

fn pieces<'a>(rest: &'a str, what: &str) -> Result<Pieces<'a>, LockError> {
    let (rest, fragment) = match rest.find('#') {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    let (userinfo, after) = match rest.rsplit_once('@') {
        Some((userinfo, after)) => (format!("{userinfo}@"), after),
        None => (String::new(), rest),
    };
    let (hosts, after) = match after.find(['/', '?']) {
        Some(at) => after.split_at(at),
        None => (after, ""),
    };
    let (path, query) = match after.split_once('?') {
        Some((path, query)) => (path, query),
        None => (after, ""),
    };
    let hosts: Vec<&str> = hosts.split(',').map(str::trim).collect();
    if hosts.iter().all(|h| h.is_empty()) {
        return Err(config_error(format!(
            "a {what} URL needs at least one host:port"
        )));
    }
    if let Some(empty) = hosts.iter().position(|h| h.is_empty()) {
        return Err(config_error(format!(
            "host #{} of the {what} URL is empty",
            empty + 1
        )));
    }
    Ok(Pieces {
        userinfo,
        hosts,
        path,
        query,
        fragment,
    })
}

/// `host:port`, with `default_port` when `host` has none.
fn with_port(host: &str, default_port: u16) -> Result<String, LockError> {
    match host.rsplit_once(':') {
        Some((name, port)) if !name.is_empty() && port.parse::<u16>().is_ok() => {
            Ok(host.to_owned())
        }
        Some(_) => Err(config_error(format!("{host:?} is not host:port"))),
        None => Ok(format!("{host}:{default_port}")),
    }
}

/// Checks the TLS scheme is compiled in.
fn check_tls(tls: bool, scheme: &str) -> Result<(), LockError> {
    if tls && !cfg!(feature = "tls") {
        return Err(config_error(format!(
            "{scheme}:// (TLS) needs the `tls` feature of distlock-redis"
        )));
    }
    Ok(())
}

/// Parses the part after `redis+sentinel://` (or `rediss+sentinel://` when `tls`).
///
/// # Errors
/// [`LockError::Config`] without a Sentinel address, without a master name, for a
/// `db` that is not a number or another query parameter, and for TLS without the
/// `tls` feature.
pub(crate) fn parse_sentinel(rest: &str, tls: bool) -> Result<SentinelUrl, LockError> {
    check_tls(tls, "rediss+sentinel")?;
    let p = pieces(rest, "Sentinel")?;
    let master_name = p.path.trim_start_matches('/');
    if master_name.is_empty() {
        return Err(config_error(
            "a Sentinel URL needs the master's name as its path: redis+sentinel://host:port[,host:port…]/MASTER_NAME",
        ));
    }
    if master_name.contains('/') {
        return Err(config_error(format!(
            "the master name {master_name:?} contains '/': the path of a Sentinel URL is only the master's name (the database is ?db=N)"
        )));
    }
    let mut db = 0;
    for pair in p.query.split('&').filter(|pair| !pair.is_empty()) {
        match pair.split_once('=') {
            Some(("db", value)) => {
                db = value.parse().map_err(|_| {
                    config_error(format!(
                        "the URL parameter db must be a number, got {value:?}"
                    ))
                })?;
            }
            _ => {
                return Err(config_error(format!(
                    "unknown parameter {pair:?} in a Sentinel URL (known: db, fifo, min_replicas, replica_timeout)"
                )))
            }
        }
    }
    let sentinels = p
        .hosts
        .iter()
        .map(|h| with_port(h, SENTINEL_PORT))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(SentinelUrl {
        sentinels,
        master_name: master_name.to_owned(),
        db,
        tls,
        userinfo: p.userinfo,
        fragment: p.fragment.to_owned(),
    })
}

/// Parses the part after `redis+cluster://` (or `rediss+cluster://` when `tls`) into
/// one driver URL per seed, each with the URL's credentials.
///
/// # Errors
/// [`LockError::Config`] without a seed, for a path (a Cluster has only database 0)
/// or query parameters, and for TLS without the `tls` feature.
pub(crate) fn parse_cluster(rest: &str, tls: bool) -> Result<Vec<String>, LockError> {
    check_tls(tls, "rediss+cluster")?;
    let p = pieces(rest, "Cluster")?;
    if !p.path.trim_start_matches('/').is_empty() {
        return Err(config_error(
            "a Cluster URL has no path: Redis Cluster has only database 0",
        ));
    }
    if !p.query.is_empty() {
        return Err(config_error(format!(
            "unknown parameters {:?} in a Cluster URL (known: fifo, min_replicas, replica_timeout)",
            p.query
        )));
    }
    let scheme = if tls { "rediss" } else { "redis" };
    p.hosts
        .iter()
        .map(|h| {
            Ok(format!(
                "{scheme}://{}{}{}",
                p.userinfo,
                with_port(h, REDIS_PORT)?,
                p.fragment
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_urls() {
        let s = parse_sentinel("u:p@a:1, b ,c:3/mymaster?db=2", false).unwrap();
        assert_eq!(s.sentinels, ["a:1", "b:26379", "c:3"]);
        assert_eq!(s.master_name, "mymaster");
        assert_eq!(s.db, 2);
        assert_eq!(s.master_url("m:6"), "redis://u:p@m:6/2");
        assert_eq!(s.sentinel_url("a:1"), "redis://a:1");
        assert!(!format!("{s:?}").contains("u:p"));
        for bad in [
            "a:1",
            "a:1/",
            "a:1/m?x=1",
            "a:1/m?db=x",
            ",a:1/m",
            "a:x/m",
            "a:1/m/2",
        ] {
            assert!(
                matches!(parse_sentinel(bad, false), Err(LockError::Config { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn cluster_urls() {
        assert_eq!(
            parse_cluster("u:p@a:1,b", false).unwrap(),
            ["redis://u:p@a:1", "redis://u:p@b:6379"]
        );
        for bad in ["", "a:1/0", "a:1?x=1", "a:1,,b:2"] {
            assert!(
                matches!(parse_cluster(bad, false), Err(LockError::Config { .. })),
                "{bad}"
            );
        }
    }
}
