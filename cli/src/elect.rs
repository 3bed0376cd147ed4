//! `distlock elect`: runs a command only while this replica leads an election, and
//! campaigns again after a lost leadership, so that a standby needs nothing around it.

use std::time::Duration;

use clap::Args;
use distlock::{AutoRenew, Candidate, LeaderElection, LockError, LockKey, LockOptions, WaitPolicy};
use tokio::time::Instant;

use crate::error::CliError;
use crate::exec::{self, CommandEnd, Job, Signals, EXIT_NOT_ACQUIRED, EXIT_UNREACHABLE};
use crate::{duration, escape};

/// How long a standby waits before campaigning again after the backend failed it
/// (a connection error, the server restarting): short enough for a prompt failover,
/// long enough not to hammer a server that is down.
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(1);

/// Arguments of `distlock elect`.
#[derive(Debug, Args)]
#[command(after_help = "\
Exit codes:
  N      the command ended on its own while this replica led, with code N (128+S if
         killed by signal S); distlock resigned and exits with it
  2      usage or configuration error (bad flag, URL, name, id or duration)
  69     backend unreachable (or failing) before the command started (with --once;
         without it distlock retries every second)
  75     not leader within --wait (at once with --no-wait)
  124    with --once: the leadership was lost while the command ran (it was stopped),
         or not shown to have lasted until it ended
  126    command not executable; 127 command not found
  130/143/129  distlock got SIGINT/SIGTERM/SIGHUP (forwarded to a running command)

Without --once, a lost leadership (the lease ran out, the connection was cut past it,
another replica leads) stops the command (SIGTERM to its process group, SIGKILL after
--kill-after) and distlock campaigns again: a standby replica runs `distlock elect` and
nothing else. The command gets DISTLOCK_ELECTION, DISTLOCK_TERM (the leadership's term:
send it with every write and have the resource refuse lower ones), DISTLOCK_CANDIDATE
and DISTLOCK_BACKEND. `distlock leader NAME` shows who leads.")]
pub struct ElectArgs {
    #[command(flatten)]
    backend: crate::LockBackendArgs,
    /// This candidate's identity, shown by `distlock leader` (default: HOST:PID).
    #[arg(long, value_name = "ID")]
    id: Option<String>,
    /// Leadership lease (at least 250ms), renewed every third of it while leading. A
    /// killed or frozen leader is replaced after at most this long on TTL backends
    /// (Redis); on the others as `exec --help` says of --ttl.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = duration::parse)]
    ttl: Duration,
    /// How long to wait to lead (default: forever). 0 means --no-wait.
    #[arg(long, value_name = "DURATION", value_parser = duration::parse, conflicts_with = "no_wait")]
    wait: Option<Duration>,
    /// Exit at once (code 75) if another replica leads.
    #[arg(long)]
    no_wait: bool,
    /// Lead once: run the command once, then exit (124 if the leadership was lost).
    #[arg(long)]
    once: bool,
    /// After a lost leadership, how long the command has to exit after SIGTERM before SIGKILL.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration::parse)]
    kill_after: Duration,
    /// Print each term won and lost on stderr.
    #[arg(long, short)]
    verbose: bool,
    /// The election's name.
    #[arg(value_name = "NAME")]
    name: String,
    /// The command and its arguments, after `--`.
    #[arg(value_name = "CMD", required = true, last = true)]
    command: Vec<String>,
}

/// Campaigns, runs the command while leading, and campaigns again after a loss (once
/// with `--once`); `Ok(())` for exit code 0.
pub async fn run(args: ElectArgs) -> Result<(), CliError> {
    let name =
        LockKey::new(&args.name).map_err(|e| CliError::usage(format!("invalid name: {e}")))?;
    let id = args.id.clone().unwrap_or_else(default_identity);
    let candidate =
        Candidate::new(id.clone()).map_err(|e| CliError::usage(format!("invalid --id: {e}")))?;
    if args.ttl < exec::MIN_TTL {
        return Err(CliError::usage(format!(
            "invalid --ttl: {} is below the minimum of {} (a shorter lease cannot be \
             renewed reliably while a command runs)",
            duration::format(args.ttl),
            duration::format(exec::MIN_TTL)
        )));
    }
    let wait = match (args.no_wait, args.wait) {
        (true, _) => WaitPolicy::NoWait,
        (false, Some(d)) if d.is_zero() => WaitPolicy::NoWait,
        (false, Some(d)) => WaitPolicy::Timeout(d),
        (false, None) => WaitPolicy::Forever,
    };
    let options = LockOptions::new(args.ttl)
        .with_wait(wait)
        .with_auto_renew(AutoRenew::new());
    options
        .validate()
        .map_err(|e| CliError::usage(format!("invalid --ttl: {e}")))?;
    let mut signals = Signals::new()?;
    let subject = format!("leadership of {}", escape::quoted(&args.name));
    let mut elections: Option<std::sync::Arc<dyn LeaderElection>> = None;
    loop {
        let campaign = async {
            let election = match &elections {
                Some(election) => election.clone(),
                None => distlock::connect(&args.backend.backend)
                    .await
                    .map(|c| c.election())?,
            };
            let won = election.campaign(&name, &candidate, &options).await?;
            Ok::<_, LockError>((election, won))
        };
        let won = tokio::select! {
            won = campaign => won,
            signo = signals.next() => match signo {
                libc::SIGTSTP => { exec::stop_self(); continue; }
                libc::SIGCONT => continue,
                _ => return Err(CliError::silent(128u8.saturating_add(signo as u8))),
            },
        };
        let (election, leadership) = match won {
            Ok(won) => won,
            Err(error) if !args.once && is_passing(&error) => {
                exec::warn(&format!(
                    "campaign for {subject} failed ({error}); campaigning again in {}",
                    duration::format(RETRY_AFTER_ERROR)
                ));
                // A client whose connection broke may be beyond repair: start afresh.
                elections = None;
                pause_or_signal(&mut signals, RETRY_AFTER_ERROR).await?;
                continue;
            }
            Err(error) => return Err(campaign_error(error, &name)),
        };
        elections = Some(election.clone());
        let backend = election.info();
        let term = leadership.term();
        if args.verbose {
            exec::warn(&format!(
                "leading election {} as {candidate} in term {term}",
                escape::quoted(&args.name)
            ));
        }
        let job = Job {
            argv: &args.command,
            env: vec![
                ("DISTLOCK_ELECTION", args.name.clone()),
                ("DISTLOCK_TERM", term.get().to_string()),
                ("DISTLOCK_CANDIDATE", id.clone()),
                ("DISTLOCK_BACKEND", args.backend.backend.clone()),
            ],
            unset: vec!["DISTLOCK_KEY", "DISTLOCK_FENCING_TOKEN"],
            kill_after: args.kill_after,
        };
        let led_at = Instant::now();
        let monitor = leadership.monitor();
        let end = exec::supervise(
            &job,
            &subject,
            &|| monitor.state(),
            leadership.lost(),
            &mut signals,
        )
        .await;
        let release = exec::release(leadership.resign(), &backend).await;
        let end = match end {
            Ok(end) => end,
            Err(error) => {
                if let exec::Release::Failed { error, freed } = &release {
                    exec::warn(&format!("could not resign {subject} ({error}); {freed}"));
                }
                return Err(error);
            }
        };
        if args.verbose {
            exec::warn(&format!(
                "term {term} of election {} ended after {}",
                escape::quoted(&args.name),
                duration::format(led_at.elapsed())
            ));
        }
        let verdict = exec::verdict::decide(&subject, end, &release);
        verdict.lines.iter().for_each(|line| exec::warn(line));
        // A command that ended on its own ends elect; one stopped by a lost leadership
        // (or never started) waits for the next term.
        let lost_it = matches!(end, CommandEnd::Stopped { .. } | CommandEnd::NotStarted);
        if lost_it && !args.once {
            exec::warn(&format!("campaigning again for {subject}"));
            continue;
        }
        return match verdict.code {
            0 => Ok(()),
            code => Err(CliError::silent(code)),
        };
    }
}

/// Whether a standby should shrug `error` off and campaign again: the backend failed
/// (retryable), as opposed to the request being wrong or `--wait` running out.
fn is_passing(error: &LockError) -> bool {
    error.is_retryable() && !matches!(error, LockError::Timeout { .. })
}

/// Sleeps `pause`, unless a signal that ends distlock comes first.
async fn pause_or_signal(signals: &mut Signals, pause: Duration) -> Result<(), CliError> {
    let deadline = tokio::time::sleep(pause);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            () = &mut deadline => return Ok(()),
            signo = signals.next() => match signo {
                libc::SIGTSTP => exec::stop_self(),
                libc::SIGCONT => {}
                _ => return Err(CliError::silent(128u8.saturating_add(signo as u8))),
            },
        }
    }
}

/// Maps a failed connect or campaign onto elect's exit codes.
fn campaign_error(error: LockError, name: &LockKey) -> CliError {
    match &error {
        LockError::Timeout { waited, .. } => CliError::with_code(
            format!(
                "another candidate leads {:?} (waited {})",
                name.as_str(),
                duration::format(*waited)
            ),
            EXIT_NOT_ACQUIRED,
        ),
        LockError::Config { .. }
        | LockError::InvalidKey { .. }
        | LockError::InvalidOptions { .. }
        | LockError::Unsupported { .. } => {
            CliError::with_code(crate::error::describe(&error), CliError::USAGE)
        }
        _ => CliError::with_code(crate::error::describe(&error), EXIT_UNREACHABLE),
    }
}

/// `HOST:PID`, what a replica is called when it gives no `--id`.
fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}:{}", std::process::id())
}
