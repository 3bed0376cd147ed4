//! Closing a session on the server when the runtime that serves it shuts down.
//!
//! The client's connection is a task on the runtime that opened the session. While
//! that runtime runs, dropping the last handle of a session sends `closeSession`, and
//! the background removal of an abandoned contender node runs to its end. When the
//! runtime shuts down (a program returning from `main` while an acquire waits, say),
//! tokio drops those tasks at their next await: without this module the server would
//! keep the session, and with it every contender node and lock of this process, until
//! the session timeout, so a dead waiter would hold up the queue behind it for that
//! long. A task spawned with the session notices the shutdown (the runtime drops it
//! unfinished) and closes the session from a fresh connection, within
//! [`CLOSE_PATIENCE`]: its ephemeral nodes go at once, as they go when a process's
//! Postgres connection closes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use tokio::sync::oneshot;
use zookeeper_client as zk;

use crate::security::Identity;

/// How long a runtime shutdown may wait for a session to be closed on the server.
pub(crate) const CLOSE_PATIENCE: Duration = Duration::from_secs(1);

/// Held by a live session; dropping it while the runtime runs stands the watch down
/// (the client then closes the session itself).
#[derive(Debug)]
pub(crate) struct ShutdownWatch {
    _session_alive: oneshot::Sender<()>,
    closed: Arc<AtomicBool>,
}

impl ShutdownWatch {
    /// Spawns, on the current runtime, the task that closes the session `client`
    /// serves (through `hosts`) if that runtime shuts down while the session lives,
    /// calling `lose_leases` first: the locks held on the session are gone once it is
    /// closed, and their guards must say so.
    pub(crate) fn spawn(
        client: &zk::Client,
        hosts: &str,
        identity: &Identity,
        lose_leases: impl FnOnce() + Send + 'static,
    ) -> ShutdownWatch {
        let (session_alive, session_dropped) = oneshot::channel();
        let closed = Arc::new(AtomicBool::new(false));
        let closer = CloseOnShutdown {
            hosts: hosts.to_owned(),
            identity: identity.clone(),
            session: Some(client.session().clone()),
            timeout: client.session_timeout(),
            state: client.state_watcher(),
            closed: closed.clone(),
            lose_leases: Some(Box::new(lose_leases)),
        };
        tokio::spawn(async move {
            // Resolves when the session is dropped; the runtime still runs then.
            let _ = session_dropped.await;
            closer.stand_down();
        });
        ShutdownWatch {
            _session_alive: session_alive,
            closed,
        }
    }

    /// The session was closed because its runtime shut down: its client cannot be
    /// used any more.
    pub(crate) fn closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }
}

/// Dropped with its session still set: the runtime is shutting down.
struct CloseOnShutdown {
    hosts: String,
    /// The same credentials and TLS as the session's own connections.
    identity: Identity,
    session: Option<zk::SessionInfo>,
    timeout: Duration,
    state: zk::StateWatcher,
    closed: Arc<AtomicBool>,
    lose_leases: Option<Box<dyn FnOnce() + Send>>,
}

impl CloseOnShutdown {
    /// The session was dropped while the runtime ran: nothing to do.
    fn stand_down(mut self) {
        self.session = None;
    }
}

impl Drop for CloseOnShutdown {
    fn drop(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        self.closed.store(true, Ordering::Relaxed);
        if let Some(lose_leases) = self.lose_leases.take() {
            lose_leases();
        }
        if self.state.peek_state().is_terminated() {
            return;
        }
        let (hosts, timeout) = (std::mem::take(&mut self.hosts), self.timeout);
        let identity = self.identity.clone();
        let (done, finished) = mpsc::channel();
        // The runtime being shut down runs nothing more, and this thread may be one of
        // its workers, which cannot start another runtime: close from a thread of our
        // own, and wait for it at most `CLOSE_PATIENCE`.
        let closing = std::thread::Builder::new()
            .name("distlock-zk-close".into())
            .spawn(move || {
                let result = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime.block_on(async {
                        tokio::time::timeout(
                            CLOSE_PATIENCE,
                            close(&hosts, &identity, session, timeout),
                        )
                        .await
                        .unwrap_or(Err(zk::Error::Timeout))
                    }),
                    Err(e) => Err(zk::Error::UnexpectedError(e.to_string())),
                };
                let _ = done.send(result);
            });
        let result = match closing {
            Ok(_) => finished
                .recv_timeout(CLOSE_PATIENCE + Duration::from_millis(100))
                .unwrap_or(Err(zk::Error::Timeout)),
            Err(e) => Err(zk::Error::UnexpectedError(e.to_string())),
        };
        if let Err(error) = result {
            tracing::warn!(%error, "could not close the ZooKeeper session as its runtime shut down; its nodes live until it expires");
        }
    }
}

/// Resumes `session` on a new connection and closes it; one the server already expired
/// is as good as closed.
async fn close(
    hosts: &str,
    identity: &Identity,
    session: zk::SessionInfo,
    timeout: Duration,
) -> Result<(), zk::Error> {
    let connector = zk::Client::connector()
        .with_session(session)
        .with_session_timeout(timeout)
        .with_fail_eagerly();
    let connecting = identity.connect(connector, hosts);
    let client = match connecting.await {
        Ok(client) => client,
        Err(zk::Error::SessionExpired) => return Ok(()),
        Err(error) => return Err(error),
    };
    let mut state = client.state_watcher();
    // The last handle: the client sends `closeSession` and ends once it is answered.
    drop(client);
    while !state.peek_state().is_terminated() {
        state.changed().await;
    }
    Ok(())
}
