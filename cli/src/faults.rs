//! `distlock conformance --faults`: the fault scenarios against a backend, as a table,
//! JSON, and optionally a self-contained HTML page.
//!
//! Against a URL the tool can only put fault proxies in front of the servers it
//! names (network faults); server faults skip as "server not controlled by the
//! harness". With `--spawn` it starts throwaway servers of the URL's kind (through
//! `distlock_test_servers`, the same way the tests do) and runs them all.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use distlock::memory::{MemoryStore, MEMORY_BACKEND};
use distlock::LockError;
use distlock_conformance::{MemoryHarness, UrlConnector};
use distlock_conformance_faults::{
    Claim, ElectionConnector, Fault, FaultHarness, FaultReport, ProxiedHarness, RwConnector,
    SemaphoreConnector, ServerHarness,
};
use distlock_test_servers::{
    EtcdCluster, EtcdServer, PostgresServer, PostgresServerOptions, RedisServer, ServerControl,
    ServerError, ZooKeeperEnsemble, ZooKeeperServer,
};

use crate::error::CliError;
use crate::print_out;

/// The ZooKeeper session the CLI's fault clients ask for: short, so a cut-off holder
/// frees within seconds.
const ZK_SESSION_MS: u64 = 2000;

fn usage(message: impl Into<String>) -> CliError {
    CliError::from(LockError::config("distlock", message.into()))
}

/// `url` with a short ZooKeeper session, unless it sets one.
fn short_session(url: String) -> String {
    match url.split_once("://") {
        Some(("zk" | "zookeeper", rest)) if !rest.contains("session_timeout_ms") => {
            let sep = if rest.contains('?') { '&' } else { '?' };
            format!("{url}{sep}session_timeout_ms={ZK_SESSION_MS}")
        }
        _ => url,
    }
}

/// `distlock::connect`, with a short ZooKeeper session.
fn connector() -> UrlConnector {
    Arc::new(|url: String| {
        Box::pin(async move {
            distlock::connect(&short_session(url))
                .await
                .map(|c| c.lock())
        })
    })
}

/// `distlock::connect` and `Client::semaphore`, with a short ZooKeeper session.
fn semaphore_connector() -> SemaphoreConnector {
    Arc::new(|url: String| {
        Box::pin(async move {
            distlock::connect(&short_session(url))
                .await
                .map(|c| c.semaphore())
        })
    })
}

/// `distlock::connect` and `Client::rw_lock`, with a short ZooKeeper session.
fn rw_connector() -> RwConnector {
    Arc::new(|url: String| {
        Box::pin(async move {
            distlock::connect(&short_session(url))
                .await
                .map(|c| c.rw_lock())
        })
    })
}

/// `distlock::connect` and `Client::election`, with a short ZooKeeper session.
fn election_connector() -> ElectionConnector {
    Arc::new(|url: String| {
        Box::pin(async move {
            distlock::connect(&short_session(url))
                .await
                .map(|c| c.election())
        })
    })
}

/// Which servers `--spawn` starts for a URL. The CLI knows every backend, so the
/// URL templates and claims that the backends' own fault tests state live here too
/// for the servers it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ServerKind {
    /// `nodes` redis-servers without persistence: one is a single node, more is Redlock.
    Redis { nodes: usize },
    /// One PostgreSQL server.
    Postgres,
    /// One standalone ZooKeeper server.
    ZooKeeper,
    /// A ZooKeeper ensemble of `nodes`.
    ZooKeeperEnsemble { nodes: usize },
    /// One etcd node.
    Etcd,
    /// An etcd cluster of `nodes` members.
    EtcdCluster { nodes: usize },
}

impl ServerKind {
    /// The kind a backend URL's scheme names, with the node count of its host list.
    fn for_url(url: &str) -> Option<ServerKind> {
        let (scheme, rest) = url.split_once("://")?;
        let hosts = rest
            .split(['/', '?'])
            .next()
            .map_or(1, |h| h.split(',').count().max(1));
        match scheme {
            "redis" => Some(ServerKind::Redis { nodes: 1 }),
            "redis+redlock" => Some(ServerKind::Redis { nodes: hosts }),
            "postgres" | "postgresql" => Some(ServerKind::Postgres),
            "zk" | "zookeeper" if hosts > 1 => Some(ServerKind::ZooKeeperEnsemble { nodes: hosts }),
            "zk" | "zookeeper" => Some(ServerKind::ZooKeeper),
            "etcd" if hosts > 1 => Some(ServerKind::EtcdCluster { nodes: hosts }),
            "etcd" => Some(ServerKind::Etcd),
            _ => None,
        }
    }

    /// What the backend claims under `fault` with these servers, from its documented
    /// semantics (the same claims as the backends' fault tests).
    fn claim(self, fault: Fault) -> Claim {
        let not = |why: &str| Claim::NotClaimed(why.to_owned());
        match (self, fault) {
            (ServerKind::Redis { nodes: 1 }, Fault::ServerRestart) => not(
                "redis-server without persistence forgets held locks and the fencing counter when restarted",
            ),
            (ServerKind::Redis { .. }, Fault::ServerRestart) => not(
                "Redlock nodes without persistence forget held locks when all restart at once",
            ),
            (ServerKind::Postgres, Fault::ServerRestart) => not(
                "advisory locks die with the server; a holder learns of it only when its session breaks",
            ),
            _ => Claim::Safe,
        }
    }

    /// Starts the servers and a harness over them.
    async fn start(self, connector: UrlConnector) -> Result<ServerHarness, ServerError> {
        let harness = match self {
            ServerKind::Redis { nodes } => {
                let mut all: Vec<Box<dyn ServerControl>> = Vec::new();
                for _ in 0..nodes.max(1) {
                    all.push(Box::new(RedisServer::start().await?));
                }
                let template = if nodes <= 1 {
                    "redis://{hosts}"
                } else {
                    "redis+redlock://{hosts}"
                };
                ServerHarness::new(all, template, connector)
            }
            ServerKind::Postgres => {
                // 16 contending clients with a few sessions each, and the waits'.
                let options =
                    PostgresServerOptions::default().with_setting("max_connections", "400");
                let server = PostgresServer::start_with(options).await?;
                let port = server.port();
                ServerHarness::new(
                    vec![Box::new(server)],
                    "postgres://postgres@{hosts}/postgres?application_name=distlock-fault-{client}",
                    connector,
                )
                .with_session_terminator(Arc::new(move |client| {
                    Box::pin(async move {
                        let name = format!("distlock-fault-{client}");
                        distlock_test_servers::terminate_sessions_at(port, &name)
                            .await
                            .map_err(|e| e.to_string())
                    })
                }))
            }
            ServerKind::ZooKeeper => ServerHarness::new(
                vec![Box::new(ZooKeeperServer::start().await?)],
                "zookeeper://{hosts}",
                connector,
            ),
            ServerKind::ZooKeeperEnsemble { nodes } => ServerHarness::over_ensemble(
                ZooKeeperEnsemble::start(nodes).await?,
                "zookeeper://{hosts}",
                connector,
            ),
            ServerKind::Etcd => ServerHarness::new(
                vec![Box::new(EtcdServer::start().await?)],
                "etcd://{hosts}",
                connector,
            ),
            ServerKind::EtcdCluster { nodes } => ServerHarness::over_etcd_cluster(
                EtcdCluster::start(nodes).await?,
                "etcd://{hosts}",
                connector,
            ),
        };
        Ok(harness.with_claims(move |fault| self.claim(fault)))
    }
}

/// The shortest lease etcd grants with its default 1 s election timeout: the TTL the
/// etcd scenarios use.
const ETCD_TTL: Duration = Duration::from_secs(2);

/// After a lease's TTL, how long etcd may take to expire it: the leader's expiry sweep
/// (every 500 ms) and the revoke's raft round.
const ETCD_SWEEP: Duration = Duration::from_millis(600);

/// The TTL and the longest a cut-off holder keeps its lock, for `kind` with the
/// clients' default settings.
fn timing(kind: Option<ServerKind>) -> (Duration, Duration) {
    if let Some(ServerKind::Etcd | ServerKind::EtcdCluster { .. }) = kind {
        return (ETCD_TTL, ETCD_TTL + ETCD_SWEEP);
    }
    let ttl = Duration::from_millis(500);
    let bound = match kind {
        // The default session timeout (10 s) and one heartbeat (2 s).
        Some(ServerKind::Postgres) => Duration::from_millis(12_100),
        // The session, rounded up to a server tick, plus one for the sweep.
        Some(ServerKind::ZooKeeper | ServerKind::ZooKeeperEnsemble { .. }) => {
            Duration::from_millis(ZK_SESSION_MS + 400)
        }
        _ => ttl,
    };
    (ttl, bound)
}

/// How long a killed FIFO waiter holds up the queue when it is longer than the crash
/// bound: on Redis, the queue entry's TTL (clients here use the default config).
fn dead_waiter_bound(kind: Option<ServerKind>, crash_bound: Duration) -> Duration {
    match kind {
        Some(ServerKind::Redis { .. }) => {
            crash_bound.max(distlock::redis::RedisConfig::default().fifo_entry_ttl)
        }
        // A waiter waits under a lease of its own of at most 3 s.
        Some(ServerKind::Etcd | ServerKind::EtcdCluster { .. }) => {
            crash_bound.max(Duration::from_secs(3) + ETCD_SWEEP)
        }
        _ => crash_bound,
    }
}

async fn harness(url: &str, spawn: bool) -> Result<Arc<dyn FaultHarness>, CliError> {
    let kind = ServerKind::for_url(url);
    // Only the scheme goes into messages: URLs may carry passwords.
    let scheme = url
        .split_once("://")
        .map_or("(no scheme)", |(scheme, _)| scheme);
    if spawn {
        let kind = kind.ok_or_else(|| {
            usage(format!(
                "--spawn starts redis://, redis+redlock://h1,h2,h3, postgres://, zookeeper://, \
                 zookeeper://h1,h2,h3, etcd:// or etcd://h1,h2,h3 servers; {scheme}:// is none \
                 of these"
            ))
        })?;
        if matches!(kind, ServerKind::Etcd | ServerKind::EtcdCluster { .. })
            && !cfg!(feature = "etcd")
        {
            return Err(usage(
                "etcd:// needs a distlock built with the `etcd` feature \
                 (cargo build -p distlock-cli --features etcd)",
            ));
        }
        let (ttl, bound) = timing(Some(kind));
        let harness = kind
            .start(connector())
            .await
            .map_err(|e| CliError::failed(format!("cannot start the servers: {e}")))?;
        return Ok(Arc::new(
            harness
                .with_timing(ttl, bound)
                .with_dead_waiter_bound(dead_waiter_bound(Some(kind), bound))
                .with_primitives(semaphore_connector(), rw_connector())
                .with_election(election_connector()),
        ));
    }
    // Connect once first, so a bad or unreachable backend is one clear error.
    let probe = distlock::connect(url).await?.lock();
    if probe.info().name == MEMORY_BACKEND {
        let name = url.split_once("://").map_or("", |(_, name)| name);
        return Ok(Arc::new(MemoryHarness::with_store(MemoryStore::named(
            name,
        ))));
    }
    drop(probe);
    let (ttl, bound) = timing(kind);
    let harness = ProxiedHarness::new(url, connector()).await.map_err(usage)?;
    Ok(Arc::new(
        harness
            .with_claims(move |fault| kind.map_or(Claim::Safe, |kind| kind.claim(fault)))
            .with_timing(ttl, bound)
            .with_dead_waiter_bound(dead_waiter_bound(kind, bound)),
    ))
}

/// Runs every fault scenario against `url` (or servers spawned like it), prints the
/// table or JSON, and writes the HTML page to `html` if given.
///
/// # Errors
/// A usage error for a URL the tool cannot use; a failure when servers cannot start,
/// the backend cannot be reached, the page cannot be written, or a scenario fails
/// (the report is printed first).
pub async fn run(url: &str, spawn: bool, json: bool, html: Option<&Path>) -> Result<(), CliError> {
    let harness = harness(url, spawn).await?;
    let report = distlock_conformance_faults::run_faults(harness).await;
    if json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| CliError::failed(format!("cannot write the report as JSON: {e}")))?;
        print_out(&format!("{text}\n"))?;
    } else {
        print_out(&report.to_table())?;
    }
    if let Some(path) = html {
        write_html(&report, path)?;
    }
    let failed = report.failed();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(CliError::failed(format!(
            "{} of {} fault scenarios failed: {}",
            failed.len(),
            report.results.len(),
            failed.join(", ")
        )))
    }
}

fn write_html(report: &FaultReport, path: &Path) -> Result<(), CliError> {
    std::fs::write(path, report.to_html())
        .map_err(|e| CliError::failed(format!("cannot write {}: {e}", path.display())))
}
