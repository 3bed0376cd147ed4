#![doc = include_str!("../README.md")]
// docs.rs (`--cfg docsrs`, nightly) shows which feature each gated item needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]

mod backends;
pub mod guide;

pub use distlock_api::memory;
pub use distlock_api::*;

/// The file backend: OS file locks on one host (feature `file`, on by default).
#[cfg(feature = "file")]
#[cfg_attr(docsrs, doc(cfg(feature = "file")))]
pub use distlock_file as file;

/// The Postgres advisory-lock backend (feature `postgres`).
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use distlock_postgres as postgres;

/// The MySQL/MariaDB backend, `GET_LOCK` user locks (feature `mysql`).
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use distlock_mysql as mysql;

/// The Redis backend (feature `redis`).
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use distlock_redis as redis;

/// The etcd backend (feature `etcd`).
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub use distlock_etcd as etcd;

/// The ZooKeeper backend (feature `zookeeper`).
#[cfg(feature = "zookeeper")]
#[cfg_attr(docsrs, doc(cfg(feature = "zookeeper")))]
pub use distlock_zookeeper as zookeeper;

/// Connects to the lock backend named by `url`, choosing it by the URL's scheme.
///
/// Schemes are matched case-insensitively:
/// - `memory://` is a client of the process-wide default in-memory store
///   ([`memory::MemoryStore::named`]`("")`), and `memory://NAME` of the store called
///   `NAME` (taken verbatim). Every client connected by the same URL shares locks, like
///   processes sharing a server; different names are independent. Memory URLs take no
///   options, so `NAME` must not contain `?` or `#`.
/// - `file://` uses OS file locks in `distlock_file::default_dir()`, and
///   `file:///DIR` in `DIR` (feature `file`, on by default).
/// - `redis://` and `redis+redlock://` connect to Redis (feature `redis`), and
///   `rediss://` over TLS (feature `redis-tls`).
/// - `redis+sentinel://` (a master found through Sentinels) and `redis+cluster://`
///   (a Redis Cluster) are in feature `redis` too; their `rediss+…` TLS forms need
///   `redis-tls`.
/// - `zookeeper://` and `zk://` connect to ZooKeeper (feature `zookeeper`), and
///   `zookeeper+tls://` and `zk+tls://` over TLS (feature `zookeeper-tls`).
/// - `postgres://` and `postgresql://` connect to PostgreSQL (feature `postgres`),
///   over TLS as libpq's `sslmode` says (feature `postgres-tls`); behind a
///   transaction pooler (PgBouncer's `pool_mode = transaction`) add
///   `?pool_mode=transaction` (`distlock_postgres::PoolMode`).
/// - `etcd://` connects to etcd (feature `etcd`), and `etcd+tls://` over TLS
///   (feature `etcd-tls`).
///
/// Every backend crate parses its URLs with `parse_url` (for example
/// `distlock_redis::parse_url`), whose docs give the forms and options.
///
/// Each call returns a new, independent [`Client`]: one connection (or pool, or
/// session) that its mutex, semaphore, read-write lock and election share, each
/// measured as [`observe`] says. Error messages never repeat the URL beyond its
/// scheme, because server URLs may carry passwords.
///
/// # Errors
/// [`LockError::Config`] when `url` is empty, contains whitespace or control
/// characters, lacks a `scheme://` prefix, has an unknown scheme, names a backend not
/// available in this build, or is a memory URL with options; the backend's own
/// connection and configuration errors otherwise.
pub async fn connect(url: &str) -> Result<Client, LockError> {
    let (scheme, _) = split_scheme(url)?;
    let backend = backends::for_scheme(scheme).ok_or_else(|| {
        config(format!(
            "unknown URL scheme `{}://`; known schemes: {}",
            shorten(scheme),
            known_schemes()
        ))
    })?;
    match backend.connect {
        Some(connect) => connect(url).await,
        None => Err(config(format!(
            "{scheme}:// needs the {title} backend: rebuild with the `{feature}` feature of distlock",
            scheme = scheme.to_ascii_lowercase(),
            title = backend.title,
            feature = backend.feature,
        ))),
    }
}

/// Every URL scheme [`connect`] recognises, lowercase, whether or not its backend is
/// compiled in (see [`scheme_available`]).
pub fn schemes() -> impl Iterator<Item = &'static str> {
    backends::BACKENDS
        .iter()
        .flat_map(|b| b.schemes.iter().copied())
}

/// Whether [`connect`] can connect `scheme` in this build: known, and its backend's
/// Cargo feature on. Matched case-insensitively.
pub fn scheme_available(scheme: &str) -> bool {
    backends::for_scheme(scheme).is_some_and(|b| b.connect.is_some())
}

/// A client of the memory store named by a `memory://` URL (what follows `://`).
fn memory_client(url: &str) -> Result<Client, LockError> {
    let name = url.split_once("://").map_or("", |(_, name)| name);
    if name.contains(['?', '#']) {
        return Err(LockError::config(
            memory::MEMORY_BACKEND,
            "memory:// URLs take no options: use memory:// or memory://NAME, where NAME has no `?` or `#`",
        ));
    }
    Ok(MemoryLock::with_store(memory::MemoryStore::named(name)).client())
}

/// Splits `url` into its scheme and what follows `://`, checking the scheme's syntax.
fn split_scheme(url: &str) -> Result<(&str, &str), LockError> {
    if url.is_empty() {
        return Err(config(format!(
            "the backend URL is empty; known schemes: {}",
            known_schemes()
        )));
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(config(
            "the backend URL contains whitespace or control characters",
        ));
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(config(format!(
            "the backend URL has no `scheme://` prefix (for example memory:// or redis://host:6379); known schemes: {}",
            known_schemes()
        )));
    };
    // RFC 3986: ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )
    let mut chars = scheme.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !valid {
        return Err(config(format!(
            "the backend URL has no valid scheme before `://`; known schemes: {}",
            known_schemes()
        )));
    }
    Ok((scheme, rest))
}

/// A configuration error raised before any backend is involved.
fn config(message: impl Into<String>) -> LockError {
    LockError::config(API_BACKEND_NAME, message)
}

/// `memory://, redis://, …` for error messages.
fn known_schemes() -> String {
    schemes()
        .map(|scheme| format!("{scheme}://"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// At most 32 characters of a (valid, hence ASCII) scheme, for error messages.
fn shorten(scheme: &str) -> String {
    const MAX: usize = 32;
    match scheme.get(..MAX) {
        Some(head) if scheme.len() > MAX => format!("{head}…"),
        _ => scheme.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn key() -> LockKey {
        LockKey::new("facade-tests/account-42").unwrap()
    }

    fn no_wait() -> LockOptions {
        LockOptions::new(Duration::from_secs(30)).with_wait(WaitPolicy::NoWait)
    }

    /// The config message of a refused URL; panics unless it is a config error.
    async fn refused(url: &str) -> String {
        match connect(url).await {
            Err(LockError::Config { message, .. }) => message,
            Err(other) => panic!("{url:?}: expected a config error, got {other}"),
            Ok(lock) => panic!("{url:?}: expected a config error, connected to {lock:?}"),
        }
    }

    #[tokio::test]
    async fn empty_url_is_a_config_error() {
        let message = refused("").await;
        assert!(message.contains("empty"), "{message}");
        assert!(message.contains("memory://"), "{message}");
    }

    #[tokio::test]
    async fn whitespace_and_control_characters_are_config_errors() {
        for url in [
            " memory://",
            "memory:// ",
            "memory://a b",
            "\tmemory://",
            "memory://a\nb",
            "memory://\0",
            "   ",
        ] {
            let message = refused(url).await;
            assert!(message.contains("whitespace"), "{url:?}: {message}");
        }
    }

    #[tokio::test]
    async fn missing_separator_is_a_config_error() {
        for url in [
            "memory",
            "memory:",
            "memory:/x",
            "localhost:6379",
            "redis:host",
        ] {
            let message = refused(url).await;
            assert!(message.contains("scheme://"), "{url:?}: {message}");
            assert!(message.contains("redis+redlock://"), "{url:?}: {message}");
        }
    }

    #[tokio::test]
    async fn malformed_schemes_are_config_errors() {
        for url in [
            "://",
            "://host",
            "1redis://h",
            "re%dis://h",
            "ré://h",
            "a_b://h",
        ] {
            let message = refused(url).await;
            assert!(
                message.contains("scheme") && message.contains("memory://"),
                "{url:?}: {message}"
            );
        }
    }

    #[tokio::test]
    async fn unknown_schemes_name_the_known_ones() {
        let message = refused("mongodb://user:secret@db/x").await;
        assert!(message.contains("`mongodb://`"), "{message}");
        for scheme in [
            "memory://",
            "file://",
            "redis://",
            "rediss://",
            "redis+redlock://",
            "postgres://",
            "postgresql://",
            "mysql://",
            "mariadb://",
            "zookeeper://",
            "zk://",
            "zookeeper+tls://",
            "zk+tls://",
            "etcd://",
        ] {
            assert!(message.contains(scheme), "{scheme} missing from {message}");
        }
        assert!(!message.contains("secret"), "the URL leaked: {message}");
        let long = format!("{}://x", "a".repeat(10_000));
        assert!(refused(&long).await.len() < 400);
    }

    #[tokio::test]
    async fn backends_not_built_name_their_feature() {
        let mut cases = Vec::new();
        if cfg!(not(feature = "postgres")) {
            cases.extend([
                ("postgres://user:secret@h/db", "postgres", "Postgres"),
                ("postgresql://h", "postgres", "Postgres"),
            ]);
        }
        if cfg!(not(feature = "mysql")) {
            cases.extend([
                ("mysql://user:secret@h/db", "mysql", "MySQL/MariaDB"),
                ("mariadb://h/db", "mysql", "MySQL/MariaDB"),
            ]);
        }
        if cfg!(not(feature = "zookeeper")) {
            cases.extend([
                ("zookeeper://h:2181", "zookeeper", "ZooKeeper"),
                ("zk://h", "zookeeper", "ZooKeeper"),
            ]);
        }
        if cfg!(not(feature = "etcd")) {
            cases.extend([
                ("etcd://user:secret@h:2379", "etcd", "etcd"),
                ("etcd+tls://h?ca=/x", "etcd", "etcd"),
            ]);
        }
        if cfg!(not(feature = "file")) {
            cases.push(("file:///tmp/locks", "file", "file"));
        }
        if cfg!(not(feature = "redis")) {
            cases.extend([
                ("redis://127.0.0.1:6379", "redis", "Redis"),
                ("REDIS://h", "redis", "Redis"),
                ("redis+redlock://a,b,c", "redis", "Redis"),
            ]);
        }
        for (url, feature, title) in cases {
            let message = refused(url).await;
            assert!(
                message.contains(&format!("`{feature}` feature")),
                "{url}: {message}"
            );
            assert!(
                message.contains(&format!("the {title} backend")),
                "{url}: {message}"
            );
            assert!(!message.contains("secret"), "the URL leaked: {message}");
        }
    }

    #[cfg(feature = "file")]
    #[tokio::test]
    async fn file_urls_reach_the_file_backend() {
        let dir = std::env::temp_dir().join(format!("distlock-facade-{}", std::process::id()));
        let url = format!("file://{}", dir.display());
        let (a, b) = (
            connect(&url).await.unwrap().lock(),
            connect(&url).await.unwrap().lock(),
        );
        assert_eq!(a.info().name, "file");
        let guard = a.acquire(&key(), &no_wait()).await.unwrap();
        assert!(b.try_acquire(&key(), &no_wait()).await.unwrap().is_none());
        guard.release().await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(
            connect("file://relative/dir").await,
            Err(LockError::Config { .. })
        ));
    }

    #[cfg(feature = "zookeeper")]
    #[tokio::test]
    async fn zookeeper_tls_urls_reach_the_zookeeper_backend() {
        let err = connect("zk+tls://127.0.0.1:1?ca=/nonexistent/ca.pem")
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::Config { .. }), "{err}");
        assert_eq!(err.backend(), zookeeper::ZOOKEEPER_BACKEND);
        if cfg!(feature = "zookeeper-tls") {
            assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
        } else {
            assert!(err.to_string().contains("`tls` feature"), "{err}");
        }
    }

    #[cfg(feature = "redis")]
    #[tokio::test]
    async fn bad_redis_urls_are_config_errors_from_the_redis_backend() {
        if cfg!(not(feature = "redis-tls")) {
            let err = connect("rediss://h").await.unwrap_err();
            assert!(err.to_string().contains("`tls` feature"), "{err}");
        }
        for url in [
            "redis+redlock://a:1,b:2",
            "redis+redlock://a:1,a:1,b:2",
            "redis+redlock://",
        ] {
            let err = connect(url).await.unwrap_err();
            assert!(matches!(err, LockError::Config { .. }), "{url}: {err}");
            assert_eq!(err.backend(), redis::REDIS_BACKEND, "{url}");
        }
    }

    #[tokio::test]
    async fn memory_urls_with_options_are_config_errors() {
        for url in ["memory://a?x=1", "memory://#frag", "memory://?"] {
            let err = connect(url).await.unwrap_err();
            assert!(matches!(err, LockError::Config { .. }), "{url}: {err}");
            assert_eq!(err.backend(), memory::MEMORY_BACKEND);
        }
    }

    #[tokio::test]
    async fn same_memory_url_shares_locks() {
        let a = connect("memory://facade-shared").await.unwrap().lock();
        let b = connect("memory://facade-shared").await.unwrap().lock();
        assert_eq!(a.info().name, "memory");
        let guard = a.acquire(&key(), &no_wait()).await.unwrap();
        assert!(b.try_acquire(&key(), &no_wait()).await.unwrap().is_none());
        assert!(matches!(
            b.acquire(&key(), &no_wait()).await,
            Err(LockError::Timeout { .. })
        ));
        assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
        let again = b.try_acquire(&key(), &no_wait()).await.unwrap();
        assert!(again.is_some(), "free after release");
    }

    #[tokio::test]
    async fn scheme_is_case_insensitive_and_name_is_verbatim() {
        let a = connect("memory://facade-case").await.unwrap().lock();
        let b = connect("MEMORY://facade-case").await.unwrap().lock();
        let c = connect("memory://FACADE-CASE").await.unwrap().lock();
        let _held = a.acquire(&key(), &no_wait()).await.unwrap();
        assert!(b.try_acquire(&key(), &no_wait()).await.unwrap().is_none());
        assert!(c.try_acquire(&key(), &no_wait()).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn different_memory_names_are_independent() {
        let a = connect("memory://facade-one").await.unwrap().lock();
        let b = connect("memory://facade-two").await.unwrap().lock();
        let _one = a.acquire(&key(), &no_wait()).await.unwrap();
        let two = b.try_acquire(&key(), &no_wait()).await.unwrap();
        assert!(two.is_some(), "another name is another store");
    }

    #[tokio::test]
    async fn bare_memory_url_is_the_default_named_store() {
        let url = connect("memory://").await.unwrap().lock();
        let direct = MemoryLock::with_store(memory::MemoryStore::named("")).lock();
        let key = LockKey::new("facade-tests/default-store").unwrap();
        let _held = url.acquire(&key, &no_wait()).await.unwrap();
        assert!(direct
            .try_acquire(&key, &no_wait())
            .await
            .unwrap()
            .is_none());
        let other = connect("memory://facade-not-default").await.unwrap().lock();
        assert!(other.try_acquire(&key, &no_wait()).await.unwrap().is_some());
    }
}
