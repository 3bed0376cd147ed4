//! [`MySqlConfig`] and the connection options every session is opened with.

use std::str::FromStr;
use std::time::Duration;

use distlock_api::backend::address::{check_scheme, host_port, url_address};
use distlock_api::backend::sessions::{check_heartbeat, check_session_counts, Timing};
use distlock_api::LockError;
use sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};
use sqlx::ConnectOptions as _;

use crate::MYSQL_BACKEND;

/// Settings of a MySQL/MariaDB lock client ([`crate::MySqlLock`]).
///
/// Start from [`MySqlConfig::default`] and change fields; [`crate::MySqlLock::connect_with`]
/// checks them (see [`MySqlConfig::validate`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MySqlConfig {
    /// How many sessions (connections) carry the locks taken without waiting: every
    /// `try_acquire`, and every `acquire` that finds its key free. Default 10. Opened on
    /// demand, one per request in flight; any number of held locks share them.
    pub shared_sessions: usize,
    /// How many connections may be dedicated at once to waiting in `GET_LOCK` (each
    /// then keeps the lock it was granted until that lock ends) and to holding a
    /// semaphore permit. Default 16. When all are busy, a further contended `acquire`
    /// waits in the client for one, within its wait policy.
    pub wait_sessions: usize,
    /// The server setting `wait_timeout` of every lock session (whole seconds): a
    /// session that sends nothing for this long is closed by the server, and its locks
    /// with it. Sessions holding a lock send a heartbeat well within it, so this bounds
    /// how long a frozen, paused or silently cut-off holder keeps its locks. Every
    /// lease's validity is capped at its session's last proof of life plus this (less
    /// 1 % and 2 ms). It also caps each `GET_LOCK` wait statement, so a dead waiter
    /// leaves the server's queue within it. Default 10 s; whole seconds, at least 2 s.
    pub session_timeout: Duration,
    /// How often a session holding locks proves it is alive, when no other command has
    /// done so. `None` (the default) means `session_timeout / 5`. At most half of
    /// `session_timeout`.
    pub heartbeat: Option<Duration>,
    /// Limit on connecting and on each reply (default 5 s). A session whose reply does
    /// not come in time is closed, and its leases are marked lost.
    pub request_timeout: Duration,
}

impl Default for MySqlConfig {
    fn default() -> Self {
        MySqlConfig {
            shared_sessions: 10,
            wait_sessions: 16,
            session_timeout: Duration::from_secs(10),
            heartbeat: None,
            request_timeout: Duration::from_secs(5),
        }
    }
}

/// The shortest [`MySqlConfig::session_timeout`] accepted.
const MIN_SESSION_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest: MySQL's own maximum of `wait_timeout` on every platform.
const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(2_147_483);

impl MySqlConfig {
    /// Checks the bounds documented on each field.
    ///
    /// # Errors
    /// [`LockError::Config`] naming the first field out of bounds.
    pub fn validate(&self) -> Result<(), LockError> {
        let bad = |message: String| Err(LockError::config(MYSQL_BACKEND, message));
        check_session_counts(MYSQL_BACKEND, self.shared_sessions, self.wait_sessions)?;
        if self.session_timeout < MIN_SESSION_TIMEOUT
            || self.session_timeout > MAX_SESSION_TIMEOUT
            || self.session_timeout.subsec_nanos() != 0
        {
            return bad(format!(
                "session_timeout {:?} must be whole seconds between {MIN_SESSION_TIMEOUT:?} and {MAX_SESSION_TIMEOUT:?}",
                self.session_timeout
            ));
        }
        check_heartbeat(
            MYSQL_BACKEND,
            self.session_timeout,
            self.heartbeat(),
            self.request_timeout,
        )?;
        Ok(())
    }

    /// The heartbeat period in force.
    pub fn heartbeat(&self) -> Duration {
        self.heartbeat.unwrap_or(self.session_timeout / 5)
    }

    /// The timers of every session: leases valid for `session_timeout` less 1 % and
    /// 2 ms after each proof of life; an unused session holding nothing closed after
    /// half of it, before the server would end it.
    pub(crate) fn timing(&self) -> Timing {
        Timing::new(self.session_timeout, self.heartbeat())
    }

    /// The longest one `GET_LOCK` statement waits: a waiter whose client died leaves
    /// the server's queue within this.
    pub(crate) fn max_wait_statement(&self) -> Duration {
        self.session_timeout
    }

    /// The longest a cut-off client's locks outlive its last round trip: the
    /// `session_timeout` (the server's `wait_timeout`), plus one second, since the
    /// server checks it at whole seconds.
    pub fn dead_holder_bound(&self) -> Duration {
        self.session_timeout + Duration::from_secs(1)
    }
}

/// The URL schemes a MySQL/MariaDB lock client accepts.
pub const URL_SCHEMES: [&str; 2] = ["mysql", "mariadb"];

/// The URL parameters understood (sqlx's names, as the MySQL drivers spell them, and
/// sqlx's aliases).
const KNOWN_PARAMS: [&str; 10] = [
    "ssl-mode", "sslmode", "ssl-ca", "sslca", "ssl-cert", "sslcert", "ssl-key", "sslkey",
    "charset", "socket",
];

/// Where `options` connect: `host:port`, or the Unix socket's path. For messages: never
/// the URL, which may carry a password.
pub(crate) fn server_address(options: &MySqlConnectOptions) -> String {
    if let Some(socket) = options.get_socket() {
        return socket.display().to_string();
    }
    host_port(options.get_host(), options.get_port())
}

/// Parses `mysql://` and `mariadb://` URLs: `mysql://user:password@host:port/database?params`
/// (port 3306 by default). The database is required: the fencing table lives there.
///
/// TLS follows the MySQL drivers' parameters: `ssl-mode` (`disabled`, `preferred`
/// (the default), `required`, `verify_ca`, `verify_identity`, any case), `ssl-ca`,
/// `ssl-cert`, `ssl-key` (sqlx's aliases `sslmode`, `sslca`, `sslcert`, `sslkey` are
/// taken too). `preferred` uses TLS when the server offers it (with the `tls`
/// feature) and plaintext otherwise, without checking the certificate; `required`
/// insists on TLS without checking the certificate (even with `ssl-ca`); `verify_ca`
/// checks the chain against `ssl-ca` and the system roots, and through a driver bug
/// (sqlx issue 3793) the host name too; `verify_identity` checks both.
/// `charset` and `socket` are passed to the driver; any other parameter is refused.
///
/// # Errors
/// [`LockError::Config`] for another scheme, a URL that cannot be parsed (the message
/// names its `host:port` only), an unknown parameter or `ssl-mode`, a missing
/// database, a `ssl-ca` file that cannot be read, or a mode needing TLS in a build
/// without the `tls` feature. Messages never repeat the URL, which may carry a
/// password.
pub fn parse_url(url: &str) -> Result<MySqlConnectOptions, LockError> {
    check_scheme(url, &URL_SCHEMES, MYSQL_BACKEND, "MySQL")?;
    #[cfg(feature = "tls")]
    install_crypto_provider();
    let address = url_address(url).unwrap_or("the server");
    let unparsable = |source: Box<dyn std::error::Error + Send + Sync>| LockError::Config {
        backend: MYSQL_BACKEND,
        message: format!("{address}: the MySQL URL could not be parsed"),
        source: Some(source),
    };
    let mut parsed = url::Url::parse(url).map_err(|e| unparsable(e.into()))?;
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(LockError::config(
            MYSQL_BACKEND,
            format!("{address}: the MySQL URL names no host"),
        ));
    }
    let bad = |message: String| {
        Err(LockError::config(
            MYSQL_BACKEND,
            format!("{address}: {message}"),
        ))
    };
    let mut mode = None;
    for (name, value) in parsed.query_pairs() {
        if !KNOWN_PARAMS.contains(&name.as_ref()) {
            return bad(format!(
                "unknown URL parameter {name:?} (known: ssl-mode, ssl-ca, ssl-cert, ssl-key, charset, socket)"
            ));
        }
        if matches!(name.as_ref(), "ssl-mode" | "sslmode") {
            match MySqlSslMode::from_str(&value) {
                Ok(m) => mode = Some(m),
                Err(_) => {
                    return bad(format!(
                        "ssl-mode={value:?} is not one of disabled, preferred, required, verify_ca, verify_identity"
                    ))
                }
            }
        }
    }
    if !cfg!(feature = "tls")
        && matches!(
            mode,
            Some(MySqlSslMode::Required | MySqlSslMode::VerifyCa | MySqlSslMode::VerifyIdentity)
        )
    {
        return bad(
            "this ssl-mode needs TLS, and distlock-mysql was built without its `tls` feature \
             (distlock's `mysql-tls`)"
                .into(),
        );
    }
    if matches!(
        mode,
        Some(MySqlSslMode::VerifyCa | MySqlSslMode::VerifyIdentity)
    ) && !parsed
        .query_pairs()
        .any(|(n, _)| n == "ssl-ca" || n == "sslca")
    {
        return bad(
            "ssl-mode=verify_ca and verify_identity need ssl-ca (the CA's certificate file)".into(),
        );
    }
    for (name, value) in parsed.query_pairs() {
        if matches!(
            name.as_ref(),
            "ssl-ca" | "sslca" | "ssl-cert" | "sslcert" | "ssl-key" | "sslkey"
        ) {
            if let Err(e) = std::fs::metadata(value.as_ref()) {
                return bad(format!("{name}: cannot read {value:?}: {e}"));
            }
        }
    }
    // sqlx knows the scheme `mysql` only.
    parsed
        .set_scheme("mysql")
        .map_err(|()| LockError::config(MYSQL_BACKEND, format!("{address}: bad URL scheme")))?;
    let options =
        MySqlConnectOptions::from_str(parsed.as_str()).map_err(|e| unparsable(e.into()))?;
    if options.get_database().is_none_or(str::is_empty) {
        return bad(
            "the URL names no database (mysql://user@host/DATABASE): distlock keeps its fencing \
             table there"
                .into(),
        );
    }
    // Statements are few and fixed; the driver's own logging would log every grant.
    Ok(options.disable_statement_logging())
}

/// rustls needs one process-wide crypto provider when more than one is compiled in (a
/// build with `zookeeper-tls` also has aws-lc-rs), and sqlx panics without one when it
/// opens a TLS session: installs ring unless the program installed a provider first.
#[cfg(feature = "tls")]
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another installer is fine: a provider is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_error(url: &str) -> String {
        match parse_url(url) {
            Err(LockError::Config { message, .. }) => message,
            other => panic!("{url}: expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn both_schemes_parse() {
        for url in [
            "mysql://u:p@db:3307/app",
            "mariadb://u@db/app",
            "MySQL://u@db/app",
        ] {
            let options = parse_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(options.get_database(), Some("app"));
            assert_eq!(options.get_host(), "db");
        }
        assert_eq!(
            parse_url("mysql://u@db/app").map(|o| o.get_port()).ok(),
            Some(3306)
        );
    }

    #[test]
    fn bad_urls_are_config_errors_naming_the_address_only() {
        let message = config_error("mysql://user:secret@db.internal:99999/app");
        assert!(message.contains("db.internal:99999"), "{message}");
        assert!(!message.contains("secret"), "{message}");
        assert!(config_error("postgres://db/app").contains("postgres://"));
        assert!(config_error("mysql://u:secret@db/").contains("no database"));
        let message = config_error("mysql://u:secret@db/app?ssl-mode=sometimes");
        assert!(
            message.contains("ssl-mode") && !message.contains("secret"),
            "{message}"
        );
        assert!(config_error("mysql://u@db/app?sslmod=required").contains("unknown URL parameter"));
        assert!(config_error("mysql://u@db/app?ssl-ca=/nonexistent/ca.pem").contains("ssl-ca"));
    }

    #[test]
    fn config_bounds() {
        assert!(MySqlConfig::default().validate().is_ok());
        let mut config = MySqlConfig {
            session_timeout: Duration::from_millis(2500),
            ..MySqlConfig::default()
        };
        assert!(config.validate().is_err());
        config.session_timeout = Duration::from_secs(1);
        assert!(config.validate().is_err());
    }
}
