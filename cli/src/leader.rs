//! `distlock leader`: who leads an election, and with `--watch` every change.

use std::time::Duration;

use distlock::{Leader, LeaderWatch, LockKey};
use serde::Serialize;

use crate::error::CliError;
use crate::exec::EXIT_UNREACHABLE;
use crate::{escape, print_out};

/// What `--json` prints, one object per look (one per line with `--watch`).
#[derive(Debug, Serialize)]
struct LeaderJson<'a> {
    election: &'a str,
    backend: &'static str,
    /// `null` when nobody leads.
    leader: Option<String>,
    term: Option<u64>,
    remaining_ms: Option<u128>,
}

/// Prints the leader of `name` on the backend at `url`; with `watch`, then every change
/// until the connection is lost (exit 69) or distlock is stopped.
///
/// # Errors
/// A usage error for a bad name or URL, or a backend without elections; exit 69 when
/// the backend cannot be reached or the watch loses it.
pub async fn run(url: &str, name: &str, json: bool, watch: bool) -> Result<(), CliError> {
    let name = LockKey::new(name).map_err(|e| CliError::usage(format!("invalid name: {e}")))?;
    let elections = distlock::connect(url)
        .await
        .map(|c| c.election())
        .map_err(unreachable)?;
    let backend = elections.info().name;
    let mut changes = LeaderWatch::new(elections, name.clone());
    loop {
        let now = changes.next().await.map_err(unreachable)?;
        let text = if json {
            one_line_json(&name, backend, now.as_ref())?
        } else if watch {
            watch_line(now.as_ref())
        } else {
            table(&name, backend, now.as_ref())
        };
        print_out(&text)?;
        if !watch {
            return Ok(());
        }
    }
}

fn unreachable(error: distlock::LockError) -> CliError {
    match CliError::from(error) {
        usage if usage.exit_code() == CliError::USAGE => usage,
        other => CliError::with_code(other.message(), EXIT_UNREACHABLE),
    }
}

fn one_line_json(
    name: &LockKey,
    backend: &'static str,
    now: Option<&Leader>,
) -> Result<String, CliError> {
    let json = LeaderJson {
        election: name.as_str(),
        backend,
        leader: now.map(|l| l.candidate.to_text().into_owned()),
        term: now.map(|l| l.term.get()),
        remaining_ms: now.and_then(|l| l.remaining).map(|r| r.as_millis()),
    };
    let text = serde_json::to_string(&json)
        .map_err(|e| CliError::failed(format!("cannot encode JSON: {e}")))?;
    Ok(escape::json(&text).into_owned() + "\n")
}

/// One line per change for `--watch`: the identity is quoted and escaped, since it
/// comes from whoever campaigned.
fn watch_line(now: Option<&Leader>) -> String {
    match now {
        Some(l) => format!("leader {} term {}\n", l.candidate, l.term),
        None => "no leader\n".to_owned(),
    }
}

fn table(name: &LockKey, backend: &str, now: Option<&Leader>) -> String {
    let (leader, term, remaining) = match now {
        Some(l) => (
            l.candidate.to_string(),
            l.term.to_string(),
            match l.remaining {
                Some(left) => seconds(left),
                None => "until it resigns (or its session or process ends)".to_owned(),
            },
        ),
        None => ("none".to_owned(), "-".to_owned(), "-".to_owned()),
    };
    format!(
        "election:       {}\nbackend:        {backend}\nleader:         {leader}\nterm:           {term}\nremaining:      {remaining}\n",
        escape::quoted(name.as_str())
    )
}

fn seconds(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}
