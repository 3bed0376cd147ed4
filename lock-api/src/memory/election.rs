//! [`MemoryElection`]: the in-memory [`LeaderElection`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::shared::{self, Kind, Want};
use super::{MemoryLock, MEMORY_BACKEND, NOT_FIFO};
use crate::backend::check_campaign_request;
use crate::{
    check_ttl, BackendInfo, Candidate, Capability, DistributedLock, ExtendOutcome, FencingToken,
    Leader, LeaderElection, Leadership, Lease, LockError, LockKey, LockOptions, ReleaseOutcome,
};

/// An election client of a [`super::MemoryStore`], made by [`MemoryLock::election`].
///
/// Campaigns wait woken by resignations, or at the leader's expiry; observers
/// ([`LeaderElection::wait_change`]) are woken by every new leadership and
/// resignation, and at the leader's expiry; no polling. Terms come from the store's
/// fencing counter. Cloning gives another handle on the same client.
#[derive(Debug, Clone)]
pub struct MemoryElection {
    client: MemoryLock,
}

impl MemoryElection {
    /// An election client of a fresh, private store.
    pub fn new() -> Self {
        MemoryLock::new().election()
    }

    pub(super) fn from_client(client: MemoryLock) -> Self {
        MemoryElection { client }
    }

    /// The mutex client sharing this one's store and crash state.
    pub fn client(&self) -> &MemoryLock {
        &self.client
    }

    fn attempt(
        &self,
        name: &LockKey,
        candidate: &Candidate,
        options: &LockOptions,
    ) -> Result<Result<Leadership, Option<Instant>>, LockError> {
        let want = Want::Lead(candidate.clone());
        match shared::attempt(&self.client, Kind::Election, name, want, options)? {
            Err(expiry) => Ok(Err(expiry)),
            Ok(lease) => {
                let monitor = shared::monitor(&lease);
                let backend: Arc<dyn LeaderElection> = Arc::new(self.clone());
                crate::backend::leadership(
                    lease,
                    monitor,
                    backend,
                    options.auto_renew(),
                    candidate.clone(),
                )
                .map(Ok)
            }
        }
    }
}

impl Default for MemoryElection {
    fn default() -> Self {
        MemoryElection::new()
    }
}

#[async_trait]
impl LeaderElection for MemoryElection {
    fn info(&self) -> BackendInfo {
        self.client.info()
    }

    async fn try_campaign(
        &self,
        name: &LockKey,
        candidate: &Candidate,
        options: &LockOptions,
    ) -> Result<Option<Leadership>, LockError> {
        check_campaign_request(MEMORY_BACKEND, options, Capability::Unsupported(NOT_FIFO))?;
        Ok(self.attempt(name, candidate, options)?.ok())
    }

    async fn campaign(
        &self,
        name: &LockKey,
        candidate: &Candidate,
        options: &LockOptions,
    ) -> Result<Leadership, LockError> {
        check_campaign_request(MEMORY_BACKEND, options, Capability::Unsupported(NOT_FIFO))?;
        let wake = self.client.store.shared.wake_handle(Kind::Election, name);
        let (won, met_leader) = super::wait_woken(wake, name, options, MEMORY_BACKEND, || {
            self.attempt(name, candidate, options)
        })
        .await?;
        Ok(won.with_contended(met_leader))
    }

    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError> {
        self.client.check_alive()?;
        let table = &self.client.store.shared;
        Ok(table.release(Kind::Election, lease.key(), lease.owner()))
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        check_ttl(ttl).map_err(|e| LockError::invalid_options(MEMORY_BACKEND, e))?;
        self.client.check_alive()?;
        let table = &self.client.store.shared;
        Ok(table.extend(
            Kind::Election,
            lease.key(),
            lease.owner(),
            ttl,
            Instant::now(),
        ))
    }

    async fn leader(&self, name: &LockKey) -> Result<Option<Leader>, LockError> {
        self.client.check_alive()?;
        Ok(self.client.store.shared.leader(name))
    }

    async fn wait_change(
        &self,
        name: &LockKey,
        seen: Option<FencingToken>,
        patience: Duration,
    ) -> Result<Option<Leader>, LockError> {
        let deadline = Instant::now() + patience;
        let wake = self.client.store.shared.wake_handle(Kind::Election, name);
        loop {
            let woken = wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let now = self.leader(name).await?;
            if now.as_ref().map(|l| l.term) != seen || Instant::now() >= deadline {
                return Ok(now);
            }
            // A leader's lease running out wakes nobody: look again at its expiry.
            let expiry = now
                .and_then(|l| l.remaining)
                .map(|left| Instant::now() + left);
            let at = expiry.map_or(deadline, |e| e.min(deadline));
            tokio::select! {
                _ = &mut woken => {}
                _ = tokio::time::sleep_until(at) => {}
            }
        }
    }
}
