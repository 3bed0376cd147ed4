//! Several keys taken all or nothing: [`MultiGuard`], and the canonical order, shared
//! deadline and clean-up behind every primitive trait's `acquire_all` and
//! `try_acquire_all`.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use crate::{
    ExtendOutcome, FencingToken, LeaseState, LockError, LockGuard, LockKey, LockOptions,
    OptionsError, ReleaseOutcome, WaitPolicy,
};

/// Grants of several keys, taken all or nothing in one canonical order (the keys
/// sorted, duplicates once), so that two callers whose sets overlap never deadlock.
///
/// Each part is a [`LockGuard`] with its own lease and fencing token
/// ([`MultiGuard::fencing_token`]). The set is as valid as its weakest part: its
/// validity is the earliest part's, and [`MultiGuard::lost`] fires when any part is
/// lost. [`MultiGuard::release`] releases every part; dropping the guard releases
/// every part in the background, as a dropped [`LockGuard`] does.
#[must_use = "dropping the guard releases every key at once"]
#[derive(Debug)]
pub struct MultiGuard {
    /// In canonical order.
    parts: Vec<LockGuard>,
}

impl MultiGuard {
    /// The parts, one per key, in canonical (sorted) key order.
    pub fn parts(&self) -> &[LockGuard] {
        &self.parts
    }

    /// The keys held, in canonical order.
    pub fn keys(&self) -> impl Iterator<Item = &LockKey> {
        self.parts.iter().map(LockGuard::key)
    }

    /// The part holding `key`, if it is one of the set.
    pub fn get(&self, key: &LockKey) -> Option<&LockGuard> {
        self.parts.iter().find(|part| part.key() == key)
    }

    /// The fencing token of `key`'s part: `None` when `key` is not in the set or its
    /// backend hands out no tokens. Send each with the writes to the resource its key
    /// protects.
    pub fn fencing_token(&self, key: &LockKey) -> Option<FencingToken> {
        self.get(key).and_then(LockGuard::fencing_token)
    }

    /// Until when every part is valid: the earliest part's deadline.
    pub fn valid_until(&self) -> Instant {
        self.parts
            .iter()
            .map(LockGuard::valid_until)
            .min()
            .unwrap_or_else(Instant::now)
    }

    /// The weakest part's state: lost if any part is, suspect if any part is, else
    /// held.
    pub fn state(&self) -> LeaseState {
        let states = self.parts.iter().map(LockGuard::state);
        states.fold(LeaseState::Held, |worst, state| match (worst, state) {
            (LeaseState::Lost, _) | (_, LeaseState::Lost) => LeaseState::Lost,
            (LeaseState::Suspect, _) | (_, LeaseState::Suspect) => LeaseState::Suspect,
            _ => LeaseState::Held,
        })
    }

    /// Resolves when any part is lost (or its validity passed without renewal): stop
    /// the work the set protects then. Does not borrow the guard.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut parts: Vec<Pin<Box<dyn Future<Output = ()> + Send>>> = self
            .parts
            .iter()
            .map(|part| Box::pin(part.lost()) as Pin<Box<dyn Future<Output = ()> + Send>>)
            .collect();
        std::future::poll_fn(move |cx| {
            if parts
                .iter_mut()
                .any(|part| part.as_mut().poll(cx).is_ready())
            {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
    }

    /// Extends every part to expire `ttl` from now, as [`LockGuard::extend`] does, and
    /// returns each part's outcome in canonical order. Every part is tried, even after
    /// one fails.
    ///
    /// # Errors
    /// The first part's error, after every part was tried.
    pub async fn extend(&self, ttl: Duration) -> Result<Vec<ExtendOutcome>, LockError> {
        let mut outcomes = Vec::with_capacity(self.parts.len());
        let mut first_error = None;
        for part in &self.parts {
            match part.extend(ttl).await {
                Ok(outcome) => outcomes.push(outcome),
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        first_error.map_or(Ok(outcomes), Err)
    }

    /// Lets every part's lease run out on its own instead of releasing it, as
    /// [`LockGuard::let_expire`] does.
    pub fn let_expire(self) {
        self.parts.into_iter().for_each(LockGuard::let_expire);
    }

    /// Releases every part (owner-checked) and returns each outcome in canonical
    /// order. Every part is released, even after one fails.
    ///
    /// # Errors
    /// The first part's connection or backend error, after every part was tried; the
    /// parts not released then run out on their own.
    pub async fn release(self) -> Result<Vec<ReleaseOutcome>, LockError> {
        release_all(self.parts).await
    }
}

/// [`crate::DistributedLock::acquire_all`]'s default: every key of `keys` through
/// `lock`, in canonical order under one deadline, all or nothing. Public in
/// [`crate::backend`] for implementors that override `acquire_all` (a test double
/// making a mistake on purpose, say) and still need the right behaviour otherwise.
///
/// # Errors
/// Those of [`crate::DistributedLock::acquire_all`].
pub async fn acquire_all<L: crate::DistributedLock + ?Sized>(
    lock: &L,
    keys: &[LockKey],
    options: &LockOptions,
) -> Result<MultiGuard, LockError> {
    let mut taking = Taking::new(lock.info().name, keys, options, true)?;
    for key in taking.keys() {
        match lock.acquire(&key, &taking.next_options()).await {
            Ok(part) => taking.took(part),
            Err(error) => return Err(taking.abandon(error).await),
        }
    }
    Ok(taking.done())
}

/// A set of parts taken by hand, in the order given: for implementors that override
/// `acquire_all` (see [`acquire_all`]). The parts' keys should be distinct.
pub fn multi_guard(parts: Vec<LockGuard>) -> MultiGuard {
    MultiGuard { parts }
}

/// Releases `parts`, every one, and returns the outcomes or the first error.
async fn release_all(parts: Vec<LockGuard>) -> Result<Vec<ReleaseOutcome>, LockError> {
    let mut outcomes = Vec::with_capacity(parts.len());
    let mut first_error = None;
    for part in parts {
        match part.release().await {
            Ok(outcome) => outcomes.push(outcome),
            Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    first_error.map_or(Ok(outcomes), Err)
}

/// One all-or-nothing acquire: the keys in canonical order, the one deadline they
/// share, and the parts taken so far.
pub(crate) struct Taking {
    keys: Vec<LockKey>,
    options: LockOptions,
    started: Instant,
    deadline: Option<Instant>,
    taken: Vec<LockGuard>,
}

impl Taking {
    /// The plan for `keys` (sorted, duplicates once) under `options`; `waits` is false
    /// for a try.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] naming `backend` for an empty set, or for options
    /// [`LockOptions::validate`] refuses (checked once here, before any key is taken).
    pub(crate) fn new(
        backend: &'static str,
        keys: &[LockKey],
        options: &LockOptions,
        waits: bool,
    ) -> Result<Self, LockError> {
        if keys.is_empty() {
            return Err(LockError::invalid_options(backend, OptionsError::NoKeys));
        }
        options.validate_for(backend)?;
        let mut keys = keys.to_vec();
        keys.sort();
        keys.dedup();
        let started = Instant::now();
        let deadline = match waits {
            true => options.wait().deadline_from(started),
            false => Some(started),
        };
        Ok(Taking {
            taken: Vec::with_capacity(keys.len()),
            keys,
            options: options.clone(),
            started,
            deadline,
        })
    }

    /// The keys, in the order they must be taken.
    pub(crate) fn keys(&self) -> Vec<LockKey> {
        self.keys.clone()
    }

    /// The options for the next part: the caller's, waiting only what is left of the
    /// shared deadline.
    pub(crate) fn next_options(&self) -> LockOptions {
        let wait = match self.deadline {
            None => WaitPolicy::Forever,
            Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => WaitPolicy::Timeout(left),
                _ => WaitPolicy::NoWait,
            },
        };
        self.options.clone().with_wait(wait)
    }

    /// Records a part taken.
    pub(crate) fn took(&mut self, part: LockGuard) {
        self.taken.push(part);
    }

    /// Every part taken: the set.
    pub(crate) fn done(self) -> MultiGuard {
        MultiGuard { parts: self.taken }
    }

    /// Gives up: releases every part taken so far, then returns `error` (a timeout of
    /// one part is reported as the whole set's wait).
    pub(crate) async fn abandon(self, error: LockError) -> LockError {
        let waited = self.started.elapsed();
        if let Err(release) = release_all(self.taken).await {
            tracing::warn!(%release, "releasing a partly taken set failed; the leases will run out");
        }
        match error {
            LockError::Timeout { backend, key, .. } => LockError::Timeout {
                backend,
                key,
                waited,
            },
            other => other,
        }
    }

    /// Gives up a try that found a key held: releases every part taken so far.
    pub(crate) async fn refused(self) {
        if let Err(release) = release_all(self.taken).await {
            tracing::warn!(%release, "releasing a partly taken set failed; the leases will run out");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{DistributedLock, MemoryLock};

    fn keys(names: &[&str]) -> Vec<LockKey> {
        names.iter().map(|n| LockKey::new(*n).unwrap()).collect()
    }

    fn waiting(wait: Duration) -> LockOptions {
        LockOptions::new(Duration::from_secs(30)).with_wait(WaitPolicy::Timeout(wait))
    }

    /// Two clients taking overlapping sets named in opposite orders, many times at
    /// once: the canonical order means neither ever waits out its deadline.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn overlapping_sets_in_opposite_orders_never_deadlock() {
        let memory = MemoryLock::new();
        let (a, b) = (memory.lock(), memory.new_client().lock());
        let forward = keys(&["m/a", "m/b", "m/c"]);
        let backward: Vec<_> = forward.iter().rev().cloned().collect();
        let run = |lock: Arc<dyn DistributedLock>, set: Vec<LockKey>| {
            tokio::spawn(async move {
                for _ in 0..50 {
                    let held = lock
                        .acquire_all(&set, &waiting(Duration::from_secs(10)))
                        .await?;
                    tokio::task::yield_now().await;
                    held.release().await?;
                }
                Ok::<_, LockError>(())
            })
        };
        let (x, y) = (run(a, forward), run(b, backward));
        x.await.unwrap().expect("no deadlock");
        y.await.unwrap().expect("no deadlock");
    }

    #[tokio::test]
    async fn a_timeout_part_way_leaves_nothing_held() {
        let memory = MemoryLock::new();
        let (locks, other) = (memory.lock(), memory.new_client().lock());
        let set = keys(&["t/1", "t/2", "t/3"]);
        let blocker = other
            .acquire(&set[1], &waiting(Duration::ZERO))
            .await
            .unwrap();
        let err = locks
            .acquire_all(&set, &waiting(Duration::from_millis(100)))
            .await
            .expect_err("t/2 is held");
        assert!(matches!(err, LockError::Timeout { .. }), "{err}");
        assert!(memory.store().get(&set[0]).is_none(), "t/1 was left held");
        assert!(memory.store().get(&set[2]).is_none());
        let tried = locks.try_acquire_all(&set, &waiting(Duration::ZERO)).await;
        assert!(tried.unwrap().is_none());
        assert!(
            memory.store().get(&set[0]).is_none(),
            "a refused try left t/1"
        );
        blocker.release().await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_part_fires_lost_and_tokens_are_per_key() {
        let locks = MemoryLock::new().lock();
        let set = keys(&["l/b", "l/a", "l/b"]);
        let short = LockOptions::new(Duration::from_secs(1));
        let held = locks.acquire_all(&set, &short).await.unwrap();
        let names: Vec<_> = held.keys().map(LockKey::as_str).collect();
        assert_eq!(names, ["l/a", "l/b"], "sorted, duplicates once");
        let (a, b) = (&set[1], &set[0]);
        assert!(held.fencing_token(a).is_some());
        assert_ne!(held.fencing_token(a), held.fencing_token(b));
        // Only l/a is kept alive: l/b runs out, and the set is lost with it.
        let kept = held.get(a).unwrap();
        let start = Instant::now();
        let lost = tokio::spawn(held.lost());
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(matches!(
            kept.extend(Duration::from_secs(60)).await,
            Ok(ExtendOutcome::Extended { .. })
        ));
        lost.await.unwrap();
        assert!(start.elapsed() >= Duration::from_millis(999));
        assert_eq!(held.state(), LeaseState::Lost);
        assert_eq!(held.get(a).unwrap().state(), LeaseState::Held);
        assert!(held.valid_until() <= held.get(a).unwrap().valid_until());
    }

    #[tokio::test]
    async fn an_empty_set_is_refused() {
        let locks = MemoryLock::new().lock();
        let err = locks
            .acquire_all(&[], &waiting(Duration::ZERO))
            .await
            .expect_err("no keys");
        assert!(
            matches!(
                err,
                LockError::InvalidOptions {
                    source: OptionsError::NoKeys,
                    ..
                }
            ),
            "{err}"
        );
    }
}
