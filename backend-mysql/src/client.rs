//! The state of one MySQL lock client, shared by its handles and its session tasks:
//! the settings sessions open with, which session holds which lease, and its
//! sessions.

use std::sync::Arc;

use distlock_api::backend::sessions::SessionPool;
use distlock_api::LockError;
use sqlx::mysql::MySqlConnectOptions;

use crate::config::{server_address, MySqlConfig};
use crate::mailbox::Command;
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
    /// The shared and dedicated sessions, and which holds which lease.
    pub sessions: Arc<SessionPool<Command>>,
}
