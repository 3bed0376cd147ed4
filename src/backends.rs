//! The backends [`crate::connect`] knows: one row each. A new backend is one row here
//! and its Cargo feature in `Cargo.toml`; the CLI, the bench and the kits reach it
//! through [`crate::connect`] and [`crate::schemes`].

use std::future::Future;
use std::pin::Pin;

use crate::{Client, LockError};

/// A backend's connect: a URL of one of its schemes to a client.
type Connect =
    for<'a> fn(&'a str) -> Pin<Box<dyn Future<Output = Result<Client, LockError>> + Send + 'a>>;

/// One backend, whether or not it is compiled in.
pub(crate) struct Backend {
    /// Its name in prose.
    pub(crate) title: &'static str,
    /// The Cargo feature of this crate that compiles it in (empty: always compiled).
    pub(crate) feature: &'static str,
    /// Its URL schemes, lowercase.
    pub(crate) schemes: &'static [&'static str],
    /// Its connect; `None` when its feature is off.
    pub(crate) connect: Option<Connect>,
}

/// The [`Connect`] of a backend crate's lock type: its `connect(url)`, then `client()`.
// Unused when every backend feature is off.
#[allow(unused_macros)]
macro_rules! connect_of {
    ($lock:ty) => {
        Some(|url| Box::pin(async move { Ok(<$lock>::connect(url).await?.client()) }))
    };
}

/// Every backend, in the order error messages list their schemes.
pub(crate) const BACKENDS: &[Backend] = &[
    Backend {
        title: "in-memory",
        feature: "",
        schemes: &["memory"],
        connect: Some(|url| Box::pin(async move { crate::memory_client(url) })),
    },
    Backend {
        title: "file",
        feature: "file",
        schemes: &["file"],
        #[cfg(feature = "file")]
        connect: connect_of!(distlock_file::FileLock),
        #[cfg(not(feature = "file"))]
        connect: None,
    },
    Backend {
        title: "Redis",
        feature: "redis",
        schemes: &[
            "redis",
            "rediss",
            "redis+redlock",
            "redis+sentinel",
            "rediss+sentinel",
            "redis+cluster",
            "rediss+cluster",
        ],
        #[cfg(feature = "redis")]
        connect: connect_of!(distlock_redis::RedisLock),
        #[cfg(not(feature = "redis"))]
        connect: None,
    },
    Backend {
        title: "Postgres",
        feature: "postgres",
        schemes: &["postgres", "postgresql"],
        // `pool_mode=` picks the session or the transaction-pooling design.
        #[cfg(feature = "postgres")]
        connect: Some(|url| Box::pin(distlock_postgres::connect(url))),
        #[cfg(not(feature = "postgres"))]
        connect: None,
    },
    Backend {
        title: "MySQL/MariaDB",
        feature: "mysql",
        schemes: &["mysql", "mariadb"],
        #[cfg(feature = "mysql")]
        connect: connect_of!(distlock_mysql::MySqlLock),
        #[cfg(not(feature = "mysql"))]
        connect: None,
    },
    Backend {
        title: "ZooKeeper",
        feature: "zookeeper",
        schemes: &["zookeeper", "zk", "zookeeper+tls", "zk+tls"],
        #[cfg(feature = "zookeeper")]
        connect: connect_of!(distlock_zookeeper::ZooKeeperLock),
        #[cfg(not(feature = "zookeeper"))]
        connect: None,
    },
    Backend {
        title: "etcd",
        feature: "etcd",
        schemes: &["etcd", "etcd+tls"],
        #[cfg(feature = "etcd")]
        connect: connect_of!(distlock_etcd::EtcdLock),
        #[cfg(not(feature = "etcd"))]
        connect: None,
    },
];

/// The backend of `scheme` (matched case-insensitively).
pub(crate) fn for_scheme(scheme: &str) -> Option<&'static Backend> {
    BACKENDS
        .iter()
        .find(|b| b.schemes.iter().any(|s| s.eq_ignore_ascii_case(scheme)))
}
