//! Every capability a backend claims, checked against behaviour on every primitive it
//! offers: FIFO waits, fencing tokens, extend, and the refusal of what it does not
//! offer. A claim and a behaviour that disagree fail here, whichever way.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use distlock_api::{
    BackendInfo, Candidate, Capability, DistributedLock, DistributedRwLock, DistributedSemaphore,
    ExtendOutcome, FencingToken, Guarantees, LeaderElection, Leadership, LockError, LockGuard,
    LockKey, LockOptions, Primitive, ReleaseOutcome, RwMode,
};

use super::fifo::fifo_with_ttl;
use super::{check, no_wait, unique_key, Failure, LONG_TTL};
use crate::{Client, Harness};

/// Waiters queued behind the holder in a FIFO check.
const FIFO_WAITERS: usize = 3;

/// One primitive of a client, taken the same way whichever it is: the mutex, a permit
/// of a one-permit semaphore, the write side of the read-write lock, or a leadership.
/// Each is exclusive, so one check serves all four.
#[derive(Clone)]
enum Taker {
    Mutex(Arc<dyn DistributedLock>),
    Permit(Arc<dyn DistributedSemaphore>),
    Write(Arc<dyn DistributedRwLock>),
    Lead(Arc<dyn LeaderElection>, Candidate),
}

/// What a [`Taker`] holds.
enum Taken {
    Guard(LockGuard),
    Leader(Leadership),
}

impl Taker {
    /// `client`'s handle on `primitive`.
    fn of(client: Client, primitive: Primitive) -> Result<Taker, Failure> {
        Ok(match primitive {
            Primitive::Mutex => Taker::Mutex(client.lock()),
            Primitive::Semaphore => Taker::Permit(client.semaphore()),
            Primitive::RwLock => Taker::Write(client.rw_lock()),
            Primitive::Election => {
                let candidate = Candidate::new("claims")
                    .map_err(|e| Failure::Failed(format!("candidate \"claims\": {e}")))?;
                Taker::Lead(client.election(), candidate)
            }
        })
    }

    fn info(&self) -> BackendInfo {
        match self {
            Taker::Mutex(lock) => lock.info(),
            Taker::Permit(semaphore) => semaphore.info(),
            Taker::Write(rw) => rw.info(),
            Taker::Lead(election, _) => election.info(),
        }
    }

    async fn acquire(&self, key: &LockKey, options: &LockOptions) -> Result<Taken, LockError> {
        Ok(match self {
            Taker::Mutex(lock) => Taken::Guard(lock.acquire(key, options).await?),
            Taker::Permit(semaphore) => Taken::Guard(semaphore.acquire(key, 1, options).await?),
            Taker::Write(rw) => Taken::Guard(rw.acquire(key, RwMode::Write, options).await?),
            Taker::Lead(election, me) => Taken::Leader(election.campaign(key, me, options).await?),
        })
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        options: &LockOptions,
    ) -> Result<Option<Taken>, LockError> {
        Ok(match self {
            Taker::Mutex(lock) => lock.try_acquire(key, options).await?.map(Taken::Guard),
            Taker::Permit(semaphore) => semaphore
                .try_acquire(key, 1, options)
                .await?
                .map(Taken::Guard),
            Taker::Write(rw) => rw
                .try_acquire(key, RwMode::Write, options)
                .await?
                .map(Taken::Guard),
            Taker::Lead(election, me) => election
                .try_campaign(key, me, options)
                .await?
                .map(Taken::Leader),
        })
    }
}

impl Taken {
    fn fencing_token(&self) -> Option<FencingToken> {
        match self {
            Taken::Guard(guard) => guard.fencing_token(),
            Taken::Leader(leader) => leader.guard().fencing_token(),
        }
    }

    async fn extend(&self, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        match self {
            Taken::Guard(guard) => guard.extend(ttl).await,
            Taken::Leader(leader) => leader.extend(ttl).await,
        }
    }

    async fn release(self) -> Result<ReleaseOutcome, LockError> {
        match self {
            Taken::Guard(guard) => guard.release().await,
            Taken::Leader(leader) => leader.resign().await,
        }
    }
}

/// Each primitive the harness's clients have a handle for and the backend offers (or,
/// with `offered` false, does not offer), with that handle's claims for it.
async fn primitives(
    h: &dyn Harness,
    offered: bool,
) -> Result<Vec<(Primitive, Taker, Guarantees)>, Failure> {
    let mut found = Vec::new();
    for primitive in Primitive::ALL {
        let taker = Taker::of(h.client().await?, primitive)?;
        let guarantees = *taker.info().capabilities.of(primitive);
        if guarantees.offered.is_supported() == offered {
            found.push((primitive, taker, guarantees));
        }
    }
    Ok(found)
}

/// A fresh taker of `primitive` on a new client of the harness.
async fn taker(h: &dyn Harness, primitive: Primitive) -> Result<Taker, Failure> {
    Taker::of(h.client().await?, primitive)
}

fn is_unsupported(result: &Result<impl Sized, LockError>) -> bool {
    matches!(result, Err(LockError::Unsupported { .. }))
}

pub(super) async fn every_primitive_keeps_its_fifo_claim(
    h: &dyn Harness,
) -> Result<String, Failure> {
    let mut seen = Vec::new();
    for (primitive, taker, guarantees) in primitives(h, true).await? {
        let name = primitive.as_str();
        let key = unique_key("claims-fifo");
        match guarantees.fifo {
            Capability::Unsupported(_) => {
                let fifo = fifo_with_ttl(LONG_TTL, h.slack());
                let waited = taker.acquire(&key, &fifo).await;
                check!(
                    is_unsupported(&waited),
                    "the {name} claims no FIFO, yet a FIFO acquire was not refused as Unsupported"
                );
                let tried = taker.try_acquire(&key, &fifo).await;
                check!(
                    is_unsupported(&tried),
                    "the {name} claims no FIFO, yet a FIFO try was not refused as Unsupported"
                );
                let free = taker.try_acquire(&key, &no_wait(LONG_TTL)).await?;
                check!(
                    free.is_some(),
                    "a refused FIFO request on the {name} left the key held"
                );
                if let Some(taken) = free {
                    taken.release().await?;
                }
                seen.push(format!("{name}: refused"));
            }
            Capability::Supported => {
                granted_in_arrival_order(h, primitive, &taker, &key).await?;
                seen.push(format!("{name}: {FIFO_WAITERS} waiters in order"));
            }
        }
    }
    Ok(seen.join("; "))
}

/// A holder, then [`FIFO_WAITERS`] clients asking for FIFO, each arriving well after
/// the last: after the release they are granted in arrival order.
async fn granted_in_arrival_order(
    h: &dyn Harness,
    primitive: Primitive,
    holder: &Taker,
    key: &LockKey,
) -> Result<(), Failure> {
    let name = primitive.as_str();
    let held = holder
        .acquire(key, &fifo_with_ttl(LONG_TTL, h.slack()))
        .await?;
    let spacing = (h.slack() / 2).max(Duration::from_millis(300));
    let granted = Arc::new(Mutex::new(Vec::with_capacity(FIFO_WAITERS)));
    let mut waiters = Vec::with_capacity(FIFO_WAITERS);
    for arrived in 0..FIFO_WAITERS {
        let taker = taker(h, primitive).await?;
        let options = fifo_with_ttl(LONG_TTL, h.slack() * 30);
        let (key, granted) = (key.clone(), granted.clone());
        waiters.push(tokio::spawn(async move {
            let taken = taker.acquire(&key, &options).await?;
            granted
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(arrived);
            // Hold a moment, so a waiter woken out of turn would find the key held.
            tokio::time::sleep(Duration::from_millis(20)).await;
            taken.release().await?;
            Ok::<_, LockError>(())
        }));
        tokio::time::sleep(spacing).await;
    }
    held.release().await?;
    for waiter in waiters {
        waiter
            .await
            .map_err(|e| Failure::Failed(format!("a {name} waiter panicked: {e}")))??;
    }
    let order = granted
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    check!(
        order == (0..FIFO_WAITERS).collect::<Vec<_>>(),
        "the {name} claims FIFO: waiters arrived {spacing:?} apart in order 0..{FIFO_WAITERS} but were granted in order {order:?}"
    );
    Ok(())
}

pub(super) async fn every_primitive_keeps_its_fencing_claim(
    h: &dyn Harness,
) -> Result<String, Failure> {
    let mut seen = Vec::new();
    for (primitive, first, guarantees) in primitives(h, true).await? {
        let name = primitive.as_str();
        let key = unique_key("claims-fencing");
        let mut tokens = Vec::new();
        for taker in [first, taker(h, primitive).await?] {
            let taken = taker.try_acquire(&key, &no_wait(LONG_TTL)).await?;
            let Some(taken) = taken else {
                return Err(Failure::Failed(format!(
                    "a free {name} key was refused after a release"
                )));
            };
            tokens.push(taken.fencing_token());
            taken.release().await?;
        }
        match guarantees.fencing {
            Capability::Supported => {
                let rising = matches!(tokens[..], [Some(a), Some(b)] if b > a);
                check!(
                    rising,
                    "the {name} claims fencing, yet two successive grants carried {tokens:?}"
                );
                seen.push(format!("{name}: rising tokens"));
            }
            Capability::Unsupported(_) => {
                check!(
                    tokens.iter().all(Option::is_none),
                    "the {name} claims no fencing, yet its grants carried {tokens:?}"
                );
                seen.push(format!("{name}: no tokens"));
            }
        }
    }
    Ok(seen.join("; "))
}

pub(super) async fn every_primitive_keeps_its_extend_claim(
    h: &dyn Harness,
) -> Result<String, Failure> {
    let mut seen = Vec::new();
    for (primitive, taker, guarantees) in primitives(h, true).await? {
        let name = primitive.as_str();
        let key = unique_key("claims-extend");
        let Some(taken) = taker.try_acquire(&key, &no_wait(LONG_TTL)).await? else {
            return Err(Failure::Failed(format!("a free {name} key was refused")));
        };
        let extended = taken.extend(LONG_TTL).await;
        taken.release().await?;
        match guarantees.extend {
            Capability::Supported => {
                check!(
                    matches!(extended, Ok(ExtendOutcome::Extended { .. })),
                    "the {name} claims extend, yet extending a held grant gave {extended:?}"
                );
                seen.push(format!("{name}: extended"));
            }
            Capability::Unsupported(_) => {
                check!(
                    is_unsupported(&extended),
                    "the {name} claims no extend, yet extending gave {extended:?}"
                );
                seen.push(format!("{name}: refused"));
            }
        }
    }
    Ok(seen.join("; "))
}

pub(super) async fn unoffered_primitives_are_refused(h: &dyn Harness) -> Result<String, Failure> {
    let mut seen = Vec::new();
    for (primitive, taker, _) in primitives(h, false).await? {
        let name = primitive.as_str();
        let key = unique_key("claims-offered");
        let waited = taker.acquire(&key, &no_wait(LONG_TTL)).await;
        let tried = taker.try_acquire(&key, &no_wait(LONG_TTL)).await;
        check!(
            is_unsupported(&waited) && is_unsupported(&tried),
            "the {name} is not offered, yet an acquire and a try were not both refused as Unsupported"
        );
        seen.push(format!("{name}: refused"));
    }
    if seen.is_empty() {
        return Err(Failure::Skipped(
            "the backend offers every primitive".to_owned(),
        ));
    }
    Ok(seen.join("; "))
}
