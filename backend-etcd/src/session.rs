//! The connection to etcd, the leases this client owns, and revoking them when the
//! runtime that serves them shuts down.
//!
//! Every contender (waiting or holding) lives under one of the client's shared leases
//! (one per TTL, see `lock::shared`), and every such lease is listed in [`LiveLeases`]
//! from before it is granted until it is revoked. A drop deletes keys and an idle lease
//! is revoked in a background task ([`distlock_api::backend::spawn_cleanup`]); but
//! when the runtime shuts down (a program returning from `main` while an acquire waits,
//! say), tokio drops those tasks unrun and closes the connection, and etcd, unlike
//! ZooKeeper, does not end leases with connections: the keys would stay until their
//! TTL, and a dead waiter would hold up the waiters behind it for that long. A task
//! spawned at connect notices the shutdown (the runtime drops it unfinished) and
//! revokes every lease still listed from a fresh connection on a thread of its own,
//! within [`REVOKE_PATIENCE`].

use std::collections::HashSet;
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::Duration;

use distlock_api::connect_retry::retry_connect;
use distlock_api::LockError;
use etcd_client::{Client, ConnectOptions, GetOptions};
use tokio::sync::oneshot;

use crate::config::{EtcdConfig, EtcdUrl};
use crate::error::{at_servers, connect_refused, sent, within};
use crate::ETCD_BACKEND;

/// How long a runtime shutdown may wait for this client's leases to be revoked.
pub(crate) const REVOKE_PATIENCE: Duration = Duration::from_secs(1);

/// The etcd leases this client has granted (or is granting) and not yet revoked.
#[derive(Debug, Default)]
pub(crate) struct LiveLeases(Mutex<HashSet<i64>>);

impl LiveLeases {
    pub(crate) fn add(&self, id: i64) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id);
    }

    pub(crate) fn remove(&self, id: i64) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
    }

    fn snapshot(&self) -> Vec<i64> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .copied()
            .collect()
    }
}

/// A connected client.
pub(crate) struct Session {
    pub(crate) client: Client,
    /// `h1:p1,h2:p2`, for error messages.
    pub(crate) hosts: String,
    pub(crate) live: Arc<LiveLeases>,
    /// Dropped with the session: stands the shutdown task down.
    _alive: oneshot::Sender<()>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("hosts", &self.hosts)
            .field("live_leases", &self.live.snapshot().len())
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Connects (authenticating when the URL has credentials) and checks that etcd
    /// answers a read of the prefix, each within its timeout.
    pub(crate) async fn connect(url: &EtcdUrl, config: &EtcdConfig) -> Result<Session, LockError> {
        let hosts = url.hosts();
        let options = connect_options(url, config)?;
        let uris = url.uris();
        let tls = url.tls.is_some();
        let client = retry_connect(
            config.connect_timeout,
            |deadline| {
                let (uris, options, prefix, hosts) = (
                    uris.clone(),
                    options.clone(),
                    url.prefix.clone(),
                    hosts.as_str(),
                );
                async move {
                    let client =
                        within(config.connect_timeout, Client::connect(uris, Some(options)))
                            .await
                            .map_err(|fail| connect_refused(hosts, tls, fail))?;
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    sent(config.request_timeout.min(left), || {
                        let (mut probe, prefix) = (client.kv_client(), prefix.clone());
                        async move {
                            probe
                                .get(
                                    prefix,
                                    Some(GetOptions::new().with_limit(1).with_keys_only()),
                                )
                                .await
                        }
                    })
                    .await
                    .map_err(|fail| connect_refused(hosts, tls, fail))?;
                    Ok(client)
                }
            },
            |last| {
                last.unwrap_or_else(|| {
                    at_servers(
                        &hosts,
                        LockError::connection(
                            ETCD_BACKEND,
                            format!(
                                "no connection within the connect timeout of {} ms",
                                config.connect_timeout.as_millis()
                            ),
                        ),
                    )
                })
            },
        )
        .await?;
        let live = Arc::new(LiveLeases::default());
        let (alive, dropped) = oneshot::channel();
        let revoker = RevokeOnShutdown {
            uris,
            options,
            live: live.clone(),
            armed: true,
        };
        tokio::spawn(async move {
            let mut revoker = revoker;
            // Resolves when the session is dropped; the runtime still runs then.
            let _ = dropped.await;
            revoker.stand_down();
        });
        Ok(Session {
            client,
            hosts,
            live,
            _alive: alive,
        })
    }
}

/// The options every connection of a client uses.
fn connect_options(url: &EtcdUrl, config: &EtcdConfig) -> Result<ConnectOptions, LockError> {
    // No per-request timeout here: it would cut watch and keep-alive streams too.
    // Each request is bounded by `within` instead.
    let mut options = ConnectOptions::new().with_connect_timeout(config.connect_timeout);
    if let Some((user, password)) = &url.credentials {
        options = options.with_user(user.clone(), password.clone());
    }
    if let Some(files) = &url.tls {
        options = tls_options(options, url, files)?;
    }
    Ok(options)
}

#[cfg(feature = "tls")]
fn tls_options(
    options: ConnectOptions,
    url: &EtcdUrl,
    files: &crate::config::TlsFiles,
) -> Result<ConnectOptions, LockError> {
    use etcd_client::{Certificate, Identity, TlsOptions};
    let read = |path: &std::path::Path, what: &str| {
        std::fs::read(path).map_err(|e| {
            LockError::config(
                ETCD_BACKEND,
                format!("cannot read the {what} file {}: {e}", path.display()),
            )
        })
    };
    let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(read(&files.ca, "CA")?));
    if let (Some(cert), Some(key)) = (&files.cert, &files.key) {
        tls = tls.identity(Identity::from_pem(
            read(cert, "client certificate")?,
            read(key, "client key")?,
        ));
    }
    if let Some((host, _)) = url.endpoints.first() {
        tls = tls.domain_name(host.clone());
    }
    Ok(options.with_tls(tls))
}

#[cfg(not(feature = "tls"))]
fn tls_options(
    _options: ConnectOptions,
    _url: &EtcdUrl,
    _files: &crate::config::TlsFiles,
) -> Result<ConnectOptions, LockError> {
    Err(LockError::config(
        ETCD_BACKEND,
        "etcd+tls:// URLs need the `tls` feature of distlock-etcd (`etcd-tls` of distlock)",
    ))
}

/// Dropped with `armed` set: the runtime is shutting down with the session alive.
struct RevokeOnShutdown {
    uris: Vec<String>,
    options: ConnectOptions,
    live: Arc<LiveLeases>,
    armed: bool,
}

impl RevokeOnShutdown {
    /// The session ended while the runtime runs: nothing to revoke on its behalf.
    fn stand_down(&mut self) {
        self.armed = false;
    }
}

impl Drop for RevokeOnShutdown {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let leases = self.live.snapshot();
        if leases.is_empty() {
            return;
        }
        let (uris, options) = (self.uris.clone(), self.options.clone());
        let (done, finished) = mpsc::channel();
        // A thread of its own: the runtime this runs on is going away.
        let spawned = std::thread::Builder::new()
            .name("distlock-etcd-revoke".into())
            .spawn(move || {
                let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                runtime.block_on(async {
                    let _ = tokio::time::timeout(REVOKE_PATIENCE, async {
                        let Ok(mut client) = Client::connect(uris, Some(options)).await else {
                            return;
                        };
                        for id in leases {
                            let _ = client.lease_revoke(id).await;
                        }
                    })
                    .await;
                });
                let _ = done.send(());
            });
        if spawned.is_ok() {
            let _ = finished.recv_timeout(REVOKE_PATIENCE + Duration::from_millis(200));
        }
    }
}
