//! A throwaway Sentinel-managed Redis group: a master, a replica and three
//! Sentinels (`redis-server sentinel.conf --sentinel`), all on 127.0.0.1.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::process::{Launch, Supervised};
use super::redis::{redis_binary, redis_ping};
use super::redis::{redis_cli, replica_in_sync};
use super::redis_shared::TlsFiles;
use super::{
    free_port, temp_dir, FaultProxy, RedisServer, RedisServerOptions, ServerError, PROBE_TIMEOUT,
};

const SERVER: &str = "redis-sentinel";
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// The name the Sentinels monitor the master under.
pub const MASTER_NAME: &str = "distlock";

/// One Sentinel process.
#[derive(Debug)]
struct Sentinel {
    process: Supervised,
    port: u16,
    /// The TLS port, when the group uses TLS.
    tls_port: Option<u16>,
    _dir: TempDir,
}

/// A master, a replica and three Sentinels watching them (quorum 2,
/// `down-after-milliseconds` 1000, `failover-timeout` 5000).
///
/// The servers keep their ports: after a failover the replica is the master and the
/// old master, restarted, becomes a replica. Dropping the handle kills everything.
#[derive(Debug)]
pub struct RedisSentinelGroup {
    // Sentinels first, so they die before the servers they watch.
    sentinels: Vec<Sentinel>,
    servers: Vec<RedisServer>,
    /// The proxy the replica replicates through, for a group started with
    /// [`RedisSentinelGroup::start_with_replication_proxy`].
    replication: Option<FaultProxy>,
}

impl RedisSentinelGroup {
    /// Starts the group and waits (at most 20 s) until every Sentinel sees the
    /// master, the replica and the other two Sentinels, and the replica has
    /// synchronised with the master.
    ///
    /// # Errors
    /// As [`RedisServer::start_with`] for the servers; [`ServerError::Exited`] or
    /// [`ServerError::StartTimeout`] when a Sentinel does not come up or the group does
    /// not form in time.
    pub async fn start() -> Result<RedisSentinelGroup, ServerError> {
        RedisSentinelGroup::start_with_tls(None).await
    }

    /// As [`RedisSentinelGroup::start`], and with `tls` (a certificate and its key,
    /// PEM files; the certificate is its own CA) every server and Sentinel also
    /// listens for TLS on a second port (clients need not show a certificate), the
    /// servers replicate and the Sentinels talk over TLS, and the Sentinels name the
    /// TLS ports: see [`RedisSentinelGroup::tls_url`].
    ///
    /// # Errors
    /// As [`RedisSentinelGroup::start`].
    pub async fn start_with_tls(
        tls: Option<(PathBuf, PathBuf)>,
    ) -> Result<RedisSentinelGroup, ServerError> {
        let tls = tls.map(|(cert, key)| TlsFiles { cert, key });
        let tls_args = |port: u16| -> Vec<String> {
            let Some(tls) = &tls else {
                return Vec::new();
            };
            tls.directives(port)
                .into_iter()
                .flat_map(|(name, value)| [format!("--{name}"), value])
                .collect()
        };
        let master_tls = free_port()?;
        let master = RedisServer::start_with(RedisServerOptions {
            extra_args: tls_args(master_tls),
            ..RedisServerOptions::default()
        })
        .await?;
        // With TLS, replication and the Sentinels go to the master's TLS port.
        let master_port = if tls.is_some() {
            master_tls
        } else {
            master.port()
        };
        let mut replica_args = vec![
            "--replicaof".into(),
            "127.0.0.1".into(),
            master_port.to_string(),
        ];
        let replica_tls = free_port()?;
        replica_args.extend(tls_args(replica_tls));
        let replica = RedisServer::start_with(RedisServerOptions {
            extra_args: replica_args,
            ..RedisServerOptions::default()
        })
        .await?;
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            sentinels.push(start_sentinel(master_port, tls.as_ref(), FAILOVER_TIMEOUT_MS).await?);
        }
        let group = RedisSentinelGroup {
            sentinels,
            servers: vec![master, replica],
            replication: None,
        };
        group.wait_formed().await?;
        Ok(group)
    }

    /// As [`RedisSentinelGroup::start`] (without TLS), but the replica replicates
    /// through a [`FaultProxy`] in front of the master (see
    /// [`RedisSentinelGroup::replication_proxy`]), so a test can delay or drop the
    /// replication stream and the replica's acknowledgements, and nothing else: clients
    /// and Sentinels reach the servers directly. The Sentinels' `failover-timeout` is
    /// 60 s: they would re-point a replica whose master address is not the master's
    /// own (the proxy's) after it, so the group serves one failover, within a minute.
    ///
    /// # Errors
    /// As [`RedisSentinelGroup::start`]; [`ServerError::Io`] when the proxy cannot
    /// listen.
    pub async fn start_with_replication_proxy() -> Result<RedisSentinelGroup, ServerError> {
        let master = RedisServer::start().await?;
        let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], master.port()));
        let proxy = FaultProxy::start(upstream)
            .await
            .map_err(|e| ServerError::io("starting the replication proxy", e))?;
        let replica = RedisServer::start_with(RedisServerOptions {
            extra_args: vec![
                "--replicaof".into(),
                "127.0.0.1".into(),
                proxy.local_addr().port().to_string(),
            ],
            ..RedisServerOptions::default()
        })
        .await?;
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            sentinels.push(start_sentinel(master.port(), None, 60_000).await?);
        }
        let group = RedisSentinelGroup {
            sentinels,
            servers: vec![master, replica],
            replication: Some(proxy),
        };
        group.wait_formed().await?;
        Ok(group)
    }

    /// The proxy the replica replicates through, for a group started with
    /// [`RedisSentinelGroup::start_with_replication_proxy`]; `None` otherwise.
    pub fn replication_proxy(&self) -> Option<&FaultProxy> {
        self.replication.as_ref()
    }

    /// Polls until each Sentinel counts one replica and two other Sentinels.
    async fn wait_formed(&self) -> Result<(), ServerError> {
        let started = Instant::now();
        let mut last = String::new();
        while started.elapsed() < READY_TIMEOUT {
            let mut formed = true;
            for sentinel in &self.sentinels {
                let master = redis_cli(sentinel.port, &["SENTINEL", "MASTER", MASTER_NAME])
                    .await
                    .unwrap_or_default();
                let field = |name: &str| {
                    let lines: Vec<&str> = master.lines().collect();
                    lines
                        .iter()
                        .position(|l| *l == name)
                        .and_then(|i| lines.get(i + 1))
                        .and_then(|v| v.parse::<u32>().ok())
                        .unwrap_or(0)
                };
                if field("num-slaves") < 1 || field("num-other-sentinels") < 2 {
                    formed = false;
                    last = format!("Sentinel {} sees: {master:?}", sentinel.port);
                }
            }
            if formed && replica_in_sync(self.servers[1].port()).await {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(ServerError::StartTimeout {
            server: SERVER,
            waited: READY_TIMEOUT,
            last_probe: last,
            log: self.sentinels[0].process.log_path().to_path_buf(),
            log_tail: self.sentinels[0].process.log_tail(),
        })
    }

    /// `redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/distlock`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinel_ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+sentinel://{}/{MASTER_NAME}", hosts.join(","))
    }

    /// `rediss+sentinel://…/distlock#insecure` over the Sentinels' TLS ports, for a
    /// group started with TLS; `None` otherwise.
    pub fn tls_url(&self) -> Option<String> {
        let hosts: Option<Vec<String>> = self
            .sentinels
            .iter()
            .map(|s| s.tls_port.map(|p| format!("127.0.0.1:{p}")))
            .collect();
        Some(format!(
            "rediss+sentinel://{}/{MASTER_NAME}#insecure",
            hosts?.join(",")
        ))
    }

    /// The Sentinels' ports.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    /// The data servers (the first started as master, the second as its replica).
    pub fn servers(&mut self) -> &mut [RedisServer] {
        &mut self.servers
    }

    /// The port of the master as the first answering Sentinel names it.
    ///
    /// # Errors
    /// [`ServerError::Probe`] when no Sentinel answers.
    pub async fn master_port(&self) -> Result<u16, ServerError> {
        let mut last = String::new();
        for sentinel in &self.sentinels {
            match redis_cli(
                sentinel.port,
                &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME],
            )
            .await
            {
                Ok(reply) => {
                    if let Some(port) = reply.lines().nth(1).and_then(|p| p.parse().ok()) {
                        return Ok(port);
                    }
                    last = reply;
                }
                Err(e) => last = e.to_string(),
            }
        }
        Err(ServerError::Probe {
            server: SERVER,
            detail: format!("no Sentinel named the master: {last}"),
        })
    }

    /// The index in [`servers`](Self::servers) of the server on `port`.
    pub fn index_of(&self, port: u16) -> Option<usize> {
        self.servers.iter().position(|s| s.port() == port)
    }

    /// Asks a Sentinel for a failover now (`SENTINEL FAILOVER`), without killing
    /// the master: the replica is promoted and the old master demoted.
    ///
    /// # Errors
    /// [`ServerError::Probe`] when the Sentinel refuses (no replica ready, a
    /// failover in progress).
    pub async fn failover(&self) -> Result<(), ServerError> {
        let reply = redis_cli(
            self.sentinels[0].port,
            &["SENTINEL", "FAILOVER", MASTER_NAME],
        )
        .await?;
        if reply.trim() == "OK" {
            Ok(())
        } else {
            Err(ServerError::Probe {
                server: SERVER,
                detail: format!("SENTINEL FAILOVER answered {reply:?}"),
            })
        }
    }
}

/// The Sentinels' `failover-timeout` (ms) but with a replication proxy.
const FAILOVER_TIMEOUT_MS: u32 = 5000;

async fn start_sentinel(
    master_port: u16,
    tls: Option<&TlsFiles>,
    failover_timeout_ms: u32,
) -> Result<Sentinel, ServerError> {
    let binary = redis_binary()?;
    let dir = temp_dir(SERVER)?;
    let port = free_port()?;
    let tls_port = tls.map(|_| free_port()).transpose()?;
    let mut config = format!(
        "port {port}\nbind 127.0.0.1\ndaemonize no\nlogfile \"\"\ndir {dir}\n\
         sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
         sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
         sentinel failover-timeout {MASTER_NAME} {failover_timeout_ms}\n\
         sentinel parallel-syncs {MASTER_NAME} 1\n",
        dir = dir.path().display()
    );
    if let (Some(tls), Some(tls_port)) = (tls, tls_port) {
        for (name, value) in tls.directives(tls_port) {
            config.push_str(&format!("{name} {value}\n"));
        }
    }
    let config_path = dir.path().join("sentinel.conf");
    std::fs::write(&config_path, config)
        .map_err(|e| ServerError::io("writing sentinel.conf", e))?;
    let launch = Launch {
        program: binary,
        args: vec![config_path.into_os_string(), OsString::from("--sentinel")],
        cwd: dir.path().to_path_buf(),
        run_as: None,
    };
    let mut process = Supervised::new(SERVER, launch, dir.path().join("sentinel.log"));
    process.spawn()?;
    process
        .wait_ready(READY_TIMEOUT, || redis_ping(port, None, PROBE_TIMEOUT))
        .await?;
    Ok(Sentinel {
        process,
        port,
        tls_port,
        _dir: dir,
    })
}
