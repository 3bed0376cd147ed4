//! Throwaway etcd servers: a single node and a loopback cluster.

use std::ffi::OsString;
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

const SERVER: &str = "etcd";

/// Options for [`EtcdServer::start_with`] and [`EtcdCluster::start_with`].
///
/// The defaults are etcd's own timing (100 ms heartbeat, 1 s election timeout), which
/// makes the shortest lease the server grants 2 s (etcd raises shorter TTLs to
/// 1.5 × election timeout, rounded up to whole seconds).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EtcdServerOptions {
    /// `--heartbeat-interval` in milliseconds. Default 100.
    pub heartbeat_ms: u32,
    /// `--election-timeout` in milliseconds. Default 1000.
    pub election_timeout_ms: u32,
    /// How long to wait until a node serves (and, for a cluster, has a leader).
    /// Default 30 s.
    pub ready_timeout: Duration,
    /// Extra command-line arguments appended after the harness's own.
    pub extra_args: Vec<String>,
}

impl Default for EtcdServerOptions {
    fn default() -> Self {
        EtcdServerOptions {
            heartbeat_ms: 100,
            election_timeout_ms: 1000,
            ready_timeout: Duration::from_secs(30),
            extra_args: Vec::new(),
        }
    }
}

/// One `etcd` process on 127.0.0.1 with its data directory and log in a temporary
/// directory: a single-node cluster, or one member of an [`EtcdCluster`].
///
/// Dropping the handle SIGKILLs the process, reaps it and deletes the directory.
#[derive(Debug)]
pub struct EtcdServer {
    // Declared before `dir` so the process dies before its directory goes.
    process: Supervised,
    client_port: u16,
    peer_port: u16,
    /// The plaintext port `/health` is probed on: the client port, or with TLS the
    /// metrics port (`--listen-metrics-urls`, which serves `/health` in plaintext).
    probe_port: u16,
    name: String,
    ready_timeout: Duration,
    dir: TempDir,
}

impl EtcdServer {
    /// Starts a single-node etcd with the default [`EtcdServerOptions`].
    ///
    /// # Errors
    /// See [`EtcdServer::start_with`].
    pub async fn start() -> Result<EtcdServer, ServerError> {
        Self::start_with(EtcdServerOptions::default()).await
    }

    /// Starts a single-node etcd on free loopback ports and waits (at most
    /// `options.ready_timeout`) until `GET /health` answers `"health":"true"`.
    ///
    /// Runs `etcd --name n0 --data-dir TMP/data --listen-client-urls
    /// http://127.0.0.1:P …` with the zap logger writing to `server.log` in the
    /// temporary directory. A start that loses its port is retried.
    ///
    /// # Errors
    /// [`ServerError::NotInstalled`] when `etcd` is not found (`DISTLOCK_ETCD`, then
    /// `PATH`, then `/usr/bin/etcd`); [`ServerError::Exited`] or
    /// [`ServerError::StartTimeout`] with the log tail when it does not come up;
    /// [`ServerError::Io`] for file-system or spawn failures.
    pub async fn start_with(options: EtcdServerOptions) -> Result<EtcdServer, ServerError> {
        Self::start_single(options, None).await
    }

    /// A single node, serving TLS on its client port when `tls` is given.
    pub(crate) async fn start_single(
        options: EtcdServerOptions,
        tls: Option<&ServerTls>,
    ) -> Result<EtcdServer, ServerError> {
        let binary = etcd_binary()?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let ports = free_ports(3)?;
            let (client_port, peer_port) = (ports[0], ports[1]);
            let initial = format!("n0=http://127.0.0.1:{peer_port}");
            let mut server = EtcdServer::prepare(
                &binary,
                &options,
                Member {
                    name: "n0",
                    client_port,
                    peer_port,
                    initial_cluster: &initial,
                    token: &cluster_token(),
                },
                tls.map(|tls| (tls, ports[2])),
            )?;
            match server.boot().await {
                Ok(()) => return Ok(server),
                Err(e) if e.is_port_conflict() && attempt < START_ATTEMPTS => continue,
                Err(e) => return Err(e),
            }
        }
    }

    fn prepare(
        binary: &Path,
        options: &EtcdServerOptions,
        member: Member<'_>,
        tls: Option<(&ServerTls, u16)>,
    ) -> Result<EtcdServer, ServerError> {
        let Member {
            name,
            client_port,
            peer_port,
            initial_cluster,
            token,
        } = member;
        let dir = fast_temp_dir()?;
        let data_dir = dir.path().join("data");
        let scheme = if tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let mut args: Vec<OsString> = vec![
            "--name".into(),
            name.into(),
            "--data-dir".into(),
            data_dir.into_os_string(),
            "--listen-client-urls".into(),
            client.clone().into(),
            "--advertise-client-urls".into(),
            client.into(),
            "--listen-peer-urls".into(),
            peer.clone().into(),
            "--initial-advertise-peer-urls".into(),
            peer.into(),
            "--initial-cluster".into(),
            initial_cluster.into(),
            "--initial-cluster-state".into(),
            "new".into(),
            "--initial-cluster-token".into(),
            token.into(),
            "--heartbeat-interval".into(),
            options.heartbeat_ms.to_string().into(),
            "--election-timeout".into(),
            options.election_timeout_ms.to_string().into(),
            "--logger".into(),
            "zap".into(),
            "--log-outputs".into(),
            "stderr".into(),
        ];
        let mut probe_port = client_port;
        if let Some((tls, metrics_port)) = tls {
            probe_port = metrics_port;
            args.extend([
                "--cert-file".into(),
                tls.cert.clone().into_os_string(),
                "--key-file".into(),
                tls.key.clone().into_os_string(),
                "--trusted-ca-file".into(),
                tls.ca.clone().into_os_string(),
                "--listen-metrics-urls".into(),
                format!("http://127.0.0.1:{metrics_port}").into(),
            ]);
            if tls.client_cert_auth {
                args.push("--client-cert-auth".into());
            }
        }
        args.extend(options.extra_args.iter().map(OsString::from));
        let launch = Launch {
            program: binary.to_path_buf(),
            args,
            cwd: dir.path().to_path_buf(),
            run_as: None,
        };
        let process = Supervised::new(SERVER, launch, dir.path().join("server.log"));
        Ok(EtcdServer {
            process,
            client_port,
            peer_port,
            probe_port,
            name: name.to_owned(),
            ready_timeout: options.ready_timeout,
            dir,
        })
    }

    async fn boot(&mut self) -> Result<(), ServerError> {
        self.process.spawn()?;
        self.wait_ready().await
    }

    async fn wait_ready(&mut self) -> Result<(), ServerError> {
        let port = self.probe_port;
        let timeout = self.ready_timeout;
        self.process
            .wait_ready(timeout, || health(port, super::PROBE_TIMEOUT))
            .await
    }

    /// `etcd://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.endpoint())
    }

    /// `127.0.0.1:PORT`, the form `etcdctl --endpoints` takes.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// The client port (stable across restarts).
    pub fn port(&self) -> u16 {
        self.client_port
    }

    /// The peer (raft) port.
    pub fn peer_port(&self) -> u16 {
        self.peer_port
    }

    /// The member name (`n0`, `n1`, …).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process id, `None` after [`kill`](ServerControl::kill).
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// The temporary directory holding `data/` and `server.log`; kept across restarts
    /// and deleted on drop.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The file receiving the server's log output.
    pub fn log_path(&self) -> PathBuf {
        self.process.log_path().to_path_buf()
    }

    /// True while the process is alive (also when paused).
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    /// True between [`pause`](ServerControl::pause) and [`resume`](ServerControl::resume).
    pub fn is_paused(&self) -> bool {
        self.process.is_paused()
    }

    /// `GET /health` answers `"health":"true"` within `timeout` (the member serves and
    /// the cluster has a leader).
    ///
    /// # Errors
    /// [`ServerError::Probe`] on connection failure, an unhealthy answer or timeout.
    pub async fn ping(&self, timeout: Duration) -> Result<(), ServerError> {
        health(self.probe_port, timeout).await
    }

    /// The member's own id and the id of the leader it knows, from
    /// `POST /v3/maintenance/status`.
    ///
    /// # Errors
    /// [`ServerError::Probe`] when the member does not answer within `timeout`.
    pub async fn status(&self, timeout: Duration) -> Result<(String, String), ServerError> {
        let reply = http(
            self.client_port,
            "POST /v3/maintenance/status HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
            timeout,
        )
        .await?;
        let member = json_string(&reply, "\"member_id\":\"");
        let leader = json_string(&reply, "\"leader\":\"");
        match (member, leader) {
            (Some(m), Some(l)) => Ok((m, l)),
            _ => Err(probe_error(format!(
                "unexpected status reply {:?}",
                tail(&reply)
            ))),
        }
    }
}

#[async_trait::async_trait]
impl SupervisedServer for EtcdServer {
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

/// A cluster of `n` etcd members on loopback, each its own process with its own data
/// directory.
///
/// Members are addressed by index `0..len()` (named `n0`, `n1`, …). A member's
/// [`ServerControl::restart`] waits until it is healthy, which needs a majority up.
/// Dropping the cluster kills every member and deletes every directory.
#[derive(Debug)]
pub struct EtcdCluster {
    nodes: Vec<EtcdServer>,
    ready_timeout: Duration,
}

impl EtcdCluster {
    /// Starts an `n`-member cluster with the default [`EtcdServerOptions`].
    ///
    /// # Errors
    /// See [`EtcdCluster::start_with`].
    pub async fn start(n: usize) -> Result<EtcdCluster, ServerError> {
        Self::start_with(n, EtcdServerOptions::default()).await
    }

    /// Starts `n` members at once and waits (at most `options.ready_timeout`) until
    /// every one is healthy and all agree on one leader.
    ///
    /// # Errors
    /// [`ServerError::InvalidArgument`] for `n == 0`; [`ServerError::NotInstalled`]
    /// without `etcd`; [`ServerError::Exited`] / [`ServerError::StartTimeout`] with the
    /// failing member's log tail; [`ServerError::NoLeader`] when the members do not
    /// agree on a leader in time.
    pub async fn start_with(
        n: usize,
        options: EtcdServerOptions,
    ) -> Result<EtcdCluster, ServerError> {
        if n == 0 {
            return Err(ServerError::InvalidArgument(
                "an etcd cluster needs at least one member".into(),
            ));
        }
        let binary = etcd_binary()?;
        let ports = free_ports(2 * n)?;
        let initial = (0..n)
            .map(|i| format!("n{i}=http://127.0.0.1:{}", ports[n + i]))
            .collect::<Vec<_>>()
            .join(",");
        let token = cluster_token();
        let mut nodes = Vec::with_capacity(n);
        for i in 0..n {
            nodes.push(EtcdServer::prepare(
                &binary,
                &options,
                Member {
                    name: &format!("n{i}"),
                    client_port: ports[i],
                    peer_port: ports[n + i],
                    initial_cluster: &initial,
                    token: &token,
                },
                None,
            )?);
        }
        for node in &mut nodes {
            node.process.spawn()?;
        }
        for node in &mut nodes {
            node.wait_ready().await?;
        }
        let cluster = EtcdCluster {
            nodes,
            ready_timeout: options.ready_timeout,
        };
        cluster.wait_for_leader(options.ready_timeout).await?;
        Ok(cluster)
    }

    /// How many members the cluster has (dead or alive).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always false: a cluster has at least one member.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// `etcd://127.0.0.1:P1,127.0.0.1:P2,…` listing every member.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.endpoints())
    }

    /// `127.0.0.1:P1,127.0.0.1:P2,…`, the form `etcdctl --endpoints` takes.
    pub fn endpoints(&self) -> String {
        self.nodes
            .iter()
            .map(EtcdServer::endpoint)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The members, in name order.
    pub fn nodes(&self) -> &[EtcdServer] {
        &self.nodes
    }

    /// Member `index` for direct control ([`ServerControl`]), if it exists.
    pub fn node_mut(&mut self, index: usize) -> Option<&mut EtcdServer> {
        self.nodes.get_mut(index)
    }

    fn get_mut(&mut self, index: usize) -> Result<&mut EtcdServer, ServerError> {
        let size = self.nodes.len();
        self.nodes
            .get_mut(index)
            .ok_or(ServerError::NoSuchNode { index, size })
    }

    /// SIGKILLs member `index` (idempotent).
    ///
    /// # Errors
    /// [`ServerError::NoSuchNode`] for an index out of range.
    pub fn kill_node(&mut self, index: usize) -> Result<(), ServerError> {
        self.get_mut(index)?.kill();
        Ok(())
    }

    /// SIGSTOPs member `index`.
    ///
    /// # Errors
    /// [`ServerError::NoSuchNode`]; [`ServerError::NotRunning`] if it was killed.
    pub fn pause_node(&mut self, index: usize) -> Result<(), ServerError> {
        self.get_mut(index)?.pause()
    }

    /// SIGCONTs member `index`.
    ///
    /// # Errors
    /// [`ServerError::NoSuchNode`]; [`ServerError::NotRunning`] if it was killed.
    pub fn resume_node(&mut self, index: usize) -> Result<(), ServerError> {
        self.get_mut(index)?.resume()
    }

    /// Restarts member `index` (killing it first if needed) on the same ports and
    /// data. When a majority of the members then runs, waits (at most the ready
    /// timeout) until it is healthy, which needs a leader; a member restarted while
    /// the majority is still down (the first members of a whole-cluster restart, one
    /// by one) is only started, since it cannot be healthy before the others come.
    ///
    /// # Errors
    /// [`ServerError::NoSuchNode`]; [`ServerError::Exited`] /
    /// [`ServerError::StartTimeout`] with the member's log tail.
    pub async fn restart_node(&mut self, index: usize) -> Result<(), ServerError> {
        let node = self.get_mut(index)?;
        node.kill();
        node.process.spawn()?;
        let running = self
            .nodes
            .iter_mut()
            .filter_map(|n| (!n.is_paused() && n.is_running()).then_some(()))
            .count();
        if running > self.nodes.len() / 2 {
            self.get_mut(index)?.wait_ready().await?;
        }
        Ok(())
    }

    /// Kills every member, starts them all again on the same ports and data, and
    /// waits until each is healthy and they agree on a leader (a whole-cluster restart).
    ///
    /// # Errors
    /// As [`EtcdCluster::start_with`].
    pub async fn restart_all(&mut self) -> Result<(), ServerError> {
        for node in &mut self.nodes {
            node.kill();
        }
        for node in &mut self.nodes {
            node.process.spawn()?;
        }
        for node in &mut self.nodes {
            node.wait_ready().await?;
        }
        self.wait_for_leader(self.ready_timeout).await.map(drop)
    }

    /// The index of the member every live, answering member names as leader, if they
    /// agree on one that answers.
    pub async fn leader(&self) -> Option<usize> {
        let mut ids = Vec::with_capacity(self.nodes.len());
        let mut leader: Option<String> = None;
        for node in &self.nodes {
            if node.pid().is_none() || node.is_paused() {
                ids.push(None);
                continue;
            }
            match node.status(super::PROBE_TIMEOUT).await {
                Ok((member, known)) => {
                    if leader.as_ref().is_some_and(|l| *l != known) || known == "0" {
                        return None;
                    }
                    leader = Some(known);
                    ids.push(Some(member));
                }
                Err(_) => ids.push(None),
            }
        }
        let leader = leader?;
        ids.iter()
            .position(|id| id.as_deref() == Some(leader.as_str()))
    }

    /// Polls until the live members agree on a leader, and returns its index.
    ///
    /// # Errors
    /// [`ServerError::NoLeader`] when none is agreed within `timeout`.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Result<usize, ServerError> {
        let started = Instant::now();
        loop {
            if let Some(i) = self.leader().await {
                return Ok(i);
            }
            if started.elapsed() >= timeout {
                let tails: String = self
                    .nodes
                    .iter()
                    .map(|n| format!("\n--- {} log tail ---\n{}", n.name, n.logs()))
                    .collect();
                return Err(ServerError::NoLeader {
                    waited: started.elapsed(),
                    modes: format!("members do not agree on a leader; {tails}"),
                });
            }
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
    }

    /// The ready timeout the cluster was started with.
    pub fn ready_timeout(&self) -> Duration {
        self.ready_timeout
    }
}

/// Where a member sits in its cluster.
struct Member<'a> {
    name: &'a str,
    client_port: u16,
    peer_port: u16,
    initial_cluster: &'a str,
    token: &'a str,
}

/// The PEM files of a TLS client port.
#[derive(Debug, Clone)]
pub(crate) struct ServerTls {
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
    /// The CA that signs client certificates (and the server's).
    pub(crate) ca: PathBuf,
    /// `--client-cert-auth`: demand a client certificate signed by `ca`.
    pub(crate) client_cert_auth: bool,
}

/// A temporary directory in `/dev/shm` where it can be made, else in the usual place.
///
/// etcd 3.4 has no switch to turn its fsyncs off (3.5's `--unsafe-no-fsync`), and every
/// write (a lease grant, a put, a revoke) waits for one: on a disk-backed temporary
/// directory that is milliseconds per request. On tmpfs an fsync costs nothing, as
/// `fsync=off` does for the PostgreSQL test servers; the data still survives a restart
/// of the process.
fn fast_temp_dir() -> Result<TempDir, ServerError> {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::Builder::new()
            .prefix("distlock-etcd-")
            .tempdir_in(shm)
        {
            return Ok(dir);
        }
    }
    temp_dir(SERVER)
}

/// A fresh `--initial-cluster-token`, shared by the members of one cluster only.
fn cluster_token() -> String {
    format!("distlock-{:016x}", rand::random::<u64>())
}

/// Where the `etcd` binary is.
fn etcd_binary() -> Result<PathBuf, ServerError> {
    if let Some(path) = std::env::var_os("DISTLOCK_ETCD") {
        return Ok(PathBuf::from(path));
    }
    find_on_path("etcd")
        .or_else(|| {
            let p = PathBuf::from("/usr/bin/etcd");
            p.is_file().then_some(p)
        })
        .ok_or_else(|| ServerError::NotInstalled {
            what: "etcd".into(),
            hint: "install the Debian packages `etcd-server etcd-client` (scripts/install-deps.sh does), or set DISTLOCK_ETCD".into(),
        })
}

fn probe_error(detail: String) -> ServerError {
    ServerError::Probe {
        server: SERVER,
        detail,
    }
}

/// `GET /health` expecting `"health":"true"`.
async fn health(port: u16, timeout: Duration) -> Result<(), ServerError> {
    let reply = http(
        port,
        "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        timeout,
    )
    .await?;
    if reply.contains("\"health\":\"true\"") {
        Ok(())
    } else {
        Err(probe_error(format!("/health answered {:?}", tail(&reply))))
    }
}

/// Sends one HTTP/1.1 request (with `Connection: close`) and reads the whole reply.
async fn http(port: u16, request: &str, timeout: Duration) -> Result<String, ServerError> {
    let exchange = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| format!("connect to 127.0.0.1:{port}: {e}"))?;
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| format!("write request: {e}"))?;
        let mut reply = Vec::new();
        stream
            .read_to_end(&mut reply)
            .await
            .map_err(|e| format!("read reply: {e}"))?;
        Ok::<_, String>(String::from_utf8_lossy(&reply).into_owned())
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(Ok(reply)) => Ok(reply),
        Ok(Err(detail)) => Err(probe_error(detail)),
        Err(_) => Err(probe_error(format!(
            "no HTTP reply from 127.0.0.1:{port} within {timeout:?}"
        ))),
    }
}

/// The string value after `prefix` (which ends with the opening quote).
fn json_string(text: &str, prefix: &str) -> Option<String> {
    let start = text.find(prefix)? + prefix.len();
    let end = text[start..].find('"')? + start;
    Some(text[start..end].to_owned())
}

/// The last 200 characters of a reply, for error messages.
fn tail(reply: &str) -> String {
    let chars: Vec<char> = reply.chars().collect();
    chars[chars.len().saturating_sub(200)..].iter().collect()
}
