//! The state of one Postgres lock client, shared by its handles and its session
//! tasks: the settings sessions open with, which session holds which lease, and its
//! sessions.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub(crate) use distlock_api::backend::sessions::locked;
use distlock_api::backend::sessions::SessionPool;
use distlock_api::LockError;
use sqlx::postgres::PgConnectOptions;
use tokio::sync::OnceCell;

use crate::config::{server_address, PostgresConfig};
use crate::mailbox::{Command, SessionHandle};
use crate::sql::Statements;
use crate::POSTGRES_BACKEND;

/// What every session of a client is opened and run with.
#[derive(Debug)]
pub(crate) struct Settings {
    pub config: PostgresConfig,
    pub connect: PgConnectOptions,
    pub sql: Statements,
    /// `SET` statements every new session runs first, when something between the
    /// client and the server (a session pooler) may drop the start-up settings.
    pub restate: Option<String>,
}

impl Settings {
    /// A connection error with a message of ours, at the server's address.
    pub(crate) fn connection_error(&self, why: impl Into<String>) -> LockError {
        LockError::connection_at(POSTGRES_BACKEND, server_address(&self.connect), why.into())
    }
}

/// The state of a client, shared by a client's handles and its session tasks.
pub(crate) struct ClientState {
    pub settings: Arc<Settings>,
    pub registry: Mutex<Registry>,
    /// The shared and dedicated sessions.
    pub sessions: Arc<SessionPool<Command>>,
    /// Set once the election table is known to exist (see `election::ready`).
    pub election_table: OnceCell<()>,
}

#[derive(Default)]
pub(crate) struct Registry {
    /// Owner token of every held lease → the session holding it.
    routes: HashMap<u128, Arc<SessionHandle>>,
    /// Key hash → owner, for every key granted or being granted on a shared session
    /// of this client: a second grant of the same key would be re-entrant.
    shared_keys: HashMap<i64, u128>,
}

impl ClientState {
    pub(crate) fn forget_shared_key(&self, hash: i64, owner: u128) {
        let mut registry = locked(&self.registry);
        if registry.shared_keys.get(&hash) == Some(&owner) {
            registry.shared_keys.remove(&hash);
        }
    }

    pub(crate) fn add_route(&self, owner: u128, session: Arc<SessionHandle>) {
        locked(&self.registry).routes.insert(owner, session);
    }

    pub(crate) fn remove_route(&self, owner: u128, hash: i64) {
        let mut registry = locked(&self.registry);
        registry.routes.remove(&owner);
        if registry.shared_keys.get(&hash) == Some(&owner) {
            registry.shared_keys.remove(&hash);
        }
    }

    pub(crate) fn route(&self, owner: u128) -> Option<Arc<SessionHandle>> {
        locked(&self.registry).routes.get(&owner).cloned()
    }

    /// Reserves the key for a grant on a shared session; `false` if this client holds
    /// it, or is taking it, already.
    pub(crate) fn reserve_shared_key(&self, hash: i64, owner: u128) -> bool {
        let mut registry = locked(&self.registry);
        if registry.shared_keys.contains_key(&hash) {
            return false;
        }
        registry.shared_keys.insert(hash, owner);
        true
    }
}
