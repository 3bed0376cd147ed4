//! A throwaway ZooKeeper server with a TLS client port (`secureClientPort`, Netty
//! connection factory), its certificates from [`TlsFiles`].

use crate::ServerControl;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

use super::openssl_ca::TlsFiles;
use super::zookeeper::{ZooKeeperServer, ZooKeeperServerOptions};
use super::{free_port, ServerError, PROBE_INTERVAL, START_ATTEMPTS};

const SERVER: &str = "zookeeper-tls";

/// The server's certificates, and its key store: its private key followed by its
/// certificate in one PEM file, which is how ZooKeeper reads a PEM key store.
#[derive(Debug)]
struct Certificates {
    tls: TlsFiles,
    server_key_store: PathBuf,
}

impl Certificates {
    async fn create() -> Result<Certificates, ServerError> {
        let tls = TlsFiles::create("zookeeper", "distlock-client").await?;
        let server = tls.server_cert();
        let server_key_store = tls.ca().dir().join("server.pem");
        let read = |path: &Path| {
            std::fs::read_to_string(path)
                .map_err(|e| ServerError::io(format!("reading {}", path.display()), e))
        };
        let store = read(&server.key)? + &read(&server.cert)?;
        std::fs::write(&server_key_store, store)
            .map_err(|e| ServerError::io(format!("writing {}", server_key_store.display()), e))?;
        Ok(Certificates {
            tls,
            server_key_store,
        })
    }
}

/// A standalone ZooKeeper server that serves TLS on its `secureClientPort` and
/// plaintext on its client port (for probes and for tests that need both), with the
/// certificates of [`TlsFiles`] (client common name `distlock-client`).
///
/// Dropping it kills the server and deletes its directories.
#[derive(Debug)]
pub struct ZooKeeperTlsServer {
    // Declared first: the JVM dies before its key store goes.
    server: ZooKeeperServer,
    secure_port: u16,
    client_auth: bool,
    certs: Certificates,
}

impl ZooKeeperTlsServer {
    /// Starts a server with [`ZooKeeperServerOptions::default`]; with `client_auth`
    /// it demands a client certificate signed by the CA (`ssl.clientAuth=need`), else
    /// asks for none.
    ///
    /// # Errors
    /// As [`TlsFiles::create`] and [`ZooKeeperServer::start_with`], and
    /// [`ServerError::StartTimeout`] when the TLS port does not accept connections
    /// within the options' `ready_timeout`.
    pub async fn start(client_auth: bool) -> Result<ZooKeeperTlsServer, ServerError> {
        let certs = Certificates::create().await?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let secure_port = free_port()?;
            let mut options = ZooKeeperServerOptions::default();
            options
                .extra_config
                .extend(tls_config(&certs, secure_port, client_auth));
            let ready_timeout = options.ready_timeout;
            let started = match ZooKeeperServer::start_with(options).await {
                Ok(mut server) => match wait_listening(secure_port, ready_timeout).await {
                    Ok(()) => Ok(server),
                    Err(last_probe) => {
                        server.kill();
                        Err(ServerError::StartTimeout {
                            server: SERVER,
                            waited: ready_timeout,
                            last_probe,
                            log: server.log_path(),
                            log_tail: server.logs(),
                        })
                    }
                },
                Err(e) => Err(e),
            };
            match started {
                Ok(server) => {
                    return Ok(ZooKeeperTlsServer {
                        server,
                        secure_port,
                        client_auth,
                        certs,
                    })
                }
                Err(e) if e.is_port_conflict() && attempt < START_ATTEMPTS => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// `zookeeper+tls://127.0.0.1:SECURE_PORT?ca=…`, with `&cert=…&key=…` when the
    /// server demands a client certificate.
    pub fn url(&self) -> String {
        self.url_with_credentials("")
    }

    /// [`Self::url`] with `userinfo@` (for example `app:secret`) before the host.
    pub fn url_with_credentials(&self, userinfo: &str) -> String {
        let at = if userinfo.is_empty() { "" } else { "@" };
        let mut url = format!(
            "zookeeper+tls://{userinfo}{at}127.0.0.1:{}?ca={}",
            self.secure_port,
            self.certs.tls.ca_cert().display()
        );
        if self.client_auth {
            let client = self.certs.tls.client_cert();
            url.push_str(&format!(
                "&cert={}&key={}",
                client.cert.display(),
                client.key.display()
            ));
        }
        url
    }

    /// The TLS port.
    pub fn secure_port(&self) -> u16 {
        self.secure_port
    }

    /// The certificates: the CA to trust, the client certificate, the unrelated CA.
    pub fn tls(&self) -> &TlsFiles {
        &self.certs.tls
    }

    /// The server itself: its plaintext [`ZooKeeperServer::url`], fault controls and log.
    pub fn server(&self) -> &ZooKeeperServer {
        &self.server
    }

    /// The server, mutably (kill, pause, restart).
    pub fn server_mut(&mut self) -> &mut ZooKeeperServer {
        &mut self.server
    }
}

/// The `zoo.cfg` lines of a TLS client port: ZooKeeper passes unknown keys on as
/// `zookeeper.*` system properties, which is where the Netty factory and the X.509
/// settings are read from. PEM key and trust stores need ZooKeeper 3.6 or later.
fn tls_config(certs: &Certificates, secure_port: u16, client_auth: bool) -> Vec<String> {
    let store = |path: &Path| path.display().to_string();
    vec![
        format!("secureClientPort={secure_port}"),
        "secureClientPortAddress=127.0.0.1".into(),
        "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory".into(),
        format!("ssl.keyStore.location={}", store(&certs.server_key_store)),
        "ssl.keyStore.type=PEM".into(),
        format!("ssl.trustStore.location={}", store(&certs.tls.ca_cert())),
        "ssl.trustStore.type=PEM".into(),
        format!(
            "ssl.clientAuth={}",
            if client_auth { "need" } else { "none" }
        ),
    ]
}

/// Waits until 127.0.0.1:`port` accepts TCP connections (the server binds its TLS
/// port just after it starts answering on the plaintext one); else the last failure.
async fn wait_listening(port: u16, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        match TcpStream::connect(("127.0.0.1", port)).await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!("TLS port {port} does not accept connections: {e}"))
            }
            Err(_) => tokio::time::sleep(PROBE_INTERVAL).await,
        }
    }
}
