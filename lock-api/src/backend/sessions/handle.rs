//! The mailbox between a client and one of its session tasks, and what a command
//! answers.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::backend::NewLease as _;
use crate::{FencingToken, Lease, LeaseMonitor, LockError, LockKey, LockOptions, OwnerToken};

/// What a session is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Carries grants that did not wait, for any number of keys.
    Shared,
    /// Waits in the server's queue for one key (or holds one permit), then holds that
    /// one grant.
    Wait,
}

/// Why a command failed.
#[derive(Debug)]
pub enum Failure {
    /// The session closed before running the command: nothing happened, retry elsewhere.
    Closed,
    /// The command ran, or may have, and failed.
    Lock(LockError),
    /// A permit try found the semaphore in use with this other permit count; nothing
    /// was taken.
    Mismatch(u32),
}

/// Where a session task answers a command.
pub type Reply<T> = oneshot::Sender<Result<T, Failure>>;

/// A lock granted to a session.
#[derive(Debug)]
pub struct Granted {
    /// The grant's fencing token.
    pub token: u64,
    /// When the lease starts, on the client's clock (conservative).
    pub acquired_at: Instant,
    /// The lease's monitor; the session task keeps a clone to report suspicion and loss.
    pub monitor: LeaseMonitor,
}

impl Granted {
    /// The lease of this grant of `key` to `owner` under `options` (its fencing token,
    /// its TTL from [`Granted::acquired_at`]), and its monitor.
    pub fn into_lease(
        self,
        key: &LockKey,
        owner: OwnerToken,
        options: &LockOptions,
    ) -> (Lease, LeaseMonitor) {
        let lease = Lease::new(
            key.clone(),
            owner,
            Some(FencingToken::new(self.token)),
            options.ttl(),
            self.acquired_at,
        );
        (lease, self.monitor)
    }
}

/// A command on one held lease, for the session holding it (see
/// [`super::release`] and [`super::extend`]).
#[derive(Debug)]
pub enum LeaseCommand {
    /// Releases `owner`'s lease if this session holds it; `true` if it did. Without a
    /// reply it is the compensation for a grant whose caller went away.
    Release {
        /// The lease's owner token.
        owner: u128,
        /// Where the answer goes, if anywhere.
        reply: Option<Reply<bool>>,
    },
    /// Proves the session alive and pushes `owner`'s TTL deadline to `ttl` from now;
    /// the new validity deadline, or `None` if this session does not hold the lease.
    Extend {
        /// The lease's owner token.
        owner: u128,
        /// The lease's new TTL, from the proof of life.
        ttl: Duration,
        /// Where the answer goes.
        reply: Reply<Option<Instant>>,
    },
}

impl LeaseCommand {
    /// Answers the command with `failure`, if it expects an answer.
    pub fn fail(self, failure: Failure) {
        match self {
            LeaseCommand::Release { reply, .. } => {
                if let Some(reply) = reply {
                    let _ = reply.send(Err(failure));
                }
            }
            LeaseCommand::Extend { reply, .. } => {
                let _ = reply.send(Err(failure));
            }
        }
    }
}

/// An election candidacy: what a grant of the election's lock records as the leader,
/// in the same session, before it is handed out.
#[derive(Debug)]
pub struct Seat {
    /// The election's name as the backend's table keys it.
    pub name: String,
    /// The candidate's identity.
    pub candidate: Vec<u8>,
}

/// The client's handle on a session task: its mailbox of commands `C`, the count of
/// commands in flight and whether the task still takes commands.
#[derive(Debug)]
pub struct SessionHandle<C> {
    tx: mpsc::UnboundedSender<C>,
    /// Commands sent and not yet finished, for picking the least busy session.
    load: AtomicUsize,
    alive: AtomicBool,
}

impl<C> SessionHandle<C> {
    /// A handle for a new task, and the task's end of the mailbox.
    pub fn new() -> (Self, mpsc::UnboundedReceiver<C>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let handle = SessionHandle {
            tx,
            load: AtomicUsize::new(0),
            alive: AtomicBool::new(true),
        };
        (handle, rx)
    }

    /// Notes that the task finished `count` commands.
    pub fn finished(&self, count: usize) {
        self.load.fetch_sub(count, Ordering::Relaxed);
    }

    /// Notes that the task stopped: the session takes no more commands.
    pub fn close(&self) {
        self.alive.store(false, Ordering::Release);
    }

    /// Queues `command`.
    ///
    /// # Errors
    /// Gives `command` back if the task has stopped taking commands.
    pub fn send(&self, command: C) -> Result<(), C> {
        self.load.fetch_add(1, Ordering::Relaxed);
        self.tx.send(command).map_err(|e| {
            self.load.fetch_sub(1, Ordering::Relaxed);
            e.0
        })
    }

    /// Commands sent and not yet finished.
    pub fn load(&self) -> usize {
        self.load.load(Ordering::Relaxed)
    }

    /// Whether the task still takes commands.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire) && !self.tx.is_closed()
    }
}
