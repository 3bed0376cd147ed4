//! [`EtcdConfig`] and the `etcd://` / `etcd+tls://` URL.

use std::path::PathBuf;
use std::time::Duration;

use distlock_api::LockError;

use crate::ETCD_BACKEND;

/// The etcd client port used when a URL names a host without one.
pub const DEFAULT_PORT: u16 = 2379;

/// The key prefix locks live under when the URL names none: lock `K` contends under
/// `distlock/<encoded K>/`.
pub const DEFAULT_PREFIX: &str = "distlock";

/// Settings of an etcd lock client.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdConfig {
    /// Limit on each request's reply (default 5 s). A request past it fails with a
    /// connection error; what it may have created is deleted (or goes with its lease).
    pub request_timeout: Duration,
    /// Limit on connecting (and authenticating) at [`crate::EtcdLock::connect`]
    /// (default 5 s).
    pub connect_timeout: Duration,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
        }
    }
}

impl EtcdConfig {
    /// Sets [`EtcdConfig::request_timeout`].
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets [`EtcdConfig::connect_timeout`].
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }
}

/// The PEM files of a TLS URL.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsFiles {
    /// The CAs that sign the servers' certificates (`ca=`, required).
    pub ca: PathBuf,
    /// A client certificate (`cert=`), with its key.
    pub cert: Option<PathBuf>,
    /// The client certificate's key (`key=`).
    pub key: Option<PathBuf>,
}

/// A parsed `etcd://` URL. Its `Debug` hides the password.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdUrl {
    /// `(host, port)` of every endpoint, in URL order.
    pub endpoints: Vec<(String, u16)>,
    /// `user:password@`, for etcd's own authentication.
    pub credentials: Option<(String, String)>,
    /// The key prefix locks live under, without leading or trailing `/`
    /// ([`DEFAULT_PREFIX`] when the URL has no path).
    pub prefix: String,
    /// TLS settings of an `etcd+tls://` URL.
    pub tls: Option<TlsFiles>,
}

impl std::fmt::Debug for EtcdUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdUrl")
            .field("endpoints", &self.endpoints)
            .field(
                "user",
                &self.credentials.as_ref().map(|(user, _)| user.as_str()),
            )
            .field("prefix", &self.prefix)
            .field("tls", &self.tls)
            .finish()
    }
}

impl EtcdUrl {
    /// `h1:p1,h2:p2`, for error messages (no credentials).
    pub fn hosts(&self) -> String {
        self.endpoints
            .iter()
            .map(|(h, p)| format!("{h}:{p}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The endpoint URIs etcd-client dials (`http://h:p` or `https://h:p`).
    pub(crate) fn uris(&self) -> Vec<String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        self.endpoints
            .iter()
            .map(|(h, p)| format!("{scheme}://{h}:{p}"))
            .collect()
    }
}

fn config_error(message: impl Into<String>) -> LockError {
    LockError::config(ETCD_BACKEND, message)
}

/// Parses `etcd://[user:pass@]host[:port][,host[:port]…][/prefix]` and
/// `etcd+tls://…?ca=PATH[&cert=PATH&key=PATH]`.
///
/// The port defaults to [`DEFAULT_PORT`], the prefix to [`DEFAULT_PREFIX`]; a prefix
/// may have several segments (`/team/locks`). `user` and `pass` may be
/// percent-encoded. Plain `etcd://` URLs take no query parameters.
///
/// # Errors
/// [`LockError::Config`] for another scheme, no host, a bad port, an endpoint listed
/// twice, an empty user name, a bad percent-encoding, a prefix with empty segments or
/// control characters, an unknown or repeated parameter, a TLS URL without `ca`, or
/// `cert` without `key` (and the reverse). Messages never repeat the password.
pub fn parse_url(url: &str) -> Result<EtcdUrl, LockError> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| config_error("an etcd URL starts with etcd:// or etcd+tls://"))?;
    let tls = match scheme.to_ascii_lowercase().as_str() {
        "etcd" => false,
        "etcd+tls" => true,
        _ => {
            return Err(config_error(
                "an etcd URL starts with etcd:// or etcd+tls://",
            ))
        }
    };
    if rest.contains('#') {
        return Err(config_error("etcd URLs take no #fragment"));
    }
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, Some(query)),
        None => (rest, None),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let (credentials, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (Some(parse_userinfo(userinfo)?), hosts),
        None => (None, authority),
    };
    let endpoints = parse_hosts(hosts)?;
    let prefix = parse_prefix(path)?;
    let tls = parse_query(query, tls)?;
    Ok(EtcdUrl {
        endpoints,
        credentials,
        prefix,
        tls,
    })
}

fn parse_userinfo(userinfo: &str) -> Result<(String, String), LockError> {
    let (user, pass) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let user = percent_decode(user, "user name")?;
    let pass = percent_decode(pass, "password")?;
    if user.is_empty() {
        return Err(config_error(
            "the etcd URL has credentials without a user name",
        ));
    }
    Ok((user, pass))
}

fn parse_hosts(hosts: &str) -> Result<Vec<(String, u16)>, LockError> {
    if hosts.is_empty() {
        return Err(config_error("the etcd URL names no host"));
    }
    let mut endpoints: Vec<(String, u16)> = Vec::new();
    for part in hosts.split(',') {
        let (host, port) = match part.rsplit_once(':') {
            // An IPv6 literal `[::1]` without a port ends with `]`.
            Some((host, port)) if !port.ends_with(']') => {
                let port: u16 =
                    port.parse().ok().filter(|p| *p != 0).ok_or_else(|| {
                        config_error(format!("bad port in etcd endpoint `{part}`"))
                    })?;
                (host, port)
            }
            _ => (part, DEFAULT_PORT),
        };
        if host.is_empty() {
            return Err(config_error("the etcd URL has an endpoint without a host"));
        }
        let host = host.to_ascii_lowercase();
        if endpoints.iter().any(|(h, p)| *h == host && *p == port) {
            return Err(config_error(format!(
                "the etcd URL lists {host}:{port} twice"
            )));
        }
        endpoints.push((host, port));
    }
    Ok(endpoints)
}

fn parse_prefix(path: &str) -> Result<String, LockError> {
    let trimmed = path.trim_matches('/');
    if trimmed.is_empty() {
        return Ok(DEFAULT_PREFIX.to_owned());
    }
    let prefix = percent_decode(trimmed, "prefix")?;
    if prefix.split('/').any(str::is_empty) || prefix.chars().any(char::is_control) {
        return Err(config_error(
            "the etcd URL's prefix has an empty segment or control characters",
        ));
    }
    Ok(prefix)
}

fn parse_query(query: Option<&str>, tls: bool) -> Result<Option<TlsFiles>, LockError> {
    let (mut ca, mut cert, mut key) = (None, None, None);
    for pair in query.into_iter().flat_map(|q| q.split('&')) {
        if pair.is_empty() {
            continue;
        }
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let slot = match name {
            "ca" | "cert" | "key" if !tls => {
                return Err(config_error(format!(
                    "`{name}=` is a TLS parameter: use an etcd+tls:// URL"
                )))
            }
            "ca" => &mut ca,
            "cert" => &mut cert,
            "key" => &mut key,
            other => {
                return Err(config_error(format!(
                    "unknown etcd URL parameter `{}` (known: ca, cert, key with etcd+tls://)",
                    other.chars().take(32).collect::<String>()
                )))
            }
        };
        if slot.is_some() {
            return Err(config_error(format!("`{name}=` is given twice")));
        }
        let value = percent_decode(value, name)?;
        if value.is_empty() {
            return Err(config_error(format!("`{name}=` needs a file path")));
        }
        *slot = Some(PathBuf::from(value));
    }
    if !tls {
        return Ok(None);
    }
    let ca = ca.ok_or_else(|| {
        config_error("an etcd+tls:// URL needs ?ca=PATH (the PEM file of the servers' CAs)")
    })?;
    if cert.is_some() != key.is_some() {
        return Err(config_error(
            "an etcd+tls:// URL gives a client certificate with both cert= and key=",
        ));
    }
    Ok(Some(TlsFiles { ca, cert, key }))
}

/// Decodes `%XX` escapes; `what` names the part in errors (never its value).
fn percent_decode(text: &str, what: &str) -> Result<String, LockError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| config_error(format!("bad %-escape in the etcd URL's {what}")))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| config_error(format!("the etcd URL's {what} is not UTF-8")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_forms() {
        let url = parse_url("etcd://127.0.0.1:2379").unwrap();
        assert_eq!(url.endpoints, vec![("127.0.0.1".to_owned(), 2379)]);
        assert_eq!(url.prefix, DEFAULT_PREFIX);
        assert!(url.credentials.is_none() && url.tls.is_none());

        let url = parse_url("ETCD://u:p%40ss@a:1,b,c:3/team/locks/").unwrap();
        assert_eq!(url.hosts(), "a:1,b:2379,c:3");
        assert_eq!(url.prefix, "team/locks");
        assert_eq!(url.credentials, Some(("u".into(), "p@ss".into())));
        assert!(!format!("{url:?}").contains("p@ss"));

        let url = parse_url("etcd+tls://h:1?ca=/ca.pem&cert=/c.pem&key=/k.pem").unwrap();
        let tls = url.tls.clone().unwrap();
        assert_eq!(tls.ca, PathBuf::from("/ca.pem"));
        assert_eq!(tls.key, Some(PathBuf::from("/k.pem")));
        assert_eq!(url.uris_for_test(), vec!["https://h:1".to_owned()]);
    }

    #[test]
    fn refuses_bad_urls() {
        for url in [
            "etcd://",
            "etcd:///prefix",
            "etcd://h:0",
            "etcd://h:99999",
            "etcd://h:x",
            "etcd://h:1,h:1",
            "etcd://:secret@h",
            "etcd://h/a//b",
            "etcd://h?ca=/x",
            "etcd://h?fifo=true",
            "etcd+tls://h",
            "etcd+tls://h?ca=/x&cert=/c",
            "etcd+tls://h?ca=/x&ca=/y",
            "etcd://h#frag",
            "etcd://h/%zz",
            "redis://h",
            "nothing",
        ] {
            let err = parse_url(url).unwrap_err();
            assert!(matches!(err, LockError::Config { .. }), "{url}: {err:?}");
            assert!(!err.to_string().contains("secret"), "{err}");
        }
    }

    impl EtcdUrl {
        fn uris_for_test(&self) -> Vec<String> {
            self.uris()
        }
    }
}
