//! The state of one MySQL lock client, shared by its handles and its session tasks:
//! the settings sessions open with, which session holds which lease, and the pools
//! of shared and dedicated sessions.

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use distlock_api::LockError;
use sqlx::mysql::MySqlConnectOptions;
use tokio::sync::{Notify, Semaphore};

use crate::config::{server_address, MySqlConfig};
use crate::mailbox::{Kind, SessionHandle};
use crate::MYSQL_BACKEND;

/// What every session of a client is opened and run with.
#[derive(Debug)]
pub(crate) struct Settings {
    pub config: MySqlConfig,
    pub connect: MySqlConnectOptions,
    /// `host:port`, for messages.
    pub address: String,
}

impl Settings {
    pub(crate) fn new(config: MySqlConfig, connect: MySqlConnectOptions) -> Self {
        let address = server_address(&connect);
        Settings {
            config,
            connect,
            address,
        }
    }

    /// A connection error with a message of ours, at the server's address.
    pub(crate) fn connection_error(&self, why: impl Into<String>) -> LockError {
        LockError::connection_at(MYSQL_BACKEND, &self.address, why.into())
    }
}

/// The state of a client, shared by a client's handles and its session tasks.
pub(crate) struct ClientState {
    pub settings: Arc<Settings>,
    /// Owner token of every held lease → the session holding it.
    pub routes: Mutex<HashMap<u128, Arc<SessionHandle>>>,
    pub pool: Mutex<Pool>,
    /// Signalled when a shared session is added or an opening attempt ends.
    pub pool_changed: Notify,
    /// Dedicated sessions holding nothing, ready for the next wait.
    pub idle_waits: Mutex<Vec<Arc<SessionHandle>>>,
    /// One permit per dedicated session in use (waiting, or holding what it waited for).
    pub wait_slots: Arc<Semaphore>,
    /// Open sessions of each kind, counted by the session tasks.
    pub open_shared: AtomicUsize,
    pub open_waits: AtomicUsize,
}

#[derive(Default)]
pub(crate) struct Pool {
    pub sessions: Vec<Arc<SessionHandle>>,
    /// Shared sessions being opened.
    pub opening: usize,
}

pub(crate) fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section is a few map operations that cannot panic half-way.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ClientState {
    /// The count of open sessions of `kind`, kept by the session tasks.
    pub(crate) fn open_sessions(&self, kind: Kind) -> &AtomicUsize {
        match kind {
            Kind::Shared => &self.open_shared,
            Kind::Wait => &self.open_waits,
        }
    }

    pub(crate) fn add_route(&self, owner: u128, session: Arc<SessionHandle>) {
        locked(&self.routes).insert(owner, session);
    }

    pub(crate) fn remove_route(&self, owner: u128) {
        locked(&self.routes).remove(&owner);
    }

    pub(crate) fn route(&self, owner: u128) -> Option<Arc<SessionHandle>> {
        locked(&self.routes).get(&owner).cloned()
    }

    pub(crate) fn return_wait_session(&self, session: Arc<SessionHandle>) {
        let mut idle = locked(&self.idle_waits);
        if session.is_alive() && !idle.iter().any(|s| Arc::ptr_eq(s, &session)) {
            idle.push(session);
        }
    }

    pub(crate) fn drop_session(&self, session: &Arc<SessionHandle>) {
        locked(&self.idle_waits).retain(|s| !Arc::ptr_eq(s, session));
        locked(&self.pool)
            .sessions
            .retain(|s| !Arc::ptr_eq(s, session));
        self.pool_changed.notify_waiters();
    }
}
