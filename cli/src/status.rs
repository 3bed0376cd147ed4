//! `distlock status`: whether a key is held, read without taking it.

use std::time::Duration;

use distlock::{KeyStatus, LockKey};
use serde::Serialize;

use crate::error::CliError;
use crate::{escape, print_out};

pub mod primitives;

/// What `--json` prints.
#[derive(Debug, Serialize)]
struct StatusJson<'a> {
    key: &'a str,
    backend: &'static str,
    held: bool,
    fencing_token: Option<u64>,
    remaining_ms: Option<u128>,
    holder: Option<&'a str>,
}

/// Prints the status of `key` on the backend at `url`.
///
/// # Errors
/// A usage error for a bad key or URL; a failure when the backend cannot be reached
/// or cannot look at keys.
pub async fn run(url: &str, key: &str, json: bool) -> Result<(), CliError> {
    let key = LockKey::new(key).map_err(|e| CliError::usage(format!("invalid key: {e}")))?;
    let locks = distlock::connect(url).await?.lock();
    let info = locks.info();
    let backend = info.name;
    let status = locks.inspect(&key).await?;
    let text = if json {
        let json = StatusJson {
            key: key.as_str(),
            backend,
            held: status.held,
            fencing_token: status.fencing_token.map(|t| t.get()),
            remaining_ms: status.remaining.map(|r| r.as_millis()),
            holder: status.holder.as_deref(),
        };
        let text = serde_json::to_string_pretty(&json)
            .map_err(|e| CliError::failed(format!("cannot encode JSON: {e}")))?;
        escape::json(&text).into_owned() + "\n"
    } else {
        table(
            &key,
            backend,
            info.capabilities.mutex.fencing.is_supported(),
            &status,
        )
    };
    print_out(&text)
}

/// The human-readable status. The key and the holder (which can be a foreign client's
/// value on Redis) are quoted and escaped: neither may drive the operator's terminal.
fn table(key: &LockKey, backend: &str, fencing: bool, status: &KeyStatus) -> String {
    let unknown = || "unknown".to_owned();
    // Without fencing there is no token to know, rather than one we cannot read.
    let no_token = || match fencing {
        true => unknown(),
        false => "none (this backend has no fencing tokens)".to_owned(),
    };
    let token_label = if status.held {
        "fencing token"
    } else {
        "last token"
    };
    let remaining = match (status.held, status.remaining) {
        (false, _) => "-".to_owned(),
        (true, Some(left)) => seconds(left),
        (true, None) => "until released (or its session or process ends)".to_owned(),
    };
    format!(
        "key:            {key}\nbackend:        {backend}\nstate:          {state}\n{token_label:<15} {token}\nremaining:      {remaining}\nholder:         {holder}\n",
        key = escape::quoted(key.as_str()),
        state = if status.held { "held" } else { "free" },
        token_label = format!("{token_label}:"),
        token = status.fencing_token.map_or_else(no_token, |t| t.to_string()),
        holder = match (&status.holder, status.held) {
            (Some(holder), _) => escape::quoted(holder),
            (None, true) => unknown(),
            (None, false) => "-".to_owned(),
        },
    )
}

pub(crate) fn seconds(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}
