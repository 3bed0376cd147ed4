//! A conformance harness over a real PostgreSQL server, started for the test or shared
//! by every test of the binary, with each client behind its own fault proxy so it can
//! be cut off like a crashed host.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::LockError;
use distlock_conformance::{Client, ClientFaults, Harness, UrlConnector};
use distlock_postgres::{PostgresConfig, PostgresLock};
use distlock_test_servers::FaultProxy;
use distlock_test_servers::{shared_server, PostgresServer, PostgresServerOptions};
use sqlx::{Connection, PgConnection};
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore};

/// At most this many test servers run at once in one test binary: each is a whole
/// PostgreSQL cluster, and timing-sensitive scenarios share two cores with them.
const SERVERS_AT_ONCE: usize = 3;

/// A permit to run one more test server in this test binary.
pub fn server_slots() -> Arc<Semaphore> {
    static SLOTS: OnceLock<Arc<Semaphore>> = OnceLock::new();
    SLOTS
        .get_or_init(|| Arc::new(Semaphore::new(SERVERS_AT_ONCE)))
        .clone()
}

/// The client settings of the tests: short timeouts, so the crash scenarios are quick.
pub fn test_config() -> PostgresConfig {
    let mut config = PostgresConfig::default();
    config.session_timeout = Duration::from_secs(2);
    config.request_timeout = Duration::from_secs(2);
    config.dead_peer_timeout = Duration::from_secs(2);
    config
}

/// A throwaway PostgreSQL server and the clients the tests make of it.
pub struct PgHarness {
    /// The server when the harness owns it (`None` on the binary's shared server).
    server: Option<Mutex<PostgresServer>>,
    pub port: u16,
    pub config: PostgresConfig,
    /// Every client's proxy, kept for the harness's life: scenarios keep a client's
    /// lock but drop its fault hooks.
    proxies: std::sync::Mutex<Vec<FaultProxy>>,
    /// Whether `Harness::client` gives clients fault hooks (behind proxies).
    faults: bool,
    _slot: Option<OwnedSemaphorePermit>,
}

/// The server settings every harness starts with; `start_with` adds to them.
const SETTINGS: [(&str, &str); 1] = [("max_connections", "400")];

fn cannot_start(e: impl std::fmt::Display) -> ! {
    panic!("could not start PostgreSQL (run scripts/test.sh, which installs it): {e}")
}

/// Starts a server with `settings` (`-c name=value`); a server that cannot start fails
/// the test.
pub async fn start_with(settings: &[(&str, &str)]) -> PgHarness {
    let slot = server_slots()
        .acquire_owned()
        .await
        .expect("the server slots are never closed");
    let mut config = PostgresServerOptions::default();
    config.settings = SETTINGS
        .iter()
        .chain(settings)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let server = PostgresServer::start_with(config)
        .await
        .unwrap_or_else(|e| cannot_start(e));
    let port = server.port();
    PgHarness {
        server: Some(Mutex::new(server)),
        port,
        config: test_config(),
        proxies: std::sync::Mutex::new(Vec::new()),
        faults: true,
        _slot: Some(slot),
    }
}

/// A server of the test's own, for tests that kill, pause or reconfigure it.
pub async fn start() -> PgHarness {
    start_with(&[]).await
}

/// The port of one server (the settings of [`start`]) shared by every test of this
/// binary: started on first use, stopped when the test process exits. A cluster's
/// `initdb` and start take seconds, most of a short test. For tests that neither
/// stop nor pause it, and that use keys of their own.
pub fn shared_port() -> u16 {
    static PORT: OnceLock<u16> = OnceLock::new();
    *PORT.get_or_init(|| {
        let mut options = PostgresServerOptions::default();
        for (name, value) in SETTINGS {
            options = options.with_setting(name, value);
        }
        shared_server(PostgresServer::start_with(options), |server| match server {
            Ok(server) => server.port(),
            Err(e) => cannot_start(e),
        })
    })
}

/// A harness on the binary's shared server (see [`shared_port`]).
pub fn shared() -> PgHarness {
    PgHarness {
        server: None,
        port: shared_port(),
        config: test_config(),
        proxies: std::sync::Mutex::new(Vec::new()),
        faults: true,
        _slot: None,
    }
}

/// The kit's harness: short session timeouts, crashable clients, on the shared server.
pub async fn harness() -> Arc<dyn Harness> {
    Arc::new(shared())
}

/// What `distlock conformance --backend postgres://…` runs: default settings, plain
/// clients without fault hooks, on the shared server.
pub async fn default_harness() -> Arc<dyn Harness> {
    let mut h = shared();
    h.config = PostgresConfig::default();
    h.faults = false;
    Arc::new(h)
}

pub fn url_for(port: u16) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/postgres")
}

impl PgHarness {
    /// The server this harness started (for its fault controls).
    ///
    /// # Panics
    ///
    /// On a harness of the shared server, which no test may stop or pause.
    pub fn server(&self) -> &Mutex<PostgresServer> {
        self.server
            .as_ref()
            .expect("a harness of the shared server has no server handle")
    }

    /// The direct URL (no proxy).
    pub fn url(&self) -> String {
        url_for(self.port)
    }

    /// A client with the test settings, straight to the server.
    pub async fn client(&self) -> PostgresLock {
        PostgresLock::connect_with(&self.url(), self.config.clone())
            .await
            .expect("connects")
    }

    /// A client with the test settings whose sessions show as `name` in
    /// `pg_stat_activity.application_name`.
    pub async fn named_client(&self, name: &str) -> PostgresLock {
        self.named_client_with(name, self.config.clone()).await
    }

    /// As [`PgHarness::named_client`], with `config`.
    pub async fn named_client_with(&self, name: &str, config: PostgresConfig) -> PostgresLock {
        let url = format!("{}?application_name={name}", self.url());
        PostgresLock::connect_with(&url, config)
            .await
            .expect("connects")
    }

    /// A client whose every session goes through its own proxy, and the proxy.
    pub async fn proxied_client(&self) -> (PostgresLock, FaultProxy) {
        let upstream = SocketAddr::from(([127, 0, 0, 1], self.port));
        let proxy = FaultProxy::start(upstream)
            .await
            .expect("fault proxy starts");
        let url = url_for(proxy.local_addr().port());
        let lock = PostgresLock::connect_with(&url, self.config.clone())
            .await
            .expect("connects through the proxy");
        (lock, proxy)
    }

    /// A plain connection, for inspecting `pg_locks` and `pg_stat_activity`.
    pub async fn raw(&self) -> PgConnection {
        PgConnection::connect(&self.url())
            .await
            .expect("raw connection")
    }
}

/// Cuts a client off like a crashed host: its connections stay open but silent (no
/// reset reaches the server), and it cannot reconnect. The server frees its locks
/// when its sessions' `idle_session_timeout` runs out. (A crashed process would close
/// its connections and free them at once.)
struct SilentCrash(FaultProxy);

#[async_trait]
impl ClientFaults for SilentCrash {
    async fn crash(&self) -> Result<(), LockError> {
        self.0.refuse_new(true);
        self.0.blackhole();
        Ok(())
    }
}

#[async_trait]
impl Harness for PgHarness {
    fn name(&self) -> String {
        self.url()
    }

    async fn client(&self) -> Result<Client, LockError> {
        if !self.faults {
            let lock = PostgresLock::connect_with(&self.url(), self.config.clone()).await?;
            return Ok(Client::new(lock.client()));
        }
        let (lock, proxy) = self.proxied_client().await;
        if let Ok(mut kept) = self.proxies.lock() {
            kept.push(proxy.clone());
        }
        Ok(Client::new(lock.client()).with_faults(Arc::new(SilentCrash(proxy))))
    }

    fn crash_bound(&self, ttl: Duration) -> Duration {
        ttl.max(self.config.dead_holder_bound()) + self.config.heartbeat()
    }

    fn url_connector(&self) -> Option<UrlConnector> {
        let config = self.config.clone();
        Some(Arc::new(move |url: String| {
            let config = config.clone();
            Box::pin(async move { Ok(PostgresLock::connect_with(&url, config).await?.client()) })
        }))
    }
}

/// The `pg_locks` ids (`classid`, `objid`) of a `bigint` advisory key.
pub fn lock_ids(hash: i64) -> (i64, i64) {
    let bits = hash as u64;
    ((bits >> 32) as i64, (bits & 0xffff_ffff) as i64)
}

/// Every `(application_name, granted)` entry of `pg_locks` for the advisory key `hash`.
pub async fn lock_entries(raw: &mut PgConnection, hash: i64) -> Vec<(String, bool)> {
    let (high, low) = lock_ids(hash);
    sqlx::query_as(
        "SELECT coalesce(a.application_name, ''), l.granted FROM pg_locks l \
         LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND l.objsubid = 1 \
         AND l.classid = $1::int8::oid AND l.objid = $2::int8::oid ORDER BY l.granted DESC",
    )
    .bind(high)
    .bind(low)
    .fetch_all(raw)
    .await
    .expect("pg_locks query")
}

/// Waits (bounded) until `check` holds on the `pg_locks` entries of `hash`, and
/// returns them; panics with `what` after `limit`.
pub async fn wait_for_entries(
    raw: &mut PgConnection,
    hash: i64,
    limit: Duration,
    what: &str,
    check: impl Fn(&[(String, bool)]) -> bool,
) -> Vec<(String, bool)> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let entries = lock_entries(raw, hash).await;
        if check(&entries) {
            return entries;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("{what}: not seen within {limit:?}; pg_locks shows {entries:?}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The `pg_locks` view of the server only changes through other sessions, so the
/// tests observe it by polling; this is that poll's period.
pub const POLL: Duration = Duration::from_millis(10);
