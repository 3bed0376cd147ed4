//! etcd over TLS (feature `tls`): the whole conformance kit against a real etcd that
//! serves only TLS and demands a client certificate (`--client-cert-auth`), every
//! client behind its own fault proxy; and a TLS client against a plaintext server, a
//! plaintext client against the TLS server, or a TLS client without the certificate
//! the server demands, fails within the timeouts with a connection error that says what
//! to check (nothing is created before a connect succeeds).

#![cfg(feature = "tls")]

use crate::common;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use distlock_api::LockError;
use distlock_conformance::{Client, Harness, UrlConnector};
use distlock_conformance_faults::NetFaults;
use distlock_etcd::{EtcdConfig, EtcdLock};
use distlock_test_servers::{shared_server, EtcdTlsServer, FaultProxy};

/// One TLS server (client certificates demanded) for every test of this binary: its
/// URL, port and CA file.
fn shared() -> &'static (String, u16, String) {
    static URL: OnceLock<(String, u16, String)> = OnceLock::new();
    URL.get_or_init(|| {
        shared_server(EtcdTlsServer::start(true), |server| match server {
            Ok(server) => (
                server.url(),
                server.port(),
                server.tls().ca_cert().display().to_string(),
            ),
            Err(e) => panic!("could not start etcd with TLS (run scripts/test.sh): {e}"),
        })
    })
}

/// Clients of the TLS server, each through its own proxy (the TLS session runs end to
/// end through it; the certificate names 127.0.0.1, as the proxy's address does).
struct TlsHarness {
    url: String,
    port: u16,
    proxies: Mutex<Vec<FaultProxy>>,
}

impl TlsHarness {
    fn via(&self, proxy: &FaultProxy) -> String {
        self.url.replacen(
            &format!(":{}?", self.port),
            &format!(":{}?", proxy.local_addr().port()),
            1,
        )
    }
}

fn connector() -> UrlConnector {
    Arc::new(|url: String| Box::pin(async move { Ok(EtcdLock::connect(&url).await?.client()) }))
}

#[async_trait]
impl Harness for TlsHarness {
    fn name(&self) -> String {
        self.url.split('?').next().unwrap_or_default().to_owned()
    }

    async fn client(&self) -> Result<Client, LockError> {
        let proxy = common::network_proxy(self.port).await;
        let lock = EtcdLock::connect(&self.via(&proxy)).await?;
        if let Ok(mut kept) = self.proxies.lock() {
            kept.push(proxy.clone());
        }
        Ok(Client::new(lock.client()).with_faults(Arc::new(NetFaults::new(vec![proxy]))))
    }

    fn ttl(&self) -> Duration {
        common::TTL
    }

    fn slack(&self) -> Duration {
        Duration::from_millis(1500)
    }

    /// As the plaintext harness's (tests/common): the TTL in whole seconds plus the
    /// leader's expiry sweep and the revoke's raft round.
    fn crash_bound(&self, ttl: Duration) -> Duration {
        Duration::from_secs(ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0))
            + Duration::from_millis(600)
    }

    fn dead_waiter_bound(&self) -> Duration {
        common::WAITER_TTL + Duration::from_millis(600)
    }

    fn url_connector(&self) -> Option<UrlConnector> {
        Some(connector())
    }
}

async fn harness() -> Arc<dyn Harness> {
    let (url, port, _) = shared();
    Arc::new(TlsHarness {
        url: url.clone(),
        port: *port,
        proxies: Mutex::new(Vec::new()),
    })
}

mod kit {
    distlock_conformance::conformance_tests!(super::harness());
}

/// Short timeouts, so that "within the timeouts" is quick to check.
fn short() -> EtcdConfig {
    EtcdConfig::default()
        .with_connect_timeout(Duration::from_secs(2))
        .with_request_timeout(Duration::from_secs(2))
}

/// The connect attempt fails within both timeouts (plus scheduling slack).
async fn refused(url: &str) -> LockError {
    let started = Instant::now();
    let err = EtcdLock::connect_with(url, short()).await.unwrap_err();
    let took = started.elapsed();
    eprintln!("{url}: {took:?}: {err}");
    assert!(
        took < Duration::from_secs(6),
        "the mismatch took {took:?}: {err}"
    );
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_client_against_the_plaintext_server_is_a_typed_error() {
    let (_, _, ca) = shared();
    let plain = common::shared_port();
    let err = refused(&format!("etcd+tls://127.0.0.1:{plain}?ca={ca}")).await;
    // A failed handshake is a connection error, as on the other backends, that says
    // what to check.
    assert!(
        matches!(err, LockError::Connection { .. }),
        "a TLS client against a plaintext server: {err}"
    );
    assert!(err.to_string().contains("serves TLS on this port"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_client_against_the_tls_server_is_a_typed_error() {
    let (_, port, _) = shared();
    let err = refused(&format!("etcd://127.0.0.1:{port}")).await;
    assert!(
        matches!(err, LockError::Connection { .. }),
        "a plaintext client against a TLS server: {err}"
    );
    assert!(err.to_string().contains("etcd+tls://"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_without_its_certificate_is_refused() {
    let (_, port, ca) = shared();
    let err = refused(&format!("etcd+tls://127.0.0.1:{port}?ca={ca}")).await;
    assert!(
        matches!(err, LockError::Connection { .. }),
        "no client certificate where one is demanded: {err}"
    );
    assert!(err.to_string().contains("client certificate"), "{err}");
}
