//! Naming a server in messages without its URL, which may carry a password, and
//! refusing a URL of another scheme.

use crate::LockError;

/// The `host[:port]` (or the comma-separated list of them) of `url`, without any user
/// or password; `None` when the URL names none.
pub fn url_address(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next()?;
    let hosts = authority
        .rsplit_once('@')
        .map_or(authority, |(_, hosts)| hosts);
    (!hosts.is_empty()).then_some(hosts)
}

/// `host:port`, with an IPv6 host in brackets.
pub fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Checks that `url`'s scheme is one of `schemes` (any case).
///
/// # Errors
/// [`LockError::Config`] of `backend`: "`s://` is not a `name` URL scheme (use …)"
/// for another scheme, naming it only when it looks like one; "not a … URL" when
/// there is none.
pub fn check_scheme(
    url: &str,
    schemes: &[&str],
    backend: &'static str,
    name: &str,
) -> Result<(), LockError> {
    let listed = schemes
        .iter()
        .map(|s| format!("{s}://"))
        .collect::<Vec<_>>()
        .join(" or ");
    match url.split_once("://").map(|(scheme, _)| scheme) {
        Some(s) if schemes.iter().any(|k| k.eq_ignore_ascii_case(s)) => Ok(()),
        Some(s) if s.len() <= 32 && s.bytes().all(|b| b.is_ascii_graphic()) => {
            Err(LockError::config(
                backend,
                format!("{s}:// is not a {name} URL scheme (use {listed})"),
            ))
        }
        _ => Err(LockError::config(backend, format!("not a {listed} URL"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_leave_credentials_out() {
        assert_eq!(url_address("mysql://u:secret@db:3306/app"), Some("db:3306"));
        assert_eq!(url_address("postgres://a,b:5433/x?y=1"), Some("a,b:5433"));
        assert_eq!(url_address("postgres:///x"), None);
        assert_eq!(host_port("::1", 5432), "[::1]:5432");
        assert_eq!(host_port("db", 5432), "db:5432");
    }

    #[test]
    fn other_schemes_are_named() {
        let message = |url| match check_scheme(url, &["mysql", "mariadb"], "mysql", "MySQL") {
            Err(LockError::Config { message, .. }) => message,
            other => panic!("{other:?}"),
        };
        assert!(check_scheme("MySQL://db/x", &["mysql"], "mysql", "MySQL").is_ok());
        assert_eq!(
            message("redis://db"),
            "redis:// is not a MySQL URL scheme (use mysql:// or mariadb://)"
        );
        assert_eq!(message("db/x"), "not a mysql:// or mariadb:// URL");
    }
}
