//! The one acquire of every primitive on every backend: the checks, one bounded wait,
//! one error-patience rule, and the acquire metrics.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{timeout_at, Instant};

use crate::backend::WaitReport;
use crate::engine::{Claim, Engine, Grant, Request};
use crate::metrics::{acquired, contended};
use crate::observe::{BACKEND_LABEL, WAIT_SECONDS};
use crate::{check_permits, Capabilities, Capability, LockError, LockKey, LockOptions};

/// How long past a wait's deadline an answer already on its way is still awaited
/// before the wait is cut: one grace for every backend, short enough that a caller's
/// deadline means what it says, long enough that a grant in flight is not thrown away
/// (and released) for a few milliseconds.
pub(crate) const ANSWER_GRACE: Duration = Duration::from_millis(50);

/// [`acquire`] with its metrics: a grant's acquire time, and contention as the engine
/// saw it (a grant after meeting the key held, a try that found it held, or a wait
/// that ran out), with the wait time of a contended waiting acquire.
pub(super) async fn observed(
    engine: &Arc<dyn Engine>,
    backend: &'static str,
    key: &LockKey,
    claim: Claim<'_>,
    options: &LockOptions,
    waits: bool,
) -> Result<Option<(Grant, bool)>, LockError> {
    let start = Instant::now();
    let result = acquire(engine, key, claim, options, waits).await;
    let elapsed = start.elapsed();
    let met_held = match &result {
        Ok(Some((_, contended))) => *contended,
        Ok(None) => true,
        Err(error) => matches!(error, LockError::Timeout { .. }),
    };
    if met_held {
        contended(backend);
        let may_wait = waits && options.wait().deadline_from(start) != Some(start);
        if may_wait {
            metrics::histogram!(WAIT_SECONDS, BACKEND_LABEL => backend).record(elapsed);
        }
    }
    if let Ok(Some(_)) = &result {
        acquired(backend, elapsed);
    }
    result
}

/// Takes `claim` on `key` through `engine`: once when `waits` is false (`None` when
/// held), else as the options' wait allows (never `None`: a wait that runs out is a
/// [`LockError::Timeout`]). The grant comes with whether the key was met held first.
///
/// The rule, the same on every backend:
/// - the options, the permit count and the claim are checked against the backend's
///   capabilities before anything reaches the server;
/// - a wait with a deadline is cut at the deadline plus [`ANSWER_GRACE`], whatever the
///   server does: then it fails with [`LockError::Timeout`] if an answer showed the key
///   held, else with the engine's [`Engine::unanswered`] error;
/// - retryable errors are retried with the options' backoff for at most the options'
///   [error patience](LockOptions::error_patience) from the first of a run of
///   failures, and never past the deadline; a try makes one attempt.
async fn acquire(
    engine: &Arc<dyn Engine>,
    key: &LockKey,
    claim: Claim<'_>,
    options: &LockOptions,
    waits: bool,
) -> Result<Option<(Grant, bool)>, LockError> {
    // Only the name is kept: the whole info is large, and the future carries what it
    // keeps across its awaits.
    let backend = {
        let info = engine.info();
        check(info.name, &info.capabilities, claim, options)?;
        info.name
    };
    let started = Instant::now();
    let deadline = match waits {
        true => options.wait().deadline_from(started),
        false => Some(started),
    };
    let report = WaitReport::new();
    let request = Request {
        key,
        claim,
        options,
        started,
        deadline,
        report: &report,
    };
    let timeout = || LockError::Timeout {
        backend,
        key: key.clone(),
        waited: started.elapsed(),
    };
    if !request.waits() {
        return match engine.acquire(&request).await? {
            Some(grant) => Ok(Some((grant, false))),
            None if waits => Err(timeout()),
            None => Ok(None),
        };
    }
    // Pinned in place: the timeout then moves a pointer, not the attempts' future.
    let attempts = pin!(retried(engine.as_ref(), &request));
    let granted = match deadline.and_then(|d| Some((d - started, d.checked_add(ANSWER_GRACE)?))) {
        None => attempts.await?,
        Some((wait, cut)) => match timeout_at(cut, attempts).await {
            Ok(result) => result?,
            Err(_) if report.held_seen() => return Err(timeout()),
            Err(_) => return Err(engine.unanswered(wait)),
        },
    };
    match granted {
        Some(grant) => Ok(Some((grant, report.held_seen()))),
        None => Err(timeout()),
    }
}

/// The checks every acquire makes before touching the server, in this order: the
/// options ([`LockOptions::validate_for`]); that the backend offers the claim's
/// primitive; a permit count within bounds; and a FIFO wait only where the
/// primitive's [`crate::Guarantees::fifo`] is supported.
///
/// # Errors
/// [`LockError::InvalidOptions`] and [`LockError::Unsupported`], naming `backend`.
pub(crate) fn check(
    backend: &'static str,
    capabilities: &Capabilities,
    claim: Claim<'_>,
    options: &LockOptions,
) -> Result<(), LockError> {
    options.validate_for(backend)?;
    let primitive = claim.primitive();
    let guarantees = capabilities.of(primitive);
    if let Capability::Unsupported(reason) = guarantees.offered {
        return Err(LockError::Unsupported {
            backend,
            operation: primitive.as_str(),
            reason,
        });
    }
    if let Claim::Permit { max } = claim {
        check_permits(max).map_err(|e| LockError::invalid_options(backend, e))?;
    }
    options.check_order(backend, guarantees.fifo)
}

/// Calls the engine until it answers, retrying retryable errors under the error
/// patience (see [`acquire`]).
async fn retried(engine: &dyn Engine, request: &Request<'_>) -> Result<Option<Grant>, LockError> {
    let patience = request.options.error_patience();
    let mut backoff = request.options.backoff().delays();
    let mut failing_since: Option<Instant> = None;
    loop {
        let error = match engine.acquire(request).await {
            Err(error) if error.is_retryable() => error,
            answer => return answer,
        };
        let since = *failing_since.get_or_insert_with(Instant::now);
        // A patience too large for the clock is no limit.
        let give_up = [since.checked_add(patience), request.deadline]
            .into_iter()
            .flatten()
            .min();
        let now = Instant::now();
        let mut nap = backoff.next_delay();
        if let Some(give_up) = give_up {
            if now >= give_up {
                return Err(error);
            }
            nap = nap.min(give_up - now);
        }
        tracing::debug!(%error, ?nap, "acquire failed on a retryable error; retrying");
        tokio::time::sleep(nap).await;
    }
}
