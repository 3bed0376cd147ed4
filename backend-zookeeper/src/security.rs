//! Who a session is and how it talks to the servers: digest credentials, TLS files,
//! and the ACL of the nodes it creates.

use std::fmt;
use std::path::PathBuf;

use distlock_api::LockError;
use zookeeper_client as zk;

use crate::ZOOKEEPER_BACKEND;

/// Digest credentials (`user:password@` in the URL), sent with ZooKeeper's `addauth
/// digest user:password` on every session. `Debug` does not show the password.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Credentials {
    /// The digest user name.
    pub user: String,
    /// The digest password.
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// The PEM files of a `zookeeper+tls://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsFiles {
    /// `?ca=PATH`: the certificate authorities that sign the servers' certificates
    /// (required: no system roots are used). The servers' certificates must name the
    /// host of the URL (a DNS name or IP address in their subject alternative names).
    pub ca: PathBuf,
    /// `?cert=PATH&key=PATH`: a client certificate chain and its private key, for
    /// servers that ask for one (`ssl.clientAuth`). Both or neither.
    pub client: Option<(PathBuf, PathBuf)>,
}

/// ACL of every node a client with credentials creates (lock directories, the base
/// path's missing ancestors, contender nodes): its creator's identity may do anything,
/// everyone may read (list the contenders, see the holder), as Curator's ACL providers
/// allow. ZooKeeper checks a node's *parent* for creating and deleting children, so no
/// other identity can enter, leave or remove contenders in such a directory.
static CREATOR_ALL_WORLD_READ: [zk::Acl; 2] = [
    zk::Acl::new_const(zk::Permission::ALL, "auth", ""),
    zk::Acl::new_const(zk::Permission::READ, "world", "anyone"),
];

/// The ACL for nodes this client creates: [`CREATOR_ALL_WORLD_READ`] with credentials,
/// else the open ACL (anyone may do anything, the default of ZooKeeper and Curator).
pub(crate) fn node_acls(authenticated: bool) -> zk::Acls<'static> {
    if authenticated {
        zk::Acls::from(&CREATOR_ALL_WORLD_READ[..])
    } else {
        zk::Acls::anyone_all()
    }
}

/// What every session of one client presents: credentials and TLS settings, read
/// once when the client is made.
#[derive(Debug, Clone, Default)]
pub(crate) struct Identity {
    credentials: Option<Credentials>,
    #[cfg(feature = "tls")]
    tls: Option<zk::TlsOptions>,
}

impl Identity {
    /// Reads `tls`'s files (a missing or unreadable file, or one without a usable
    /// certificate or key, is a [`LockError::Config`] naming it).
    ///
    /// # Errors
    /// [`LockError::Config`] as above, and for TLS in a build without the `tls`
    /// feature.
    pub(crate) fn new(
        credentials: Option<Credentials>,
        tls: Option<&TlsFiles>,
    ) -> Result<Identity, LockError> {
        #[cfg(feature = "tls")]
        let tls = tls.map(tls_options).transpose()?;
        #[cfg(not(feature = "tls"))]
        if tls.is_some() {
            return Err(LockError::config(
                ZOOKEEPER_BACKEND,
                "zookeeper+tls:// needs distlock-zookeeper's `tls` feature \
                 (`zookeeper-tls` in the distlock facade)",
            ));
        }
        Ok(Identity {
            credentials,
            #[cfg(feature = "tls")]
            tls,
        })
    }

    /// True when sessions authenticate (and nodes get [`CREATOR_ALL_WORLD_READ`]).
    pub(crate) fn is_authenticated(&self) -> bool {
        self.credentials.is_some()
    }

    /// True when connections use TLS.
    pub(crate) fn uses_tls(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    /// Connects `connector` to `hosts` as this identity.
    ///
    /// The credentials go in an `addauth` sent once the session is established, not
    /// with the connect request: ZooKeeper 3.8's Netty server (every TLS port) can
    /// answer an `addauth` that arrives right behind the connect request of a new
    /// session before the connect itself, and the client then fails the handshake.
    /// (The client sends the credentials again with every reconnect of the session.)
    pub(crate) async fn connect(
        &self,
        connector: zk::Connector,
        hosts: &str,
    ) -> Result<zk::Client, zk::Error> {
        #[cfg(feature = "tls")]
        let connecting = match &self.tls {
            Some(tls) => {
                install_crypto_provider();
                connector.with_tls(tls.clone()).secure_connect(hosts).await
            }
            None => connector.connect(hosts).await,
        };
        #[cfg(not(feature = "tls"))]
        let connecting = connector.connect(hosts).await;
        let client = connecting?;
        if let Some(c) = &self.credentials {
            client
                .auth("digest", format!("{}:{}", c.user, c.password).as_bytes())
                .await?;
        }
        Ok(client)
    }
}

/// Checks that every `host:port` of a TLS URL names a host a certificate can be
/// checked against (a DNS name or an IP address): the client cannot connect to others
/// over TLS.
///
/// # Errors
/// [`LockError::Config`] naming the first host that is neither.
pub(crate) fn check_tls_hosts(hosts: &[String]) -> Result<(), LockError> {
    for host in hosts {
        let name = host
            .rsplit_once(':')
            .map_or(host.as_str(), |(name, _)| name);
        let name = name.trim_start_matches('[').trim_end_matches(']');
        let valid = name.parse::<std::net::IpAddr>().is_ok() || is_dns_name(name);
        if !valid {
            return Err(LockError::config(
                ZOOKEEPER_BACKEND,
                format!(
                    "{name:?} is neither a DNS name nor an IP address, so no TLS certificate \
                     can name it"
                ),
            ));
        }
    }
    Ok(())
}

/// A DNS name as rustls checks it: dot-separated labels of 1 to 63 letters, digits,
/// `-` and `_`, not starting or ending with `-`, at most 253 bytes, not all digits.
fn is_dns_name(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    let label_ok = |label: &str| {
        (1..=63).contains(&label.len())
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    (1..=253).contains(&name.len())
        && name.split('.').all(label_ok)
        && !name
            .split('.')
            .next_back()
            .is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(feature = "tls")]
fn tls_options(files: &TlsFiles) -> Result<zk::TlsOptions, LockError> {
    let read = |what: &str, path: &PathBuf| {
        std::fs::read_to_string(path).map_err(|e| {
            LockError::config(
                ZOOKEEPER_BACKEND,
                format!("cannot read the TLS {what} file {}: {e}", path.display()),
            )
        })
    };
    let invalid = |what: &str, path: &PathBuf, e: zk::Error| {
        LockError::config(
            ZOOKEEPER_BACKEND,
            format!(
                "the TLS {what} file {} is not usable PEM: {e}",
                path.display()
            ),
        )
    };
    let ca = read("CA", &files.ca)?;
    let mut options = zk::TlsOptions::new()
        .with_pem_ca(&ca)
        .map_err(|e| invalid("CA", &files.ca, e))?;
    if let Some((cert, key)) = &files.client {
        let (cert_pem, key_pem) = (read("client certificate", cert)?, read("client key", key)?);
        options = options
            .with_pem_identity(&cert_pem, &key_pem)
            .map_err(|e| invalid("client certificate or key", cert, e))?;
    }
    Ok(options)
}

/// rustls needs one process-wide crypto provider when more than one is compiled in
/// (zookeeper-client enables aws-lc-rs, other crates ring); installs ring unless the
/// program installed one.
#[cfg(feature = "tls")]
fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another installer is fine: a provider is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_password() {
        let c = Credentials {
            user: "app".into(),
            password: "s3cret".into(),
        };
        let shown = format!("{c:?}");
        assert!(
            shown.contains("app") && !shown.contains("s3cret"),
            "{shown}"
        );
    }

    #[test]
    fn tls_hosts_must_be_names_or_addresses() {
        let ok = [
            "127.0.0.1:1",
            "[::1]:2281",
            "zk-1.example.com:2281",
            "_zk.local:1",
            "h:1",
        ];
        assert!(check_tls_hosts(&ok.map(String::from)).is_ok());
        for bad in [
            "bad..host:1",
            "-x:1",
            "a b:1",
            "x-.y:1",
            "1.2.3:1",
            "ü.de:1",
        ] {
            assert!(check_tls_hosts(&[bad.to_owned()]).is_err(), "{bad}");
        }
    }

    #[test]
    fn acls_are_open_without_credentials() {
        assert_eq!(&*node_acls(false), &*zk::Acls::anyone_all());
        let acls = node_acls(true);
        assert_eq!(acls.len(), 2);
        assert!(acls
            .iter()
            .any(|a| a.scheme() == "world" && a.permission() == zk::Permission::READ));
    }
}
