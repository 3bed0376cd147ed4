//! Mapping `zookeeper-client` errors to [`LockError`], and per-request timeouts.

use std::future::Future;
use std::time::Duration;

use distlock_api::LockError;
use zookeeper_client as zk;

use crate::ZOOKEEPER_BACKEND;

/// Why one request failed: the server's (or client's) answer, or no answer in time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fail {
    Zk(zk::Error),
    /// No reply within the request timeout. The request may still take effect.
    TimedOut(Duration),
}

impl Fail {
    /// The session is over: its ephemeral nodes are (or will shortly be) gone.
    pub(crate) fn session_ended(&self) -> bool {
        matches!(
            self,
            Fail::Zk(zk::Error::SessionExpired | zk::Error::ClientClosed | zk::Error::SessionMoved)
        )
    }

    pub(crate) fn is_no_node(&self) -> bool {
        matches!(self, Fail::Zk(zk::Error::NoNode))
    }

    /// The request may or may not have been applied: the connection dropped (the
    /// client fails in-flight requests with `ConnectionLoss` or with the I/O error that
    /// ended the connection), or no reply came in time.
    pub(crate) fn is_uncertain(&self) -> bool {
        matches!(
            self,
            Fail::TimedOut(_)
                | Fail::Zk(
                    zk::Error::ConnectionLoss
                        | zk::Error::Timeout
                        | zk::Error::Custom(_)
                        | zk::Error::UnexpectedError(_)
                )
        )
    }

    /// The connection dropped with the request in flight (but no timeout of ours).
    pub(crate) fn is_connection_loss(&self) -> bool {
        matches!(self, Fail::Zk(_)) && self.is_uncertain()
    }
}

impl From<Fail> for LockError {
    fn from(fail: Fail) -> Self {
        match fail {
            Fail::TimedOut(limit) => LockError::connection(
                ZOOKEEPER_BACKEND,
                format!("no reply from ZooKeeper within {limit:?}"),
            ),
            Fail::Zk(error) => zk_error(error),
        }
    }
}

/// Connection-level failures are [`LockError::Connection`] (retryable); anything the
/// server refused is [`LockError::Backend`], except `NoAuth` (a node's ACL refused this
/// client's identity: wrong or missing credentials in the URL), a [`LockError::Config`]
/// as a wrong password is for the other backends.
pub(crate) fn zk_error(error: zk::Error) -> LockError {
    use zk::Error as E;
    match error {
        E::ConnectionLoss
        | E::Timeout
        | E::NoHosts
        | E::SessionExpired
        | E::SessionMoved
        | E::ClientClosed
        | E::Throttled
        // The I/O error that ended a connection.
        | E::Custom(_) => LockError::connection(ZOOKEEPER_BACKEND, error),
        E::NoAuth => LockError::config(
            ZOOKEEPER_BACKEND,
            "ZooKeeper refused the request (NoAuth): the node's ACL does not let this \
             client's identity in; a lock directory made by a client with credentials \
             admits only that user with that password (see the URL's user:password@)",
        ),
        other => LockError::backend_error(ZOOKEEPER_BACKEND, other),
    }
}

/// Awaits one request's reply for at most `limit`.
pub(crate) async fn within<T>(
    limit: Duration,
    request: impl Future<Output = Result<T, zk::Error>>,
) -> Result<T, Fail> {
    match tokio::time::timeout(limit, request).await {
        Ok(result) => result.map_err(Fail::Zk),
        Err(_) => Err(Fail::TimedOut(limit)),
    }
}

/// A connection error that names the servers it concerns.
#[derive(Debug)]
struct AtServers {
    hosts: String,
    error: distlock_api::BoxError,
}

impl std::fmt::Display for AtServers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ZooKeeper at {}: {}", self.hosts, self.error)
    }
}

impl std::error::Error for AtServers {}

/// Names `hosts` (a connect string: it carries no credentials) in a
/// [`LockError::Connection`]; other errors are returned as they are.
pub(crate) fn at_servers(hosts: &str, error: LockError) -> LockError {
    match error {
        LockError::Connection { backend, source } => LockError::Connection {
            backend,
            source: Box::new(AtServers {
                hosts: hosts.to_owned(),
                error: source,
            }),
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_loss_is_retryable_and_refusals_are_not() {
        for error in [
            zk::Error::ConnectionLoss,
            zk::Error::Timeout,
            zk::Error::SessionExpired,
        ] {
            let mapped = zk_error(error.clone());
            assert!(
                matches!(mapped, LockError::Connection { .. }),
                "{error:?}: {mapped:?}"
            );
            assert!(mapped.is_retryable(), "{error:?}");
        }
        let refused = zk_error(zk::Error::NoAuth);
        assert!(matches!(refused, LockError::Config { .. }), "{refused:?}");
        assert!(refused.to_string().contains("ACL"), "{refused}");
        assert!(!refused.is_retryable());
        let no_reply = LockError::from(Fail::TimedOut(Duration::from_secs(1)));
        assert!(no_reply.is_retryable(), "{no_reply:?}");
    }
}
