//! FIFO waiting on a single node: the waiter's loop around the queue scripts.
//!
//! A waiter joins the key's queue (`{K}:queue`, scored by arrival) with its first
//! attempt and refreshes its entry's deadline (`{K}:queue:deadlines`) with every later
//! one, at least every third of [`RedisConfig::fifo_entry_ttl`]. The lock is granted
//! only to the head of the queue, when it is free. A release publishes the head's id,
//! which wakes that waiter only. A waiter that gives up (its wait ran out, an error)
//! removes its entry before it returns and wakes the next; one whose future is dropped
//! (a wait cut past its grace included) removes it in the background; one that dies
//! stops refreshing, and its entry is dropped by the next script run after its
//! deadline, which the waiters behind it time their naps to.
//!
//! [`RedisConfig::fifo_entry_ttl`]: crate::RedisConfig::fifo_entry_ttl

use std::time::Duration;

use distlock_api::backend::{Grant, Request};
use distlock_api::{LockError, LockKey, LockOptions, OwnerToken};
use tokio::time::Instant;

use super::{too_late, Compensation, RedisLock};
use crate::keys::KeyNames;
use crate::node::{hex, Node, QueueGrant};
use crate::REDIS_BACKEND;

/// One FIFO attempt's result, when it did not fail.
enum QueueAttempt {
    Granted(Grant),
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
        // Until we hand out the grant, a drop of this future must undo it.
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
                if let Some(grant) = self.grant(key, owner, Some(token), started, ttl) {
                    compensation.disarm();
                    return Ok(QueueAttempt::Granted(grant));
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

    /// A FIFO acquire of `request`'s key: for a try, granted only when the lock is free
    /// and nobody is queued, so it never overtakes a waiter; else queued, as
    /// [`RedisLock::wait_in_queue`].
    pub(crate) async fn acquire_queued(
        &self,
        request: &Request<'_>,
    ) -> Result<Option<Grant>, LockError> {
        if request.waits() {
            return self.wait_in_queue(request).await;
        }
        let names = KeyNames::for_key(request.key);
        let attempt = self
            .attempt_in_queue(request.key, &names, request.options, &waiter_id(), false)
            .await?;
        Ok(match attempt {
            QueueAttempt::Granted(grant) => Some(grant),
            QueueAttempt::Waiting { .. } => {
                request.saw_held();
                None
            }
        })
    }

    /// The FIFO acquire loop: queue up, then attempt again whenever woken as the head,
    /// and at least every third of the entry TTL (which refreshes the entry), at the
    /// holder's expiry and at the earliest queue deadline, until granted or the
    /// request's deadline passes with the key held. Without a grant it leaves the
    /// queue before it returns (if the caller cuts it first, in the background).
    async fn wait_in_queue(&self, request: &Request<'_>) -> Result<Option<Grant>, LockError> {
        let (key, options, deadline) = (request.key, request.options, request.deadline);
        let node = self.queue_node()?;
        let names = KeyNames::for_key(key);
        let waiter = waiter_id();
        let refresh = self.inner.config.fifo_entry_ttl / 3;
        let mut membership = Membership {
            lock: self,
            names: &names,
            waiter: &waiter,
            armed: true,
        };
        let mut backoff = options.backoff().delays();
        let mut ticket = None;
        let mut attempted = false;
        loop {
            if attempted && request.deadline_passed() {
                // No attempt past the deadline: its round trip, and the removal's after
                // it, would both have to fit in the caller's grace.
                membership.leave().await;
                return Ok(None);
            }
            attempted = true;
            let attempt = self
                .attempt_in_queue(key, &names, options, &waiter, true)
                .await;
            let wake_by = match attempt {
                Ok(QueueAttempt::Granted(grant)) => {
                    // The grant took our entry out of the queue.
                    membership.armed = false;
                    return Ok(Some(grant));
                }
                Ok(QueueAttempt::Waiting {
                    held_for,
                    next_deadline,
                    place,
                }) => {
                    request.saw_held();
                    // Neither a holder that expires (the head's concern: the rest would
                    // find it queued ahead of them) nor a dead waiter ahead whose entry
                    // runs out publishes: be there when it happens.
                    [
                        held_for.filter(|_| place == Some(0)),
                        next_deadline.map(|d| d + Duration::from_millis(1)),
                    ]
                    .into_iter()
                    .flatten()
                    .min()
                }
                Err(error) => {
                    // Leave before answering: the caller may exit right after (exec
                    // does), and a background removal would not get to run.
                    membership.leave().await;
                    return Err(error);
                }
            };
            if request.deadline_passed() {
                // No attempt past the deadline; leave before answering, as above.
                membership.leave().await;
                return Ok(None);
            }
            let Some((ticket, subscribed)) = &ticket else {
                // Queued: listen for our name, then try again at once, so a release
                // published before the subscription is not missed.
                ticket = Some(node.watch(&names, Some(&waiter)).await);
                continue;
            };
            let mut nap = if *subscribed {
                refresh
            } else {
                backoff.next_delay().min(refresh)
            };
            if let Some(bound) = wake_by {
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
