//! Mapping `etcd-client` errors to [`LockError`], and per-request timeouts.

use std::future::Future;
use std::time::Duration;

use distlock_api::connect_retry::Refused;
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
            Fail::TimedOut(limit) => LockError::connection(
                ETCD_BACKEND,
                format!("no reply from etcd within {} ms", limit.as_millis()),
            ),
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
    // The message in words; the driver's error stays the source.
    let said = |error: EtcdError| distlock_api::InWords::with_words(etcd_words(&error), error);
    match error {
        EtcdError::TransportError(_) | EtcdError::IoError(_) => {
            LockError::connection(ETCD_BACKEND, said(error))
        }
        EtcdError::GRpcStatus(ref status) => {
            let message = status.message();
            match status.code() {
                Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Aborted => {
                    LockError::connection(ETCD_BACKEND, said(error))
                }
                Code::ResourceExhausted => LockError::transient(ETCD_BACKEND, said(error)),
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
                    LockError::connection(ETCD_BACKEND, said(error))
                }
                _ if message.contains("leader changed")
                    || message.contains("no leader")
                    || message.contains("timed out")
                    || message.contains("too many requests") =>
                {
                    LockError::transient(ETCD_BACKEND, said(error))
                }
                _ => LockError::backend_error(ETCD_BACKEND, said(error)),
            }
        }
        EtcdError::WatchError(_) | EtcdError::LeaseKeepAliveError(_) => {
            LockError::connection(ETCD_BACKEND, said(error))
        }
        other => LockError::backend_error(ETCD_BACKEND, said(other)),
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

/// etcd's error told in words: the transport's I/O cause ("connection refused"), else
/// the most specific message in the error's chain, never the `Debug` dump that
/// `etcd-client` and `tonic` put in their `Display`.
pub(crate) fn etcd_words(error: &EtcdError) -> String {
    let words = match error {
        EtcdError::GRpcStatus(status) => {
            let words = distlock_api::in_words(status);
            if distlock_api::looks_like_debug(status.message()) || status.message().is_empty() {
                words
            } else if words == "the driver failed without a readable reason" {
                status.message().to_owned()
            } else {
                words
            }
        }
        other => distlock_api::in_words(other),
    };
    if words.contains("connection closed") {
        "the server closed the connection".to_owned()
    } else {
        words
    }
}

/// A failed connect attempt to `hosts`, told in words (the driver's error stays the
/// source) and sorted: a refused or silent port, a member without a leader and other
/// unavailability may pass (retried until the connect timeout); refused credentials,
/// a connection that opened and broke before etcd answered (TLS on one side only, a
/// refused TLS handshake, another kind of server) and any other answer do not.
pub(crate) fn connect_refused(hosts: &str, tls: bool, fail: Fail) -> Refused {
    let words = match &fail {
        Fail::Etcd(error) => etcd_words(error),
        _ => String::new(),
    };
    let status = match &fail {
        Fail::Etcd(EtcdError::GRpcStatus(status)) => status.message().to_ascii_lowercase(),
        _ => String::new(),
    };
    match LockError::from(fail) {
        LockError::Config {
            backend,
            message,
            source,
        } => Refused::Lasting(LockError::Config {
            backend,
            message: format!("etcd at {hosts}: {message}"),
            source,
        }),
        LockError::Connection { backend, source } => {
            let text = format!("{words} {status}").to_ascii_lowercase();
            let passing = [
                "refused",
                "no reply",
                "timed out",
                "unreachable",
                "dns",
                "leader",
            ]
            .iter()
            .any(|word| text.contains(word))
                || words.is_empty();
            let hint = match (passing, tls) {
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
            };
            let error = LockError::Connection {
                backend,
                source: Box::new(AtServers {
                    hosts: hosts.to_owned(),
                    error: source,
                    hint,
                }),
            };
            if passing {
                Refused::Passing(error)
            } else {
                Refused::Lasting(error)
            }
        }
        LockError::Transient { backend, source } => Refused::Passing(LockError::Connection {
            backend,
            source: Box::new(AtServers {
                hosts: hosts.to_owned(),
                error: source,
                hint: None,
            }),
        }),
        LockError::Backend { backend, source } => Refused::Lasting(LockError::Config {
            backend,
            message: format!(
                "etcd at {hosts}: {words} (is this the client port of an etcd server?)"
            ),
            source: Some(source),
        }),
        other => Refused::Lasting(other),
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
