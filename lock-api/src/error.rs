//! [`LockError`]: the one error type of every lock operation.

use std::time::Duration;

use crate::{KeyError, LockKey};

/// A boxed error from a backend's driver.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The backend name used for errors raised before any backend is involved.
pub const API_BACKEND_NAME: &str = "distlock";

/// Why a lease is no longer held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotHeldReason {
    /// The lease ran out (or was already released) and nobody else holds the key.
    Expired,
    /// Another owner holds the key now.
    HeldByOther,
    /// The backend lost the lease (session ended, connection cut, renewal refused).
    Lost,
}

impl std::fmt::Display for NotHeldReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NotHeldReason::Expired => "the lease expired",
            NotHeldReason::HeldByOther => "another owner holds it",
            NotHeldReason::Lost => "the lease was lost",
        })
    }
}

/// An error together with the server address it concerns, so that a message says where.
///
/// Backends wrap driver errors in it (see [`LockError::connection_at`]). The address is
/// `host:port` (or a socket path), never a URL: a URL may carry a password.
#[derive(Debug, thiserror::Error)]
#[error("{address}: {source}")]
#[non_exhaustive]
pub struct AtAddress {
    /// The server's `host:port` as configured.
    pub address: String,
    /// What happened there.
    #[source]
    pub source: BoxError,
}

impl AtAddress {
    /// `source`, at `address`.
    pub fn new(address: impl Into<String>, source: impl Into<BoxError>) -> Self {
        AtAddress {
            address: address.into(),
            source: source.into(),
        }
    }
}

/// A driver error told in words: [`Display`](std::fmt::Display) is a short sentence for
/// an operator (see [`in_words`]), and [`source`](std::error::Error::source) is the
/// driver's error itself, for code and for logs that want every detail.
#[derive(Debug)]
pub struct InWords {
    words: String,
    source: BoxError,
}

impl InWords {
    /// `source`, described by [`in_words`].
    pub fn new(source: impl Into<BoxError>) -> Self {
        let source = source.into();
        InWords {
            words: in_words(source.as_ref()),
            source,
        }
    }

    /// `source`, described as `words` (which should name the cause, not the driver's
    /// types).
    pub fn with_words(words: impl Into<String>, source: impl Into<BoxError>) -> Self {
        InWords {
            words: words.into(),
            source: source.into(),
        }
    }
}

impl std::fmt::Display for InWords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.words)
    }
}

impl std::error::Error for InWords {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.source.as_ref())
    }
}

/// Text that gives away a `Debug` rendering (`Os { code: 111, … }`,
/// `tonic::transport::Error(…)`) rather than a sentence: what [`in_words`] avoids.
pub fn looks_like_debug(text: &str) -> bool {
    ["{ ", "Os {", "tonic::", "Error("]
        .iter()
        .any(|marker| text.contains(marker))
}

/// The cause of a connection-level `error`, in words for an operator: an I/O error
/// anywhere in its [`source`](std::error::Error::source) chain by its kind
/// ("connection refused", "timed out", "the server closed the connection", …), else
/// the deepest message of the chain (the most specific) that is not a `Debug` dump
/// (see [`looks_like_debug`]), else a note that the driver gave no readable reason (the
/// whole error stays reachable as the source of an [`InWords`]).
pub fn in_words(error: &(dyn std::error::Error + 'static)) -> String {
    let chain = || std::iter::successors(Some(error), |e| e.source());
    if let Some(words) = chain()
        .filter_map(|e| e.downcast_ref::<std::io::Error>())
        .find_map(io_words)
    {
        return words;
    }
    chain()
        .map(|e| e.to_string())
        .filter(|text| !text.trim().is_empty() && !looks_like_debug(text))
        .last()
        .unwrap_or_else(|| "the driver failed without a readable reason".to_owned())
}

/// An I/O error's kind in words, or its own message when that reads well; `None` for
/// an error that only wraps another (which the chain names instead).
fn io_words(error: &std::io::Error) -> Option<String> {
    use std::io::ErrorKind as K;
    let words = match error.kind() {
        K::ConnectionRefused => "connection refused",
        K::ConnectionReset => "the server reset the connection",
        K::ConnectionAborted => "the connection was aborted",
        K::UnexpectedEof | K::BrokenPipe => "the server closed the connection",
        K::NotConnected => "not connected",
        K::TimedOut => "timed out",
        K::AddrNotAvailable => "the address is not available",
        K::HostUnreachable => "the host is unreachable",
        K::NetworkUnreachable => "the network is unreachable",
        K::PermissionDenied => "permission denied",
        K::NotFound => "not found",
        _ => {
            if let Some(inner) = error.get_ref() {
                let text = inner.to_string();
                return (!looks_like_debug(&text) && !text.trim().is_empty()).then_some(text);
            }
            let text = error.to_string();
            return (!looks_like_debug(&text)).then_some(text);
        }
    };
    Some(words.to_owned())
}

/// Why [`LockOptions`](crate::LockOptions) were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OptionsError {
    /// The TTL was below [`MIN_TTL`](crate::MIN_TTL).
    #[error("ttl {ttl:?} is below the minimum of {min:?}")]
    TtlTooShort {
        /// The TTL given.
        ttl: Duration,
        /// [`MIN_TTL`](crate::MIN_TTL).
        min: Duration,
    },
    /// The TTL was above [`MAX_TTL`](crate::MAX_TTL).
    #[error("ttl {ttl:?} is above the maximum of {max:?}; use auto-renew to hold longer")]
    TtlTooLong {
        /// The TTL given.
        ttl: Duration,
        /// [`MAX_TTL`](crate::MAX_TTL).
        max: Duration,
    },
    /// The retry backoff would spin or is inverted.
    #[error("{0}")]
    Backoff(&'static str),
    /// The auto-renew settings cannot keep the lease alive.
    #[error("{0}")]
    AutoRenew(&'static str),
    /// The auto-renew period is below [`MIN_RENEW_INTERVAL`](crate::MIN_RENEW_INTERVAL) or above half the TTL.
    #[error("auto-renew interval {interval:?} must be at least {min:?} and at most half the ttl ({max:?})")]
    RenewInterval {
        /// The period asked for (TTL/3 by default).
        interval: Duration,
        /// [`MIN_RENEW_INTERVAL`](crate::MIN_RENEW_INTERVAL).
        min: Duration,
        /// Half the TTL.
        max: Duration,
    },
    /// A semaphore's permit count was 0 or above [`MAX_PERMITS`](crate::MAX_PERMITS).
    #[error("a semaphore needs between 1 and {max} permits, not {permits}")]
    Permits {
        /// The count given.
        permits: u32,
        /// [`MAX_PERMITS`](crate::MAX_PERMITS).
        max: u32,
    },
    /// A candidate identity was empty or longer than
    /// [`MAX_CANDIDATE_LEN`](crate::MAX_CANDIDATE_LEN) bytes.
    #[error("a candidate identity needs between 1 and {max} bytes, not {len}")]
    Candidate {
        /// The identity's length in bytes.
        len: usize,
        /// [`MAX_CANDIDATE_LEN`](crate::MAX_CANDIDATE_LEN).
        max: usize,
    },
    /// A schedule's period was below a second or not whole seconds.
    #[error("a schedule's period must be whole seconds, at least 1 s; got {period:?}")]
    Period {
        /// The period given.
        period: Duration,
    },
    /// An all-or-nothing acquire was given no key.
    #[error("an acquire of several keys needs at least one key")]
    NoKeys,
}

/// Every failure of a lock operation. Each variant names the backend that raised it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The key was refused; see [`KeyError`].
    #[error("{backend}: invalid lock key: {source}")]
    InvalidKey {
        /// Backend name.
        backend: &'static str,
        /// What was wrong with the key.
        #[source]
        source: KeyError,
    },
    /// The options were refused; see [`OptionsError`].
    #[error("{backend}: invalid lock options: {source}")]
    InvalidOptions {
        /// Backend name.
        backend: &'static str,
        /// Which bound was broken.
        #[source]
        source: OptionsError,
    },
    /// The lock was not granted within the wait policy (immediately, for `NoWait`).
    #[error("{backend}: lock {key:?} still held by another owner after waiting {waited:?}")]
    Timeout {
        /// Backend name.
        backend: &'static str,
        /// The contended key.
        key: LockKey,
        /// How long the caller waited.
        waited: Duration,
    },
    /// The operation needs a lease that is no longer held.
    #[error("{backend}: lock {key:?} is not held: {reason}")]
    NotHeld {
        /// Backend name.
        backend: &'static str,
        /// The key.
        key: LockKey,
        /// Why.
        reason: NotHeldReason,
    },
    /// The backend cannot do this at all.
    #[error("{backend}: {operation} is not supported: {reason}")]
    Unsupported {
        /// Backend name.
        backend: &'static str,
        /// The refused operation.
        operation: &'static str,
        /// Why the backend cannot offer it.
        reason: &'static str,
    },
    /// A URL or configuration value is wrong; retrying will not help.
    #[error("{backend}: configuration error: {message}")]
    Config {
        /// Backend name.
        backend: &'static str,
        /// What is wrong, for a human.
        message: String,
        /// The parser's error, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// The server could not be reached or the connection broke.
    #[error("{backend}: connection error: {source}")]
    Connection {
        /// Backend name.
        backend: &'static str,
        /// The driver's error.
        #[source]
        source: BoxError,
    },
    /// The server is up but cannot serve the request now, and said so in its own terms
    /// (Redis `LOADING`, `BUSY`, `TRYAGAIN`; Postgres serialization failure `40001` or
    /// deadlock `40P01`): the same call may succeed shortly, nothing was changed.
    #[error("{backend}: the server cannot serve this now (retry): {source}")]
    Transient {
        /// Backend name.
        backend: &'static str,
        /// The driver's error, with the server's code.
        #[source]
        source: BoxError,
    },
    /// The server answered with an error, or answered something unexpected; retrying
    /// the same call will not help (see [`LockError::is_retryable`]).
    #[error("{backend}: backend error: {source}")]
    Backend {
        /// Backend name.
        backend: &'static str,
        /// The driver's error.
        #[source]
        source: BoxError,
    },
    /// A semaphore acquire asked for another permit count than the key's holders use;
    /// see [`PermitMismatch`]. Retrying with the same count will not help.
    #[error("{backend}: {source}")]
    PermitMismatch {
        /// Backend name.
        backend: &'static str,
        /// The key and both counts.
        #[source]
        source: PermitMismatch,
    },
}

/// A semaphore acquire whose permit count differs from the one the key's current
/// holders and waiters use (see [`crate::DistributedSemaphore`]): nothing was taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("semaphore {key:?} is in use with {in_use} permits, not the {asked} asked for")]
#[non_exhaustive]
pub struct PermitMismatch {
    /// The key.
    pub key: LockKey,
    /// The count this acquire asked for.
    pub asked: u32,
    /// The count the key's holders use.
    pub in_use: u32,
}

impl PermitMismatch {
    /// A mismatch on `key`: `asked` for, `in_use` by the holders.
    pub fn new(key: LockKey, asked: u32, in_use: u32) -> Self {
        PermitMismatch { key, asked, in_use }
    }
}

impl LockError {
    /// The name of the backend that raised the error.
    pub fn backend(&self) -> &'static str {
        match self {
            LockError::InvalidKey { backend, .. }
            | LockError::InvalidOptions { backend, .. }
            | LockError::Timeout { backend, .. }
            | LockError::NotHeld { backend, .. }
            | LockError::Unsupported { backend, .. }
            | LockError::Config { backend, .. }
            | LockError::Connection { backend, .. }
            | LockError::Transient { backend, .. }
            | LockError::Backend { backend, .. }
            | LockError::PermitMismatch { backend, .. } => backend,
        }
    }

    /// Whether the same call may succeed later: true for timeouts, connection errors
    /// and [`LockError::Transient`] refusals (the backend's own "try again" signals);
    /// false for everything retrying cannot fix (bad input, configuration, a lease no
    /// longer held, unsupported operations, other server errors).
    ///
    /// The guard's renewal watchdog stops at the first error that is not retryable,
    /// and backends retry only retryable errors while an acquire may wait.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            LockError::Timeout { .. } | LockError::Connection { .. } | LockError::Transient { .. }
        )
    }

    /// A configuration error with no underlying source.
    pub fn config(backend: &'static str, message: impl Into<String>) -> Self {
        LockError::Config {
            backend,
            message: message.into(),
            source: None,
        }
    }

    /// Wraps a driver error as a connection error.
    pub fn connection(backend: &'static str, source: impl Into<BoxError>) -> Self {
        LockError::Connection {
            backend,
            source: source.into(),
        }
    }

    /// A connection error at `address` (`host:port`, never a URL with credentials): the
    /// message reads `address: source`.
    pub fn connection_at(
        backend: &'static str,
        address: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        LockError::connection(backend, AtAddress::new(address, source))
    }

    /// A connection error at `address` whose message tells `source` in words (see
    /// [`in_words`]): `address: connection refused`. The driver's error stays
    /// reachable through [`source`](std::error::Error::source).
    pub fn connection_in_words(
        backend: &'static str,
        address: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        LockError::connection_at(backend, address, InWords::new(source))
    }

    /// Wraps a driver error the server marked as temporary as a [`LockError::Transient`].
    pub fn transient(backend: &'static str, source: impl Into<BoxError>) -> Self {
        LockError::Transient {
            backend,
            source: source.into(),
        }
    }

    /// Wraps a driver error as a backend error.
    pub fn backend_error(backend: &'static str, source: impl Into<BoxError>) -> Self {
        LockError::Backend {
            backend,
            source: source.into(),
        }
    }

    /// Options refused by `backend`.
    pub fn invalid_options(backend: &'static str, source: OptionsError) -> Self {
        LockError::InvalidOptions { backend, source }
    }
}

impl From<KeyError> for LockError {
    fn from(source: KeyError) -> Self {
        LockError::InvalidKey {
            backend: API_BACKEND_NAME,
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ECONNRESET` on Linux (and its `Debug` is `Os { code: 104, … }`).
    fn libc_econnreset() -> i32 {
        104
    }

    #[test]
    fn io_errors_read_as_words_and_keep_their_source() {
        use std::error::Error as _;
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let error = LockError::connection_in_words("etcd", "127.0.0.1:1", refused);
        assert_eq!(
            error.to_string(),
            "etcd: connection error: 127.0.0.1:1: connection refused"
        );
        let mut cause = error.source();
        let mut found = false;
        while let Some(e) = cause {
            found |= e.is::<std::io::Error>();
            cause = e.source();
        }
        assert!(found, "the io::Error is in the source chain");
        #[derive(Debug)]
        struct Dump(std::io::Error);
        impl std::fmt::Display for Dump {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "transport: {:?}", self.0)
            }
        }
        impl std::error::Error for Dump {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let reset = Dump(std::io::Error::from_raw_os_error(libc_econnreset()));
        assert!(looks_like_debug(&reset.to_string()));
        assert_eq!(in_words(&reset), "the server reset the connection");
        let plain = std::io::Error::other("certificate not trusted");
        assert_eq!(in_words(&plain), "certificate not trusted");
    }

    #[test]
    fn retryable_kinds_are_the_ones_a_retry_can_fix() {
        assert!(LockError::transient("x", "BUSY").is_retryable());
        assert!(LockError::connection("x", "reset").is_retryable());
        assert!(!LockError::backend_error("x", "WRONGTYPE").is_retryable());
        assert!(!LockError::config("x", "bad url").is_retryable());
        assert_eq!(LockError::transient("x", "BUSY").backend(), "x");
    }
}
