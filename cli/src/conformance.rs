//! `distlock conformance`: the conformance kit against a backend URL, or its self-test.

use std::sync::Arc;

use distlock::memory::{MemoryStore, MEMORY_BACKEND};
use distlock_conformance::{run_all, Harness, MemoryHarness};
use serde::Serialize;

use crate::error::CliError;
use crate::print_out;
use crate::url_harness::{connector, UrlHarness};

/// Runs every scenario against `url` and prints the report (a table, or JSON).
///
/// # Errors
/// A usage error for a URL `distlock::connect` refuses; a failure when the backend
/// cannot be reached or any scenario fails (the report is printed first).
pub async fn run(url: &str, json: bool) -> Result<(), CliError> {
    let harness = harness(url).await?;
    let report = run_all(harness).await;
    print(&report, json, || report.to_table())?;
    if report.all_passed() {
        Ok(())
    } else {
        let failed = report.failed();
        Err(CliError::failed(format!(
            "{} of {} conformance scenarios failed: {}",
            failed.len(),
            report.results.len(),
            failed.join(", ")
        )))
    }
}

/// Runs the kit's self-test and prints its table (or JSON).
///
/// # Errors
/// A failure unless the reference backend passed and every broken backend was caught.
pub async fn self_test(json: bool) -> Result<(), CliError> {
    let report = distlock_conformance::self_test().await;
    print(&report, json, || report.to_table())?;
    if report.all_good() {
        Ok(())
    } else {
        let missed: Vec<_> = report
            .rows
            .iter()
            .filter(|row| row.caught_by.is_empty())
            .map(|row| row.mistake)
            .collect();
        Err(CliError::failed(format!(
            "self-test failed: the reference backend {} and {} anti-pattern(s) went uncaught{}{}",
            if report.reference.all_passed() {
                "passed"
            } else {
                "failed"
            },
            missed.len(),
            if missed.is_empty() { "" } else { ": " },
            missed.join(", ")
        )))
    }
}

/// The harness for `url`: the crashable memory harness for `memory://` URLs, a
/// [`UrlHarness`] otherwise. Connects once first, so a bad or unreachable backend is
/// one clear error rather than a report full of failures.
async fn harness(url: &str) -> Result<Arc<dyn Harness>, CliError> {
    let probe = distlock::connect(url).await?.lock();
    if probe.info().name == MEMORY_BACKEND {
        // `connect` accepted the URL, so it has a `scheme://` prefix; the store name is
        // what follows, exactly as `connect` reads it.
        let name = url.split_once("://").map_or("", |(_, name)| name);
        let harness =
            MemoryHarness::with_store(MemoryStore::named(name)).with_url_connector(connector());
        Ok(Arc::new(harness))
    } else {
        Ok(Arc::new(UrlHarness::new(url)))
    }
}

/// Prints `value` as pretty JSON, or the table `table` builds.
fn print<T: Serialize>(
    value: &T,
    json: bool,
    table: impl FnOnce() -> String,
) -> Result<(), CliError> {
    if json {
        let text = serde_json::to_string_pretty(value)
            .map_err(|e| CliError::failed(format!("cannot write the report as JSON: {e}")))?;
        print_out(&format!("{text}\n"))
    } else {
        print_out(&table())
    }
}
