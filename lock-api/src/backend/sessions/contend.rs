//! [`contend`]: tries and waits for one grant, until it comes or the deadline passes.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::Request;
use crate::LockError;

/// Contends for `request`: `attempt` (a try), then, while the key is held and the
/// deadline allows, `wait` (a wait in the server's queue, or a nap: it is given the
/// next delay of the options' backoff, cut at the deadline, for a plan that polls) and
/// another `attempt`.
/// `None` once the key is still held at the deadline, at once for a try; each held
/// answer is noted in the request. Errors are returned as they come: the caller
/// retries them.
///
/// # Errors
/// The first error of `attempt` or `wait`.
pub async fn contend<G, A, AF, W, WF>(
    request: &Request<'_>,
    mut attempt: A,
    mut wait: W,
) -> Result<Option<G>, LockError>
where
    A: FnMut() -> AF,
    AF: Future<Output = Result<Option<G>, LockError>>,
    W: FnMut(Duration) -> WF,
    WF: Future<Output = Result<Option<G>, LockError>>,
{
    let mut polls = request.options.backoff().delays();
    loop {
        let granted = match attempt().await? {
            Some(grant) => Some(grant),
            None => {
                request.saw_held();
                if !request.waits() || request.deadline_passed() {
                    return Ok(None);
                }
                let mut nap = polls.next_delay();
                if let Some(d) = request.deadline {
                    nap = nap.min(d.saturating_duration_since(Instant::now()));
                }
                wait(nap).await?
            }
        };
        if granted.is_some() {
            return Ok(granted);
        }
        request.saw_held();
        if request.deadline_passed() {
            return Ok(None);
        }
        // The server's wait was capped below the deadline, or a poll's nap ended: try
        // again.
    }
}
