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
    FaultHarness, FaultReport, ProxiedHarness, ServerHarness, ServerKind,
};

use crate::error::CliError;
use crate::print_out;

/// The ZooKeeper session the CLI's fault clients ask for: short, so a cut-off holder
/// frees within seconds.
const ZK_SESSION_MS: u64 = 2000;

fn usage(message: impl Into<String>) -> CliError {
    CliError::from(LockError::config("distlock", message.into()))
}

/// `distlock::connect`, with a short ZooKeeper session.
fn connector() -> UrlConnector {
    Arc::new(|url: String| {
        Box::pin(async move {
            let url = match url.split_once("://") {
                Some(("zk" | "zookeeper", rest)) if !rest.contains("session_timeout_ms") => {
                    let sep = if rest.contains('?') { '&' } else { '?' };
                    format!("{url}{sep}session_timeout_ms={ZK_SESSION_MS}")
                }
                _ => url,
            };
            distlock::connect(&url).await
        })
    })
}

/// The TTL and the longest a cut-off holder keeps its lock, for `kind` with the
/// clients' default settings.
fn timing(kind: Option<ServerKind>) -> (Duration, Duration) {
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
                "--spawn starts redis://, redis+redlock://h1,h2,h3, postgres://, zookeeper:// or \
                 zookeeper://h1,h2,h3 servers; {scheme}:// is none of these"
            ))
        })?;
        let (ttl, bound) = timing(Some(kind));
        let harness = ServerHarness::start(kind, connector())
            .await
            .map_err(|e| CliError::failed(format!("cannot start the servers: {e}")))?;
        return Ok(Arc::new(
            harness
                .with_timing(ttl, bound)
                .with_dead_waiter_bound(dead_waiter_bound(Some(kind), bound)),
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
    let (ttl, bound) = timing(kind);
    let harness = ProxiedHarness::new(url, connector()).await.map_err(usage)?;
    Ok(Arc::new(
        harness
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
