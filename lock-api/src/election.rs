//! The [`LeaderElection`] trait: candidates campaign for a name, one leads at a time
//! with a rising term, and anyone can ask who leads or follow the changes.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::lease_backend::lease_backend_for;
use crate::{
    BackendInfo, ExtendOutcome, FencingToken, Lease, LeaseMonitor, LeaseState, LockError,
    LockGuard, LockKey, LockOptions, OptionsError, ReleaseOutcome,
};

/// The longest candidate identity, in bytes: an identity is a label (a host name and
/// an address), not a payload, and every backend stores it beside the leader's record.
pub const MAX_CANDIDATE_LEN: usize = 512;

/// How often [`LeaderElection::wait_change`]'s default looks at the leader, for
/// backends that cannot be told of a change.
pub const OBSERVE_POLL: Duration = Duration::from_millis(50);

/// Who campaigns: a short identity (a host name, an address) that observers read
/// through [`LeaderElection::leader`]. Bytes, so that any peer library's identity can
/// be read back; [`Candidate::to_text`] shows it as text.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Candidate(Vec<u8>);

impl Candidate {
    /// An identity of 1 to [`MAX_CANDIDATE_LEN`] bytes.
    ///
    /// # Errors
    /// [`OptionsError::Candidate`] for an empty or longer identity.
    pub fn new(identity: impl Into<Vec<u8>>) -> Result<Self, OptionsError> {
        let identity = identity.into();
        if identity.is_empty() || identity.len() > MAX_CANDIDATE_LEN {
            return Err(OptionsError::Candidate {
                len: identity.len(),
                max: MAX_CANDIDATE_LEN,
            });
        }
        Ok(Candidate(identity))
    }

    /// The identity's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The identity as text, with invalid UTF-8 replaced by U+FFFD. Print it with
    /// `{:?}` (or [`fmt::Display`], which quotes and escapes) where it may hold control
    /// characters: it comes from whoever campaigned.
    pub fn to_text(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.0)
    }
}

impl fmt::Debug for Candidate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Candidate({:?})", self.to_text())
    }
}

impl fmt::Display for Candidate {
    /// Quoted, with Rust's escapes, so that no identity can drive a terminal.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_text())
    }
}

/// The leader of a name as one look saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's identity, as it campaigned.
    pub candidate: Candidate,
    /// Its term: the fencing token of its leadership, above every earlier term of the
    /// name.
    pub term: FencingToken,
    /// How long its lease had left when looked at, where the backend can tell
    /// (session-bound backends cannot: `None`).
    pub remaining: Option<Duration>,
}

impl Leader {
    /// `candidate` leading in `term`, with no remaining lease known.
    pub fn new(candidate: Candidate, term: FencingToken) -> Self {
        Leader {
            candidate,
            term,
            remaining: None,
        }
    }

    /// Sets the remaining lease.
    pub fn with_remaining(mut self, remaining: Option<Duration>) -> Self {
        self.remaining = remaining;
        self
    }
}

/// Leader election: candidates campaign for a name; at most one leads at a time, in a
/// term that rises strictly with every new leadership of the name.
///
/// Object-safe; share it as `Arc<dyn LeaderElection>`. A won campaign is a
/// [`Leadership`]: a [`LockGuard`] underneath, with the mutex's semantics (a lease with
/// a validity deadline and [`Leadership::lost`], auto-renew, owner-checked resign and
/// extend with typed outcomes, a `Drop` that resigns in the background and never
/// blocks), plus the term and the identity.
///
/// **What every backend that offers it promises** (checked by `distlock-conformance`,
/// gated by [`Capabilities::election`](crate::Capabilities::election)):
/// - At most one leader of a name at any instant, as far as the backend's mutex
///   promises exclusion (its docs and the fault report say under which faults).
/// - Terms rise strictly per name: send [`Leadership::term`] with every write the
///   leader makes, and have the resource refuse lower terms, so a leader that stalled
///   past its lease cannot overwrite its successor's work.
/// - A leader learns of its loss ([`Leadership::lost`]) no later than its validity
///   deadline, also when its connection is cut: it must stop acting then.
/// - After a leader crashes, another candidate leads within the backend's lease bound
///   (the TTL, session timeout or lease) plus one hand-off; after a resign, within one
///   hand-off. Waiting candidates are woken by the backend where it can (its
///   [`Guarantees::wake_on_release`](crate::Guarantees::wake_on_release)).
/// - [`LeaderElection::leader`] reads the current leader (identity and term) without
///   campaigning; [`LeaderWatch`] follows the changes in term order.
///
/// Election names are a namespace of their own: the mutex key `a` and the election
/// `a` are different.
///
/// Contract for implementors: `release` and `extend` act only on the lease's own
/// leadership, atomically with the check; dropping a campaign future leaves nothing
/// held and no candidacy behind; options and the identity are checked before touching
/// the server; the lease of a [`Leadership`] always carries its term.
#[async_trait]
pub trait LeaderElection: Send + Sync + fmt::Debug {
    /// The backend's name and guarantees
    /// ([`Capabilities::election`](crate::Capabilities::election)).
    fn info(&self) -> BackendInfo;

    /// Campaigns once for `name` as `candidate`, without waiting. `Ok(None)` when
    /// another candidate leads.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`], [`LockError::Unsupported`], or connection and
    /// backend errors.
    async fn try_campaign(
        &self,
        name: &LockKey,
        candidate: &Candidate,
        options: &LockOptions,
    ) -> Result<Option<Leadership>, LockError>;

    /// Campaigns for `name` as `candidate`, waiting to lead as the options'
    /// [`crate::WaitPolicy`] allows.
    ///
    /// # Errors
    /// [`LockError::Timeout`] when the wait runs out, and the errors of
    /// [`LeaderElection::try_campaign`].
    async fn campaign(
        &self,
        name: &LockKey,
        candidate: &Candidate,
        options: &LockOptions,
    ) -> Result<Leadership, LockError>;

    /// Owner-checked resignation of the leadership `lease`. Prefer
    /// [`Leadership::resign`].
    ///
    /// # Errors
    /// Connection and backend errors only.
    async fn release(&self, lease: &Lease) -> Result<ReleaseOutcome, LockError>;

    /// Owner-checked extension of the leadership `lease` to expire `ttl` from now.
    /// Prefer [`Leadership::extend`] (or auto-renew).
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] for a TTL out of bounds, and connection and
    /// backend errors.
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<ExtendOutcome, LockError>;

    /// The current leader of `name`, or `None` when nobody leads. A snapshot: it may be
    /// stale by the time it returns, so a candidate never uses it to decide whether it
    /// leads (its [`Leadership`] says that).
    ///
    /// # Errors
    /// Connection and backend errors.
    async fn leader(&self, name: &LockKey) -> Result<Option<Leader>, LockError>;

    /// Waits until the leadership of `name` differs from `seen` (the term last seen,
    /// `None` for "nobody leads"), or until `patience` has passed, and returns what it
    /// finds then (which may still be `seen`). [`LeaderWatch`] is built on this.
    ///
    /// The default polls [`LeaderElection::leader`] every [`OBSERVE_POLL`]; backends that
    /// can be told of a change (a watch, a notification) wait for it instead.
    ///
    /// # Errors
    /// Connection and backend errors.
    async fn wait_change(
        &self,
        name: &LockKey,
        seen: Option<FencingToken>,
        patience: Duration,
    ) -> Result<Option<Leader>, LockError> {
        let deadline = Instant::now() + patience;
        loop {
            let now = self.leader(name).await?;
            if now.as_ref().map(|l| l.term) != seen || Instant::now() >= deadline {
                return Ok(now);
            }
            tokio::time::sleep_until(deadline.min(Instant::now() + OBSERVE_POLL)).await;
        }
    }
}

lease_backend_for!(LeaderElection);

/// A won campaign: this candidate leads `name` in [`Leadership::term`] until it
/// resigns, its lease is lost, or the guard is dropped (which resigns in the
/// background, as a [`LockGuard`] releases).
#[must_use = "dropping the leadership resigns at once"]
#[derive(Debug)]
pub struct Leadership {
    guard: LockGuard,
    candidate: Candidate,
    term: FencingToken,
}

impl Leadership {
    /// A won campaign: `guard` holds the leadership of `term` for `candidate`.
    pub(crate) fn from_guard(guard: LockGuard, candidate: Candidate, term: FencingToken) -> Self {
        Leadership {
            guard,
            candidate,
            term,
        }
    }

    /// The election's name.
    pub fn name(&self) -> &LockKey {
        self.guard.key()
    }

    /// The identity this leadership campaigned with.
    pub fn candidate(&self) -> &Candidate {
        &self.candidate
    }

    /// The term: above every earlier term of the name. Send it with every write the
    /// leader makes (it is the leadership's fencing token).
    pub fn term(&self) -> FencingToken {
        self.term
    }

    /// Whether the campaign found another leader first (and so waited).
    pub fn contended(&self) -> bool {
        self.guard.contended()
    }

    /// The lock guard underneath: the lease, its monitor and its metrics, as for any
    /// grant.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// The lease (owner token, TTL, grant time).
    pub fn lease(&self) -> &Lease {
        self.guard.lease()
    }

    /// Held, suspect or lost.
    pub fn state(&self) -> LeaseState {
        self.guard.state()
    }

    /// Until when this leadership is valid, on the monotonic clock (conservative).
    pub fn valid_until(&self) -> Instant {
        self.guard.valid_until()
    }

    /// Resolves when the leadership is known lost or its validity passed without
    /// renewal: stop acting as leader then. Does not borrow the leadership.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.guard.lost()
    }

    /// A handle on the lease state that outlives the borrow.
    pub fn monitor(&self) -> LeaseMonitor {
        self.guard.monitor()
    }

    /// Extends the leadership's lease, as [`LockGuard::extend`] does.
    ///
    /// # Errors
    /// Those of [`LockGuard::extend`].
    pub async fn extend(&self, ttl: Duration) -> Result<ExtendOutcome, LockError> {
        self.guard.extend(ttl).await
    }

    /// Stops renewal and resigns (owner-checked), so another candidate can lead at once.
    ///
    /// # Errors
    /// Connection and backend errors; the lease then runs out on its own.
    pub async fn resign(self) -> Result<ReleaseOutcome, LockError> {
        self.guard.release().await
    }
}

/// Follows the leadership of one name: [`LeaderWatch::next`] returns the current state
/// first, then each change (a new term, or nobody leading) in order.
///
/// Guarantees: terms returned never go back, a term is returned at most once, and
/// `None` (nobody leads) only after a leader. A term that began and ended between two
/// looks of the backend can be missed (the next term then follows at once), so treat
/// the stream as "the latest leadership, in order", not as a log of every term. An
/// error (the connection lost) is returned as such: the watch does not pretend the
/// leader is unchanged; call `next` again to retry, or drop the watch.
#[derive(Debug)]
pub struct LeaderWatch {
    election: Arc<dyn LeaderElection>,
    name: LockKey,
    /// What was returned last: `None` before the first call.
    last: Option<Option<FencingToken>>,
    /// The highest term returned, so a stale read never sends the stream back.
    highest: Option<FencingToken>,
}

/// How long one [`LeaderElection::wait_change`] of a [`LeaderWatch`] waits before it
/// looks again: a backstop, since `wait_change` returns on every change it sees.
const WATCH_PATIENCE: Duration = Duration::from_secs(30);

impl LeaderWatch {
    /// A watch of `name` through `election`.
    pub fn new(election: Arc<dyn LeaderElection>, name: LockKey) -> Self {
        LeaderWatch {
            election,
            name,
            last: None,
            highest: None,
        }
    }

    /// The next state: the current one on the first call, then the next change.
    /// Waits as long as nothing changes.
    ///
    /// # Errors
    /// The backend's connection and backend errors.
    pub async fn next(&mut self) -> Result<Option<Leader>, LockError> {
        let Some(last) = self.last else {
            let now = self.election.leader(&self.name).await?;
            self.highest = now.as_ref().map(|l| l.term);
            self.last = Some(self.highest);
            return Ok(now);
        };
        loop {
            let now = self
                .election
                .wait_change(&self.name, last, WATCH_PATIENCE)
                .await?;
            if let Some(changed) = self.accept(now) {
                return Ok(changed);
            }
        }
    }

    /// Records `now` and returns it if it is news: a term above every one returned, or
    /// nobody leading after a leader. `None` for a repeat or a stale read.
    fn accept(&mut self, now: Option<Leader>) -> Option<Option<Leader>> {
        let news = match &now {
            Some(leader) => self.highest.is_none_or(|h| leader.term > h),
            None => !matches!(self.last, Some(None)),
        };
        if !news {
            return None;
        }
        if let Some(leader) = &now {
            self.highest = Some(leader.term);
        }
        self.last = Some(now.as_ref().map(|l| l.term));
        Some(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_are_bounded_and_print_escaped() {
        assert!(Candidate::new("").is_err());
        assert!(Candidate::new(vec![b'a'; MAX_CANDIDATE_LEN]).is_ok());
        let refused = Candidate::new(vec![b'a'; MAX_CANDIDATE_LEN + 1]).expect_err("too long");
        assert!(refused.to_string().contains("513"), "{refused}");
        let odd = Candidate::new("esc\u{1b}[31m").expect("valid");
        assert_eq!(odd.to_string(), "\"esc\\u{1b}[31m\"");
    }
}
