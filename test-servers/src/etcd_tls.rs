//! A throwaway single-node etcd serving TLS on its client port, its certificates from
//! [`TlsFiles`].

use super::etcd::{EtcdServer, EtcdServerOptions, ServerTls};
use super::openssl_ca::TlsFiles;
use super::ServerError;

/// A single-node etcd whose client port speaks only TLS (`https://`), with the
/// certificates of [`TlsFiles`] (client common name `distlock-client`). Its health is
/// probed on a plaintext metrics port.
///
/// Dropping it kills the server and deletes its directories.
#[derive(Debug)]
pub struct EtcdTlsServer {
    // Declared first: the process dies before its certificates go.
    server: EtcdServer,
    client_auth: bool,
    tls: TlsFiles,
}

impl EtcdTlsServer {
    /// Starts a node with [`EtcdServerOptions::default`]; with `client_auth` it
    /// demands a client certificate signed by the CA (`--client-cert-auth`).
    ///
    /// # Errors
    /// As [`TlsFiles::create`] and [`EtcdServer::start_with`].
    pub async fn start(client_auth: bool) -> Result<EtcdTlsServer, ServerError> {
        let tls = TlsFiles::create("etcd", "distlock-client").await?;
        let server_tls = ServerTls {
            cert: tls.server_cert().cert.clone(),
            key: tls.server_cert().key.clone(),
            ca: tls.ca_cert(),
            client_cert_auth: client_auth,
        };
        let server =
            EtcdServer::start_single(EtcdServerOptions::default(), Some(&server_tls)).await?;
        Ok(EtcdTlsServer {
            server,
            client_auth,
            tls,
        })
    }

    /// `etcd+tls://127.0.0.1:PORT?ca=…`, with `&cert=…&key=…` when the server
    /// demands a client certificate.
    pub fn url(&self) -> String {
        let mut url = format!(
            "etcd+tls://127.0.0.1:{}?ca={}",
            self.server.port(),
            self.tls.ca_cert().display()
        );
        if self.client_auth {
            let client = self.tls.client_cert();
            url.push_str(&format!(
                "&cert={}&key={}",
                client.cert.display(),
                client.key.display()
            ));
        }
        url
    }

    /// The TLS client port.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// The certificates: the CA to trust, the client certificate, the unrelated CA.
    pub fn tls(&self) -> &TlsFiles {
        &self.tls
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
