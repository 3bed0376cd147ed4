//! The mailbox between a client and its session tasks: the commands a task takes, and
//! the client's handle on a task (see `distlock_api::backend::sessions` for the rest).

use std::sync::Arc;
use std::time::Duration;

use distlock_api::backend::sessions;
pub(crate) use distlock_api::backend::sessions::{
    Failure, Granted, Kind, LeaseCommand, Reply, Seat,
};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

/// What a dedicated session's grant takes, and how.
#[derive(Debug, Clone)]
pub(crate) enum Grab {
    /// `pg_advisory_lock(hash)`, waiting in the server's queue: a mutex's or a writer's
    /// wait.
    Exclusive,
    /// `pg_advisory_lock_shared(hash)`, waiting in the server's queue: a reader's wait.
    SharedWait,
    /// `pg_try_advisory_lock_shared(hash)`: a reader's try.
    SharedTry,
    /// A semaphore permit's try: the count id `(count_key, max)` shared, then the first
    /// free slot of `slots` exclusive (see `Statements::permit_try`).
    PermitTry {
        count_key: i32,
        max: u32,
        slots: Vec<i64>,
    },
}

impl Grab {
    /// Whether the grant waits in the server's queue (under `lock_timeout`).
    pub fn waits(&self) -> bool {
        matches!(self, Grab::Exclusive | Grab::SharedWait)
    }
}

/// Which advisory locks a [`Command::HeldByAnyone`] looks for in `pg_locks`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Probe {
    pub classid: i64,
    /// `None` matches any `objid`.
    pub objid: Option<i64>,
    /// 1 for a `bigint` key, 2 for a two-`int4` key.
    pub objsubid: i32,
}

impl Probe {
    /// The `bigint` advisory key `hash`.
    pub fn key(hash: i64) -> Self {
        let (classid, objid) = crate::keys::pg_locks_ids(hash);
        Probe {
            classid,
            objid: Some(objid),
            objsubid: 1,
        }
    }

    /// Any count id `(count_key, m)` of a semaphore: held while any permit is.
    pub fn permit_counts(count_key: i32) -> Self {
        Probe {
            classid: i64::from(count_key),
            objid: None,
            objsubid: 2,
        }
    }
}

/// A command for a session task.
#[derive(Debug)]
pub(crate) enum Command {
    /// `pg_try_advisory_lock`, and a fencing token if granted.
    TryGrant {
        hash: i64,
        owner: u128,
        ttl: Duration,
        requested_at: Instant,
        /// An election's grant: recorded as the leader before the reply.
        seat: Option<Arc<Seat>>,
        reply: Reply<Option<Granted>>,
    },
    /// `grab` on `hash` (a waiting grab under `lock_timeout`, ms, 0 for none) on a
    /// dedicated session, which then holds only this grant.
    Wait {
        hash: i64,
        grab: Grab,
        owner: u128,
        ttl: Duration,
        lock_timeout_ms: u64,
        slot: OwnedSemaphorePermit,
        /// An election's grant: recorded as the leader before the reply.
        seat: Option<Arc<Seat>>,
        reply: Reply<Option<Granted>>,
    },
    /// A release or extend of a lease this session holds.
    Lease(LeaseCommand),
    /// Whether any session of the database holds an advisory lock matching `probe`.
    HeldByAnyone { probe: Probe, reply: Reply<bool> },
    /// The leader's `(candidate, term)` of the election `name` (advisory key `hash`),
    /// if the session that recorded it holds the election's lock.
    Leader {
        name: String,
        hash: i64,
        reply: Reply<Option<(Vec<u8>, i64)>>,
    },
}

impl Command {
    /// Answers the command with `failure`, if it expects an answer.
    pub(crate) fn fail(self, failure: Failure) {
        match self {
            Command::TryGrant { reply, .. } | Command::Wait { reply, .. } => {
                let _ = reply.send(Err(failure));
            }
            Command::Lease(command) => command.fail(failure),
            Command::HeldByAnyone { reply, .. } => {
                let _ = reply.send(Err(failure));
            }
            Command::Leader { reply, .. } => {
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
