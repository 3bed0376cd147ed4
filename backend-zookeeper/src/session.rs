//! ZooKeeper sessions, the registry of leases held on them, and the per-session task
//! that turns session events into lease states.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use distlock_api::backend::prelude::*;
use distlock_api::connect_retry::{retry_connect, Refused};
use distlock_api::{InWords, LeaseMonitor, LockError, OwnerToken};
use tokio::time::{sleep_until, Instant};
use zookeeper_client as zk;

use crate::config::{ZooKeeperConfig, MIN_SESSION_TIMEOUT};
use crate::probe::{probe_all, Lasting, PROBE_PATIENCE};
use crate::security::{node_acls, Identity};
use crate::shutdown::ShutdownWatch;
use crate::ZOOKEEPER_BACKEND;

/// One ZooKeeper session: the lease of every lock taken through it.
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) client: zk::Client,
    pub(crate) id: i64,
    /// The timeout the server negotiated.
    pub(crate) timeout: Duration,
    /// Closes the session on the server should its runtime shut down first.
    shutdown: ShutdownWatch,
    /// The runtime the session's connection runs on, where its background work goes.
    pub(crate) runtime: tokio::runtime::Handle,
    /// The ACL of the nodes created through this session.
    pub(crate) acls: zk::Acls<'static>,
}

impl Session {
    /// Establishes a new session (never resumes an old one).
    ///
    /// Connection errors do not name `hosts`: the caller adds them to every error.
    /// Should the runtime shut down while the session lives, the session's leases in
    /// `registry` are marked lost and the session is closed on the server.
    pub(crate) async fn open(
        hosts: &str,
        config: &ZooKeeperConfig,
        identity: &Identity,
        registry: &Arc<Registry>,
    ) -> Result<Session, LockError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            LockError::config(
                ZOOKEEPER_BACKEND,
                "the ZooKeeper backend runs on a Tokio runtime; none is running here",
            )
        })?;
        let limit = config.connect_timeout.unwrap_or(config.session_timeout);
        let tls = identity.uses_tls();
        // One eager pass over the servers per attempt; a pass that no server answered
        // is explained by probing them, and retried unless every refusal is lasting.
        let client = retry_connect(
            limit,
            |deadline| async move {
                let connector = zk::Client::connector()
                    .with_session_timeout(config.session_timeout)
                    .with_fail_eagerly();
                // Leave time before the deadline to find out why a pass hangs.
                let reserve = (PROBE_PATIENCE * 2)
                    .min(deadline.saturating_duration_since(Instant::now()) / 2);
                let cutoff = deadline.checked_sub(reserve).unwrap_or(deadline);
                let error =
                    match tokio::time::timeout_at(cutoff, identity.connect(connector, hosts)).await
                    {
                        Ok(Ok(client)) => return Ok(client),
                        Ok(Err(error)) => Some(error),
                        Err(_) => None,
                    };
                Err(match error {
                    Some(zk::Error::BadArguments(why)) => Refused::Lasting(LockError::config(
                        ZOOKEEPER_BACKEND,
                        format!("bad ZooKeeper connect string {hosts:?}: {why}"),
                    )),
                    None
                    | Some(zk::Error::NoHosts | zk::Error::ConnectionLoss | zk::Error::Timeout) => {
                        let found = probe_all(hosts, tls, deadline).await;
                        match found.lasting {
                            // Config errors do not pass through `at_servers`: name them here.
                            Some(Lasting::NotZooKeeper) => Refused::Lasting(LockError::config(
                                ZOOKEEPER_BACKEND,
                                format!("ZooKeeper at {hosts}: {}", found.words),
                            )),
                            Some(Lasting::TlsMismatch) => Refused::Lasting(LockError::connection(
                                ZOOKEEPER_BACKEND,
                                found.words,
                            )),
                            None => Refused::Passing(LockError::connection(
                                ZOOKEEPER_BACKEND,
                                found.words,
                            )),
                        }
                    }
                    Some(error @ (zk::Error::AuthFailed | zk::Error::NoAuth)) => {
                        Refused::Lasting(LockError::Config {
                            backend: ZOOKEEPER_BACKEND,
                            message: format!(
                                "ZooKeeper at {hosts}: the server refused the URL's \
                                 credentials (authentication failed)"
                            ),
                            source: Some(Box::new(error)),
                        })
                    }
                    Some(error) => Refused::Passing(LockError::connection(
                        ZOOKEEPER_BACKEND,
                        InWords::with_words(format!("cannot establish a session: {error}"), error),
                    )),
                })
            },
            |last| {
                let why = match &last {
                    Some(LockError::Connection { source, .. }) => format!(" ({source})"),
                    _ => String::new(),
                };
                LockError::connection(
                    ZOOKEEPER_BACKEND,
                    format!(
                        "no session established within the connect timeout of {} ms{why}",
                        limit.as_millis()
                    ),
                )
            },
        )
        .await?;
        let timeout = client.session_timeout();
        if timeout < MIN_SESSION_TIMEOUT {
            // Dropping the only handle closes the session on the server.
            return Err(LockError::config(
                ZOOKEEPER_BACKEND,
                format!(
                    "the ZooKeeper server at {hosts} granted a session timeout of {} ms, below \
                     the {} ms this client needs (raise the server's maxSessionTimeout)",
                    timeout.as_millis(),
                    MIN_SESSION_TIMEOUT.as_millis()
                ),
            ));
        }
        let id = client.session_id().0;
        let leases = Arc::downgrade(registry);
        let shutdown = ShutdownWatch::spawn(&client, hosts, identity, move || {
            if let Some(leases) = leases.upgrade() {
                leases.lose_session(id);
            }
        });
        Ok(Session {
            id,
            timeout,
            shutdown,
            runtime,
            client,
            acls: node_acls(identity.is_authenticated()),
        })
    }

    /// False once the session expired, was closed (also by its runtime shutting down)
    /// or failed authentication.
    pub(crate) fn is_alive(&self) -> bool {
        !self.shutdown.closed() && !self.client.state().is_terminated()
    }
}

/// One granted lock, as its client tracks it.
#[derive(Debug)]
pub(crate) struct Held {
    /// The contender node that holds the lock.
    pub(crate) path: String,
    pub(crate) session: Arc<Session>,
    /// The node's `czxid`: the lease's fencing token.
    pub(crate) fence: u64,
    pub(crate) monitor: LeaseMonitor,
}

/// The locks a client holds, by owner token.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    held: Mutex<HashMap<OwnerToken, Held>>,
}

impl Registry {
    fn held(&self) -> MutexGuard<'_, HashMap<OwnerToken, Held>> {
        // Every update is a single insert or remove: a panic cannot leave it half-done.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn insert(&self, owner: OwnerToken, held: Held) {
        self.held().insert(owner, held);
    }

    pub(crate) fn remove(&self, owner: OwnerToken) -> Option<Held> {
        self.held().remove(&owner)
    }

    /// Path, session and fence of a held lease.
    pub(crate) fn lookup(&self, owner: OwnerToken) -> Option<(String, Arc<Session>, u64)> {
        self.held()
            .get(&owner)
            .map(|h| (h.path.clone(), h.session.clone(), h.fence))
    }

    /// `owner`'s node at `path` is gone while still held: the lease is lost.
    pub(crate) fn lose(&self, owner: OwnerToken, path: &str) {
        let mut held = self.held();
        if held.get(&owner).is_some_and(|h| h.path == path) {
            if let Some(h) = held.remove(&owner) {
                tracing::warn!(path, "our lock node is gone while held; lock lost");
                h.monitor.mark_lost();
            }
        }
    }

    /// Owner, path and fence of every lease held on session `id`.
    fn held_on(&self, id: i64) -> Vec<(OwnerToken, String, u64)> {
        self.held()
            .iter()
            .filter(|(_, h)| h.session.id == id)
            .map(|(owner, h)| (*owner, h.path.clone(), h.fence))
            .collect()
    }

    fn suspect_session(&self, id: i64) {
        for h in self.held().values().filter(|h| h.session.id == id) {
            h.monitor.suspect();
        }
    }

    fn renew_session(&self, id: i64, valid_until: Instant) {
        for h in self.held().values().filter(|h| h.session.id == id) {
            h.monitor.renewed(valid_until);
        }
    }

    fn lose_session(&self, id: i64) {
        let mut held = self.held();
        let lost: Vec<OwnerToken> = held
            .iter()
            .filter(|(_, h)| h.session.id == id)
            .map(|(owner, _)| *owner)
            .collect();
        if !lost.is_empty() {
            tracing::warn!(
                session = format_args!("{id:#x}"),
                locks = lost.len(),
                "ZooKeeper session ended; its locks are lost"
            );
        }
        for owner in lost {
            if let Some(h) = held.remove(&owner) {
                h.monitor.mark_lost();
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.held().len()
    }
}

/// Follows `session` until it ends: a disconnect makes its leases suspect, expiry or
/// close makes them lost. While it holds leases, every third of the session timeout a
/// `sync` proves it alive and pushes their validity to `sent + timeout`, and a
/// pipelined multi-read of their nodes finds any that was deleted (lost).
pub(crate) fn spawn_watcher(session: &Arc<Session>, registry: &Arc<Registry>) {
    let states = session.client.state_watcher();
    tokio::spawn(watch(
        Arc::downgrade(session),
        Arc::downgrade(registry),
        states,
        session.id,
        session.timeout,
    ));
}

async fn watch(
    session: Weak<Session>,
    registry: Weak<Registry>,
    mut states: zk::StateWatcher,
    id: i64,
    timeout: Duration,
) {
    let period = (timeout / 3).max(Duration::from_millis(10));
    let mut next_beat = Instant::now() + period;
    loop {
        let changed = tokio::select! {
            state = states.changed() => Some(state),
            _ = sleep_until(next_beat) => None,
        };
        let Some(leases) = registry.upgrade() else {
            return;
        };
        match changed {
            Some(state) if state.is_terminated() => {
                leases.lose_session(id);
                return;
            }
            Some(zk::SessionState::Disconnected) => {
                leases.suspect_session(id);
                continue;
            }
            // Reconnected (beat now, to clear the suspicion), or time for a beat.
            _ => {}
        }
        next_beat = Instant::now() + period;
        let held = leases.held_on(id);
        drop(leases);
        if held.is_empty() {
            continue;
        }
        let Some(live) = session.upgrade() else {
            return;
        };
        let sent = Instant::now();
        let (synced, read) = beat(&live.client, &held, period).await;
        drop(live);
        let Some(leases) = registry.upgrade() else {
            return;
        };
        if let Some(results) = read {
            for ((owner, path, fence), result) in held.iter().zip(results) {
                let ours = match result {
                    zk::MultiReadResult::Data { stat, .. } => {
                        u64::try_from(stat.czxid) == Ok(*fence) && stat.ephemeral_owner == id
                    }
                    zk::MultiReadResult::Error { err } => err != zk::Error::NoNode,
                    _ => true,
                };
                if !ours {
                    leases.lose(*owner, path);
                }
            }
        }
        if let (true, Some(valid_until)) = (synced, sent.checked_add(timeout)) {
            leases.renew_session(id, valid_until);
        }
    }
}

/// One heartbeat: a `sync` (it goes through the leader, so its reply proves the session
/// was live there after it was sent, and the server cannot expire it before
/// `sent + timeout`), and right behind it a multi-read of the held nodes.
async fn beat(
    client: &zk::Client,
    held: &[(OwnerToken, String, u64)],
    limit: Duration,
) -> (bool, Option<Vec<zk::MultiReadResult>>) {
    let synced = client.sync("/");
    let mut reader = client.new_multi_reader();
    for (_, path, _) in held {
        if reader.add_get_data(path).is_err() {
            // Our own paths are valid; should one not be, skip the check this time.
            reader.abort();
            break;
        }
    }
    let read = reader.commit();
    match tokio::time::timeout(limit, async { tokio::join!(synced, read) }).await {
        Ok((synced, read)) => (
            synced.is_ok(),
            read.ok().filter(|results| results.len() == held.len()),
        ),
        Err(_) => (false, None),
    }
}
