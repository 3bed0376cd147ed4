//! The read-write lock: one advisory lock per key, taken shared by readers and
//! exclusive by writers.
//!
//! Writer preference comes from the server's lock manager: a lock request that
//! conflicts with a request already waiting in the lock's queue waits behind it (and a
//! try is refused), even when it is compatible with the current holders. So once a
//! writer waits in the queue (`pg_advisory_lock`), new readers' `pg_advisory_lock_shared`
//! queue behind it and their `pg_try_advisory_lock_shared` fail; the writer is granted
//! when the readers already inside leave, and the readers queued behind it are granted
//! together after it. A writer that gives up leaves the queue (its wait statement ends,
//! or its session is closed), which lets the readers behind it in at once.

use distlock_api::{LockKey, RwMode};

use crate::keys::rw_advisory_key;
use crate::lock::Plan;
use crate::mailbox::Probe;

/// How a side of the lock is taken. A write goes as the mutex's lock does (a try on a
/// shared session, then a wait in the server's queue on a dedicated one). A read is
/// taken and held on a dedicated session of the client (one of
/// [`crate::PostgresConfig::wait_sessions`]): advisory locks are re-entrant per
/// session, and a session's own shared lock would not exclude its own exclusive one.
pub(crate) fn plan(mode: RwMode) -> Plan {
    match mode {
        RwMode::Read => Plan::Shared,
        RwMode::Write => Plan::Exclusive,
    }
}

/// The advisory key of `key`'s read-write lock.
pub(crate) fn hash(key: &LockKey) -> i64 {
    rw_advisory_key(key)
}

/// What finds the other holders of `key`'s read-write lock.
pub(crate) fn probe(key: &LockKey) -> Probe {
    Probe::key(rw_advisory_key(key))
}
