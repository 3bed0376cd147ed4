//! The mailbox between a client and its session tasks: what a session is for, the
//! commands a task takes, their replies, and the client's handle on a task.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock_api::{LeaseMonitor, LockError, LockKey};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};
use tokio::time::Instant;

/// What a session is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Carries grants that did not wait, for any number of names.
    Shared,
    /// Waits in `GET_LOCK` for one name, or holds one permit, then holds that one grant.
    Wait,
}

/// Why a command failed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The session closed before running the command: nothing happened, retry elsewhere.
    Closed,
    /// The command ran, or may have, and failed.
    Lock(LockError),
    /// A permit try found the semaphore in use with this other permit count; nothing
    /// was taken.
    Mismatch(u32),
}

/// How a grant takes its lock.
#[derive(Debug, Clone)]
pub(crate) enum Grab {
    /// `GET_LOCK(name, 0)` unless the name is in use (by anyone, this session too).
    Try,
    /// `GET_LOCK(name, seconds)` on a dedicated session holding nothing.
    Wait { seconds: f64 },
    /// A semaphore permit's try on a dedicated session (see `semaphore`).
    Permit { key: LockKey, max: u32 },
}

/// An election candidacy: what a grant of the election's lock records as the leader,
/// in the same session, before it is handed out.
#[derive(Debug)]
pub(crate) struct Seat {
    /// The election's lock name (the table's key).
    pub name: String,
    /// The candidate's identity.
    pub candidate: Vec<u8>,
}

pub(crate) type Reply<T> = oneshot::Sender<Result<T, Failure>>;

/// A lock granted to a session.
#[derive(Debug)]
pub(crate) struct Granted {
    pub token: u64,
    /// When the lease starts, on the client's clock (conservative).
    pub acquired_at: Instant,
    pub monitor: LeaseMonitor,
}

/// A command for a session task.
#[derive(Debug)]
pub(crate) enum Command {
    /// `grab` on the lock `name`, with its fencing token if granted.
    Grant {
        name: Arc<str>,
        grab: Grab,
        owner: u128,
        ttl: Duration,
        requested_at: Instant,
        /// A dedicated session's wait slot, kept as long as the grant is held.
        slot: Option<OwnedSemaphorePermit>,
        /// An election's grant: recorded as the leader before the reply.
        seat: Option<Arc<Seat>>,
        reply: Reply<Option<Granted>>,
    },
    /// Unlocks `owner`'s lease if this session holds it; `true` if it did. Without a
    /// reply it is the compensation for a grant whose caller went away.
    Release {
        owner: u128,
        reply: Option<Reply<bool>>,
    },
    /// Proves the session alive and pushes `owner`'s TTL deadline to `ttl` from now;
    /// the new validity deadline, or `None` if this session does not hold the lease.
    Extend {
        owner: u128,
        ttl: Duration,
        reply: Reply<Option<Instant>>,
    },
    /// The connection id holding the lock `name`, if any (`IS_USED_LOCK`).
    Holder {
        name: String,
        reply: Reply<Option<u64>>,
    },
    /// Whether any permit of the semaphore `key` is held, by anyone.
    PermitsInUse { key: LockKey, reply: Reply<bool> },
    /// The leader's `(candidate, term)` of the election whose lock is `name`, if the
    /// session that recorded it holds the lock.
    Leader {
        name: String,
        reply: Reply<Option<(Vec<u8>, u64)>>,
    },
}

impl Command {
    /// Answers the command with `failure`, if it expects an answer.
    pub(crate) fn fail(self, failure: Failure) {
        match self {
            Command::Grant { reply, .. } => {
                let _ = reply.send(Err(failure));
            }
            Command::Release { reply, .. } => {
                if let Some(reply) = reply {
                    let _ = reply.send(Err(failure));
                }
            }
            Command::Extend { reply, .. } => {
                let _ = reply.send(Err(failure));
            }
            Command::Holder { reply, .. } => {
                let _ = reply.send(Err(failure));
            }
            Command::Leader { reply, .. } => {
                let _ = reply.send(Err(failure));
            }
            Command::PermitsInUse { reply, .. } => {
                let _ = reply.send(Err(failure));
            }
        }
    }
}

/// The client's handle on a session task.
#[derive(Debug)]
pub(crate) struct SessionHandle {
    tx: mpsc::UnboundedSender<Command>,
    /// Commands sent and not yet finished, for picking the least busy session.
    load: AtomicUsize,
    alive: AtomicBool,
}

impl SessionHandle {
    /// A handle for a new task, and the task's end of the mailbox.
    pub fn new() -> (Self, mpsc::UnboundedReceiver<Command>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let handle = SessionHandle {
            tx,
            load: AtomicUsize::new(0),
            alive: AtomicBool::new(true),
        };
        (handle, rx)
    }

    /// Notes that the task finished a command.
    pub fn finished(&self) {
        self.load.fetch_sub(1, Ordering::Relaxed);
    }

    /// Notes that the task stopped: the session takes no more commands.
    pub fn close(&self) {
        self.alive.store(false, Ordering::Release);
    }

    /// Queues `command`; gives it back if the task has stopped taking commands.
    pub fn send(&self, command: Command) -> Result<(), Command> {
        self.load.fetch_add(1, Ordering::Relaxed);
        self.tx.send(command).map_err(|e| {
            self.load.fetch_sub(1, Ordering::Relaxed);
            e.0
        })
    }

    pub fn load(&self) -> usize {
        self.load.load(Ordering::Relaxed)
    }

    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire) && !self.tx.is_closed()
    }
}
