//! libpq's TLS parameters (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`), resolved as
//! libpq resolves them (URL, then `PGSSL…` environment variables, then the files in
//! `~/.postgresql/`), and handed to the driver in the mode that gives libpq's behaviour.

use std::path::PathBuf;

use distlock_api::LockError;
use sqlx::postgres::{PgConnectOptions, PgSslMode};

use crate::POSTGRES_BACKEND;

/// libpq's `sslmode` values, as libpq spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    const NAMES: [(&'static str, SslMode); 6] = [
        ("disable", SslMode::Disable),
        ("allow", SslMode::Allow),
        ("prefer", SslMode::Prefer),
        ("require", SslMode::Require),
        ("verify-ca", SslMode::VerifyCa),
        ("verify-full", SslMode::VerifyFull),
    ];

    fn parse(value: &str) -> Result<SslMode, LockError> {
        Self::NAMES
            .iter()
            .find(|(name, _)| *name == value)
            .map(|(_, mode)| *mode)
            .ok_or_else(|| {
                config(format!(
                    "sslmode {value:?} is not one of disable, allow, prefer, require, verify-ca, verify-full"
                ))
            })
    }

    fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(_, mode)| *mode == self)
            .map_or("?", |(name, _)| *name)
    }

    /// Whether the mode connects only over TLS.
    fn needs_tls(self) -> bool {
        matches!(
            self,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull
        )
    }
}

/// One TLS parameter: its libpq name, the spellings the driver also accepts in a URL,
/// its environment variable and its default file in `~/.postgresql/`.
struct Parameter {
    name: &'static str,
    aliases: &'static [&'static str],
    env: &'static str,
    default_file: &'static str,
}

const SSLMODE: Parameter = Parameter {
    name: "sslmode",
    aliases: &["ssl-mode"],
    env: "PGSSLMODE",
    default_file: "",
};
const SSLROOTCERT: Parameter = Parameter {
    name: "sslrootcert",
    aliases: &["ssl-root-cert", "ssl-ca"],
    env: "PGSSLROOTCERT",
    default_file: "root.crt",
};
const SSLCERT: Parameter = Parameter {
    name: "sslcert",
    aliases: &["ssl-cert"],
    env: "PGSSLCERT",
    default_file: "postgresql.crt",
};
const SSLKEY: Parameter = Parameter {
    name: "sslkey",
    aliases: &["ssl-key"],
    env: "PGSSLKEY",
    default_file: "postgresql.key",
};

/// Where the parameters come from besides the URL: the environment and the home
/// directory (injected so the rules can be tested without touching either).
pub(crate) struct Sources<'a> {
    pub env: &'a dyn Fn(&str) -> Option<String>,
    pub home: Option<PathBuf>,
}

impl Sources<'_> {
    /// The process's environment and `$HOME`.
    pub(crate) fn process() -> Sources<'static> {
        Sources {
            env: &|name| std::env::var(name).ok().filter(|v| !v.is_empty()),
            home: std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(PathBuf::from),
        }
    }

    /// The parameter's value given in the URL (the last one wins) or else in the
    /// environment.
    fn explicit(&self, url: &url::Url, parameter: &Parameter) -> Option<String> {
        url.query_pairs()
            .filter(|(key, _)| key == parameter.name || parameter.aliases.contains(&&**key))
            .map(|(_, value)| value.into_owned())
            .last()
            .or_else(|| (self.env)(parameter.env))
    }

    /// `~/.postgresql/FILE` if it exists, as libpq looks for it.
    fn default_file(&self, parameter: &Parameter) -> Option<PathBuf> {
        let path = self
            .home
            .as_ref()?
            .join(".postgresql")
            .join(parameter.default_file);
        path.is_file().then_some(path)
    }

    /// The file of a certificate or key parameter: the one named (which must be a
    /// readable file), else the default file if it exists.
    fn file(&self, url: &url::Url, parameter: &Parameter) -> Result<Option<PathBuf>, LockError> {
        match self.explicit(url, parameter) {
            Some(named) => readable(parameter, PathBuf::from(named)).map(Some),
            None => Ok(self.default_file(parameter)),
        }
    }
}

/// `path` if it is a file this process can open, else a configuration error naming the
/// parameter and the path (a path is not a secret).
fn readable(parameter: &Parameter, path: PathBuf) -> Result<PathBuf, LockError> {
    match std::fs::File::open(&path).and_then(|f| f.metadata()) {
        Ok(meta) if meta.is_file() => Ok(path),
        Ok(_) => Err(config(format!(
            "{} {} is not a file",
            parameter.name,
            path.display()
        ))),
        Err(e) => Err(config(format!(
            "{} {} cannot be read: {e}",
            parameter.name,
            path.display()
        ))),
    }
}

fn config(message: String) -> LockError {
    LockError::config(POSTGRES_BACKEND, message)
}

/// The driver's TLS settings for the URL's TLS parameters, the environment and
/// `~/.postgresql/`, following libpq:
/// - `sslmode` defaults to `prefer`: TLS if the server offers it, else plaintext, with
///   no certificate check;
/// - `require` checks the server's certificate chain as `verify-ca` does when a root
///   certificate is there (`sslrootcert`, or the default `~/.postgresql/root.crt`);
/// - `verify-ca` and `verify-full` need a root certificate;
/// - a client certificate (`sslcert`, or the default `~/.postgresql/postgresql.crt`)
///   is sent with its key (`sslkey`, or `~/.postgresql/postgresql.key`), which must
///   exist then.
///
/// The differences from libpq are listed in the crate docs (section TLS).
///
/// # Errors
/// [`LockError::Config`] for an unknown `sslmode`, `allow`, a named file that cannot
/// be read, a verifying mode without a root certificate, a client certificate without
/// its key, or a mode that needs TLS in a build without the `tls` feature.
pub(crate) fn resolve(url: &url::Url, sources: &Sources<'_>) -> Result<TlsSettings, LockError> {
    #[cfg(feature = "tls")]
    install_crypto_provider();
    let mode = match sources.explicit(url, &SSLMODE) {
        Some(value) => SslMode::parse(&value)?,
        None => SslMode::Prefer,
    };
    let driver_mode = match mode {
        SslMode::Disable => {
            return Ok(TlsSettings {
                mode: PgSslMode::Disable,
                root: None,
                client: None,
            })
        }
        SslMode::Allow => {
            return Err(config(
                "sslmode \"allow\" is not supported (use prefer, or disable)".into(),
            ))
        }
        SslMode::Prefer => PgSslMode::Prefer,
        SslMode::Require => PgSslMode::Require,
        SslMode::VerifyCa => PgSslMode::VerifyCa,
        SslMode::VerifyFull => PgSslMode::VerifyFull,
    };
    let root = sources.file(url, &SSLROOTCERT)?;
    let driver_mode = match (&root, driver_mode) {
        // libpq: with a root certificate, `require` verifies as `verify-ca` does.
        (Some(_), PgSslMode::Require) => PgSslMode::VerifyCa,
        (None, PgSslMode::VerifyCa | PgSslMode::VerifyFull) => {
            return Err(config(format!(
                "sslmode \"{}\" needs a root certificate: set sslrootcert \
                 (the default ~/.postgresql/root.crt does not exist)",
                mode.name()
            )))
        }
        (_, other) => other,
    };
    let client = match sources.file(url, &SSLCERT)? {
        Some(cert) => {
            let key = sources.file(url, &SSLKEY)?.ok_or_else(|| {
                config(format!(
                    "client certificate {} has no private key: set sslkey \
                     (the default ~/.postgresql/postgresql.key does not exist)",
                    cert.display()
                ))
            })?;
            Some((cert, key))
        }
        None => None,
    };
    if mode.needs_tls() && !cfg!(feature = "tls") {
        return Err(config(format!(
            "sslmode \"{}\" needs TLS, which this build lacks: enable the `tls` feature \
             of distlock-postgres (`postgres-tls` of distlock)",
            mode.name()
        )));
    }
    Ok(TlsSettings {
        mode: driver_mode,
        root,
        client,
    })
}

/// The TLS settings [`resolve`] found, in the driver's terms.
#[derive(Debug)]
pub(crate) struct TlsSettings {
    mode: PgSslMode,
    root: Option<PathBuf>,
    /// The client certificate and its key.
    client: Option<(PathBuf, PathBuf)>,
}

impl TlsSettings {
    /// `options` with these settings.
    pub(crate) fn apply(self, options: PgConnectOptions) -> PgConnectOptions {
        let mut options = options.ssl_mode(self.mode);
        if let Some(root) = self.root {
            options = options.ssl_root_cert(root);
        }
        if let Some((cert, key)) = self.client {
            options = options.ssl_client_cert(cert).ssl_client_key(key);
        }
        options
    }
}

/// rustls needs one process-wide crypto provider when more than one is compiled in (a
/// build with `zookeeper-tls` also has aws-lc-rs), and sqlx panics without one: installs
/// ring unless the program installed a provider first.
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
    use std::collections::HashMap;
    use std::path::Path;
    use std::str::FromStr;

    /// The driver options for `url` with environment `env` and home directory `home`.
    fn options_for(
        url: &str,
        env: &[(&str, &str)],
        home: Option<&Path>,
    ) -> Result<PgConnectOptions, LockError> {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let lookup = move |name: &str| env.get(name).cloned();
        let sources = Sources {
            env: &lookup,
            home: home.map(Path::to_path_buf),
        };
        let parsed = url::Url::parse(url).expect("test URL");
        let base = PgConnectOptions::from_str("postgres://h/db").expect("base options");
        super::resolve(&parsed, &sources).map(|settings| settings.apply(base))
    }

    fn mode(options: &PgConnectOptions) -> String {
        format!("{:?}", options.get_ssl_mode())
    }

    fn config_message(result: Result<PgConnectOptions, LockError>) -> String {
        match result {
            Err(LockError::Config { message, .. }) => message,
            other => panic!("expected a configuration error, got {other:?}"),
        }
    }

    /// A home directory with `~/.postgresql/` holding `files`.
    fn home_with(files: &[&str]) -> tempfile::TempDir {
        let home = tempfile::tempdir().expect("temp dir");
        let dir = home.path().join(".postgresql");
        std::fs::create_dir(&dir).expect("mkdir");
        for file in files {
            std::fs::write(dir.join(file), "x").expect("write");
        }
        home
    }

    #[test]
    fn prefer_is_the_default_and_disable_is_plaintext() {
        assert_eq!(
            mode(&options_for("postgres://h/db", &[], None).unwrap()),
            "Prefer"
        );
        assert_eq!(
            mode(&options_for("postgres://h/db?sslmode=disable", &[], None).unwrap()),
            "Disable"
        );
        // The URL wins over the environment, which wins over the default.
        let env = [("PGSSLMODE", "disable")];
        assert_eq!(
            mode(&options_for("postgres://h/db", &env, None).unwrap()),
            "Disable"
        );
        assert_eq!(
            mode(&options_for("postgres://h/db?sslmode=prefer", &env, None).unwrap()),
            "Prefer"
        );
    }

    #[test]
    fn unknown_and_unsupported_modes_are_config_errors() {
        for bad in ["bogus", "REQUIRE", "", "verify_full"] {
            let message = config_message(options_for(
                &format!("postgres://h/db?sslmode={bad}"),
                &[],
                None,
            ));
            assert!(message.contains("is not one of"), "{message}");
        }
        let message = config_message(options_for("postgres://h/db?sslmode=allow", &[], None));
        assert!(message.contains("not supported"), "{message}");
    }

    #[test]
    fn missing_named_files_are_config_errors() {
        for url in [
            "postgres://h/db?sslmode=require&sslrootcert=/no/such/root.crt",
            "postgres://h/db?sslrootcert=/no/such/root.crt",
            "postgres://h/db?sslcert=/no/such/client.crt&sslkey=/no/such/client.key",
        ] {
            let message = config_message(options_for(url, &[], None));
            assert!(message.contains("/no/such/"), "{url}: {message}");
        }
    }

    #[test]
    fn verifying_modes_need_a_root_certificate() {
        for m in ["verify-ca", "verify-full"] {
            let message = config_message(options_for(
                &format!("postgres://h/db?sslmode={m}"),
                &[],
                None,
            ));
            assert!(message.contains("needs a root certificate"), "{message}");
        }
    }

    #[cfg(feature = "tls")]
    #[test]
    fn require_verifies_the_chain_when_a_root_certificate_is_there() {
        let home = home_with(&["root.crt"]);
        let named = home.path().join(".postgresql/root.crt");
        let url = format!(
            "postgres://h/db?sslmode=require&sslrootcert={}",
            named.display()
        );
        assert_eq!(mode(&options_for(&url, &[], None).unwrap()), "VerifyCa");
        // The default file counts as libpq's does.
        let options =
            options_for("postgres://h/db?sslmode=require", &[], Some(home.path())).unwrap();
        assert_eq!(mode(&options), "VerifyCa");
        let bare = home_with(&[]);
        let options =
            options_for("postgres://h/db?sslmode=require", &[], Some(bare.path())).unwrap();
        assert_eq!(mode(&options), "Require");
        let options = options_for(
            "postgres://h/db?sslmode=verify-full",
            &[],
            Some(home.path()),
        )
        .unwrap();
        assert_eq!(mode(&options), "VerifyFull");
    }

    #[test]
    fn a_client_certificate_needs_its_key() {
        let home = home_with(&["postgresql.crt"]);
        let message = config_message(options_for("postgres://h/db", &[], Some(home.path())));
        assert!(message.contains("no private key"), "{message}");
        let home = home_with(&["postgresql.crt", "postgresql.key"]);
        assert!(options_for("postgres://h/db", &[], Some(home.path())).is_ok());
        // A key without a certificate is ignored, as libpq does.
        let home = home_with(&["postgresql.key"]);
        assert!(options_for("postgres://h/db", &[], Some(home.path())).is_ok());
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn modes_needing_tls_name_the_feature_in_a_build_without_it() {
        let message = config_message(options_for("postgres://h/db?sslmode=require", &[], None));
        assert!(message.contains("`tls` feature"), "{message}");
        assert_eq!(
            mode(&options_for("postgres://h/db", &[], None).unwrap()),
            "Prefer"
        );
    }
}
