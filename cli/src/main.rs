//! The `distlock` command-line tool: `exec` runs a command under a lock, `elect` only
//! while leading an election, `leader` and `status` show who holds what, and `demo`
//! shows why locks and fencing tokens matter. With the `conformance` and `bench`
//! features, `conformance` and `bench` evaluate a backend.
//!
//! Exit codes: 0 on success, 1 when a run fails (a conformance scenario, the demo's own
//! checks, a backend that cannot be reached), 2 for usage and configuration errors;
//! `exec` passes on its command's code and has its own codes (see `exec --help`).
//! Every error is one line on stderr, starting with `error: `.

#[cfg(feature = "bench")]
mod bench;
#[cfg(feature = "conformance")]
mod conformance;
mod demo;
mod duration;
mod elect;
mod error;
mod escape;
// The command runner makes the process-control FFI calls (prctl, kill, raise).
#[allow(unsafe_code)]
mod exec;
#[cfg(feature = "bench")]
mod failover;
#[cfg(feature = "conformance")]
mod faults;
mod leader;
mod status;
#[cfg(feature = "conformance")]
mod url_harness;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::error::CliError;

/// Runs commands under distributed locks and elections (exec, elect), shows who holds
/// what (leader, status), and plays the fencing demo; on Redis, Postgres, ZooKeeper,
/// etcd or file locks.
#[derive(Debug, Parser)]
#[command(name = "distlock", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Plays the bank story: a lost update without a lock, the right balance with one,
    /// and a stale holder's write rejected by its fencing token.
    Demo {
        #[command(flatten)]
        backend: BackendArgs,
    },
    /// Runs the conformance scenarios against a backend and prints a report (Cargo
    /// feature `conformance`).
    #[cfg(feature = "conformance")]
    Conformance {
        #[command(flatten)]
        backend: BackendArgs,
        /// Print the report as JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Instead of testing the backend, prove the kit works: run it against the
        /// reference memory backend and every deliberately broken backend
        /// (--backend is ignored).
        #[arg(long)]
        self_test: bool,
        #[command(flatten)]
        faults: FaultArgs,
    },
    /// Runs a command while holding a lock (or, with --permits N, one of N permits of a
    /// semaphore; with --shared, a read lock); exits with the command's exit code.
    Exec(exec::ExecArgs),
    /// Campaigns in election NAME and runs a command only while leading; after a lost
    /// leadership stops the command and campaigns again (unless --once).
    Elect(elect::ElectArgs),
    /// Shows who leads election NAME (identity, term, remaining lease); with --watch,
    /// every change as it happens.
    Leader {
        #[command(flatten)]
        backend: LockBackendArgs,
        /// The election's name.
        name: String,
        /// Follow the leadership: one line per change, until the connection is lost
        /// (exit 69) or distlock is stopped.
        #[arg(long)]
        watch: bool,
        /// Print JSON (one object per line with --watch) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Shows whether KEY is held, its fencing token and remaining lease where the
    /// backend can tell, without taking the lock; with --semaphore or --rw, the holders
    /// of the semaphore or read-write lock KEY (what `exec --permits` and `exec
    /// --shared` take).
    Status {
        #[command(flatten)]
        backend: LockBackendArgs,
        /// The lock key.
        key: String,
        /// Show the semaphore KEY: its permit count and the permits held.
        #[arg(long, conflicts_with = "rw")]
        semaphore: bool,
        /// Show the read-write lock KEY: free, read or write, its holders where the
        /// backend can list them, and whether a writer waits.
        #[arg(long)]
        rw: bool,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Benchmarks distlock on a backend; with --compare, beside the raw bound and the
    /// peer crates, as figures and ratios from one run (Cargo feature `bench`).
    #[cfg(feature = "bench")]
    Bench {
        #[command(flatten)]
        backend: BackendArgs,
        #[command(flatten)]
        args: bench::BenchArgs,
    },
}

/// The backend option of commands that act on real locks (`exec`, `status`): the
/// default is the file backend, shared by every process of this user on this host.
#[derive(Debug, Args)]
pub(crate) struct LockBackendArgs {
    /// Lock backend URL: file:// (default: /tmp/distlock-<uid>), file:///DIR,
    /// redis://…, postgres://…, mysql://…, zk://…
    #[arg(
        long,
        value_name = "URL",
        env = "DISTLOCK_BACKEND",
        default_value = "file://",
        hide_env_values = true
    )]
    pub(crate) backend: String,
}

/// The backend option shared by every subcommand that uses a backend.
#[derive(Debug, Args)]
struct BackendArgs {
    /// Lock backend URL: memory://, memory://NAME, redis://…, postgres://…, mysql://…, zk://…
    #[arg(
        long,
        value_name = "URL",
        env = "DISTLOCK_BACKEND",
        default_value = "memory://",
        hide_env_values = true
    )]
    backend: String,
}

/// The fault-injection options of `conformance`.
#[cfg(feature = "conformance")]
#[derive(Debug, Args)]
struct FaultArgs {
    /// Run the fault scenarios (partitions, lost replies, paused and restarted
    /// servers, random faults under contention) instead of the plain ones.
    #[arg(long)]
    faults: bool,
    /// With --faults: start throwaway servers of the URL's kind (and node count) and
    /// run the server-fault scenarios too, instead of proxying the given servers.
    #[arg(long, requires = "faults")]
    spawn: bool,
    /// With --faults: also write a self-contained HTML report with a grant timeline.
    #[arg(long, value_name = "FILE", requires = "faults")]
    html: Option<std::path::PathBuf>,
}

/// The longest distlock waits at exit for background clean-ups (the release of a
/// dropped guard, the undoing of an acquire cut short by a signal): each is one request
/// bounded by the backend's request timeout.
const CLEANUP_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

fn main() -> ExitCode {
    // Clap prints its own usage errors (exit code 2) and help/version (exit code 0).
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return report(CliError::failed(format!("cannot start the runtime: {e}"))),
    };
    let is_exec = matches!(cli.command, Command::Exec(_) | Command::Elect(_));
    let outcome = runtime.block_on(async {
        let outcome = run(cli.command).await;
        // exec may return right after dropping an acquire (a signal while waiting),
        // whose backend still has to undo it on the server (a Redis waiter leaves the
        // queue, a late grant is released). Shutting the runtime down would drop those
        // tasks unrun, so they get a bounded moment first.
        distlock::settle_cleanups(CLEANUP_GRACE).await;
        outcome
    });
    if is_exec {
        // What backends do as the runtime's tasks are dropped (ZooKeeper closes its
        // session, taking a waiter's contender node with it) is blocking work: bounded.
        runtime.shutdown_timeout(CLEANUP_GRACE);
    } else {
        // Do not wait for the other background tasks (renewals, subscriptions).
        runtime.shutdown_background();
    }
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => report(e),
    }
}

async fn run(command: Command) -> Result<(), CliError> {
    match command {
        Command::Demo { backend } => demo::run(&backend.backend).await,
        Command::Status {
            backend,
            key,
            semaphore,
            rw,
            json,
        } => {
            let url = &backend.backend;
            match (semaphore, rw) {
                (true, _) => status::primitives::semaphore(url, &key, json).await,
                (_, true) => status::primitives::rw(url, &key, json).await,
                _ => status::run(url, &key, json).await,
            }
        }
        #[cfg(feature = "conformance")]
        Command::Conformance {
            backend,
            json,
            self_test,
            faults,
        } => {
            if faults.faults {
                faults::run(&backend.backend, faults.spawn, json, faults.html.as_deref()).await
            } else if self_test {
                conformance::self_test(json).await
            } else {
                conformance::run(&backend.backend, json).await
            }
        }
        Command::Exec(args) => exec::run(args).await,
        Command::Elect(args) => elect::run(args).await,
        Command::Leader {
            backend,
            name,
            watch,
            json,
        } => leader::run(&backend.backend, &name, json, watch).await,
        #[cfg(feature = "bench")]
        Command::Bench { backend, args } => bench::run(&backend.backend, args).await,
    }
}

/// Writes `text` to stdout. A closed pipe (`distlock … | head`) is an error, not a panic.
pub(crate) fn print_out(text: &str) -> Result<(), CliError> {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|e| CliError::failed(format!("cannot write to stdout: {e}")))
}

/// Prints `error: …` on one line, control characters escaped, and returns the error's
/// exit code.
fn report(error: CliError) -> ExitCode {
    use std::io::Write as _;
    let message = error.message();
    if message.is_empty() {
        return ExitCode::from(error.exit_code());
    }
    // Nothing more can be done if stderr is closed; the exit code still tells. The
    // message may quote a server or a key: escaped, it cannot drive the terminal.
    let _ = writeln!(std::io::stderr(), "error: {}", escape::line(&message));
    ExitCode::from(error.exit_code())
}
