//! Mapping sqlx errors to [`LockError`], and the typed errors this backend adds.

use std::fmt;

use distlock_api::{AtAddress, LockError};
use sqlx::postgres::{PgDatabaseError, PgSeverity};

use crate::POSTGRES_BACKEND;

/// The server's shared lock table is full, so it refused another lock.
///
/// PostgreSQL keeps every lock of every session in one table sized
/// `max_locks_per_transaction × (max_connections + max_prepared_transactions)`
/// (plus some spare shared memory). Advisory locks held by long-lived sessions count
/// against it. Release locks, or raise `max_locks_per_transaction` (a restart is
/// needed). Reported as [`LockError::Backend`] with this as its source:
///
/// ```
/// # fn check(error: &distlock_api::LockError) -> bool {
/// use std::error::Error as _;
/// error.source().is_some_and(|s| s.is::<distlock_postgres::LockTableFull>())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockTableFull {
    /// The server's message and hint.
    pub server_message: String,
}

impl fmt::Display for LockTableFull {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the server's lock table is full (max_locks_per_transaction × max_connections locks \
             across all sessions); release locks or raise max_locks_per_transaction \
             (server said: {})",
            self.server_message
        )
    }
}

impl std::error::Error for LockTableFull {}

/// The SQLSTATE of a server error, if `error` is one.
pub(crate) fn sqlstate(error: &sqlx::Error) -> Option<&str> {
    match error {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<PgDatabaseError>()
            .map(PgDatabaseError::code),
        _ => None,
    }
}

/// Whether `error` left the connection unusable: I/O and protocol failures, and
/// server errors that end the session (FATAL, PANIC, connection class 08, shutdown).
pub(crate) fn ends_session(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => match db.try_downcast_ref::<PgDatabaseError>() {
            Some(pg) => {
                matches!(pg.severity(), PgSeverity::Fatal | PgSeverity::Panic)
                    || pg.code().starts_with("08")
                    || pg.code().starts_with("57P")
            }
            None => false,
        },
        sqlx::Error::Io(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed => true,
        _ => false,
    }
}

/// The lock-table-full error, if `error` is the server running out of lock slots.
fn lock_table_full(error: &sqlx::Error) -> Option<LockTableFull> {
    let sqlx::Error::Database(db) = error else {
        return None;
    };
    let pg = db.try_downcast_ref::<PgDatabaseError>()?;
    // 53200 out_of_memory, "out of shared memory", hint: max_locks_per_transaction.
    let about_locks = pg.message().contains("shared memory")
        || pg
            .hint()
            .is_some_and(|h| h.contains("max_locks_per_transaction"));
    (pg.code() == "53200" && about_locks).then(|| LockTableFull {
        server_message: match pg.hint() {
            Some(hint) => format!("{} ({hint})", pg.message()),
            None => pg.message().to_owned(),
        },
    })
}

/// The words of a prepared-statement error that a transaction pooler causes: the
/// driver's statements met a server connection that had another client's
/// (`42P05` duplicate_prepared_statement) or lacked its own (`26000`).
fn pooler_symptom(error: &sqlx::Error) -> Option<String> {
    let sqlx::Error::Database(db) = error else {
        return None;
    };
    let pg = db.try_downcast_ref::<PgDatabaseError>()?;
    let prepared = pg.message().contains("prepared statement");
    (prepared && ["42P05", "26000"].contains(&pg.code()))
        .then(|| format!("server said: {}", pg.message()))
}

/// Whether a pooler refused the start-up parameters distlock sends (PgBouncer:
/// "unsupported startup parameter"), and its words.
fn startup_refused(error: &sqlx::Error) -> Option<String> {
    let sqlx::Error::Database(db) = error else {
        return None;
    };
    db.message()
        .contains("unsupported startup parameter")
        .then(|| db.message().to_owned())
}

/// The error of the session design behind a transaction pooler at `address`.
pub(crate) fn transaction_pooler(address: &str, evidence: &str) -> LockError {
    LockError::config(
        POSTGRES_BACKEND,
        format!(
            "{address} is a transaction pooler (PgBouncer with pool_mode = transaction, or \
             another), not a server session of this client ({evidence}): session advisory \
             locks would stay on server connections the pooler lends to other clients. \
             Connect with {param}=transaction (postgres://user@host/db?\
             {param}=transaction), which keeps each lock in a transaction of its \
             own, or point the URL at the server or at a session-mode pool",
            param = crate::config::POOL_MODE_PARAM
        ),
    )
}

/// SQLSTATEs the server uses for "this transaction lost a race, run it again":
/// serialization_failure and deadlock_detected. The statement was rolled back.
const RETRY_STATES: [&str; 2] = ["40001", "40P01"];

/// Maps an error from a lock statement to a [`LockError`]: a session-ending error is a
/// connection error, a [`RETRY_STATES`] refusal is [`LockError::Transient`], and
/// anything else the server refused is a backend error.
pub(crate) fn lock_error(error: sqlx::Error) -> LockError {
    if let Some(evidence) = pooler_symptom(&error) {
        return transaction_pooler("the server", &evidence);
    }
    if let Some(full) = lock_table_full(&error) {
        return LockError::backend_error(POSTGRES_BACKEND, full);
    }
    if sqlstate(&error).is_some_and(|code| RETRY_STATES.contains(&code)) {
        return LockError::transient(POSTGRES_BACKEND, error);
    }
    if ends_session(&error) {
        return LockError::connection(POSTGRES_BACKEND, error);
    }
    match error {
        sqlx::Error::Configuration(source) => LockError::Config {
            backend: POSTGRES_BACKEND,
            message: "invalid connection settings".into(),
            source: Some(source),
        },
        other => LockError::backend_error(POSTGRES_BACKEND, other),
    }
}

/// Maps an error from opening a session with the server at `address`: refusals that
/// retrying cannot fix (authentication, missing database, a server too old for the
/// settings, a TLS refusal: see [`tls_refusal`]) are configuration errors; the rest are connection errors. Either names the
/// address.
pub(crate) fn connect_error(error: sqlx::Error, address: &str) -> LockError {
    if let Some(said) = startup_refused(&error) {
        return LockError::Config {
            backend: POSTGRES_BACKEND,
            message: format!(
                "{address}: a pooler (PgBouncer) refused the session settings sent at start-up \
                 (server said: {said}). Behind PgBouncer in session mode, set \
                 ignore_startup_parameters = extra_float_digits,options in pgbouncer.ini; \
                 behind a transaction pooler, connect with {param}=transaction \
                 (postgres://user@host/db?{param}=transaction), which sends none",
                param = crate::config::POOL_MODE_PARAM
            ),
            source: Some(error.into()),
        };
    }
    if let Some(evidence) = pooler_symptom(&error) {
        return transaction_pooler(address, &evidence);
    }
    if let Some(full) = lock_table_full(&error) {
        // A new session needs lock slots too.
        return LockError::backend_error(POSTGRES_BACKEND, AtAddress::new(address, full));
    }
    let hint = match sqlstate(&error) {
        Some(code) if code.starts_with("28") => Some("the server refused the credentials"),
        Some("3D000") => Some("the database does not exist"),
        Some("42704") => Some(
            "the server does not know a session setting distlock needs \
             (idle_session_timeout and client_connection_check_interval need PostgreSQL 14 or later)",
        ),
        Some("42501") => Some("the user may not connect or lacks a privilege"),
        _ => None,
    };
    match (hint, error) {
        (Some(hint), error) => {
            // The server's own words (they name the user or database, never a password).
            let said = match &error {
                sqlx::Error::Database(db) => format!(" (server said: {})", db.message()),
                _ => String::new(),
            };
            LockError::Config {
                backend: POSTGRES_BACKEND,
                message: format!("{address}: {hint}{said}"),
                source: Some(error.into()),
            }
        }
        (None, error) if tls_refusal(&error) => LockError::Config {
            backend: POSTGRES_BACKEND,
            message: format!("{address}: TLS failed: {error}"),
            source: Some(error.into()),
        },
        (None, sqlx::Error::Configuration(source)) => LockError::Config {
            backend: POSTGRES_BACKEND,
            message: format!("{address}: invalid connection settings"),
            source: Some(source),
        },
        (None, error) => LockError::connection_in_words(POSTGRES_BACKEND, address, error),
    }
}

/// Whether opening a session failed on TLS in a way retrying cannot fix: the server
/// does not offer TLS where the mode needs it, a certificate or key the driver cannot
/// use, or a handshake one side refused (an untrusted or misnamed server certificate,
/// a client certificate the server refused). A connection cut during the handshake is
/// a plain I/O error, not one of these.
fn tls_refusal(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Tls(_) => true,
        #[cfg(feature = "tls")]
        sqlx::Error::Io(io) => io
            .get_ref()
            .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some()),
        _ => false,
    }
}

/// A connection error with a message of ours.
pub(crate) fn connection(message: impl Into<String>) -> LockError {
    LockError::connection(POSTGRES_BACKEND, message.into())
}
