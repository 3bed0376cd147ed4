//! [`ZooKeeperConfig`] and the `zookeeper://` / `zk://` URL.

use std::time::Duration;

use distlock_api::LockError;

use crate::ZOOKEEPER_BACKEND;

/// The ZooKeeper client port used when a URL names a host without one.
pub const DEFAULT_PORT: u16 = 2181;

/// The shortest session timeout this client works with, asked for or negotiated.
///
/// The client gives a connection 2/5 of the timeout to answer (the whole session
/// handshake must fit in the timeout), and its leases need a `sync` answered every
/// third of it; below 500 ms a loaded host, a JIT warming up or a GC pause breaks
/// those now and then, so connecting would fail, or locks be lost, on some runs and
/// not others. A shorter timeout in the configuration or the URL is a
/// [`LockError::Config`]; so is a server whose `maxSessionTimeout` grants less.
pub const MIN_SESSION_TIMEOUT: Duration = Duration::from_millis(500);

/// The longest session timeout that can be asked for: the protocol carries it as a
/// 32-bit count of milliseconds (about 24.8 days). Servers clamp what they grant to
/// their `maxSessionTimeout` (by default 20 ticks, 40 s).
pub const MAX_SESSION_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);

/// Checks a requested session timeout against [`MIN_SESSION_TIMEOUT`] and
/// [`MAX_SESSION_TIMEOUT`].
pub(crate) fn check_session_timeout(timeout: Duration) -> Result<(), LockError> {
    if (MIN_SESSION_TIMEOUT..=MAX_SESSION_TIMEOUT).contains(&timeout) {
        return Ok(());
    }
    Err(config_error(format!(
        "a ZooKeeper session timeout of {} ms is outside {} ..= {} ms (the client needs \
         room for a connection handshake and a sync every third of the timeout)",
        timeout.as_millis(),
        MIN_SESSION_TIMEOUT.as_millis(),
        MAX_SESSION_TIMEOUT.as_millis()
    )))
}

/// Settings of a ZooKeeper lock client.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ZooKeeperConfig {
    /// The session timeout asked of the server (default 10 s; at least
    /// [`MIN_SESSION_TIMEOUT`], at most [`MAX_SESSION_TIMEOUT`]). The server clamps it
    /// to its `minSessionTimeout ..= maxSessionTimeout` (by default 2 ..= 20 ticks);
    /// the negotiated value is what bounds how long a crashed holder keeps its locks,
    /// and what [`crate::ZooKeeperLock::session_timeout`] reports. A URL's
    /// `?session_timeout_ms=` overrides it.
    pub session_timeout: Duration,
    /// Limit on each request's reply; `None` (the default) means the negotiated
    /// session timeout. A request past it fails with a connection error; a create
    /// whose reply was given up on is found by its GUID and deleted in the background.
    /// An `acquire` with a `WaitPolicy::Timeout` gives up at its deadline (plus 50 ms)
    /// even while a reply is outstanding, with a connection error.
    pub request_timeout: Option<Duration>,
    /// Limit on establishing a session; `None` (the default) means the requested
    /// session timeout.
    pub connect_timeout: Option<Duration>,
    /// The node under which every key's lock directory lives (default `/distlock`),
    /// below the URL's chroot if it has one. Missing nodes on the way are created as
    /// container nodes.
    pub base_path: String,
}

impl Default for ZooKeeperConfig {
    fn default() -> Self {
        ZooKeeperConfig {
            session_timeout: Duration::from_secs(10),
            request_timeout: None,
            connect_timeout: None,
            base_path: "/distlock".to_owned(),
        }
    }
}

impl ZooKeeperConfig {
    /// Sets the requested session timeout.
    pub fn with_session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// Sets the per-request reply limit.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    /// Sets the limit on establishing a session.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// Sets the base path of lock directories.
    pub fn with_base_path(mut self, base_path: impl Into<String>) -> Self {
        self.base_path = base_path.into();
        self
    }
}

/// A parsed `zookeeper://` or `zk://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ZooKeeperUrl {
    /// `host:port` of every server, in the URL's order.
    pub hosts: Vec<String>,
    /// The chroot path (`/app`), if the URL has one.
    pub chroot: Option<String>,
    /// `?session_timeout_ms=N`, if given.
    pub session_timeout: Option<Duration>,
}

impl ZooKeeperUrl {
    /// The hosts as a ZooKeeper connect string (without the chroot).
    pub fn connect_string(&self) -> String {
        self.hosts.join(",")
    }
}

fn config_error(message: impl Into<String>) -> LockError {
    LockError::config(ZOOKEEPER_BACKEND, message)
}

/// Parses `zookeeper://host[:port][,host[:port]…][/chroot][?session_timeout_ms=N]`;
/// `zk://` is the same. The port defaults to [`DEFAULT_PORT`]; IPv6 hosts go in
/// brackets (`[::1]:2181`).
///
/// # Errors
/// [`LockError::Config`] for another scheme, no host, an empty host in the list, a bad
/// port, credentials (not supported), an invalid chroot path, or an unknown or bad
/// query parameter (a `session_timeout_ms` that is not a number, or outside
/// [`MIN_SESSION_TIMEOUT`] ..= [`MAX_SESSION_TIMEOUT`]).
pub fn parse_url(url: &str) -> Result<ZooKeeperUrl, LockError> {
    let url = url.trim();
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| config_error(format!("{url:?} is not a URL")))?;
    if !matches!(scheme, "zookeeper" | "zk") {
        return Err(config_error(format!(
            "{scheme}:// is not a ZooKeeper URL scheme (use zookeeper:// or zk://)"
        )));
    }
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, Some(query)),
        None => (rest, None),
    };
    let (authority, chroot) = match rest.find('/') {
        Some(at) => (&rest[..at], Some(&rest[at..])),
        None => (rest, None),
    };
    if authority.contains('@') {
        return Err(config_error(
            "credentials in a ZooKeeper URL are not supported",
        ));
    }
    if authority.trim().is_empty() {
        return Err(config_error(format!("{url:?} names no ZooKeeper server")));
    }
    let mut hosts = Vec::new();
    for (n, host) in authority.split(',').enumerate() {
        hosts.push(parse_host(host.trim()).map_err(|why| {
            config_error(format!("server #{} ({host:?}) of {url:?}: {why}", n + 1))
        })?);
    }
    let chroot = match chroot {
        None | Some("/") => None,
        Some(path) => {
            validate_path(path).map_err(|why| config_error(format!("chroot {path:?}: {why}")))?;
            Some(path.to_owned())
        }
    };
    let mut session_timeout = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("session_timeout_ms", value)) => {
                let ms: u64 = value.parse().map_err(|_| {
                    config_error(format!("session_timeout_ms={value:?} is not a number"))
                })?;
                let timeout = Duration::from_millis(ms);
                check_session_timeout(timeout)?;
                session_timeout = Some(timeout);
            }
            _ => {
                return Err(config_error(format!(
                    "unknown URL parameter {pair:?} (known: session_timeout_ms)"
                )))
            }
        }
    }
    Ok(ZooKeeperUrl {
        hosts,
        chroot,
        session_timeout,
    })
}

fn parse_host(host: &str) -> Result<String, &'static str> {
    if host.is_empty() {
        return Err("empty host");
    }
    let (name, port) = if let Some(v6) = host.strip_prefix('[') {
        let (addr, after) = v6.split_once(']').ok_or("unclosed '[' in an IPv6 host")?;
        if addr.is_empty() {
            return Err("empty IPv6 address");
        }
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or("junk after an IPv6 address")?),
        };
        (format!("[{addr}]"), port)
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) => (name.to_owned(), Some(port)),
            None => (host.to_owned(), None),
        }
    };
    if name.is_empty() {
        return Err("empty host name");
    }
    if name
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '/')
    {
        return Err("invalid character in the host name");
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(0) | Err(_) => return Err("the port must be a number from 1 to 65535"),
            Ok(p) => p,
        },
    };
    Ok(format!("{name}:{port}"))
}

/// Checks an absolute ZooKeeper path as the server would (`PathUtils.validatePath`).
pub(crate) fn validate_path(path: &str) -> Result<(), &'static str> {
    let rest = path.strip_prefix('/').ok_or("must start with '/'")?;
    if rest.is_empty() {
        return Ok(());
    }
    if rest.ends_with('/') {
        return Err("must not end with '/'");
    }
    for segment in rest.split('/') {
        if segment.is_empty() {
            return Err("has an empty segment ('//')");
        }
        if segment == "." || segment == ".." {
            return Err("has a '.' or '..' segment");
        }
    }
    let forbidden = |c: char| matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' | '\u{e000}'..='\u{f8ff}' | '\u{fff0}'..='\u{ffff}');
    if rest.chars().any(forbidden) {
        return Err("has a character ZooKeeper refuses in paths");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_urls() {
        let u = parse_url("zookeeper://127.0.0.1:2181").unwrap();
        assert_eq!(u.hosts, ["127.0.0.1:2181"]);
        assert_eq!(u.chroot, None);
        let u = parse_url("zk://a:1, b ,[::1]:3/app/locks?session_timeout_ms=1500").unwrap();
        assert_eq!(u.hosts, ["a:1", "b:2181", "[::1]:3"]);
        assert_eq!(u.chroot.as_deref(), Some("/app/locks"));
        assert_eq!(u.session_timeout, Some(Duration::from_millis(1500)));
        assert_eq!(u.connect_string(), "a:1,b:2181,[::1]:3");
        assert_eq!(parse_url("zk://h/").unwrap().chroot, None);
        for (ms, timeout) in [
            ("500", MIN_SESSION_TIMEOUT),
            ("2147483647", MAX_SESSION_TIMEOUT),
        ] {
            let url = format!("zk://h?session_timeout_ms={ms}");
            assert_eq!(parse_url(&url).unwrap().session_timeout, Some(timeout));
        }
    }

    #[test]
    fn bad_urls_are_config_errors() {
        for url in [
            "",
            "   ",
            "not a url",
            "://nothing",
            "nosuchscheme://host:1",
            "memory",
            "redis://h:1",
            "zookeeper://",
            "zookeeper:///chroot",
            "zk://a:1,,b:2",
            "zk://a:0",
            "zk://a:99999",
            "zk://a:x",
            "zk://user:pw@a:1",
            "zk://[::1",
            "zk://a:1/chroot/",
            "zk://a:1/x//y",
            "zk://a:1/x/../y",
            "zk://a:1?session_timeout_ms=0",
            "zk://a:1?session_timeout_ms=1",
            "zk://a:1?session_timeout_ms=499",
            "zk://a:1?session_timeout_ms=2147483648",
            "zk://a:1?session_timeout_ms=99999999999999999999",
            "zk://a:1?session_timeout_ms=abc",
            "zk://a:1?color=blue",
        ] {
            assert!(
                matches!(parse_url(url), Err(LockError::Config { .. })),
                "{url:?} gave {:?}",
                parse_url(url)
            );
        }
    }

    #[test]
    fn paths() {
        assert!(validate_path("/distlock").is_ok());
        assert!(validate_path("/").is_ok());
        assert!(validate_path("distlock").is_err());
        assert!(validate_path("/a/./b").is_err());
        assert!(validate_path("/a\u{1}").is_err());
    }
}
