//! The state of one MySQL lock client, shared by its handles and its session tasks:
//! the settings sessions open with, which session holds which lease, and its
//! sessions.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use distlock_api::backend::sessions::{locked, SessionPool};
use distlock_api::LockError;
use sqlx::mysql::MySqlConnectOptions;

use crate::config::{server_address, MySqlConfig};
use crate::mailbox::{Command, SessionHandle};
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
    /// The shared and dedicated sessions.
    pub sessions: Arc<SessionPool<Command>>,
}

impl ClientState {
    pub(crate) fn add_route(&self, owner: u128, session: Arc<SessionHandle>) {
        locked(&self.routes).insert(owner, session);
    }

    pub(crate) fn remove_route(&self, owner: u128) {
        locked(&self.routes).remove(&owner);
    }

    pub(crate) fn route(&self, owner: u128) -> Option<Arc<SessionHandle>> {
        locked(&self.routes).get(&owner).cloned()
    }
}
