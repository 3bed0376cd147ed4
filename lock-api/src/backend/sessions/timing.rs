//! [`Timing`]: a session's timers, from the server's idle limit; and the checks of
//! the settings every session-multiplexing backend shares.

use std::time::Duration;

use crate::LockError;

/// How a session task runs (see [`super::TaskCore::new`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How long after a proof of life the session is surely alive on the server.
    pub horizon: Duration,
    /// How often a session holding leases proves it alive (and the reply delay that
    /// marks its leases suspect).
    pub heartbeat: Duration,
    /// How long a session holding nothing stays open unused.
    pub idle_close: Duration,
}

impl Timing {
    /// The timers of a session the server ends after `session_timeout` of silence,
    /// proven alive every `heartbeat`: leases valid for `session_timeout` less 1 % and
    /// 2 ms (for clock-rate differences) after each proof; an unused session holding
    /// nothing closed after half the `session_timeout`, before the server would end it.
    pub fn new(session_timeout: Duration, heartbeat: Duration) -> Self {
        let margin = session_timeout / 100 + Duration::from_millis(2);
        Timing {
            horizon: session_timeout.saturating_sub(margin),
            heartbeat,
            idle_close: session_timeout / 2,
        }
    }
}

/// Checks the session counts of a backend's configuration: at least one shared and
/// one dedicated session.
///
/// # Errors
/// [`LockError::Config`] of `backend`, naming the first count out of bounds.
pub fn check_session_counts(
    backend: &'static str,
    shared_sessions: usize,
    wait_sessions: usize,
) -> Result<(), LockError> {
    if shared_sessions == 0 {
        return Err(LockError::config(
            backend,
            "shared_sessions must be at least 1",
        ));
    }
    if wait_sessions == 0 {
        return Err(LockError::config(
            backend,
            "wait_sessions must be at least 1",
        ));
    }
    Ok(())
}

/// Checks a backend's heartbeat (above zero, at most half the `session_timeout`) and
/// `request_timeout` (above zero).
///
/// # Errors
/// [`LockError::Config`] of `backend`, naming the first setting out of bounds.
pub fn check_heartbeat(
    backend: &'static str,
    session_timeout: Duration,
    heartbeat: Duration,
    request_timeout: Duration,
) -> Result<(), LockError> {
    if heartbeat.is_zero() || heartbeat > session_timeout / 2 {
        return Err(LockError::config(
            backend,
            format!(
                "heartbeat {heartbeat:?} must be above zero and at most half the session_timeout ({session_timeout:?})"
            ),
        ));
    }
    if request_timeout.is_zero() {
        return Err(LockError::config(
            backend,
            "request_timeout must be above zero",
        ));
    }
    Ok(())
}
