//! A throwaway PgBouncer (Debian's `pgbouncer`) in front of a Postgres server.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use tempfile::TempDir;

use super::control::SupervisedServer;
use super::postgres::{pg_ping, postgres_identity};
use super::process::{Launch, Supervised};
use super::{find_on_path, free_port, temp_dir, ServerError, START_ATTEMPTS};

const SERVER: &str = "pgbouncer";
const READY_TIMEOUT: Duration = Duration::from_secs(15);

/// PgBouncer's `pool_mode`: when a server connection goes back to the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoolMode {
    /// `session`: a client keeps its server connection until it disconnects.
    Session,
    /// `transaction`: a client has a server connection only for one transaction (or
    /// one statement outside a transaction); consecutive transactions may run on
    /// different server connections, each shared with other clients.
    Transaction,
}

impl PoolMode {
    /// The value of `pool_mode` in `pgbouncer.ini`.
    pub fn as_str(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
        }
    }
}

/// Options for [`PgBouncerServer::start`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PgBouncerOptions {
    /// The pooling mode.
    pub mode: PoolMode,
    /// `default_pool_size`: server connections per (database, user) pair. Default 20.
    pub pool_size: u32,
}

impl PgBouncerOptions {
    /// `mode` with the default pool size (20).
    pub fn new(mode: PoolMode) -> Self {
        PgBouncerOptions {
            mode,
            pool_size: 20,
        }
    }

    /// These options with `default_pool_size = size`.
    pub fn with_pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }
}

/// A PgBouncer process listening on a free port of `127.0.0.1`, forwarding every
/// database to a Postgres server on `127.0.0.1:<postgres port>`, with `trust`
/// authentication for user `postgres`, and
/// `ignore_startup_parameters = extra_float_digits,options` (as sqlx users must set).
/// Its config, auth file and log live in a temporary directory. When the test runs as
/// root, it runs as the `postgres` system user (PgBouncer refuses to run as root).
///
/// `server_login_retry` is 1 s (a restarted server is used again within about a
/// second) and `query_wait_timeout` 60 s. Dropping the handle kills the process and
/// deletes the directory.
#[derive(Debug)]
pub struct PgBouncerServer {
    // Declared before `dir` so the process dies before its directory goes.
    process: Supervised,
    port: u16,
    options: PgBouncerOptions,
    dir: TempDir,
}

impl PgBouncerServer {
    /// Writes `pgbouncer.ini` for `options` in front of the Postgres server on
    /// `postgres_port`, starts `pgbouncer` on a free port, and waits (at most 15 s)
    /// until a startup handshake as `postgres` through it reaches `ReadyForQuery`.
    ///
    /// The binary is `DISTLOCK_PGBOUNCER` if set, else `pgbouncer` on `PATH`, else
    /// `/usr/sbin/pgbouncer`. A start that loses its port is retried on a new one.
    ///
    /// # Errors
    /// [`ServerError::NotInstalled`] without the binary (or, as root, without a
    /// `postgres` user); [`ServerError::Exited`] or [`ServerError::StartTimeout`]
    /// (with the log tail) when it does not come up; [`ServerError::Io`] for
    /// file-system or spawn failures.
    pub async fn start(
        postgres_port: u16,
        options: PgBouncerOptions,
    ) -> Result<PgBouncerServer, ServerError> {
        let program = pgbouncer_binary()?;
        let run_as = postgres_identity()?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let dir = temp_dir(SERVER)?;
            if let Some((uid, gid)) = run_as {
                std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).map_err(|e| {
                    ServerError::io(format!("chown {} to postgres", dir.path().display()), e)
                })?;
            }
            let port = free_port()?;
            let auth_file = dir.path().join("userlist.txt");
            std::fs::write(&auth_file, "\"postgres\" \"\"\n")
                .map_err(|e| ServerError::io(format!("writing {}", auth_file.display()), e))?;
            let ini = dir.path().join("pgbouncer.ini");
            let config = format!(
                "[databases]\n\
                 * = host=127.0.0.1 port={postgres_port}\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = trust\n\
                 auth_file = {auth}\n\
                 pool_mode = {mode}\n\
                 default_pool_size = {size}\n\
                 max_client_conn = 500\n\
                 ignore_startup_parameters = extra_float_digits,options\n\
                 server_login_retry = 1\n\
                 query_wait_timeout = 60\n\
                 server_connect_timeout = 5\n\
                 admin_users = postgres\n",
                auth = auth_file.display(),
                mode = options.mode.as_str(),
                size = options.pool_size,
            );
            std::fs::write(&ini, config)
                .map_err(|e| ServerError::io(format!("writing {}", ini.display()), e))?;
            let launch = Launch {
                program: program.clone(),
                args: vec![OsString::from(ini.as_os_str())],
                cwd: dir.path().to_path_buf(),
                run_as,
            };
            let process = Supervised::new(SERVER, launch, dir.path().join("server.log"));
            let mut server = PgBouncerServer {
                process,
                port,
                options: options.clone(),
                dir,
            };
            match server.boot().await {
                Ok(()) => return Ok(server),
                Err(e) if e.is_port_conflict() && attempt < START_ATTEMPTS => continue,
                Err(e) => return Err(e),
            }
        }
    }

    async fn boot(&mut self) -> Result<(), ServerError> {
        self.process.spawn()?;
        let port = self.port;
        self.process
            .wait_ready(READY_TIMEOUT, || pg_ping(port, super::PROBE_TIMEOUT))
            .await
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`, through the pooler.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The TCP port PgBouncer listens on (stable across restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The options it was started with.
    pub fn options(&self) -> &PgBouncerOptions {
        &self.options
    }

    /// The process id, `None` after [`kill`](crate::ServerControl::kill).
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// The temporary directory holding `pgbouncer.ini`, `userlist.txt` and
    /// `server.log`; deleted on drop.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// The file receiving PgBouncer's log.
    pub fn log_path(&self) -> PathBuf {
        self.process.log_path().to_path_buf()
    }
}

#[async_trait::async_trait]
impl SupervisedServer for PgBouncerServer {
    fn process(&self) -> &Supervised {
        &self.process
    }

    fn process_mut(&mut self) -> &mut Supervised {
        &mut self.process
    }

    fn client_url(&self) -> String {
        self.url()
    }

    fn client_port(&self) -> u16 {
        self.port()
    }

    async fn boot_again(&mut self) -> Result<(), ServerError> {
        self.boot().await
    }
}

/// The `pgbouncer` binary: `DISTLOCK_PGBOUNCER`, `PATH`, or `/usr/sbin/pgbouncer`.
fn pgbouncer_binary() -> Result<PathBuf, ServerError> {
    if let Some(path) = std::env::var_os("DISTLOCK_PGBOUNCER") {
        return Ok(PathBuf::from(path));
    }
    let system = PathBuf::from("/usr/sbin/pgbouncer");
    find_on_path(SERVER)
        .or_else(|| system.is_file().then_some(system))
        .ok_or_else(|| ServerError::NotInstalled {
            what: "pgbouncer".into(),
            hint: "install the Debian package `pgbouncer` (scripts/install-deps.sh does), or set DISTLOCK_PGBOUNCER".into(),
        })
}
