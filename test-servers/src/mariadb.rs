//! A throwaway MariaDB server (`mariadb-install-db` + `mariadbd`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use super::control::SupervisedServer;
use super::process::{Launch, Supervised};
use super::{free_port, temp_dir, ServerError, START_ATTEMPTS};

const SERVER: &str = "mariadb";
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const SETUP_TIMEOUT: Duration = Duration::from_secs(60);

/// The user, password and database every [`MariaDbServer`] has for its clients.
pub const MARIADB_USER: &str = "distlock";
/// See [`MARIADB_USER`].
pub const MARIADB_PASSWORD: &str = "distlock-test";
/// See [`MARIADB_USER`].
pub const MARIADB_DATABASE: &str = "distlock";

/// Server options small enough for a throwaway server, shared by the install and
/// every start (InnoDB's files must be made and opened with the same sizes).
const SMALL: [&str; 4] = [
    "--innodb-log-file-size=8M",
    "--innodb-buffer-pool-size=32M",
    "--skip-log-bin",
    "--innodb-data-file-path=ibdata1:4M:autoextend",
];

/// A MariaDB server with a fresh data directory in a temporary directory, listening
/// on `127.0.0.1` with a user [`MARIADB_USER`] (password [`MARIADB_PASSWORD`]) that
/// has every right on the database [`MARIADB_DATABASE`], and `root` without a
/// password (for the tests' administration through [`MariaDbServer::sql`]).
///
/// When the test runs as root, `mariadbd` runs as root too (`--user=root`).
/// Dropping the handle asks the server to shut down (SIGTERM), kills whatever is left
/// after 5 s, and deletes the directory.
#[derive(Debug)]
pub struct MariaDbServer {
    // Declared before `dir` so the process dies before its directory goes.
    process: Supervised,
    port: u16,
    dir: TempDir,
}

impl MariaDbServer {
    /// Makes a data directory with `mariadb-install-db --no-defaults
    /// --auth-root-authentication-method=normal`, starts `mariadbd --no-defaults
    /// --datadir DATA --port PORT --bind-address=127.0.0.1 --socket SOCK` on a free
    /// port, waits (at most 30 s) until it sends its handshake, then creates the
    /// user and database through the `mariadb` client. A start that loses its port to
    /// another process is retried on a new port.
    ///
    /// # Errors
    /// [`ServerError::NotInstalled`] without `mariadbd`, `mariadb-install-db` or
    /// `mariadb` (Debian's `mariadb-server` and `mariadb-client`);
    /// [`ServerError::Setup`] when the install or the user's creation fails (with its
    /// output); [`ServerError::Exited`] or [`ServerError::StartTimeout`] (with the log
    /// tail) when the server does not come up; [`ServerError::Io`] for file-system or
    /// spawn failures.
    pub async fn start() -> Result<MariaDbServer, ServerError> {
        MariaDbServer::start_with(&[]).await
    }

    /// As [`MariaDbServer::start`], with `server_args` added to `mariadbd`'s command
    /// line (such as `--ssl-cert=FILE`).
    ///
    /// # Errors
    /// As [`MariaDbServer::start`].
    pub async fn start_with(server_args: &[String]) -> Result<MariaDbServer, ServerError> {
        let bin = Binaries::find()?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let dir = temp_dir(SERVER)?;
            let data_dir = dir.path().join("data");
            // The server's own temporary directory: two installs at once in the shared
            // /tmp were seen to fail together ("Could not remove temporary table").
            let tmp_dir = dir.path().join("tmp");
            std::fs::create_dir(&tmp_dir)
                .map_err(|e| ServerError::io(format!("creating {}", tmp_dir.display()), e))?;
            let tmp_arg = format!("--tmpdir={}", tmp_dir.display());
            install(&bin, &data_dir, &tmp_arg, dir.path()).await?;
            let port = free_port()?;
            let mut args: Vec<OsString> = vec![
                "--no-defaults".into(),
                format!("--datadir={}", data_dir.display()).into(),
                format!("--port={port}").into(),
                "--bind-address=127.0.0.1".into(),
                format!("--socket={}", dir.path().join("sock").display()).into(),
                format!("--pid-file={}", dir.path().join("mariadbd.pid").display()).into(),
                "--max-connections=500".into(),
                "--skip-name-resolve".into(),
                tmp_arg.clone().into(),
            ];
            args.extend(SMALL.iter().map(OsString::from));
            args.extend(server_args.iter().map(OsString::from));
            if running_as_root() {
                args.push("--user=root".into());
            }
            let launch = Launch {
                program: bin.server.clone(),
                args,
                cwd: dir.path().to_path_buf(),
                run_as: None,
            };
            let process = Supervised::new(SERVER, launch, dir.path().join("server.log"))
                .with_graceful_signal(libc::SIGTERM);
            let mut server = MariaDbServer { process, port, dir };
            match server.boot().await {
                Ok(()) => {}
                Err(e) if e.is_port_conflict() && attempt < START_ATTEMPTS => continue,
                Err(e) => return Err(e),
            }
            let setup = format!(
                "CREATE DATABASE {MARIADB_DATABASE}; \
                 CREATE USER '{MARIADB_USER}'@'%' IDENTIFIED BY '{MARIADB_PASSWORD}'; \
                 GRANT ALL ON {MARIADB_DATABASE}.* TO '{MARIADB_USER}'@'%'; \
                 CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'; \
                 GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;"
            );
            server.sql(&setup).await.map_err(|e| ServerError::Setup {
                server: SERVER,
                step: "creating the test user and database".into(),
                detail: e.to_string(),
            })?;
            return Ok(server);
        }
    }

    async fn boot(&mut self) -> Result<(), ServerError> {
        self.process.spawn()?;
        let port = self.port;
        self.process
            .wait_ready(READY_TIMEOUT, || handshake(port))
            .await
    }

    /// `mysql://distlock:distlock-test@127.0.0.1:PORT/distlock`.
    pub fn url(&self) -> String {
        format!(
            "mysql://{MARIADB_USER}:{MARIADB_PASSWORD}@127.0.0.1:{}/{MARIADB_DATABASE}",
            self.port
        )
    }

    /// The TCP port the server listens on (stable across restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id, `None` after [`kill`](crate::ServerControl::kill).
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// The temporary directory holding `data/`, the socket and `server.log`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Runs `sql` (one or more statements) as `root` through the `mariadb` client on
    /// the server's Unix socket, in the database [`MARIADB_DATABASE`] once it exists,
    /// and returns what it printed (tab-separated, no column names).
    ///
    /// # Errors
    /// [`ServerError::NotInstalled`] without the client; [`ServerError::Probe`] when it
    /// fails (with its output) or does not finish within 60 s.
    pub async fn sql(&self, sql: &str) -> Result<String, ServerError> {
        client_sql(&self.dir.path().join("sock"), "root", sql).await
    }

    /// The connection ids of the server's sessions of `user`, per the process list.
    ///
    /// # Errors
    /// As [`MariaDbServer::sql`]; [`ServerError::Probe`] for an id that is no number.
    pub async fn connections_of(&self, user: &str) -> Result<Vec<u64>, ServerError> {
        connections_of(self.port, user).await
    }

    /// `KILL CONNECTION` of every session of `user`; how many there were.
    ///
    /// # Errors
    /// As [`MariaDbServer::sql`].
    pub async fn kill_connections_of(&self, user: &str) -> Result<usize, ServerError> {
        kill_connections_of(self.port, user).await
    }

    /// The file receiving the server's stdout and stderr.
    pub fn log_path(&self) -> PathBuf {
        self.process.log_path().to_path_buf()
    }
}

/// Runs `sql` as `user` (password `password`, `None` for none) over TCP through the
/// `mariadb` client on the server at 127.0.0.1:`port`, in the database
/// [`MARIADB_DATABASE`], as a foreign program would, and returns what it printed
/// (tab-separated, no column names). Every [`MariaDbServer`] has `root` without a
/// password at 127.0.0.1, with every right.
///
/// # Errors
/// [`ServerError::NotInstalled`] without the client; [`ServerError::Probe`] when it
/// fails (with its output) or does not finish within 60 s.
pub async fn mariadb_sql(
    port: u16,
    user: &str,
    password: Option<&str>,
    sql: &str,
) -> Result<String, ServerError> {
    let bin = Binaries::find()?;
    let mut cmd = tokio::process::Command::new(&bin.client);
    cmd.arg("--no-defaults")
        .arg("-h127.0.0.1")
        .arg(format!("-P{port}"))
        .arg(format!("-u{user}"));
    if let Some(password) = password {
        cmd.arg(format!("-p{password}"));
    }
    cmd.args(["-N", "-B", MARIADB_DATABASE, "-e"])
        .arg(sql)
        .kill_on_drop(true);
    finish(cmd.output()).await
}

/// The connection ids of the sessions of `user` on the server at 127.0.0.1:`port`.
///
/// # Errors
/// As [`mariadb_sql`]; [`ServerError::Probe`] for an id that is no number.
pub async fn connections_of(port: u16, user: &str) -> Result<Vec<u64>, ServerError> {
    let text = mariadb_sql(
        port,
        "root",
        None,
        &format!(
            "SELECT id FROM information_schema.processlist WHERE user = '{}'",
            user.replace('\'', "''")
        ),
    )
    .await?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            l.trim().parse().map_err(|_| ServerError::Probe {
                server: SERVER,
                detail: format!("processlist id {l:?} is no number"),
            })
        })
        .collect()
}

/// `KILL CONNECTION` of every session of `user` on the server at 127.0.0.1:`port`;
/// how many there were.
///
/// # Errors
/// As [`mariadb_sql`].
pub async fn kill_connections_of(port: u16, user: &str) -> Result<usize, ServerError> {
    let ids = connections_of(port, user).await?;
    for id in &ids {
        // A session may end on its own meanwhile: that is what was wanted.
        let _ = mariadb_sql(port, "root", None, &format!("KILL CONNECTION {id}")).await;
    }
    Ok(ids.len())
}

#[async_trait::async_trait]
impl SupervisedServer for MariaDbServer {
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

impl Drop for MariaDbServer {
    fn drop(&mut self) {
        self.process.shutdown(Duration::from_secs(5));
    }
}

/// Where the MariaDB programs are.
struct Binaries {
    server: PathBuf,
    install: PathBuf,
    client: PathBuf,
}

impl Binaries {
    fn find() -> Result<Binaries, ServerError> {
        let find = |names: &[&str], dirs: &[&str]| -> Option<PathBuf> {
            dirs.iter()
                .flat_map(|d| names.iter().map(move |n| Path::new(d).join(n)))
                .find(|p| p.is_file())
        };
        let missing = |what: &str| ServerError::NotInstalled {
            what: what.into(),
            hint: "install the Debian packages `mariadb-server` and `mariadb-client` \
                   (scripts/install-deps.sh does)"
                .into(),
        };
        let dirs = ["/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"];
        Ok(Binaries {
            server: find(&["mariadbd", "mysqld"], &dirs).ok_or_else(|| missing("mariadbd"))?,
            install: find(&["mariadb-install-db", "mysql_install_db"], &dirs)
                .ok_or_else(|| missing("mariadb-install-db"))?,
            client: find(&["mariadb", "mysql"], &dirs).ok_or_else(|| missing("mariadb"))?,
        })
    }
}

#[allow(unsafe_code)] // FFI: see the SAFETY note
fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// `mariadb-install-db` into `data_dir`, with the server's `--tmpdir=` argument.
async fn install(
    bin: &Binaries,
    data_dir: &Path,
    tmp_arg: &str,
    cwd: &Path,
) -> Result<(), ServerError> {
    let mut cmd = tokio::process::Command::new(&bin.install);
    cmd.arg("--no-defaults")
        .arg(format!("--datadir={}", data_dir.display()))
        .arg(tmp_arg)
        .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
        .args(SMALL)
        .current_dir(cwd)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    if running_as_root() {
        cmd.arg("--user=root");
    }
    let output = tokio::time::timeout(SETUP_TIMEOUT, cmd.output())
        .await
        .map_err(|_| ServerError::Setup {
            server: SERVER,
            step: "mariadb-install-db".into(),
            detail: format!("did not finish within {SETUP_TIMEOUT:?}"),
        })?
        .map_err(|e| ServerError::io(format!("running {}", bin.install.display()), e))?;
    if output.status.success() {
        return Ok(());
    }
    Err(ServerError::Setup {
        server: SERVER,
        step: "mariadb-install-db".into(),
        detail: format!(
            "{}\nstdout:\n{}\nstderr:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    })
}

/// Runs `sql` through the `mariadb` client on `socket` as `user`.
async fn client_sql(socket: &Path, user: &str, sql: &str) -> Result<String, ServerError> {
    let bin = Binaries::find()?;
    let mut cmd = tokio::process::Command::new(&bin.client);
    cmd.arg("--no-defaults")
        .arg(format!("--socket={}", socket.display()))
        .arg(format!("-u{user}"))
        .args(["-N", "-B", "-e"])
        .arg(sql)
        .kill_on_drop(true);
    finish(cmd.output()).await
}

async fn finish(
    output: impl std::future::Future<Output = std::io::Result<std::process::Output>>,
) -> Result<String, ServerError> {
    let output = tokio::time::timeout(SETUP_TIMEOUT, output)
        .await
        .map_err(|_| ServerError::Probe {
            server: SERVER,
            detail: format!("the mariadb client did not finish within {SETUP_TIMEOUT:?}"),
        })?
        .map_err(|e| ServerError::io("running the mariadb client", e))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(ServerError::Probe {
            server: SERVER,
            detail: format!(
                "the mariadb client failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        })
    }
}

/// Connects to 127.0.0.1:`port` and expects the server's initial handshake packet
/// (protocol version 10), not an error packet (such as "starting up").
async fn handshake(port: u16) -> Result<(), ServerError> {
    let probe = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| format!("connect to 127.0.0.1:{port}: {e}"))?;
        let mut header = [0u8; 5];
        stream
            .read_exact(&mut header)
            .await
            .map_err(|e| format!("read the handshake: {e}"))?;
        match header[4] {
            10 => Ok(()),
            0xff => Err("the server answered with an error packet".to_owned()),
            other => Err(format!("unexpected handshake protocol {other}")),
        }
    };
    probe.await.map_err(|detail| ServerError::Probe {
        server: SERVER,
        detail,
    })
}

/// How many fault-kit clients [`add_fault_users`] makes users for.
pub const MARIADB_FAULT_CLIENTS: usize = 128;

/// The client URL template of the fault kit on MariaDB: client `N` logs in as the
/// user `faultN` ([`add_fault_users`]), so that its sessions can be told apart and
/// killed ([`kill_connections_of`]).
pub const MARIADB_FAULT_URL_TEMPLATE: &str = "mysql://fault{client}:distlock-test@{hosts}/distlock";

/// Creates the users `fault0` … `fault127` (password [`MARIADB_PASSWORD`], every
/// right on [`MARIADB_DATABASE`]) on the server at 127.0.0.1:`port`, for
/// [`MARIADB_FAULT_URL_TEMPLATE`].
///
/// # Errors
/// As [`mariadb_sql`].
pub async fn add_fault_users(port: u16) -> Result<(), ServerError> {
    let mut sql = String::new();
    for client in 0..MARIADB_FAULT_CLIENTS {
        sql.push_str(&format!(
            "CREATE USER IF NOT EXISTS 'fault{client}'@'%' IDENTIFIED BY '{MARIADB_PASSWORD}'; \
             GRANT ALL ON {MARIADB_DATABASE}.* TO 'fault{client}'@'%'; "
        ));
    }
    mariadb_sql(port, "root", None, &sql).await.map(|_| ())
}
