//! The mailbox between a client and its session tasks: the commands a task takes, and
//! the client's handle on a task (see `distlock_api::backend::sessions` for the rest).

use std::sync::Arc;
use std::time::Duration;

use distlock_api::backend::sessions;
pub(crate) use distlock_api::backend::sessions::{
    Failure, Granted, Kind, LeaseCommand, Reply, Seat,
};
use distlock_api::LockKey;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

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
    /// A release or extend of a lease this session holds.
    Lease(LeaseCommand),
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
            Command::Lease(command) => command.fail(failure),
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

impl From<LeaseCommand> for Command {
    fn from(command: LeaseCommand) -> Self {
        Command::Lease(command)
    }
}

/// The client's handle on a session task.
pub(crate) type SessionHandle = sessions::SessionHandle<Command>;
