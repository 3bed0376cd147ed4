//! A throwaway MariaDB server with TLS (`ssl-ca`, `ssl-cert`, `ssl-key`), its
//! certificates from a [`TestCa`], a test user that must use TLS and one that must
//! present a client certificate.

use std::path::PathBuf;

use super::openssl_ca::{CertUse, IssuedCert, TestCa};
use super::{MariaDbServer, ServerError, MARIADB_DATABASE, MARIADB_PASSWORD, MARIADB_USER};

/// The user of a [`MariaDbTlsServer`] that is admitted only over TLS with a client
/// certificate signed by the server's CA (`REQUIRE X509`), password
/// [`MARIADB_PASSWORD`], every right on [`MARIADB_DATABASE`].
pub const MARIADB_CERT_USER: &str = "distlock_x509";

/// The names the server certificate is valid for.
const SERVER_NAMES: [&str; 2] = ["IP:127.0.0.1", "DNS:localhost"];

/// A [`MariaDbServer`] with TLS, listening on `127.0.0.1` and `127.0.0.2`, with a
/// server certificate for `127.0.0.1` and `localhost` only (so `127.0.0.2` reaches the
/// same server under a name the certificate does not cover), signed by a throwaway CA.
///
/// The test user [`MARIADB_USER`] must use TLS (`REQUIRE SSL`: a plaintext login is
/// refused as "access denied"); [`MARIADB_CERT_USER`] must also present a client
/// certificate signed by the CA ([`MariaDbTlsServer::client_cert`]). `root` at
/// `127.0.0.1` may still log in without TLS, so the tests' administration through the
/// `mariadb` client works as on a plaintext server (the server-wide
/// `require_secure_transport` would refuse it). A second, unrelated CA
/// ([`MariaDbTlsServer::other_ca_cert`]) is there for "wrong CA" tests.
///
/// Dropping it stops the server, then deletes the certificates.
#[derive(Debug)]
pub struct MariaDbTlsServer {
    // Declared first so the server stops before its certificates go.
    server: MariaDbServer,
    ca: TestCa,
    client: IssuedCert,
    other_ca: TestCa,
}

impl MariaDbTlsServer {
    /// Makes the CAs and certificates with `openssl`, starts the server (see
    /// [`MariaDbServer::start_with`]) with them, and sets the users' TLS requirements.
    ///
    /// # Errors
    /// As [`TestCa::create`] and [`MariaDbServer::start_with`]; [`ServerError::Setup`]
    /// when the users cannot be changed or the server does not report TLS enabled.
    pub async fn start() -> Result<MariaDbTlsServer, ServerError> {
        let ca = TestCa::create("mariadb").await?;
        let server_cert = ca
            .issue("server", "localhost", CertUse::Server(&SERVER_NAMES))
            .await?;
        let client = ca
            .issue("client", MARIADB_CERT_USER, CertUse::Client)
            .await?;
        let other_ca = TestCa::create("other").await?;
        let args = vec![
            // The last --bind-address wins over the plaintext server's own.
            "--bind-address=127.0.0.1,127.0.0.2".to_owned(),
            format!("--ssl-ca={}", ca.cert().display()),
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
        Ok(MariaDbTlsServer {
            server,
            ca,
            client,
            other_ca,
        })
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
        let base = format!("mysql://{user}:{MARIADB_PASSWORD}@{host}:{port}/{MARIADB_DATABASE}");
        if query.is_empty() {
            base
        } else {
            format!("{base}?{query}")
        }
    }

    /// The CA certificate that signed the server's and the client's certificates.
    pub fn ca_cert(&self) -> PathBuf {
        self.ca.cert()
    }

    /// The certificate of an unrelated CA, which signed neither.
    pub fn other_ca_cert(&self) -> PathBuf {
        self.other_ca.cert()
    }

    /// The unrelated CA, to issue certificates the server does not trust.
    pub fn other_ca(&self) -> &TestCa {
        &self.other_ca
    }

    /// A client certificate (common name [`MARIADB_CERT_USER`]) and key signed by the CA.
    pub fn client_cert(&self) -> &IssuedCert {
        &self.client
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
