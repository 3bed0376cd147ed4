//! A throwaway PostgreSQL server with TLS (`ssl=on`), its certificates from
//! [`TlsFiles`], and one database that admits only clients with a certificate.

use std::path::Path;

use super::openssl_ca::{set_mode, TlsFiles};
use super::postgres::{pg_bin_dir, postgres_identity};
use super::{with_query, PostgresServer, PostgresServerOptions, ServerError};

/// The database of a [`PostgresTlsServer`] that takes only TLS sessions presenting a
/// client certificate signed by the server's CA (`hostssl … clientcert=verify-ca`).
pub const CLIENT_CERT_DATABASE: &str = "certdb";

/// A [`PostgresServer`] with `ssl=on`, listening on `127.0.0.1` and `127.0.0.2`, with
/// the certificates of [`TlsFiles`] (client common name `postgres`).
///
/// Authentication is `trust` for user `postgres`, over TLS or plaintext, in every
/// database but [`CLIENT_CERT_DATABASE`], which takes TLS sessions with a client
/// certificate signed by the CA ([`TlsFiles::client_cert`]) only.
///
/// Dropping it stops the server, then deletes the certificates.
#[derive(Debug)]
pub struct PostgresTlsServer {
    // Declared first so the server stops before its certificates go.
    server: PostgresServer,
    tls: TlsFiles,
}

impl PostgresTlsServer {
    /// Makes the CAs and certificates with `openssl`, starts the server (see
    /// [`PostgresServer::start_with`]) and creates [`CLIENT_CERT_DATABASE`] with `psql`.
    ///
    /// # Errors
    /// As [`TlsFiles::create`] and [`PostgresServer::start_with`];
    /// [`ServerError::Setup`] when `psql` cannot create the database.
    pub async fn start() -> Result<PostgresTlsServer, ServerError> {
        let tls = TlsFiles::create("postgres", "postgres").await?;
        let (ca, server_cert) = (tls.ca(), tls.server_cert());
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
        Ok(PostgresTlsServer { server, tls })
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres?QUERY` (no `?` when `query` is
    /// empty).
    pub fn url(&self, query: &str) -> String {
        self.url_to("127.0.0.1", "postgres", query)
    }

    /// `postgres://postgres@HOST:PORT/DATABASE?QUERY` (no `?` when `query` is empty).
    pub fn url_to(&self, host: &str, database: &str, query: &str) -> String {
        let port = self.server.port();
        with_query(
            format!("postgres://postgres@{host}:{port}/{database}"),
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
