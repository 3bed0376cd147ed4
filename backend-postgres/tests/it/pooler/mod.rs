//! A real PgBouncer (Debian's `pgbouncer`) in front of a throwaway PostgreSQL, for the
//! pooler tests: the transaction-pooling design's conformance and fault kits, the
//! session design's refusal of a transaction pooler, and its budget in a session pool.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::LockError;
use distlock_conformance::{Client, ClientFaults, Harness, UrlConnector};
use distlock_postgres::{PostgresConfig, PostgresXactLock};
use distlock_test_servers::{
    shared_server, FaultProxy, PgBouncerOptions, PgBouncerServer, PoolMode, PostgresServer,
    PostgresServerOptions, ServerError,
};

/// Server connections of the shared transaction-mode PgBouncer: the conformance
/// kit's scenarios hold and wait for dozens of locks at once, each on one.
pub const SHARED_POOL: u32 = 60;

pub fn cannot_start(e: ServerError) -> ! {
    panic!("could not start PostgreSQL or PgBouncer (run scripts/install-deps.sh): {e}")
}

/// The test settings: short timeouts, so the crash scenarios are quick.
pub fn test_config() -> PostgresConfig {
    let mut config = PostgresConfig::default();
    config.session_timeout = Duration::from_secs(2);
    config.request_timeout = Duration::from_secs(2);
    config.dead_peer_timeout = Duration::from_secs(2);
    // Connections of the lock pool: the kit's largest scenario holds 16 at once.
    config.wait_sessions = 24;
    config
}

/// A Postgres server with room for the pooler's connections.
pub async fn postgres() -> PostgresServer {
    PostgresServer::start_with(
        PostgresServerOptions::default().with_setting("max_connections", "300"),
    )
    .await
    .unwrap_or_else(|e| cannot_start(e))
}

/// A PgBouncer in `mode` with `pool_size` server connections, in front of `pg`.
pub async fn bouncer(pg: &PostgresServer, mode: PoolMode, pool_size: u32) -> PgBouncerServer {
    PgBouncerServer::start(
        pg.port(),
        PgBouncerOptions::new(mode).with_pool_size(pool_size),
    )
    .await
    .unwrap_or_else(|e| cannot_start(e))
}

/// `(pgbouncer port, postgres port)` of one transaction-mode PgBouncer and its server,
/// shared by every test of the binary: started on first use, stopped at exit. For
/// tests that neither stop nor pause them, and that use keys of their own.
pub fn shared_ports() -> (u16, u16) {
    static PORTS: OnceLock<(u16, u16)> = OnceLock::new();
    *PORTS.get_or_init(|| {
        let start = async {
            let pg = postgres().await;
            let bouncer = bouncer(&pg, PoolMode::Transaction, SHARED_POOL).await;
            (bouncer, pg)
        };
        shared_server(start, |(bouncer, pg)| (bouncer.port(), pg.port()))
    })
}

pub fn url_for(port: u16) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/postgres")
}

/// The URL form that selects the transaction-pooling design.
pub fn transaction_url(port: u16) -> String {
    format!("{}?pool_mode=transaction", url_for(port))
}

/// Cuts a client off like a crashed host: its connections to the pooler stay open but
/// silent, and it cannot reconnect. The server ends its open transactions when their
/// `idle_in_transaction_session_timeout` (the session timeout) runs out.
struct SilentCrash(FaultProxy);

#[async_trait]
impl ClientFaults for SilentCrash {
    async fn crash(&self) -> Result<(), LockError> {
        self.0.refuse_new(true);
        self.0.blackhole();
        Ok(())
    }
}

/// The conformance kit's harness: transaction-pooling clients through the shared
/// PgBouncer, each behind a fault proxy of its own.
pub struct XactHarness {
    pub port: u16,
    pub config: PostgresConfig,
    proxies: std::sync::Mutex<Vec<FaultProxy>>,
    faults: bool,
}

impl XactHarness {
    /// Crashable clients with the test settings.
    pub fn crashable() -> Self {
        XactHarness {
            port: shared_ports().0,
            config: test_config(),
            proxies: std::sync::Mutex::new(Vec::new()),
            faults: true,
        }
    }

    /// Plain clients with the default settings, as `distlock::connect` makes them.
    pub fn defaults() -> Self {
        let mut config = PostgresConfig::default();
        config.wait_sessions = 24;
        XactHarness {
            port: shared_ports().0,
            config,
            proxies: std::sync::Mutex::new(Vec::new()),
            faults: false,
        }
    }
}

#[async_trait]
impl Harness for XactHarness {
    fn name(&self) -> String {
        transaction_url(self.port)
    }

    async fn client(&self) -> Result<Client, LockError> {
        if !self.faults {
            let lock =
                PostgresXactLock::connect_with(&transaction_url(self.port), self.config.clone())
                    .await?;
            return Ok(Client::new(lock.client()));
        }
        let upstream = SocketAddr::from(([127, 0, 0, 1], self.port));
        let proxy = FaultProxy::start(upstream)
            .await
            .expect("fault proxy starts");
        let url = transaction_url(proxy.local_addr().port());
        let lock = PostgresXactLock::connect_with(&url, self.config.clone()).await?;
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
            Box::pin(
                async move { Ok(PostgresXactLock::connect_with(&url, config).await?.client()) },
            )
        }))
    }
}
