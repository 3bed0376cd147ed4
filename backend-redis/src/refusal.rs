//! What a failed connection handshake means, told from the server's actual reply.
//!
//! redis-rs opens a connection with `HELLO 3 [AUTH user password]` and `SELECT db`; a
//! refusal of either comes back as the server's error. Refusals that retrying cannot fix
//! (credentials, database, not a Redis server at all) are configuration errors; the rest
//! are connection errors. Every message names the address and never the URL, which may
//! carry a password.

use distlock_api::{AtAddress, LockError};
use redis::{ErrorKind, RedisError};

use crate::REDIS_BACKEND;

/// Maps the error of connecting to the server at `address` (selecting database `db`).
pub(crate) fn connect_error(address: &str, db: i64, error: RedisError) -> LockError {
    let said = server_said(&error);
    let problem = match error.code() {
        Some("WRONGPASS") => Some(format!(
            "authentication failed: the server refused the user name or password ({said})"
        )),
        Some("NOAUTH") => Some(format!(
            "authentication failed: the server requires a password and the URL gives none ({said})"
        )),
        Some("NOPERM") => Some(format!(
            "the user may not run the commands distlock needs ({said})"
        )),
        _ if error.kind() == ErrorKind::AuthenticationFailed => {
            Some(format!("authentication failed ({said})"))
        }
        _ if said.contains("without any password configured") => Some(format!(
            "authentication failed: the URL gives a password but the server has none set ({said})"
        )),
        _ if said.contains("DB index is out of range") || said.contains("switch database") => Some(
            format!("no such database: the server has no database {db} ({said})"),
        ),
        _ if error.kind() == ErrorKind::RESP3NotSupported => {
            Some("the server does not speak RESP3 (Redis 6 or later is needed)".to_owned())
        }
        _ if error.kind() == ErrorKind::Parse => Some(
            "not a Redis server: it answered the Redis handshake with something else".to_owned(),
        ),
        _ => None,
    };
    if let Some(problem) = problem {
        return LockError::Config {
            backend: REDIS_BACKEND,
            message: format!("{address}: {problem}"),
            source: Some(Box::new(error)),
        };
    }
    if error.is_connection_refusal() || error.is_timeout() {
        return LockError::connection_at(REDIS_BACKEND, address, error);
    }
    if error.is_io_error() || error.is_connection_dropped() {
        // Connected, then cut off before the handshake's answer: something listens
        // there, but it does not speak Redis (or wants TLS).
        return LockError::connection_at(
            REDIS_BACKEND,
            address,
            format!(
                "not a Redis server? it closed the connection without answering the Redis handshake \
                 (a TLS-only server needs rediss://): {error}"
            ),
        );
    }
    LockError::backend_error(REDIS_BACKEND, AtAddress::new(address, error))
}

/// The server's own words: its error code and message.
fn server_said(error: &RedisError) -> String {
    match (error.code(), error.detail()) {
        (Some(code), Some(detail)) => format!("server said: {code} {detail}"),
        (None, Some(detail)) => format!("server said: {detail}"),
        _ => error.to_string(),
    }
}
