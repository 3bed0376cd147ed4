//! A throwaway ZooKeeper server with a TLS client port (`secureClientPort`, Netty
//! connection factory), and the throwaway certificate authority it uses.

use crate::ServerControl;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tokio::net::TcpStream;

use super::zookeeper::{ZooKeeperServer, ZooKeeperServerOptions};
use super::{free_port, temp_dir, ServerError, PROBE_INTERVAL, START_ATTEMPTS};

const SERVER: &str = "zookeeper-tls";

/// A throwaway certificate authority made with the `openssl` tool: a CA, a server
/// certificate for `127.0.0.1` and `localhost` (IP and DNS subject alternative
/// names), and a client certificate, all PEM files in a temporary directory that is
/// deleted on drop. Valid for two days.
#[derive(Debug)]
pub struct TestCertificates {
    dir: TempDir,
}

impl TestCertificates {
    /// Makes the CA and both certificates.
    ///
    /// # Errors
    /// [`ServerError::NotInstalled`] without `openssl` on `PATH`; [`ServerError::Setup`]
    /// (with its output) when an `openssl` step fails; [`ServerError::Io`].
    pub fn generate() -> Result<TestCertificates, ServerError> {
        let dir = temp_dir("certs")?;
        let certs = TestCertificates { dir };
        certs.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=distlock test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ])?;
        certs.sign(
            "server",
            "/CN=127.0.0.1",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        )?;
        certs.sign(
            "client",
            "/CN=distlock-client",
            "extendedKeyUsage=clientAuth",
        )?;
        // The server reads its key and certificate from one PEM key store.
        let mut store = std::fs::read_to_string(certs.path("server.key"))
            .map_err(|e| ServerError::io("reading server.key", e))?;
        store.push_str(
            &std::fs::read_to_string(certs.path("server.crt"))
                .map_err(|e| ServerError::io("reading server.crt", e))?,
        );
        std::fs::write(certs.path("server.pem"), store)
            .map_err(|e| ServerError::io("writing server.pem", e))?;
        Ok(certs)
    }

    /// A key and a certificate `NAME.key`, `NAME.crt` signed by the CA, with `extension`.
    fn sign(&self, name: &str, subject: &str, extension: &str) -> Result<(), ServerError> {
        let (key, csr, crt, ext) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
            format!("{name}.ext"),
        );
        std::fs::write(self.path(&ext), format!("{extension}\n"))
            .map_err(|e| ServerError::io(format!("writing {ext}"), e))?;
        self.openssl(&[
            "req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", &key, "-out", &csr,
        ])?;
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &crt,
        ])
    }

    fn openssl(&self, args: &[&str]) -> Result<(), ServerError> {
        let output = Command::new("openssl")
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => ServerError::NotInstalled {
                    what: "openssl".into(),
                    hint: "install the Debian package `openssl` (scripts/test.sh does)".into(),
                },
                _ => ServerError::io("running openssl", e),
            })?;
        if output.status.success() {
            return Ok(());
        }
        Err(ServerError::Setup {
            server: SERVER,
            step: format!("openssl {}", args.join(" ")),
            detail: format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ),
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The CA certificate (PEM): what clients trust.
    pub fn ca(&self) -> PathBuf {
        self.path("ca.pem")
    }

    /// The server's private key followed by its certificate (one PEM file).
    pub fn server_key_store(&self) -> PathBuf {
        self.path("server.pem")
    }

    /// The client certificate (PEM), signed by the CA.
    pub fn client_cert(&self) -> PathBuf {
        self.path("client.crt")
    }

    /// The client certificate's private key (PEM, PKCS#8).
    pub fn client_key(&self) -> PathBuf {
        self.path("client.key")
    }
}

/// A standalone ZooKeeper server that serves TLS on its `secureClientPort` and
/// plaintext on its client port (for probes and for tests that need both), with
/// certificates from a fresh [`TestCertificates`].
///
/// Dropping it kills the server and deletes its directories.
#[derive(Debug)]
pub struct ZooKeeperTlsServer {
    // Declared first: the JVM dies before its key store goes.
    server: ZooKeeperServer,
    secure_port: u16,
    client_auth: bool,
    certs: TestCertificates,
}

impl ZooKeeperTlsServer {
    /// Starts a server with [`ZooKeeperServerOptions::default`]; with `client_auth`
    /// it demands a client certificate signed by the CA (`ssl.clientAuth=need`), else
    /// asks for none.
    ///
    /// # Errors
    /// As [`TestCertificates::generate`] and [`ZooKeeperServer::start_with`], and
    /// [`ServerError::StartTimeout`] when the TLS port does not accept connections
    /// within the options' `ready_timeout`.
    pub async fn start(client_auth: bool) -> Result<ZooKeeperTlsServer, ServerError> {
        let certs = TestCertificates::generate()?;
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
            self.certs.ca().display()
        );
        if self.client_auth {
            url.push_str(&format!(
                "&cert={}&key={}",
                self.certs.client_cert().display(),
                self.certs.client_key().display()
            ));
        }
        url
    }

    /// The TLS port.
    pub fn secure_port(&self) -> u16 {
        self.secure_port
    }

    /// The certificates the server and its clients use.
    pub fn certificates(&self) -> &TestCertificates {
        &self.certs
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
fn tls_config(certs: &TestCertificates, secure_port: u16, client_auth: bool) -> Vec<String> {
    let store = |path: &Path| path.display().to_string();
    vec![
        format!("secureClientPort={secure_port}"),
        "secureClientPortAddress=127.0.0.1".into(),
        "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory".into(),
        format!("ssl.keyStore.location={}", store(&certs.server_key_store())),
        "ssl.keyStore.type=PEM".into(),
        format!("ssl.trustStore.location={}", store(&certs.ca())),
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
