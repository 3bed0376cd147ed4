//! What the Sentinel group and the Cluster share: their TLS files and `redis-cli`
//! probes. Its own module, so neither of the two imports the other.

use std::path::PathBuf;
use std::time::Duration;

use super::redis::redis_binary;
use super::ServerError;

/// The label of `redis-cli` failures (the Sentinel group's, where the probe began).
const SERVER: &str = "redis-sentinel";

/// The certificate and key of a TLS group or cluster.
pub(super) struct TlsFiles {
    pub(super) cert: PathBuf,
    pub(super) key: PathBuf,
}

impl TlsFiles {
    /// The configuration directives for TLS on `port`.
    pub(super) fn directives(&self, port: u16) -> Vec<(&'static str, String)> {
        let (cert, key) = (
            self.cert.display().to_string(),
            self.key.display().to_string(),
        );
        vec![
            ("tls-port", port.to_string()),
            ("tls-cert-file", cert.clone()),
            ("tls-key-file", key),
            ("tls-ca-cert-file", cert),
            ("tls-auth-clients", "no".into()),
            ("tls-replication", "yes".into()),
        ]
    }
}

/// Runs `redis-cli -p PORT ARGS…` and returns its output (each reply element on
/// its own line).
///
/// # Errors
/// [`ServerError::Probe`] when it fails or says `ERR`/`Could not connect`.
pub(super) async fn redis_cli(port: u16, args: &[&str]) -> Result<String, ServerError> {
    let cli = redis_binary()?.with_file_name("redis-cli");
    let cli = if cli.is_file() {
        cli
    } else {
        PathBuf::from("redis-cli")
    };
    let output = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::process::Command::new(cli)
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| ServerError::Probe {
        server: SERVER,
        detail: format!("redis-cli -p {port} {args:?} did not finish in 10 s"),
    })?
    .map_err(|e| ServerError::io("running redis-cli", e))?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() || text.starts_with("ERR") || text.starts_with("Could not connect")
    {
        return Err(ServerError::Probe {
            server: SERVER,
            detail: format!(
                "redis-cli -p {port} {args:?}: {} {}",
                text.trim(),
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        });
    }
    Ok(text)
}

/// True unless the server on `port` is a replica whose link to its master is not up
/// (`INFO replication`).
pub(super) async fn replica_in_sync(port: u16) -> bool {
    let info = redis_cli(port, &["INFO", "replication"])
        .await
        .unwrap_or_default();
    !info.contains("role:slave") || info.contains("master_link_status:up")
}
