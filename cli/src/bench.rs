//! `distlock bench`: distlock beside the raw server bound and the peer crates, as a
//! table of figures and ratios, optionally JSON and an SVG of the distributions.

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::PossibleValuesParser;
use clap::Args;
use distlock_bench::{BenchConfig, BenchError, KeyMode};
use distlock_test_servers::{kind_named, Started, SERVER_KINDS};

use crate::error::CliError;
use crate::print_out;

/// Options of `distlock bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Also measure the raw bound (bare driver, same round trips) and the peer crates
    /// (Redis: rslock, distributed-lock; Postgres: sqlx PgAdvisoryLock; MySQL/MariaDB:
    /// the raw bound only; ZooKeeper: zookeeper-client's lock recipe; etcd:
    /// etcd-client's lock()/unlock() on a lease per cycle and on one lease per worker).
    /// rslock and distributed-lock need a build with the `compare` feature; without it
    /// they are left out with a note.
    #[arg(long)]
    compare: bool,
    /// Write an SVG of the latency and hand-off distributions to this file.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// Print the report as JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Tiny counts: checks that everything runs, in a few seconds; measures nothing.
    #[arg(long)]
    quick: bool,
    /// Alternating rounds per concurrency (default 5; 1 with --quick).
    #[arg(long, value_name = "N")]
    rounds: Option<usize>,
    /// Measured seconds per side and round (default 1).
    #[arg(long, value_name = "SECONDS")]
    slice: Option<f64>,
    /// Concurrencies of the uncontended cycles, comma-separated (default 1,16,64);
    /// latencies are reported for 1 and 16 among them.
    #[arg(long, value_name = "N,…", value_delimiter = ',')]
    concurrency: Option<Vec<usize>>,
    /// The keys of the uncontended cycles, comma-separated: `reused` (each worker its
    /// own key, again and again), `fresh` (a new key per cycle); default both, one
    /// table each.
    #[arg(long, value_name = "MODE,…", value_delimiter = ',', value_parser = ["reused", "fresh"])]
    keys: Option<Vec<String>>,
    /// Hand-offs to collect per side on the hot key (default 2000).
    #[arg(long, value_name = "N")]
    handoffs: Option<usize>,
    /// Workers on the hot key (default 16): one holds while the others wait, so 9
    /// gives the hand-off with 8 waiters.
    #[arg(long, value_name = "N")]
    hot_workers: Option<usize>,
    /// Locks to hold at once for the cost-of-holding row (default 10000; 0 skips it).
    #[arg(long, value_name = "N")]
    hold: Option<usize>,
    /// Start a throwaway local server of this kind and benchmark it (--backend is
    /// ignored). Needs the server installed, as for the tests.
    #[arg(long, value_name = "KIND", value_parser = spawn_kinds())]
    spawn: Option<String>,
    /// Instead of the lock benchmarks, measure election failover over N trials each:
    /// resign → the standby leads, and kill -9 of a `distlock elect` leader → the
    /// standby's command starts (p50, p99, max).
    #[arg(long, value_name = "N")]
    failover: Option<usize>,
}

/// The kinds `--spawn` can start: every `distlock_test_servers::SERVER_KINDS` name.
fn spawn_kinds() -> PossibleValuesParser {
    PossibleValuesParser::new(SERVER_KINDS.iter().map(|k| k.name))
}

/// Starts one server of the kind called `name`: the servers, kept alive for the run,
/// and a client URL.
async fn spawn(name: &str) -> Result<(Started, String), CliError> {
    let kind =
        kind_named(name).ok_or_else(|| usage(format!("--spawn knows no server kind {name:?}")))?;
    let started = kind
        .start(1)
        .await
        .map_err(|e| CliError::failed(format!("cannot start the server: {e}")))?;
    let url = kind.url_for(&started.ports());
    Ok((started, url))
}

/// A usage error (exit code 2), through the configuration-error path every
/// subcommand shares.
fn usage(message: String) -> CliError {
    CliError::from(distlock::LockError::config("bench", message))
}

/// Runs the benchmark against `url` (or a spawned server) and prints the report.
pub async fn run(url: &str, args: BenchArgs) -> Result<(), CliError> {
    let server = match &args.spawn {
        Some(kind) => Some(spawn(kind).await?),
        None => None,
    };
    let url = server
        .as_ref()
        .map_or_else(|| url.to_owned(), |(_, url)| url.clone());
    if let Some(trials) = args.failover {
        return print_out(&crate::failover::run(&url, trials).await?);
    }
    let mut config = if args.quick {
        BenchConfig::quick(url)
    } else {
        BenchConfig::standard(url)
    };
    config.compare = args.compare;
    if let Some(rounds) = args.rounds {
        if rounds == 0 {
            return Err(usage("--rounds must be at least 1".into()));
        }
        config.rounds = rounds;
    }
    if let Some(seconds) = args.slice {
        config.slice = Duration::try_from_secs_f64(seconds)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                usage(format!(
                    "--slice must be a positive number of seconds, not {seconds}"
                ))
            })?;
    }
    if let Some(concurrency) = args.concurrency {
        if concurrency.contains(&0) {
            return Err(usage("--concurrency values must be at least 1".into()));
        }
        config.concurrencies = concurrency;
    }
    if let Some(keys) = args.keys {
        let mut modes = Vec::new();
        for name in &keys {
            let mode = KeyMode::named(name)
                .ok_or_else(|| usage(format!("--keys knows no mode {name:?}")))?;
            if !modes.contains(&mode) {
                modes.push(mode);
            }
        }
        config.key_modes = modes;
    }
    if let Some(handoffs) = args.handoffs {
        config.handoffs = handoffs.max(1);
    }
    if let Some(workers) = args.hot_workers {
        if workers < 2 {
            return Err(usage(
                "--hot-workers must be at least 2 (a holder and a waiter)".into(),
            ));
        }
        config.hot_workers = workers;
    }
    if let Some(hold) = args.hold {
        config.hold = hold;
    }
    let mut progress = |line: &str| {
        use std::io::Write as _;
        // Progress is a courtesy; a closed stderr must not stop the run.
        let _ = writeln!(std::io::stderr(), "{line}");
    };
    let report = distlock_bench::run(&config, &mut progress)
        .await
        .map_err(|e: BenchError| {
            if e.is_usage() {
                usage(e.to_string())
            } else {
                CliError::failed(e.to_string())
            }
        })?;
    if let Some(path) = &args.plot {
        std::fs::write(path, distlock_bench::svg(&report))
            .map_err(|e| CliError::failed(format!("cannot write {}: {e}", path.display())))?;
    }
    if args.json {
        let json = serde_json::to_string_pretty(&report)
            .map_err(|e| CliError::failed(format!("cannot encode the report: {e}")))?;
        print_out(&format!("{json}\n"))
    } else {
        print_out(&format!("{report}"))
    }
}
