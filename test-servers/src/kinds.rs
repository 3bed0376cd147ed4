//! [`ServerKind`]: the one table of which throwaway servers a backend URL's scheme
//! needs, for tools that start servers on demand (`distlock bench --spawn`,
//! `distlock conformance --faults --spawn`) and for proxies that must fill in a
//! default port. A new backend adds its row here, beside the server type that starts
//! it.

use std::future::Future;
use std::pin::Pin;

use crate::{
    EtcdCluster, EtcdServer, MariaDbServer, PostgresServer, PostgresServerOptions, RedisServer,
    ServerControl, ServerError, ZooKeeperEnsemble, ZooKeeperServer,
};

/// Servers of one kind, started together and stopped when dropped.
pub enum Started {
    /// One server, or independent nodes that clients reach as a quorum (Redlock).
    Nodes(Vec<Box<dyn ServerControl>>),
    /// A ZooKeeper ensemble.
    ZooKeeperEnsemble(ZooKeeperEnsemble),
    /// An etcd cluster.
    EtcdCluster(EtcdCluster),
}

impl Started {
    /// The servers' ports, in node order.
    pub fn ports(&self) -> Vec<u16> {
        match self {
            Started::Nodes(nodes) => nodes.iter().map(|n| n.port()).collect(),
            Started::ZooKeeperEnsemble(ensemble) => {
                ensemble.nodes().iter().map(|n| n.port()).collect()
            }
            Started::EtcdCluster(cluster) => cluster.nodes().iter().map(|n| n.port()).collect(),
        }
    }
}

type Start = fn(usize) -> Pin<Box<dyn Future<Output = Result<Started, ServerError>> + Send>>;

/// A kind of server a backend needs: its schemes, default port, client URL and how
/// to start it.
#[non_exhaustive]
pub struct ServerKind {
    /// A short name (`redis`), as `--spawn` takes it.
    pub name: &'static str,
    /// The URL schemes its servers serve, lowercase.
    pub schemes: &'static [&'static str],
    /// The service's TLS schemes, which share the default port; nothing here starts
    /// TLS servers.
    pub tls_schemes: &'static [&'static str],
    /// The port its servers listen on when a URL names none.
    pub default_port: u16,
    /// The URL of a client of one node, `{hosts}` standing for `127.0.0.1:PORT`.
    pub url_template: &'static str,
    /// The URL of a client of several nodes, where the kind starts several.
    pub nodes_url_template: Option<&'static str>,
    start: Start,
}

impl ServerKind {
    /// Starts `nodes` servers (at least one; a kind without multi-node support starts
    /// one whatever `nodes` says).
    ///
    /// # Errors
    /// Whatever starting a server raised.
    pub async fn start(&self, nodes: usize) -> Result<Started, ServerError> {
        (self.start)(nodes.max(1)).await
    }

    /// The client URL template for `nodes` servers.
    pub fn template(&self, nodes: usize) -> &'static str {
        match self.nodes_url_template {
            Some(template) if nodes > 1 => template,
            _ => self.url_template,
        }
    }

    /// The template filled in for servers at `ports`.
    pub fn url_for(&self, ports: &[u16]) -> String {
        self.template(ports.len())
            .replace("{hosts}", &loopback_hosts(ports))
    }
}

/// `127.0.0.1:P1,127.0.0.1:P2,…` for `ports`: what a URL template's `{hosts}` stands for.
pub fn loopback_hosts(ports: &[u16]) -> String {
    ports
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Every kind of server, by backend.
pub const SERVER_KINDS: &[ServerKind] = &[
    ServerKind {
        name: "redis",
        tls_schemes: &["rediss"],
        schemes: &["redis", "redis+redlock"],
        default_port: 6379,
        url_template: "redis://{hosts}",
        nodes_url_template: Some("redis+redlock://{hosts}"),
        start: |nodes| {
            Box::pin(async move {
                let mut all: Vec<Box<dyn ServerControl>> = Vec::new();
                for _ in 0..nodes {
                    all.push(Box::new(RedisServer::start().await?));
                }
                Ok(Started::Nodes(all))
            })
        },
    },
    ServerKind {
        name: "postgres",
        tls_schemes: &[],
        schemes: &["postgres", "postgresql"],
        default_port: 5432,
        url_template: "postgres://postgres@{hosts}/postgres",
        nodes_url_template: None,
        start: |_| {
            Box::pin(async move {
                // Room for many contending clients with a few sessions each, and for
                // comparators that use a connection per worker.
                let options =
                    PostgresServerOptions::default().with_setting("max_connections", "400");
                let server = PostgresServer::start_with(options).await?;
                Ok(Started::Nodes(vec![Box::new(server)]))
            })
        },
    },
    ServerKind {
        name: "mariadb",
        tls_schemes: &[],
        schemes: &["mysql", "mariadb"],
        default_port: 3306,
        url_template: "mysql://distlock:distlock-test@{hosts}/distlock",
        nodes_url_template: None,
        start: |_| {
            Box::pin(async move {
                let server = MariaDbServer::start().await?;
                Ok(Started::Nodes(vec![Box::new(server)]))
            })
        },
    },
    ServerKind {
        name: "zookeeper",
        tls_schemes: &[],
        schemes: &["zookeeper", "zk"],
        default_port: 2181,
        url_template: "zookeeper://{hosts}",
        nodes_url_template: Some("zookeeper://{hosts}"),
        start: |nodes| {
            Box::pin(async move {
                Ok(match nodes {
                    1 => Started::Nodes(vec![Box::new(ZooKeeperServer::start().await?)]),
                    n => Started::ZooKeeperEnsemble(ZooKeeperEnsemble::start(n).await?),
                })
            })
        },
    },
    ServerKind {
        name: "etcd",
        tls_schemes: &["etcd+tls"],
        schemes: &["etcd"],
        default_port: 2379,
        url_template: "etcd://{hosts}",
        nodes_url_template: Some("etcd://{hosts}"),
        start: |nodes| {
            Box::pin(async move {
                Ok(match nodes {
                    1 => Started::Nodes(vec![Box::new(EtcdServer::start().await?)]),
                    n => Started::EtcdCluster(EtcdCluster::start(n).await?),
                })
            })
        },
    },
];

/// The kind whose servers serve `scheme` (case-insensitive).
pub fn kind_for_scheme(scheme: &str) -> Option<&'static ServerKind> {
    SERVER_KINDS
        .iter()
        .find(|k| k.schemes.iter().any(|s| s.eq_ignore_ascii_case(scheme)))
}

/// The port servers of `scheme` listen on when a URL names none, for the schemes of
/// [`SERVER_KINDS`] and their TLS forms.
pub fn default_port(scheme: &str) -> Option<u16> {
    SERVER_KINDS
        .iter()
        .find(|k| {
            k.schemes
                .iter()
                .chain(k.tls_schemes)
                .any(|s| s.eq_ignore_ascii_case(scheme))
        })
        .map(|k| k.default_port)
}

/// The kind called `name`.
pub fn kind_named(name: &str) -> Option<&'static ServerKind> {
    SERVER_KINDS
        .iter()
        .find(|k| k.name.eq_ignore_ascii_case(name))
}
