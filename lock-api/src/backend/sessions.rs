//! For backends that multiplex many held locks over a few database sessions (the
//! Postgres and MySQL backends): the parts of that design that do not depend on the
//! database.
//!
//! Such a backend keeps two kinds of sessions ([`Kind`]): a few **shared** ones that
//! carry every grant that does not wait, and **dedicated** ones that wait in the
//! server's lock queue for one key and then hold that one grant. Each session is owned
//! by one task, which runs its commands in order and owns what the session holds; the
//! client talks to it through a [`SessionHandle`] (a mailbox of the backend's own
//! command type `C`). A caller that finds the session idle (nothing queued or running,
//! no timer due) runs its command in its own task instead, with the task's own code,
//! behind the lock the task and such callers take turns on
//! ([`SessionHandle::run`]): that spares two cross-thread wake-ups per statement
//! (the task's, and the caller's by the reply). Once started, such a command runs to
//! its end even if its caller goes away, as a queued one would. A backend that batches
//! what queues on a shared session (Postgres) keeps those sessions' commands on the
//! task: run inline, one would take a round trip of its own and split the batch
//! behind it; its dedicated sessions (a wait, then one grant) run them inline.
//!
//! - [`SessionPool`]: the client's sessions: picking the least busy shared session
//!   (opening more as the load grows), the idle dedicated sessions and the slots that
//!   bound them, and the count of open sessions of each kind.
//! - [`SessionTask`]: the loop of a session task (commands in order, timers first,
//!   the leases' upkeep, the end), over the backend's statements; [`TaskCore`] is
//!   what every such task keeps beside its connection.
//! - [`Leases`]: a session task's held leases: their client-enforced TTL deadlines,
//!   the session's proof of life and every lease's validity pushed from it, the
//!   release deferred after a process pause, and [`Leases::trip`], one statement timed
//!   so that a slow reply marks every lease suspect.
//! - [`contend`]: a try, then waits and tries until a grant or the deadline.
//! - [`Failure`], [`Granted`], [`Seat`], [`Reply`]: what a command answers.
//!
//! What stays in the backend: its connection and statements, its command type and
//! how a batch of them runs, how a wait is abandoned on the server, and the error
//! classification (passed to [`Leases::trip`] as a function).

mod contend;
mod handle;
mod leases;
mod pool;
mod source;
mod task;
mod timing;
mod trip;

pub use contend::contend;
pub use handle::{Failure, Granted, Kind, LeaseCommand, Reply, Seat, SessionHandle};
pub use leases::{Extension, Held, Leases, Upkeep, PAUSED_LATENESS, PAUSE_GRACE};
pub use pool::{locked, SessionPool};
pub use source::{
    ask, compensate, dedicated_session, extend, release, shared_session, to_holder, wait_session,
    SessionSource, SESSION_ATTEMPTS,
};
pub use task::{End, SessionTask, Statement, TaskCore};
pub use timing::{check_heartbeat, check_session_counts, Timing};
pub use trip::Trip;
