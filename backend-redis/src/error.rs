//! Every mapping of a driver error to a [`LockError`]: a failed connection handshake,
//! told from the server's actual reply; an operation's failure; and the replies that
//! mean "try again later".
//!
//! redis-rs opens a connection with `HELLO 3 [AUTH user password]` and `SELECT db`; a
//! refusal of either comes back as the server's error. Refusals that retrying cannot fix
//! (credentials, database, not a Redis server at all) are configuration errors; the rest
//! are connection errors. Every message names the address and never the URL, which may
//! carry a password.

use distlock_api::connect_retry::Refused;
use distlock_api::{AtAddress, InWords, LockError};
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
    if is_transient(&error) {
        // A server still loading its dataset refuses the handshake with LOADING.
        return LockError::transient(REDIS_BACKEND, AtAddress::new(address, error));
    }
    if error.is_connection_refusal() || error.is_timeout() {
        let words = if error.is_timeout() {
            "timed out"
        } else {
            "connection refused"
        };
        return LockError::connection_at(REDIS_BACKEND, address, InWords::with_words(words, error));
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

/// [`connect_error`], sorted for [`distlock_api::connect_retry::retry_connect`]: a refused
/// or silent port and a server still loading its dataset may pass; everything else
/// (credentials, database, a server that is not Redis or wants TLS) does not.
pub(crate) fn connect_refused(address: &str, db: i64, error: RedisError) -> Refused {
    let passing = is_transient(&error) || error.is_connection_refusal() || error.is_timeout();
    let error = connect_error(address, db, error);
    if passing && error.is_retryable() {
        Refused::Passing(error)
    } else {
        Refused::Lasting(error)
    }
}

/// The server's own words: its error code and message.
fn server_said(error: &RedisError) -> String {
    match (error.code(), error.detail()) {
        (Some(code), Some(detail)) => format!("server said: {code} {detail}"),
        (None, Some(detail)) => format!("server said: {detail}"),
        _ => error.to_string(),
    }
}

/// Error codes with which a Redis server refuses a command it did not run and would
/// run later: `LOADING` (reading its dataset at start-up), `BUSY` (a script or function
/// is running past `busy-reply-threshold`), `TRYAGAIN` (a cluster slot is migrating),
/// `MASTERDOWN` (a replica that lost its primary); and the replies of a topology in
/// flux, which the next attempt finds settled: `MOVED`, `ASK` and `CLUSTERDOWN` from a
/// Cluster whose slot moved or that is failing over (once the driver's own redirects
/// are spent), `READONLY` from a Sentinel master demoted to a replica, and `UNBLOCKED`
/// for a `WAIT` (`min_replicas`) cut short by that demotion.
pub(crate) const RETRY_CODES: [&str; 9] = [
    "LOADING",
    "BUSY",
    "TRYAGAIN",
    "MASTERDOWN",
    "MOVED",
    "ASK",
    "CLUSTERDOWN",
    "READONLY",
    "UNBLOCKED",
];

/// Whether the server refused `error`'s command for now (see [`RETRY_CODES`]).
pub(crate) fn is_transient(error: &RedisError) -> bool {
    error.code().is_some_and(|code| RETRY_CODES.contains(&code))
}

/// Maps a driver error from an operation on the server at `address` to the API's
/// error kinds; the message names the address. The server's own "try again" replies
/// ([`is_transient`]) are [`LockError::Transient`].
pub(crate) fn lock_error(address: &str, error: RedisError) -> LockError {
    // A Cluster driver with no connection to the node that serves a slot (the node
    // died and a failover is moving its slots) says so with its own kind, not an I/O
    // error: it is a connection error all the same, which the next attempt may pass.
    if error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.kind() == ErrorKind::ClusterConnectionNotFound
    {
        LockError::connection_in_words(REDIS_BACKEND, address, error)
    } else if is_transient(&error) {
        LockError::transient(REDIS_BACKEND, AtAddress::new(address, error))
    } else {
        LockError::backend_error(REDIS_BACKEND, AtAddress::new(address, error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server error reply `text` (code and message), as the driver parses it.
    fn reply(text: &str) -> RedisError {
        match redis::parse_redis_value(format!("-{text}\r\n").as_bytes()) {
            Ok(redis::Value::ServerError(error)) => error.into(),
            other => panic!("not an error reply: {other:?}"),
        }
    }

    #[test]
    fn try_again_replies_are_transient_and_others_are_not() {
        for text in [
            "LOADING Redis is loading the dataset in memory",
            "BUSY Redis is busy running a script",
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "MASTERDOWN Link with MASTER is down",
            "MOVED 3999 127.0.0.1:6381",
            "ASK 3999 127.0.0.1:6381",
            "CLUSTERDOWN The cluster is down",
            "READONLY You can't write against a read only replica.",
            "UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)",
        ] {
            let error = lock_error("127.0.0.1:6379", reply(text));
            assert!(
                matches!(error, LockError::Transient { .. }),
                "{text}: {error:?}"
            );
            assert!(error.is_retryable());
            assert!(error.to_string().contains("127.0.0.1:6379"), "{error}");
        }
        // Before: a Cluster waiter whose slot's master had just died failed with a
        // backend error ("Requested connection not found"), not retried.
        let gone = RedisError::from((ErrorKind::ClusterConnectionNotFound, "No connections found"));
        let error = lock_error("127.0.0.1:6379", gone);
        assert!(matches!(error, LockError::Connection { .. }), "{error:?}");
        assert!(error.is_retryable());
        let error = lock_error("127.0.0.1:6379", reply("WRONGTYPE Operation against a key"));
        assert!(matches!(error, LockError::Backend { .. }), "{error:?}");
        assert!(!error.is_retryable());
    }
}
