//! What the Sentinel group and the Cluster share: their TLS files. Its own module, so
//! neither of the two imports the other.

use std::path::PathBuf;

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
