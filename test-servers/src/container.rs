//! The Docker provider: servers as containers of the official images, through
//! testcontainers. Every container call runs on one runtime of this module's own, so
//! the engine client never depends on the runtime of the test that asked, and the
//! synchronous [`ServerControl`] actions can wait for it.

use std::future::Future;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use testcontainers::core::IntoContainerPort;
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

use crate::{free_port, PostgresServerOptions, ServerControl, ServerError, PROBE_INTERVAL};

/// How long a container may take to serve after it starts (an image pull included).
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Why this provider does not pause: freezing a container's cgroup is not the
/// SIGSTOP of one server process that the pause scenarios are written and timed for.
const NO_PAUSE: &str = "the Docker provider does not pause servers (a frozen container is \
     not the stopped process the pause scenarios are written for)";

/// The runtime every engine call runs on (never dropped).
fn engine_runtime() -> Result<&'static tokio::runtime::Runtime, ServerError> {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    if let Some(runtime) = RUNTIME.get() {
        return Ok(runtime);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("distlock-docker")
        .enable_all()
        .build()
        .map_err(|e| ServerError::io("starting the Docker provider's runtime", e))?;
    Ok(RUNTIME.get_or_init(|| runtime))
}

/// Runs `work` on the engine runtime and waits for it without blocking the caller's
/// runtime.
async fn on_engine<T, F>(work: F) -> Result<T, ServerError>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    engine_runtime()?
        .spawn(work)
        .await
        .map_err(|e| ServerError::InvalidArgument(format!("a Docker call panicked: {e}")))
}

/// Runs `work` on the engine runtime and blocks this thread until it is done, for
/// the synchronous actions (which may block for a few seconds, as documented).
fn on_engine_blocking<T, F>(work: F) -> Result<T, ServerError>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel();
    engine_runtime()?.spawn(async move {
        let _ = tx.send(work.await);
    });
    rx.recv()
        .map_err(|_| ServerError::InvalidArgument("a Docker call panicked".into()))
}

/// Whether a Docker engine answers `GET /_ping` on its socket (`DOCKER_HOST` as
/// `unix://PATH`, else `/var/run/docker.sock`).
///
/// # Errors
/// Why not, as text: no socket, no answer, or not `OK`.
pub fn docker_engine() -> Result<(), String> {
    let path = match std::env::var("DOCKER_HOST") {
        Ok(host) => match host.strip_prefix("unix://") {
            Some(path) => path.to_owned(),
            None => return Err(format!("DOCKER_HOST={host} is not a unix:// socket")),
        },
        Err(_) => "/var/run/docker.sock".to_owned(),
    };
    let mut stream =
        UnixStream::connect(&path).map_err(|e| format!("no Docker engine at {path}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
        .map_err(|e| format!("Docker engine at {path}: {e}"))?;
    let mut reply = String::new();
    stream
        .read_to_string(&mut reply)
        .map_err(|e| format!("Docker engine at {path}: {e}"))?;
    if reply.ends_with("OK") {
        Ok(())
    } else {
        Err(format!("Docker engine at {path} answered {reply:?}"))
    }
}

fn engine_error(server: &str, e: impl std::fmt::Display) -> ServerError {
    ServerError::Setup {
        server: "docker",
        step: format!("container for {server}"),
        detail: e.to_string(),
    }
}

/// How a container's server shows it serves: a probe of the host port.
type Probe = fn(u16) -> std::pin::Pin<Box<dyn Future<Output = Result<(), ServerError>> + Send>>;

/// A server in a container, its port mapped to a fixed host port so that a restart
/// keeps the URL.
pub struct ContainerServer {
    name: &'static str,
    scheme_url: fn(u16) -> String,
    container: Arc<ContainerAsync<GenericImage>>,
    port: u16,
    probe: Probe,
}

impl std::fmt::Debug for ContainerServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerServer")
            .field("name", &self.name)
            .field("id", &self.container.id())
            .field("port", &self.port)
            .finish()
    }
}

impl ContainerServer {
    async fn start(
        name: &'static str,
        image: GenericImage,
        container_port: u16,
        scheme_url: fn(u16) -> String,
        probe: Probe,
        configure: impl FnOnce(
                testcontainers::ContainerRequest<GenericImage>,
            ) -> testcontainers::ContainerRequest<GenericImage>
            + Send
            + 'static,
    ) -> Result<Self, ServerError> {
        docker_engine().map_err(|why| ServerError::NotInstalled {
            what: "a Docker engine".into(),
            hint: why,
        })?;
        let port = free_port()?;
        let request = configure(image.with_mapped_port(port, container_port.tcp()));
        let container = on_engine(async move { request.start().await })
            .await?
            .map_err(|e| engine_error(name, e))?;
        let server = ContainerServer {
            name,
            scheme_url,
            container: Arc::new(container),
            port,
            probe,
        };
        server.wait_ready().await?;
        Ok(server)
    }

    async fn wait_ready(&self) -> Result<(), ServerError> {
        let started = Instant::now();
        loop {
            let last = match (self.probe)(self.port).await {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if started.elapsed() >= READY_TIMEOUT {
                return Err(ServerError::Probe {
                    server: "docker",
                    detail: format!(
                        "{} container not ready within {READY_TIMEOUT:?}: {last}; logs:\n{}",
                        self.name,
                        self.logs()
                    ),
                });
            }
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
    }
}

#[async_trait]
impl ServerControl for ContainerServer {
    fn url(&self) -> String {
        (self.scheme_url)(self.port)
    }

    fn port(&self) -> u16 {
        self.port
    }

    /// Stops the container at once (no grace period), as a crash would.
    fn kill(&mut self) {
        let container = self.container.clone();
        // Never fails, as the trait promises: a container already gone is killed.
        let _ = on_engine_blocking(async move { container.stop_with_timeout(Some(0)).await });
    }

    async fn restart(&mut self) -> Result<(), ServerError> {
        let container = self.container.clone();
        on_engine(async move {
            let _ = container.stop_with_timeout(Some(0)).await;
            container.start().await
        })
        .await?
        .map_err(|e| engine_error(self.name, e))?;
        self.wait_ready().await
    }

    fn pause(&mut self) -> Result<(), ServerError> {
        Err(self.unsupported("pause"))
    }

    fn resume(&mut self) -> Result<(), ServerError> {
        Err(self.unsupported("resume"))
    }

    fn logs(&self) -> String {
        let container = self.container.clone();
        let logs = on_engine_blocking(async move {
            let mut text = container.stdout_to_vec().await.unwrap_or_default();
            text.extend(container.stderr_to_vec().await.unwrap_or_default());
            text
        });
        match logs {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                let lines: Vec<&str> = text.lines().collect();
                lines[lines.len().saturating_sub(60)..].join("\n")
            }
            Err(e) => format!("<no logs: {e}>"),
        }
    }

    fn pause_unsupported(&self) -> Option<String> {
        Some(NO_PAUSE.to_owned())
    }
}

impl ContainerServer {
    fn unsupported(&self, action: &'static str) -> ServerError {
        ServerError::Unsupported {
            server: self.name.to_owned(),
            action,
            why: NO_PAUSE.to_owned(),
        }
    }
}

pub(crate) async fn redis() -> Result<Box<dyn ServerControl>, ServerError> {
    let image = GenericImage::new("redis", "7.0");
    let server = ContainerServer::start(
        "redis",
        image,
        6379,
        |port| format!("redis://127.0.0.1:{port}"),
        |port| Box::pin(crate::redis::redis_ping(port, None, crate::PROBE_TIMEOUT)),
        |request| request.with_cmd(["redis-server", "--save", "", "--appendonly", "no"]),
    )
    .await?;
    Ok(Box::new(server))
}

pub(crate) async fn postgres(
    options: PostgresServerOptions,
) -> Result<Box<dyn ServerControl>, ServerError> {
    let mut cmd = vec!["postgres".to_owned()];
    for (name, value) in options.settings {
        cmd.push("-c".into());
        cmd.push(format!("{name}={value}"));
    }
    let server = ContainerServer::start(
        "postgres",
        GenericImage::new("postgres", "15"),
        5432,
        |port| format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        |port| Box::pin(crate::postgres::pg_ping(port, crate::PROBE_TIMEOUT)),
        move |request| {
            request
                .with_env_var("POSTGRES_HOST_AUTH_METHOD", "trust")
                .with_cmd(cmd)
        },
    )
    .await?;
    Ok(Box::new(server))
}

pub(crate) async fn zookeeper() -> Result<Box<dyn ServerControl>, ServerError> {
    let server = ContainerServer::start(
        "zookeeper",
        GenericImage::new("zookeeper", "3.8"),
        2181,
        |port| format!("zookeeper://127.0.0.1:{port}"),
        |port| {
            Box::pin(async move {
                match crate::zookeeper::four_letter(port, "ruok", crate::PROBE_TIMEOUT).await? {
                    reply if reply.trim() == "imok" => Ok(()),
                    reply => Err(ServerError::Probe {
                        server: "zookeeper",
                        detail: format!("ruok answered {reply:?}"),
                    }),
                }
            })
        },
        // The probes and the kit's checks use four-letter words.
        |request| request.with_env_var("ZOO_4LW_COMMANDS_WHITELIST", "*"),
    )
    .await?;
    Ok(Box::new(server))
}
