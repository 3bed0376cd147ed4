//! [`PostgresConfig`] and the connection options every session is opened with.

use std::str::FromStr;
use std::time::Duration;

use distlock_api::backend::address::{check_scheme, host_port, url_address};
use distlock_api::backend::sessions::{check_heartbeat, check_session_counts, Timing};
use distlock_api::LockError;
use sqlx::postgres::PgConnectOptions;
use sqlx::ConnectOptions as _;

use crate::{tls, POSTGRES_BACKEND};

/// Settings of a Postgres lock client ([`crate::PostgresLock`]).
///
/// Start from [`PostgresConfig::default`] and change fields; [`crate::PostgresLock::connect_with`]
/// checks them (see [`PostgresConfig::validate`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PostgresConfig {
    /// How many sessions (connections) carry the locks taken without waiting: every
    /// `try_acquire`, and every `acquire` that finds its key free. Default 10. Sessions
    /// are opened on demand, up to this many: about one per 8 requests in flight.
    pub shared_sessions: usize,
    /// How many connections may be dedicated to waiting in the server's queue at once,
    /// each keeping the lock it was granted until that lock ends. Default 16. When all
    /// are busy, a further contended `acquire` waits in the client (FIFO) for one, within
    /// its wait policy. Every read of the read-write lock
    /// ([`crate::PostgresLock::rw_lock`]) and every permit of the semaphore
    /// ([`crate::PostgresLock::semaphore`]) takes one of these too, waiting or not, for
    /// as long as it is held (a `try_acquire` waits for one at most the request timeout,
    /// then reports the key held). In the transaction-pooling design
    /// ([`PoolMode::Transaction`]) it is the size of the lock pool instead: one
    /// connection per held lease and per waiting acquire.
    pub wait_sessions: usize,
    /// The server setting `idle_session_timeout` of every lock session: a session that
    /// sends nothing for this long is ended by the server, and its locks with it.
    /// Sessions holding a lock send a heartbeat well within it, so this is the bound on
    /// how long a frozen, paused or silently cut-off holder keeps its locks. It also caps
    /// every lease's validity at the last proof of life of its session plus this
    /// (less 1 % + 2 ms). Default 10 s; at least 500 ms.
    pub session_timeout: Duration,
    /// How often a session holding locks proves it is alive, when no other command has
    /// done so. `None` (the default) means `session_timeout / 5`. At most half of
    /// `session_timeout`.
    pub heartbeat: Option<Duration>,
    /// Limit on connecting and on each reply (default 5 s). A session whose reply does
    /// not come in time is closed, and its leases are marked lost. An `acquire` with a
    /// `WaitPolicy::Timeout` gives up at its deadline (plus 50 ms) even while a reply
    /// is outstanding, with a connection error.
    pub request_timeout: Duration,
    /// How soon the server gives up on a client host that stopped answering, through
    /// the server's TCP keepalive settings (`tcp_keepalives_idle`, `_interval`, `_count`)
    /// and `tcp_user_timeout` on every session. This frees the wait of a dead waiter; a
    /// dead holder is freed by `session_timeout` already. Default 10 s; whole seconds,
    /// at least 2 s.
    pub dead_peer_timeout: Duration,
    /// The schema holding the fencing sequence, created on first connect if missing.
    /// Default `distlock`. Lowercase ASCII letters, digits and `_`, not starting with a
    /// digit, at most 63 bytes.
    pub schema: String,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            shared_sessions: 10,
            wait_sessions: 16,
            session_timeout: Duration::from_secs(10),
            heartbeat: None,
            request_timeout: Duration::from_secs(5),
            dead_peer_timeout: Duration::from_secs(10),
            schema: "distlock".to_owned(),
        }
    }
}

/// The shortest [`PostgresConfig::session_timeout`] accepted.
const MIN_SESSION_TIMEOUT: Duration = Duration::from_millis(500);
/// The server's limit on millisecond settings.
const MAX_SETTING_MS: u128 = i32::MAX as u128;
/// How often a waiting session's server checks that its client is still connected.
pub(crate) const CLIENT_CHECK_INTERVAL_MS: u64 = 1000;

impl PostgresConfig {
    /// Checks the bounds documented on each field.
    ///
    /// # Errors
    /// [`LockError::Config`] naming the first field out of bounds.
    pub fn validate(&self) -> Result<(), LockError> {
        let bad = |message: String| Err(LockError::config(POSTGRES_BACKEND, message));
        check_session_counts(POSTGRES_BACKEND, self.shared_sessions, self.wait_sessions)?;
        if self.session_timeout < MIN_SESSION_TIMEOUT
            || self.session_timeout.as_millis() > MAX_SETTING_MS
        {
            return bad(format!(
                "session_timeout {:?} must be between {MIN_SESSION_TIMEOUT:?} and {MAX_SETTING_MS} ms",
                self.session_timeout
            ));
        }
        check_heartbeat(
            POSTGRES_BACKEND,
            self.session_timeout,
            self.heartbeat(),
            self.request_timeout,
        )?;
        if self.dead_peer_timeout < Duration::from_secs(2)
            || self.dead_peer_timeout.as_millis() > MAX_SETTING_MS
        {
            return bad(format!(
                "dead_peer_timeout {:?} must be at least 2 s and below {MAX_SETTING_MS} ms",
                self.dead_peer_timeout
            ));
        }
        let schema_ok = !self.schema.is_empty()
            && self.schema.len() <= 63
            && self
                .schema
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            && !self.schema.as_bytes()[0].is_ascii_digit();
        if !schema_ok {
            return bad(format!(
                "schema {:?} must be 1 to 63 lowercase ASCII letters, digits or `_`, not starting with a digit",
                self.schema
            ));
        }
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

    /// The longest a cut-off client's locks outlive its last round trip: the
    /// `session_timeout`, plus the server's timer slack.
    pub fn dead_holder_bound(&self) -> Duration {
        self.session_timeout + Duration::from_millis(100)
    }
}

/// The URL schemes a Postgres lock client accepts.
pub const URL_SCHEMES: [&str; 2] = ["postgres", "postgresql"];

/// Where `options` connect: `host:port`, or the Unix socket's path. For messages: never
/// the URL, which may carry a password.
pub(crate) fn server_address(options: &PgConnectOptions) -> String {
    if let Some(socket) = options.get_socket() {
        return socket.display().to_string();
    }
    host_port(options.get_host(), options.get_port())
}

/// A parsed `postgres://` or `postgresql://` URL: the server, login and database, before
/// the settings every distlock session adds. Its `Debug` shows the server's address
/// only, never the password.
#[derive(Clone)]
pub struct PostgresUrl {
    options: PgConnectOptions,
    pool_mode: PoolMode,
}

impl PostgresUrl {
    /// The URL as the driver parsed it (host, port, user, database, its own options).
    pub fn options(&self) -> &PgConnectOptions {
        &self.options
    }

    /// The design the URL's `pool_mode` parameter selects (default
    /// [`PoolMode::Session`]).
    pub fn pool_mode(&self) -> PoolMode {
        self.pool_mode
    }
}

/// What sits between the client and the server, as the URL parameter `pool_mode` says,
/// and so which design a client uses (see the crate docs, "Poolers").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PoolMode {
    /// `pool_mode=session` (the default): every connection of the client is its own
    /// server session for as long as it is open: the server itself, or a pooler in
    /// session mode (PgBouncer's `pool_mode = session`). Session advisory locks,
    /// multiplexed over a few sessions ([`crate::PostgresLock`]). Behind a transaction
    /// pooler this design refuses to run (a [`LockError::Config`] naming the URL form
    /// below).
    #[default]
    Session,
    /// `pool_mode=transaction`: a transaction pooler (PgBouncer's `pool_mode =
    /// transaction`) may hand each transaction to another server connection. Each grant
    /// is a transaction-scoped advisory lock in a transaction of its own, kept open
    /// (pinned to one server connection) for the lease's life, with unnamed statements
    /// only ([`crate::PostgresXactLock`] as an engine). Correct straight to the server
    /// too.
    Transaction,
}

/// The URL parameter that selects a [`PoolMode`].
pub const POOL_MODE_PARAM: &str = "pool_mode";

impl std::fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresUrl")
            .field("server", &server_address(&self.options))
            .finish_non_exhaustive()
    }
}

/// Parses `postgres://` or `postgresql://` URLs in the forms sqlx accepts
/// (`postgres://user:password@host:port/database?options`). An `application_name` is
/// set to `distlock` unless the URL names one.
///
/// TLS follows libpq's parameters `sslmode` (default `prefer`), `sslrootcert`,
/// `sslcert` and `sslkey`, with libpq's environment variables (`PGSSLMODE`, …) and
/// default files in `~/.postgresql/` (see the crate docs for the rules and the few
/// differences). The named files are checked here, so a missing one fails the parse.
///
/// `pool_mode=session` (the default) or `pool_mode=transaction` selects the design
/// ([`PoolMode`]); it is not passed to the driver.
///
/// # Errors
/// [`LockError::Config`] for another scheme, a URL sqlx cannot parse, an unknown
/// `pool_mode`, an unknown or
/// unsupported (`allow`) `sslmode`, a certificate or key file that cannot be read, a
/// verifying mode without a root certificate, a client certificate without its key, or
/// a mode needing TLS in a build without the `tls` feature. Error messages never
/// repeat the URL, which may carry a password.
pub fn parse_url(url: &str) -> Result<PostgresUrl, LockError> {
    check_scheme(url, &URL_SCHEMES, POSTGRES_BACKEND, "Postgres")?;
    let unparsable = |source: Box<dyn std::error::Error + Send + Sync>| LockError::Config {
        backend: POSTGRES_BACKEND,
        message: match url_address(url) {
            Some(address) => format!("{address}: the Postgres URL could not be parsed"),
            None => "the Postgres URL could not be parsed".into(),
        },
        source: Some(source),
    };
    let mut parsed = url::Url::parse(url).map_err(|e| unparsable(e.into()))?;
    let pool_mode = take_pool_mode(&mut parsed)?;
    // TLS first: its errors are clearer than the driver's.
    let tls = tls::resolve(&parsed, &tls::Sources::process())?;
    let options = PgConnectOptions::from_str(parsed.as_str()).map_err(|e| unparsable(e.into()))?;
    let options = tls.apply(options);
    let options = if options.get_application_name().is_none() {
        options.application_name("distlock")
    } else {
        options
    };
    Ok(PostgresUrl { options, pool_mode })
}

/// Removes the `pool_mode` parameter from `url` (the driver does not know it) and
/// returns the mode it names.
fn take_pool_mode(url: &mut url::Url) -> Result<PoolMode, LockError> {
    let mut mode = None;
    let mut rest = Vec::new();
    for (name, value) in url.query_pairs() {
        if name == POOL_MODE_PARAM {
            let named = match value.as_ref() {
                "session" => PoolMode::Session,
                "transaction" => PoolMode::Transaction,
                other => {
                    return Err(LockError::config(
                        POSTGRES_BACKEND,
                        format!(
                            "{POOL_MODE_PARAM}={other:?} is not a pooling mode: use \
                             {POOL_MODE_PARAM}=transaction behind a transaction pooler \
                             (PgBouncer's pool_mode = transaction), or session (the default)"
                        ),
                    ))
                }
            };
            if mode.is_some_and(|m| m != named) {
                return Err(LockError::config(
                    POSTGRES_BACKEND,
                    format!("{POOL_MODE_PARAM} is given twice, with different values"),
                ));
            }
            mode = Some(named);
        } else {
            rest.push((name.into_owned(), value.into_owned()));
        }
    }
    if mode.is_some() {
        if rest.is_empty() {
            url.set_query(None);
        } else {
            url.query_pairs_mut().clear().extend_pairs(rest);
        }
    }
    Ok(mode.unwrap_or_default())
}

/// The connect options of `url` for the transaction-pooling design: no start-up
/// parameters beyond the pooler's known ones (no `options`, no `extra_float_digits`),
/// and no statement cache.
pub(crate) fn pooler_options(url: &PostgresUrl) -> PgConnectOptions {
    url.options
        .clone()
        .extra_float_digits(None)
        .statement_cache_capacity(0)
        .disable_statement_logging()
}

/// The connect options of `url` with the server settings every distlock session runs
/// with (see the crate docs).
pub(crate) fn session_options(url: &PostgresUrl, config: &PostgresConfig) -> PgConnectOptions {
    let options = url.options.clone();
    // Waits are long statements by design: keep sqlx from logging them as slow.
    options
        .options(session_settings(config))
        .disable_statement_logging()
}

/// The same settings as `SET` statements, for a session whose start-up parameters a
/// pooler dropped (PgBouncer's `ignore_startup_parameters` ignores `options`).
pub(crate) fn session_set_statements(config: &PostgresConfig) -> String {
    session_settings(config)
        .into_iter()
        .map(|(name, value)| format!("SET {name} = '{value}'"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The server settings of every session (values are numbers or `on`).
fn session_settings(config: &PostgresConfig) -> Vec<(&'static str, String)> {
    let peer_secs = config.dead_peer_timeout.as_secs().max(2);
    let keepalive_idle = peer_secs / 2;
    let keepalive_count = (peer_secs - keepalive_idle).max(1);
    let settings: Vec<(&'static str, String)> = vec![
        (
            "idle_session_timeout",
            config.session_timeout.as_millis().to_string(),
        ),
        // Shared sessions never wait on a lock; waits set their own limit.
        (
            "lock_timeout",
            config
                .request_timeout
                .as_millis()
                .min(MAX_SETTING_MS)
                .to_string(),
        ),
        (
            "client_connection_check_interval",
            CLIENT_CHECK_INTERVAL_MS.to_string(),
        ),
        ("tcp_keepalives_idle", keepalive_idle.to_string()),
        ("tcp_keepalives_interval", "1".to_string()),
        ("tcp_keepalives_count", keepalive_count.to_string()),
        (
            "tcp_user_timeout",
            config.dead_peer_timeout.as_millis().to_string(),
        ),
        // Fencing tokens must survive a server crash once handed out.
        ("synchronous_commit", "on".to_string()),
    ];
    settings
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unparsable_url_names_its_address_but_not_its_password() {
        let Err(LockError::Config {
            message, source, ..
        }) = parse_url("postgres://app:s3cret@db.example:99999/locks")
        else {
            panic!("a bad port is a configuration error");
        };
        assert_eq!(
            message,
            "db.example:99999: the Postgres URL could not be parsed"
        );
        assert!(source.is_some_and(|s| s.to_string().contains("port")));
        assert_eq!(url_address("postgres:///locks"), None);
    }

    #[test]
    fn default_is_valid() {
        assert!(PostgresConfig::default().validate().is_ok());
        assert_eq!(
            PostgresConfig::default().heartbeat(),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn bad_configs_are_config_errors() {
        let d = PostgresConfig::default;
        let mut bad = vec![
            PostgresConfig {
                shared_sessions: 0,
                ..d()
            },
            PostgresConfig {
                wait_sessions: 0,
                ..d()
            },
            PostgresConfig {
                session_timeout: Duration::from_millis(10),
                ..d()
            },
            PostgresConfig {
                heartbeat: Some(Duration::from_secs(9)),
                ..d()
            },
            PostgresConfig {
                heartbeat: Some(Duration::ZERO),
                ..d()
            },
            PostgresConfig {
                request_timeout: Duration::ZERO,
                ..d()
            },
            PostgresConfig {
                dead_peer_timeout: Duration::from_secs(1),
                ..d()
            },
        ];
        for schema in ["", "Distlock", "1abc", "a-b", "a;drop", &"x".repeat(64)] {
            bad.push(PostgresConfig {
                schema: schema.to_owned(),
                ..d()
            });
        }
        for c in bad {
            assert!(
                matches!(c.validate(), Err(LockError::Config { .. })),
                "{c:?}"
            );
        }
    }

    #[test]
    fn pool_mode_selects_the_design_and_is_not_passed_on() {
        let session = parse_url("postgres://u@h/db").unwrap();
        assert_eq!(session.pool_mode(), PoolMode::Session);
        let t =
            parse_url("postgres://u@h:6432/db?pool_mode=transaction&application_name=x").unwrap();
        assert_eq!(t.pool_mode(), PoolMode::Transaction);
        assert_eq!(t.options().get_application_name(), Some("x"));
        assert_eq!(t.options().get_port(), 6432);
        let only = parse_url("postgres://u@h/db?pool_mode=session").unwrap();
        assert_eq!(only.pool_mode(), PoolMode::Session);
        for bad in [
            "postgres://u:secret@h/db?pool_mode=statement",
            "postgres://u:secret@h/db?pool_mode=",
            "postgres://u:secret@h/db?pool_mode=session&pool_mode=transaction",
        ] {
            match parse_url(bad) {
                Err(LockError::Config { message, .. }) => {
                    assert!(message.contains("pool_mode"), "{message}");
                    assert!(!message.contains("secret"), "{message}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn pooler_options_send_no_startup_settings() {
        let o = pooler_options(&parse_url("postgres://u@h/db?pool_mode=transaction").unwrap());
        assert!(o.get_options().is_none());
    }

    #[test]
    fn session_settings_as_statements() {
        let sql = session_set_statements(&PostgresConfig::default());
        assert!(sql.contains("SET idle_session_timeout = '10000'"), "{sql}");
        assert!(sql.contains("SET synchronous_commit = 'on'"), "{sql}");
    }

    #[test]
    fn urls() {
        let c = PostgresConfig::default();
        for url in [
            "postgres://u@h:5/db",
            "postgresql://u:pw@h/db",
            "POSTGRES://h",
        ] {
            let parsed = parse_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            let o = session_options(&parsed, &c);
            assert!(o
                .get_options()
                .is_some_and(|s| s.contains("idle_session_timeout=10000")));
            assert_eq!(o.get_application_name(), Some("distlock"));
        }
        let o = session_options(
            &parse_url("postgres://h/db?application_name=mine").unwrap(),
            &c,
        );
        assert_eq!(o.get_application_name(), Some("mine"));
        for url in [
            "",
            "   ",
            "memory://x",
            "redis://h",
            "postgres:/h",
            "not a url",
            "://nothing",
            "postgres://u:secret@h:notaport/db",
        ] {
            match parse_url(url) {
                Err(LockError::Config { message, .. }) => {
                    assert!(!message.contains("secret"), "{message}")
                }
                other => panic!("{url:?}: {other:?}"),
            }
        }
    }
}
