//! [`LockGuard`]: a held lock, its lease state, renewal watchdog and release-on-drop.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument as _;

use crate::lease_backend::LeaseBackend;
use crate::{
    AutoRenew, ExtendOutcome, FencingToken, Lease, LeaseMonitor, LeaseState, LockError, LockKey,
    ReleaseOutcome,
};

/// A held lock.
///
/// Release it with [`LockGuard::release`] to learn the outcome. Dropping it instead
/// releases in the background, on the runtime that was current at acquire time; `Drop`
/// never blocks and never panics, and without a runtime the lease simply runs out. A
/// program that exits right after a drop awaits [`crate::settle_cleanups`] first, or
/// the runtime's shutdown may drop the release unsent.
#[must_use = "dropping the guard releases the lock at once"]
#[derive(Debug)]
pub struct LockGuard {
    lease: Lease,
    monitor: LeaseMonitor,
    backend: Arc<dyn LeaseBackend>,
    watchdog: Option<JoinHandle<()>>,
    runtime: Option<Handle>,
    released: bool,
    /// Whether the hold time (and loss) has been recorded; once per guard.
    observed: bool,
    /// Whether the acquire met the key held before it was granted.
    contended: bool,
}

impl LockGuard {
    /// See [`crate::backend::NewGuard::new`].
    pub(crate) fn from_grant(
        lease: Lease,
        monitor: LeaseMonitor,
        backend: Arc<dyn LeaseBackend>,
        auto_renew: Option<AutoRenew>,
    ) -> Self {
        let runtime = Handle::try_current().ok();
        let watchdog = match (&runtime, auto_renew) {
            (Some(rt), Some(policy)) => Some(rt.spawn(crate::renew::renew_until_stopped(
                backend.clone(),
                lease.clone(),
                monitor.clone(),
                policy,
            ))),
            _ => None,
        };
        LockGuard {
            lease,
            monitor,
            backend,
            watchdog,
            runtime,
            released: false,
            observed: false,
            contended: false,
        }
    }

    /// This guard, recording whether its acquire met the key held first.
    pub(crate) fn with_contended(mut self, contended: bool) -> Self {
        self.contended = contended;
        self
    }

    /// The name of the backend that granted it.
    pub(crate) fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// Whether the acquire that granted this guard found the key held by another owner
    /// first (and so waited for it), as the backend reported it. `false` for a
    /// `try_acquire` grant.
    pub fn contended(&self) -> bool {
        self.contended
    }

    /// The key held.
    pub fn key(&self) -> &LockKey {
        self.lease.key()
    }

    /// This grant's fencing token: above every earlier grant's for this key.
    ///
    /// `None` when the backend cannot promise ordered tokens (its
    /// [`Guarantees::fencing`](crate::Guarantees::fencing) is unsupported, as on
    /// Redlock); see [`Lease::fencing_token`] for what to do instead.
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.lease.fencing_token()
    }

    /// The lease details (owner token, TTL, grant time).
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Until when the lease is valid, on the monotonic clock. Conservative: measured
    /// from before the grant request was sent.
    pub fn valid_until(&self) -> Instant {
        self.monitor.valid_until()
    }

    /// Held, suspect or lost.
    pub fn state(&self) -> LeaseState {
        self.monitor.state()
    }

    /// Resolves when the lock is known lost or its validity passed without renewal.
    /// Does not borrow the guard, so it can race the critical section in a `select!`.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.monitor.lost()
    }

    /// A handle on the lease state, for code that outlives the borrow of the guard.
    pub fn monitor(&self) -> LeaseMonitor {
        self.monitor.clone()
    }

    /// Extends the lease to expire `ttl` from now: [`ExtendOutcome::Extended`] with the
    /// new deadline, or, as [`LockGuard::release`] does, an outcome saying the lease is
    /// not ours any more ([`ExtendOutcome::Expired`], [`ExtendOutcome::HeldByOther`];
    /// the guard is then lost).
    ///
    /// A lease already lost (its validity deadline passed) is not extended, even if the
    /// server still has it: lost is final, and the outcome is [`ExtendOutcome::Lost`].
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] for a TTL out of bounds, [`LockError::Unsupported`]
    /// on backends without extend, and connection and backend errors.
    pub async fn extend(&self, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        let backend = self.backend.name();
        let span = tracing::debug_span!("extend", backend, key = %self.key(), ttl = ?ttl);
        let outcome = self.extend_inner(ttl).instrument(span).await;
        crate::metrics::renewal(
            backend,
            matches!(outcome, Ok(ExtendOutcome::Extended { .. })),
        );
        outcome
    }

    async fn extend_inner(&self, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        let _turn = self.monitor.renewal_turn().await;
        // Lost is final: reviving the server's key now would leave a lock nobody holds.
        if self.monitor.state() == LeaseState::Lost {
            return Ok(ExtendOutcome::Lost);
        }
        let outcome = self.backend.extend(&self.lease, ttl).await?;
        match outcome {
            ExtendOutcome::Extended { valid_until } => {
                if !self.monitor.apply_renewal(valid_until) {
                    // The deadline passed while the extend was in flight.
                    self.monitor.set_lost();
                    let _ = self.backend.release(&self.lease).await;
                    return Ok(ExtendOutcome::Lost);
                }
            }
            ExtendOutcome::Expired | ExtendOutcome::HeldByOther | ExtendOutcome::Lost => {
                self.monitor.set_lost();
            }
        }
        Ok(outcome)
    }

    /// Stops renewal, then releases the lock (owner-checked).
    ///
    /// # Errors
    /// Connection and backend errors; the lease then runs out on its own.
    pub async fn release(mut self) -> Result<ReleaseOutcome, LockError> {
        self.stop_watchdog();
        self.record_end();
        let span =
            tracing::debug_span!("release", backend = self.backend.name(), key = %self.key());
        let release = self.backend.release(&self.lease);
        let outcome = match span.is_disabled() {
            true => release.await,
            false => release.instrument(span).await,
        };
        // Only now: if this future is dropped mid-release, `Drop` releases instead.
        self.released = true;
        outcome
    }

    /// Lets the lease run out on its own instead of releasing it: renewal stops, and
    /// the key stays held until the lease's TTL (from its last grant or extend)
    /// passes. For a mark that must outlive the work, such as a scheduled firing's
    /// "done" mark; on a backend without TTL expiry
    /// ([`Guarantees::ttl_expiry`](crate::Guarantees::ttl_expiry)) the key stays held
    /// until the client's session or process ends.
    pub fn let_expire(mut self) {
        self.stop_watchdog();
        self.record_end();
        self.released = true;
    }

    /// Records the hold time, and the loss if the lease was lost; once.
    fn record_end(&mut self) {
        if !self.observed {
            self.observed = true;
            crate::metrics::guard_ended(
                self.backend.name(),
                self.key(),
                self.lease.acquired_at().elapsed(),
                self.monitor.state() == LeaseState::Lost,
            );
        }
    }

    fn stop_watchdog(&mut self) {
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.abort();
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.stop_watchdog();
        if self.released {
            return;
        }
        self.record_end();
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        let backend = self.backend.clone();
        let lease = self.lease.clone();
        // Spawning on a runtime that has shut down drops the task; it does not panic.
        // Counted, so that a program exiting right after can let it finish.
        let span = tracing::debug_span!("release", backend = backend.name(), key = %lease.key(), on_drop = true);
        crate::cleanup::spawn_cleanup(&runtime, async move {
            if let Err(error) = backend.release(&lease).instrument(span).await {
                tracing::warn!(key = %lease.key(), %error, "release on drop failed; the lease will run out");
            }
        });
    }
}
