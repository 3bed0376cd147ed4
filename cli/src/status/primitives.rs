//! `distlock status --semaphore` and `--rw`: the holders of a semaphore or read-write
//! lock, read without taking it.

use distlock::{HolderStatus, LockKey, RwMode};
use serde::Serialize;

use super::seconds;
use crate::error::CliError;
use crate::{escape, print_out};

/// One holder, as `--json` prints it.
#[derive(Debug, Serialize)]
struct HolderJson<'a> {
    holder: Option<&'a str>,
    remaining_ms: Option<u128>,
    fencing_token: Option<u64>,
}

impl<'a> From<&'a HolderStatus> for HolderJson<'a> {
    fn from(h: &'a HolderStatus) -> Self {
        HolderJson {
            holder: h.holder.as_deref(),
            remaining_ms: h.remaining.map(|r| r.as_millis()),
            fencing_token: h.fencing_token.map(|t| t.get()),
        }
    }
}

/// What `status --semaphore --json` prints.
#[derive(Debug, Serialize)]
struct SemaphoreJson<'a> {
    key: &'a str,
    backend: &'static str,
    permits: Option<u32>,
    held: usize,
    holders: Vec<HolderJson<'a>>,
}

/// What `status --rw --json` prints.
#[derive(Debug, Serialize)]
struct RwJson<'a> {
    key: &'a str,
    backend: &'static str,
    /// `"free"`, `"read"` or `"write"`.
    state: &'static str,
    /// `null` when the backend cannot list them (the file backend's readers).
    holders: Option<Vec<HolderJson<'a>>>,
    writer_waiting: Option<bool>,
}

fn key_of(key: &str) -> Result<LockKey, CliError> {
    LockKey::new(key).map_err(|e| CliError::usage(format!("invalid key: {e}")))
}

fn json_text(value: &impl Serialize) -> Result<String, CliError> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| CliError::failed(format!("cannot encode JSON: {e}")))?;
    Ok(escape::json(&text).into_owned() + "\n")
}

/// One line per holder, indented, its fields escaped (a holder's text may come from a
/// server).
fn holder_lines(holders: &[HolderStatus]) -> String {
    holders
        .iter()
        .enumerate()
        .map(|(n, h)| {
            let mut line = format!("  {}:", n + 1);
            if let Some(holder) = &h.holder {
                line += &format!(" {}", escape::quoted(holder));
            }
            if let Some(left) = h.remaining {
                line += &format!(" remaining {}", seconds(left));
            }
            if let Some(token) = h.fencing_token {
                line += &format!(" fencing token {token}");
            }
            line + "\n"
        })
        .collect()
}

/// Prints the semaphore `key` on the backend at `url`: its permit count and holders.
///
/// # Errors
/// A usage error for a bad key or URL, or a backend without semaphores; a failure when
/// the backend cannot be reached or cannot look at keys.
pub async fn semaphore(url: &str, key: &str, json: bool) -> Result<(), CliError> {
    let key = key_of(key)?;
    let client = distlock::connect(url).await?;
    offered(&client, distlock::Primitive::Semaphore)?;
    let semaphores = client.semaphore();
    let backend = semaphores.info().name;
    let status = semaphores.inspect(&key).await.map_err(unsupported)?;
    let text = if json {
        json_text(&SemaphoreJson {
            key: key.as_str(),
            backend,
            permits: status.permits,
            held: status.holders.len(),
            holders: status.holders.iter().map(HolderJson::from).collect(),
        })?
    } else {
        let permits = status
            .permits
            .map_or_else(|| "-".to_owned(), |n| n.to_string());
        format!(
            "semaphore:      {key}\nbackend:        {backend}\npermits:        {permits}\nheld:           {held}\n{lines}",
            key = escape::quoted(key.as_str()),
            held = status.holders.len(),
            lines = holder_lines(&status.holders),
        )
    };
    print_out(&text)
}

/// Prints the read-write lock `key` on the backend at `url`: free, read or write, its
/// holders where the backend can list them, and whether a writer waits.
///
/// # Errors
/// As [`semaphore`].
pub async fn rw(url: &str, key: &str, json: bool) -> Result<(), CliError> {
    let key = key_of(key)?;
    let client = distlock::connect(url).await?;
    offered(&client, distlock::Primitive::RwLock)?;
    let locks = client.rw_lock();
    let backend = locks.info().name;
    let status = locks.inspect(&key).await.map_err(unsupported)?;
    let state = status.mode.map_or("free", RwMode::as_str);
    let text = if json {
        json_text(&RwJson {
            key: key.as_str(),
            backend,
            state,
            holders: status
                .holders
                .as_ref()
                .map(|list| list.iter().map(HolderJson::from).collect()),
            writer_waiting: status.writer_waiting,
        })?
    } else {
        let (count, lines) = match &status.holders {
            Some(list) => (list.len().to_string(), holder_lines(list)),
            None => (
                "unknown (this backend cannot list readers)".to_owned(),
                String::new(),
            ),
        };
        let waiting = match status.writer_waiting {
            Some(true) => "yes (new readers wait behind it)",
            Some(false) => "no",
            None => "unknown",
        };
        format!(
            "rw lock:        {key}\nbackend:        {backend}\nstate:          {state}\nholders:        {count}\n{lines}writer waiting: {waiting}\n",
            key = escape::quoted(key.as_str()),
        )
    };
    print_out(&text)
}

/// A backend without the primitive is the caller's mistake (exit 2), as for `exec`.
/// A usage error when the backend does not offer `primitive`, with its reason.
fn offered(client: &distlock::Client, primitive: distlock::Primitive) -> Result<(), CliError> {
    let info = client.info();
    match info.capabilities.of(primitive).offered {
        distlock::Capability::Supported => Ok(()),
        distlock::Capability::Unsupported(reason) => {
            Err(unsupported(distlock::LockError::Unsupported {
                backend: info.name,
                operation: primitive.as_str(),
                reason,
            }))
        }
    }
}

fn unsupported(error: distlock::LockError) -> CliError {
    match error {
        distlock::LockError::Unsupported { .. } => CliError::usage(crate::error::describe(&error)),
        other => other.into(),
    }
}
