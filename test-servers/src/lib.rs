//! Throwaway real servers for integration tests: redis-server, PostgreSQL,
//! MariaDB, ZooKeeper and etcd on free loopback ports, PgBouncer in front of PostgreSQL, controlled through [`ServerControl`] (url, kill,
//! restart, pause, resume, logs), and [`FaultProxy`], a TCP fault-injection proxy.
//!
//! **Not API-stable**: like other test-fixture crates, this one changes whenever the
//! tests that use it need something else; pin an exact version if you depend on it.
//! It does not depend on `distlock-api`: nothing here is about locks.
//!
//! Each server type in this module starts a genuine server process
//! (`redis-server`, PostgreSQL's `postgres`, Apache ZooKeeper on the JVM) on a
//! free loopback port with all of its state in a fresh temporary directory,
//! waits until the server answers its own wire protocol, and tears everything
//! down again when the handle is dropped: the process tree is stopped, the
//! process is reaped and the temporary directory is removed. A PostgreSQL cluster is
//! a copy of one `initdb` made on the process's first start (the template is deleted
//! when the process exits), since `initdb` takes most of a start.
//!
//! Two Redis topologies are built from `redis-server` processes:
//! [`RedisSentinelGroup`] (a master, a replica and three Sentinels) and
//! [`RedisCluster`] (three masters with a replica each, on ports whose cluster bus
//! port, +10000, is free too); both are set up with `redis-cli` (Debian's
//! `redis-tools`, a dependency of `redis-server`).
//!
//! The handles also expose, through [`ServerControl`], the fault controls that
//! failure-scenario tests need: `kill` (SIGKILL), `restart` (same port, same data
//! directory), `pause` (SIGSTOP) and `resume` (SIGCONT).
//!
//! The default provider uses no Docker (see [`Provider`]); the server binaries come from the Debian packages
//! `redis-server`, `postgresql`, `mariadb-server`, `zookeeper` and `etcd-server` (`scripts/test.sh` installs
//! them); TLS servers get throwaway certificates from the `openssl` tool, and
//! [`ZooKeeperTlsServer`] needs Debian's netty jars (a dependency of `zookeeper`) for
//! its TLS port. Where a binary lives can be overridden with environment variables:
//!
//! | variable | meaning |
//! | --- | --- |
//! | `DISTLOCK_REDIS_SERVER` | path of the `redis-server` binary |
//! | `DISTLOCK_PG_BIN` | directory holding `initdb` and `postgres` |
//! | `DISTLOCK_JAVA` | path of the `java` binary (else `$JAVA_HOME/bin/java`, else `java` on `PATH`) |
//! | `DISTLOCK_ZK_CLASSPATH` | the full Java class path for the ZooKeeper server |
//! | `DISTLOCK_ETCD` | path of the `etcd` binary |
//! | `DISTLOCK_PGBOUNCER` | path of the `pgbouncer` binary |
//!
//! Whether a server that cannot be started is a test failure or a skip is
//! decided by [`require_servers`]; [`skip_or_panic`] implements that policy.
//!
//! Handles are meant for tests: `kill`, `pause`, `resume` and `Drop` are
//! synchronous and may block the calling thread for a few milliseconds (at
//! most a few seconds) while processes die and are reaped.

// docs.rs (`--cfg docsrs`, nightly) shows which feature each gated item needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "testcontainers")]
mod container;
mod control;
mod etcd;
mod etcd_tls;
pub mod fault_proxy;
mod kinds;
mod mariadb;
mod mariadb_tls;
mod openssl_ca;
mod pgbouncer;
mod postgres;
mod postgres_tls;
mod process;
mod provider;
mod redis;
mod redis_cluster;
mod redis_sentinel;
mod redis_shared;
mod shared;
mod zookeeper;
mod zookeeper_tls;

use std::io::Read;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[cfg(feature = "testcontainers")]
pub use container::{docker_engine, ContainerServer};
pub use control::ServerControl;
pub use etcd::{EtcdCluster, EtcdServer, EtcdServerOptions};
pub use etcd_tls::EtcdTlsServer;
pub use fault_proxy::FaultProxy;
pub use kinds::{
    default_port, kind_for_scheme, kind_named, loopback_hosts, ServerKind, Started, SERVER_KINDS,
};
pub use mariadb::{
    add_fault_users, connections_of, kill_connections_of, mariadb_sql, MariaDbServer,
    MARIADB_DATABASE, MARIADB_FAULT_CLIENTS, MARIADB_FAULT_URL_TEMPLATE, MARIADB_PASSWORD,
    MARIADB_USER,
};
pub use mariadb_tls::{MariaDbTlsServer, MARIADB_CERT_USER};
pub use openssl_ca::{CertUse, IssuedCert, TestCa, TlsFiles};
pub use pgbouncer::{PgBouncerOptions, PgBouncerServer, PoolMode};
pub use postgres::{terminate_sessions_at, PostgresServer, PostgresServerOptions};
pub use postgres_tls::{PostgresTlsServer, CLIENT_CERT_DATABASE};
pub use provider::{Provider, PROVIDER_VAR};
pub use redis::{valkey_binary, RedisServer, RedisServerOptions};
pub use redis_cluster::RedisCluster;
pub use redis_sentinel::RedisSentinelGroup;
pub use shared::shared_server;
pub use zookeeper::{ZooKeeperEnsemble, ZooKeeperMode, ZooKeeperServer, ZooKeeperServerOptions};
pub use zookeeper_tls::ZooKeeperTlsServer;

/// Why a throwaway server could not be started, probed or controlled.
///
/// Variants that concern a server process which misbehaved carry the tail of
/// that server's log (stdout and stderr are captured to a file in the server's
/// temporary directory) so that a failing test shows the cause.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// A required binary or jar is not installed.
    #[error("{what} not found: {hint}")]
    NotInstalled {
        /// What was looked for, e.g. `redis-server`.
        what: String,
        /// How to install it.
        hint: String,
    },
    /// An operating-system operation (creating a temp dir, spawning, writing
    /// a config file, ...) failed.
    #[error("{context}: {source}")]
    Io {
        /// What the harness was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A preparation step (such as `initdb`) failed.
    #[error("{server}: setup step `{step}` failed: {detail}")]
    Setup {
        /// Which server, e.g. `postgres`.
        server: &'static str,
        /// Which step, e.g. `initdb`.
        step: String,
        /// Exit status and output of the step.
        detail: String,
    },
    /// The server process exited before it became ready.
    #[error("{server} exited during startup ({status}); log {}:\n{log_tail}", .log.display())]
    Exited {
        /// Which server.
        server: &'static str,
        /// The exit status as text.
        status: String,
        /// The server's log file (removed when the handle is dropped).
        log: PathBuf,
        /// The last lines of the log.
        log_tail: String,
    },
    /// The server did not answer its protocol within the readiness deadline.
    #[error("{server} not ready within {waited:?} (last probe: {last_probe}); log {}:\n{log_tail}", .log.display())]
    StartTimeout {
        /// Which server.
        server: &'static str,
        /// How long the harness waited.
        waited: Duration,
        /// The outcome of the last readiness probe.
        last_probe: String,
        /// The server's log file (removed when the handle is dropped).
        log: PathBuf,
        /// The last lines of the log.
        log_tail: String,
    },
    /// An operation needs a running server process but there is none (it was
    /// killed, or it exited).
    #[error("{server} is not running")]
    NotRunning {
        /// Which server.
        server: &'static str,
    },
    /// A protocol-level probe (PING, startup handshake, four-letter word)
    /// failed or timed out.
    #[error("{server} probe failed: {detail}")]
    Probe {
        /// Which server.
        server: &'static str,
        /// What went wrong.
        detail: String,
    },
    /// A ZooKeeper ensemble operation named a node index that does not exist.
    #[error("ZooKeeper ensemble has no node {index} (it has {size})")]
    NoSuchNode {
        /// The index that was asked for.
        index: usize,
        /// How many nodes the ensemble has.
        size: usize,
    },
    /// A ZooKeeper ensemble did not have a serving leader in time.
    #[error("no ZooKeeper leader within {waited:?}; node modes: {modes}")]
    NoLeader {
        /// How long the harness waited.
        waited: Duration,
        /// What each node reported last.
        modes: String,
    },
    /// The provider that started the server cannot do this (for example pause a
    /// container); tests that need it skip with this reason.
    #[error("{server}: {action} is not supported: {why}")]
    Unsupported {
        /// Which server.
        server: String,
        /// What was asked, e.g. `pause`.
        action: &'static str,
        /// Why the provider cannot.
        why: String,
    },
    /// An argument was out of range (e.g. an ensemble of zero nodes).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl ServerError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        ServerError::Io {
            context: context.into(),
            source,
        }
    }

    /// True when the server failed to start because its port was taken in the
    /// window between the harness choosing the port and the server binding it.
    pub(crate) fn is_port_conflict(&self) -> bool {
        match self {
            ServerError::Exited { log_tail, .. } | ServerError::StartTimeout { log_tail, .. } => {
                log_tail.contains("in use")
            }
            _ => false,
        }
    }
}

/// Whether tests must treat "could not start a real server" as a failure.
///
/// Returns `true` when the environment variable `CI` is `true` (or `1`), or
/// `DISTLOCK_REQUIRE_SERVERS` is `1` (or `true`), compared case-insensitively.
/// `scripts/test.sh` sets `DISTLOCK_REQUIRE_SERVERS=1`. When this returns
/// `false`, a test whose server cannot start should print a loud skip line
/// and return (see [`skip_or_panic`]).
pub fn require_servers() -> bool {
    fn truthy(var: &str) -> bool {
        std::env::var(var)
            .map(|v| {
                let v = v.trim();
                v == "1" || v.eq_ignore_ascii_case("true")
            })
            .unwrap_or(false)
    }
    truthy("CI") || truthy("DISTLOCK_REQUIRE_SERVERS")
}

/// Applies the skip-or-fail policy to a server start failure.
///
/// Prints `SKIPPED: <test>: <err>` to stderr and returns when
/// [`require_servers`] is `false`; the caller should then return from the
/// test.
///
/// # Panics
///
/// Panics with the error (including the server's log tail) when
/// [`require_servers`] is `true`, failing the calling test.
pub fn skip_or_panic(test: &str, err: &ServerError) {
    if require_servers() {
        panic!("{test}: could not start a real server (required because CI=true or DISTLOCK_REQUIRE_SERVERS=1): {err}");
    }
    eprintln!(
        "SKIPPED: {test}: could not start a real server: {err}\n         (set DISTLOCK_REQUIRE_SERVERS=1 to make this a failure; scripts/test.sh installs the servers)"
    );
}

/// Picks `n` distinct free TCP ports on 127.0.0.1 by binding port 0 and
/// reading the assigned port. All listeners are held until every port is
/// chosen so the ports are distinct, then released for the server to bind.
pub(crate) fn free_ports(n: usize) -> Result<Vec<u16>, ServerError> {
    let mut listeners = Vec::with_capacity(n);
    let mut ports = Vec::with_capacity(n);
    for _ in 0..n {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| ServerError::io("binding 127.0.0.1:0 to find a free port", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| ServerError::io("reading a free port", e))?
            .port();
        ports.push(port);
        listeners.push(listener);
    }
    Ok(ports)
}

/// One free TCP port on 127.0.0.1 (see [`free_ports`]).
pub(crate) fn free_port() -> Result<u16, ServerError> {
    free_ports(1)?
        .pop()
        .ok_or_else(|| ServerError::InvalidArgument("no port allocated".into()))
}

/// `base?query`, or `base` alone when `query` is empty: a test URL with its parameters.
pub(crate) fn with_query(base: String, query: &str) -> String {
    if query.is_empty() {
        base
    } else {
        format!("{base}?{query}")
    }
}

/// Looks `name` up on `PATH`, like a shell would.
pub(crate) fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// The last lines (at most about 8 KiB) of a log file, or a note saying why it
/// could not be read.
pub(crate) fn log_tail(path: &Path) -> String {
    const MAX_BYTES: usize = 8 * 1024;
    const MAX_LINES: usize = 60;
    let mut buf = Vec::new();
    match std::fs::File::open(path).and_then(|mut f| f.read_to_end(&mut buf)) {
        Ok(_) => {}
        Err(e) => return format!("<could not read {}: {e}>", path.display()),
    }
    let start = buf.len().saturating_sub(MAX_BYTES);
    let text = String::from_utf8_lossy(&buf[start..]);
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(MAX_LINES);
    lines[from..].join("\n")
}

/// Creates a fresh temporary directory named after the server.
pub(crate) fn temp_dir(server: &str) -> Result<tempfile::TempDir, ServerError> {
    tempfile::Builder::new()
        .prefix(&format!("distlock-{server}-"))
        .tempdir()
        .map_err(|e| ServerError::io(format!("creating a temp dir for {server}"), e))
}

/// How often readiness probes are retried.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_millis(50);
/// How long a single readiness probe may take.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// How many times a fresh start is retried when its port was taken.
pub(crate) const START_ATTEMPTS: usize = 3;
