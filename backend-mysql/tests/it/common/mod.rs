//! A conformance harness over a real MariaDB server, started for the test or shared
//! by every test of the binary, with each client behind its own fault proxy so it can
//! be cut off like a crashed host.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use distlock_api::LockError;
use distlock_conformance::{Client, ClientFaults, Harness, UrlConnector};
use distlock_mysql::{MySqlConfig, MySqlLock};
use distlock_test_servers::{
    mariadb_sql, shared_server, FaultProxy, MariaDbServer, MARIADB_DATABASE, MARIADB_PASSWORD,
    MARIADB_USER,
};

/// The client settings of the tests: short timeouts, so the crash scenarios are quick.
pub fn test_config() -> MySqlConfig {
    let mut config = MySqlConfig::default();
    config.session_timeout = Duration::from_secs(2);
    config.request_timeout = Duration::from_secs(2);
    config
}

pub fn cannot_start(e: impl std::fmt::Display) -> ! {
    panic!("could not start MariaDB (run scripts/install-deps.sh, which installs it): {e}")
}

/// The port of one server shared by every test of this binary: started on first use,
/// stopped when the test process exits. For tests that neither stop nor pause it, and
/// that use keys of their own.
pub fn shared_port() -> u16 {
    static PORT: OnceLock<u16> = OnceLock::new();
    *PORT.get_or_init(|| {
        shared_server(MariaDbServer::start(), |server| match server {
            Ok(server) => server.port(),
            Err(e) => cannot_start(e),
        })
    })
}

/// The test user's URL of the server on `port`.
pub fn url_for(port: u16) -> String {
    format!("mysql://{MARIADB_USER}:{MARIADB_PASSWORD}@127.0.0.1:{port}/{MARIADB_DATABASE}")
}

/// Runs `sql` as root on the server at `port` through the `mariadb` client.
pub async fn admin(port: u16, sql: &str) -> String {
    mariadb_sql(port, "root", None, sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// A MariaDB server (the binary's shared one) and the clients the tests make of it.
pub struct MyHarness {
    pub port: u16,
    pub config: MySqlConfig,
    /// Every client's proxy, kept for the harness's life.
    proxies: std::sync::Mutex<Vec<FaultProxy>>,
    /// Whether `Harness::client` gives clients fault hooks (behind proxies).
    faults: bool,
}

/// A harness on the binary's shared server.
pub fn shared() -> MyHarness {
    MyHarness {
        port: shared_port(),
        config: test_config(),
        proxies: std::sync::Mutex::new(Vec::new()),
        faults: true,
    }
}

/// The kit's harness: short session timeouts, crashable clients, on the shared server.
pub async fn harness() -> Arc<dyn Harness> {
    Arc::new(shared())
}

/// What `distlock conformance --backend mysql://…` runs: default settings, plain
/// clients without fault hooks, on the shared server.
pub async fn default_harness() -> Arc<dyn Harness> {
    let mut h = shared();
    h.config = MySqlConfig::default();
    h.faults = false;
    Arc::new(h)
}

impl MyHarness {
    /// The direct URL (no proxy).
    pub fn url(&self) -> String {
        url_for(self.port)
    }

    /// A client with the test settings, straight to the server.
    pub async fn client(&self) -> MySqlLock {
        MySqlLock::connect_with(&self.url(), self.config.clone())
            .await
            .expect("connects")
    }

    /// A client whose every session goes through its own proxy, and the proxy.
    pub async fn proxied_client(&self) -> (MySqlLock, FaultProxy) {
        let upstream = SocketAddr::from(([127, 0, 0, 1], self.port));
        let proxy = FaultProxy::start(upstream)
            .await
            .expect("fault proxy starts");
        let url = url_for(proxy.local_addr().port());
        let lock = MySqlLock::connect_with(&url, self.config.clone())
            .await
            .expect("connects through the proxy");
        (lock, proxy)
    }
}

/// Cuts a client off like a crashed host: its connections stay open but silent (no
/// reset reaches the server), and it cannot reconnect. The server frees its locks
/// when its sessions' `wait_timeout` runs out.
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
impl Harness for MyHarness {
    fn name(&self) -> String {
        format!("mysql://127.0.0.1:{}", self.port)
    }

    async fn client(&self) -> Result<Client, LockError> {
        if !self.faults {
            let lock = MySqlLock::connect_with(&self.url(), self.config.clone()).await?;
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
            Box::pin(async move { Ok(MySqlLock::connect_with(&url, config).await?.client()) })
        }))
    }
}

/// Waits (bounded) until `check` holds for the connection id holding `name` (per
/// `IS_USED_LOCK`), and returns it; panics with `what` after `limit`.
pub async fn wait_for_holder(
    port: u16,
    name: &str,
    limit: Duration,
    what: &str,
    check: impl Fn(Option<u64>) -> bool,
) -> Option<u64> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let text = admin(port, &format!("SELECT IS_USED_LOCK('{name}')")).await;
        let holder = text.trim().parse::<u64>().ok();
        if check(holder) {
            return holder;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("{what}: not seen within {limit:?}; IS_USED_LOCK says {holder:?}");
        }
        // The server's lock table changes only through other sessions: poll it.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
