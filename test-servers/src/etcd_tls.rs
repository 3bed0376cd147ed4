//! A throwaway single-node etcd serving TLS on its client port, its certificates from
//! a [`TestCa`].

use std::path::PathBuf;

use super::etcd::{EtcdServer, EtcdServerOptions, ServerTls};
use super::openssl_ca::{CertUse, IssuedCert, TestCa};
use super::ServerError;

/// The names the server certificate is valid for.
const SERVER_NAMES: [&str; 2] = ["IP:127.0.0.1", "DNS:localhost"];

/// A single-node etcd whose client port speaks only TLS (`https://`), with a server
/// certificate for `127.0.0.1` and `localhost` and a client certificate, both from a
/// fresh [`TestCa`]. Its health is probed on a plaintext metrics port.
///
/// Dropping it kills the server and deletes its directories.
#[derive(Debug)]
pub struct EtcdTlsServer {
    // Declared first: the process dies before its certificates go.
    server: EtcdServer,
    client_auth: bool,
    ca: TestCa,
    client: IssuedCert,
}

impl EtcdTlsServer {
    /// Starts a node with [`EtcdServerOptions::default`]; with `client_auth` it
    /// demands a client certificate signed by the CA (`--client-cert-auth`).
    ///
    /// # Errors
    /// As [`TestCa::create`] and [`EtcdServer::start_with`].
    pub async fn start(client_auth: bool) -> Result<EtcdTlsServer, ServerError> {
        let ca = TestCa::create("etcd").await?;
        let server_cert = ca
            .issue("server", "127.0.0.1", CertUse::Server(&SERVER_NAMES))
            .await?;
        let client = ca
            .issue("client", "distlock-client", CertUse::Client)
            .await?;
        let tls = ServerTls {
            cert: server_cert.cert,
            key: server_cert.key,
            ca: ca.cert(),
            client_cert_auth: client_auth,
        };
        let server = EtcdServer::start_single(EtcdServerOptions::default(), Some(&tls)).await?;
        Ok(EtcdTlsServer {
            server,
            client_auth,
            ca,
            client,
        })
    }

    /// `etcd+tls://127.0.0.1:PORT?ca=…`, with `&cert=…&key=…` when the server
    /// demands a client certificate.
    pub fn url(&self) -> String {
        let mut url = format!(
            "etcd+tls://127.0.0.1:{}?ca={}",
            self.server.port(),
            self.ca.cert().display()
        );
        if self.client_auth {
            url.push_str(&format!(
                "&cert={}&key={}",
                self.client.cert.display(),
                self.client.key.display()
            ));
        }
        url
    }

    /// The TLS client port.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// The CA certificate (PEM) that signed the server's and the client's
    /// certificates: what clients trust.
    pub fn ca_cert(&self) -> PathBuf {
        self.ca.cert()
    }

    /// A client certificate (common name `distlock-client`) and key signed by the CA.
    pub fn client_cert(&self) -> &IssuedCert {
        &self.client
    }

    /// The server itself (its [`EtcdServer::url`] is the plaintext form, which this
    /// server refuses), for fault controls and its log.
    pub fn server(&self) -> &EtcdServer {
        &self.server
    }

    /// The server, mutably (kill, pause, restart).
    pub fn server_mut(&mut self) -> &mut EtcdServer {
        &mut self.server
    }
}
