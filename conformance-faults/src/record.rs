//! [`Recorder`] (a lock client that logs every call) and [`FencedSet`] (a fenced
//! resource that logs every access in its own order).

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use distlock_api::{
    Candidate, DistributedLock, FencingToken, LeaderElection, Leadership, LockError, LockGuard,
    LockKey, LockOptions, ReleaseOutcome,
};

use super::harness::NetFaults;
use super::history::{Event, History, Op, Phase, Primitive};

/// Whether a failed call may still have taken effect.
fn phase_of(error: &LockError) -> Phase {
    match error {
        LockError::Timeout { .. }
        | LockError::NotHeld { .. }
        | LockError::InvalidKey { .. }
        | LockError::InvalidOptions { .. }
        | LockError::Unsupported { .. }
        | LockError::Config { .. } => Phase::Fail,
        _ => Phase::Unknown,
    }
}

/// One client's lock calls, each logged to a [`History`] as invoke then ok, fail or
/// unknown, with the lease's owner, token and claimed validity deadline.
#[derive(Clone)]
#[non_exhaustive]
pub struct Recorder {
    /// The client's number in the history.
    pub client: usize,
    /// The client's lock handle.
    pub lock: Arc<dyn DistributedLock>,
    /// Where calls are logged.
    pub history: History,
}

impl Recorder {
    /// A recorder for `lock` as client `client`.
    pub fn new(client: usize, lock: Arc<dyn DistributedLock>, history: History) -> Self {
        Recorder {
            client,
            lock,
            history,
        }
    }

    fn event(&self, key: &LockKey, op: Op, phase: Phase) -> Event {
        Event::new(self.client, key.as_str(), op, phase)
    }

    fn lease_event(&self, guard: &LockGuard, op: Op, phase: Phase) -> Event {
        self.event(guard.key(), op, phase)
            .owner(guard.lease().owner())
            .token(guard.fencing_token().map(FencingToken::get))
            .valid_until_us(self.history.micros(guard.valid_until()))
    }

    /// `acquire`, logged.
    ///
    /// # Errors
    /// Whatever `acquire` raised.
    pub async fn acquire(
        &self,
        key: &LockKey,
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        self.acquire_as(key, Primitive::Mutex, self.lock.acquire(key, options))
            .await
    }

    /// Any primitive's acquire of `key` (a semaphore permit, a read or write lock, from
    /// this client's handles), logged as a grant of `primitive` so that the exclusion
    /// checker applies that primitive's rule; release and loss are logged as for a
    /// mutex, with [`Recorder::release`] and [`Recorder::lost`].
    ///
    /// # Errors
    /// Whatever `acquiring` raised.
    pub async fn acquire_as(
        &self,
        key: &LockKey,
        primitive: Primitive,
        acquiring: impl Future<Output = Result<LockGuard, LockError>>,
    ) -> Result<LockGuard, LockError> {
        self.history
            .record(self.event(key, Op::Acquire, Phase::Invoke));
        match acquiring.await {
            Ok(guard) => {
                let mut granted = self
                    .lease_event(&guard, Op::Acquire, Phase::Ok)
                    .primitive(primitive);
                // The key asked for: what the caller believes it holds, whatever key
                // the backend put on the guard.
                granted.key = key.as_str().to_owned();
                self.history.record(granted);
                Ok(guard)
            }
            Err(e) => {
                self.history
                    .record(self.event(key, Op::Acquire, phase_of(&e)));
                Err(e)
            }
        }
    }

    /// `release`, logged; the invoke carries the deadline claimed until then.
    ///
    /// # Errors
    /// Whatever `release` raised.
    pub async fn release(&self, guard: LockGuard) -> Result<ReleaseOutcome, LockError> {
        self.history
            .record(self.lease_event(&guard, Op::Release, Phase::Invoke));
        let key = guard.key().clone();
        let owner = guard.lease().owner();
        match guard.release().await {
            Ok(outcome) => {
                self.history
                    .record(self.event(&key, Op::Release, Phase::Ok).owner(owner));
                Ok(outcome)
            }
            Err(e) => {
                self.history
                    .record(self.event(&key, Op::Release, phase_of(&e)).owner(owner));
                Err(e)
            }
        }
    }

    /// A campaign of `election` for `name`, logged as a mutex grant of `name` (a
    /// leadership is exclusive), so that the exclusion checker allows one leader at a
    /// time; the term is logged as the grant's token.
    ///
    /// # Errors
    /// Whatever the campaign raised.
    pub async fn campaign(
        &self,
        election: &dyn LeaderElection,
        name: &LockKey,
        candidate: &Candidate,
        options: &LockOptions,
    ) -> Result<Leadership, LockError> {
        self.history
            .record(self.event(name, Op::Acquire, Phase::Invoke));
        match election.campaign(name, candidate, options).await {
            Ok(leadership) => {
                let mut granted = self
                    .lease_event(leadership.guard(), Op::Acquire, Phase::Ok)
                    .primitive(Primitive::Mutex);
                granted.key = name.as_str().to_owned();
                self.history.record(granted);
                Ok(leadership)
            }
            Err(e) => {
                self.history
                    .record(self.event(name, Op::Acquire, phase_of(&e)));
                Err(e)
            }
        }
    }

    /// `resign`, logged as [`Recorder::release`] logs a release.
    ///
    /// # Errors
    /// Whatever `resign` raised.
    pub async fn resign(&self, leadership: Leadership) -> Result<ReleaseOutcome, LockError> {
        self.history
            .record(self.lease_event(leadership.guard(), Op::Release, Phase::Invoke));
        let name = leadership.name().clone();
        let owner = leadership.lease().owner();
        let outcome = leadership.resign().await;
        let phase = match &outcome {
            Ok(_) => Phase::Ok,
            Err(e) => phase_of(e),
        };
        self.history
            .record(self.event(&name, Op::Release, phase).owner(owner));
        outcome
    }

    /// Logs that the holder learned its lease is gone, with the deadline it had claimed.
    pub fn lost(&self, guard: &LockGuard) {
        self.history
            .record(self.lease_event(guard, Op::Lost, Phase::Ok));
    }
}

#[derive(Debug, Default)]
struct SetState {
    highest: Option<u64>,
    items: Vec<u64>,
}

/// A set behind fencing tokens, like a storage service that checks them: an access
/// with a token below the highest seen is refused; reads are fenced too, so a holder
/// that read under an old token cannot write back over a newer holder's work. Every
/// access is logged under the set's own lock, so the history has the set's order.
#[derive(Debug, Clone)]
pub struct FencedSet {
    key: String,
    state: Arc<Mutex<SetState>>,
    history: History,
}

impl FencedSet {
    /// An empty set called `key`, logging to `history`.
    pub fn new(key: impl Into<String>, history: History) -> Self {
        FencedSet {
            key: key.into(),
            state: Arc::default(),
            history,
        }
    }

    /// Whether an access with `token` may proceed. One without a token (a backend
    /// without fencing) cannot be checked, so it is admitted.
    fn admit(&self, state: &mut SetState, token: Option<FencingToken>) -> bool {
        let Some(token) = token.map(FencingToken::get) else {
            return true;
        };
        if state.highest.is_some_and(|h| token < h) {
            return false;
        }
        state.highest = Some(token);
        true
    }

    /// Reads the set with `token`; `None` when the token is stale. Without a token the
    /// read is unfenced.
    pub fn read(&self, client: usize, token: Option<FencingToken>) -> Option<Vec<u64>> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let ok = self.admit(&mut state, token);
        let phase = if ok { Phase::Ok } else { Phase::Fail };
        self.history.record(
            Event::new(client, &self.key, Op::Read, phase).token(token.map(FencingToken::get)),
        );
        ok.then(|| state.items.clone())
    }

    /// Writes `items` with `token`, as the holder's add of `added`; false when the token
    /// is stale (nothing changes). Without a token the write is unfenced.
    pub fn write(
        &self,
        client: usize,
        token: Option<FencingToken>,
        items: Vec<u64>,
        added: u64,
    ) -> bool {
        let raw = token.map(FencingToken::get);
        self.history.record(
            Event::new(client, &self.key, Op::Write, Phase::Invoke)
                .token(raw)
                .value(added),
        );
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let ok = self.admit(&mut state, token);
        if ok {
            state.items = items;
        }
        let phase = if ok { Phase::Ok } else { Phase::Fail };
        self.history.record(
            Event::new(client, &self.key, Op::Write, phase)
                .token(raw)
                .value(added),
        );
        ok
    }

    /// Read-modify-write: adds `value` under `token`; false if either step was refused.
    /// Without a token (a backend without fencing) neither step is fenced.
    pub fn add(&self, client: usize, token: Option<FencingToken>, value: u64) -> bool {
        let Some(mut items) = self.read(client, token) else {
            return false;
        };
        items.push(value);
        self.write(client, token, items, value)
    }

    /// The final contents, logged unfenced as the read the lost-update check uses.
    pub fn final_read(&self) -> Vec<u64> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        self.history.record(
            Event::new(usize::MAX, &self.key, Op::Read, Phase::Ok).seen(state.items.clone()),
        );
        state.items.clone()
    }
}

/// The holder-pause tool: the holder's process stalls (a GC pause, a stopped VM) while
/// `meanwhile` runs, then wakes up. Its lock calls and renewals simply do not happen
/// meanwhile (do not call it); if `net` is given, its connections are blackholed too, so
/// session heartbeats stop as well, and reset when it wakes (a long stall ends in
/// broken connections). The caller then writes with the stale guard and checks that
/// fencing refuses it.
pub async fn pause_holder<F: Future>(net: Option<&NetFaults>, meanwhile: F) -> F::Output {
    if let Some(net) = net {
        net.blackhole();
    }
    let out = meanwhile.await;
    if let Some(net) = net {
        net.heal_with_reset();
    }
    out
}
