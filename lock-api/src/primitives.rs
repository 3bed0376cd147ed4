//! The four public primitives, implemented once over any [`Engine`]: the handles
//! [`crate::Client`] hands out.
//!
//! Every check, the wait rule, the error patience, guard and leadership wrapping, and
//! the acquire metrics and spans live here (and in [`acquire`]), so no backend can
//! drift from them.

mod acquire;

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tracing::Instrument as _;

use crate::engine::{Claim, Engine, Grant};
use crate::lease_backend::LeaseBackend;
use crate::{
    check_ttl, BackendInfo, Candidate, DistributedLock, DistributedRwLock, DistributedSemaphore,
    ExtendOutcome, FencingToken, KeyStatus, Leader, LeaderElection, Leadership, Lease, LockError,
    LockGuard, LockKey, LockOptions, Primitive, ReleaseOutcome, RwMode, RwStatus, SemaphoreStatus,
};

/// An engine with the primitive its grants belong to: what a guard releases and
/// extends through, and what each handle wraps.
#[derive(Debug)]
pub(crate) struct Route {
    engine: Arc<dyn Engine>,
    primitive: Primitive,
    name: &'static str,
}

impl Route {
    pub(crate) fn new(engine: Arc<dyn Engine>, primitive: Primitive) -> Self {
        let name = engine.info().name;
        Route {
            engine,
            primitive,
            name,
        }
    }

    fn info(&self) -> BackendInfo {
        self.engine.info()
    }

    /// Takes `claim` on `key`, once (`waits == false`) or as the options' wait allows,
    /// and wraps the grant as a guard. `None` only for a try that found the key held.
    async fn acquire(
        self: &Arc<Self>,
        key: &LockKey,
        claim: Claim<'_>,
        options: &LockOptions,
        waits: bool,
    ) -> Result<Option<LockGuard>, LockError> {
        let span = tracing::debug_span!(
            "acquire",
            backend = self.name,
            primitive = self.primitive.as_str(),
            key = %key,
            wait = ?(if waits { options.wait() } else { crate::WaitPolicy::NoWait }),
        );
        // Pinned in place, and instrumented only when the span is recorded: either way
        // the large acquire future is not moved (this is every acquire's hot path).
        let acquire = pin!(acquire::observed(
            &self.engine,
            self.name,
            key,
            claim,
            options,
            waits
        ));
        let granted = match span.is_disabled() {
            true => acquire.await,
            false => acquire.instrument(span).await,
        }?;
        Ok(granted.map(|(grant, contended)| self.guard(grant, options, contended)))
    }

    fn guard(self: &Arc<Self>, grant: Grant, options: &LockOptions, contended: bool) -> LockGuard {
        let Grant { lease, monitor } = grant;
        // The handle's own route, shared: a guard costs no allocation of its own here.
        let route: Arc<dyn LeaseBackend> = self.clone();
        LockGuard::from_grant(lease, monitor, route, options.auto_renew()).with_contended(contended)
    }

    /// A won campaign as a [`Leadership`].
    ///
    /// # Errors
    /// [`LockError::Backend`] when the engine granted a lease without a term; the
    /// grant is then released in the background.
    fn leadership(guard: LockGuard, candidate: &Candidate) -> Result<Leadership, LockError> {
        let Some(term) = guard.fencing_token() else {
            let backend = guard.backend_name();
            drop(guard);
            return Err(LockError::backend_error(
                backend,
                "a leadership was granted without a term",
            ));
        };
        Ok(Leadership::from_guard(guard, candidate.clone(), term))
    }
}

#[async_trait]
impl LeaseBackend for Route {
    fn name(&self) -> &'static str {
        self.name
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.engine.release(self.primitive, lease).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        check_ttl(ttl).map_err(|e| LockError::invalid_options(self.name, e))?;
        if let crate::Capability::Unsupported(reason) =
            self.info().capabilities.of(self.primitive).extend
        {
            return Err(LockError::Unsupported {
                backend: self.name,
                operation: "extend",
                reason,
            });
        }
        self.engine.extend(self.primitive, lease, ttl).await
    }
}

/// The mutex of an engine.
#[derive(Debug)]
pub(crate) struct MutexHandle(pub(crate) Arc<Route>);

#[async_trait]
impl DistributedLock for MutexHandle {
    fn info(&self) -> BackendInfo {
        self.0.info()
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        self.0.acquire(key, Claim::Mutex, options, false).await
    }

    async fn acquire(&self, key: &LockKey, options: &LockOptions) -> Result<LockGuard, LockError> {
        waited(self.0.acquire(key, Claim::Mutex, options, true).await)
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        LeaseBackend::release(&*self.0, lease).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        LeaseBackend::extend(&*self.0, lease, ttl).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<KeyStatus, LockError> {
        self.0.engine.inspect(key).await
    }
}

/// The semaphore of an engine.
#[derive(Debug)]
pub(crate) struct SemaphoreHandle(pub(crate) Arc<Route>);

#[async_trait]
impl DistributedSemaphore for SemaphoreHandle {
    fn info(&self) -> BackendInfo {
        self.0.info()
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        max_permits: u32,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        let claim = Claim::Permit { max: max_permits };
        self.0.acquire(key, claim, options, false).await
    }

    async fn acquire(
        &self,
        key: &LockKey,
        max_permits: u32,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        let claim = Claim::Permit { max: max_permits };
        waited(self.0.acquire(key, claim, options, true).await)
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        LeaseBackend::release(&*self.0, lease).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        LeaseBackend::extend(&*self.0, lease, ttl).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<SemaphoreStatus, LockError> {
        self.0.engine.inspect_semaphore(key).await
    }
}

/// The read-write lock of an engine.
#[derive(Debug)]
pub(crate) struct RwHandle(pub(crate) Arc<Route>);

#[async_trait]
impl DistributedRwLock for RwHandle {
    fn info(&self) -> BackendInfo {
        self.0.info()
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        mode: RwMode,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        self.0.acquire(key, Claim::Rw(mode), options, false).await
    }

    async fn acquire(
        &self,
        key: &LockKey,
        mode: RwMode,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        waited(self.0.acquire(key, Claim::Rw(mode), options, true).await)
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        LeaseBackend::release(&*self.0, lease).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        LeaseBackend::extend(&*self.0, lease, ttl).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<RwStatus, LockError> {
        self.0.engine.inspect_rw(key).await
    }
}

/// Leader election over an engine.
#[derive(Debug)]
pub(crate) struct ElectionHandle(pub(crate) Arc<Route>);

#[async_trait]
impl LeaderElection for ElectionHandle {
    fn info(&self) -> BackendInfo {
        self.0.info()
    }

    async fn try_campaign(
        &self,
        name: &LockKey,
        candidate: &Candidate,
        options: &LockOptions,
    ) -> Result<Option<Leadership>, LockError> {
        let claim = Claim::Lead(candidate);
        match self.0.acquire(name, claim, options, false).await? {
            Some(guard) => Route::leadership(guard, candidate).map(Some),
            None => Ok(None),
        }
    }

    async fn campaign(
        &self,
        name: &LockKey,
        candidate: &Candidate,
        options: &LockOptions,
    ) -> Result<Leadership, LockError> {
        let claim = Claim::Lead(candidate);
        let guard = waited(self.0.acquire(name, claim, options, true).await)?;
        Route::leadership(guard, candidate)
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        LeaseBackend::release(&*self.0, lease).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        LeaseBackend::extend(&*self.0, lease, ttl).await
    }

    async fn leader(&self, name: &LockKey) -> Result<Option<Leader>, LockError> {
        self.0.engine.leader(name).await
    }

    async fn wait_change(
        &self,
        name: &LockKey,
        seen: Option<FencingToken>,
        patience: Duration,
    ) -> Result<Option<Leader>, LockError> {
        self.0.engine.wait_change(name, seen, patience).await
    }
}

/// A waiting acquire's guard: [`Route::acquire`] with `waits` answers `None` only for
/// a try, and a waiting acquire whose wait ran out is a [`LockError::Timeout`] there.
fn waited(granted: Result<Option<LockGuard>, LockError>) -> Result<LockGuard, LockError> {
    granted?.ok_or_else(|| {
        LockError::backend_error(
            crate::API_BACKEND_NAME,
            "a waiting acquire ended without a grant or an error",
        )
    })
}
