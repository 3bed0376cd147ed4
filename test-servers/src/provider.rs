//! [`Provider`]: where throwaway servers come from. Local binaries by default; Docker
//! containers (through testcontainers) with the `testcontainers` feature and
//! `DISTLOCK_TEST_SERVERS=docker`, for machines that have Docker but not the servers.

use crate::{
    PostgresServer, PostgresServerOptions, RedisServer, ServerControl, ServerError, ZooKeeperServer,
};

/// The environment variable that chooses the provider: unset, empty or `local` for
/// local binaries, `docker` for containers.
pub const PROVIDER_VAR: &str = "DISTLOCK_TEST_SERVERS";

/// Where [`Provider::redis`], [`Provider::postgres`] and [`Provider::zookeeper`]
/// get their servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Provider {
    /// Processes of the locally installed binaries (`redis-server`, PostgreSQL,
    /// ZooKeeper on the JVM): every [`ServerControl`] action works. Installs
    /// nothing itself.
    Local,
    /// Docker containers of the official images, through testcontainers (feature
    /// `testcontainers`). Kill, restart (same host port) and logs work; pause does
    /// not (see [`ServerControl::pause_unsupported`]), and ensembles are not offered.
    Docker,
}

impl Provider {
    /// The provider [`PROVIDER_VAR`] names.
    ///
    /// # Errors
    /// [`ServerError::InvalidArgument`] for any other value.
    pub fn from_env() -> Result<Provider, ServerError> {
        let value = std::env::var(PROVIDER_VAR).unwrap_or_default();
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "local" => Ok(Provider::Local),
            "docker" => Ok(Provider::Docker),
            other => Err(ServerError::InvalidArgument(format!(
                "{PROVIDER_VAR}={other}: expected `local` or `docker`"
            ))),
        }
    }

    /// A Redis server without persistence.
    ///
    /// # Errors
    /// Whatever starting it raised; with [`Provider::Docker`], also
    /// [`ServerError::NotInstalled`] when the feature is off or no Docker engine
    /// answers.
    pub async fn redis(self) -> Result<Box<dyn ServerControl>, ServerError> {
        match self {
            Provider::Local => Ok(Box::new(RedisServer::start().await?)),
            Provider::Docker => docker::redis().await,
        }
    }

    /// A PostgreSQL server with `options` (user `postgres`, trust authentication).
    ///
    /// # Errors
    /// As [`Provider::redis`].
    pub async fn postgres(
        self,
        options: PostgresServerOptions,
    ) -> Result<Box<dyn ServerControl>, ServerError> {
        match self {
            Provider::Local => Ok(Box::new(PostgresServer::start_with(options).await?)),
            Provider::Docker => docker::postgres(options).await,
        }
    }

    /// A standalone ZooKeeper server.
    ///
    /// # Errors
    /// As [`Provider::redis`].
    pub async fn zookeeper(self) -> Result<Box<dyn ServerControl>, ServerError> {
        match self {
            Provider::Local => Ok(Box::new(ZooKeeperServer::start().await?)),
            Provider::Docker => docker::zookeeper().await,
        }
    }
}

#[cfg(feature = "testcontainers")]
use crate::container as docker;

#[cfg(not(feature = "testcontainers"))]
mod docker {
    //! Without the feature, the Docker provider says how to get it.

    use crate::{PostgresServerOptions, ServerControl, ServerError};

    fn missing() -> ServerError {
        ServerError::NotInstalled {
            what: "the Docker provider".into(),
            hint: "build distlock-test-servers with the `testcontainers` feature".into(),
        }
    }

    pub(crate) async fn redis() -> Result<Box<dyn ServerControl>, ServerError> {
        Err(missing())
    }

    pub(crate) async fn postgres(
        _options: PostgresServerOptions,
    ) -> Result<Box<dyn ServerControl>, ServerError> {
        Err(missing())
    }

    pub(crate) async fn zookeeper() -> Result<Box<dyn ServerControl>, ServerError> {
        Err(missing())
    }
}
