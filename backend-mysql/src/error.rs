//! Mapping sqlx errors to [`LockError`].

use distlock_api::LockError;
use sqlx::mysql::MySqlDatabaseError;

use crate::MYSQL_BACKEND;

/// The server's error number, if `error` is a server error.
pub(crate) fn error_number(error: &sqlx::Error) -> Option<u16> {
    match error {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(MySqlDatabaseError::number),
        _ => None,
    }
}

/// Server errors that end the session: shutting down (1053), connection killed
/// (1927, MariaDB), aborted connection (1152), `KILL` of the connection (1317 is a
/// query kill: the session survives, so it is not here).
const SESSION_ENDING: [u16; 3] = [1053, 1927, 1152];

/// Whether `error` left the connection unusable: I/O and protocol failures, and
/// server errors that end the session.
pub(crate) fn ends_session(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(_) => {
            error_number(error).is_some_and(|n| SESSION_ENDING.contains(&n))
        }
        sqlx::Error::Io(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed => true,
        _ => false,
    }
}

/// Errors that mean "this statement lost a race, run it again": InnoDB's deadlock
/// (1213, MySQL and MariaDB), lock wait timeout (1205), and MySQL's user-lock
/// deadlock (3058, `GET_LOCK` waits that would deadlock). Nothing was taken.
const RETRY_NUMBERS: [u16; 3] = [1213, 1205, 3058];

/// Maps an error from a lock statement to a [`LockError`]: a session-ending error is a
/// connection error, a [`RETRY_NUMBERS`] refusal is [`LockError::Transient`], a missing
/// right is a configuration error, and anything else the server refused is a backend
/// error.
pub(crate) fn lock_error(error: sqlx::Error) -> LockError {
    if error_number(&error).is_some_and(|n| RETRY_NUMBERS.contains(&n)) {
        return LockError::transient(MYSQL_BACKEND, error);
    }
    if let Some(message) = missing_right(&error) {
        return LockError::Config {
            backend: MYSQL_BACKEND,
            message,
            source: Some(error.into()),
        };
    }
    if ends_session(&error) {
        return LockError::connection(MYSQL_BACKEND, error);
    }
    LockError::backend_error(MYSQL_BACKEND, error)
}

/// The words for a server refusal of a statement for a missing privilege (1142 a
/// table command, 1044/1045 access, 1227 a global privilege).
fn missing_right(error: &sqlx::Error) -> Option<String> {
    let sqlx::Error::Database(db) = error else {
        return None;
    };
    let number = error_number(error)?;
    [1142, 1143, 1044, 1227].contains(&number).then(|| {
        format!(
            "the server refused a statement for a missing privilege (server said: {})",
            db.message()
        )
    })
}

/// Maps an error from opening a session with the server at `address`: refusals that
/// retrying cannot fix (credentials, an unknown database, TLS) are configuration
/// errors; the rest are connection errors. Either names the address.
pub(crate) fn connect_error(error: sqlx::Error, address: &str) -> LockError {
    let hint = match error_number(&error) {
        Some(1045) => Some("the server refused the credentials"),
        Some(1049) => Some("the database does not exist"),
        Some(1044) => Some("the database does not exist, or this user may not use it"),
        Some(1130) => Some("the server does not let this host connect"),
        _ => None,
    };
    if let Some(hint) = hint {
        // The server's own words (they name the user or database, never a password).
        let said = match &error {
            sqlx::Error::Database(db) => format!(" (server said: {})", db.message()),
            _ => String::new(),
        };
        return LockError::Config {
            backend: MYSQL_BACKEND,
            message: format!("{address}: {hint}{said}"),
            source: Some(error.into()),
        };
    }
    match error {
        error if tls_refusal(&error) => LockError::Config {
            backend: MYSQL_BACKEND,
            message: format!("{address}: TLS failed: {error}"),
            source: Some(error.into()),
        },
        sqlx::Error::Configuration(source) => LockError::Config {
            backend: MYSQL_BACKEND,
            message: format!("{address}: invalid connection settings"),
            source: Some(source),
        },
        error => LockError::connection_in_words(MYSQL_BACKEND, address, error),
    }
}

/// Whether opening a session failed on TLS in a way retrying cannot fix: the server
/// does not offer TLS where the mode needs it, a certificate or key the driver cannot
/// use, or a handshake one side refused (an untrusted or misnamed server certificate,
/// a client certificate the server refused: rustls reports these as I/O errors). A
/// connection cut during the handshake is a plain I/O error, not one of these.
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

/// Whether a failed connect may succeed shortly: a refused or silent port, a server
/// starting or shutting down, or one with no connection free (1040).
pub(crate) fn connect_may_pass(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(io) => matches!(
            io.kind(),
            std::io::ErrorKind::ConnectionRefused
                | std::io::ErrorKind::TimedOut
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::UnexpectedEof
        ),
        _ => error_number(error).is_some_and(|n| [1040, 1053, 1927].contains(&n)),
    }
}
