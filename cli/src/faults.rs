//! `distlock conformance --faults`: the fault scenarios against a backend, as a table,
//! JSON, and optionally a self-contained HTML page.
//!
//! Against a URL the tool can only put fault proxies in front of the servers it
//! names (network faults); server faults skip as "server not controlled by the
//! harness". With `--spawn` it starts throwaway servers of the URL's kind (through
//! `distlock_test_servers::SERVER_KINDS`, the same way the tests do) and runs them all.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use distlock::memory::{MemoryStore, MEMORY_BACKEND};
use distlock::LockError;
use distlock_conformance::{MemoryHarness, UrlConnector};
use distlock_conformance_faults::{
    Claim, Fault, FaultHarness, FaultReport, ProxiedHarness, ServerHarness,
};
use distlock_test_servers::{kind_for_scheme, ServerError, ServerKind, SERVER_KINDS};

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
    Arc::new(|url: String| Box::pin(async move { distlock::connect(&short_session(url)).await }))
}

/// The servers a URL names, as `--spawn` would start them: their kind (from
/// `distlock_test_servers::SERVER_KINDS`) and how many nodes its host list has.
#[derive(Clone, Copy)]
struct Servers {
    kind: &'static ServerKind,
    nodes: usize,
}

impl Servers {
    fn for_url(url: &str) -> Option<Servers> {
        let (scheme, rest) = url.split_once("://")?;
        let nodes = rest
            .split(['/', '?'])
            .next()
            .map_or(1, |h| h.split(',').count().max(1));
        Some(Servers {
            kind: kind_for_scheme(scheme)?,
            nodes,
        })
    }

    /// What the backend claims under `fault` on these servers, from its documented
    /// semantics (the same claims as the backends' fault tests); safe elsewhere.
    fn claim(self, fault: Fault) -> Claim {
        let not = |why: &str| Claim::NotClaimed(why.to_owned());
        match (self.kind.name, self.nodes, fault) {
            ("redis", 1, Fault::ServerRestart) => not(
                "redis-server without persistence forgets held locks and the fencing counter when restarted",
            ),
            ("redis", _, Fault::ServerRestart) => not(
                "Redlock nodes without persistence forget held locks when all restart at once",
            ),
            ("postgres", _, Fault::ServerRestart) => not(
                "advisory locks die with the server; a holder learns of it only when its session breaks",
            ),
            ("mariadb", _, Fault::ServerRestart) => not(
                "GET_LOCK user locks die with the server; a holder learns of it only when its session breaks",
            ),
            _ => Claim::Safe,
        }
    }

    /// Starts the servers and a harness over them.
    async fn start(self, connector: UrlConnector) -> Result<ServerHarness, ServerError> {
        let started = self.kind.start(self.nodes).await?;
        let harness = if self.kind.name == "postgres" {
            // Each client names its sessions, so that one client's can be ended.
            let port = started.ports().first().copied().unwrap_or_default();
            let template = format!(
                "{}?application_name=distlock-fault-{{client}}",
                self.kind.template(1)
            );
            ServerHarness::over_started(started, template, connector).with_session_terminator(
                Arc::new(move |client| {
                    Box::pin(async move {
                        let name = format!("distlock-fault-{client}");
                        distlock_test_servers::terminate_sessions_at(port, &name)
                            .await
                            .map_err(|e| e.to_string())
                    })
                }),
            )
        } else if self.kind.name == "mariadb" {
            // Each client logs in as a user of its own, so that its sessions can be killed.
            let port = started.ports().first().copied().unwrap_or_default();
            distlock_test_servers::add_fault_users(port).await?;
            let template = distlock_test_servers::MARIADB_FAULT_URL_TEMPLATE;
            ServerHarness::over_started(started, template, connector).with_session_terminator(
                Arc::new(move |client| {
                    Box::pin(async move {
                        distlock_test_servers::kill_connections_of(port, &format!("fault{client}"))
                            .await
                            .map_err(|e| e.to_string())
                    })
                }),
            )
        } else {
            ServerHarness::over_started(started, self.kind.template(self.nodes), connector)
        };
        Ok(harness.with_claims(move |fault| self.claim(fault)))
    }

    /// The TTL and the longest a cut-off holder keeps its lock, with the clients'
    /// default settings.
    fn timing(self) -> (Duration, Duration) {
        let ttl = Duration::from_millis(500);
        match self.kind.name {
            "etcd" => (ETCD_TTL, ETCD_TTL + ETCD_SWEEP),
            // The default session timeout (10 s) and one heartbeat (2 s).
            "postgres" => (ttl, Duration::from_millis(12_100)),
            // The default session timeout (10 s, checked at whole seconds: + 1 s) and one
            // heartbeat (2 s).
            "mariadb" => (ttl, Duration::from_millis(13_100)),
            // The session, rounded up to a server tick, plus one for the sweep.
            "zookeeper" => (ttl, Duration::from_millis(ZK_SESSION_MS + 400)),
            _ => (ttl, ttl),
        }
    }

    /// How long a killed FIFO waiter holds up the queue when that is longer than the
    /// crash bound.
    fn dead_waiter_bound(self, crash_bound: Duration) -> Duration {
        match self.kind.name {
            // The queue entry's TTL (clients here use the default config).
            "redis" => crash_bound.max(distlock::redis::RedisConfig::default().fifo_entry_ttl),
            // A waiter waits under a lease of its own of at most 3 s.
            "etcd" => crash_bound.max(Duration::from_secs(3) + ETCD_SWEEP),
            _ => crash_bound,
        }
    }
}

/// The shortest lease etcd grants with its default 1 s election timeout: the TTL the
/// etcd scenarios use.
const ETCD_TTL: Duration = Duration::from_secs(2);

/// After a lease's TTL, how long etcd may take to expire it: the leader's expiry sweep
/// (every 500 ms) and the revoke's raft round.
const ETCD_SWEEP: Duration = Duration::from_millis(600);

/// The TTL and crash bounds of servers we know nothing of: the kit's defaults.
const DEFAULT_TIMING: (Duration, Duration) =
    (Duration::from_millis(500), Duration::from_millis(500));

async fn harness(url: &str, spawn: bool) -> Result<Arc<dyn FaultHarness>, CliError> {
    let servers = Servers::for_url(url);
    // Only the scheme goes into messages: URLs may carry passwords.
    let scheme = url
        .split_once("://")
        .map_or("(no scheme)", |(scheme, _)| scheme);
    if spawn {
        let servers = servers.ok_or_else(|| {
            let known: Vec<String> = SERVER_KINDS
                .iter()
                .flat_map(|k| k.schemes.iter().map(|s| format!("{s}://")))
                .collect();
            usage(format!(
                "--spawn starts servers for {} URLs (several hosts: Redlock, a ZooKeeper \
                 ensemble or an etcd cluster); {scheme}:// is none of these",
                known.join(", ")
            ))
        })?;
        if !distlock::scheme_available(scheme) {
            // connect() names the feature to turn on.
            distlock::connect(url).await?;
        }
        let (ttl, bound) = servers.timing();
        let harness = servers
            .start(connector())
            .await
            .map_err(|e| CliError::failed(format!("cannot start the servers: {e}")))?;
        return Ok(Arc::new(
            harness
                .with_timing(ttl, bound)
                .with_dead_waiter_bound(servers.dead_waiter_bound(bound)),
        ));
    }
    // Connect once first, so a bad or unreachable backend is one clear error.
    let probe = distlock::connect(url).await?;
    if probe.info().name == MEMORY_BACKEND {
        let name = url.split_once("://").map_or("", |(_, name)| name);
        return Ok(Arc::new(MemoryHarness::with_store(MemoryStore::named(
            name,
        ))));
    }
    drop(probe);
    let (ttl, bound) = servers.map_or(DEFAULT_TIMING, Servers::timing);
    let dead_waiter = servers.map_or(bound, |s| s.dead_waiter_bound(bound));
    let harness = ProxiedHarness::new(url, connector()).await.map_err(usage)?;
    Ok(Arc::new(
        harness
            .with_claims(move |fault| servers.map_or(Claim::Safe, |s| s.claim(fault)))
            .with_timing(ttl, bound)
            .with_dead_waiter_bound(dead_waiter),
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
