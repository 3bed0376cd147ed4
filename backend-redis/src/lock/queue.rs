//! FIFO waiting on a single node: the waiter's loop around the queue scripts.
//!
//! A waiter joins the key's queue (`{K}:queue`, scored by arrival) with its first
//! attempt and refreshes its entry's deadline (`{K}:queue:deadlines`) with every later
//! one, at least every third of [`RedisConfig::fifo_entry_ttl`]. The lock is granted
//! only to the head of the queue, when it is free. A release publishes the head's id,
//! which wakes that waiter only. A waiter that gives up (timeout, error, dropped
//! future) removes its entry at once and wakes the next; one that dies stops
//! refreshing, and its entry is dropped by the next script run after its deadline,
//! which the waiters behind it time their naps to.
//!
//! [`RedisConfig::fifo_entry_ttl`]: crate::RedisConfig::fifo_entry_ttl

use std::future::Future;
use std::time::Duration;

use distlock_api::backend::WaitReport;
use distlock_api::{LockError, LockGuard, LockKey, LockOptions, OwnerToken};
use tokio::time::Instant;

use super::{too_late, Compensation, RedisLock, DEADLINE_GRACE};
use crate::keys::KeyNames;
use crate::node::{hex, Node, QueueGrant};
use crate::REDIS_BACKEND;

/// One FIFO attempt's result, when it did not fail.
enum QueueAttempt {
    Granted(LockGuard),
    /// Not granted: held, or others are ahead.
    Waiting {
        held_for: Option<Duration>,
        next_deadline: Option<Duration>,
        place: Option<u64>,
    },
}

impl RedisLock {
    /// The one node FIFO runs on (Redlock refuses FIFO before this is reached).
    fn queue_node(&self) -> Result<&Node, LockError> {
        match self.inner.nodes.as_slice() {
            [node] => Ok(node),
            _ => Err(LockError::backend_error(
                REDIS_BACKEND,
                "FIFO waiting needs exactly one node",
            )),
        }
    }

    /// One FIFO attempt for `waiter`: joins (or refreshes its place in) the queue when
    /// `join`, else only takes the lock if it is free and nobody is queued.
    async fn attempt_in_queue(
        &self,
        key: &LockKey,
        names: &KeyNames,
        options: &LockOptions,
        waiter: &str,
        join: bool,
    ) -> Result<QueueAttempt, LockError> {
        let node = self.queue_node()?;
        let (owner, ttl) = (OwnerToken::random(), options.ttl());
        let started = Instant::now();
        // Until we hand out a guard, a drop of this future must undo any grant.
        let compensation = Compensation {
            lock: self,
            key,
            owner,
            ttl,
            armed: true,
        };
        let entry_ttl = self.inner.config.fifo_entry_ttl;
        let answer = node
            .try_grant_in_queue(names, owner, ttl, waiter, entry_ttl, join)
            .await;
        let answer = match answer {
            Ok(answer) => answer,
            Err(error) => {
                // The script may have run: undo a grant we never saw.
                self.release_everywhere(names, owner, ttl).await;
                compensation.disarm();
                return Err(error);
            }
        };
        match answer {
            QueueGrant::Granted(token) => {
                if let Some(guard) = self.guard(key, owner, Some(token), started, options) {
                    compensation.disarm();
                    return Ok(QueueAttempt::Granted(guard));
                }
                self.release_everywhere(names, owner, ttl).await;
                compensation.disarm();
                Err(too_late(self.name(), "acquire"))
            }
            QueueGrant::Waiting {
                held_for,
                next_deadline,
                place,
            } => {
                compensation.disarm();
                Ok(QueueAttempt::Waiting {
                    held_for,
                    next_deadline,
                    place,
                })
            }
        }
    }

    /// A FIFO `try_acquire`: granted only when the lock is free and nobody is queued,
    /// so it never overtakes a waiter.
    pub(super) async fn try_ahead_of_queue(
        &self,
        key: &LockKey,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        let waiter = waiter_id();
        let names = KeyNames::for_key(key);
        Ok(
            match self
                .attempt_in_queue(key, &names, options, &waiter, false)
                .await?
            {
                QueueAttempt::Granted(guard) => Some(guard),
                QueueAttempt::Waiting { .. } => None,
            },
        )
    }

    /// The FIFO acquire loop: queue up, then attempt again whenever woken as the head,
    /// and at least every third of the entry TTL (which refreshes the entry), at the
    /// holder's expiry and at the earliest queue deadline, until granted or `deadline`.
    pub(super) async fn wait_in_queue(
        &self,
        key: &LockKey,
        options: &LockOptions,
        started: Instant,
        deadline: Option<Instant>,
        report: &WaitReport,
    ) -> Result<LockGuard, LockError> {
        let node = self.queue_node()?;
        let names = KeyNames::for_key(key);
        let waiter = waiter_id();
        if deadline == Some(started) {
            // No wait: one try that does not queue.
            return match self
                .attempt_in_queue(key, &names, options, &waiter, false)
                .await?
            {
                QueueAttempt::Granted(guard) => Ok(guard),
                QueueAttempt::Waiting { .. } => {
                    report.saw_held();
                    Err(self.out_of_wait(key, started, true))
                }
            };
        }
        let refresh = self.inner.config.fifo_entry_ttl / 3;
        let mut membership = Membership {
            lock: self,
            names: &names,
            waiter: &waiter,
            armed: true,
        };
        // The wait bounds the call whatever the server does: a step still in flight at
        // `cutoff` is cut short (an attempt's compensation releases a grant the server
        // applies late), and the entry is removed before the call returns, however slow
        // the server: a background removal would not run if the caller exits.
        let cutoff = deadline.and_then(|d| d.checked_add(DEADLINE_GRACE));
        let past_deadline = || deadline.is_some_and(|d| Instant::now() >= d);
        let mut backoff = options.backoff().delays();
        let mut ticket = None;
        let mut failing: Option<(Instant, u32)> = None;
        let mut attempted = false;
        loop {
            if attempted && past_deadline() {
                // No attempt past the deadline: its round trip, and the removal's after
                // it, would both have to fit in the grace.
                return membership
                    .give_up(self.out_of_wait(key, started, report.held_seen()))
                    .await;
            }
            attempted = true;
            let attempt = self.attempt_in_queue(key, &names, options, &waiter, true);
            let Some(attempt) = within(cutoff, attempt).await else {
                return membership
                    .give_up(self.out_of_wait(key, started, report.held_seen()))
                    .await;
            };
            let (held_for, next_deadline) = match attempt {
                Ok(QueueAttempt::Granted(guard)) => {
                    // The grant took our entry out of the queue.
                    membership.armed = false;
                    return Ok(guard);
                }
                Ok(QueueAttempt::Waiting {
                    held_for,
                    next_deadline,
                    place,
                }) => {
                    failing = None;
                    report.saw_held();
                    // Only the head takes over from a holder that expires; the rest
                    // would find it queued ahead of them.
                    (held_for.filter(|_| place == Some(0)), next_deadline)
                }
                Err(error) if error.is_retryable() => {
                    if let Err(error) =
                        self.retry_or_give_up(error, deadline, started, &mut failing)
                    {
                        return membership.give_up(error).await;
                    }
                    (None, None)
                }
                Err(error) => {
                    return membership.give_up(error).await;
                }
            };
            if past_deadline() {
                // Leave before answering: the caller may exit right after (exec
                // does), and a background removal would not get to run.
                return membership
                    .give_up(self.out_of_wait(key, started, report.held_seen()))
                    .await;
            }
            let Some((ticket, subscribed)) = &ticket else {
                // Queued: listen for our name, then try again at once, so a release
                // published before the subscription is not missed.
                let Some(watch) = within(cutoff, node.watch(&names, Some(&waiter))).await else {
                    return membership
                        .give_up(self.out_of_wait(key, started, report.held_seen()))
                        .await;
                };
                ticket = Some(watch);
                continue;
            };
            let mut nap = if *subscribed && failing.is_none() {
                refresh
            } else {
                backoff.next_delay().min(refresh)
            };
            // A holder that expires (the head's concern), or a dead waiter ahead whose
            // entry runs out, does not publish: be there when it happens.
            for bound in [
                held_for,
                next_deadline.map(|d| d + Duration::from_millis(1)),
            ]
            .into_iter()
            .flatten()
            {
                nap = nap.min(bound);
            }
            nap = nap.max(Duration::from_millis(1));
            if let Some(d) = deadline {
                nap = nap.min(d.saturating_duration_since(Instant::now()));
            }
            tokio::select! {
                _ = ticket.notify().notified() => {}
                _ = tokio::time::sleep(nap) => {}
            }
        }
    }
}

/// `step`'s output, or `None` when `cutoff` passed first (the step is then dropped).
async fn within<T>(cutoff: Option<Instant>, step: impl Future<Output = T>) -> Option<T> {
    match cutoff {
        Some(cutoff) => tokio::time::timeout_at(cutoff, step).await.ok(),
        None => Some(step.await),
    }
}

/// A fresh waiter id: 32 hex digits, like an owner token.
fn waiter_id() -> String {
    String::from_utf8_lossy(&hex(OwnerToken::random())).into_owned()
}

/// A waiter's place in the queue: leaving the wait in any way but a grant removes the
/// entry at once: before the call returns (timeout, error), or in the background (a
/// dropped future).
struct Membership<'a> {
    lock: &'a RedisLock,
    names: &'a KeyNames,
    waiter: &'a str,
    armed: bool,
}

impl Membership<'_> {
    /// Leaves the queue (as [`Membership::leave`]), then fails with `error`.
    async fn give_up<T>(&mut self, error: LockError) -> Result<T, LockError> {
        self.leave().await;
        Err(error)
    }

    /// Removes the entry now and waits for the answer. If this future is dropped
    /// midway, the removal runs again in the background.
    async fn leave(&mut self) {
        if let Ok(node) = self.lock.queue_node() {
            // If this fails the entry expires on its own within the entry TTL.
            let _ = node.leave_queue(self.names, self.waiter).await;
        }
        self.armed = false;
    }
}

impl Drop for Membership<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (lock, names, waiter) = (
                self.lock.clone(),
                self.names.clone(),
                self.waiter.to_owned(),
            );
            // Counted, so that a program exiting right after can let it finish.
            distlock_api::backend::spawn_cleanup(&runtime, async move {
                if let Ok(node) = lock.queue_node() {
                    // If this fails the entry expires on its own within the entry TTL.
                    let _ = node.leave_queue(&names, &waiter).await;
                }
            });
        }
    }
}
