//! A throwaway certificate authority made with the `openssl` tool, for servers that
//! speak TLS in tests.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;

use super::{find_on_path, temp_dir, ServerError};

const STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// What a certificate issued by a [`TestCa`] is for.
#[derive(Debug, Clone, Copy)]
pub enum CertUse<'a> {
    /// A server certificate for these subject alternative names, in openssl's
    /// spelling (`IP:127.0.0.1`, `DNS:localhost`).
    Server(&'a [&'a str]),
    /// A client certificate.
    Client,
}

/// A certificate and its private key (PEM files, the key unencrypted).
#[derive(Debug, Clone)]
pub struct IssuedCert {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key (mode 0600).
    pub key: PathBuf,
}

/// A certificate authority (P-256 key, valid for two days) in a temporary directory,
/// deleted on drop with every certificate it issued.
#[derive(Debug)]
pub struct TestCa {
    dir: TempDir,
    name: String,
}

impl TestCa {
    /// Makes a self-signed CA certificate with common name `distlock test CA NAME`.
    ///
    /// # Errors
    /// [`ServerError::NotInstalled`] without `openssl` on `PATH`; [`ServerError::Setup`]
    /// (with openssl's output) when it fails; [`ServerError::Io`] for the directory.
    pub async fn create(name: &str) -> Result<TestCa, ServerError> {
        let ca = TestCa {
            dir: temp_dir(&format!("ca-{name}"))?,
            name: name.to_owned(),
        };
        let subject = format!("/CN=distlock test CA {name}");
        openssl(
            ca.dir.path(),
            "make the CA certificate",
            &[
                "req",
                "-x509",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "2",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-subj",
                &subject,
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        )
        .await?;
        Ok(ca)
    }

    /// The CA certificate (PEM).
    pub fn cert(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// The directory holding the CA's files and every certificate it issued.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Issues `FILE.crt` and `FILE.key` (a new P-256 key) for common name `cn`, signed
    /// by this CA, valid for two days.
    ///
    /// # Errors
    /// As [`TestCa::create`].
    pub async fn issue(
        &self,
        file: &str,
        cn: &str,
        usage: CertUse<'_>,
    ) -> Result<IssuedCert, ServerError> {
        let (cert, key, csr, ext) = (
            format!("{file}.crt"),
            format!("{file}.key"),
            format!("{file}.csr"),
            format!("{file}.ext"),
        );
        let extensions = match usage {
            CertUse::Server(names) => format!(
                "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n\
                 extendedKeyUsage=serverAuth\nsubjectAltName={}\n",
                names.join(",")
            ),
            CertUse::Client => "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
                 extendedKeyUsage=clientAuth\n"
                .to_owned(),
        };
        let ext_path = self.dir.path().join(&ext);
        std::fs::write(&ext_path, extensions)
            .map_err(|e| ServerError::io(format!("writing {}", ext_path.display()), e))?;
        let subject = format!("/CN={cn}");
        openssl(
            self.dir.path(),
            &format!("make the key and request for {file} ({})", self.name),
            &[
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &csr,
                "-subj",
                &subject,
            ],
        )
        .await?;
        openssl(
            self.dir.path(),
            &format!("sign the certificate {file} ({})", self.name),
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-set_serial",
                &serial(),
                "-days",
                "2",
                "-extfile",
                &ext,
                "-out",
                &cert,
            ],
        )
        .await?;
        let key = self.dir.path().join(key);
        set_mode(&key, 0o600)?;
        Ok(IssuedCert {
            cert: self.dir.path().join(cert),
            key,
        })
    }
}

/// The names a [`TlsFiles`] server certificate is valid for.
const SERVER_NAMES: [&str; 2] = ["IP:127.0.0.1", "DNS:localhost"];

/// What a TLS test server and its tests need: a fresh CA, a server certificate for
/// `127.0.0.1` and `localhost` only (so `127.0.0.2` reaches the same server under a
/// name the certificate does not cover) and a client certificate, both signed by the
/// CA, and a second, unrelated CA for "wrong CA" tests. Deleted on drop.
#[derive(Debug)]
pub struct TlsFiles {
    ca: TestCa,
    server: IssuedCert,
    client: IssuedCert,
    other_ca: TestCa,
}

impl TlsFiles {
    /// Makes both CAs and the certificates; the CA is named after `server` and the
    /// client certificate has common name `client_cn`.
    ///
    /// # Errors
    /// As [`TestCa::create`].
    pub async fn create(server: &str, client_cn: &str) -> Result<TlsFiles, ServerError> {
        let ca = TestCa::create(server).await?;
        let server = ca
            .issue("server", "localhost", CertUse::Server(&SERVER_NAMES))
            .await?;
        let client = ca.issue("client", client_cn, CertUse::Client).await?;
        let other_ca = TestCa::create("other").await?;
        Ok(TlsFiles {
            ca,
            server,
            client,
            other_ca,
        })
    }

    /// The CA that signed the server's and the client's certificates.
    pub fn ca(&self) -> &TestCa {
        &self.ca
    }

    /// The CA certificate (PEM): what clients trust.
    pub fn ca_cert(&self) -> PathBuf {
        self.ca.cert()
    }

    /// The server's certificate and key.
    pub fn server_cert(&self) -> &IssuedCert {
        &self.server
    }

    /// A client certificate and key signed by the CA.
    pub fn client_cert(&self) -> &IssuedCert {
        &self.client
    }

    /// The unrelated CA, to issue certificates the server does not trust.
    pub fn other_ca(&self) -> &TestCa {
        &self.other_ca
    }

    /// The unrelated CA's certificate, which signed neither.
    pub fn other_ca_cert(&self) -> PathBuf {
        self.other_ca.cert()
    }
}

/// A serial number unique enough for throwaway certificates.
fn serial() -> String {
    format!("{}", rand::random::<u64>() >> 1)
}

/// Sets the permission bits of `path`.
pub(crate) fn set_mode(path: &Path, mode: u32) -> Result<(), ServerError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| ServerError::io(format!("chmod {mode:o} {}", path.display()), e))
}

/// Runs `openssl ARGS` in `dir`; `step` names it in errors.
async fn openssl(dir: &Path, step: &str, args: &[&str]) -> Result<(), ServerError> {
    let program = find_on_path("openssl").ok_or_else(|| ServerError::NotInstalled {
        what: "openssl".into(),
        hint: "install the Debian package `openssl` (scripts/test.sh does)".into(),
    })?;
    let run = tokio::process::Command::new(program)
        .args(args)
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(STEP_TIMEOUT, run)
        .await
        .map_err(|_| ServerError::Setup {
            server: "openssl",
            step: step.to_owned(),
            detail: format!("did not finish within {STEP_TIMEOUT:?}"),
        })?
        .map_err(|e| ServerError::io("running openssl", e))?;
    if output.status.success() {
        return Ok(());
    }
    Err(ServerError::Setup {
        server: "openssl",
        step: step.to_owned(),
        detail: format!(
            "{}\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    })
}
