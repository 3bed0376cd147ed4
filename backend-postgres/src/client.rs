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
use crate::mailbox::Command;
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
    /// Key hash → owner, for every key granted or being granted on a shared session
    /// of this client: a second grant of the same key would be re-entrant.
    pub shared_keys: Mutex<HashMap<i64, u128>>,
    /// The shared and dedicated sessions, and which holds which lease.
    pub sessions: Arc<SessionPool<Command>>,
    /// Set once the election table is known to exist (see `election::ready`).
    pub election_table: OnceCell<()>,
}

impl ClientState {
    pub(crate) fn forget_shared_key(&self, hash: i64, owner: u128) {
        let mut shared_keys = locked(&self.shared_keys);
        if shared_keys.get(&hash) == Some(&owner) {
            shared_keys.remove(&hash);
        }
    }

    /// Reserves the key for a grant on a shared session; `false` if this client holds
    /// it, or is taking it, already.
    pub(crate) fn reserve_shared_key(&self, hash: i64, owner: u128) -> bool {
        let mut shared_keys = locked(&self.shared_keys);
        if shared_keys.contains_key(&hash) {
            return false;
        }
        shared_keys.insert(hash, owner);
        true
    }
}
