//! [`ZooKeeperConfig`] and the `zookeeper://` / `zk://` URL.

use std::time::Duration;

use distlock_api::LockError;

use crate::security::{Credentials, TlsFiles};
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

/// A parsed `zookeeper://`, `zk://`, `zookeeper+tls://` or `zk+tls://` URL.
/// `Debug` does not show the password.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ZooKeeperUrl {
    /// `host:port` of every server, in the URL's order.
    pub hosts: Vec<String>,
    /// The chroot path (`/app`), if the URL has one.
    pub chroot: Option<String>,
    /// `?session_timeout_ms=N`, if given.
    pub session_timeout: Option<Duration>,
    /// `user:password@` (percent-decoded), if given: digest authentication, and nodes
    /// created with a creator-only ACL (see the crate docs, *Security*).
    pub credentials: Option<Credentials>,
    /// The TLS files of a `+tls` URL; `None` for plaintext.
    pub tls: Option<TlsFiles>,
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

/// Parses `zookeeper://[user:password@]host[:port][,host[:port]…][/chroot][?params]`;
/// `zk://` is the same, and `zookeeper+tls://` (or `zk+tls://`) connects over TLS. The
/// port defaults to [`DEFAULT_PORT`]; IPv6 hosts go in brackets (`[::1]:2181`). User
/// and password are percent-decoded (write `@`, `:`, `/` and `%` in them as `%40`,
/// `%3A`, `%2F`, `%25`).
///
/// Parameters: `session_timeout_ms=N`; with `+tls` only, `ca=PATH` (required),
/// `cert=PATH` and `key=PATH` (a client certificate, both or neither), PEM files,
/// percent-decoded paths.
///
/// # Errors
/// [`LockError::Config`] for another scheme, no host, an empty host in the list, a bad
/// port, credentials without a `:` or with an empty user, a bad `%`-escape, an invalid
/// chroot path, TLS files on a plaintext URL, a `+tls` URL without `ca`, `cert` without
/// `key` (or the reverse), or an unknown, repeated or bad query parameter (a
/// `session_timeout_ms` that is not a number, or outside [`MIN_SESSION_TIMEOUT`] ..=
/// [`MAX_SESSION_TIMEOUT`]). Files are not read here (see
/// [`crate::ZooKeeperLock::connect`]).
pub fn parse_url(url: &str) -> Result<ZooKeeperUrl, LockError> {
    let url = url.trim();
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| config_error(format!("{:?} is not a URL", redact(url))))?;
    let tls = match scheme {
        "zookeeper" | "zk" => false,
        "zookeeper+tls" | "zk+tls" => true,
        _ => {
            return Err(config_error(format!(
                "{scheme}:// is not a ZooKeeper URL scheme (use zookeeper://, zk://, \
                 zookeeper+tls:// or zk+tls://)"
            )))
        }
    };
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, Some(query)),
        None => (rest, None),
    };
    let (authority, chroot) = match rest.find('/') {
        Some(at) => (&rest[..at], Some(&rest[at..])),
        None => (rest, None),
    };
    let (credentials, authority) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (Some(parse_credentials(userinfo)?), hosts),
        None => (None, authority),
    };
    if authority.trim().is_empty() {
        return Err(config_error(format!(
            "{:?} names no ZooKeeper server",
            redact(url)
        )));
    }
    let mut hosts = Vec::new();
    for (n, host) in authority.split(',').enumerate() {
        hosts.push(
            parse_host(host.trim())
                .map_err(|why| config_error(format!("server #{} ({host:?}): {why}", n + 1)))?,
        );
    }
    let chroot = match chroot {
        None | Some("/") => None,
        Some(path) => {
            validate_path(path).map_err(|why| config_error(format!("chroot {path:?}: {why}")))?;
            Some(path.to_owned())
        }
    };
    let mut session_timeout = None;
    let (mut ca, mut cert, mut key) = (None, None, None);
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let slot = match name {
            "session_timeout_ms" => {
                let ms: u64 = value.parse().map_err(|_| {
                    config_error(format!("session_timeout_ms={value:?} is not a number"))
                })?;
                let timeout = Duration::from_millis(ms);
                check_session_timeout(timeout)?;
                session_timeout = Some(timeout);
                continue;
            }
            "ca" => &mut ca,
            "cert" => &mut cert,
            "key" => &mut key,
            _ => {
                return Err(config_error(format!(
                    "unknown URL parameter {pair:?} (known: session_timeout_ms, and with \
                     zookeeper+tls:// ca, cert, key)"
                )))
            }
        };
        if !tls {
            return Err(config_error(format!(
                "{name}= is a TLS parameter: use zookeeper+tls:// (or zk+tls://)"
            )));
        }
        let path = percent_decode(value)
            .filter(|p| !p.is_empty())
            .ok_or_else(|| config_error(format!("{name}={value:?} is not a file path")))?;
        if slot.replace(std::path::PathBuf::from(path)).is_some() {
            return Err(config_error(format!("{name}= is given twice")));
        }
    }
    let tls = match (tls, ca, cert, key) {
        (false, ..) => None,
        (true, None, ..) => {
            return Err(config_error(
                "a zookeeper+tls:// URL needs ?ca=PATH (a PEM file of the certificate \
                 authorities that sign the servers' certificates)",
            ))
        }
        (true, Some(ca), None, None) => Some(TlsFiles { ca, client: None }),
        (true, Some(ca), Some(cert), Some(key)) => Some(TlsFiles {
            ca,
            client: Some((cert, key)),
        }),
        (true, Some(_), ..) => {
            return Err(config_error(
                "a client certificate needs both cert=PATH and key=PATH",
            ))
        }
    };
    Ok(ZooKeeperUrl {
        hosts,
        chroot,
        session_timeout,
        credentials,
        tls,
    })
}

/// The URL with any password replaced by `***`, for error messages.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return if url.contains('@') {
            "(not shown: it may hold a password)".to_owned()
        } else {
            url.to_owned()
        };
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    match rest[..authority_end].rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
            format!("{scheme}://{user}:***@{hosts}{}", &rest[authority_end..])
        }
        None => url.to_owned(),
    }
}

/// `user:password` (percent-encoded) of a URL.
fn parse_credentials(userinfo: &str) -> Result<Credentials, LockError> {
    let (user, password) = userinfo.split_once(':').ok_or_else(|| {
        config_error("ZooKeeper credentials must be user:password@ (digest authentication)")
    })?;
    let decode = |what: &str, text: &str| {
        percent_decode(text)
            .ok_or_else(|| config_error(format!("bad %-escape in the URL's {what}")))
    };
    let user = decode("user name", user)?;
    if user.is_empty() {
        return Err(config_error("the user name in the URL is empty"));
    }
    // The digest provider splits `user:password` at the first ':'.
    if user.contains(':') {
        return Err(config_error(
            "a ZooKeeper digest user name cannot contain ':'",
        ));
    }
    Ok(Credentials {
        user,
        password: decode("password", password)?,
    })
}

/// Decodes `%XX` escapes; `None` for a bad escape or bytes that are not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
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
            "zk://user@a:1",
            "zk://:pw@a:1",
            "zk://us%zzer:pw@a:1",
            "zk://@a:1",
            "zk://a:1?ca=/x.pem",
            "zk+tls://a:1",
            "zk+tls://a:1?ca=",
            "zk+tls://a:1?ca=/c&ca=/d",
            "zk+tls://a:1?ca=/c&cert=/d",
            "zk+tls://a:1?ca=/c&key=/d",
            "zookeeper+ssl://a:1?ca=/c",
            "zk://a:0",
            "zk://a:99999",
            "zk://a:x",
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
    fn credentials_and_tls() {
        let u = parse_url("zk://app:p%40ss%3Aw%2Frd@a:1,b/app").unwrap();
        let c = u.credentials.clone().unwrap();
        assert_eq!((c.user.as_str(), c.password.as_str()), ("app", "p@ss:w/rd"));
        assert_eq!(u.hosts, ["a:1", "b:2181"]);
        assert_eq!(u.chroot.as_deref(), Some("/app"));
        assert_eq!(u.tls, None);
        assert!(!format!("{u:?}").contains("p@ss"));
        assert_eq!(
            parse_url("zk://u:@a")
                .unwrap()
                .credentials
                .unwrap()
                .password,
            ""
        );
        let u = parse_url("zookeeper+tls://u:p@a:2281?ca=/etc/ca%20x.pem&session_timeout_ms=900")
            .unwrap();
        let tls = u.tls.unwrap();
        assert_eq!(tls.ca, std::path::Path::new("/etc/ca x.pem"));
        assert_eq!(tls.client, None);
        assert_eq!(u.session_timeout, Some(Duration::from_millis(900)));
        let u = parse_url("zk+tls://a?ca=/c&cert=/d&key=/e").unwrap();
        assert_eq!(u.tls.unwrap().client, Some(("/d".into(), "/e".into())));
    }

    #[test]
    fn errors_do_not_show_passwords() {
        for url in ["zk://u:hunter2@", "nourl u:hunter2@x", "zk://u:hunter2@/x"] {
            let error = parse_url(url).unwrap_err().to_string();
            assert!(!error.contains("hunter2"), "{error}");
        }
        assert_eq!(redact("zk://u:pw@h/x?y"), "zk://u:***@h/x?y");
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
