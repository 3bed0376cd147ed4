//! A throwaway PostgreSQL cluster (`initdb` + `postgres`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::control::SupervisedServer;
use super::process::{Launch, Supervised};
use super::{free_port, temp_dir, ServerError, START_ATTEMPTS};

const SERVER: &str = "postgres";
const READY_TIMEOUT: Duration = Duration::from_secs(15);
const INITDB_TIMEOUT: Duration = Duration::from_secs(60);

/// Options for [`PostgresServer::start_with`].
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct PostgresServerOptions {
    /// Extra `-c name=value` server settings, applied after the harness's own
    /// (`listen_addresses=127.0.0.1`, `fsync=off`, `synchronous_commit=off`,
    /// `full_page_writes=off`), so they can override them.
    pub settings: Vec<(String, String)>,
}

impl PostgresServerOptions {
    /// These options plus the server setting `name = value` (see [`Self::settings`]).
    pub fn with_setting(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.push((name.into(), value.into()));
        self
    }
}

/// A PostgreSQL server with a fresh cluster in a temporary directory,
/// listening on `127.0.0.1` with `trust` authentication for user `postgres`.
///
/// When the test runs as root, `initdb` and `postgres` (which refuse to run
/// as root) run as the `postgres` system user, which owns the temporary
/// directory.
///
/// Dropping the handle asks the server for a fast shutdown (SIGINT), kills
/// whatever is left after 5 s, removes a SysV shared-memory segment left by a
/// killed server, and deletes the directory.
#[derive(Debug)]
pub struct PostgresServer {
    // Declared before `dir` so the process dies before its directory goes.
    process: Supervised,
    port: u16,
    data_dir: PathBuf,
    dir: TempDir,
}

impl PostgresServer {
    /// Starts a server with the default [`PostgresServerOptions`].
    ///
    /// # Errors
    ///
    /// See [`PostgresServer::start_with`].
    pub async fn start() -> Result<PostgresServer, ServerError> {
        Self::start_with(PostgresServerOptions::default()).await
    }

    /// Makes a fresh cluster in a temporary directory (a copy of one `initdb -A trust
    /// -U postgres` made once per process, deleted when the process exits), starts
    /// `postgres -D DATA -p PORT -k SOCKDIR -c listen_addresses=127.0.0.1 -c
    /// fsync=off ...` on a free port, and waits (at most 15 s) until a
    /// protocol startup handshake as `postgres` reaches `ReadyForQuery`.
    ///
    /// Binaries come from `DISTLOCK_PG_BIN` if set, else
    /// `/usr/lib/postgresql/15/bin`, else the newest
    /// `/usr/lib/postgresql/*/bin` holding `initdb` and `postgres`. A start
    /// that loses its port to another process is retried on a new port.
    ///
    /// # Errors
    ///
    /// [`ServerError::NotInstalled`] when no PostgreSQL binaries are found,
    /// or when running as root and there is no `postgres` user;
    /// [`ServerError::Setup`] when `initdb` or the copy fails (with its output);
    /// [`ServerError::Exited`] or [`ServerError::StartTimeout`] (with the log
    /// tail) when the server does not come up; [`ServerError::Io`] for
    /// file-system or spawn failures.
    pub async fn start_with(config: PostgresServerOptions) -> Result<PostgresServer, ServerError> {
        let bin = pg_bin_dir()?;
        let run_as = postgres_identity()?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let dir = temp_dir(SERVER)?;
            let data_dir = dir.path().join("data");
            let sock_dir = dir.path().join("sock");
            std::fs::create_dir(&sock_dir)
                .map_err(|e| ServerError::io(format!("creating {}", sock_dir.display()), e))?;
            if let Some((uid, gid)) = run_as {
                for path in [dir.path(), sock_dir.as_path()] {
                    std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(|e| {
                        ServerError::io(format!("chown {} to postgres", path.display()), e)
                    })?;
                }
            }
            new_cluster(&bin, &data_dir, run_as).await?;

            let port = free_port()?;
            let mut args: Vec<OsString> = vec![
                "-D".into(),
                data_dir.as_os_str().to_owned(),
                "-p".into(),
                port.to_string().into(),
                "-k".into(),
                sock_dir.as_os_str().to_owned(),
            ];
            let mut settings: Vec<(String, String)> = [
                ("listen_addresses", "127.0.0.1"),
                ("fsync", "off"),
                ("synchronous_commit", "off"),
                ("full_page_writes", "off"),
                ("logging_collector", "off"),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            settings.extend(config.settings.iter().cloned());
            for (name, value) in settings {
                args.push("-c".into());
                args.push(format!("{name}={value}").into());
            }
            let launch = Launch {
                program: bin.join("postgres"),
                args,
                cwd: dir.path().to_path_buf(),
                run_as,
            };
            let process = Supervised::new(SERVER, launch, dir.path().join("server.log"))
                .with_graceful_signal(libc::SIGINT);
            let mut server = PostgresServer {
                process,
                port,
                data_dir,
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

    /// `postgres://postgres@127.0.0.1:PORT/postgres` (no password: `trust`).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The TCP port the server listens on (stable across restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The postmaster's process id, `None` after [`kill`](crate::ServerControl::kill).
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// The cluster directory (`-D`), kept across restarts and deleted on
    /// drop.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The temporary directory holding `data/` (the cluster), `sock/` (the
    /// Unix socket directory) and `server.log`; deleted on drop.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The file receiving the server's stdout and stderr.
    pub fn log_path(&self) -> PathBuf {
        self.process.log_path().to_path_buf()
    }

    /// True while the postmaster is alive (also when paused).
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    /// True between [`pause`](crate::ServerControl::pause) and [`resume`](crate::ServerControl::resume).
    pub fn is_paused(&self) -> bool {
        self.process.is_paused()
    }

    /// Opens a session as `postgres` over TCP and expects `ReadyForQuery`
    /// within `timeout`, then closes it.
    ///
    /// # Errors
    ///
    /// [`ServerError::Probe`] on connection failure, an error response (for
    /// instance "the database system is starting up") or timeout.
    pub async fn ping(&self, timeout: Duration) -> Result<(), ServerError> {
        pg_ping(self.port, timeout).await
    }

    /// Terminates (`pg_terminate_backend`) every client session whose
    /// `application_name` is `application_name`, through the `psql` next to
    /// the server binaries, and returns how many were terminated.
    ///
    /// # Errors
    ///
    /// [`ServerError::NotInstalled`] without the binaries; [`ServerError::Io`]
    /// when `psql` cannot run; [`ServerError::Probe`] when it fails (with its
    /// output) or prints no count.
    pub async fn terminate_sessions(&self, application_name: &str) -> Result<usize, ServerError> {
        terminate_sessions_at(self.port, application_name).await
    }
}

/// Terminates (`pg_terminate_backend`) every session of the server on `port`
/// whose `application_name` is `application_name`, through `psql`, and returns
/// how many there were; see [`PostgresServer::terminate_sessions`].
///
/// # Errors
///
/// [`ServerError::NotInstalled`] without `psql`; [`ServerError::Probe`] when
/// `psql` fails.
pub async fn terminate_sessions_at(
    port: u16,
    application_name: &str,
) -> Result<usize, ServerError> {
    let psql = pg_bin_dir()?.join("psql");
    // A literal in SQL: double any quote.
    let name = application_name.replace('\'', "''");
    let sql = format!(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE application_name = '{name}' AND pid <> pg_backend_pid()"
    );
    let output = tokio::process::Command::new(psql)
        .args([
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-tA",
            "-c",
        ])
        .arg(&sql)
        .arg("-p")
        .arg(port.to_string())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| ServerError::io("running psql", e))?;
    let text = String::from_utf8_lossy(&output.stdout);
    match (output.status.success(), text.trim().parse()) {
        (true, Ok(count)) => Ok(count),
        _ => Err(ServerError::Probe {
            server: SERVER,
            detail: format!(
                "psql failed: {}{}",
                text.trim(),
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        }),
    }
}

#[async_trait::async_trait]
impl SupervisedServer for PostgresServer {
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

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.process.shutdown(Duration::from_secs(5));
        remove_orphaned_shm(&self.data_dir);
    }
}

/// The directory holding `initdb` and `postgres`.
pub(super) fn pg_bin_dir() -> Result<PathBuf, ServerError> {
    let usable = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    if let Some(dir) = std::env::var_os("DISTLOCK_PG_BIN") {
        let dir = PathBuf::from(dir);
        return if usable(&dir) {
            Ok(dir)
        } else {
            Err(ServerError::NotInstalled {
                what: format!("initdb/postgres in DISTLOCK_PG_BIN={}", dir.display()),
                hint: "point DISTLOCK_PG_BIN at a PostgreSQL bin directory".into(),
            })
        };
    }
    let preferred = PathBuf::from("/usr/lib/postgresql/15/bin");
    if usable(&preferred) {
        return Ok(preferred);
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            usable(&bin).then_some((version, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| ServerError::NotInstalled {
            what: "PostgreSQL server binaries (/usr/lib/postgresql/*/bin/initdb)".into(),
            hint: "install the Debian package `postgresql` (scripts/test.sh does), or set DISTLOCK_PG_BIN".into(),
        })
}

/// `Some((uid, gid))` of the `postgres` user when running as root, else
/// `None` (run as the current user).
#[allow(unsafe_code)] // FFI: see the SAFETY notes
pub(super) fn postgres_identity() -> Result<Option<(u32, u32)>, ServerError> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let not_found = |detail: String| {
        ServerError::NotInstalled {
        what: "system user `postgres` (initdb/postgres refuse to run as root)".into(),
        hint: format!(
            "{detail}; install the Debian package `postgresql`, which creates it, or run `adduser --system --group postgres`"
        ),
    }
    };
    let id = |flag: &str| -> Result<u32, ServerError> {
        let out = std::process::Command::new("id")
            .args([flag, "postgres"])
            .output()
            .map_err(|e| not_found(format!("running `id {flag} postgres`: {e}")))?;
        if !out.status.success() {
            return Err(not_found(
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            ));
        }
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .map_err(|e| not_found(format!("parsing `id {flag} postgres`: {e}")))
    };
    let uid = id("-u")?;
    let gid = id("-g")?;
    if uid == 0 {
        return Err(not_found("user `postgres` has uid 0".into()));
    }
    Ok(Some((uid, gid)))
}

/// A cluster `initdb` made once for this process, which every server copies: a copy
/// takes a fraction of `initdb`'s time (its bootstrap runs hundreds of SQL
/// statements), and test binaries start dozens of servers. Deleted at exit.
static TEMPLATE: Mutex<Option<TempDir>> = Mutex::new(None);

extern "C" fn remove_template() {
    if let Ok(mut template) = TEMPLATE.lock() {
        template.take();
    }
}

/// The template cluster's data directory and the binaries that made it.
async fn template(
    bin: &Path,
    run_as: Option<(u32, u32)>,
) -> Result<&'static (PathBuf, PathBuf), ServerError> {
    static MADE: tokio::sync::OnceCell<(PathBuf, PathBuf)> = tokio::sync::OnceCell::const_new();
    MADE.get_or_try_init(|| async {
        let dir = temp_dir("postgres-template")?;
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).map_err(|e| {
                ServerError::io(format!("chown {} to postgres", dir.path().display()), e)
            })?;
        }
        let data_dir = dir.path().join("data");
        initdb(bin, &data_dir, dir.path(), run_as).await?;
        let mut kept = TEMPLATE.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.is_none() {
            register_template_removal();
        }
        *kept = Some(dir);
        Ok((bin.to_path_buf(), data_dir))
    })
    .await
}

#[allow(unsafe_code)] // FFI: see the SAFETY note
fn register_template_removal() {
    // SAFETY: registers a plain `extern "C"` function with no captured state.
    unsafe {
        libc::atexit(remove_template);
    }
}

/// Makes a fresh cluster in `data_dir`: a copy (`cp -a`, keeping owners and modes) of
/// this process's template, or `initdb` itself when `bin` is not the template's.
async fn new_cluster(
    bin: &Path,
    data_dir: &Path,
    run_as: Option<(u32, u32)>,
) -> Result<(), ServerError> {
    let (made_by, template) = template(bin, run_as).await?;
    if made_by != bin {
        let cwd = data_dir.parent().unwrap_or(data_dir);
        return initdb(bin, data_dir, cwd, run_as).await;
    }
    let copy = tokio::process::Command::new("cp")
        .arg("-a")
        .arg(template)
        .arg(data_dir)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(INITDB_TIMEOUT, copy)
        .await
        .map_err(|_| ServerError::Setup {
            server: SERVER,
            step: "copying the template cluster".into(),
            detail: format!("did not finish within {INITDB_TIMEOUT:?}"),
        })?
        .map_err(|e| ServerError::io("running cp", e))?;
    if output.status.success() {
        return Ok(());
    }
    Err(ServerError::Setup {
        server: SERVER,
        step: "copying the template cluster".into(),
        detail: format!(
            "{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ),
    })
}

async fn initdb(
    bin: &Path,
    data_dir: &Path,
    cwd: &Path,
    run_as: Option<(u32, u32)>,
) -> Result<(), ServerError> {
    let mut cmd = tokio::process::Command::new(bin.join("initdb"));
    cmd.arg("-D")
        .arg(data_dir)
        .args([
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ])
        .current_dir(cwd)
        .env("LC_ALL", "C")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    if let Some((uid, gid)) = run_as {
        cmd.gid(gid).uid(uid);
    }
    let output = tokio::time::timeout(INITDB_TIMEOUT, cmd.output())
        .await
        .map_err(|_| ServerError::Setup {
            server: SERVER,
            step: "initdb".into(),
            detail: format!("did not finish within {INITDB_TIMEOUT:?}"),
        })?
        .map_err(|e| ServerError::io(format!("running {}", bin.join("initdb").display()), e))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(ServerError::Setup {
            server: SERVER,
            step: "initdb".into(),
            detail: format!(
                "{}\nstdout:\n{}\nstderr:\n{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        })
    }
}

/// A killed postmaster leaves its SysV shared-memory segment behind (a later
/// restart on the same directory would remove it). Remove it at drop so
/// repeated test runs do not exhaust the system's segment limit.
#[allow(unsafe_code)] // FFI: see the SAFETY notes
fn remove_orphaned_shm(data_dir: &Path) {
    // postmaster.pid exists only if the server did not shut down cleanly.
    // Line 7 is "<key> <shmid>".
    let Ok(text) = std::fs::read_to_string(data_dir.join("postmaster.pid")) else {
        return;
    };
    let Some(shmid) = text
        .lines()
        .nth(6)
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|id| id.parse::<libc::c_int>().ok())
    else {
        return;
    };
    // SAFETY: shmid_ds is plain old data; shmctl writes into it only for
    // IPC_STAT and reads nothing for IPC_RMID.
    unsafe {
        let mut ds: libc::shmid_ds = std::mem::zeroed();
        if libc::shmctl(shmid, libc::IPC_STAT, &mut ds) == 0 && ds.shm_nattch == 0 {
            libc::shmctl(shmid, libc::IPC_RMID, std::ptr::null_mut());
        }
    }
}

/// Opens a protocol-3 session as `postgres`/`postgres` on 127.0.0.1:`port`
/// and expects `AuthenticationOk` followed by `ReadyForQuery`.
pub(crate) async fn pg_ping(port: u16, timeout: Duration) -> Result<(), ServerError> {
    match tokio::time::timeout(timeout, pg_handshake(port)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(detail)) => Err(ServerError::Probe {
            server: SERVER,
            detail,
        }),
        Err(_) => Err(ServerError::Probe {
            server: SERVER,
            detail: format!("no ReadyForQuery within {timeout:?}"),
        }),
    }
}

async fn pg_handshake(port: u16) -> Result<(), String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect to 127.0.0.1:{port}: {e}"))?;
    let mut body = Vec::new();
    body.extend_from_slice(&196_608_i32.to_be_bytes()); // protocol 3.0
    for part in ["user", "postgres", "database", "postgres"] {
        body.extend_from_slice(part.as_bytes());
        body.push(0);
    }
    body.push(0);
    let len = i32::try_from(body.len() + 4).map_err(|e| e.to_string())?;
    let mut msg = len.to_be_bytes().to_vec();
    msg.extend_from_slice(&body);
    stream
        .write_all(&msg)
        .await
        .map_err(|e| format!("write startup message: {e}"))?;
    loop {
        let tag = stream
            .read_u8()
            .await
            .map_err(|e| format!("read message type: {e}"))?;
        let len = stream
            .read_i32()
            .await
            .map_err(|e| format!("read message length: {e}"))?;
        let len = usize::try_from(len.saturating_sub(4))
            .map_err(|_| format!("bad message length {len}"))?;
        if len > 1 << 20 {
            return Err(format!("implausible message length {len}"));
        }
        let mut payload = vec![0; len];
        stream
            .read_exact(&mut payload)
            .await
            .map_err(|e| format!("read message body: {e}"))?;
        match tag {
            b'R' => {
                let code = payload.get(..4).map(|b| [b[0], b[1], b[2], b[3]]);
                if code != Some([0, 0, 0, 0]) {
                    return Err(format!(
                        "server asked for authentication {code:?}; expected trust"
                    ));
                }
            }
            b'E' => return Err(format!("error response: {}", pg_error_message(&payload))),
            b'Z' => {
                // Terminate; the session is done either way.
                let _ = stream.write_all(&[b'X', 0, 0, 0, 4]).await;
                return Ok(());
            }
            // ParameterStatus, BackendKeyData, NoticeResponse, ...
            _ => {}
        }
    }
}

/// The severity, SQLSTATE and message fields of an ErrorResponse body.
fn pg_error_message(payload: &[u8]) -> String {
    let mut parts = Vec::new();
    for field in payload.split(|&b| b == 0) {
        if let Some((&kind, value)) = field.split_first() {
            if matches!(kind, b'S' | b'C' | b'M') {
                parts.push(String::from_utf8_lossy(value).into_owned());
            }
        }
    }
    parts.join(" ")
}
