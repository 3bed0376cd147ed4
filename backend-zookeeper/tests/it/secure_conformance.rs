//! The whole conformance kit over digest credentials (creator-only ACLs), plaintext and
//! over TLS with a client certificate (feature `tls`): every client behind its own
//! fault proxy with a 2 s session, so the crash scenarios run too.

use crate::common;

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use distlock_api::LockError;
use distlock_conformance::{Client, Harness, UrlConnector};
use distlock_conformance_faults::NetFaults;
use distlock_test_servers::FaultProxy;
use distlock_zookeeper::ZooKeeperLock;

/// Clients of `url` (its server's port replaced by each client's proxy's), with
/// credentials in the URL.
/// How long a client of the TLS server may take to open its session.
const TLS_CONNECT: std::time::Duration = std::time::Duration::from_secs(15);

struct SecureHarness {
    url: String,
    port: u16,
    proxies: Mutex<Vec<FaultProxy>>,
}

impl SecureHarness {
    fn harness(url: String, port: u16) -> Arc<dyn Harness> {
        Arc::new(SecureHarness {
            url,
            port,
            proxies: Mutex::new(Vec::new()),
        })
    }

    fn via(&self, proxy: &FaultProxy) -> String {
        let (server, client) = (
            format!(":{}", self.port),
            format!(":{}", proxy.local_addr().port()),
        );
        self.url.replacen(&server, &client, 1)
    }
}

#[async_trait]
impl Harness for SecureHarness {
    fn name(&self) -> String {
        self.url.clone()
    }

    async fn client(&self) -> Result<Client, LockError> {
        let proxy = common::network_proxy(self.port).await;
        // A TLS handshake with the server's Java stack can take seconds when many
        // scenarios connect at once on a busy two-core machine: the session may take
        // longer to open than the 2 s it is granted once open.
        let config = common::config(common::SESSION_TIMEOUT).with_connect_timeout(TLS_CONNECT);
        let lock = ZooKeeperLock::connect_with(&self.via(&proxy), config).await?;
        if let Ok(mut kept) = self.proxies.lock() {
            kept.push(proxy.clone());
        }
        Ok(Client::new(lock.client()).with_faults(Arc::new(NetFaults::new(vec![proxy]))))
    }

    fn crash_bound(&self, _ttl: std::time::Duration) -> std::time::Duration {
        common::SESSION_TIMEOUT + 2 * common::TICK
    }

    fn url_connector(&self) -> Option<UrlConnector> {
        Some(Arc::new(|url: String| {
            Box::pin(async move { Ok(ZooKeeperLock::connect(&url).await?.client()) })
        }))
    }
}

async fn digest() -> Arc<dyn Harness> {
    let port = common::shared_port();
    SecureHarness::harness(
        format!("zookeeper://kit:secret@127.0.0.1:{port}/digest-kit"),
        port,
    )
}

mod with_digest_credentials {
    distlock_conformance::conformance_tests!(super::digest());
}

#[cfg(feature = "tls")]
mod over_tls {
    use std::sync::{Arc, OnceLock};

    use distlock_conformance::Harness;
    use distlock_test_servers::{shared_server, ZooKeeperTlsServer};

    /// One TLS server (client certificates demanded) for every scenario of this binary.
    fn shared() -> &'static (String, u16) {
        static URL: OnceLock<(String, u16)> = OnceLock::new();
        URL.get_or_init(|| {
            let start = async {
                let server = ZooKeeperTlsServer::start(true).await?;
                serving_tls(&server.url_with_credentials("kit:secret")).await;
                Ok::<_, distlock_test_servers::ServerError>(server)
            };
            shared_server(start, |server| match server {
                Ok(server) => (
                    server.url_with_credentials("kit:secret"),
                    server.secure_port(),
                ),
                Err(e) => panic!("could not start ZooKeeper with TLS (run scripts/test.sh): {e}"),
            })
        })
    }

    /// Waits (bounded) until the secure port opens a session: the server answers on its
    /// plain port before its TLS listener has come up, and the first scenarios to start
    /// would otherwise race it.
    async fn serving_tls(url: &str) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            match distlock_zookeeper::ZooKeeperLock::connect(url).await {
                Ok(_) => return,
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    panic!("the TLS port never opened a session within 60 s: {e}")
                }
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
            }
        }
    }

    async fn harness() -> Arc<dyn Harness> {
        let (url, port) = shared();
        super::SecureHarness::harness(url.clone(), *port)
    }

    distlock_conformance::conformance_tests!(harness());
}
