//! Throwaway Apache ZooKeeper servers: standalone and loopback ensembles.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::control::SupervisedServer;
use super::process::{Launch, Supervised};
use super::{
    find_on_path, free_ports, temp_dir, ServerControl, ServerError, PROBE_INTERVAL, START_ATTEMPTS,
};

const SERVER: &str = "zookeeper";

/// Options for [`ZooKeeperServer::start_with`] and
/// [`ZooKeeperEnsemble::start_with`].
///
/// The defaults favour fast failure scenarios: a 200 ms tick and a 400 ms
/// minimum session timeout let session-expiry tests run in about a second.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ZooKeeperServerOptions {
    /// `tickTime` in milliseconds. Default 200.
    pub tick_time_ms: u32,
    /// `minSessionTimeout` in milliseconds. Default 400.
    pub min_session_timeout_ms: u32,
    /// `maxSessionTimeout` in milliseconds. Default 20 000.
    pub max_session_timeout_ms: u32,
    /// `initLimit` in ticks (ensembles only). Default 50 (10 s at 200 ms).
    pub init_limit: u32,
    /// `syncLimit` in ticks (ensembles only): how long a leader or follower
    /// tolerates a silent peer. Default 15 (3 s at 200 ms).
    pub sync_limit: u32,
    /// JVM maximum heap in MiB (`-Xmx`). Default 256.
    pub max_heap_mb: u32,
    /// How long to wait for each readiness phase (JVM start, then for an
    /// ensemble the election). Default 30 s.
    pub ready_timeout: Duration,
    /// Extra `key=value` lines appended to `zoo.cfg`.
    pub extra_config: Vec<String>,
}

impl Default for ZooKeeperServerOptions {
    fn default() -> Self {
        ZooKeeperServerOptions {
            tick_time_ms: 200,
            min_session_timeout_ms: 400,
            max_session_timeout_ms: 20_000,
            init_limit: 50,
            sync_limit: 15,
            max_heap_mb: 256,
            ready_timeout: Duration::from_secs(30),
            extra_config: Vec::new(),
        }
    }
}

/// What a ZooKeeper server reports as its role (the `Mode:` line of `srvr`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ZooKeeperMode {
    /// A single server that is not part of an ensemble.
    Standalone,
    /// The ensemble's current leader.
    Leader,
    /// A follower that is synced with the leader.
    Follower,
    /// A non-voting observer.
    Observer,
    /// The server answers but does not serve requests (no quorum, election
    /// in progress, still loading).
    NotServing,
    /// Any other reply.
    Other(String),
}

impl ZooKeeperMode {
    /// True for modes in which the server serves client requests.
    pub fn is_serving(&self) -> bool {
        matches!(
            self,
            ZooKeeperMode::Standalone
                | ZooKeeperMode::Leader
                | ZooKeeperMode::Follower
                | ZooKeeperMode::Observer
        )
    }

    fn parse(srvr: &str) -> ZooKeeperMode {
        if srvr.contains("not currently serving") {
            return ZooKeeperMode::NotServing;
        }
        match srvr
            .lines()
            .find_map(|line| line.strip_prefix("Mode:"))
            .map(str::trim)
        {
            Some("standalone") => ZooKeeperMode::Standalone,
            Some("leader") => ZooKeeperMode::Leader,
            Some("follower") => ZooKeeperMode::Follower,
            Some("observer") => ZooKeeperMode::Observer,
            Some(other) => ZooKeeperMode::Other(other.to_string()),
            None => ZooKeeperMode::Other(srvr.trim().chars().take(120).collect()),
        }
    }
}

impl fmt::Display for ZooKeeperMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ZooKeeperMode::Standalone => f.write_str("standalone"),
            ZooKeeperMode::Leader => f.write_str("leader"),
            ZooKeeperMode::Follower => f.write_str("follower"),
            ZooKeeperMode::Observer => f.write_str("observer"),
            ZooKeeperMode::NotServing => f.write_str("not serving"),
            ZooKeeperMode::Other(s) => write!(f, "other({s})"),
        }
    }
}

/// One ZooKeeper server JVM (`QuorumPeerMain`) with its config, data and log
/// in a temporary directory: either standalone or one node of a
/// [`ZooKeeperEnsemble`].
///
/// Dropping the handle SIGKILLs the JVM, reaps it and deletes the directory.
#[derive(Debug)]
pub struct ZooKeeperServer {
    // Declared before `dir` so the process dies before its directory goes.
    process: Supervised,
    client_port: u16,
    /// `myid` for ensemble members.
    id: Option<u32>,
    ready_timeout: Duration,
    dir: TempDir,
}

impl ZooKeeperServer {
    /// Starts a standalone server with the default [`ZooKeeperServerOptions`].
    ///
    /// # Errors
    ///
    /// See [`ZooKeeperServer::start_with`].
    pub async fn start() -> Result<ZooKeeperServer, ServerError> {
        Self::start_with(ZooKeeperServerOptions::default()).await
    }

    /// Starts a standalone server on a free loopback port and waits (at most
    /// `config.ready_timeout`) until it answers `ruok` with `imok` and `srvr`
    /// reports `Mode: standalone`.
    ///
    /// Runs `java ... -cp CP org.apache.zookeeper.server.quorum.QuorumPeerMain
    /// zoo.cfg` with `admin.enableServer=false`, `4lw.commands.whitelist=*` and
    /// `maxClientCnxns=0`: every client here comes from 127.0.0.1, and past
    /// ZooKeeper's default of 60 connections per address the server closes each new
    /// one unanswered (`distlock bench --compare`, whose hot key opens a client per
    /// worker and side, then met it at its holding row). Server logging goes to
    /// `server.log` in the temporary directory. A start that loses its port is retried.
    ///
    /// # Errors
    ///
    /// [`ServerError::NotInstalled`] when `java` or the ZooKeeper jars are
    /// missing; [`ServerError::Exited`] or [`ServerError::StartTimeout`]
    /// (with the log tail) when the server does not come up;
    /// [`ServerError::Io`] for file-system or spawn failures.
    pub async fn start_with(
        config: ZooKeeperServerOptions,
    ) -> Result<ZooKeeperServer, ServerError> {
        let runtime = JavaRuntime::find()?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = free_ports(1)?
                .pop()
                .ok_or_else(|| ServerError::InvalidArgument("no port allocated".into()))?;
            let mut server = ZooKeeperServer::prepare(&runtime, &config, port, None, &[])?;
            match server.boot(true).await {
                Ok(()) => return Ok(server),
                Err(e) if e.is_port_conflict() && attempt < START_ATTEMPTS => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes the config into a fresh temp dir; does not start the JVM.
    fn prepare(
        runtime: &JavaRuntime,
        config: &ZooKeeperServerOptions,
        client_port: u16,
        id: Option<u32>,
        peers: &[(u16, u16)],
    ) -> Result<ZooKeeperServer, ServerError> {
        let dir = temp_dir(SERVER)?;
        let data_dir = dir.path().join("data");
        std::fs::create_dir(&data_dir)
            .map_err(|e| ServerError::io(format!("creating {}", data_dir.display()), e))?;
        let mut cfg = format!(
            "tickTime={}\ndataDir={}\nclientPort={}\nclientPortAddress=127.0.0.1\n\
             minSessionTimeout={}\nmaxSessionTimeout={}\nadmin.enableServer=false\n\
             4lw.commands.whitelist=*\nmaxClientCnxns=0\n",
            config.tick_time_ms,
            data_dir.display(),
            client_port,
            config.min_session_timeout_ms,
            config.max_session_timeout_ms,
        );
        if let Some(id) = id {
            cfg.push_str(&format!(
                "initLimit={}\nsyncLimit={}\n",
                config.init_limit, config.sync_limit
            ));
            for (n, (peer, election)) in peers.iter().enumerate() {
                cfg.push_str(&format!("server.{}=127.0.0.1:{peer}:{election}\n", n + 1));
            }
            write_file(&data_dir.join("myid"), &format!("{id}\n"))?;
        }
        for line in &config.extra_config {
            cfg.push_str(line);
            cfg.push('\n');
        }
        let cfg_path = dir.path().join("zoo.cfg");
        write_file(&cfg_path, &cfg)?;
        let log4j_path = dir.path().join("log4j.properties");
        write_file(
            &log4j_path,
            "log4j.rootLogger=INFO, CONSOLE\n\
             log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender\n\
             log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout\n\
             log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p [%t] %c{1}: %m%n\n",
        )?;
        let mut args: Vec<OsString> = vec![
            "-Xms16m".into(),
            format!("-Xmx{}m", config.max_heap_mb).into(),
            "-XX:+UseSerialGC".into(),
            "-XX:TieredStopAtLevel=1".into(),
            "-XX:-UsePerfData".into(),
            "-XX:+ExitOnOutOfMemoryError".into(),
            "-Djava.net.preferIPv4Stack=true".into(),
            "-Dzookeeper.forceSync=no".into(),
            "-Dzookeeper.preAllocSize=1024".into(),
            "-Dzookeeper.jmx.log4j.disable=true".into(),
            // Empty container nodes are reaped every 500 ms instead of every minute, so
            // a test can watch a lock directory go.
            "-Dznode.container.checkIntervalMs=500".into(),
            format!("-Dlog4j.configuration=file:{}", log4j_path.display()).into(),
            "-cp".into(),
            runtime.classpath.clone(),
            "org.apache.zookeeper.server.quorum.QuorumPeerMain".into(),
        ];
        args.push(cfg_path.into_os_string());
        let launch = Launch {
            program: runtime.java.clone(),
            args,
            cwd: dir.path().to_path_buf(),
            run_as: None,
        };
        let process = Supervised::new(SERVER, launch, dir.path().join("server.log"));
        Ok(ZooKeeperServer {
            process,
            client_port,
            id,
            ready_timeout: config.ready_timeout,
            dir,
        })
    }

    /// Spawns the JVM and waits for `ruok` (and, if `serving`, a serving
    /// `srvr` mode).
    async fn boot(&mut self, serving: bool) -> Result<(), ServerError> {
        self.process.spawn()?;
        self.wait_ready(serving).await
    }

    async fn wait_ready(&mut self, serving: bool) -> Result<(), ServerError> {
        let port = self.client_port;
        let timeout = self.ready_timeout;
        self.process
            .wait_ready(timeout, || async move {
                let reply = four_letter(port, "ruok", super::PROBE_TIMEOUT).await?;
                if reply.trim() != "imok" {
                    return Err(probe_error(format!("ruok answered {reply:?}")));
                }
                if serving {
                    let mode = ZooKeeperMode::parse(
                        &four_letter(port, "srvr", super::PROBE_TIMEOUT).await?,
                    );
                    if !mode.is_serving() {
                        return Err(probe_error(format!("srvr reports mode {mode}")));
                    }
                }
                Ok(())
            })
            .await
    }

    /// `zookeeper://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("zookeeper://{}", self.connect_string())
    }

    /// `127.0.0.1:PORT`, the form ZooKeeper clients take.
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// The client port (stable across restarts).
    pub fn port(&self) -> u16 {
        self.client_port
    }

    /// The server's `myid` when it is an ensemble member, else `None`.
    pub fn id(&self) -> Option<u32> {
        self.id
    }

    /// The JVM's process id, `None` after [`kill`](ServerControl::kill).
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// The temporary directory holding `zoo.cfg`, `data/` and `server.log`;
    /// kept across restarts and deleted on drop.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The file receiving the server's log output.
    pub fn log_path(&self) -> PathBuf {
        self.process.log_path().to_path_buf()
    }

    /// True while the JVM is alive (also when paused).
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    /// True between [`pause`](ServerControl::pause) and [`resume`](ServerControl::resume).
    pub fn is_paused(&self) -> bool {
        self.process.is_paused()
    }

    /// Sends `ruok` and expects `imok` within `timeout`.
    ///
    /// # Errors
    ///
    /// [`ServerError::Probe`] on connection failure, a wrong reply or
    /// timeout.
    pub async fn ping(&self, timeout: Duration) -> Result<(), ServerError> {
        let reply = four_letter(self.client_port, "ruok", timeout).await?;
        if reply.trim() == "imok" {
            Ok(())
        } else {
            Err(probe_error(format!("ruok answered {reply:?}")))
        }
    }

    /// Sends a four-letter-word command (`srvr`, `stat`, `mntr`, `cons`, ...)
    /// and returns the whole reply.
    ///
    /// # Errors
    ///
    /// [`ServerError::Probe`] on connection failure or timeout.
    pub async fn four_letter(
        &self,
        command: &str,
        timeout: Duration,
    ) -> Result<String, ServerError> {
        four_letter(self.client_port, command, timeout).await
    }

    /// The server's role according to `srvr`.
    ///
    /// # Errors
    ///
    /// [`ServerError::Probe`] when the server does not answer within
    /// `timeout` (for instance because it is paused or killed).
    pub async fn mode(&self, timeout: Duration) -> Result<ZooKeeperMode, ServerError> {
        Ok(ZooKeeperMode::parse(
            &four_letter(self.client_port, "srvr", timeout).await?,
        ))
    }
}

#[async_trait::async_trait]
impl SupervisedServer for ZooKeeperServer {
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
        self.boot(self.id.is_none()).await
    }
}

/// A ZooKeeper ensemble of `n` servers on loopback (each its own JVM with
/// `server.N=127.0.0.1:peerPort:electionPort` lines and a `myid` file).
///
/// Nodes are addressed by index `0..len()`; node `i` has `myid` `i + 1`.
/// Dropping the ensemble kills every JVM and deletes every directory.
#[derive(Debug)]
pub struct ZooKeeperEnsemble {
    nodes: Vec<ZooKeeperServer>,
}

impl ZooKeeperEnsemble {
    /// Starts an `n`-node ensemble with the default [`ZooKeeperServerOptions`].
    ///
    /// # Errors
    ///
    /// See [`ZooKeeperEnsemble::start_with`].
    pub async fn start(n: usize) -> Result<ZooKeeperEnsemble, ServerError> {
        Self::start_with(n, ZooKeeperServerOptions::default()).await
    }

    /// Starts `n` JVMs at once, waits (at most `config.ready_timeout`) until
    /// each answers `ruok`, then (again at most `config.ready_timeout`) until
    /// every node reports leader or follower and exactly one is the leader.
    ///
    /// # Errors
    ///
    /// [`ServerError::InvalidArgument`] for `n == 0`;
    /// [`ServerError::NotInstalled`] when `java` or the jars are missing;
    /// [`ServerError::Exited`] / [`ServerError::StartTimeout`] (with the
    /// failing node's log tail) when a node does not start;
    /// [`ServerError::NoLeader`] when the election does not settle.
    pub async fn start_with(
        n: usize,
        config: ZooKeeperServerOptions,
    ) -> Result<ZooKeeperEnsemble, ServerError> {
        if n == 0 {
            return Err(ServerError::InvalidArgument(
                "a ZooKeeper ensemble needs at least one node".into(),
            ));
        }
        let runtime = JavaRuntime::find()?;
        let ports = free_ports(3 * n)?;
        let peers: Vec<(u16, u16)> = (0..n).map(|i| (ports[n + i], ports[2 * n + i])).collect();
        let mut nodes = Vec::with_capacity(n);
        for (i, &client_port) in ports.iter().take(n).enumerate() {
            let id = u32::try_from(i + 1)
                .map_err(|_| ServerError::InvalidArgument(format!("ensemble size {n}")))?;
            nodes.push(ZooKeeperServer::prepare(
                &runtime,
                &config,
                client_port,
                Some(id),
                &peers,
            )?);
        }
        for node in &mut nodes {
            node.process.spawn()?;
        }
        for node in &mut nodes {
            node.wait_ready(false).await?;
        }
        let ensemble = ZooKeeperEnsemble { nodes };
        ensemble.wait_all_serving(config.ready_timeout).await?;
        Ok(ensemble)
    }

    /// Waits until every node answers `srvr` with leader or follower and one
    /// node is the leader.
    async fn wait_all_serving(&self, timeout: Duration) -> Result<(), ServerError> {
        let started = Instant::now();
        loop {
            let modes = self.modes().await;
            let leaders = modes
                .iter()
                .filter(|m| matches!(m, Some(ZooKeeperMode::Leader)))
                .count();
            let all_serving = modes
                .iter()
                .all(|m| m.as_ref().is_some_and(|m| m.is_serving()));
            if all_serving && (leaders == 1 || self.nodes.len() == 1) {
                return Ok(());
            }
            if started.elapsed() >= timeout {
                return Err(ServerError::NoLeader {
                    waited: started.elapsed(),
                    modes: format!("{}; {}", describe_modes(&modes), self.log_tails()),
                });
            }
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
    }

    fn log_tails(&self) -> String {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| format!("\n--- node {i} log tail ---\n{}", n.logs()))
            .collect()
    }

    /// How many nodes the ensemble has (dead or alive).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always false: an ensemble has at least one node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// `zookeeper://127.0.0.1:P1,127.0.0.1:P2,...` listing every node.
    pub fn url(&self) -> String {
        format!("zookeeper://{}", self.connect_string())
    }

    /// `127.0.0.1:P1,127.0.0.1:P2,...`, the form ZooKeeper clients take.
    pub fn connect_string(&self) -> String {
        self.nodes
            .iter()
            .map(ZooKeeperServer::connect_string)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The nodes, in `myid` order.
    pub fn nodes(&self) -> &[ZooKeeperServer] {
        &self.nodes
    }

    /// Node `index`, if it exists.
    pub fn node(&self, index: usize) -> Option<&ZooKeeperServer> {
        self.nodes.get(index)
    }

    /// Node `index` for direct control, if it exists.
    pub fn node_mut(&mut self, index: usize) -> Option<&mut ZooKeeperServer> {
        self.nodes.get_mut(index)
    }

    fn get_mut(&mut self, index: usize) -> Result<&mut ZooKeeperServer, ServerError> {
        let size = self.nodes.len();
        self.nodes
            .get_mut(index)
            .ok_or(ServerError::NoSuchNode { index, size })
    }

    /// SIGKILLs node `index` (idempotent).
    ///
    /// # Errors
    ///
    /// [`ServerError::NoSuchNode`] for an index out of range.
    pub fn kill_node(&mut self, index: usize) -> Result<(), ServerError> {
        self.get_mut(index)?.kill();
        Ok(())
    }

    /// SIGSTOPs node `index`.
    ///
    /// # Errors
    ///
    /// [`ServerError::NoSuchNode`]; [`ServerError::NotRunning`] if the node
    /// was killed.
    pub fn pause_node(&mut self, index: usize) -> Result<(), ServerError> {
        self.get_mut(index)?.pause()
    }

    /// SIGCONTs node `index`.
    ///
    /// # Errors
    ///
    /// [`ServerError::NoSuchNode`]; [`ServerError::NotRunning`] if the node
    /// was killed.
    pub fn resume_node(&mut self, index: usize) -> Result<(), ServerError> {
        self.get_mut(index)?.resume()
    }

    /// Restarts node `index` (killing it first if needed) on the same ports
    /// and data directory and waits for `ruok`; then, if a majority of the
    /// ensemble is running and not paused, also waits (at most the ready
    /// timeout) until the node serves as leader or follower again.
    ///
    /// # Errors
    ///
    /// [`ServerError::NoSuchNode`]; [`ServerError::Exited`] /
    /// [`ServerError::StartTimeout`] with the node's log tail.
    pub async fn restart_node(&mut self, index: usize) -> Result<(), ServerError> {
        let node = self.get_mut(index)?;
        node.kill();
        node.boot(false).await?;
        let live = self
            .nodes
            .iter_mut()
            .filter(|n| !n.is_paused())
            .filter_map(|n| n.is_running().then_some(()))
            .count();
        if live > self.nodes.len() / 2 {
            self.get_mut(index)?.wait_ready(true).await?;
        }
        Ok(())
    }

    /// What each node reports through `srvr`; `None` for a node that is
    /// killed, paused or does not answer within a second.
    pub async fn modes(&self) -> Vec<Option<ZooKeeperMode>> {
        let mut modes = Vec::with_capacity(self.nodes.len());
        for node in &self.nodes {
            let mode = if node.pid().is_none() || node.is_paused() {
                None
            } else {
                node.mode(super::PROBE_TIMEOUT).await.ok()
            };
            modes.push(mode);
        }
        modes
    }

    /// The index of the node that currently reports `Mode: leader`, if any.
    pub async fn leader(&self) -> Option<usize> {
        self.modes()
            .await
            .iter()
            .position(|m| matches!(m, Some(ZooKeeperMode::Leader)))
    }

    /// Polls until some node reports `Mode: leader` and returns its index.
    ///
    /// # Errors
    ///
    /// [`ServerError::NoLeader`] (listing every node's last mode) when no
    /// leader appears within `timeout`.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Result<usize, ServerError> {
        let started = Instant::now();
        loop {
            let modes = self.modes().await;
            if let Some(i) = modes
                .iter()
                .position(|m| matches!(m, Some(ZooKeeperMode::Leader)))
            {
                return Ok(i);
            }
            if started.elapsed() >= timeout {
                return Err(ServerError::NoLeader {
                    waited: started.elapsed(),
                    modes: describe_modes(&modes),
                });
            }
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
    }
}

fn describe_modes(modes: &[Option<ZooKeeperMode>]) -> String {
    modes
        .iter()
        .enumerate()
        .map(|(i, m)| match m {
            Some(m) => format!("node {i}: {m}"),
            None => format!("node {i}: no answer"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn probe_error(detail: String) -> ServerError {
    ServerError::Probe {
        server: SERVER,
        detail,
    }
}

fn write_file(path: &Path, contents: &str) -> Result<(), ServerError> {
    std::fs::write(path, contents)
        .map_err(|e| ServerError::io(format!("writing {}", path.display()), e))
}

/// Sends a four-letter word to 127.0.0.1:`port` and reads the reply until the
/// server closes the connection.
pub(crate) async fn four_letter(
    port: u16,
    command: &str,
    timeout: Duration,
) -> Result<String, ServerError> {
    let exchange = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| format!("connect to 127.0.0.1:{port}: {e}"))?;
        stream
            .write_all(command.as_bytes())
            .await
            .map_err(|e| format!("write {command}: {e}"))?;
        let mut reply = Vec::new();
        stream
            .read_to_end(&mut reply)
            .await
            .map_err(|e| format!("read reply to {command}: {e}"))?;
        Ok::<_, String>(String::from_utf8_lossy(&reply).into_owned())
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(Ok(reply)) => Ok(reply),
        Ok(Err(detail)) => Err(probe_error(detail)),
        Err(_) => Err(probe_error(format!(
            "no reply to {command} within {timeout:?}"
        ))),
    }
}

/// Where `java` is and what class path runs the ZooKeeper server.
struct JavaRuntime {
    java: PathBuf,
    classpath: OsString,
}

impl JavaRuntime {
    fn find() -> Result<JavaRuntime, ServerError> {
        let java = if let Some(java) = std::env::var_os("DISTLOCK_JAVA") {
            PathBuf::from(java)
        } else if let Some(home) = std::env::var_os("JAVA_HOME")
            .map(|h| PathBuf::from(h).join("bin").join("java"))
            .filter(|p| p.is_file())
        {
            home
        } else {
            find_on_path("java").ok_or_else(|| ServerError::NotInstalled {
                what: "java".into(),
                hint: "install the Debian package `zookeeper` (it pulls in a JRE; scripts/test.sh does), or set DISTLOCK_JAVA".into(),
            })?
        };
        Ok(JavaRuntime {
            java,
            classpath: zookeeper_classpath()?,
        })
    }
}

/// The class path for `QuorumPeerMain`.
///
/// Debian's `zookeeper.jar` names its dependencies (jute, netty, slf4j-api,
/// metrics, ...) in its manifest `Class-Path`, so the class path only adds
/// one slf4j binding (log4j 1.2) to get a single, configurable logger instead
/// of `/usr/share/java/*`'s many competing bindings. Falls back to
/// `/usr/share/java/*` when the pieces are not where Debian puts them.
fn zookeeper_classpath() -> Result<OsString, ServerError> {
    if let Some(cp) = std::env::var_os("DISTLOCK_ZK_CLASSPATH") {
        return Ok(cp);
    }
    let java_dir = Path::new("/usr/share/java");
    let zk = java_dir.join("zookeeper.jar");
    if !zk.is_file() {
        return Err(ServerError::NotInstalled {
            what: "ZooKeeper server jars (/usr/share/java/zookeeper.jar)".into(),
            hint: "install the Debian package `zookeeper` (scripts/test.sh does), or set DISTLOCK_ZK_CLASSPATH".into(),
        });
    }
    let binding = ["slf4j-log4j12.jar", "log4j-1.2.jar"].map(|j| java_dir.join(j));
    if binding.iter().all(|p| p.is_file()) {
        // The Netty connection factory (TLS client ports) also needs these, which the
        // manifest leaves out; Debian's libnetty-java (a dependency) ships them.
        let netty = [
            "netty-codec.jar",
            "netty-resolver.jar",
            "netty-transport-native-unix-common.jar",
        ]
        .map(|j| java_dir.join(j))
        .into_iter()
        .filter(|p| p.is_file());
        let parts = std::iter::once(zk).chain(binding).chain(netty);
        return std::env::join_paths(parts)
            .map_err(|e| ServerError::InvalidArgument(format!("ZooKeeper class path: {e}")));
    }
    Ok(OsString::from("/usr/share/java/*"))
}
