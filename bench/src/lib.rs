//! Benchmarks of distlock beside the raw server bound and (with feature `compare`) the
//! peer lock crates, run by `distlock bench`.
//!
//! Every figure comes from one run against one server: distlock and each comparator
//! take turns in alternating rounds in the same process, and ratios are taken within a
//! round and reported as the median over rounds, with their spread. See
//! `docs/benchmarks.md` for the method and a reference run.

#[cfg(feature = "etcd")]
mod etcd;
mod holding;
mod measure;
mod mysql;
mod plot;
mod postgres;
mod primitives;
mod redis;
mod report;
mod server_cpu;
mod side;
mod zookeeper;

use std::time::Duration;

pub use plot::svg;
pub use report::{
    BackendReport, HandoffRow, HoldingRow, LatencyRow, Ratio, SideCpu, SideRate, ThroughputRow,
};

use crate::side::{BoxError, Side};

/// What to run and for how long.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// The backend URL (`redis://`, `postgres://`, `zookeeper://`, `zk://`, `file://` or
    /// `memory://`).
    pub url: String,
    /// Also run the raw bound and the peer crates.
    pub compare: bool,
    /// Alternating rounds per concurrency.
    pub rounds: usize,
    /// Measured length of one side's turn in a round.
    pub slice: Duration,
    /// Unmeasured run before each turn (connections, caches, the server's JIT).
    pub warm_up: Duration,
    /// Concurrencies of the uncontended cycles.
    pub concurrencies: Vec<usize>,
    /// The keys of the uncontended cycles: each worker reusing its own, a fresh key
    /// per cycle, or both (one table each).
    pub key_modes: Vec<KeyMode>,
    /// Concurrencies whose acquire latencies are reported.
    pub latency_concurrencies: Vec<usize>,
    /// Workers on the hot key.
    pub hot_workers: usize,
    /// Hand-offs to collect per side on the hot key.
    pub handoffs: usize,
    /// Longest hot-key run per side.
    pub hot_limit: Duration,
    /// A hot-key worker's pause between its release and its next acquire.
    pub think: Duration,
    /// Locks held at once for the cost-of-holding row (0 skips it).
    pub hold: usize,
}

impl BenchConfig {
    /// The full run used for published figures.
    pub fn standard(url: impl Into<String>) -> Self {
        BenchConfig {
            url: url.into(),
            compare: false,
            rounds: 9,
            slice: Duration::from_secs(1),
            warm_up: Duration::from_millis(200),
            concurrencies: vec![1, 16, 64],
            key_modes: vec![KeyMode::Reused, KeyMode::Fresh],
            latency_concurrencies: vec![1, 16],
            hot_workers: 16,
            handoffs: 2000,
            hot_limit: Duration::from_secs(10),
            think: Duration::from_millis(1),
            hold: 10_000,
        }
    }

    /// Tiny counts: proves the tool works in a few seconds, measures nothing.
    pub fn quick(url: impl Into<String>) -> Self {
        BenchConfig {
            rounds: 1,
            slice: Duration::from_millis(100),
            warm_up: Duration::from_millis(20),
            handoffs: 20,
            hot_limit: Duration::from_secs(2),
            hold: 100,
            ..Self::standard(url)
        }
    }
}

/// Which keys the uncontended cycles lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyMode {
    /// Each worker locks its own key (file: its own 16) again and again, as a job
    /// locking one resource does.
    Reused,
    /// Every cycle locks a key never locked before, as a service locking order ids
    /// does: whatever a backend creates per key is created (and later removed) on
    /// every cycle.
    Fresh,
}

impl KeyMode {
    /// The mode's name in tables, JSON and `--keys`.
    pub fn name(self) -> &'static str {
        match self {
            KeyMode::Reused => "reused",
            KeyMode::Fresh => "fresh",
        }
    }

    /// The mode called `name` (see [`KeyMode::name`]).
    pub fn named(name: &str) -> Option<KeyMode> {
        [KeyMode::Reused, KeyMode::Fresh]
            .into_iter()
            .find(|mode| mode.name() == name)
    }
}

/// A benchmark that could not run: a bad URL, an unreachable server, or distlock
/// itself failing mid-run (a peer failing is recorded in the report instead).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct BenchError {
    message: String,
    usage: bool,
}

impl BenchError {
    fn run(context: &str, error: impl std::fmt::Display) -> Self {
        BenchError {
            message: format!("{context}: {error}"),
            usage: false,
        }
    }

    /// True for usage errors (an unsupported URL), false for failed runs.
    pub fn is_usage(&self) -> bool {
        self.usage
    }
}

/// The backends the benchmark knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Redis,
    /// `redis+sentinel://` or `redis+cluster://` (and the TLS forms): distlock only, as
    /// the raw driver and the peer crates speak to one node.
    RedisTopology,
    Postgres,
    /// `mysql://` or `mariadb://`.
    MySql,
    ZooKeeper,
    /// `etcd://` (feature `etcd`).
    Etcd,
    /// `file://`: distlock only (no server, no comparators), for its own rows and the
    /// semaphore and read-write rows beside the mutex.
    File,
    /// `memory://`: the same, in this process: the cost of the API and guards alone.
    Memory,
    /// Any other scheme `distlock::connect` takes: distlock's own rows only.
    Other,
}

impl Backend {
    fn of(url: &str) -> Result<Backend, BenchError> {
        let scheme = url.split("://").next().unwrap_or_default();
        match scheme {
            "redis" => Ok(Backend::Redis),
            "redis+sentinel" | "rediss+sentinel" | "redis+cluster" | "rediss+cluster" => {
                Ok(Backend::RedisTopology)
            }
            "postgres" | "postgresql" => Ok(Backend::Postgres),
            "mysql" | "mariadb" => Ok(Backend::MySql),
            "zookeeper" | "zk" => Ok(Backend::ZooKeeper),
            "etcd" if cfg!(feature = "etcd") => Ok(Backend::Etcd),
            "file" => Ok(Backend::File),
            "memory" => Ok(Backend::Memory),
            "etcd" => Err(BenchError {
                message: "etcd:// needs the bench's `etcd` feature".to_owned(),
                usage: true,
            }),
            other if distlock::scheme_available(other) => Ok(Backend::Other),
            _ => Err(BenchError {
                message: format!(
                    "bench takes the URLs distlock connects in this build ({}), not {scheme}://",
                    distlock::schemes()
                        .filter(|s| distlock::scheme_available(s))
                        .map(|s| format!("{s}://"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                usage: true,
            }),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Backend::Redis => "Redis",
            Backend::RedisTopology => "Redis (Sentinel/Cluster)",
            Backend::Postgres => "Postgres",
            Backend::MySql => "MySQL/MariaDB",
            Backend::ZooKeeper => "ZooKeeper",
            Backend::Etcd => "etcd",
            Backend::File => "file",
            Backend::Memory => "memory",
            Backend::Other => "other",
        }
    }

    /// Whether a server's connections can be counted for the holding row.
    fn has_server(self) -> bool {
        !matches!(
            self,
            Backend::RedisTopology
                | Backend::Etcd
                | Backend::File
                | Backend::Memory
                | Backend::Other
        )
    }

    /// Keys each worker cycles through in the uncontended run with reused keys: one
    /// (still uncontended, each worker has its own).
    fn keys_per_worker(self) -> u64 {
        match self {
            // A few lock files per key and side in one directory.
            Backend::File => 16,
            _ => 1,
        }
    }
}

/// The note a comparison run gets when the peer crates were not built in.
#[cfg(not(feature = "compare"))]
const WITHOUT_PEERS: &str = "rslock and distributed-lock left out: this build lacks the \
     `compare` feature (cargo install distlock-cli --features compare)";

/// Connects distlock and, with `compare`, every comparator (see [`connect_unbounded`]),
/// within [`side::PATIENCE`]: a peer's connect takes no deadline of its own, and a run
/// must fail rather than wait without one.
async fn connect_sides(
    backend: Backend,
    url: &str,
    compare: bool,
    notes: &mut Vec<String>,
) -> Result<Vec<Box<dyn Side>>, BenchError> {
    tokio::time::timeout(
        side::PATIENCE,
        connect_unbounded(backend, url, compare, notes),
    )
    .await
    .map_err(|_| {
        BenchError::run(
            "connecting the sides",
            format!("not done within {:?}", side::PATIENCE),
        )
    })?
}

/// Every side of `backend` at `url` (the peers only with `compare`); a peer that cannot
/// connect is left out with a note.
async fn connect_unbounded(
    backend: Backend,
    url: &str,
    compare: bool,
    notes: &mut Vec<String>,
) -> Result<Vec<Box<dyn Side>>, BenchError> {
    let ours = side::Ours::connect(url)
        .await
        .map_err(|e| BenchError::run("distlock", e))?;
    let mut sides: Vec<Box<dyn Side>> = vec![Box::new(ours)];
    if matches!(backend, Backend::Redis | Backend::RedisTopology) {
        // FIFO is a mode of our own, so it is measured in every run, against the
        // default mode. (Postgres and ZooKeeper wait in FIFO order anyway.)
        let fifo = side::Ours::fifo(url)
            .await
            .map_err(|e| BenchError::run("distlock fifo", e))?;
        sides.push(Box::new(fifo));
    }
    primitives::add_sides(url, &mut sides, notes).await;
    if !compare {
        return Ok(sides);
    }
    let mut add = |name: &str, side: Result<Box<dyn Side>, BoxError>| match side {
        Ok(side) => sides.push(side),
        Err(e) => notes.push(format!("{name} left out: cannot connect: {e}")),
    };
    match backend {
        Backend::Redis => {
            add("raw", boxed(redis::Raw::connect(url).await));
            #[cfg(feature = "compare")]
            {
                add("rslock", Ok(Box::new(redis::Rslock::connect(url))));
                add(
                    "distributed-lock",
                    boxed(redis::DistributedLockRedis::connect(url).await),
                );
            }
            #[cfg(not(feature = "compare"))]
            notes.push(WITHOUT_PEERS.into());
        }
        Backend::Postgres => {
            add("raw", Ok(Box::new(postgres::Raw::new(url))));
            add(
                "sqlx PgAdvisoryLock",
                Ok(Box::new(postgres::SqlxAdvisory::new(url))),
            );
            notes.push(
                "distributed-lock left out: its Postgres crate switches sqlx to OpenSSL in the whole build"
                    .into(),
            );
        }
        Backend::MySql => {
            add("raw", Ok(Box::new(mysql::Raw::new(url))));
            notes.push(
                "distributed-lock's MySQL crate is not compared here: it turns on sqlx's \
                 native-tls (OpenSSL) for the whole build; bench/peers-mysql, a cargo project \
                 outside the workspace, compares it"
                    .into(),
            );
        }
        Backend::RedisTopology => notes.push(
            "no comparators for Sentinel and Cluster URLs: the raw driver and the peer crates speak to one node".into(),
        ),
        Backend::File | Backend::Memory => {
            notes.push("no comparators for file:// and memory://: there is no server".into())
        }
        Backend::Other => notes.push("no comparators known for this backend".into()),
        Backend::ZooKeeper => {
            add("raw", boxed(zookeeper::Raw::connect(url).await));
            add(
                "zookeeper-client lock",
                boxed(zookeeper::Recipe::connect(url).await),
            );
        }
        #[cfg(feature = "etcd")]
        Backend::Etcd => {
            add("raw", boxed(etcd::Raw::connect(url).await));
            add(
                "etcd-client lock",
                boxed(etcd::Recipe::connect(url).await),
            );
            add(
                "etcd-client lock, lease per worker",
                boxed(etcd::SessionRecipe::connect(url).await),
            );
        }
        #[cfg(not(feature = "etcd"))]
        Backend::Etcd => {}
    }
    Ok(sides)
}

fn boxed<S: Side + 'static>(side: Result<S, BoxError>) -> Result<Box<dyn Side>, BoxError> {
    side.map(|s| Box::new(s) as Box<dyn Side>)
}

async fn server_version(backend: Backend, url: &str) -> String {
    let version = match backend {
        Backend::Redis => redis::server_version(url).await,
        Backend::RedisTopology => Ok("Redis through Sentinel or Cluster".to_owned()),
        Backend::Postgres => postgres::server_version(url).await,
        Backend::MySql => mysql::server_version(url).await,
        Backend::ZooKeeper => zookeeper::server_version(url).await,
        #[cfg(feature = "etcd")]
        Backend::Etcd => etcd::server_version(url).await,
        #[cfg(not(feature = "etcd"))]
        Backend::Etcd => Err("built without the `etcd` feature".into()),
        Backend::File => Ok("no server: flock(2) on the local file system".to_owned()),
        Backend::Memory => Ok("no server: this process's memory".to_owned()),
        Backend::Other => Err("the bench knows no version query for this backend".into()),
    };
    version.unwrap_or_else(|e| format!("{} (version unknown: {e})", backend.name()))
}

/// Runs every measurement against `config.url` and returns the report. `progress` is
/// told what is running (for a terminal; the figures are in the report).
///
/// # Errors
/// A usage error for a URL of an unsupported scheme; a run error when distlock cannot
/// connect or fails mid-run. A comparator that fails is left out of later rows and the
/// failure recorded in the report's notes.
pub async fn run(
    config: &BenchConfig,
    progress: &mut (dyn FnMut(&str) + Send),
) -> Result<BackendReport, BenchError> {
    let backend = Backend::of(&config.url)?;
    // Keys are new in every run: a lock a comparator left behind in an earlier run (its
    // TTL not yet over) cannot stall this one.
    let run_id = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default()
    );
    // First, while the process is fresh: its memory growth is then the locks' cost,
    // not noise from the allocator reusing what earlier measurements freed.
    let holding = if config.hold > 0 && backend.has_server() {
        progress(&format!(
            "{}: cost of holding {} locks",
            backend.name(),
            config.hold
        ));
        Some(holding_cost(backend, config, &run_id).await?)
    } else {
        None
    };

    let mut notes = Vec::new();
    let server = server_version(backend, &config.url).await;
    let sides = connect_sides(backend, &config.url, config.compare, &mut notes).await?;
    let names: Vec<&'static str> = sides.iter().map(|s| s.name()).collect();
    let mut report = BackendReport::new(backend.name(), server, config, &names);
    let mut failed = vec![false; sides.len()];
    let server_cpu = server_cpu::ServerCpu::locate(
        &config.url,
        backend == Backend::Redis,
        matches!(
            backend,
            Backend::Postgres | Backend::MySql | Backend::ZooKeeper | Backend::Etcd
        ),
    );
    if matches!(server_cpu, server_cpu::ServerCpu::Unknown) {
        notes.push(
            "server CPU n/a: the server is not one local process the bench can read (Redis \
             reports its own; others are read from /proc when they listen on this machine's \
             loopback)"
                .into(),
        );
    }
    for &mode in &config.key_modes {
        for &workers in &config.concurrencies {
            progress(&format!(
                "{}: uncontended cycles at concurrency {workers}, {} keys",
                backend.name(),
                mode.name()
            ));
            let turn = Turn {
                backend,
                mode,
                workers,
                server_cpu: &server_cpu,
                plotted: Some(&mode) == config.key_modes.first(),
            };
            uncontended(
                config,
                &run_id,
                &sides,
                &turn,
                &mut failed,
                &mut report,
                &mut notes,
            )
            .await?;
        }
    }
    progress(&format!(
        "{}: hot key, {} workers",
        backend.name(),
        config.hot_workers
    ));
    hot_key(
        backend,
        config,
        &run_id,
        &sides,
        &failed,
        &mut report,
        &mut notes,
    )
    .await?;
    report.holding = holding;
    report.notes = notes;
    Ok(report)
}

/// The holding row: a fresh client holds `config.hold` locks at once.
async fn holding_cost(
    backend: Backend,
    config: &BenchConfig,
    run_id: &str,
) -> Result<HoldingRow, BenchError> {
    let prefix = format!("{run_id}/hold");
    holding::measure(&config.url, &prefix, config.hold, |url| {
        let url = url.to_owned();
        async move {
            match backend {
                Backend::Redis => redis::connected_clients(&url).await,
                Backend::RedisTopology
                | Backend::Etcd
                | Backend::File
                | Backend::Memory
                | Backend::Other => Err("connections are not counted on this backend".into()),
                Backend::Postgres => postgres::client_connections(&url).await,
                Backend::MySql => mysql::client_connections(&url).await,
                Backend::ZooKeeper => zookeeper::alive_connections(&url).await,
            }
        }
    })
    .await
    .map_err(|e| BenchError::run("distlock, holding locks", e))
}

/// What one series of uncontended rounds runs.
struct Turn<'a> {
    backend: Backend,
    mode: KeyMode,
    workers: usize,
    server_cpu: &'a server_cpu::ServerCpu,
    /// Whether its latencies go into the plot (one key mode's only).
    plotted: bool,
}

/// One concurrency and key mode of uncontended cycles: `config.rounds` rounds, each
/// side taking a turn per round, in an order drawn afresh each round
/// ([`measure::turn_order`]); adds the throughput (and latency) rows. A comparator that
/// fails is marked in `failed` and left out from then on.
async fn uncontended(
    config: &BenchConfig,
    run_id: &str,
    sides: &[Box<dyn Side>],
    turn: &Turn<'_>,
    failed: &mut [bool],
    report: &mut BackendReport,
    notes: &mut Vec<String>,
) -> Result<(), BenchError> {
    let mut rates = vec![Vec::new(); sides.len()];
    let mut latencies = vec![Vec::new(); sides.len()];
    // CPU per cycle, microseconds: (client, server where it is known).
    let mut cpu = vec![(Vec::new(), Vec::new()); sides.len()];
    let keys = match turn.mode {
        KeyMode::Reused => measure::Keys::PerWorker(turn.backend.keys_per_worker()),
        KeyMode::Fresh => measure::Keys::Fresh,
    };
    let run_id = format!("{run_id}/{}", turn.mode.name());
    for round in 0..config.rounds {
        for index in measure::turn_order(round, sides.len()) {
            if failed[index] {
                continue;
            }
            let side = &sides[index];
            let server_before = turn.server_cpu.read().await;
            let slice = measure::slice(
                side.as_ref(),
                turn.workers,
                &run_id,
                keys,
                config.warm_up,
                config.slice,
            )
            .await;
            match slice {
                Ok(slice) => {
                    let cycles = slice.all_cycles.max(1) as f64;
                    cpu[index]
                        .0
                        .push(slice.client_cpu.as_secs_f64() * 1e6 / cycles);
                    if let (Some(before), Some(after)) =
                        (server_before, turn.server_cpu.read().await)
                    {
                        let used = after.saturating_sub(before);
                        cpu[index].1.push(used.as_secs_f64() * 1e6 / cycles);
                    }
                    rates[index].push(Some(slice.rate));
                    latencies[index].extend(slice.latencies);
                }
                Err(e) if index == 0 => return Err(BenchError::run("distlock", e)),
                Err(e) => {
                    failed[index] = true;
                    notes.push(format!("{} failed and was left out: {e}", side.name()));
                }
            }
        }
        // Rounds where a side did not run have no ratio for it.
        for side_rates in &mut rates {
            if side_rates.len() <= round {
                side_rates.push(None);
            }
        }
    }
    report.add_throughput(turn.mode.name(), turn.workers, &rates, &cpu);
    if config.latency_concurrencies.contains(&turn.workers) {
        report.add_latency(turn.mode.name(), turn.workers, latencies, turn.plotted);
    }
    Ok(())
}

/// The hot key, side after side, for every side that can wait; adds the hand-off rows.
async fn hot_key(
    backend: Backend,
    config: &BenchConfig,
    run_id: &str,
    sides: &[Box<dyn Side>],
    failed: &[bool],
    report: &mut BackendReport,
    notes: &mut Vec<String>,
) -> Result<(), BenchError> {
    // Every hot-key worker gets its own client, as separate processes would have.
    let mut clients = Vec::with_capacity(config.hot_workers);
    for _ in 0..config.hot_workers {
        let mut ignored = Vec::new();
        clients.push(connect_sides(backend, &config.url, config.compare, &mut ignored).await?);
    }
    for (index, side) in sides.iter().enumerate() {
        let name = side.name();
        if failed[index] {
            continue;
        }
        if !side.waits() {
            if name == primitives::OURS_READ {
                notes.push(format!(
                    "{name} left out of the hot key: readers share it, nothing is handed off"
                ));
            } else if name != "raw" {
                notes.push(format!(
                    "{name} left out of the hot key: its acquire does not wait for a held key"
                ));
            }
            continue;
        }
        let mut contenders = Vec::with_capacity(config.hot_workers);
        let mut connect_error = None;
        for (worker, client) in clients.iter().enumerate() {
            match client.iter().find(|s| s.name() == name) {
                Some(side) => match side.contender(worker).await {
                    Ok(c) => contenders.push(c),
                    Err(e) => connect_error = Some(e.to_string()),
                },
                None => connect_error = Some("client did not connect".into()),
            }
        }
        if let Some(e) = connect_error {
            notes.push(format!("{name} left out of the hot key: {e}"));
            continue;
        }
        let hot = measure::hot_key(
            contenders,
            &format!("{run_id}/hot"),
            config.handoffs,
            config.hot_limit,
            config.think,
        )
        .await;
        match hot {
            Ok(hot) => report.add_handoff(name, hot),
            Err(e) if index == 0 => return Err(BenchError::run("distlock, hot key", e)),
            Err(e) => notes.push(format!("{name} failed on the hot key: {e}")),
        }
    }
    shared_client_hot_key(config, run_id, sides[0].as_ref(), report).await
}

/// The hot key's row for distlock with every worker sharing one client, as tasks of one
/// service do (the README's advice): hand-off inside the client, beside the row where
/// each worker has its own.
async fn shared_client_hot_key(
    config: &BenchConfig,
    run_id: &str,
    ours: &dyn Side,
    report: &mut BackendReport,
) -> Result<(), BenchError> {
    let mut contenders = Vec::with_capacity(config.hot_workers);
    for worker in 0..config.hot_workers {
        contenders.push(
            ours.contender(worker)
                .await
                .map_err(|e| BenchError::run("distlock, hot key, one client", e))?,
        );
    }
    let hot = measure::hot_key(
        contenders,
        &format!("{run_id}/hot-shared"),
        config.handoffs,
        config.hot_limit,
        config.think,
    )
    .await
    .map_err(|e| BenchError::run("distlock, hot key, one client", e))?;
    report.add_handoff(OURS_SHARED, hot);
    Ok(())
}

/// The hot-key row of distlock with one client shared by every worker.
pub const OURS_SHARED: &str = "distlock, one client";
