//! For backend authors: what implementing [`DistributedLock`](crate::DistributedLock)
//! takes beyond the user's API (applications need none of it).
//!
//! - [`bounded_wait`] runs a waiting acquire's attempts until the wait's deadline plus
//!   a grace for an answer on its way, then fails the way every backend does: with
//!   [`LockError::Timeout`] if an answer showed the key held, else with the backend's
//!   connection error, since nobody said who holds it. It also marks the guard when the
//!   acquire met a held key ([`LockGuard::contended`]), which is what
//!   [`crate::observe::Observed`] counts as contention.
//! - [`WaitReport`] is what the attempts tell it.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::{timeout_at, Instant};

use crate::{LockError, LockGuard, LockKey, LockOptions};

/// The bounds of one waiting acquire: when it started, when its wait ends, and how long
/// past that an answer on its way is still awaited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct WaitBound {
    /// When the acquire started.
    pub started: Instant,
    /// When the wait ends; `None` waits forever, `Some(started)` does not wait.
    pub deadline: Option<Instant>,
    /// How long past the deadline an answer on its way is still awaited.
    pub grace: Duration,
}

impl WaitBound {
    /// The bound of an acquire starting now with `options`' wait policy.
    pub fn starting_now(options: &LockOptions, grace: Duration) -> Self {
        let started = Instant::now();
        WaitBound {
            started,
            deadline: options.wait().deadline_from(started),
            grace,
        }
    }
}

/// Marks `guard` as granted after its acquire met the key held (or not): what
/// [`LockGuard::contended`] reports. [`bounded_wait`] does this itself.
pub fn mark_contended(guard: LockGuard, contended: bool) -> LockGuard {
    guard.with_contended(contended)
}

/// What the attempts of one acquire learned, shared with [`bounded_wait`].
#[derive(Debug, Default)]
pub struct WaitReport {
    held_seen: AtomicBool,
}

impl WaitReport {
    /// A report of nothing seen yet.
    pub fn new() -> Self {
        WaitReport::default()
    }

    /// Notes an answer saying another owner holds the key.
    pub fn saw_held(&self) {
        self.held_seen.store(true, Ordering::Relaxed);
    }

    /// Whether any answer said another owner holds the key.
    pub fn held_seen(&self) -> bool {
        self.held_seen.load(Ordering::Relaxed)
    }
}

/// Runs `attempts` (the backend's acquire loop, which notes in `report` each answer
/// saying the key is held) within `bound`.
///
/// A deadline after the start bounds the whole call, whatever the server does: once
/// the deadline plus the grace passes, `attempts` is dropped (so its drop guards must undo a
/// grant that lands later) and the call fails with [`LockError::Timeout`] naming
/// `backend` and `key` if `report` saw the key held, else with `no_answer(wait)`, the
/// backend's connection error saying the server did not answer within the wait. With
/// no deadline, or one at `started` (no wait), `attempts` bounds itself.
///
/// A guard granted after `report` saw the key held is marked
/// [contended](LockGuard::contended).
///
/// # Errors
/// Whatever `attempts` returns, or the two above when the deadline passes first.
pub async fn bounded_wait<F>(
    backend: &'static str,
    key: &LockKey,
    bound: WaitBound,
    report: &WaitReport,
    attempts: F,
    no_answer: impl FnOnce(Duration) -> LockError,
) -> Result<LockGuard, LockError>
where
    F: Future<Output = Result<LockGuard, LockError>>,
{
    let WaitBound {
        started,
        deadline,
        grace,
    } = bound;
    let cut = deadline
        .filter(|d| *d > started)
        .and_then(|d| Some((d - started, d.checked_add(grace)?)));
    let result = match cut {
        None => attempts.await,
        Some((wait, cut)) => match timeout_at(cut, attempts).await {
            Ok(result) => result,
            Err(_) if report.held_seen() => Err(LockError::Timeout {
                backend,
                key: key.clone(),
                waited: started.elapsed(),
            }),
            Err(_) => Err(no_answer(wait)),
        },
    };
    result.map(|guard| guard.with_contended(report.held_seen()))
}
