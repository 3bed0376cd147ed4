//! A throwaway MariaDB server with TLS (`ssl-ca`, `ssl-cert`, `ssl-key`), its
//! certificates from [`TlsFiles`], a test user that must use TLS and one that must
//! present a client certificate.

use super::openssl_ca::TlsFiles;
use super::{
    with_query, MariaDbServer, ServerError, MARIADB_DATABASE, MARIADB_PASSWORD, MARIADB_USER,
};

/// The user of a [`MariaDbTlsServer`] that is admitted only over TLS with a client
/// certificate signed by the server's CA (`REQUIRE X509`), password
/// [`MARIADB_PASSWORD`], every right on [`MARIADB_DATABASE`].
pub const MARIADB_CERT_USER: &str = "distlock_x509";

/// A [`MariaDbServer`] with TLS, listening on `127.0.0.1` and `127.0.0.2`, with the
/// certificates of [`TlsFiles`] (client common name [`MARIADB_CERT_USER`]).
///
/// The test user [`MARIADB_USER`] must use TLS (`REQUIRE SSL`: a plaintext login is
/// refused as "access denied"); [`MARIADB_CERT_USER`] must also present a client
/// certificate signed by the CA ([`TlsFiles::client_cert`]). `root` at
/// `127.0.0.1` may still log in without TLS, so the tests' administration through the
/// `mariadb` client works as on a plaintext server (the server-wide
/// `require_secure_transport` would refuse it).
///
/// Dropping it stops the server, then deletes the certificates.
#[derive(Debug)]
pub struct MariaDbTlsServer {
    // Declared first so the server stops before its certificates go.
    server: MariaDbServer,
    tls: TlsFiles,
}

impl MariaDbTlsServer {
    /// Makes the CAs and certificates with `openssl`, starts the server (see
    /// [`MariaDbServer::start_with`]) with them, and sets the users' TLS requirements.
    ///
    /// # Errors
    /// As [`TlsFiles::create`] and [`MariaDbServer::start_with`];
    /// [`ServerError::Setup`] when the users cannot be changed or the server does not
    /// report TLS enabled.
    pub async fn start() -> Result<MariaDbTlsServer, ServerError> {
        let tls = TlsFiles::create("mariadb", MARIADB_CERT_USER).await?;
        let server_cert = tls.server_cert();
        let args = vec![
            // The last --bind-address wins over the plaintext server's own.
            "--bind-address=127.0.0.1,127.0.0.2".to_owned(),
            format!("--ssl-ca={}", tls.ca_cert().display()),
            format!("--ssl-cert={}", server_cert.cert.display()),
            format!("--ssl-key={}", server_cert.key.display()),
        ];
        let server = MariaDbServer::start_with(&args).await?;
        let setup = format!(
            "ALTER USER '{MARIADB_USER}'@'%' REQUIRE SSL; \
             CREATE USER '{MARIADB_CERT_USER}'@'%' IDENTIFIED BY '{MARIADB_PASSWORD}' REQUIRE X509; \
             GRANT ALL ON {MARIADB_DATABASE}.* TO '{MARIADB_CERT_USER}'@'%'; \
             SELECT @@have_ssl;"
        );
        let have_ssl = server.sql(&setup).await.map_err(|e| ServerError::Setup {
            server: "mariadb",
            step: "requiring TLS of the test users".into(),
            detail: e.to_string(),
        })?;
        if have_ssl.trim() != "YES" {
            return Err(ServerError::Setup {
                server: "mariadb",
                step: "enabling TLS".into(),
                detail: format!("@@have_ssl is {:?}, not YES", have_ssl.trim()),
            });
        }
        Ok(MariaDbTlsServer { server, tls })
    }

    /// `mysql://distlock:distlock-test@127.0.0.1:PORT/distlock?QUERY` (no `?` when
    /// `query` is empty).
    pub fn url(&self, query: &str) -> String {
        self.url_as(MARIADB_USER, "127.0.0.1", query)
    }

    /// `mysql://USER:distlock-test@HOST:PORT/distlock?QUERY` (no `?` when `query` is
    /// empty).
    pub fn url_as(&self, user: &str, host: &str, query: &str) -> String {
        let port = self.server.port();
        with_query(
            format!("mysql://{user}:{MARIADB_PASSWORD}@{host}:{port}/{MARIADB_DATABASE}"),
            query,
        )
    }

    /// The certificates: the CA to trust, the client certificate, the unrelated CA.
    pub fn tls(&self) -> &TlsFiles {
        &self.tls
    }

    /// The TCP port the server listens on.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// The server, for its administration and fault controls.
    pub fn server(&self) -> &MariaDbServer {
        &self.server
    }

    /// The server, for its fault controls that need `&mut`.
    pub fn server_mut(&mut self) -> &mut MariaDbServer {
        &mut self.server
    }
}
