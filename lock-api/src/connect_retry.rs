//! For backend authors: connecting through transient refusals.
//!
//! A server that is starting, restarting or electing a leader refuses connections for
//! a moment: the port is closed, or the server accepts and says it cannot serve yet.
//! A client started together with its server (or during a rolling restart) should not
//! give up at the first such refusal. [`retry_connect`] repeats a backend's connect
//! attempt with jittered exponential backoff ([`CONNECT_BACKOFF`]) until it succeeds,
//! until an attempt fails in a way retrying cannot fix (wrong credentials, a bad
//! address, a TLS mismatch, a server of another kind), or until the connect timeout
//! passes; then it fails with the last reason.

use std::future::Future;
use std::time::Duration;

use tokio::time::{sleep_until, timeout_at, Instant};

use crate::{Backoff, LockError};

/// The pauses between connect attempts: 50 ms doubling up to 1 s, each drawn from
/// `[d/2, d]` (see [`Backoff`]) so that many clients started together spread out.
pub const CONNECT_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(50), Duration::from_secs(1));

/// How a connect attempt was refused.
#[derive(Debug)]
pub enum Refused {
    /// A refusal that may pass (the server is starting, restarting, has no leader):
    /// try again.
    Passing(LockError),
    /// A refusal retrying cannot fix (credentials, address, TLS on one side only, a
    /// server of another kind): give up now with this error.
    Lasting(LockError),
}

impl Refused {
    /// [`Refused::Passing`] for an error a retry may fix
    /// ([`LockError::is_retryable`]), else [`Refused::Lasting`].
    pub fn by_kind(error: LockError) -> Refused {
        if error.is_retryable() {
            Refused::Passing(error)
        } else {
            Refused::Lasting(error)
        }
    }

    /// [`Refused::by_kind`] when the driver's error showed a refusal that may pass
    /// (`passing`: a refused or silent port, a server starting up), else
    /// [`Refused::Lasting`].
    pub fn by_kind_if(passing: bool, error: LockError) -> Refused {
        if passing {
            Refused::by_kind(error)
        } else {
            Refused::Lasting(error)
        }
    }
}

impl From<Refused> for LockError {
    fn from(refused: Refused) -> LockError {
        match refused {
            Refused::Passing(error) | Refused::Lasting(error) => error,
        }
    }
}

/// Runs `attempt` (given the deadline) until it succeeds or `limit` has passed since
/// the call, pausing between attempts by [`CONNECT_BACKOFF`] (never past the deadline).
///
/// A [`Refused::Lasting`] error is returned at once. When the deadline passes, the
/// answer is `gave_up(last)`, `last` being the error of the last attempt that was
/// refused (`None` when every attempt was still waiting for an answer: the attempt
/// running at the deadline is cut off there).
///
/// # Errors
/// As described: a lasting refusal, or `gave_up`'s error.
pub async fn retry_connect<T, Fut>(
    limit: Duration,
    mut attempt: impl FnMut(Instant) -> Fut,
    gave_up: impl FnOnce(Option<LockError>) -> LockError,
) -> Result<T, LockError>
where
    Fut: Future<Output = Result<T, Refused>>,
{
    let deadline = Instant::now() + limit;
    let mut delays = CONNECT_BACKOFF.delays();
    let mut last = None;
    loop {
        match timeout_at(deadline, attempt(deadline)).await {
            Ok(Ok(connected)) => return Ok(connected),
            Ok(Err(Refused::Lasting(error))) => return Err(error),
            Ok(Err(Refused::Passing(error))) => {
                tracing::debug!(%error, "connect attempt refused; retrying");
                // An attempt the deadline cut short ("no reply within 86 ms" on a
                // loaded host) says less than the whole attempt before it.
                if last.is_none() || Instant::now() < deadline {
                    last = Some(error);
                }
            }
            Err(_) => return Err(gave_up(last)),
        }
        let next = Instant::now() + delays.next_delay();
        if next >= deadline {
            sleep_until(deadline).await;
            return Err(gave_up(last));
        }
        sleep_until(next).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn retries_transient_errors_until_success_and_stops_at_permanent_ones() {
        let tries = AtomicU32::new(0);
        let connected = retry_connect(
            Duration::from_secs(5),
            |_| async {
                match tries.fetch_add(1, Ordering::Relaxed) {
                    0..=2 => Err(Refused::by_kind(LockError::connection("x", "refused"))),
                    n => Ok(n),
                }
            },
            |_| LockError::connection("x", "gave up"),
        )
        .await;
        assert_eq!(connected.ok(), Some(3));

        let tries = AtomicU32::new(0);
        let refused: Result<(), _> = retry_connect(
            Duration::from_secs(5),
            |_| async {
                tries.fetch_add(1, Ordering::Relaxed);
                Err(Refused::by_kind(LockError::config("x", "wrong password")))
            },
            |_| LockError::connection("x", "gave up"),
        )
        .await;
        assert!(matches!(refused, Err(LockError::Config { .. })));
        assert_eq!(tries.load(Ordering::Relaxed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_cut_by_the_deadline_keeps_the_reason_before_it() {
        let tries = AtomicU32::new(0);
        let failed: Result<(), _> = retry_connect(
            Duration::from_secs(1),
            |deadline| {
                let n = tries.fetch_add(1, Ordering::Relaxed);
                async move {
                    if n == 0 {
                        return Err(Refused::Passing(LockError::connection(
                            "x",
                            "connection refused",
                        )));
                    }
                    // The next attempt hangs until the deadline, then times out.
                    tokio::time::sleep_until(deadline).await;
                    Err(Refused::Passing(LockError::connection(
                        "x",
                        "no reply within 3 ms",
                    )))
                }
            },
            |last| last.unwrap_or_else(|| LockError::connection("x", "no answer")),
        )
        .await;
        let message = failed.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("connection refused"), "{message}");
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_at_the_deadline_with_the_last_reason() {
        let start = Instant::now();
        let failed: Result<(), _> = retry_connect(
            Duration::from_secs(3),
            |_| async {
                Err(Refused::Passing(LockError::connection(
                    "x",
                    "connection refused",
                )))
            },
            |last| last.unwrap_or_else(|| LockError::connection("x", "no answer")),
        )
        .await;
        assert_eq!(start.elapsed(), Duration::from_secs(3));
        let message = failed.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("connection refused"), "{message}");

        let start = Instant::now();
        let hung: Result<(), _> = retry_connect(
            Duration::from_secs(2),
            |_| std::future::pending(),
            |last| last.unwrap_or_else(|| LockError::connection("x", "no answer")),
        )
        .await;
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        let message = hung.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("no answer"), "{message}");
    }
}
