//! A throwaway PostgreSQL server with TLS (`ssl=on`), its certificates from a
//! [`TestCa`], and one database that admits only clients with a certificate.

use std::path::{Path, PathBuf};

use super::openssl_ca::{set_mode, CertUse, IssuedCert, TestCa};
use super::postgres::{pg_bin_dir, postgres_identity};
use super::{PostgresServer, PostgresServerOptions, ServerError};

/// The database of a [`PostgresTlsServer`] that takes only TLS sessions presenting a
/// client certificate signed by the server's CA (`hostssl … clientcert=verify-ca`).
pub const CLIENT_CERT_DATABASE: &str = "certdb";

/// The names the server certificate is valid for.
const SERVER_NAMES: [&str; 2] = ["IP:127.0.0.1", "DNS:localhost"];

/// A [`PostgresServer`] with `ssl=on`, listening on `127.0.0.1` and `127.0.0.2`, with a
/// server certificate for `127.0.0.1` and `localhost` only (so `127.0.0.2` reaches the
/// same server under a name the certificate does not cover), signed by a throwaway CA.
///
/// Authentication is `trust` for user `postgres`, over TLS or plaintext, in every
/// database but [`CLIENT_CERT_DATABASE`], which takes TLS sessions with a client
/// certificate signed by the CA ([`PostgresTlsServer::client_cert`]) only. A second,
/// unrelated CA ([`PostgresTlsServer::other_ca_cert`]) is there for "wrong CA" tests.
///
/// Dropping it stops the server, then deletes the certificates.
#[derive(Debug)]
pub struct PostgresTlsServer {
    // Declared first so the server stops before its certificates go.
    server: PostgresServer,
    ca: TestCa,
    client: IssuedCert,
    other_ca: TestCa,
}

impl PostgresTlsServer {
    /// Makes the CAs and certificates with `openssl`, starts the server (see
    /// [`PostgresServer::start_with`]) and creates [`CLIENT_CERT_DATABASE`] with `psql`.
    ///
    /// # Errors
    /// As [`TestCa::create`] and [`PostgresServer::start_with`]; [`ServerError::Setup`]
    /// when `psql` cannot create the database.
    pub async fn start() -> Result<PostgresTlsServer, ServerError> {
        let ca = TestCa::create("postgres").await?;
        let server_cert = ca
            .issue("server", "localhost", CertUse::Server(&SERVER_NAMES))
            .await?;
        let client = ca.issue("client", "postgres", CertUse::Client).await?;
        let other_ca = TestCa::create("other").await?;
        let hba = ca.dir().join("pg_hba.conf");
        let rules = format!(
            "local all all trust\n\
             hostssl {CLIENT_CERT_DATABASE} all 127.0.0.0/8 trust clientcert=verify-ca\n\
             host {CLIENT_CERT_DATABASE} all 127.0.0.0/8 reject\n\
             host all all 127.0.0.0/8 trust\n"
        );
        std::fs::write(&hba, rules)
            .map_err(|e| ServerError::io(format!("writing {}", hba.display()), e))?;
        // The server runs as `postgres` when we are root: it must read its files, and
        // it refuses a key that others may read.
        if let Some((uid, gid)) = postgres_identity()? {
            for path in [ca.dir(), &server_cert.cert, &server_cert.key, &hba] {
                std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(|e| {
                    ServerError::io(format!("chown {} to postgres", path.display()), e)
                })?;
            }
        }
        set_mode(&server_cert.key, 0o600)?;
        let mut options = PostgresServerOptions::default();
        let path = |p: &Path| p.display().to_string();
        options.settings = vec![
            ("listen_addresses".into(), "127.0.0.1,127.0.0.2".into()),
            ("ssl".into(), "on".into()),
            ("ssl_cert_file".into(), path(&server_cert.cert)),
            ("ssl_key_file".into(), path(&server_cert.key)),
            ("ssl_ca_file".into(), path(&ca.cert())),
            ("hba_file".into(), path(&hba)),
            ("max_connections".into(), "400".into()),
        ];
        let server = PostgresServer::start_with(options).await?;
        create_database(server.port(), CLIENT_CERT_DATABASE).await?;
        Ok(PostgresTlsServer {
            server,
            ca,
            client,
            other_ca,
        })
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres?QUERY` (no `?` when `query` is
    /// empty).
    pub fn url(&self, query: &str) -> String {
        self.url_to("127.0.0.1", "postgres", query)
    }

    /// `postgres://postgres@HOST:PORT/DATABASE?QUERY` (no `?` when `query` is empty).
    pub fn url_to(&self, host: &str, database: &str, query: &str) -> String {
        let port = self.server.port();
        let base = format!("postgres://postgres@{host}:{port}/{database}");
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

    /// A client certificate (common name `postgres`) and key signed by the CA.
    pub fn client_cert(&self) -> &IssuedCert {
        &self.client
    }

    /// The TCP port the server listens on.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// The server, for its fault controls.
    pub fn server(&self) -> &PostgresServer {
        &self.server
    }

    /// The server, for its fault controls that need `&mut`.
    pub fn server_mut(&mut self) -> &mut PostgresServer {
        &mut self.server
    }
}

/// `CREATE DATABASE name` through the `psql` next to the server binaries.
async fn create_database(port: u16, name: &str) -> Result<(), ServerError> {
    let psql = pg_bin_dir()?.join("psql");
    let output = tokio::process::Command::new(psql)
        .args(["-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-c"])
        .arg(format!("CREATE DATABASE {name}"))
        .arg("-p")
        .arg(port.to_string())
        .env("PGSSLMODE", "disable")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| ServerError::io("running psql", e))?;
    if output.status.success() {
        return Ok(());
    }
    Err(ServerError::Setup {
        server: "postgres",
        step: format!("CREATE DATABASE {name}"),
        detail: format!(
            "{}\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    })
}
