//! Mapping `etcd-client` errors to [`LockError`], and per-request timeouts.

use std::future::Future;
use std::time::Duration;

use distlock_api::LockError;
use etcd_client::Error as EtcdError;
use tonic::Code;

use crate::ETCD_BACKEND;

/// Why one request failed: the server's (or client's) answer, or no answer in time.
#[derive(Debug)]
pub(crate) enum Fail {
    Etcd(EtcdError),
    /// No reply within the request timeout. The request may still take effect.
    TimedOut(Duration),
    /// This key ranks ahead of ours in a lock's range but is not a contender of the
    /// recipe (see `recipe::contender_shape`, `recipe::marker_shape`): another tool's
    /// data under our prefix.
    Foreign(String),
}

impl Fail {
    /// The server says the lease does not exist (expired or revoked).
    pub(crate) fn is_lease_not_found(&self) -> bool {
        match self {
            Fail::Etcd(EtcdError::GRpcStatus(status)) => {
                status.code() == Code::NotFound && status.message().contains("lease not found")
            }
            Fail::Etcd(EtcdError::LeaseKeepAliveError(message)) => {
                message.contains("lease not found")
            }
            _ => false,
        }
    }
}

impl From<Fail> for LockError {
    fn from(fail: Fail) -> Self {
        match fail {
            Fail::TimedOut(limit) => {
                LockError::connection(ETCD_BACKEND, format!("no reply from etcd within {limit:?}"))
            }
            Fail::Etcd(error) => etcd_error(error),
            Fail::Foreign(key) => LockError::config(
                ETCD_BACKEND,
                format!(
                    "the lock's range holds `{key}`, which is not a contender of etcd's lock \
                     recipe (a key named by an id in hex, under a lease; a pending marker is \
                     named by 20 digits): another tool keeps data under this prefix; use \
                     another prefix in the URL"
                ),
            ),
        }
    }
}

/// Transport trouble is [`LockError::Connection`] (retryable), etcd's "try again"
/// answers [`LockError::Transient`], refused credentials and permissions
/// [`LockError::Config`], anything else [`LockError::Backend`].
pub(crate) fn etcd_error(error: EtcdError) -> LockError {
    match error {
        EtcdError::TransportError(_) | EtcdError::IoError(_) => {
            LockError::connection(ETCD_BACKEND, error)
        }
        EtcdError::GRpcStatus(ref status) => {
            let message = status.message();
            match status.code() {
                Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Aborted => {
                    LockError::connection(ETCD_BACKEND, error)
                }
                Code::ResourceExhausted => LockError::transient(ETCD_BACKEND, error),
                Code::Unauthenticated | Code::PermissionDenied => LockError::config(
                    ETCD_BACKEND,
                    format!("etcd refused this client's credentials or permissions: {message}"),
                ),
                Code::InvalidArgument | Code::FailedPrecondition
                    if message.contains("authentication") || message.contains("user name") =>
                {
                    LockError::config(
                        ETCD_BACKEND,
                        format!("etcd refused the URL's credentials: {message}"),
                    )
                }
                // A connection that failed under the client (refused, reset) surfaces
                // as an unknown status carrying the transport error.
                Code::Unknown if message.contains("transport") || message.contains("connect") => {
                    LockError::connection(ETCD_BACKEND, error)
                }
                _ if message.contains("leader changed")
                    || message.contains("no leader")
                    || message.contains("timed out")
                    || message.contains("too many requests") =>
                {
                    LockError::transient(ETCD_BACKEND, error)
                }
                _ => LockError::backend_error(ETCD_BACKEND, error),
            }
        }
        EtcdError::WatchError(_) | EtcdError::LeaseKeepAliveError(_) => {
            LockError::connection(ETCD_BACKEND, error)
        }
        other => LockError::backend_error(ETCD_BACKEND, other),
    }
}

/// Awaits one request's reply for at most `limit`.
pub(crate) async fn within<T>(
    limit: Duration,
    request: impl Future<Output = Result<T, EtcdError>>,
) -> Result<T, Fail> {
    match tokio::time::timeout(limit, request).await {
        Ok(result) => result.map_err(Fail::Etcd),
        Err(_) => Err(Fail::TimedOut(limit)),
    }
}

/// Sends a request (made afresh by `request` for each try) and awaits its reply, all
/// within `limit`. A try that failed before the request left (the balanced channel
/// picked an endpoint it could not connect to, such as a killed member) is repeated,
/// so that the other endpoints serve it.
pub(crate) async fn sent<T, F, Fut>(limit: Duration, mut request: F) -> Result<T, Fail>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, EtcdError>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    let mut tries: u32 = 0;
    loop {
        match tokio::time::timeout_at(deadline, request()).await {
            Ok(Ok(reply)) => return Ok(reply),
            Ok(Err(error)) if never_sent(&error) && tries < 20 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(u64::from(tries.min(10)) * 5)).await;
            }
            Ok(Err(error)) => return Err(Fail::Etcd(error)),
            Err(_) => return Err(Fail::TimedOut(limit)),
        }
    }
}

/// The request failed while connecting, before it was sent.
fn never_sent(error: &EtcdError) -> bool {
    match error {
        EtcdError::GRpcStatus(status) => {
            status.code() == Code::Unavailable && status.message().contains("connect error")
        }
        _ => false,
    }
}

/// A connection error that names the endpoints it concerns.
#[derive(Debug)]
struct AtServers {
    hosts: String,
    error: distlock_api::BoxError,
    /// What to check, for a connection that opened but broke (a TLS mismatch).
    hint: Option<&'static str>,
}

impl std::fmt::Display for AtServers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "etcd at {}: {}", self.hosts, self.error)?;
        if let Some(hint) = self.hint {
            write!(f, " ({hint})")?;
        }
        Ok(())
    }
}

impl std::error::Error for AtServers {}

/// Names `hosts` (no credentials) in a [`LockError::Connection`]; other errors are
/// returned as they are.
pub(crate) fn at_servers(hosts: &str, error: LockError) -> LockError {
    match error {
        LockError::Connection { backend, source } => LockError::Connection {
            backend,
            source: Box::new(AtServers {
                hosts: hosts.to_owned(),
                error: source,
                hint: None,
            }),
        },
        other => other,
    }
}

/// [`at_servers`] for a failed connect: a connection that opened and then broke before
/// etcd answered (not refused, not silent) is most likely TLS on one side only, or a
/// TLS handshake the server refused, and the error says what to check. It stays a
/// [`LockError::Connection`], as a failed handshake is for the other backends.
pub(crate) fn connect_failed(hosts: &str, tls: bool, error: LockError) -> LockError {
    let hint = match &error {
        LockError::Connection { source, .. } => {
            let text = format!("{source:?}").to_ascii_lowercase();
            let unreached = ["refused", "no reply", "timed out", "unreachable", "dns"]
                .iter()
                .any(|word| text.contains(word));
            match (unreached, tls) {
                (true, _) => None,
                (false, true) => Some(
                    "the TLS session failed: check that the server serves TLS on this port, \
                     that the URL's ca= signed its certificate, and whether it demands a client \
                     certificate (cert=, key=)",
                ),
                (false, false) => Some(
                    "the connection broke before etcd answered: if the server serves TLS, use \
                     an etcd+tls:// URL",
                ),
            }
        }
        _ => None,
    };
    match (at_servers(hosts, error), hint) {
        (LockError::Connection { backend, source }, Some(hint)) => {
            let source = match source.downcast::<AtServers>() {
                Ok(mut at) => {
                    at.hint = Some(hint);
                    at as distlock_api::BoxError
                }
                Err(other) => other,
            };
            LockError::Connection { backend, source }
        }
        (error, _) => error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_and_outages_map_to_their_kinds() {
        let status = |code, message: &str| {
            etcd_error(EtcdError::GRpcStatus(tonic::Status::new(code, message)))
        };
        assert!(matches!(
            status(Code::Unavailable, "connection refused"),
            LockError::Connection { .. }
        ));
        assert!(matches!(
            status(
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password"
            ),
            LockError::Config { .. }
        ));
        assert!(status(Code::Unknown, "etcdserver: leader changed").is_retryable());
        assert!(matches!(
            status(
                Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted"
            ),
            LockError::Backend { .. }
        ));
        let lost = Fail::Etcd(EtcdError::GRpcStatus(tonic::Status::new(
            Code::NotFound,
            "etcdserver: requested lease not found",
        )));
        assert!(lost.is_lease_not_found());
        assert!(LockError::from(Fail::TimedOut(Duration::from_secs(1))).is_retryable());
    }
}
